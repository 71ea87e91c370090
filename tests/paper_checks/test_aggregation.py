"""A claim's status from several checks that disagree, against a plain statement of the rule.

The rule (:func:`tiltlab.claims.decision.claim_decision`): a crash (``error``) wins, then the most
informative decided verdict ``refuted > partly > verified``, then ``inconclusive`` (a proxy that cannot
decide), then ``out_of_reach``; the deciding layers are every layer holding that verdict, in the order
theory, sim, data, llm. Checked over every assignment of verdicts to the four layers, with several
checks in one layer, and through the report's claim rows, counts and claim table and the record's
claim verdicts, which must all apply the same rule."""

from __future__ import annotations

import itertools

import pytest

from tiltlab.claims.registry import Check, CheckResult, Outcome, Verdict
from tiltlab.paper_checks import cli as pcli
from tiltlab.paper_checks import report

LAYERS = ("theory", "sim", "data", "llm")
RANK = ["error", "refuted", "partly", "verified", "inconclusive", "out_of_reach"]  # most decisive first
CHOICES = [None, "error", *[v.value for v in Verdict]]


def _outcome(cid: str, layer: str, verdict: str, name: str | None = None, numbers=None) -> Outcome:
    name = name or f"c_{layer}"
    if verdict == "error":
        chk = Check(cid, layer, name, Verdict.VERIFIED, lambda s: CheckResult(Verdict.VERIFIED, ""))
        return Outcome(chk, None, 0.0, error="Traceback ...\nRuntimeError: boom")
    chk = Check(cid, layer, name, Verdict(verdict), lambda s: CheckResult(Verdict(verdict), ""))
    return Outcome(chk, CheckResult(Verdict(verdict), "x", numbers or {}), 0.0)


def _naive(assign: dict[str, list[str]]) -> tuple[str, list[str]]:
    present = [v for vs in assign.values() for v in vs]
    if not present:
        return "unchecked", []
    best = min(present, key=RANK.index)
    return best, [layer for layer in LAYERS if best in assign.get(layer, [])]


def test_every_assignment_of_verdicts_to_layers():
    n = 0
    for combo in itertools.product(CHOICES, repeat=len(LAYERS)):
        assign = {layer: [v] for layer, v in zip(LAYERS, combo) if v is not None}
        outs = [_outcome("zz.c", layer, vs[0]) for layer, vs in assign.items()]
        want = _naive(assign)
        assert report.claim_decision(outs) == want, assign
        assert report.claim_decision(list(reversed(outs))) == want, assign  # the input order does not matter
        assert report.claim_status(outs) == want[0]
        n += 1
    assert n == len(CHOICES) ** len(LAYERS)


@pytest.mark.parametrize(
    ("checks", "want"),
    [
        # two checks of one layer that disagree: the more decisive one decides, the layer once
        ([("sim", "verified"), ("sim", "refuted")], ("refuted", ["sim"])),
        ([("sim", "partly"), ("sim", "verified"), ("llm", "verified")], ("partly", ["sim"])),
        ([("llm", "inconclusive"), ("llm", "verified")], ("verified", ["llm"])),
        ([("data", "out_of_reach"), ("sim", "inconclusive"), ("sim", "inconclusive")], ("inconclusive", ["sim"])),
        # the same deciding verdict in two layers: both, in layer order (not input order)
        ([("llm", "refuted"), ("theory", "refuted"), ("sim", "verified")], ("refuted", ["theory", "llm"])),
        # a crash beats any verdict, whichever layer it is in
        ([("llm", "refuted"), ("data", "error")], ("error", ["data"])),
        ([], ("unchecked", [])),
    ],
)
def test_disagreeing_checks_of_one_claim(checks, want):
    outs = [_outcome("zz.c", layer, v, name=f"c{i}") for i, (layer, v) in enumerate(checks)]
    assert report.claim_decision(outs) == want


def test_report_rows_counts_table_and_record_agree_on_disagreeing_claims(isolated_registry):
    reg = isolated_registry
    spec = {
        "zz_agg.a": [("sim", "verified", {"sim_only_x": 1.0}), ("llm", "refuted", {"llm_delta": -0.3})],
        "zz_agg.b": [("sim", "inconclusive", {"x": 2.0}), ("llm", "partly", {"d": 0.1}), ("data", "out_of_reach", {})],
        "zz_agg.c": [("theory", "verified", {"theory_t": 1.0}), ("sim", "verified", {"sim_s": 2.0})],
        "zz_agg.d": [("sim", "inconclusive", {}), ("data", "out_of_reach", {})],
    }
    for cid in [*spec, "zz_agg.none"]:
        reg.declare_claim(cid, "DISA", "Sec. 0", f"fake claim {cid}", kind="empirical")
    outs = [_outcome(cid, layer, v, numbers=nums) for cid, rows in spec.items() for layer, v, nums in rows]
    claims = {cid: reg.get_claim(cid) for cid in [*spec, "zz_agg.none"]}
    rows = {r["id"]: r for r in report.claim_rows(report.ReportInput(claims=claims, outcomes=outs))}
    want = {
        "zz_agg.a": ("refuted", ["llm"]),
        "zz_agg.b": ("partly", ["llm"]),
        "zz_agg.c": ("verified", ["theory", "sim"]),
        "zz_agg.d": ("inconclusive", ["sim"]),
        "zz_agg.none": ("unchecked", []),
    }
    assert {cid: (r["status"], r["decided_by"]) for cid, r in rows.items()} == want
    for cid, rs in spec.items():
        assert want[cid] == _naive({layer: [v for la, v, _ in rs if la == layer] for layer in LAYERS})
    counts = report._counts(list(rows.values()))
    assert dict(counts["DISA"]) == {"refuted": 1, "partly": 1, "verified": 1, "inconclusive": 1, "unchecked": 1}
    assert counts["all"] == counts["DISA"]
    # the claim table shows the deciding check's numbers only (not the outvoted layer's)
    table = {r["claim"]: r for r in report.claim_table(claims, outs)}
    assert table["zz_agg.a"]["verdict"] == "refuted" and table["zz_agg.a"]["decided_by"] == "llm"
    assert "llm_delta" in table["zz_agg.a"]["key_numbers"] and "sim_only_x" not in table["zz_agg.a"]["key_numbers"]
    assert table["zz_agg.c"]["decided_by"] == "theory, sim"
    assert "theory_t" in table["zz_agg.c"]["key_numbers"] and "sim_s" in table["zz_agg.c"]["key_numbers"]
    # the record's per-claim verdicts apply the same rule; a --check run counts only the claims of its rows
    # (tiltlab.claims.counts.selection_scope), so the registry's other claims do not appear
    rec = {r["claim"]: (r["verdict"], r["decided_by"]) for r in pcli._claim_verdicts(outs, {"check": ["zz_agg"]})}
    assert rec == {cid: want[cid] for cid in spec}


def test_unknown_verdicts_rank_last_and_layers_keep_their_order_then_by_name():
    """A recorded row may carry a verdict this version does not know, or a layer it does not know: a
    known verdict still decides; among unknown ones the first by name; the deciding layers are theory,
    sim, data, llm, then the others by name (never the set's iteration order)."""
    from types import SimpleNamespace

    from tiltlab.claims.decision import claim_decision

    def o(layer, verdict):
        return SimpleNamespace(verdict=verdict, check=SimpleNamespace(layer=layer))

    assert claim_decision([o("llm", "zz_new"), o("sim", "aa_new"), o("theory", "aa_new")]) == (
        "aa_new",
        ["theory", "sim"],
    )
    assert claim_decision([o("llm", "zz_new"), o("data", "out_of_reach")]) == ("out_of_reach", ["data"])
    got = claim_decision([o("zeta", "refuted"), o("llm", "refuted"), o("aaa", "refuted"), o("theory", "refuted")])
    assert got == ("refuted", ["theory", "llm", "aaa", "zeta"])
    assert claim_decision([o(layer, "verified") for layer in ("llm", "data", "sim", "theory")]) == (
        "verified",
        ["theory", "sim", "data", "llm"],
    )


def test_claim_rows_name_each_claims_verdict_deciding_layers_and_checks_in_order():
    from tiltlab.claims.decision import claim_rows

    outs = [
        _outcome("zz_rows.b", "llm", "refuted", name="b_llm"),
        _outcome("zz_rows.a", "sim", "verified", name="a_sim"),
        _outcome("zz_rows.b", "sim", "verified", name="b_sim"),
    ]
    assert claim_rows(outs) == [
        {"claim": "zz_rows.a", "verdict": "verified", "decided_by": ["sim"], "checks": ["a_sim"]},
        {"claim": "zz_rows.b", "verdict": "refuted", "decided_by": ["llm"], "checks": ["b_llm", "b_sim"]},
    ]
