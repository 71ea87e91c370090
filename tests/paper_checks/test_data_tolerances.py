"""The data layer's tolerances, pinned from both sides.

Each paper-internal check compares printed numbers up to their rounding (half a unit of the last printed
digit per number, :func:`~tiltlab.paper_checks.data_checks.halfwidth`). For each tolerance, a number is
moved to one printed unit inside the stated bound (the statement must hold) and one unit outside (it
must fail), so a tolerance that doubled or halved, or a comparison that flipped, moves a verdict."""

from __future__ import annotations

import copy
import math
from dataclasses import replace

import pytest

from tiltlab.claims.registry import Verdict
from tiltlab.paper_checks import data_checks as dc
from tiltlab.paper_checks.data_checks import disa as disa_dc
from tiltlab.paper_checks.data_checks import flowrl as flowrl_dc
from tiltlab.paper_checks.data_checks import fpa as fpa_dc
from tiltlab.paper_checks.data_checks import lad as lad_dc
from tiltlab.paper_checks.data_checks import paced as paced_dc
from tiltlab.paper_checks.data_checks import tables as tables_dc


def _edit(reg, cid: str, fn) -> None:
    """Replace claim ``cid``'s paper numbers by ``fn(copy)`` (the registry is restored after the test)."""
    c = reg.get_claim(cid)
    pn = copy.deepcopy(dict(c.paper_numbers))
    fn(pn)
    reg._CLAIMS[cid] = replace(c, paper_numbers=pn)


def _set_cell(reg, cid: str, row: str, col: str, value: float, key: str = "rows") -> None:
    def f(pn):
        pn[key][row][list(pn["columns"]).index(col)] = value

    _edit(reg, cid, f)


# ------------------------------------------------------------------------ the rounding arithmetic


def test_halfwidth_and_the_relative_gain_interval_against_hand_values():
    assert dc.halfwidth(33.5) == pytest.approx(0.05) and dc.halfwidth(3.31) == pytest.approx(0.005)
    assert tables_dc._diff_tol(33.5, 4.58) == pytest.approx(0.055)
    lo, hi = tables_dc._rel_gain_interval(13.1, 11.7)  # 13.05 / 11.75 - 1 and 13.15 / 11.65 - 1, in percent
    assert lo == pytest.approx(100 * (13.05 / 11.75 - 1), abs=1e-9)
    assert hi == pytest.approx(100 * (13.15 / 11.65 - 1), abs=1e-9)


@pytest.mark.parametrize(
    ("printed", "holds"),
    [(15.1, True), (14.9, True), (15.2, False), (14.8, False)],  # mean 15.0, bound 0.05 + 0.05 = 0.1
)
def test_average_tolerance_is_the_printed_rounding_of_the_average_plus_the_cells(printed, holds):
    pn = {"columns": ["Avg", "A", "B"], "averages": {"Avg": ["A", "B"]}, "rows": {"m": [printed, 10.0, 20.0]}}
    _, worst, problems = dc.average_problems(pn)
    assert worst == pytest.approx(abs(printed - 15.0))
    assert (problems == []) is holds


def test_average_tolerance_shrinks_with_the_cells_printed_precision():
    # two-decimal cells: the bound is 0.05 (the one-decimal average) + 0.005 (the cells) = 0.055
    def pn(a, b):
        return {"columns": ["Avg", "A", "B"], "averages": {"Avg": ["A", "B"]}, "rows": {"m": [15.1, a, b]}}

    assert dc.average_problems(pn(10.05, 20.05))[2] == []  # 15.1 - 15.05 = 0.05: within
    assert len(dc.average_problems(pn(10.04, 20.04))[2]) == 1  # 0.06 > 0.055 (one-decimal cells would allow 0.1)


# ------------------------------------------------------------------------ checks with a stated tolerance


def test_sft_gap_holds_within_the_rounding_of_three_numbers(isolated_registry):
    reg = isolated_registry
    gaps = [
        tables_dc._cell(f"disa.table4.sft_{bb}", "DISA", "Avg") - tables_dc._cell(f"disa.table4.sft_{bb}", "SFT", "Avg")
        for bb in ("qwen2.5_7b", "qwen3_4b")
    ]
    gap = max(gaps)  # the larger of the two backbones' gaps is the one "up to" states
    # bound: 0.05 + 0.05 (the two one-decimal cells) + 0.05 (the one-decimal stated gap) = 0.15
    for delta, want in [
        (0.1, Verdict.VERIFIED),
        (-0.1, Verdict.VERIFIED),
        (0.2, Verdict.REFUTED),
        (-0.2, Verdict.REFUTED),
    ]:
        _edit(reg, "disa.abstract.sft_gap", lambda pn, v=round(gap + delta, 1): pn.update(stated_gap=v))
        assert disa_dc.disa_sft_gap(0).verdict is want, delta


def test_fpa_stated_gain_holds_within_one_tenth_plus_its_rounding(isolated_registry):
    reg = isolated_registry
    cid = "fpa.text.gains_qwen2.5_math_7b"
    cols, t = tables_dc._table("fpa.table1.math_qwen2.5_math_7b")
    i = cols.index("MATH500")
    actual = t["FPA"][i] - t["Off-RL"][i]
    # bound: 0.1 (difference of two one-decimal cells) + 0.05 (the one-decimal stated gain) = 0.15
    for delta, holds in [(0.1, True), (-0.1, True), (0.2, False), (-0.2, False)]:
        _edit(reg, cid, lambda pn, v=round(actual + delta, 1): pn["stated_gain_points"].update(MATH500=v))
        res = fpa_dc.fpa_gains_qwen25(0)
        assert res.items["s2"] is holds, delta  # MATH500 is the second stated gain
        assert res.items["s1"] is True  # the Avg statement is untouched


def test_lad_margins_hold_within_a_hundredth(isolated_registry):
    reg = isolated_registry
    st = reg.get_claim("lad.text.math_margins").paper_numbers["stated"]
    m_aime = lad_dc.lad_math_margins(0).numbers["aime24_margin"]
    m_amc = lad_dc.lad_math_margins(0).numbers["amc_margin"]
    assert lad_dc.lad_math_margins(0).verdict is Verdict.VERIFIED
    # AIME24: |margin - stated| <= 0.01; AMC: <= 0.01 + the stated number's rounding (0.005 at 2 decimals)
    cases = [("aime24_margin", m_aime, 0.01, True), ("aime24_margin", m_aime, 0.02, False)]
    cases += [("amc_margin", m_amc, 0.01, True), ("amc_margin", m_amc, -0.01, True), ("amc_margin", m_amc, 0.02, False)]
    for key, m, delta, holds in cases:
        v = round(m + delta, 2)

        def f(pn, key=key, v=v):
            pn["stated"] = dict(st, **{key: v})

        _edit(reg, "lad.text.math_margins", f)
        res = lad_dc.lad_math_margins(0)
        assert res.items["s2" if key == "aime24_margin" else "s3"] is holds, (key, delta)
    # Pass@32 margin vs FlowRL: the same 0.01
    cols, t7 = tables_dc._table("lad.table7.pass32_qwen2.5_7b")
    ia = cols.index("Average")
    m32 = t7["LAD"][ia] - t7["FlowRL"][ia]
    for delta, holds in [(0.01, True), (0.02, False), (-0.02, False)]:
        _edit(
            reg,
            "lad.text.math_margins",
            lambda pn, v=round(m32 + delta, 2): pn.update(stated=dict(st, pass32_margin_vs_flowrl=v)),
        )
        assert lad_dc.lad_math_margins(0).items["s4"] is holds, delta


@pytest.mark.parametrize(("disa_minus_flowrl", "holds"), [(-0.1, True), (0.0, True), (-0.2, False)])
def test_disa_matches_flowrl_within_the_cells_rounding(isolated_registry, disa_minus_flowrl, holds):
    # "DISA matches FlowRL": DISA >= FlowRL - (0.05 + 0.05) for one-decimal averages
    cid = "disa.table1.math_qwen2.5_7b"
    f = tables_dc._cell(cid, "FlowRL", "Avg")
    _set_cell(isolated_registry, cid, "DISA", "Avg", round(f + disa_minus_flowrl, 1))
    assert flowrl_dc.flowrl_disa_matches(0).items["s1"] is holds


@pytest.mark.parametrize(("flowrl_minus_grpo", "holds"), [(0.2, True), (0.3, True), (0.1, False), (0.0, False)])
def test_flowrl_beats_grpo_only_beyond_the_cells_rounding(isolated_registry, flowrl_minus_grpo, holds):
    # FlowRL > GRPO + (0.05 + 0.05): a gap of 0.2 holds (a tolerance doubled to 0.2 would fail it), a gap
    # of 0.1 sits on the bound and does not (a halved tolerance would pass it); 32.8 + 0.1 and 32.9 are
    # the same float here
    cid = "disa.table1.math_qwen2.5_7b"
    g = tables_dc._cell(cid, "GRPO", "Avg")
    _set_cell(isolated_registry, cid, "FlowRL", "Avg", round(g + flowrl_minus_grpo, 1))
    assert flowrl_dc.flowrl_vs_grpo(0).items["s1"] is holds


@pytest.mark.parametrize(("kl_minus_off", "holds"), [(0.0, True), (0.1, True), (-1.0, True), (0.2, False)])
def test_kl_no_gain_within_the_cells_rounding(isolated_registry, kl_minus_off, holds):
    # "no gain": w/ KL <= Off-RL + (0.05 + 0.05); 0.1 above sits on the bound (46.3 + 0.1 == 46.4 as floats)
    cid = "fpa.table2.ablation"
    off = tables_dc._cell(cid, "Off-RL", "Avg")
    _set_cell(isolated_registry, cid, "w/ KL", "Avg", round(off + kl_minus_off, 1))
    assert (fpa_dc.fpa_kl_no_gain(0).verdict is Verdict.VERIFIED) is holds


def test_fpa_gain_summary_names_the_column_a_wrong_stated_gain_belongs_to(isolated_registry):
    """A stated gain that misses its column is attributed to every other column whose table gain is
    within 0.1 of it; a stated gain that holds is never attributed (the real case: Qwen3-4B's text
    states +7.8 for GaoKao, which is MATH500's gain)."""
    reg = isolated_registry
    cid = "fpa.text.gains_qwen3_4b"
    # table gains (FPA - Off-RL): GSM8K 4.8, MATH500 7.8, MATH-P 7.0, GaoKao 6.8, Olympiad 4.7, AMC 5.9, Avg 5.5
    got = fpa_dc.fpa_gains_qwen3(0).summary
    assert "GaoKao: stated +7.8, table +6.8 (+7.8 is the MATH500 gain)" in got
    assert "MATH500: stated +6.5, table +7.8;" in got  # misses, but no column has a gain within 0.1 of 6.5
    # 0.1 away from MATH500's gain is still attributed; 0.2 away is not
    _edit(reg, cid, lambda pn: pn["stated_gain_points"].update(GaoKao=7.9))
    assert "GaoKao: stated +7.9, table +6.8 (+7.9 is the MATH500 gain)" in fpa_dc.fpa_gains_qwen3(0).summary
    _edit(reg, cid, lambda pn: pn["stated_gain_points"].update(GaoKao=8.0))
    assert fpa_dc.fpa_gains_qwen3(0).summary.endswith("GaoKao: stated +8, table +6.8")
    # a stated gain that holds (GSM8K +4.8) is not attributed to Olympiad (+4.7) although it is within 0.1
    _edit(reg, cid, lambda pn: pn["stated_gain_points"].update(GSM8K=4.8))
    res = fpa_dc.fpa_gains_qwen3(0)
    assert "is the Olympiad gain" not in res.summary and "GSM8K" not in res.summary  # passes are not listed


def test_aime25_lilo_gain_holds_inside_the_rounding_interval_only(isolated_registry):
    reg = isolated_registry
    lo, hi = tables_dc._rel_gain_interval(13.1, 11.7)  # 11.06% .. 12.88%; the stated number has one decimal (±0.05)
    # the one-decimal values nearest the widened bounds [lo - 0.05, hi + 0.05] = [11.01, 12.93], each side
    top, bottom = math.floor((hi + 0.05) * 10) / 10, math.ceil((lo - 0.05) * 10) / 10
    assert (top, bottom) == (12.9, 11.1)
    inside = [top, bottom, math.floor(hi * 10) / 10, 11.9]
    outside = [round(top + 0.1, 1), round(bottom - 0.1, 1), round(math.ceil((hi + 0.05) * 10) / 10 + 0.1, 1)]
    for s, want in [(s, Verdict.VERIFIED) for s in inside] + [(s, Verdict.REFUTED) for s in outside]:
        _edit(reg, "paced.text.aime25_lilo_gain", lambda pn, s=s: pn.update(stated_rel_gain=s))
        assert paced_dc.paced_aime25_lilo(0).verdict is want, s
    # the cells must also be Table 1's: a stated pair that differs from the table refutes
    _edit(reg, "paced.text.aime25_lilo_gain", lambda pn: pn.update(stated_rel_gain=11.9, paced=13.2))
    assert paced_dc.paced_aime25_lilo(0).verdict is Verdict.REFUTED


@pytest.mark.parametrize(
    ("ratio", "want"),
    # exactly two orders (log10(100) == 2.0 in floats) is "at least two": it holds
    [(10**2 * 1.01, Verdict.VERIFIED), (100.0, Verdict.VERIFIED), (10**2 * 0.99, Verdict.REFUTED)],
)
def test_z_overhead_needs_the_stated_orders_of_magnitude(isolated_registry, ratio, want):
    def f(pn):
        pn["rows"]["Qwen2.5-Math-7B"] = [1.0, ratio]

    _edit(isolated_registry, "paced.table3.z_overhead", f)
    assert paced_dc.paced_z_overhead(0).verdict is want


@pytest.mark.parametrize(("delta", "want"), [(0.1, Verdict.VERIFIED), (0.0, Verdict.REFUTED), (-0.1, Verdict.REFUTED)])
def test_replay_gain_must_be_positive_in_every_column(isolated_registry, delta, want):
    cid = "paced.table2.replay"
    base = tables_dc._cell(cid, "w/o Replay", "Minerva")
    _set_cell(isolated_registry, cid, "PACED-RL", "Minerva", round(base + delta, 1))
    assert paced_dc.paced_replay(0).verdict is want


@pytest.mark.parametrize(("margin", "holds"), [(0.5, True), (0.01, True), (0.0, False)])
def test_lad_best_average_needs_a_positive_margin(isolated_registry, margin, holds):
    # "LAD best Avg@32": LAD's average strictly above every other method's (and equal to the stated one)
    reg = isolated_registry
    cid = "lad.table1.math_qwen2.5_7b"
    cols, t = tables_dc._table(cid)
    ia = cols.index("Average")
    best_other = max(v[ia] for k, v in t.items() if k != "LAD")
    lad = round(best_other + margin, 2)
    _set_cell(reg, cid, "LAD", "Average", lad)
    st = reg.get_claim("lad.text.math_margins").paper_numbers["stated"]
    _edit(reg, "lad.text.math_margins", lambda pn: pn.update(stated=dict(st, avg32=lad)))
    assert lad_dc.lad_math_margins(0).items["s1"] is holds
