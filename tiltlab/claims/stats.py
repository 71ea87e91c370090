"""Paired-difference statistics for check verdicts and the one decision rule every layer uses.

A check that compares two arms over units (seeds, prompts) measures *paired* differences
``d_u = arm_A(u) - arm_B(u)`` (same unit, same start, both arms), oriented so that positive is the
paper's direction. Each judged statement is an :class:`Item` of one of four *kinds*, declared per
item in the claim registry (``[[claim.item]]`` in ``paper_checks/claims/*.toml``) before the run:

* ``direction`` -- threshold 0 on both sides: *supports* when the one-sided t-test rejects
  ``mu <= 0``, *against* when it rejects ``mu >= 0``;
* ``effect`` (practical effect) -- threshold ``m`` (the item's margin, its smallest effect of
  interest) on both sides: supports when ``mu <= +m`` is rejected, against when ``mu >= -m`` is;
* ``equivalence`` ("matches", "within m") -- supports when both one-sided tests of the two
  one-sided tests procedure reject (``mu <= -m`` and ``mu >= +m``: the interval lies inside
  ``(-m, +m)``), against when the effect lies outside on one side (``mu <= +m`` or ``mu >= -m``
  rejected);
* ``context`` -- a number that holds by construction (or that the paper's sentence cannot make
  testable): reported with its interval, never in a family, never deciding anything.

The rule is symmetric by design: for ``direction`` and ``effect`` items, differences ``-d`` give
exactly the support p-value of ``d`` as their against p-value and vice versa (same level, same
threshold on both sides). An item's p-value is ``2 * min(p_supports, p_against)``; the judged items
of one verdict form a family whose p-values go through Holm's step-down procedure at :data:`ALPHA`
(0.05: with one item the rule is "the two-sided 95% interval excludes the threshold on one side");
a rejected item takes the side of its smaller one-sided p-value. An *exact* item (a deterministic
number, one value, no sampling error) supports / goes against when it lies beyond the threshold and
is not in the family. Items' outcomes combine by :func:`aggregate`; a check whose runs did not run
("it ran" flags false) gets its ``not_ran`` verdict whatever the items say.

Beside its verdict every :class:`Judgement` carries the verdict under the other threshold choice
(``direction`` <-> ``effect``, :attr:`Judgement.alt_verdict`), so a reader sees how much rides on it,
and :meth:`Judgement.evidence` is the raw per-unit record from which :func:`rejudge` re-derives the
verdict.

Everything here is pure Python plus Student's t from ``scipy.special`` (``stdtr``/``stdtrit``: exact for every
df, and the functions ``scipy.stats.t`` itself evaluates, without the ~1 s import of ``scipy.stats``). Inputs must be
finite: a NaN difference raises ``ValueError`` instead of silently becoming "inconclusive".
This module imports nothing of the project; check layers (``sim``, ``llm``) share it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "AGAINST",
    "ALPHA",
    "CONTEXT",
    "DIRECTION",
    "EFFECT",
    "EQUIVALENCE",
    "KINDS",
    "SUPPORTS",
    "UNDECIDED",
    "Decision",
    "Item",
    "ItemTest",
    "Judgement",
    "aggregate",
    "ci_numbers",
    "decide",
    "fmt_ci",
    "holm",
    "judge",
    "mean_ci",
    "mean_sd",
    "paired_t_ci",
    "rejudge",
    "t_pvalue",
    "t_quantile",
]

#: item outcomes of :func:`judge` (``context`` items have the outcome :data:`CONTEXT`)
SUPPORTS, AGAINST, UNDECIDED = "supports", "against", "undecided"
#: item kinds (see the module docstring)
DIRECTION, EFFECT, EQUIVALENCE, CONTEXT = "direction", "effect", "equivalence", "context"
KINDS = (DIRECTION, EFFECT, EQUIVALENCE, CONTEXT)
#: family-wise level of every family of item tests (two-sided; one-sided 0.025 per side)
ALPHA = 0.05
#: what a check whose runs did not run returns (``Judgement.not_ran``)
_NOT_RAN = ("inconclusive", "refuted")
_DIRECTIONS = {"greater": 1.0, "less": -1.0}


def _finite(xs: Sequence[float], name: str = "diffs", min_n: int = 2) -> list[float]:
    try:
        x = [float(v) for v in xs]
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a sequence of numbers, got {xs!r}") from None
    if len(x) < min_n:
        raise ValueError(f"{name} needs at least {min_n} values for a t interval, got {len(x)}")
    bad = [v for v in x if not math.isfinite(v)]
    if bad:
        raise ValueError(f"{name} must be finite, got {len(bad)} non-finite value(s) (first: {bad[0]})")
    return x


def _level(level: float) -> float:
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    return float(level)


def t_quantile(q: float, df: int) -> float:
    """The ``q`` quantile of Student's t with ``df >= 1`` degrees of freedom (exact: ``scipy.special.stdtrit``,
    which ``scipy.stats.t.ppf`` calls; a test pins the two equal)."""
    from scipy.special import stdtrit

    if df < 1:
        raise ValueError(f"df must be >= 1, got {df!r}")
    if not 0.0 < q < 1.0:
        raise ValueError(f"q must be in (0, 1), got {q!r}")
    return float(stdtrit(df, q))


def mean_sd(xs: Sequence[float]) -> tuple[float, float]:
    """``(mean, sample standard deviation with n - 1)`` of at least two finite values."""
    x = _finite(xs, "xs")
    n = len(x)
    if min(x) == max(x):  # identical values: exactly zero spread (fsum / n may not return x[0] exactly)
        return x[0], 0.0
    m = math.fsum(x) / n
    return m, math.sqrt(math.fsum((v - m) ** 2 for v in x) / (n - 1))


def paired_t_ci(diffs: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """``(mean, lo, hi)``: the two-sided ``level`` Student-t interval of the mean of paired differences.

    ``diffs`` are per-unit differences (arm A minus arm B on the same seed); df = n - 1. Identical
    differences give a zero-width interval at their value.
    """
    level = _level(level)
    m, sd = mean_sd(diffs)
    n = len(diffs)
    h = t_quantile(0.5 + level / 2, n - 1) * sd / math.sqrt(n)
    return m, m - h, m + h


def mean_ci(xs: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """``(mean, lo, hi)`` of per-seed values: :func:`paired_t_ci`, and ``(x, x, x)`` for a single value (a
    one-seed run has no interval)."""
    x = [float(v) for v in xs]
    if len(x) < 2:
        return x[0], x[0], x[0]
    return paired_t_ci(x, level)


def ci_numbers(prefix: str, xs: Sequence[float]) -> dict[str, float]:
    """``{prefix: mean, prefix_lo: lo, prefix_hi: hi}`` of :func:`mean_ci` (a check's numbers)."""
    m, lo, hi = mean_ci(xs)
    return {prefix: m, f"{prefix}_lo": lo, f"{prefix}_hi": hi}


def fmt_ci(xs: Sequence[float], digits: int = 3) -> str:
    """``"mean [lo, hi]"`` of :func:`mean_ci` with ``digits`` decimals (a check's summary)."""
    m, lo, hi = mean_ci(xs)
    return f"{m:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def t_pvalue(diffs: Sequence[float], null: float = 0.0, alternative: str = "two-sided") -> float:
    """p-value of the one-sample t test of the mean of ``diffs`` against ``null``.

    ``alternative``: ``"two-sided"`` (mu != null), ``"greater"`` (mu > null) or ``"less"`` (mu < null).
    With zero spread the statistic is +-inf (p = 0 on the side the mean lies strictly beyond ``null``)
    or undefined when the mean equals ``null`` (p = 1).
    """
    from scipy.special import stdtr  # Student's t cdf: t.cdf(x, df) = stdtr(df, x), t.sf(x, df) = stdtr(df, -x)

    if alternative not in ("two-sided", "greater", "less"):
        raise ValueError(f"alternative must be 'two-sided', 'greater' or 'less', got {alternative!r}")
    if not math.isfinite(float(null)):
        raise ValueError(f"null must be finite, got {null!r}")
    m, sd = mean_sd(diffs)
    n = len(diffs)
    se = sd / math.sqrt(n)
    if se == 0.0:
        if m == null:
            return 1.0
        stat = math.copysign(math.inf, m - null)
    else:
        stat = (m - null) / se
    if alternative == "greater":
        return float(stdtr(n - 1, -stat))
    if alternative == "less":
        return float(stdtr(n - 1, stat))
    return float(min(1.0, 2.0 * stdtr(n - 1, -abs(stat))))


def holm(pvalues: Sequence[float], alpha: float = 0.05) -> list[bool]:
    """Holm's step-down procedure: which hypotheses are rejected, in the order given.

    Sort the p-values ascending, ``p_(1) <= ... <= p_(k)``; reject ``H_(1), ..., H_(j)`` for the largest
    ``j`` such that ``p_(i) <= alpha / (k - i + 1)`` for every ``i <= j`` (stop at the first failure).
    Controls the family-wise error rate at ``alpha`` under any dependence between the tests.
    """
    alpha = _level(alpha)
    p = [float(v) for v in pvalues]
    if any(not (0.0 <= v <= 1.0) for v in p):
        raise ValueError(f"pvalues must lie in [0, 1], got {p}")
    k = len(p)
    reject = [False] * k
    for rank, i in enumerate(sorted(range(k), key=lambda j: p[j])):
        if p[i] > alpha / (k - rank):
            break
        reject[i] = True
    return reject


def aggregate(outcomes: Sequence[str]) -> str:
    """Default verdict of several items' outcomes (registry verdict values):

    every item supports -> ``verified``; at least one against and none supports -> ``refuted``;
    none decided -> ``inconclusive``; anything else (some support, the rest undecided or against)
    -> ``partly``. One item: supports / against / undecided -> verified / refuted / inconclusive.
    """
    if not outcomes:
        raise ValueError("aggregate needs at least one item outcome")
    bad = set(outcomes) - {SUPPORTS, AGAINST, UNDECIDED}
    if bad:
        raise ValueError(f"outcomes must be {SUPPORTS!r}, {AGAINST!r} or {UNDECIDED!r}, got {sorted(bad)}")
    if all(o == SUPPORTS for o in outcomes):
        return "verified"
    if SUPPORTS not in outcomes:
        return "refuted" if AGAINST in outcomes else "inconclusive"
    return "partly"


@dataclass(frozen=True)
class Item:
    """One statement of a claim as the rule judges it.

    ``values``: per-unit paired differences (positive = the paper's direction), at least two, or one
    with ``exact=True`` (a deterministic number: no sampling error). ``kind``: one of :data:`KINDS`.
    ``margin``: the smallest effect of interest (>= 0; > 0 for ``equivalence``); the threshold of an
    ``effect`` / ``equivalence`` item and the *other* threshold (:attr:`Judgement.alt_verdict`) of a
    ``direction`` item.
    """

    name: str
    values: tuple[float, ...]
    kind: str = EFFECT
    margin: float = 0.0
    exact: bool = False

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ValueError(f"an item needs a name, got {self.name!r}")
        if self.kind not in KINDS:
            raise ValueError(f"item {self.name}: kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        m = self.margin
        if isinstance(m, bool) or not (isinstance(m, (int, float)) and math.isfinite(m) and m >= 0):
            raise ValueError(f"item {self.name}: margin must be a finite number >= 0, got {m!r}")
        if self.kind == EQUIVALENCE and m <= 0:
            raise ValueError(f"item {self.name}: an equivalence item needs a margin > 0")
        vals = tuple(_finite(self.values, f"values of item {self.name!r}", min_n=1 if self.exact else 2))
        if self.exact and len(vals) != 1:
            raise ValueError(f"item {self.name}: an exact item holds one value, got {len(vals)}")
        object.__setattr__(self, "values", vals)
        object.__setattr__(self, "margin", float(m))

    def threshold(self, swap: bool = False) -> float:
        """The item's threshold: 0 for ``direction``, the margin otherwise (``swap``: the other choice)."""
        if self.kind == DIRECTION:
            return self.margin if swap else 0.0
        if self.kind == EFFECT:
            return 0.0 if swap else self.margin
        return self.margin

    def pvalues(self, swap: bool = False) -> tuple[float, float]:
        """``(p_supports, p_against)``: the one-sided p-values of the item's two hypotheses."""
        d, t = self.values, self.threshold(swap)
        if self.kind in (DIRECTION, EFFECT, CONTEXT):
            return t_pvalue(d, t, "greater"), t_pvalue(d, -t, "less")
        # equivalence: TOST for support; outside (-m, m) on either side (Bonferroni x2) for against
        p_sup = max(t_pvalue(d, -t, "greater"), t_pvalue(d, t, "less"))
        p_ag = min(1.0, 2.0 * min(t_pvalue(d, t, "greater"), t_pvalue(d, -t, "less")))
        return p_sup, p_ag

    def exact_outcome(self, swap: bool = False) -> str:
        """Outcome of an exact item: beyond the threshold in the paper's direction / the other / neither."""
        v, t = self.values[0], self.threshold(swap)
        if self.kind == EQUIVALENCE:
            return SUPPORTS if abs(v) < t else (AGAINST if abs(v) > t else UNDECIDED)
        return SUPPORTS if v > t else (AGAINST if v < -t else UNDECIDED)


@dataclass(frozen=True)
class ItemTest:
    """One item's test as :func:`judge` ran it.

    ``mean``, ``lo``, ``hi`` are in the claim's orientation (positive = the paper's direction; the
    interval at the family's two-sided level ``1 - alpha``); ``p`` is the item's p-value
    (``2 * min(p_supports, p_against)``) before Holm; ``outcome`` is :data:`SUPPORTS`,
    :data:`AGAINST`, :data:`UNDECIDED` or, for a ``context`` item, :data:`CONTEXT`.
    """

    mean: float
    lo: float
    hi: float
    p: float
    n: int
    outcome: str
    kind: str = EFFECT
    threshold: float = 0.0
    p_supports: float = 1.0
    p_against: float = 1.0


def _tests(items: Sequence[Item], alpha: float, swap: bool) -> dict[str, ItemTest]:
    out: dict[str, ItemTest] = {}
    family: list[tuple[str, float, str]] = []
    for it in items:
        if it.exact:
            v = it.values[0]
            o = CONTEXT if it.kind == CONTEXT else it.exact_outcome(swap)
            out[it.name] = ItemTest(
                v, v, v, 0.0 if o in (SUPPORTS, AGAINST) else 1.0, 1, o, it.kind, it.threshold(swap)
            )
            continue
        p_sup, p_ag = it.pvalues(swap)
        m, lo, hi = paired_t_ci(it.values, 1.0 - alpha)
        p = min(1.0, 2.0 * min(p_sup, p_ag))
        side = SUPPORTS if p_sup <= p_ag else AGAINST
        out[it.name] = ItemTest(m, lo, hi, p, len(it.values), CONTEXT, it.kind, it.threshold(swap), p_sup, p_ag)
        if it.kind != CONTEXT:
            family.append((it.name, p, side))
    rejected = holm([p for _, p, _ in family], alpha) if family else []
    for (name, _, side), rej in zip(family, rejected):
        t = out[name]
        out[name] = ItemTest(
            t.mean, t.lo, t.hi, t.p, t.n, side if rej else UNDECIDED, t.kind, t.threshold, t.p_supports, t.p_against
        )
    return out


@dataclass(frozen=True)
class Judgement:
    """What :func:`judge` returns: the verdict (a registry verdict value), each item's test, the
    verdict under the other threshold choice, and everything needed to re-derive both."""

    verdict: str
    alt_verdict: str
    tests: dict[str, ItemTest]
    items: tuple[Item, ...]
    ran: dict[str, bool]
    not_ran: str
    cap: str | None
    alpha: float
    unit: str

    @property
    def family(self) -> list[str]:
        """Names of the items in the Holm family (judged, not exact, not context)."""
        return [it.name for it in self.items if it.kind != CONTEXT and not it.exact]

    def flags(self) -> dict[str, bool]:
        """``<item>_supports`` / ``<item>_against`` for every judged item, plus the "it ran" flags."""
        out: dict[str, bool] = {}
        for it in self.items:
            if it.kind == CONTEXT:
                continue
            o = self.tests[it.name].outcome
            out[f"{it.name}_supports"], out[f"{it.name}_against"] = o == SUPPORTS, o == AGAINST
        out.update(self.ran)
        return out

    def numbers(self, prefix: str = "") -> dict[str, float]:
        """Finite evidence numbers per item: ``<prefix><item>_mean/_lo/_hi/_p/_margin`` (claim orientation)."""
        out: dict[str, float] = {}
        for it in self.items:
            t = self.tests[it.name]
            out.update({f"{prefix}{it.name}_{k}": float(getattr(t, k)) for k in ("mean", "lo", "hi", "p")})
            out[f"{prefix}{it.name}_margin"] = it.margin
        return out

    def evidence(self) -> dict:
        """The raw record :func:`rejudge` re-derives this judgement from (JSON-ready)."""
        return {
            "rule": "tiltlab.claims.stats.judge",
            "alpha": self.alpha,
            "unit": self.unit,
            "not_ran": self.not_ran,
            "cap": self.cap,
            "ran": dict(self.ran),
            "items": [
                {"name": it.name, "kind": it.kind, "margin": it.margin, "exact": it.exact, "values": list(it.values)}
                for it in self.items
            ],
            "verdict": self.verdict,
            "alt_verdict": self.alt_verdict,
        }

    def describe(self, digits: int = 3) -> str:
        """One clause per item: ``name +0.012 [-0.003, +0.027] (effect, margin 0.02): supports``."""
        parts = []
        for it in self.items:
            t = self.tests[it.name]
            iv = "exact" if it.exact else f"[{t.lo:+.{digits}f}, {t.hi:+.{digits}f}]"
            state = (
                "context, not judged"
                if t.outcome == CONTEXT
                else ("not significant" if t.outcome == UNDECIDED else t.outcome)
            )
            parts.append(f"{it.name} {t.mean:+.{digits}f} {iv} ({it.kind}, margin {it.margin:g}): {state}")
        return "; ".join(parts)


def _verdict(
    tests: Mapping[str, ItemTest],
    items: Sequence[Item],
    ran: Mapping[str, bool],
    not_ran: str,
    cap: str | None,
    combine: Callable[[Sequence[str]], str],
) -> str:
    if not all(ran.values()):
        return not_ran
    v = combine([tests[it.name].outcome for it in items if it.kind != CONTEXT])
    if cap == "partly" and v == "verified":
        v = "partly"
    return v


def judge(
    items: Sequence[Item],
    ran: Mapping[str, bool] | None = None,
    *,
    alpha: float = ALPHA,
    not_ran: str = "inconclusive",
    cap: str | None = None,
    unit: str = "seed",
    combine: Callable[[Sequence[str]], str] = aggregate,
) -> Judgement:
    """The one decision rule (module docstring): test every judged item at its kind's threshold,
    Holm over the family at ``alpha``, combine the outcomes (:func:`aggregate`), then the "it ran"
    flags (any false -> ``not_ran``, ``inconclusive`` or ``refuted``) and the ``cap`` (``partly``:
    a claim with parts no run tests is at most partly). ``unit`` names the paired unit (``seed``,
    ``prompt``). The same is done with the other threshold choice for :attr:`Judgement.alt_verdict`."""
    alpha = _level(alpha)
    items = tuple(items)
    if not items or not all(isinstance(it, Item) for it in items):
        raise ValueError("judge needs at least one Item")
    names = [it.name for it in items]
    if len(set(names)) != len(names):
        raise ValueError(f"item names repeat: {names}")
    if all(it.kind == CONTEXT for it in items):
        raise ValueError(f"judge needs at least one judged (not context) item, got {names}")
    if not_ran not in _NOT_RAN:
        raise ValueError(f"not_ran must be one of {_NOT_RAN}, got {not_ran!r}")
    if cap not in (None, "partly"):
        raise ValueError(f"cap must be None or 'partly', got {cap!r}")
    ran = {str(k): bool(v) for k, v in (ran or {}).items()}
    tests = _tests(items, alpha, swap=False)
    alt = _tests(items, alpha, swap=True)
    return Judgement(
        _verdict(tests, items, ran, not_ran, cap, combine),
        _verdict(alt, items, ran, not_ran, cap, combine),
        tests,
        items,
        ran,
        not_ran,
        cap,
        alpha,
        unit,
    )


def rejudge(evidence: Mapping) -> Judgement:
    """Re-derive a :class:`Judgement` from its :meth:`Judgement.evidence` (a record's raw values)."""
    try:
        items = [
            Item(str(r["name"]), tuple(r["values"]), str(r["kind"]), float(r["margin"]), bool(r.get("exact", False)))
            for r in evidence["items"]
        ]
        return judge(
            items,
            evidence.get("ran") or {},
            alpha=float(evidence["alpha"]),
            not_ran=str(evidence.get("not_ran", "inconclusive")),
            cap=evidence.get("cap"),
            unit=str(evidence.get("unit", "seed")),
        )
    except KeyError as exc:
        raise ValueError(f"evidence lacks field {exc.args[0]!r}: not a record of stats.judge") from None


@dataclass(frozen=True)
class Decision:
    """What :func:`decide` returns: ``verdict`` (a registry verdict value) and each item's test."""

    verdict: str
    items: dict[str, ItemTest]
    margin: dict[str, float]  # per item
    alpha: float
    judgement: Judgement | None = None

    def numbers(self, prefix: str = "") -> dict[str, float]:
        """Finite evidence numbers per item: ``<prefix><item>_mean/_lo/_hi/_p`` (claim orientation)."""
        out: dict[str, float] = {}
        for name, it in self.items.items():
            for k in ("mean", "lo", "hi", "p"):
                out[f"{prefix}{name}_{k}"] = float(getattr(it, k))
        return out


def decide(
    diffs_by_item: Mapping[str, Sequence[float]],
    margin: float | Mapping[str, float],
    direction: str = "greater",
    alpha: float = 0.05,
    combine: Callable[[Sequence[str]], str] = aggregate,
    *,
    exact: Mapping[str, float] | None = None,
    ran: Mapping[str, bool] | None = None,
    not_ran: str = "inconclusive",
) -> Decision:
    """Judge one claim from paired differences per item, with a margin and Holm's correction.

    Args:
        diffs_by_item: item name -> paired differences (arm the paper favours minus the other, per seed,
            or the opposite with ``direction="less"``); at least two finite values each.
        margin: smallest effect of interest, ``>= 0``, in the units of the differences; one for every item,
            or a mapping item -> margin naming every item. (A non-inferiority item, "not worse than the
            other arm by more than m", is ``d + m`` with margin 0: it supports when the interval of ``d``
            lies above ``-m`` and is against when it lies below ``-m``.)
        direction: the paper's claimed sign of the mean difference: ``"greater"`` (> 0) or ``"less"`` (< 0).
        alpha: family-wise error rate of the item decisions (Holm over the items).
        combine: maps the item outcomes (in ``diffs_by_item`` order) to a verdict (default :func:`aggregate`).
        exact: deterministic items (name -> one value, same orientation and margin rule; ``margin`` must
            name them too): beyond the threshold supports / goes against, not in the Holm family;
            they follow the sampled items in the outcomes ``combine`` sees.
        ran: "it ran" flags; any false gives ``not_ran`` (``inconclusive`` or ``refuted``) whatever the items.

    Each item is oriented so that positive = the paper's direction; it *supports* when the one-sided
    test of ``mu <= margin`` rejects, is *against* when that of ``mu >= -margin`` rejects (each at half
    the item's level), and is undecided otherwise. The item p-value ``2 * min(p_support, p_against)``
    enters Holm at ``alpha``; a rejected item takes the side of its smaller one-sided p-value.
    """
    if direction not in _DIRECTIONS:
        raise ValueError(f"direction must be 'greater' or 'less', got {direction!r}")
    alpha = _level(alpha)
    if not diffs_by_item:
        raise ValueError("diffs_by_item must name at least one item")
    exact = dict(exact or {})
    names = [*diffs_by_item, *exact]
    if len(set(names)) != len(names):
        raise ValueError(f"an item is both sampled and exact: {names}")
    margins = dict(margin) if isinstance(margin, Mapping) else dict.fromkeys(names, margin)
    if set(margins) != set(names):
        raise ValueError(f"margin must name exactly the items {sorted(names)}, got {sorted(margins)}")
    for name, m in margins.items():
        if isinstance(m, bool) or not (isinstance(m, (int, float)) and math.isfinite(m) and m >= 0):
            raise ValueError(f"margin must be a finite number >= 0, got {m!r} for item {name!r}")
    sign = _DIRECTIONS[direction]
    items = [
        Item(
            name,
            tuple(sign * v for v in _finite(d, f"diffs of item {name!r}")),
            EFFECT if margins[name] > 0 else DIRECTION,
            margins[name],
        )
        for name, d in diffs_by_item.items()
    ]
    items += [
        Item(name, (sign * float(v),), EFFECT if margins[name] > 0 else DIRECTION, margins[name], exact=True)
        for name, v in exact.items()
    ]
    j = judge(items, ran, alpha=alpha, combine=combine, not_ran=not_ran)
    return Decision(j.verdict, dict(j.tests), {k: float(v) for k, v in margins.items()}, alpha, j)
