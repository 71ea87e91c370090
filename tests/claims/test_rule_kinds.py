"""The one decision rule, item kind by item kind, against a naive oracle written from the docs.

The oracle below is written from the module docstring of :mod:`tiltlab.claims.stats` (and
docs/claims.md's statement of the rule) with numpy and ``scipy.stats.t``, not from the code: per
item its two one-sided p-values at its kind's threshold, Holm by sorting, the side of the smaller
p-value, the aggregate table, the ``partly`` cap and the "it ran" flags. Hypothesis draws families of
one to four items of every kind (direction, effect, equivalence, context; sampled and exact) with
margins on both sides of the mean, and each test asserts that :func:`stats.judge`, the llm layer's
:func:`rules.judge` and :func:`stats.decide` give the oracle's outcomes, p-values and verdicts, and
that the rule is symmetric: ``d -> -d`` swaps supports and against for direction / effect items and
leaves equivalence items unchanged, for sampled and exact items alike.

Draws within 1e-9 (relative) of a decision boundary are discarded: there the oracle's numpy sums and
the code's ``math.fsum`` may round to different sides, and neither answer would be wrong.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from tiltlab.claims import stats
from tiltlab.llm.checks import rules

ALPHA = 0.05
KINDS = ("direction", "effect", "equivalence", "context")
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])


# --------------------------------------------------------------------------------------------- the oracle
def _near(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def naive_pvalues(values, kind: str, margin: float, swap: bool = False) -> tuple[float, float]:
    """(p_supports, p_against) of one sampled item, from scipy.stats.t (docstring of stats)."""
    x = np.asarray(values, dtype=float)
    n, mean, se = len(x), float(x.mean()), float(x.std(ddof=1)) / math.sqrt(len(x))
    t_dist = sps.t(n - 1)

    def greater(null):  # p of the one-sided test of mu > null
        return float(t_dist.sf((mean - null) / se))

    def less(null):
        return float(t_dist.cdf((mean - null) / se))

    if kind == "equivalence":  # TOST for support; outside (-m, m) on either side (x2) for against
        return max(greater(-margin), less(margin)), min(1.0, 2 * min(greater(margin), less(-margin)))
    thr = {"direction": margin if swap else 0.0, "effect": 0.0 if swap else margin}.get(kind, margin)
    return greater(thr), less(-thr)


def naive_exact(v: float, kind: str, margin: float, swap: bool = False) -> str:
    if kind == "context":
        return "context"
    if kind == "equivalence":
        return "supports" if abs(v) < margin else ("against" if abs(v) > margin else "undecided")
    thr = {"direction": margin if swap else 0.0, "effect": 0.0 if swap else margin}[kind]
    return "supports" if v > thr else ("against" if v < -thr else "undecided")


def naive_holm(ps: list[float], alpha: float = ALPHA) -> list[bool]:
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    out = [False] * len(ps)
    for rank, i in enumerate(order):
        if ps[i] > alpha / (len(ps) - rank):
            break
        out[i] = True
    return out


def naive_outcomes(items, swap: bool = False) -> tuple[dict[str, str], list[float]]:
    """Each item's outcome, and the boundaries the draw must stay away from."""
    out, fam, bounds = {}, [], []
    for name, values, kind, margin, exact in items:
        if exact:
            out[name] = naive_exact(values[0], kind, margin, swap)
            bounds += [abs(values[0]) - margin, values[0] - margin, values[0] + margin, values[0]]
            continue
        p_sup, p_ag = naive_pvalues(values, kind, margin, swap)
        if kind == "context":
            out[name] = "context"
            continue
        p = min(1.0, 2 * min(p_sup, p_ag))
        bounds.append(p_sup - p_ag)
        fam.append((name, p, "supports" if p_sup <= p_ag else "against"))
    rej = naive_holm([p for _, p, _ in fam]) if fam else []
    k = len(fam)
    for (name, p, side), r in zip(fam, rej):
        out[name] = side if r else "undecided"
        bounds += [p - ALPHA / j for j in range(1, k + 1)]
    return out, bounds


def naive_verdict(outcomes: list[str], ran: dict[str, bool], cap, not_ran="inconclusive") -> str:
    if not all(ran.values()):
        return not_ran
    judged = [o for o in outcomes if o != "context"]
    if all(o == "supports" for o in judged):
        v = "verified"
    elif "supports" not in judged:
        v = "refuted" if "against" in judged else "inconclusive"
    else:
        v = "partly"
    return "partly" if cap == "partly" and v == "verified" else v


# --------------------------------------------------------------------------------------------- the draws
@st.composite
def an_item(draw, i: int, n: int, exact_ok: bool = True):
    kind = draw(st.sampled_from(KINDS))
    exact = exact_ok and draw(st.booleans())
    scale = draw(st.sampled_from([0.01, 0.1, 1.0]))
    margin = draw(st.sampled_from([0.0, 0.05, 0.3, 1.0])) * scale
    if kind == "equivalence" and margin == 0.0:
        margin = 0.3 * scale
    shift = draw(st.floats(-3.0, 3.0, allow_nan=False)) * scale
    if exact:
        return (f"item{i}", (shift,), kind, margin, True)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    noise = rng.standard_normal(n) * scale * draw(st.sampled_from([0.05, 0.3, 1.0]))
    values = tuple(float(v) for v in shift + noise)
    assume(np.std(values) > 1e-9 * scale)
    return (f"item{i}", values, kind, margin, False)


@st.composite
def a_family(draw, exact_ok: bool = True):
    n = draw(st.integers(2, 12))
    k = draw(st.integers(1, 4))
    items = [draw(an_item(i, n, exact_ok)) for i in range(k)]
    assume(any(kind != "context" for _, _, kind, _, _ in items))
    return items


def _stat_items(items):
    return [stats.Item(name, values, kind, margin, exact) for name, values, kind, margin, exact in items]


def _flip(items):
    return [(name, tuple(-v for v in values), kind, margin, exact) for name, values, kind, margin, exact in items]


def _away_from_boundaries(items) -> None:
    for swap in (False, True):
        _, bounds = naive_outcomes(items, swap)
        assume(all(not _near(b, 0.0) for b in bounds))


# --------------------------------------------------------------------------------------------- the tests
@SETTINGS
@given(
    items=a_family(),
    cap=st.sampled_from([None, "partly"]),
    ran=st.dictionaries(st.sampled_from(["loss_moved", "weights_moved"]), st.booleans(), max_size=2),
    not_ran=st.sampled_from(["inconclusive", "refuted"]),
)
def test_judge_equals_the_naive_rule_for_every_kind(items, cap, ran, not_ran):
    _away_from_boundaries(items)
    j = stats.judge(_stat_items(items), ran, cap=cap, not_ran=not_ran)
    for swap, verdict in ((False, j.verdict), (True, j.alt_verdict)):
        want, _ = naive_outcomes(items, swap)
        tests = j.tests if not swap else stats._tests(j.items, ALPHA, swap=True)
        assert {k: t.outcome for k, t in tests.items()} == want, (swap, items)
        assert verdict == naive_verdict(list(want.values()), ran, cap, not_ran)
    for name, values, kind, margin, exact in items:
        t = j.tests[name]
        if exact:
            assert (t.mean, t.lo, t.hi, t.n) == (values[0], values[0], values[0], 1)
            continue
        p_sup, p_ag = naive_pvalues(values, kind, margin)
        assert t.p_supports == pytest.approx(p_sup, rel=1e-7, abs=1e-12)
        assert t.p_against == pytest.approx(p_ag, rel=1e-7, abs=1e-12)
        assert t.p == pytest.approx(min(1.0, 2 * min(p_sup, p_ag)), rel=1e-7, abs=1e-12)
        lo, hi = sps.t.interval(0.95, len(values) - 1, loc=np.mean(values), scale=sps.sem(values))
        assert (t.lo, t.hi) == (pytest.approx(lo, rel=1e-9, abs=1e-12), pytest.approx(hi, rel=1e-9, abs=1e-12))
    # the families: judged sampled items only, in declaration order
    assert j.family == [n for n, _, kind, _, exact in items if kind != "context" and not exact]


@SETTINGS
@given(items=a_family())
def test_the_rule_is_symmetric_for_every_kind_sampled_and_exact(items):
    _away_from_boundaries(items)
    _away_from_boundaries(_flip(items))
    a = stats.judge(_stat_items(items))
    b = stats.judge(_stat_items(_flip(items)))
    mirror = {"supports": "against", "against": "supports", "undecided": "undecided", "context": "context"}
    for name, _, kind, _, exact in items:
        ta, tb = a.tests[name], b.tests[name]
        if kind == "equivalence":  # the interval (-m, m) is its own mirror image
            assert tb.outcome == ta.outcome, (name, kind, exact)
            if not exact:
                assert (tb.p_supports, tb.p_against) == pytest.approx((ta.p_supports, ta.p_against), rel=1e-9)
        else:
            assert tb.outcome == mirror[ta.outcome], (name, kind, exact)
            if not exact:
                assert (tb.p_supports, tb.p_against) == pytest.approx((ta.p_against, ta.p_supports), rel=1e-9)


@SETTINGS
@given(items=a_family(exact_ok=False), cap=st.sampled_from([None, "partly"]))
def test_the_llm_layer_passes_every_kind_and_the_cap_through(items, cap):
    _away_from_boundaries(items)
    llm_items = [rules.Item(name, values, margin=margin, kind=kind) for name, values, kind, margin, _ in items]
    verdict, nums, flags, _ = rules.judge(llm_items, {"loss_moved": True}, cap=cap)
    want, _ = naive_outcomes(items)
    assert verdict.value == naive_verdict(list(want.values()), {}, cap)
    for name, values, kind, margin, _ in items:
        p_sup, p_ag = naive_pvalues(values, kind, margin)
        assert nums[f"{name}_p_supports"] == pytest.approx(p_sup, rel=1e-7, abs=1e-12)
        assert nums[f"{name}_p_against"] == pytest.approx(p_ag, rel=1e-7, abs=1e-12)
        assert nums[f"{name}_margin"] == margin
        assert nums[name] == pytest.approx(float(np.mean(values)), rel=1e-12, abs=1e-15)
        if kind == "context":
            assert f"{name}_supports" not in flags
        else:
            assert (flags[f"{name}_supports"], flags[f"{name}_against"]) == (
                want[name] == "supports",
                want[name] == "against",
            )
    assert nums["seeds"] == len(items[0][1])
    assert flags["loss_moved"] is True


@SETTINGS
@given(
    diffs=st.lists(st.floats(-2, 2, allow_nan=False), min_size=3, max_size=8),
    exact=st.floats(-2, 2, allow_nan=False),
    margin=st.sampled_from([0.0, 0.1, 0.5]),
    direction=st.sampled_from(["greater", "less"]),
)
def test_decide_orients_sampled_and_exact_items_by_the_claims_direction(diffs, exact, margin, direction):
    assume(np.std(diffs) > 1e-6)
    sign = 1.0 if direction == "greater" else -1.0
    kind = "effect" if margin > 0 else "direction"
    items = [("s", tuple(sign * d for d in diffs), kind, margin, False), ("e", (sign * exact,), kind, margin, True)]
    _away_from_boundaries(items)
    d = stats.decide({"s": diffs}, margin, direction, exact={"e": exact})
    want, _ = naive_outcomes(items)
    assert {k: t.outcome for k, t in d.items.items()} == want
    assert d.verdict == naive_verdict(list(want.values()), {}, None)
    assert d.items["e"].mean == sign * exact and d.items["s"].mean == pytest.approx(sign * np.mean(diffs), abs=1e-12)


def test_the_draws_reach_every_outcome_of_every_kind():
    """The property tests above are only as good as their draws: every (kind, exact, outcome) cell
    the rule can produce is reached by hand-made items here, each computed by the oracle too."""
    cells = {
        # kind, exact, values, margin -> outcome
        ("direction", False, (0.9, 1.0, 1.1, 1.2), 0.5): "supports",
        ("direction", False, (-0.9, -1.0, -1.1, -1.2), 0.5): "against",
        ("direction", False, (-1.0, 1.0, -0.5, 0.6), 0.5): "undecided",
        ("effect", False, (0.9, 1.0, 1.1, 1.2), 0.5): "supports",
        ("effect", False, (-0.9, -1.0, -1.1, -1.2), 0.5): "against",
        ("effect", False, (0.2, 0.3, 0.25, 0.35), 0.5): "undecided",  # significant but within the margin
        ("equivalence", False, (0.01, -0.02, 0.015, -0.01), 0.5): "supports",
        ("equivalence", False, (-0.02, 0.01, -0.015, 0.01), 0.5): "supports",
        ("equivalence", False, (0.9, 1.0, 1.1, 1.2), 0.5): "against",
        ("equivalence", False, (-0.9, -1.0, -1.1, -1.2), 0.5): "against",
        ("equivalence", False, (-1.0, 1.0, -0.5, 0.6), 0.5): "undecided",
        ("direction", True, (0.1,), 0.5): "supports",
        ("direction", True, (-0.1,), 0.5): "against",
        ("direction", True, (0.0,), 0.5): "undecided",
        ("effect", True, (0.6,), 0.5): "supports",
        ("effect", True, (-0.6,), 0.5): "against",
        ("effect", True, (0.4,), 0.5): "undecided",
        ("equivalence", True, (0.4,), 0.5): "supports",
        ("equivalence", True, (-0.4,), 0.5): "supports",
        ("equivalence", True, (0.6,), 0.5): "against",
        ("equivalence", True, (-0.6,), 0.5): "against",
        ("equivalence", True, (0.5,), 0.5): "undecided",
    }
    for (kind, exact, values, margin), outcome in cells.items():
        items = [("x", values, kind, margin, exact)]
        assert naive_outcomes(items)[0]["x"] == outcome, (kind, exact, values)
        j = stats.judge(_stat_items(items))
        assert j.tests["x"].outcome == outcome, (kind, exact, values)
        assert j.verdict == {"supports": "verified", "against": "refuted", "undecided": "inconclusive"}[outcome]
    # the cap and the flags on one supporting item
    one = _stat_items([("x", (0.9, 1.0, 1.1, 1.2), "direction", 0.5, False)])
    assert stats.judge(one, cap="partly").verdict == "partly"
    assert stats.judge(one, {"ran": False}).verdict == "inconclusive"
    assert stats.judge(one, {"ran": False}, not_ran="refuted").verdict == "refuted"
    # a context item beside a supporting one neither helps nor hurts; the alt threshold of an effect is 0
    two = _stat_items([("x", (0.2, 0.3, 0.25, 0.35), "effect", 0.5, False), ("c", (-5.0, -6.0), "context", 0.0, False)])
    j = stats.judge(two)
    assert (j.verdict, j.alt_verdict, j.tests["c"].outcome) == ("inconclusive", "verified", "context")


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_nan_or_infinite_value_has_no_verdict_in_any_kind(bad):
    for kind in KINDS:
        with pytest.raises(ValueError, match="finite"):
            stats.Item("x", (0.1, bad, 0.3), kind, 0.5)
        with pytest.raises(ValueError, match="finite"):
            stats.Item("x", (bad,), kind, 0.5, exact=True)
        with pytest.raises(ValueError, match="non-finite"):
            rules.Item("x", (0.1, bad), margin=0.5, kind=kind)
