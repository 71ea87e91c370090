"""``tiltlab report --rejudge`` re-derives everything a row rests on (:mod:`tiltlab.claims.rejudge`).

Each test corrupts one thing a reviewer could corrupt -- the recorded verdict, the evidence's own
verdict, a flag, an item's mean, interval or p-value, one per-unit value, one per-prompt raw count --
and the re-judge must disagree, naming that field; the untouched record must re-derive exactly. The
rows are the shipped llm record's (real values), so the layouts tested are the ones the checks write.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

from tiltlab.claims import llm_record, rejudge, rejudging, stats
from tiltlab.cli import main
from tiltlab.paper_checks import catalog

SHIPPED = Path(__file__).resolve().parents[2] / "paper_checks" / "records" / "llm.json"
PRIMARY = "disa.llm.real_model_training"


def _rows() -> list[dict]:
    return json.loads(SHIPPED.read_text(encoding="utf-8"))["checks"]


def _row(claim: str) -> dict:
    return copy.deepcopy(next(r for r in _rows() if r["claim"] == claim))


def _need_llm() -> None:
    pytest.importorskip("trl", reason="the llm checks (and their re-derivations) need the [llm] extra")
    catalog.discover()


def _fields(out: dict) -> list[str]:
    return [d.split(":", 1)[0] for d in out["differences"]]


def test_the_shipped_record_re_derives_exactly_from_its_raw_values():
    _need_llm()
    outs = rejudging.rejudge_rows(_rows())
    assert [o["status"] for o in outs] == ["same"] * len(outs), [o["differences"] for o in outs if o["differences"]]
    by = {o["claim"]: o for o in outs}
    # the comparison's rows start from the per-prompt counts, the tiny-model rows from their per-seed values
    assert by[PRIMARY]["from"] == by["disa.llm.real_model_vs_kl_grpo"]["from"] == "raw values"
    assert by["disa.table1.math_qwen3_4b"]["from"] == "item values"


def test_one_raw_count_changed_is_found_in_the_item_values_and_the_run_metrics():
    _need_llm()
    row = _row(PRIMARY)
    run = next(r for r in row["evidence"]["raw"]["runs"] if r["arm"] == "disa" and r["seed"] == 0)
    i = next(i for i, c in enumerate(run["correct"]) if 0 < c < 8)
    run["correct"][i] += 1  # one more correct sample of 8 on a prompt already solved once (pass@8 unchanged)
    out = rejudging.rejudge_rows([row])[0]
    n = len(run["correct"])
    assert out["status"] == "differs" and out["rejudged"] == row["verdict"]  # the verdict does not flip ...
    assert _fields(out) == [  # ... but the values it rests on no longer follow
        "evidence.items.disa_minus_flowrl_mean8.values[0]",
        "numbers.disa_s0_mean8",
    ]
    got = float(out["differences"][1].rsplit("re-derived ", 1)[1])
    assert got == pytest.approx(row["numbers"]["disa_s0_mean8"] + 1 / 8 / n, rel=1e-12)


def test_one_item_value_changed_without_a_verdict_flip_is_found():
    """The outside audit's case: -0.203 -> +0.5 keeps the verdict, but the mean, interval and p-values
    recorded no longer follow from the values (and the raw counts no longer give the values)."""
    _need_llm()
    row = _row(PRIMARY)
    row["evidence"]["items"][0]["values"][0] = 0.5
    out = rejudging.rejudge_rows([row])[0]
    assert out["rejudged"] == row["verdict"] and out["status"] == "differs"
    name = "disa_minus_flowrl_mean8"
    assert _fields(out) == [
        f"evidence.items.{name}.values[0]",
        *(f"numbers.{name}{s}" for s in ("", "_lo", "_hi", "_p_supports", "_p_against")),
    ]
    assert "recorded -0.05260416666666666, re-derived 0.0880208333333333" in out["differences"][1]
    # without the raw values' re-derivation the item statistics still differ
    assert _fields(rejudge.rejudge_row(row, skip_raw=True))[0] == f"numbers.{name}"


def _other(v: str) -> str:
    return "refuted" if v != "refuted" else "verified"


CORRUPTIONS = {
    "verdict": lambda r: r.__setitem__("verdict", _other(r["verdict"])),
    "evidence.verdict": lambda r: r["evidence"].__setitem__("verdict", _other(r["evidence"]["verdict"])),
    "evidence.alt_verdict": lambda r: r["evidence"].__setitem__("alt_verdict", _other(r["evidence"]["alt_verdict"])),
    "numbers.verdict_other_threshold": lambda r: r["numbers"].__setitem__(
        "verdict_other_threshold", _other(r["numbers"]["verdict_other_threshold"])
    ),
    "numbers.seeds": lambda r: r["numbers"].__setitem__("seeds", r["numbers"]["seeds"] + 1),
}


def _judged(row: dict) -> str:
    return next(i["name"] for i in row["evidence"]["items"] if i["kind"] != stats.CONTEXT)


@pytest.mark.parametrize("claim", sorted({r["claim"] for r in _rows()}))
def test_every_recorded_conclusion_of_every_row_is_re_derived(claim):
    """For each row, each recorded conclusion corrupted on its own (verdicts, the other threshold's
    verdict, the unit count, each judged item's flags, mean, interval, margin and p-values): differs,
    naming that field and nothing else."""
    base = _row(claim)
    assert rejudge.rejudge_row(base, skip_raw=True)["status"] == "same"
    name = _judged(base)
    cases = dict(CORRUPTIONS)
    for flag in (f"{name}_supports", f"{name}_against", *[k for k in base["items"] if k.startswith("ran_")][:1]):
        cases[f"items.{flag}"] = lambda r, f=flag: r["items"].__setitem__(f, not r["items"][f])
    for suffix in ("", "_lo", "_hi", "_margin", "_p_supports", "_p_against"):
        key = f"{name}{suffix}"
        cases[f"numbers.{key}"] = lambda r, k=key: r["numbers"].__setitem__(
            k, r["numbers"][k] + 1e-6 + abs(r["numbers"][k]) * 1e-6
        )
    for field, corrupt in cases.items():
        row = copy.deepcopy(base)
        corrupt(row)
        out = rejudge.rejudge_row(row, skip_raw=True)
        assert out["status"] == "differs", (claim, field)
        assert _fields(out) == [field], (claim, field, out["differences"])


def test_a_number_the_llm_layer_does_not_report_is_a_difference_elsewhere_it_is_not_compared():
    row = _row("disa.table1.math_qwen3_4b")
    name = _judged(row)
    del row["numbers"][f"{name}_p_against"], row["items"][f"{name}_against"]
    out = rejudge.rejudge_row(row, skip_raw=True)
    assert _fields(out) == [f"items.{name}_against", f"numbers.{name}_p_against"]  # both not reported
    del row["numbers"][name]  # the item's mean gone: the llm layout is not there any more
    assert f"numbers.{name}" in _fields(rejudge.rejudge_row(row, skip_raw=True))
    sim = {**copy.deepcopy(row), "layer": "sim"}  # other layers: compared where they report the numbers
    out = rejudge.rejudge_row(sim, skip_raw=True)
    assert out["status"] == "same", out["differences"]
    sim["items"][f"{name}_supports"] = not sim["items"][f"{name}_supports"]
    assert _fields(rejudge.rejudge_row(sim, skip_raw=True)) == [f"items.{name}_supports"]


def test_the_tolerance_admits_rounding_and_nothing_a_reader_sees():
    row = _row("disa.fig3.proposal_strength")
    name = _judged(row)
    v = row["numbers"][name]
    for scale, same in ((1e-12, True), (1e-10, True), (1e-8, False), (1e-4, False)):
        r = copy.deepcopy(row)
        r["numbers"][name] = v * (1 + scale)
        assert (rejudge.rejudge_row(r, skip_raw=True)["status"] == "same") is same, scale
    assert rejudge.RTOL == 1e-9 and rejudge.ATOL == 1e-12
    r = copy.deepcopy(row)
    r["numbers"][name] = math.nan  # a NaN never compares close
    assert _fields(rejudge.rejudge_row(r, skip_raw=True)) == [f"numbers.{name}"]
    r["numbers"][name] = True  # nor a bool
    assert _fields(rejudge.rejudge_row(r, skip_raw=True)) == [f"numbers.{name}"]


def test_raw_values_without_a_re_derivation_or_that_do_not_re_derive_differ():
    row = _row(PRIMARY)

    def broken(raw, names):
        raise KeyError("runs")

    out = rejudge.rejudge_row(row, broken)
    assert _fields(out) == ["evidence.raw"] and "not re-derivable (KeyError" in out["differences"][0]

    def partial(raw, names):
        return {}, {}

    assert _fields(rejudge.rejudge_row(row, partial)) == ["evidence.items.disa_minus_flowrl_mean8.values"]

    def shorter(raw, names):
        return {names[0]: (0.0,)}, {}

    assert "5 values" in rejudge.rejudge_row(row, shorter)["differences"][0]
    # a registered check that keeps raw values but registers no re-derivation is a project bug
    from tiltlab.claims import registry

    key = f"{row['claim']}[{row['layer']}:{row['check']}]"
    chk = registry._CHECKS.get(key)
    if chk is not None:
        import dataclasses

        registry._CHECKS[key] = dataclasses.replace(chk, rederive=None)
        try:
            assert _fields(rejudging.rejudge_rows([row])[0]) == ["evidence.raw"]
        finally:
            registry._CHECKS[key] = chk


def test_a_verdict_is_compared_with_the_re_derived_one_not_with_the_evidences():
    """Row and evidence agree with each other and both say what the values do not give: differs (a re-judge
    comparing the record with its own evidence would pass)."""
    row = _row("disa.stage2.denoising")
    assert row["verdict"] == "verified"
    row["verdict"] = row["evidence"]["verdict"] = "refuted"
    out = rejudge.rejudge_row(row, skip_raw=True)
    assert _fields(out) == ["verdict", "evidence.verdict"] and out["rejudged"] == "verified"


def test_rejudge_cli_names_the_field_and_exits_1(tmp_path, capsys):
    rec = json.loads(SHIPPED.read_text(encoding="utf-8"))
    row = next(r for r in rec["checks"] if r["claim"] == "disa.stage2.denoising")
    row["numbers"]["regressor_beats_raw_hi"] += 0.01
    path = tmp_path / "llm.json"
    path.write_text(json.dumps(rec), encoding="utf-8")
    assert main(["report", "--rejudge", str(path)]) == 1
    out = capsys.readouterr().out
    assert "differs: disa.stage2.denoising [llm:tiny_qwen3_enum] numbers.regressor_beats_raw_hi: recorded " in out
    assert f"{len(rec['checks'])} rows: {len(rec['checks']) - 1} re-derived as recorded, 1 differ" in out


# --------------------------------------------------------------------------- one Holm family per experiment
def _naive_joint_outcomes(groups: list[list[stats.Item]], alpha: float = 0.05) -> list[dict[str, str]]:
    """Holm over the distinct judged items of all groups written out by hand (sorted p-values, stop at the
    first failure), each item's outcome the side of its smaller one-sided p-value when rejected."""
    distinct: list[stats.Item] = []
    for g in groups:
        for it in g:
            if it.kind != stats.CONTEXT and not it.exact and it not in distinct:
                distinct.append(it)
    ps = []
    for it in distinct:
        sup, ag = it.pvalues()
        ps.append((min(1.0, 2 * min(sup, ag)), it, "supports" if sup <= ag else "against"))
    outcome: dict[stats.Item, str] = {it: "undecided" for it in distinct}
    for rank, (p, it, side) in enumerate(sorted(ps, key=lambda x: x[0])):
        if p > alpha / (len(ps) - rank):
            break
        outcome[it] = side
    return [{it.name: outcome[it] for it in g if it in outcome} for g in groups]


def _draw(rng, name, shift):
    return stats.Item(name, tuple(rng.gauss(shift, 0.02) for _ in range(6)), stats.EFFECT, 0.01)


@pytest.mark.parametrize("seed", range(8))
def test_judge_jointly_is_holm_over_the_distinct_items_of_all_records(seed):
    import random

    rng = random.Random(seed)
    shared = _draw(rng, "shared", rng.choice((0.0, 0.03, -0.03)))
    groups = [
        [shared, *(_draw(rng, f"a{i}", rng.choice((0.0, 0.02, 0.05, -0.05))) for i in range(rng.randint(1, 4)))],
        [shared, *(_draw(rng, f"b{i}", rng.choice((0.0, 0.02, 0.05, -0.05))) for i in range(rng.randint(0, 3)))],
        [_draw(rng, "c0", 0.04)],
    ]
    evs = [stats.judge(g, {"ran": True}).evidence() for g in groups]
    joint = rejudge.judge_jointly(evs)
    want = _naive_joint_outcomes(groups)
    for j, w in zip(joint, want):
        assert {k: t.outcome for k, t in j.tests.items()} == w
        assert j.verdict == stats.aggregate(list(w.values()))
    # the rule stays symmetric in a joint family: every difference negated swaps supports and against
    neg = [[stats.Item(it.name, tuple(-v for v in it.values), it.kind, it.margin) for it in g] for g in groups]
    flipped = rejudge.judge_jointly([stats.judge(g, {"ran": True}).evidence() for g in neg])
    swap = {"supports": "against", "against": "supports", "undecided": "undecided"}
    for a, b in zip(joint, flipped):
        assert {k: swap[t.outcome] for k, t in a.tests.items()} == {k: t.outcome for k, t in b.tests.items()}


def test_judge_jointly_of_one_record_is_its_rejudge_and_a_larger_family_only_loses_rejections():
    rows = _rows()
    singles = [stats.rejudge(r["evidence"]) for r in rows]
    for r, j in zip(rows, singles):
        (k,) = rejudge.judge_jointly([r["evidence"]])
        assert (k.verdict, k.alt_verdict, k.tests) == (j.verdict, j.alt_verdict, j.tests), r["claim"]
    joint = rejudge.judge_jointly([r["evidence"] for r in rows])  # the whole record as one family
    for a, b in zip(singles, joint):
        for name, t in b.tests.items():
            if t.outcome in ("supports", "against"):
                assert a.tests[name].outcome == t.outcome  # Holm over more items rejects a subset
    with pytest.raises(ValueError, match="one level"):
        rejudge.judge_jointly([{**rows[0]["evidence"], "alpha": 0.1}, rows[1]["evidence"]])
    assert rejudge.judge_jointly([]) == []


def test_experiment_families_join_claims_that_share_runs_transitively():
    rows = [{"claim": c} for c in ("c1", "c2", "c3", "c4", "c5", "c2")]
    shared = [("run a", ("c1", "c2")), ("run b", ("c3", "c2")), ("run c", ("c5", "zz"))]
    assert rejudge.experiment_families(rows, shared) == [[0, 1, 2, 5], [3], [4]]
    # the grouping does not depend on the order of the rows or of the tables
    perm = [rows[i] for i in (4, 3, 5, 2, 1, 0)]
    groups = rejudge.experiment_families(perm, list(reversed(shared)))
    assert sorted(sorted(perm[i]["claim"] for i in g) for g in groups) == [["c1", "c2", "c2", "c3"], ["c4"], ["c5"]]
    assert rejudge.experiment_families(rows, []) == [[i] for i in range(6)]


def test_per_experiment_on_the_shipped_record():
    from tiltlab.claims import prereg

    rows = _rows()
    fam = rejudge.per_experiment(rows, prereg.shared_runs())
    by = {r["claim"]: f for r, f in zip(rows, fam)}
    # the 23 tiny-model rows hold 49 distinct judged items; 1 verdict moves under one family per experiment
    tiny = [r for r in rows if r["check"] == "tiny_qwen3_enum"]
    distinct = {it for r in tiny for it in stats.rejudge(r["evidence"]).items if it.kind != stats.CONTEXT}
    assert (len(tiny), len(distinct)) == (23, 49)
    assert [c for c, f in by.items() if f["verdict"] != next(r for r in rows if r["claim"] == c)["verdict"]] == [
        "fpa.figs2_4.llm_dynamics"
    ]
    assert by["fpa.figs2_4.llm_dynamics"]["verdict"] == "partly"
    assert len(by["disa.table1.math_qwen3_4b"]["family"]) == 10 and by["disa.stage2.denoising"]["family"] == [
        "disa.stage2.denoising"
    ]


# --------------------------------------------------------------------------- mutation-guided (each pins one decision)
def test_a_raw_row_without_a_re_derivation_differs_unless_it_says_why():
    row = _row(PRIMARY)
    assert _fields(rejudge.rejudge_row(row)) == ["evidence.raw"]  # the defaults: nothing re-derives the raw values
    out = rejudge.rejudge_row(row, not_loaded="check not loaded")
    assert out["status"] == "same" and out["from"] == "item values (raw values kept; not re-derived: check not loaded)"


def test_close_compares_numbers_only():
    assert rejudge._close(0.5, 0.5) and rejudge._close(3, 3.0)
    for bad in (True, False, None, "0.5", [0.5]):
        assert rejudge._close(bad, 1.0 if bad is True else 0.0) is False, bad
    assert rejudge._close(1e-13, 0.0) and not rejudge._close(1e-11, 0.0)  # ATOL at zero
    assert rejudge._close(1.0 + 1e-10, 1.0) and not rejudge._close(1.0 + 1e-8, 1.0)  # RTOL away from zero


def test_a_row_in_the_judgement_numbers_layout_is_compared_too():
    """``stats.Judgement.numbers()`` writes ``<item>_mean``, ``_lo``, ``_hi``, ``_p``, ``_margin``: a row in
    that layout (a sim check's) is re-derived field by field; without its interval it is not compared."""
    j = stats.judge([stats.Item("x", (0.05, 0.06, 0.04, 0.05, 0.055), stats.EFFECT, 0.01)])
    row = {"claim": "a.b", "layer": "sim", "check": "c", "verdict": j.verdict, "items": j.flags(),
           "numbers": j.numbers(), "evidence": j.evidence()}  # fmt: skip
    assert rejudge.rejudge_row(row)["status"] == "same"
    for key in ("x_mean", "x_lo", "x_hi", "x_p", "x_margin"):
        bad = copy.deepcopy(row)
        bad["numbers"][key] += 0.001
        assert _fields(rejudge.rejudge_row(bad)) == [f"numbers.{key}"], key
    for gone in ("x_lo", "x_hi"):
        partial = copy.deepcopy(row)
        del partial["numbers"][gone]
        partial["numbers"]["x_mean"] += 1.0  # no longer the layout: not compared (a sim row)
        assert rejudge.rejudge_row(partial)["status"] == "same", gone


def test_the_unit_count_and_the_other_thresholds_verdict_are_required_on_llm_rows_and_compared_elsewhere():
    base = _row("disa.stage2.denoising")
    for key, bad in (("verdict_other_threshold", "refuted"), ("seeds", 3)):
        gone = copy.deepcopy(base)
        del gone["numbers"][key]
        assert _fields(rejudge.rejudge_row(gone)) == [f"numbers.{key}"], key  # llm: not reported is a difference
        sim = {**copy.deepcopy(base), "layer": "sim"}
        del sim["numbers"][key]
        assert rejudge.rejudge_row(sim)["status"] == "same", key  # elsewhere: not reported, not compared
        sim["numbers"][key] = bad
        assert _fields(rejudge.rejudge_row(sim)) == [f"numbers.{key}"], key  # ... but compared where reported


def test_judge_jointly_alt_verdict_and_exact_items_follow_the_joint_family():
    """The other threshold's verdict is judged in the joint family too, and an exact item never enters
    it: an item far from 0 but near its margin supports alone at both thresholds; among 30 undecided
    items its other-threshold test no longer passes Holm; an exact item keeps its own outcome."""
    strong = stats.Item("a", (0.027, 0.033, 0.030, 0.026, 0.034, 0.030), stats.DIRECTION, 0.025)
    p_main, p_alt = (min(1.0, 2 * min(strong.pvalues(swap=s))) for s in (False, True))
    assert p_main < 1e-4 and 0.05 / 31 < p_alt < 0.05  # the case: decided alone, not among 31
    alone = stats.judge([strong]).evidence()
    weak = [stats.Item(f"w{i}", (0.01 * i, -0.01, 0.02, 0.0, -0.02, 0.01), stats.EFFECT, 0.05) for i in range(30)]
    exact = stats.Item("e", (0.5,), stats.EFFECT, 0.1, exact=True)
    others = stats.judge([*weak, exact]).evidence()
    single = stats.rejudge(alone)
    joint_a, joint_b = rejudge.judge_jointly([alone, others])
    assert (single.verdict, single.alt_verdict) == ("verified", "verified")
    assert (joint_a.verdict, joint_a.alt_verdict) == ("verified", "inconclusive")
    naive = _naive_joint_outcomes([[strong], [*weak, exact]])
    assert {k: t.outcome for k, t in joint_b.tests.items() if k != "e"} == naive[1]
    assert joint_b.tests["e"].outcome == "supports"  # exact: judged by its value, outside the family
    fam = rejudge.per_experiment(
        [{"claim": "x", "evidence": alone}, {"claim": "y", "evidence": others}], [("run", ("x", "y"))]
    )
    assert fam[0] == {"verdict": "verified", "alt_verdict": "inconclusive", "family": ["x", "y"]}


def test_rejudge_cli_lists_exactly_the_shared_runs_verdicts_that_move_and_aligns_its_table(capsys):
    """The per-experiment section of ``--rejudge`` counts the rows whose experiment family holds more
    than one claim and lists those whose joint verdict differs from the recorded one, both against
    :func:`rejudge.per_experiment` directly; the table's columns line up under the longest claim id."""
    from tiltlab.claims import prereg

    _need_llm()
    rows = _rows()
    fams = rejudge.per_experiment(rows, prereg.shared_runs())
    shared = [(r, f) for r, f in zip(rows, fams) if f is not None and len(f["family"]) >= 2]
    moved = [(r["claim"], r["verdict"], f["verdict"]) for r, f in shared if f["verdict"] != r["verdict"]]
    singles = [f for f in fams if f is not None and len(f["family"]) == 1]
    assert shared and moved and singles  # the shipped record has all three: a test that can tell them apart
    assert main(["report", "--rejudge", str(SHIPPED)]) == 0
    out = capsys.readouterr().out
    assert f": {len(moved)} of {len(shared)} verdicts of shared runs move" in out
    listed = [ln.strip() for ln in out.split("verdicts of shared runs move")[1].split("\n\n")[0].splitlines()[1:]]
    assert listed == [f"{c}: {a} -> {b}" for c, a, b in moved]
    w = max(len(r["claim"]) for r in rows)
    table = [ln for ln in out.splitlines() if ln.split(" ", 1)[0] in {r["claim"] for r in rows}]
    assert len(table) == len(rows)
    assert all(ln[w : w + 2] == "  " and ln[w + 2 : w + 5] == "llm" for ln in table)


def test_a_report_of_a_record_without_llm_rows_shows_the_shipped_ones_and_never_doubles_them(monkeypatch):
    """``tiltlab report --record``: a record with no llm row gets the shipped llm record's rows (as
    ``recorded``); a record that has llm rows of its own is shown as it is."""
    from tiltlab.paper_checks.cli.report_command import _with_recorded_llm

    monkeypatch.setattr(llm_record, "LLM_RECORD", SHIPPED)  # the suite hides it by default (conftest)
    shipped = _rows()
    sim = {"claim": "disa.prop1", "layer": "sim", "check": "x", "verdict": "verified"}
    out = _with_recorded_llm({"checks": [sim]})
    assert out["checks"][0] == sim and len(out["checks"]) == 1 + len(shipped)
    assert all(r["source"] == "recorded" and r["layer"] == "llm" for r in out["checks"][1:])
    assert [r["claim"] for r in out["checks"][1:]] == [r["claim"] for r in shipped]
    own = {**shipped[0], "source": "run"}
    mine = {"checks": [sim, own]}
    assert _with_recorded_llm(mine) is mine
