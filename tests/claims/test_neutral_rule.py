"""The one decision rule (``stats.judge``): symmetric by design, item kinds, context items outside every
family, exact items, the other-threshold verdict and re-derivation from the recorded raw values."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import scipy.stats as scipy_stats

from tiltlab.claims import llm_record, prereg, registry, rejudging, stats
from tiltlab.claims import rows as record_rows
from tiltlab.claims.registry import CheckResult, Verdict
from tiltlab.paper_checks import catalog

SHIPPED = Path(__file__).resolve().parents[2] / "paper_checks" / "records" / "llm.json"
#: The llm record as shipped before the neutral rule's re-run (2026-11-28), with the preregistration file of
#: that day (its [[legacy]] entries): the legacy machinery is tested on it.
LEGACY = Path(__file__).with_name("data") / "llm_legacy.json"
LEGACY_PREREG = Path(__file__).with_name("data") / "preregistration_legacy.toml"


@pytest.fixture
def legacy_registration(monkeypatch):
    monkeypatch.setattr(prereg, "PREREG_FILE", LEGACY_PREREG)
    assert prereg.legacy_runs()


def _draws(seed: int, n: int, mu: float, sd: float) -> tuple[float, ...]:
    rng = random.Random(seed)
    return tuple(rng.gauss(mu, sd) for _ in range(n))


@pytest.mark.parametrize("kind", [stats.DIRECTION, stats.EFFECT])
@pytest.mark.parametrize("seed", range(12))
def test_the_rule_is_symmetric_in_the_sign_of_the_differences(kind, seed):
    rng = random.Random(1000 + seed)
    d = _draws(seed, rng.choice((3, 5, 20)), rng.uniform(-0.1, 0.1), rng.uniform(0.005, 0.08))
    neg = tuple(-x for x in d)
    a = stats.judge([stats.Item("x", d, kind, 0.02)])
    b = stats.judge([stats.Item("x", neg, kind, 0.02)])
    ta, tb = a.tests["x"], b.tests["x"]
    assert ta.p_supports == pytest.approx(tb.p_against, rel=1e-12, abs=1e-300)
    assert ta.p_against == pytest.approx(tb.p_supports, rel=1e-12, abs=1e-300)
    swap = {stats.SUPPORTS: stats.AGAINST, stats.AGAINST: stats.SUPPORTS, stats.UNDECIDED: stats.UNDECIDED}
    assert tb.outcome == swap[ta.outcome]
    flip = {"verified": "refuted", "refuted": "verified", "inconclusive": "inconclusive"}
    assert b.verdict == flip[a.verdict] and b.alt_verdict == flip[a.alt_verdict]


def test_direction_and_effect_differ_only_in_the_threshold_and_show_each_other():
    small = (0.010, 0.011, 0.009, 0.010, 0.012, 0.010)  # clearly > 0, clearly < 0.02
    d = stats.judge([stats.Item("x", small, stats.DIRECTION, 0.02)])
    e = stats.judge([stats.Item("x", small, stats.EFFECT, 0.02)])
    assert (d.verdict, d.alt_verdict) == ("verified", "inconclusive")  # above 0, not beyond +-0.02
    assert (e.verdict, e.alt_verdict) == ("inconclusive", "verified")
    assert e.tests["x"].threshold == 0.02 and d.tests["x"].threshold == 0.0
    assert e.verdict == d.alt_verdict and d.verdict == e.alt_verdict


def test_effect_threshold_on_both_sides_against_scipy():
    d = (0.01, 0.05, 0.03, 0.02, 0.04)
    t = stats.judge([stats.Item("x", d, stats.EFFECT, 0.02)]).tests["x"]
    assert t.p_supports == pytest.approx(scipy_stats.ttest_1samp(d, 0.02, alternative="greater").pvalue, rel=1e-10)
    assert t.p_against == pytest.approx(scipy_stats.ttest_1samp(d, -0.02, alternative="less").pvalue, rel=1e-10)
    assert t.p == pytest.approx(min(1.0, 2 * min(t.p_supports, t.p_against)))


@pytest.mark.parametrize(
    "values,outcome",
    [
        ((0.001, -0.002, 0.0015, -0.001, 0.0005, 0.0), stats.SUPPORTS),  # tight inside +-0.02
        ((0.30, 0.31, 0.29, 0.305, 0.295, 0.30), stats.AGAINST),  # far above +0.02
        ((-0.30, -0.31, -0.29, -0.305, -0.295, -0.30), stats.AGAINST),  # far below -0.02
        ((0.2, -0.2, 0.15, -0.1, 0.05, -0.05), stats.UNDECIDED),  # too wide to tell
    ],
)
def test_equivalence_items_are_two_one_sided_tests(values, outcome):
    t = stats.judge([stats.Item("x", values, stats.EQUIVALENCE, 0.02)]).tests["x"]
    assert t.outcome == outcome
    tost = max(
        scipy_stats.ttest_1samp(values, -0.02, alternative="greater").pvalue,
        scipy_stats.ttest_1samp(values, 0.02, alternative="less").pvalue,
    )
    assert t.p_supports == pytest.approx(tost, rel=1e-10)
    with pytest.raises(ValueError, match="margin > 0"):
        stats.Item("x", values, stats.EQUIVALENCE, 0.0)


def test_context_items_never_enter_the_family_nor_the_verdict():
    a = (0.04, 0.0, 0.07, 0.01, 0.05, -0.01, 0.06)  # alone supports at 0.05; not with a second family member
    huge = (5.0, 5.1, 4.9, 5.0, 5.05, 4.95, 5.0)
    assert stats.judge([stats.Item("a", a, stats.DIRECTION)]).verdict == "verified"
    with_ctx = stats.judge([stats.Item("a", a, stats.DIRECTION), stats.Item("c", huge, stats.CONTEXT, 0.1)])
    assert with_ctx.verdict == "verified" and with_ctx.family == ["a"]
    assert with_ctx.tests["c"].outcome == stats.CONTEXT and "c_supports" not in with_ctx.flags()
    # the same number as a judged item is in the family and changes a's Holm level
    judged = stats.judge([stats.Item("a", a, stats.DIRECTION), stats.Item("c", huge, stats.DIRECTION, 0.1)])
    assert judged.family == ["a", "c"]
    against = stats.judge(
        [stats.Item("a", a, stats.DIRECTION), stats.Item("c", tuple(-x for x in huge), stats.CONTEXT, 0.1)]
    )
    assert against.verdict == "verified"  # a context item against the paper refutes nothing either
    with pytest.raises(ValueError, match="at least one judged"):
        stats.judge([stats.Item("c", huge, stats.CONTEXT, 0.1)])


def test_exact_items_judge_by_value_outside_the_family():
    j = stats.judge(
        [
            stats.Item("s", (0.1, 0.12, 0.11), stats.EFFECT, 0.01),
            stats.Item("e", (-0.5,), stats.EFFECT, 0.01, exact=True),
        ]
    )
    assert j.tests["e"].outcome == stats.AGAINST and j.family == ["s"] and j.verdict == "partly"
    assert (
        stats.judge([stats.Item("e", (0.005,), stats.EFFECT, 0.01, exact=True), stats.Item("s", (0.1, 0.12, 0.11))])
        .tests["e"]
        .outcome
        == stats.UNDECIDED
    )
    with pytest.raises(ValueError, match="one value"):
        stats.Item("e", (0.1, 0.2), exact=True)


def test_ran_flags_cap_and_not_ran():
    up = (0.1, 0.12, 0.09, 0.11, 0.1)
    it = stats.Item("x", up, stats.DIRECTION)
    assert stats.judge([it], {"ran": False}).verdict == "inconclusive"
    assert stats.judge([it], {"ran": False}, not_ran="refuted").verdict == "refuted"
    assert stats.judge([it], {"ran": True}, cap="partly").verdict == "partly"
    assert stats.judge([it], {"ran": True}).verdict == "verified"
    with pytest.raises(ValueError, match="not_ran"):
        stats.judge([it], not_ran="verified")


def test_a_no_op_and_a_nan_variant_fail():
    zeros = (0.0,) * 6
    j = stats.judge([stats.Item("x", zeros, stats.DIRECTION)])
    assert j.verdict == "inconclusive" and j.tests["x"].p == 1.0  # no effect supports nothing
    with pytest.raises(ValueError, match="finite"):
        stats.Item("x", (0.1, math.nan, 0.2))
    with pytest.raises(ValueError, match="kind"):
        stats.Item("x", (0.1, 0.2), "strong")


@pytest.mark.parametrize("seed", range(6))
def test_rejudge_re_derives_every_number_from_the_evidence(seed):
    rng = random.Random(seed)
    items = [
        stats.Item("a", _draws(seed, 8, 0.03, 0.02), stats.DIRECTION, 0.02),
        stats.Item("b", _draws(seed + 50, 8, -0.04, 0.02), stats.EFFECT, 0.02),
        stats.Item("c", _draws(seed + 90, 8, 0.0, 0.005), stats.EQUIVALENCE, 0.02),
        stats.Item("k", _draws(seed + 7, 8, 1.0, 0.1), stats.CONTEXT, 0.1),
        stats.Item("e", (rng.uniform(-0.05, 0.05),), stats.EFFECT, 0.01, exact=True),
    ]
    j = stats.judge(items, {"ran": True}, cap=rng.choice((None, "partly")))
    ev = j.evidence()
    again = stats.rejudge(ev)
    assert (again.verdict, again.alt_verdict, again.tests) == (j.verdict, j.alt_verdict, j.tests)
    ev["items"][0]["values"] = [-v for v in ev["items"][0]["values"]]  # a tampered record re-derives differently
    assert stats.rejudge(ev).tests["a"] != j.tests["a"]
    with pytest.raises(ValueError, match="lacks field"):
        stats.rejudge({"items": []})


def test_decide_is_the_effect_rule_with_its_margin():
    d = {"x": (0.05, 0.04, 0.06, 0.05), "y": (0.001, 0.002, 0.0, 0.001)}
    dec = stats.decide(d, {"x": 0.01, "y": 0.0})
    j = dec.judgement
    assert [it.kind for it in j.items] == [stats.EFFECT, stats.DIRECTION]
    assert dec.verdict == j.verdict and dec.items == j.tests


# ----------------------------------------------------------------------- the registry's item declarations
def _context_items() -> set[tuple[str, str, str]]:
    catalog.discover()
    return {(c.id, i.layer, i.name) for c in registry.claims().values() for i in c.items if i.kind == "context"}


CONTEXT_ITEMS = {
    ("disa.d3.teacher_m_study", "llm", "variance_falls"),
    ("disa.d3.teacher_m_study", "llm", "bias_shrinks"),
    ("disa.d3.teacher_m_study", "llm", "knee_at_8"),
    ("fpa.figs2_4.llm_dynamics", "llm", "fpa_raises_accuracy"),
    ("disa.llm.stage1_real_model", "llm", "m16_beats_m4"),
    ("disa.llm.stage1_real_model", "llm", "top_p_biases_low"),
    # FlowRL's rows of the DISA paper's Table 1 (a claim of the DISA paper is judged on DISA's items)
    ("disa.table1.math_qwen2.5_7b", "llm", "flowrl_minus_grpo"),
    ("disa.table1.math_qwen2.5_7b", "llm", "flowrl_minus_gspo"),
    ("disa.table1.math_qwen3_4b", "llm", "flowrl_minus_grpo"),
    ("disa.table1.math_qwen3_4b", "llm", "flowrl_minus_gspo"),
}


def test_the_by_construction_items_are_these_and_each_says_why():
    assert _context_items() == CONTEXT_ITEMS
    for c in registry.claims().values():
        for i in c.items:
            assert i.why, (c.id, i.name)


def test_a_check_whose_items_differ_from_the_registry_is_an_error():
    catalog.discover()
    chk = next(c for c in registry.checks() if c.claim_id == "paced.replay" and c.layer == "sim")
    up = (0.1, 0.12, 0.09, 0.11, 0.1)

    def res(kind, margin, name="final_pass_rate", ctx=False):
        items = [stats.Item(name, up, kind, margin)]
        if ctx:
            items.append(stats.Item("extra", up, stats.CONTEXT, 0.01))
        j = stats.judge(items)
        return CheckResult(Verdict(j.verdict), "s", {}, evidence=j.evidence())

    registry.check_evidence(chk, res(stats.EFFECT, 0.01))  # as declared
    for bad in (
        res(stats.DIRECTION, 0.01),
        res(stats.EFFECT, 0.02),
        res(stats.EFFECT, 0.01, "other"),
        res(stats.EFFECT, 0.01, ctx=True),
    ):
        with pytest.raises(ValueError, match="registry"):
            registry.check_evidence(chk, bad)
    with pytest.raises(ValueError, match="no evidence"):
        registry.check_evidence(chk, CheckResult(Verdict.VERIFIED, "s", {}))
    j = stats.judge([stats.Item("final_pass_rate", up, stats.EFFECT, 0.01)])
    lying = CheckResult(Verdict.REFUTED, "s", {}, evidence=j.evidence())  # a verdict its values do not give
    with pytest.raises(ValueError, match="re-derive"):
        registry.check_evidence(chk, lying)


# ----------------------------------------------------------------------- re-deriving records
def _row(claim, verdict, ev):
    return {"claim": claim, "layer": "sim", "check": "c", "verdict": verdict, "evidence": ev}


def test_rejudge_cli_flags_a_verdict_its_values_do_not_give(tmp_path, capsys):
    import json

    from tiltlab import cli

    j = stats.judge([stats.Item("x", (0.1, 0.12, 0.09, 0.11, 0.1), stats.DIRECTION)])
    good = [
        _row("a.b", j.verdict, j.evidence()),
        {"claim": "a.c", "layer": "theory", "check": "t", "verdict": "verified"},
    ]
    path = tmp_path / "rec.json"
    path.write_text(json.dumps({"checks": good}), encoding="utf-8")
    assert [r["status"] for r in rejudging.rejudge_rows(good)] == ["same", "no raw values"]
    assert cli.main(["report", "--rejudge", str(path)]) == 0
    assert "1 re-derived as recorded, 0 differ, 1 without raw values" in capsys.readouterr().out
    tampered = [_row("a.b", "refuted", j.evidence())]  # the verdict edited by hand
    path.write_text(json.dumps({"checks": tampered}), encoding="utf-8")
    assert cli.main(["report", "--rejudge", str(path)]) == 1
    ev = j.evidence()
    ev["items"][0]["values"] = [-v for v in ev["items"][0]["values"]]  # the values edited by hand
    assert rejudging.rejudge_rows([_row("a.b", j.verdict, ev)])[0]["status"] == "differs"


def test_the_shipped_llm_record_re_derives_or_is_legacy():
    """Every row of the shipped llm record either re-derives its verdict from its raw values, or is a
    legacy row (recorded before raw values and strict pre-registration; see preregistration.toml)."""
    from tiltlab.claims import rejudging

    rec = llm_record.load_llm_record(SHIPPED)
    assert rec is not None
    legacy = {(e["check"], e["run_commit"][:7]) for e in prereg.legacy_runs()}
    for r, out in zip(rec["checks"], rejudging.rejudge_rows(rec["checks"])):
        if out["status"] == "no raw values":
            key = (r["check"], str(r.get("commit") or rec["commit"])[:7])
            assert key in legacy, f"{r['claim']}: no raw values and not a legacy row"
        else:
            assert out["status"] == "same", out


def test_legacy_rows_keep_their_recorded_judgement_others_meet_todays_expectations(legacy_registration):

    catalog.discover()
    rec = llm_record.load_llm_record(LEGACY)
    row = next(r for r in rec["checks"] if r["claim"] == "disa.d3.teacher_m_study")
    assert row["verdict"] == "partly" and row["ok"] is True  # run under the rule of 3dfabd9
    (legacy,) = record_rows.outcomes_from_rows([row])
    assert legacy.legacy and legacy.ok  # today's expectation (inconclusive, context items) is not applied
    moved = {**row, "commit": "0123456789ab"}  # the same row from a non-legacy run
    (fresh,) = record_rows.outcomes_from_rows([moved])
    assert not fresh.legacy and not fresh.ok and fresh.failure


@pytest.mark.parametrize("n", [2, 3, 5, 20])
def test_a_pseudo_sample_has_the_recorded_mean_and_interval(n):
    from tiltlab.claims import rejudging

    xs = rejudging.pseudo_sample(0.03, -0.01, 0.07, n)
    assert len(xs) == n
    m, lo, hi = stats.paired_t_ci(xs)
    assert (m, lo, hi) == pytest.approx((0.03, -0.01, 0.07), rel=1e-12, abs=1e-15)
    with pytest.raises(ValueError, match="pseudo-sample"):
        rejudging.pseudo_sample(0.2, -0.01, 0.07, n)


def test_the_neutral_rule_on_the_legacy_record_post_hoc():
    """The legacy record re-judged post hoc from its (mean, interval, seeds) under today's declarations:
    the three verdicts the asymmetric rule leaned on move (an outside audit's numbers)."""
    from tiltlab.claims import rejudging

    catalog.discover()
    rec = llm_record.load_llm_record(LEGACY)
    got = {r["claim"]: rejudging.posthoc_neutral(r) for r in rec["checks"]}
    assert got["disa.remark2.calibration"]["verdict"] == "partly"  # is_label_m4 +0.0299 < margin 0.03
    assert got["disa.remark2.calibration"]["items"]["is_label_m4_distorts"] == stats.UNDECIDED
    assert got["paced.fig5.difficulty_rises"]["verdict"] == "inconclusive"
    assert got["paced.fig5.difficulty_rises"]["alt_verdict"] == "verified"
    assert got["paced.table1.math_qwen2.5_math_7b"]["alt_verdict"] == "refuted"  # threshold 0: refuted
    assert got["disa.llm.stage1_real_model"]["items"]["m16_beats_m4"] == stats.CONTEXT
    assert got["disa.d3.teacher_m_study"] is None  # all of its recorded items are context now
    assert all(g is None or g["missing"] == [] for g in got.values())  # every declared item was recorded
    # a row that lost one declared item's statistics names it as missing and is judged on the others
    row = next(r for r in rec["checks"] if r["claim"] == "disa.remark2.calibration")
    nums = {k: v for k, v in row["numbers"].items() if not k.startswith("is_label_m4_distorts")}
    part = rejudging.posthoc_neutral({**row, "numbers": nums})
    assert part is not None and part["missing"] == ["is_label_m4_distorts"]
    assert "is_label_m4_distorts" not in part["items"] and set(part["items"]) < set(got[row["claim"]]["items"])


def test_docs_state_the_rules_as_the_registry_declares_them():
    """docs/llm-checks.md's item tables and the post-hoc table are the generated ones (`tiltlab report
    --docs`), and no superseded rule text remains in its rule section."""
    from tiltlab.paper_checks import report

    doc = (SHIPPED.parents[2] / "docs" / "llm-checks.md").read_text(encoding="utf-8")
    assert report.section_text(doc, "llm-items") == report.item_rules_section("llm").strip("\n")
    assert report.section_text(doc, "llm-posthoc") == report.posthoc_section(llm_record.load_llm_record(SHIPPED)).strip(
        "\n"
    )
    rule = doc[doc.index("## How a verdict is decided") : doc.index("## The shared enumerable task")]
    for old in ("var(M = 8) < 0.25 var(M = 1)", "min(DISA, FlowRL) − max(GRPO, GSPO)", "Holm-corrected at 0.025"):
        assert old not in doc, old
    assert "symmetric by design" in rule


def test_the_report_shows_the_verdict_under_the_other_threshold():
    from tiltlab.paper_checks import report

    catalog.discover()
    small = (0.010, 0.011, 0.009, 0.010, 0.012, 0.010)  # above 0, inside +-0.01 ... +-0.02
    j = stats.judge([stats.Item("final_pass_rate", small, stats.EFFECT, 0.01)])
    assert (j.verdict, j.alt_verdict) == ("inconclusive", "verified")
    row = {
        "claim": "paced.replay",
        "layer": "sim",
        "check": "replay_effect_toy",
        "expected": "inconclusive",
        "verdict": j.verdict,
        "summary": "s",
        "numbers": {},
        "items": {},
        "evidence": j.evidence(),
    }
    (o,) = record_rows.outcomes_from_rows([row])
    assert o.result.evidence == j.evidence()  # the raw values survive the record
    assert report.other_threshold(o) == " (other threshold: verified)"
    same = stats.judge([stats.Item("final_pass_rate", tuple(10 * x for x in small), stats.EFFECT, 0.01)])
    (o2,) = record_rows.outcomes_from_rows([{**row, "verdict": same.verdict, "evidence": same.evidence()}])
    assert same.verdict == same.alt_verdict == "verified" and report.other_threshold(o2) == ""


# ----------------------------------------------------------------------- bookkeeping pinned (mutation survivors)
def test_defaults_and_bookkeeping_of_a_judgement():
    import dataclasses

    up = (0.10, 0.12, 0.09, 0.11, 0.10)
    d, e = stats.Item("d", up, stats.DIRECTION, 0.02), stats.Item("e", up, stats.EFFECT, 0.02)
    assert (d.threshold(), e.threshold()) == (0.0, 0.02)  # the declared threshold unless swapped
    assert d.pvalues() == d.pvalues(swap=False) != d.pvalues(swap=True)
    j = stats.judge([d, stats.Item("f", tuple(-x for x in up), stats.EFFECT, 0.02)])
    assert j.unit == "seed" and j.not_ran == "inconclusive" and j.cap is None
    assert j.flags() == {"d_supports": True, "d_against": False, "f_supports": False, "f_against": True}
    assert set(j.numbers()) == {f"{n}_{k}" for n in ("d", "f") for k in ("mean", "lo", "hi", "p", "margin")}
    assert set(j.numbers("x.")) == {f"x.{k}" for k in j.numbers()}
    assert j.describe().startswith("d +0.104 [+0.") and "(direction, margin 0.02): supports" in j.describe()
    with pytest.raises(dataclasses.FrozenInstanceError):
        j.tests["d"].outcome = stats.AGAINST  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        j.verdict = "verified"  # type: ignore[misc]  # a judgement is not edited after the fact
    with pytest.raises(ValueError, match="df"):
        stats.t_quantile(0.9, 0)


def test_an_exact_item_on_its_threshold_is_undecided():
    on = stats.judge([stats.Item("e", (0.01,), stats.EFFECT, 0.01, exact=True), stats.Item("s", (0.1, 0.12, 0.11))])
    assert on.tests["e"].outcome == stats.UNDECIDED
    below = stats.judge([stats.Item("e", (-0.01,), stats.EFFECT, 0.01, exact=True), stats.Item("s", (0.1, 0.12, 0.11))])
    assert below.tests["e"].outcome == stats.UNDECIDED


def test_rejudge_keeps_what_happens_when_a_run_did_not_run():
    j = stats.judge([stats.Item("x", (0.1, 0.12, 0.09), stats.DIRECTION)], {"ran": False}, not_ran="refuted")
    assert j.verdict == "refuted" and stats.rejudge(j.evidence()).verdict == "refuted"


def test_the_rederivation_section_rejudges_raw_rows_and_marks_summary_rows_post_hoc():
    """docs/llm-checks.md's re-derivation table: a row with raw values is re-derived from them (a row whose
    recorded verdict was altered shows the re-derived one in bold); a legacy row without raw values is
    re-judged from its summary statistics and says so."""
    import copy
    import json

    from tiltlab.paper_checks import report

    shipped = llm_record.load_llm_record(SHIPPED)
    text = report.posthoc_section(shipped)
    n = len(shipped["checks"])
    assert f"{n} of {n} rows carry their raw per-seed values" in text and f"recorded row for {n} of them" in text
    assert text.count("| raw values |") + text.count("| item values |") == n and "(post hoc)" not in text
    assert text.count("| raw values |") == 2  # the real-model comparison's rows keep their per-prompt counts
    assert "1 verdict(s) move: `fpa.figs2_4.llm_dynamics` verified -> partly." in text
    tampered = copy.deepcopy(shipped)
    row = next(r for r in tampered["checks"] if r["verdict"] == "verified")
    row["verdict"] = "refuted"
    text = report.posthoc_section(tampered)
    assert f"recorded row for {n - 1} of them" in text
    assert f"| `{row['claim']}` | {row['check']} | refuted | **verified** |" in text
    legacy = json.loads(LEGACY.read_text(encoding="utf-8"))
    text = report.posthoc_section(legacy)
    assert "| summary statistics (post hoc) |" in text and f"0 of {len(legacy['checks'])} rows" in text
