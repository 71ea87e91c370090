"""The llm checks' use of the one decision rule (:func:`tiltlab.claims.stats.judge`).

Every llm check reduces its evidence to *items*: one per statement of the claim, each a list of
per-unit paired differences (per seed: every arm trained from the same warm-up model with the same
seed; per prompt for the real-model Stage-1 check), oriented so that the paper's statement predicts
a positive difference, with a *margin* (the smallest effect of interest, in the item's own units)
and a *kind* declared in the claim registry (``[[claim.item]]``, ``layer = "llm"``):
``direction`` (threshold 0 on both sides), ``effect`` (threshold +-margin on both sides),
``equivalence`` (inside +-margin) or ``context`` (holds by construction: reported, never judged).

The rule is the one of every layer: an item supports when its one-sided test of the paper's side
rejects at its threshold and goes against when the mirror test rejects at the mirror threshold
(the same level and threshold on both sides); the judged items of a check form one family, Holm at
:data:`ALPHA` (two-sided 0.05, one-sided 0.025 per side). Verdict: every judged item supports ->
verified; some support -> partly; none supports and one goes against -> refuted; otherwise
inconclusive (not significant is never refuted). A check whose runs did not train (the "it ran"
items: losses moved, weights moved, accuracy left its warm-up value) is inconclusive whatever its
items say, and its expected "ran" items fail ``tiltlab check``. Beside the verdict the result
records the verdict under the other threshold choice (``verdict_other_threshold``) and the raw
per-unit values (:attr:`CheckResult.evidence`), from which ``tiltlab report --rejudge`` re-derives it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tiltlab.claims import stats
from tiltlab.claims.registry import Verdict
from tiltlab.claims.stats import Item  # one statement of a claim: per-unit paired differences in ``values``
from tiltlab.llm.experiments.training import RunLog  # the runs' "it ran" log, kept by the experiments

__all__ = ["ALPHA", "Item", "RunLog", "holm", "judge", "one_sided_p", "prefix_verdicts"]

ALPHA = stats.ALPHA
"""Family-wise level of the item tests: two-sided 0.05 (one-sided 0.025 per side; a 95% interval for one item)."""


def one_sided_p(xs: Sequence[float], null: float, greater: bool) -> float:
    """p-value of the one-sided t-test of ``mean > null`` (``greater``) or ``mean < null``
    (:func:`tiltlab.claims.stats.t_pvalue`: exact with zero spread). Needs two values."""
    if len(xs) < 2:
        raise ValueError(f"a paired t-test needs at least 2 seeds, got {len(xs)}")
    return stats.t_pvalue(xs, null, "greater" if greater else "less")


def holm(pvalues: Sequence[float], alpha: float = ALPHA) -> list[bool]:
    """Holm's step-down procedure at ``alpha`` (:func:`tiltlab.claims.stats.holm`)."""
    return stats.holm(pvalues, alpha)


def t_interval(xs: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """``(mean, lo, hi)`` of the two-sided Student-t interval (:func:`tiltlab.claims.stats.paired_t_ci`)."""
    return stats.paired_t_ci(xs, level)


def judge(
    items: Sequence[Item], ran: Mapping[str, bool] | None = None, *, cap: Verdict | None = None, unit: str = "seed"
) -> tuple[Verdict, dict, dict, stats.Judgement]:
    """``(verdict, numbers, items, judgement)`` of :func:`stats.judge` over ``items``. ``numbers``
    per item: mean, 95% interval, margin, the two one-sided p-values at the item's threshold, plus
    ``seeds`` (units) and ``verdict_other_threshold``; ``items`` per judged item:
    ``<name>_supports`` / ``<name>_against`` (after Holm), plus the ``ran`` items as given."""
    if not items:
        raise ValueError("judge needs at least one item")
    names = [i.name for i in items]
    if len(set(names)) != len(names):
        raise ValueError(f"item names repeat: {names}")
    n = {len(i.values) for i in items}
    if len(n) != 1:
        raise ValueError(f"items are paired per seed and need the same number of seeds, got {sorted(n)}")
    if min(n) < 2:
        raise ValueError(f"a paired t-test needs at least 2 seeds, got {min(n)}")
    j = stats.judge(
        list(items),
        dict(ran or {}),
        alpha=ALPHA,
        cap=None if cap is None else Verdict(cap).value,
        unit=unit,
    )
    nums: dict[str, float | str] = {}
    for it in items:
        t = j.tests[it.name]
        nums.update({it.name: t.mean, f"{it.name}_lo": t.lo, f"{it.name}_hi": t.hi, f"{it.name}_margin": it.margin})
        nums.update({f"{it.name}_p_supports": t.p_supports, f"{it.name}_p_against": t.p_against})
    nums["seeds"] = len(items[0].values)
    nums["verdict_other_threshold"] = j.alt_verdict
    return Verdict(j.verdict), nums, j.flags(), j


def prefix_verdicts(items: Sequence[Item], ns: Sequence[int] = (3, 5)) -> dict[str, str]:
    """The verdict the same rule gives on the first ``n`` seeds of the run, for each ``n`` (the
    sample sizes of earlier runs: a verdict that depends on the seed count shows it)."""
    out = {}
    total = len(items[0].values) if items else 0
    for k in ns:
        if 2 <= k < total:
            v, _, _, _ = judge([Item(i.name, i.values[:k], margin=i.margin, kind=i.kind) for i in items])
            out[f"verdict_at_{k}_seeds"] = v.value
    return out


def describe(judgement: stats.Judgement, digits: int = 3) -> str:
    """One clause per item: ``name +0.012 [-0.003, +0.027] (effect, margin 0.02): supports``."""
    return judgement.describe(digits)


def rule_text(unit: str = "per-seed") -> str:
    """The rule of :func:`judge` in words, for a check's summary; ``unit`` names the paired unit
    (``per-seed``; the real-model Stage-1 check pairs ``per-prompt`` means)."""
    return (
        f"rule: {unit} paired differences (positive = the paper's direction), each item of a kind declared in the "
        "registry: direction (threshold 0) or effect (threshold +-margin) supports if a one-sided t-test rejects "
        "mean <= +threshold and goes against if the mirror test rejects mean >= -threshold, equivalence supports "
        f"inside +-margin, context items are not judged; one Holm family at {ALPHA:g} (two-sided); all support "
        "verified, some partly, none and one against refuted, else inconclusive; inconclusive if a run did not train"
    )


RULE_TEXT = rule_text()
