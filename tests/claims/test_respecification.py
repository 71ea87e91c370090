"""No re-specification without a trace (``[[respecification]]`` in preregistration.toml).

A claim's judged items may change after a run had been judged under the earlier ones, but never
silently: the registration keeps the earlier items, every shipped row is judged either under the items
the registry declares now or under the earlier items of an entry, a row judged under earlier items keeps
the judgement it was made with, and each run is shown under both item sets. The earlier items an entry
declares are checked against what git shows at its ``before`` commit (or, for items that lived in code
then, against the record of the run that judged them).
"""

from __future__ import annotations

import copy
import json
import subprocess
import tomllib

import pytest

from tiltlab.claims import llm_record, prereg, registry, rejudge, stats
from tiltlab.claims import rows as record_rows
from tiltlab.paper_checks import catalog

from .test_preregistration import ROOT, SHIPPED, _in_git_checkout

LEGACY = ROOT / "tests" / "claims" / "data" / "llm_legacy.json"


def _judged(items):
    return {(i["name"], i["kind"], float(i["margin"])) for i in items if i["kind"] != "context"}


def _declared(claim_id: str) -> set[tuple[str, str, float]]:
    claim = registry.claims()[claim_id]
    return {(n, i.kind, i.margin) for n, i in claim.items_for("llm").items() if i.kind != "context"}


def test_every_shipped_row_is_judged_under_the_registered_items_or_a_recorded_respecification():
    catalog.discover()
    respecs = prereg.respecifications()
    assert {r["claim"] for r in respecs} == {
        "disa.d3.teacher_m_study",
        "disa.table1.math_qwen2.5_7b",
        "disa.table1.math_qwen3_4b",
    }
    for row in llm_record.load_llm_record(SHIPPED)["checks"]:
        got = _judged(row["evidence"]["items"])
        if got == _declared(row["claim"]):
            assert record_rows.respecification_of(row, respecs) is None
            continue
        entry = record_rows.respecification_of(row, respecs)
        assert entry is not None, f"{row['claim']}: judged under items the registry no longer declares, no trace"
        assert _judged(entry["items"]) == got


def _claim_items_at(commit: str, claim_id: str) -> list[dict] | None:
    """The claim's llm items as the claim files at ``commit`` declare them (None: not declared there)."""
    files = subprocess.run(
        ["git", "-C", str(ROOT), "ls-tree", "--name-only", f"{commit}:paper_checks/claims"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for name in files:
        if not name.endswith(".toml"):
            continue
        text = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{commit}:paper_checks/claims/{name}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for claim in tomllib.loads(text).get("claim", []):
            if claim.get("id") == claim_id:
                items = [i for i in claim.get("item", []) if i.get("layer") == "llm"]
                return items or None
    return None


def test_each_entrys_earlier_items_are_what_git_or_the_run_shows_before_the_change():
    _in_git_checkout()
    legacy = {r["claim"]: r for r in json.loads(LEGACY.read_text(encoding="utf-8"))["checks"]}
    for entry in prereg.respecifications():
        full = prereg.resolve(entry["before"])
        assert full is not None, f"{entry['claim']}: before {entry['before']} is not in this clone"
        head = subprocess.run(["git", "-C", str(ROOT), "merge-base", "--is-ancestor", full, "HEAD"], check=False)
        assert head.returncode == 0, f"{entry['claim']}: before {entry['before']} is not an ancestor of HEAD"
        at = _claim_items_at(full, entry["claim"])
        if at is not None:  # the claim files declared the items then
            assert _judged(at) == _judged(entry["items"]), entry["claim"]
            assert _judged(at) != _declared(entry["claim"])  # and they did change
        else:  # the items lived in the check's code: the run that judged them recorded them
            row = legacy[entry["claim"]]
            names = {k.rsplit("_", 1)[0] for k in row["items"] if k.endswith(("_supports", "_against"))}
            margins = {k[: -len("_margin")]: v for k, v in row["numbers"].items() if k.endswith("_margin")}
            assert names == {i["name"] for i in entry["items"]}
            assert margins == {i["name"]: i["margin"] for i in entry["items"]}


def test_a_row_judged_under_earlier_items_keeps_its_judgement_and_an_untraced_change_fails():
    catalog.discover()
    rows = [{**r, "source": "recorded"} for r in llm_record.load_llm_record(SHIPPED)["checks"]]
    outs = {o.check.claim_id: o for o in record_rows.outcomes_from_rows(rows)}
    t1 = outs["disa.table1.math_qwen2.5_7b"]
    assert t1.respecified is not None and t1.ok  # judged partly under the earlier items, as expected then
    assert t1.verdict == "partly" and t1.check.expected.value == "inconclusive"
    assert outs["disa.d3.teacher_m_study"].respecified is None  # ran after its change: judged under the new items
    # without the entry the same row is judged against today's expectations, and fails
    row = next(r for r in rows if r["claim"] == "disa.table1.math_qwen2.5_7b")
    assert record_rows.respecification_of(row, []) is None
    import unittest.mock as mock

    with mock.patch.object(prereg, "respecifications", return_value=[]):
        (bare,) = record_rows.outcomes_from_rows([row])
    assert not bare.ok and bare.failure


def test_each_run_is_shown_under_both_item_sets():
    catalog.discover()
    rows = {r["claim"]: r for r in llm_record.load_llm_record(SHIPPED)["checks"]}
    (d3,) = record_rows.respecified_views(rows["disa.d3.teacher_m_study"])
    assert (d3["now"], d3["earlier"]) == ("verified", "partly")
    assert d3["earlier_items"] == {"variance_falls": "supports", "bias_shrinks": "supports", "knee_at_8": "against"}
    (t1,) = record_rows.respecified_views(rows["disa.table1.math_qwen3_4b"])
    assert (t1["now"], t1["earlier"]) == ("inconclusive", "partly")
    assert t1["earlier_items"]["flowrl_minus_gspo"] == "supports"
    assert {t1["earlier_items"][k] for k in ("disa_minus_grpo", "disa_minus_gspo")} == {"undecided"}
    text = catalog_docs_text()
    assert "`disa.d3.teacher_m_study` (items changed after c3bee8e): this run gives **verified**" in text
    assert (
        "**partly** under the earlier items (`variance_falls` supports, `bias_shrinks` supports, `knee_at_8` against)"
        in text
    )


def catalog_docs_text() -> str:
    from tiltlab.paper_checks import report

    return report.posthoc_section(llm_record.load_llm_record(SHIPPED))


def test_under_items_re_judges_the_kept_values_with_other_kinds():
    up = (0.05, 0.06, 0.04, 0.05, 0.055)
    flat = (0.001, -0.002, 0.0, 0.002, -0.001)
    j = stats.judge([stats.Item("a", up, stats.CONTEXT, 0.01), stats.Item("b", flat, stats.EQUIVALENCE, 0.02)])
    row = {"evidence": j.evidence()}
    assert j.verdict == "verified"  # only b is judged, and it is inside +-0.02
    out = rejudge.under_items(row, [{"name": "a", "kind": "effect", "margin": 0.01}])
    assert out == {"verdict": "verified", "alt_verdict": "verified", "items": {"a": "supports"}, "missing": []}
    neg = copy.deepcopy(row)
    neg["evidence"]["items"][0]["values"] = [-v for v in up]
    assert rejudge.under_items(neg, [{"name": "a", "kind": "effect", "margin": 0.01}])["verdict"] == "refuted"
    assert rejudge.under_items(row, [{"name": "b", "kind": "effect", "margin": 0.01}])["verdict"] == "inconclusive"
    missing = rejudge.under_items(row, [{"name": "c", "kind": "effect", "margin": 0.01}])
    assert missing == {"verdict": None, "alt_verdict": None, "items": {}, "missing": ["c"]}


_ITEM = '{ name = "x", kind = "effect", margin = 0.1 }'


@pytest.mark.parametrize(
    "body, msg",
    [
        (f'before = "abc"\nreason = "r"\nitems = [{_ITEM}]', "before"),
        (f'before = "abcdef0"\nreason = " "\nitems = [{_ITEM}]', "reason"),
        ('before = "abcdef0"\nreason = "r"\nitems = []', "earlier items"),
        ('before = "abcdef0"\nreason = "r"\nitems = [{ name = "x", kind = "effect" }]', "needs name, kind and margin"),
    ],
)
def test_a_malformed_respecification_is_refused(tmp_path, body, msg):
    path = tmp_path / "p.toml"
    path.write_text(f'[[respecification]]\nclaim = "a.b"\ncheck = "c"\n{body}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=msg):
        prereg.respecifications(path)
    assert prereg.respecifications(tmp_path / "none.toml") == []


def _respecified_row_and_entry():
    catalog.discover()
    rows = json.loads(SHIPPED.read_text(encoding="utf-8"))["checks"]
    respecs = prereg.respecifications(ROOT / prereg.PREREG_PATH)
    for row in rows:
        entry = record_rows.respecification_of(row, respecs)
        if entry is not None:
            return row, entry
    raise AssertionError("the shipped record holds no re-specified row")


def _decoys(entry):
    """Entries that match the row in all but one of claim, check and items."""
    other_items = [{**i, "margin": float(i["margin"]) + 1.0} for i in entry["items"]]
    return [
        {**entry, "claim": entry["claim"] + "_other", "before": "decoy-claim"},
        {**entry, "check": entry["check"] + "_other", "before": "decoy-check"},
        {**entry, "items": other_items, "before": "decoy-items"},
    ]


def test_a_respecification_applies_only_to_its_own_claim_check_and_items():
    """A row is matched to a ``[[respecification]]`` by its claim, its check *and* the items it was
    judged under: decoys listed first that differ in one of the three never match, nor is a row of
    another claim matched to the real entry."""
    row, entry = _respecified_row_and_entry()
    decoys = _decoys(entry)
    assert record_rows.respecification_of(row, [*decoys, entry]) == entry
    assert record_rows.respecification_of(row, decoys) is None
    for field in ("claim", "check"):  # the row moved to another claim / check: the entry is not its own
        moved = {**row, field: row[field] + "_other"}
        assert record_rows.respecification_of(moved, [entry]) is None, field


def test_a_rows_views_are_those_of_its_own_claim_and_check():
    row, entry = _respecified_row_and_entry()
    decoys = _decoys(entry)[:2]  # another claim, another check (the items do not select a view)
    views = record_rows.respecified_views(row, [*decoys, entry])
    assert [v["before"] for v in views] == [entry["before"]]
    assert record_rows.respecified_views(row, decoys) == []


def test_the_shipped_rows_are_selected_by_claim_prefix_and_check_name():
    rows, rec = llm_record.recorded_llm_rows(path=SHIPPED)
    claims = [r["claim"] for r in rows]
    assert rec is not None and len(rows) == len(rec["checks"]) and all(r["source"] == "recorded" for r in rows)
    for prefix in ("disa.table1", "disa.table1.", "paced", "disa.table1.math_qwen3_4b"):
        got = [r["claim"] for r in llm_record.recorded_llm_rows(prefix, path=SHIPPED)[0]]
        want = [c for c in claims if c == prefix or c.startswith(prefix.rstrip(".") + ".") or c.startswith(prefix)]
        assert got == want and 0 < len(got) < len(claims), prefix
    assert llm_record.recorded_llm_rows("no.such.claim", path=SHIPPED)[0] == []
    by_name = llm_record.recorded_llm_rows(name="smollm2_135m_comparison", path=SHIPPED)[0]
    assert by_name and {r["check"] for r in by_name} == {"smollm2_135m_comparison"} and len(by_name) < len(rows)
