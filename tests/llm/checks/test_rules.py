"""The llm checks' one decision rule (llm/checks/rules.py) against scipy and naive computations."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import pytest
import scipy.stats as scipy_stats

from tiltlab.claims import stats as S
from tiltlab.claims.registry import Verdict
from tiltlab.llm.checks import rules as R


@pytest.mark.parametrize("xs", [(0.1, 0.3, -0.05, 0.2), (1.0, 2.0), (-0.3, -0.1, -0.2, -0.25, -0.4)])
@pytest.mark.parametrize("null", [0.0, -0.1, 0.15])
def test_one_sided_p_equals_scipy(xs, null):
    for greater, alt in ((True, "greater"), (False, "less")):
        want = scipy_stats.ttest_1samp(xs, null, alternative=alt).pvalue
        assert R.one_sided_p(xs, null, greater) == pytest.approx(want, rel=1e-10)


def test_one_sided_p_with_zero_spread_is_exact():
    # values exactly representable in binary, so the spread is exactly 0
    assert R.one_sided_p((0.25, 0.25, 0.25), 0.0, True) == 0.0
    assert R.one_sided_p((0.25, 0.25, 0.25), 0.25, True) == 1.0  # on the null: not rejected
    assert R.one_sided_p((0.25, 0.25), 0.5, False) == 0.0
    assert R.one_sided_p((0.0, 0.0), 0.0, False) == 1.0
    with pytest.raises(ValueError, match="at least 2 seeds"):
        R.one_sided_p((0.1,), 0.0, True)


def _holm_naive(ps, alpha):
    """Holm by its definition: reject H_(i) iff for every j <= i, p_(j) <= alpha / (k - j + 1)."""
    k = len(ps)
    order = sorted(range(k), key=lambda i: ps[i])
    rej = [False] * k
    for rank, i in enumerate(order):
        rej[i] = all(ps[order[j]] <= alpha / (k - j) for j in range(rank + 1))
    return rej


@pytest.mark.parametrize(
    "ps",
    [
        (0.01, 0.04, 0.03),
        (0.001, 0.0125, 0.0126),
        (0.02, 0.0001, 0.9, 0.006),
        (0.5,),
        (0.0, 0.0, 0.0),
        (0.012, 0.013),  # Bonferroni would reject neither at 0.025/2 = 0.0125 after the first ...
    ],
)
def test_holm_equals_its_definition(ps):
    assert R.holm(ps, 0.025) == _holm_naive(ps, 0.025)


def test_holm_is_not_bonferroni_and_not_uncorrected():
    ps = (0.012, 0.024)
    assert R.holm(ps, 0.025) == [True, True]  # 0.012 <= 0.0125, then 0.024 <= 0.025
    assert R.holm((0.013, 0.024), 0.025) == [False, False]  # step-down stops at the first
    assert R.holm((0.02,) * 3, 0.025) == [False, False, False]  # uncorrected would reject all


def test_t_interval_uses_the_exact_quantile():
    xs = (0.1, 0.4, 0.2, 0.3)
    m, lo, hi = R.t_interval(xs)
    sd = math.sqrt(sum((x - 0.25) ** 2 for x in xs) / 3)
    h = scipy_stats.t.ppf(0.975, 3) * sd / 2
    assert (m, lo, hi) == pytest.approx((0.25, 0.25 - h, 0.25 + h), rel=1e-12)


def _it(name, diffs, margin=0.02):
    return R.Item(name, tuple(diffs), margin=margin)


UP = (0.10, 0.12, 0.09, 0.11, 0.10)  # clearly > 0
DOWN = (-0.10, -0.12, -0.09, -0.11, -0.10)  # clearly < -margin
FLAT = (0.02, -0.03, 0.01, -0.02, 0.02)  # not significant either way


@pytest.mark.parametrize(
    "items,verdict",
    [
        ([UP], Verdict.VERIFIED),
        ([DOWN], Verdict.REFUTED),
        ([FLAT], Verdict.INCONCLUSIVE),
        ([UP, UP], Verdict.VERIFIED),
        ([UP, FLAT], Verdict.PARTLY),
        ([UP, DOWN], Verdict.PARTLY),
        ([FLAT, DOWN], Verdict.REFUTED),
        ([FLAT, FLAT], Verdict.INCONCLUSIVE),
    ],
)
def test_verdict_mapping(items, verdict):
    got, nums, _, _ = R.judge([_it(f"i{k}", d) for k, d in enumerate(items)])
    assert got is verdict
    assert nums["seeds"] == 5


def test_refuted_needs_the_interval_beyond_the_margin_not_just_below_zero():
    below_zero = (-0.030, -0.032, -0.029, -0.031, -0.030)  # significantly < 0 but inside -0.05
    assert R.judge([_it("a", below_zero, margin=0.05)])[0] is Verdict.INCONCLUSIVE
    assert R.judge([_it("a", below_zero, margin=0.02)])[0] is Verdict.REFUTED
    assert R.judge([_it("a", below_zero, margin=0.0)])[0] is Verdict.REFUTED


def test_supports_needs_significance_not_a_positive_mean():
    noisy = (0.3, -0.25, 0.2, -0.1, 0.05)  # mean +0.04, not significant
    v, nums, flags, _ = R.judge([_it("a", noisy)])
    assert nums["a"] > 0 and v is Verdict.INCONCLUSIVE and not flags["a_supports"]


def test_holm_is_applied_across_items():
    # each item alone is significant at 0.025 one-sided but not both at the Holm levels
    a = (0.04, 0.0, 0.07, 0.01, 0.05, -0.01, 0.06)
    p = R.one_sided_p(a, 0.0, True)
    assert 0.0125 < p <= 0.025
    assert R.judge([_it("a", a, margin=0.0)])[0] is Verdict.VERIFIED
    v, _, flags, _ = R.judge([_it("a", a, margin=0.0), _it("b", a, margin=0.0)])
    assert v is Verdict.INCONCLUSIVE and not flags["a_supports"] and not flags["b_supports"]


def test_numbers_are_the_naive_statistics():
    d = (0.1, 0.3, 0.2, 0.25)
    _, nums, flags, _ = R.judge([_it("x", d, margin=0.05)])
    m, lo, hi = R.t_interval(d)
    assert (nums["x"], nums["x_lo"], nums["x_hi"], nums["x_margin"]) == pytest.approx((m, lo, hi, 0.05))
    # an effect item (the default kind): threshold +-margin on both sides
    assert nums["x_p_supports"] == pytest.approx(scipy_stats.ttest_1samp(d, 0.05, alternative="greater").pvalue)
    assert nums["x_p_against"] == pytest.approx(scipy_stats.ttest_1samp(d, -0.05, alternative="less").pvalue)
    assert set(flags) == {"x_supports", "x_against"}


def test_a_run_that_did_not_train_is_inconclusive_whatever_the_items():
    for ran in ({"ran_loss_moved": False}, {"ran_loss_moved": True, "ran_weights_moved": False}):
        v, _, flags, _ = R.judge([_it("a", UP)], ran)
        assert v is Verdict.INCONCLUSIVE and flags["a_supports"]
        assert all(flags[k] is v_ for k, v_ in ran.items())
    assert R.judge([_it("a", UP)], {"ran_loss_moved": True})[0] is Verdict.VERIFIED


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_nan_difference_is_an_error(bad):
    with pytest.raises(ValueError, match="non-finite"):
        R.Item("a", (0.1, bad, 0.2), margin=0.02)


def test_bad_items_are_refused():
    with pytest.raises(ValueError, match="margin"):
        R.Item("a", (0.1, 0.2), margin=-0.01)
    with pytest.raises(ValueError, match="margin"):
        R.Item("a", (0.1, 0.2), margin=math.nan)
    with pytest.raises(ValueError, match="same number of seeds"):
        R.judge([_it("a", (0.1, 0.2, 0.3)), _it("b", (0.1, 0.2))])
    with pytest.raises(ValueError, match="repeat"):
        R.judge([_it("a", UP), _it("a", UP)])
    with pytest.raises(ValueError, match="at least one"):
        R.judge([])


def test_prefix_verdicts_use_the_first_seeds():
    # the first 5 seeds go the claim's way, the later 15 against: the verdict depends on n
    d = (0.1, 0.12, 0.09, 0.11, 0.1) + (-0.2,) * 15
    out = R.prefix_verdicts([_it("a", d)], (3, 5))
    assert out == {"verdict_at_3_seeds": "verified", "verdict_at_5_seeds": "verified"}
    assert R.judge([_it("a", d)])[0] is not Verdict.VERIFIED
    assert R.prefix_verdicts([_it("a", d[:5])], (3, 5)) == {"verdict_at_3_seeds": "verified"}  # n < total only


def test_runlog_items_and_counts():
    log = R.RunLog()
    moved = SimpleNamespace(loss_moved=True, param_change=0.3)
    log.add(moved, 0.2, 0.25)
    log.add(moved, 0.2, 0.2)  # accuracy did not move
    assert log.items() == {"ran_loss_moved": True, "ran_weights_moved": True, "ran_accuracy_moved": False}
    log.add(SimpleNamespace(loss_moved=False, param_change=0.0))
    assert log.items()["ran_loss_moved"] is False and log.items()["ran_weights_moved"] is False
    assert log.numbers() == {"runs": 3, "runs_loss_moved": 2, "runs_weights_moved": 2, "runs_accuracy_moved": 1}
    with pytest.raises(ValueError, match="non-finite accuracy"):
        log.add(moved, 0.2, math.nan)
    with pytest.raises(ValueError, match="no training run"):
        R.RunLog().items()


def test_describe_names_the_state_of_every_item():
    items = [_it("u", UP), _it("d", DOWN), _it("f", FLAT)]
    j = R.judge(items)[3]
    text = R.describe(j)
    assert "u +0.104" in text and "u +0.104 [" in text
    assert [s.split(": ")[-1] for s in text.split("; ")] == ["supports", "against", "not significant"]


def test_rule_text_names_the_unit_and_the_level_judge_uses(monkeypatch):
    assert R.rule_text() == R.RULE_TEXT and R.RULE_TEXT.startswith("rule: per-seed paired differences")
    assert R.rule_text("per-prompt").startswith("rule: per-prompt paired differences")
    assert "one Holm family at 0.05 (two-sided)" in R.RULE_TEXT
    monkeypatch.setattr(R, "ALPHA", 0.01)  # the text states the level the rule runs at, not a copy of it
    assert "one Holm family at 0.01 (two-sided)" in R.rule_text()


def test_every_verdict_is_reachable_and_only_from_its_pattern():
    # exhaustive over 3 items of the three kinds: the verdict is a function of (supports, against) only
    kinds = {"u": UP, "d": DOWN, "f": FLAT}
    for combo in itertools.product("udf", repeat=3):
        v, _, _, _ = R.judge([_it(f"i{k}", kinds[c]) for k, c in enumerate(combo)])
        if all(c == "u" for c in combo):
            assert v is Verdict.VERIFIED
        elif "u" in combo:
            assert v is Verdict.PARTLY
        elif "d" in combo:
            assert v is Verdict.REFUTED
        else:
            assert v is Verdict.INCONCLUSIVE


def test_prefix_verdicts_at_two_seeds_and_empty():
    d = (0.1, 0.12, 0.09, 0.11)
    assert R.prefix_verdicts([_it("a", d)], (2,)) == {"verdict_at_2_seeds": "inconclusive"}  # df = 1
    assert R.prefix_verdicts([_it("a", d)], (1,)) == {}  # one seed has no interval


def test_runlog_accuracy_needs_both_values_and_moves_beyond_1e9():
    moved = SimpleNamespace(loss_moved=True, param_change=0.3)
    log = R.RunLog()
    log.add(moved, 0.2, None)  # no accuracy after the run: nothing recorded
    log.add(moved, None, 0.2)
    assert "ran_accuracy_moved" not in log.items() and log.numbers()["runs_accuracy_moved"] == 0
    log.add(moved, 0.5, 0.5 + 1e-9)  # within rounding of a float pass rate: not moved
    assert log.items()["ran_accuracy_moved"] is False
    log2 = R.RunLog()
    log2.add(moved, 0.5, 0.5 + 1.5e-9)
    assert log2.items()["ran_accuracy_moved"] is True


def test_the_paired_unit_is_seed_unless_named_and_reaches_the_evidence():
    """``unit`` away from its default reaches the judgement and its evidence (what --rejudge reads);
    left out, the unit is ``seed``. A repeated item name is refused."""
    items = [R.Item("a", (0.1, 0.2, 0.3), margin=0.0, kind="direction")]
    assert R.judge(items)[3].unit == "seed" and R.judge(items)[3].evidence()["unit"] == "seed"
    j = R.judge(items, unit="prompt")[3]
    assert j.unit == "prompt" and j.evidence()["unit"] == "prompt"
    with pytest.raises(ValueError, match="item names repeat"):
        R.judge([*items, *items])


def test_rules_item_is_the_claims_item():
    """The llm checks judge ``stats.Item`` itself (one declaration of an item)."""
    assert R.Item is S.Item
    it = R.Item("x", (0.1, 0.2), margin=0.01)
    assert (it.values, it.kind, it.margin) == ((0.1, 0.2), S.EFFECT, 0.01)
