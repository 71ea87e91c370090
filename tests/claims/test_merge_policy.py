"""The merge policy of ``tiltlab check`` into an existing record (:mod:`tiltlab.claims.merging`), each branch
against a naive expectation written out by hand: a partial run keeps the old rows it did not re-run, a row
already measured is never shadowed by the shipped llm record's (no check twice), ``--replace`` drops the old
record, and a ``tiltlab reproduce`` record keeps its header. The registry is replaced by a plain dict of claim
ids, so these tests need no data folder and no check module."""

from __future__ import annotations

import pytest

from tiltlab.claims import merging, registry


def _row(claim: str, layer: str, check: str = "c", source: str = "run", **kw) -> dict:
    return {"claim": claim, "layer": layer, "check": check, "source": source, **kw}


def _keys(rows) -> list[str]:
    return [f"{r['claim']}[{r['layer']}:{r['check']}]" for r in rows]


@pytest.fixture
def declared(monkeypatch):
    """The claims the registry declares (``zz.gone`` is not one of them) and the claims with a check."""
    claims = {cid: object() for cid in ("zz.a", "zz.b", "zz.t", "zz.llm1", "zz.llm2", "qq.other")}
    monkeypatch.setattr(registry, "claims", lambda: dict(claims))
    monkeypatch.setattr(registry, "checks", lambda: [type("C", (), {"claim_id": "zz.b"})()])
    return claims


A, B, T = _row("zz.a", "sim", v=1), _row("zz.b", "sim", v=2), _row("zz.t", "theory", v=3)
GONE = _row("zz.gone", "sim")
L1, L2 = _row("zz.llm1", "llm", source="recorded", v="shipped"), _row("zz.llm2", "llm", source="recorded")
Q = _row("qq.other", "llm", source="recorded")
SHIPPED = [L1, L2, Q]


def test_a_partial_run_keeps_the_old_rows_it_did_not_rerun_in_their_order_and_drops_undeclared_claims(declared):
    old = {"checks": [A, GONE, B, T]}
    out = merging.check_run_rows(old, ["zz.a[sim:c]"], [], prefix="zz.a")
    assert out.kept == [B, T]  # A was re-run (its new row replaces it), zz.gone is no longer declared
    assert out.recorded == []


def test_without_a_layer_the_shipped_rows_the_selection_names_are_merged_as_recorded(declared):
    everything = merging.check_run_rows(None, ["zz.a[sim:c]"], SHIPPED)
    assert everything.recorded == SHIPPED and everything.kept == []
    only_zz = merging.check_run_rows(None, ["zz.a[sim:c]"], SHIPPED, prefix="zz")
    assert only_zz.recorded == [L1, L2]  # qq.other is not under --only zz
    by_name = merging.check_run_rows(None, [], [L1, _row("zz.llm2", "llm", check="d", source="recorded")], name="d")
    assert _keys(by_name.recorded) == ["zz.llm2[llm:d]"]


def test_a_layer_run_merges_no_shipped_row_the_old_record_did_not_hold(declared):
    assert merging.check_run_rows(None, ["zz.a[sim:c]"], SHIPPED, layer="sim").recorded == []
    old = {"checks": [A, {**L2, "v": "old"}]}
    out = merging.check_run_rows(old, ["zz.a[sim:c]"], SHIPPED, layer="sim")
    assert out.recorded == [L2] and out.kept == []  # its recorded row is refreshed from the shipped record


def test_a_partial_run_refreshes_the_recorded_rows_the_old_record_held_even_outside_its_selection(declared):
    old = {"checks": [A, B, {**L1, "v": "stale"}, {**Q, "v": "stale"}]}
    out = merging.check_run_rows(old, ["zz.a[sim:c]"], SHIPPED, prefix="zz.a")
    assert out.kept == [B]  # an old recorded row is never kept: it is merged afresh
    assert out.recorded == [L1, Q]  # both held before, neither under --only zz.a; L2 was never in the record
    assert all(r.get("v") != "stale" for r in out.recorded)


def test_a_row_already_measured_is_not_duplicated_by_the_shipped_one(declared):
    measured = _row("zz.llm1", "llm", v="measured here")  # an earlier `--layer llm` run into this record
    old = {"checks": [A, measured]}
    out = merging.check_run_rows(old, ["zz.a[sim:c]"], SHIPPED)
    assert out.kept == [measured] and out.recorded == [L2, Q]
    rows = [*_keys([A]), *_keys(out.kept), *_keys(out.recorded)]
    assert len(rows) == len(set(rows)) == 4  # each check once
    # a check this run ran is never merged as recorded either
    ran_llm = merging.check_run_rows(None, ["zz.llm2[llm:c]"], SHIPPED)
    assert ran_llm.recorded == [L1, Q]


def test_replace_drops_the_old_record(declared):
    """``--replace`` passes no old record: nothing is kept and no header or history carries over."""
    out = merging.check_run_rows(None, ["zz.a[sim:c]"], SHIPPED, prefix="zz.b")
    assert out.kept == [] and out.recorded == []  # the shipped rows are none of zz.b's
    rec = {"generated_at": "new", "commit": "n", "selection": {}, "summary": {"run": 1}, "unchecked": [{"claim": "x"}]}
    assert merging.merge_record_header(dict(rec), None, [], "2026-01-01T00:00:00+00:00") == rec


def _new_record() -> dict:
    return {
        "generated_at": "2026-02-02T00:00:00+00:00",
        "commit": "new1234",
        "machine": {"cpu": "new"},
        "seed": 0,
        "selection": {"only": "zz.a"},
        "summary": {"run": 1, "checks": 9},
        "runtime": {"wall_s": 1.0},
        "unchecked": [],
    }


def test_a_reproduce_record_keeps_its_header_keys_and_records_this_run_in_its_history(declared):
    header = {
        "figures": [{"id": "f1"}],
        "figures_missing": {"f2": "why"},
        "environment": {"python": "3.11"},
        "report": "REPORT.md",
        "generated_at": "2026-01-01T00:00:00+00:00",
        "commit": "old5678",
        "machine": {"cpu": "old"},
        "seed": 0,
        "selection": {"mode": "full"},
        "runtime": {"wall_s": 99.0},
    }
    old = {**header, "summary": {"run": 40, "checks": 40}, "checks": []}
    rec = merging.merge_record_header(_new_record(), old, [], "2026-02-02T00:00:00+00:00")
    assert {k: rec[k] for k in header} == header  # it still describes the reproduce run
    assert rec["updated_at"] == "2026-02-02T00:00:00+00:00"
    assert rec["history"] == [
        {"generated_at": "2026-01-01T00:00:00+00:00", "commit": "old5678", "selection": {"mode": "full"}, "ran": 40},
        {"generated_at": "2026-02-02T00:00:00+00:00", "commit": "new1234", "selection": {"only": "zz.a"}, "ran": 1},
    ]
    assert rec["summary"] == {"run": 1, "checks": 9}  # the counts are the merged record's


def test_a_check_record_keeps_its_own_header_and_extends_its_history(declared):
    old = {"generated_at": "old", "commit": "old", "history": [{"ran": 3}, {"ran": 2}], "checks": []}
    rec = merging.merge_record_header(_new_record(), old, [], "2026-02-02T00:00:00+00:00")
    assert (rec["generated_at"], rec["commit"], rec["machine"]) == (
        "2026-02-02T00:00:00+00:00",
        "new1234",
        {"cpu": "new"},
    )
    assert "updated_at" not in rec
    assert [h["ran"] for h in rec["history"]] == [3, 2, 1]


def test_unchecked_claims_of_both_runs_are_merged_the_newer_row_winning(declared):
    old = [{"claim": "zz.a", "v": "old"}, {"claim": "zz.b", "v": "old"}, {"claim": "zz.gone", "v": "old"}]
    new = [{"claim": "zz.a", "v": "new"}, {"claim": "zz.t", "v": "new"}]
    # zz.b has a check now and zz.gone is no longer declared: both leave
    assert merging.merge_unchecked(old, new) == [{"claim": "zz.a", "v": "new"}, {"claim": "zz.t", "v": "new"}]
    rec = merging.merge_record_header(_new_record(), {"unchecked": old, "checks": []}, new, "t")
    assert rec["unchecked"] == merging.merge_unchecked(old, new)


def test_merge_puts_the_kept_rows_before_the_new_and_counts_them(declared):
    new = [_row("zz.a", "sim", v="new")]
    rows, kept = merging.merge({"checks": [A, GONE, {**L1}, T]}, new)
    assert rows == [T, *new] and kept == 1  # A re-run, zz.gone undeclared, L1 recorded (merged afresh)
    assert merging.merge(None, new) == (new, 0)
