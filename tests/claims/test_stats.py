"""tiltlab.claims.stats: intervals and p-values against scipy, Holm against a naive implementation, and
the decision rule at its boundaries."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from scipy import stats as sps

from tiltlab.claims import stats

DIFFS = [0.31, -0.12, 0.48, 0.22, 0.05, 0.37, 0.11, 0.6, -0.2, 0.29, 0.24, 0.16]


@pytest.mark.parametrize("n", [2, 3, 5, 11, 12, 40])
@pytest.mark.parametrize("level", [0.9, 0.95, 0.99])
def test_paired_t_ci_matches_scipy(n, level):
    rng = random.Random(n)
    d = [rng.gauss(0.2, 1.0) for _ in range(n)]
    m, lo, hi = stats.paired_t_ci(d, level)
    ref = sps.ttest_1samp(d, 0.0).confidence_interval(level)
    # both are closed-form in float64; 1e-12 is round-off of a sum of n <= 40 terms of size O(1)
    assert m == pytest.approx(sum(d) / n, abs=1e-12)
    assert (lo, hi) == pytest.approx((ref.low, ref.high), abs=1e-12)


def test_paired_t_ci_uses_exact_quantile_for_large_df():
    """df = 11: the interval's half-width is t_{0.975, 11} = 2.201 standard errors, not 1.96."""
    m, _, hi = stats.paired_t_ci(DIFFS)
    sd = math.sqrt(sum((v - m) ** 2 for v in DIFFS) / (len(DIFFS) - 1))
    assert (hi - m) / (sd / math.sqrt(len(DIFFS))) == pytest.approx(2.200985, abs=1e-6)  # scipy t.ppf(.975, 11)


@pytest.mark.parametrize("alternative", ["two-sided", "greater", "less"])
@pytest.mark.parametrize("null", [0.0, 0.1, -0.3])
def test_t_pvalue_matches_scipy(alternative, null):
    ref = sps.ttest_1samp(DIFFS, null, alternative=alternative).pvalue
    assert stats.t_pvalue(DIFFS, null, alternative) == pytest.approx(ref, rel=1e-10, abs=1e-15)


def test_t_pvalue_zero_spread():
    assert stats.t_pvalue([0.2, 0.2, 0.2], 0.0, "greater") == 0.0
    assert stats.t_pvalue([0.2, 0.2, 0.2], 0.0, "less") == 1.0
    assert stats.t_pvalue([0.2, 0.2, 0.2], 0.2, "greater") == 1.0
    assert stats.t_pvalue([0.0, 0.0], 0.0) == 1.0


@pytest.mark.parametrize(
    "bad, match",
    [
        ([0.1], "at least 2"),
        ([0.1, float("nan")], "finite"),
        ([0.1, float("inf"), 0.2], "finite"),
        (["a", 0.1], "sequence of numbers"),
    ],
)
def test_bad_diffs_raise(bad, match):
    with pytest.raises(ValueError, match=match):
        stats.paired_t_ci(bad)
    with pytest.raises(ValueError, match=match):
        stats.decide({"a": bad}, 0.0)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="level"):
        stats.paired_t_ci(DIFFS, 1.0)
    with pytest.raises(ValueError, match="alternative"):
        stats.t_pvalue(DIFFS, 0.0, "bigger")
    with pytest.raises(ValueError, match="margin"):
        stats.decide({"a": DIFFS}, -0.1)
    with pytest.raises(ValueError, match="margin"):
        stats.decide({"a": DIFFS}, float("nan"))
    with pytest.raises(ValueError, match="direction"):
        stats.decide({"a": DIFFS}, 0.0, direction="up")
    with pytest.raises(ValueError, match="at least one item"):
        stats.decide({}, 0.0)
    with pytest.raises(ValueError, match="pvalues"):
        stats.holm([0.5, 1.2])


def naive_holm(p, alpha):
    """Holm via adjusted p-values: p_adj_(i) = max_{j <= i} min(1, (k - j + 1) p_(j)); reject p_adj <= alpha."""
    k = len(p)
    order = sorted(range(k), key=lambda i: p[i])
    adj, run = [0.0] * k, 0.0
    for rank, i in enumerate(order):
        run = max(run, min(1.0, (k - rank) * p[i]))
        adj[i] = run
    return [a <= alpha for a in adj]


def test_holm_matches_naive_adjusted_pvalues():
    rng = random.Random(0)
    for k in (1, 2, 3, 5, 8):
        for _ in range(200):
            p = [rng.random() ** 3 for _ in range(k)]
            for alpha in (0.05, 0.1):
                assert stats.holm(p, alpha) == naive_holm(p, alpha), (p, alpha)


def test_holm_textbook_and_boundaries():
    # k = 3 at alpha = 0.05: thresholds 0.05/3, 0.05/2, 0.05
    assert stats.holm([0.01, 0.04, 0.02], 0.05) == [True, True, True]
    assert stats.holm([0.01, 0.04, 0.026], 0.05) == [True, False, False]  # 0.026 > 0.025 stops the descent
    assert stats.holm([0.0167, 0.001, 0.9], 0.05) == [True, True, False]  # 0.001 <= 0.05/3, 0.0167 <= 0.05/2
    assert stats.holm([0.05 / 3, 0.05 / 2, 0.05], 0.05) == [True, True, True]  # equality rejects
    assert stats.holm([0.05 / 3 + 1e-12, 0.0, 0.0], 0.05) == [True, True, True]  # third threshold is 0.05
    assert stats.holm([0.02, 0.02], 0.05) == [True, True]
    assert stats.holm([0.03, 0.03], 0.05) == [False, False]
    assert stats.holm([], 0.05) == []


def test_holm_is_stricter_than_unadjusted():
    p = [0.01, 0.02, 0.03, 0.04]
    assert stats.holm(p, 0.05) == [True, False, False, False]
    assert all(v <= 0.05 for v in p)


def shifted(base, target_lo, level=0.95):
    """``base`` shifted so that its two-sided interval's lower end sits at ``target_lo``."""
    _, lo, _ = stats.paired_t_ci(base, level)
    return [v + target_lo - lo for v in base]


@pytest.mark.parametrize("direction, sign", [("greater", 1.0), ("less", -1.0)])
def test_decide_one_item_is_the_interval_rule(direction, sign):
    margin, eps = 0.05, 1e-6
    just_in = shifted(DIFFS, margin + eps)  # lower end just above +margin
    just_out = shifted(DIFFS, margin - eps)
    d = stats.decide({"a": [sign * v for v in just_in]}, margin, direction)
    assert d.verdict == "verified" and d.items["a"].outcome == stats.SUPPORTS
    assert d.items["a"].lo == pytest.approx(margin + eps, abs=1e-9)
    d = stats.decide({"a": [sign * v for v in just_out]}, margin, direction)
    assert d.verdict == "inconclusive" and d.items["a"].outcome == stats.UNDECIDED
    # the mirror image: upper end just below -margin is against, just above it undecided
    neg_in = [-v for v in just_in]
    neg_out = [-v for v in just_out]
    assert stats.decide({"a": [sign * v for v in neg_in]}, margin, direction).verdict == "refuted"
    assert stats.decide({"a": [sign * v for v in neg_out]}, margin, direction).verdict == "inconclusive"


def test_decide_significant_but_within_margin_is_inconclusive():
    d = [0.02 + 0.001 * i for i in range(10)]  # clearly > 0, but below a 0.05 margin
    assert stats.decide({"a": d}, 0.0).verdict == "verified"
    assert stats.decide({"a": d}, 0.05).verdict == "inconclusive"
    assert stats.decide({"a": [-v for v in d]}, 0.0).verdict == "refuted"
    assert stats.decide({"a": [-v for v in d]}, 0.05).verdict == "inconclusive"


def test_decide_noop_and_zero_spread():
    assert stats.decide({"a": [0.0] * 8}, 0.0).verdict == "inconclusive"
    assert stats.decide({"a": [0.1] * 8}, 0.05).verdict == "verified"  # deterministic effect beyond margin
    assert stats.decide({"a": [0.05] * 8}, 0.05).verdict == "inconclusive"  # exactly at the margin


def test_decide_holm_family():
    """Two items each just significant alone (p ~ 0.04) are not both significant as a family."""
    base = shifted(DIFFS, 0.0)  # lower end of the 95% interval at 0: one-sided p = 0.025
    just = [v + 0.002 for v in base]
    p1 = stats.decide({"a": just}, 0.0).items["a"].p
    assert 0.03 < p1 < 0.05
    one = stats.decide({"a": just}, 0.0)
    two = stats.decide({"a": just, "b": just}, 0.0)
    assert one.verdict == "verified"
    assert two.verdict == "inconclusive" and {it.outcome for it in two.items.values()} == {stats.UNDECIDED}
    # a strong item passes, then the weak one faces alpha (not alpha/2) and passes too
    strong = [v + 1.0 for v in DIFFS]
    mixed = stats.decide({"a": strong, "b": just}, 0.0)
    assert mixed.verdict == "verified"
    assert stats.holm([mixed.items["a"].p, mixed.items["b"].p]) == [True, True]
    # the p-value is two-sided: a weak item in the other direction is undecided, a strong one against
    assert stats.decide({"a": strong, "b": [-v for v in strong]}, 0.0).verdict == "partly"


def test_aggregate_table():
    S, A, U = stats.SUPPORTS, stats.AGAINST, stats.UNDECIDED
    expect = {
        (S, S): "verified",
        (S, U): "partly",
        (S, A): "partly",
        (U, U): "inconclusive",
        (U, A): "refuted",
        (A, A): "refuted",
    }
    for combo in itertools.product((S, A, U), repeat=2):
        key = tuple(sorted(combo, key=(S, U, A).index))
        assert stats.aggregate(combo) == expect[key], combo
    with pytest.raises(ValueError, match="outcomes"):
        stats.aggregate(["maybe"])
    with pytest.raises(ValueError, match="at least one"):
        stats.aggregate([])


def test_decision_numbers_are_finite_and_oriented():
    d = stats.decide({"x": [-v for v in DIFFS]}, 0.0, direction="less")
    n = d.numbers("gain_")
    assert set(n) == {"gain_x_mean", "gain_x_lo", "gain_x_hi", "gain_x_p"}
    assert all(math.isfinite(v) for v in n.values())
    assert n["gain_x_mean"] == pytest.approx(sum(DIFFS) / len(DIFFS))  # oriented: positive = paper's direction
    assert d.verdict == "verified"


def test_decide_custom_combine():
    d = stats.decide(
        {"a": [0.0, 0.0], "b": [1.0, 1.1, 1.05, 0.95]},
        0.0,
        combine=lambda o: "verified" if stats.SUPPORTS in o else "refuted",
    )
    assert d.verdict == "verified"


def test_decide_per_item_margins():
    d = [0.02 + 0.001 * i for i in range(10)]  # interval about [0.022, 0.027]
    dec = stats.decide({"a": d, "b": d}, {"a": 0.0, "b": 0.05})
    assert (dec.items["a"].outcome, dec.items["b"].outcome) == (stats.SUPPORTS, stats.UNDECIDED)
    assert dec.verdict == "partly" and dec.margin == {"a": 0.0, "b": 0.05}
    # non-inferiority by shifting: "not worse by more than 0.03" holds for d - 0.04 (about -0.016), not for d - 0.06
    assert stats.decide({"ni": [v - 0.04 + 0.03 for v in d]}, {"ni": 0.0}).verdict == "verified"
    assert stats.decide({"ni": [v - 0.06 + 0.03 for v in d]}, {"ni": 0.0}).verdict == "refuted"
    with pytest.raises(ValueError, match="exactly the items"):
        stats.decide({"a": d, "b": d}, {"a": 0.0})
    with pytest.raises(ValueError, match="item 'b'"):
        stats.decide({"a": d, "b": d}, {"a": 0.0, "b": -1.0})
    with pytest.raises(ValueError, match="margin"):
        stats.decide({"a": d}, True)


def test_defaults_and_edges_pinned():
    """Defaults (null 0, alpha 0.05) and edges that the other tests pass explicitly."""
    assert stats.t_pvalue(DIFFS) == pytest.approx(sps.ttest_1samp(DIFFS, 0.0).pvalue, rel=1e-10)
    assert stats.holm([0.03, 0.03]) == [False, False] and stats.holm([0.02, 0.02]) == [True, True]  # alpha 0.05
    # zero spread below the null: the statistic is -inf, whatever the null's sign
    assert stats.t_pvalue([0.2, 0.2, 0.2], 0.3, "greater") == 1.0
    assert stats.t_pvalue([0.2, 0.2, 0.2], 0.3, "less") == 0.0
    for bad in (0.0, 1.0, -0.1):
        with pytest.raises(ValueError, match="level"):
            stats.paired_t_ci(DIFFS, bad)
        with pytest.raises(ValueError, match="level"):
            stats.holm([0.01], bad)


def test_a_decision_and_its_items_cannot_be_edited_after_the_fact():
    """A verdict is read off a Decision; neither it nor its item tests may be changed in place
    (frozen dataclasses: a report cannot show a verdict its statistics did not give)."""
    import dataclasses

    d = stats.decide({"a": [0.3, 0.4, 0.5, 0.35]}, 0.01)
    item = d.items["a"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.verdict = "verified"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        item.outcome = stats.AGAINST  # type: ignore[misc]


@pytest.mark.parametrize("df", [1, 2, 3, 4, 7, 11, 29, 30, 120, 10_000])
def test_t_functions_equal_scipy_stats_t_bit_for_bit(df):
    """``t_quantile`` / ``t_pvalue`` evaluate Student's t through ``scipy.special`` (no ``scipy.stats`` import);
    they must return exactly what ``scipy.stats.t`` returns, so no interval or p-value moves."""
    qs = [1e-12, 0.01, 0.025, 0.05, 0.3, 0.5, 0.8, 0.95, 0.975, 0.995, 1 - 1e-12]
    assert [stats.t_quantile(q, df) for q in qs] == [float(sps.t.ppf(q, df)) for q in qs]
    rng = random.Random(df)
    for _ in range(20):
        d = [rng.gauss(0.1, 1.0) for _ in range(df + 1)] if df < 200 else [rng.gauss(0.1, 1.0) for _ in range(3)]
        n = len(d)
        got = {alt: stats.t_pvalue(d, 0.05, alt) for alt in ("two-sided", "greater", "less")}
        # the same statistic through scipy.stats.t: only the t functions differ between the two sides
        m2, sd2 = stats.mean_sd(d)
        stat = (m2 - 0.05) / (sd2 / math.sqrt(n))
        want = {
            "greater": float(sps.t.sf(stat, n - 1)),
            "less": float(sps.t.cdf(stat, n - 1)),
            "two-sided": float(min(1.0, 2.0 * sps.t.sf(abs(stat), n - 1))),
        }
        assert got == want


@pytest.mark.parametrize("q", [0.0, 1.0, -0.1, 1.5, float("nan")])
def test_t_quantile_refuses_a_probability_outside_0_1(q):
    with pytest.raises(ValueError, match="q must be in"):
        stats.t_quantile(q, 5)


def test_decide_judges_at_the_level_it_is_given_not_the_default():
    """``alpha`` away from its default reaches the rule: an item whose two-sided p-value lies between
    0.05 and 0.2 supports at 0.2 and is undecided at 0.05 (its p-value is the same at both levels)."""
    d = [0.3, -0.1, 0.5, 0.2, -0.2, 0.4, 0.1]
    p = 2 * stats.t_pvalue(d, 0.0, "greater")
    assert 0.05 < p < 0.2
    wide, strict = stats.decide({"a": d}, 0.0, alpha=0.2), stats.decide({"a": d}, 0.0)
    assert (wide.verdict, wide.items["a"].outcome, wide.alpha) == ("verified", stats.SUPPORTS, 0.2)
    assert (strict.verdict, strict.items["a"].outcome, strict.alpha) == ("inconclusive", stats.UNDECIDED, 0.05)
    assert wide.items["a"].p == strict.items["a"].p == pytest.approx(p, rel=1e-12)
    assert wide.judgement is not None and wide.judgement.alpha == 0.2
    lo_wide, lo_strict = wide.items["a"].lo, strict.items["a"].lo  # the interval is the (1 - alpha) one
    assert lo_wide > 0 > lo_strict


def test_judge_refuses_items_that_share_a_name():
    """Two items of one name would share one test, one flag and one Holm slot: refused, whatever else
    differs between them (a different kind or margin included)."""
    a = stats.Item("a", (0.1, 0.2, 0.3), stats.DIRECTION, 0.0)
    b = stats.Item("a", (0.5, 0.6, 0.7), stats.EFFECT, 0.1)
    with pytest.raises(ValueError, match=r"item names repeat: \['a', 'a'\]"):
        stats.judge([a, b])
    with pytest.raises(ValueError, match="item names repeat"):
        stats.judge([a, a])
    assert stats.judge([a, stats.Item("b", b.values, b.kind, b.margin)]).family == ["a", "b"]


def test_decide_refuses_an_item_that_is_both_sampled_and_exact():
    with pytest.raises(ValueError, match=r"an item is both sampled and exact: \['a', 'a'\]"):
        stats.decide({"a": [0.1, 0.2, 0.3]}, 0.0, exact={"a": 0.5})
