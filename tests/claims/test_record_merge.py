"""``merging.merge`` and the record's other aggregations over rows, with ``recorded`` rows in the old
record.

The class of bug: a merge that keeps rows it must drop (the shipped llm rows, marked ``recorded``,
are merged afresh from the shipped record on every run: kept from the old record as well they appear
twice), or drops rows it must keep, or lets the provenance of one run leak onto another's rows. The
old records here hold every kind of row -- re-run, not re-run, recorded (first, in the middle and
last), of a claim no longer declared -- and the result is checked row by row: no key twice, each row
with the provenance of the run that produced it. Also the refusals that hold for a record as soon as
one row (first or last) is of the wrong kind."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from tests.paper_checks.test_records import LLM_CID, _check, _only_fake, _setup_llm, _ship
from tiltlab.claims import llm_record, merging, pinning
from tiltlab.claims import rows as record_rows
from tiltlab.claims.registry import Verdict

CID_A, CID_B = "zz_merge.alpha", "zz_merge.beta"


def _row(claim, layer, check, source="run", commit="c0", **kw):
    return {
        "claim": claim,
        "layer": layer,
        "check": check,
        "source": source,
        "commit": commit,
        "verdict": "verified",
        "expected": "verified",
        **kw,
    }


@pytest.fixture
def claims(isolated_registry):
    for cid in (CID_A, CID_B):
        isolated_registry.declare_claim(cid, "DISA", "Sec. 0", f"fake claim {cid}", kind="empirical")
    return isolated_registry


RECORDED_FIRST = _row(CID_B, "llm", "tiny", source="recorded", commit="shipped-1")
RECORDED_LAST = _row(CID_B, "llm", "tiny2", source="recorded", commit="shipped-1")


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_merge_drops_recorded_rows_and_keeps_the_provenance_of_each_kept_row(claims, where):
    rerun = _row(CID_A, "sim", "x", commit="old-x", run_at="t0")
    kept = _row(CID_A, "data", "y", commit="old-y", run_at="t1", mode="quick")
    gone = _row("zz_merge.removed", "sim", "z", commit="old-z")
    rows = [rerun, kept, gone]
    rows.insert({"first": 0, "middle": 2, "last": len(rows)}[where], dict(RECORDED_FIRST))
    old = {"checks": [*rows, dict(RECORDED_LAST)]}
    new = [_row(CID_A, "sim", "x", commit="new", run_at="t2")]
    merged, n_kept = merging.merge(old, new)
    keys = [record_rows.row_key(r) for r in merged]
    assert not [k for k, c in Counter(keys).items() if c > 1]  # no row twice
    assert merged == [kept, new[0]] and n_kept == 1  # the re-run row replaced, recorded and undeclared dropped
    assert all(r["source"] == "run" for r in merged)
    assert merged[0]["commit"] == "old-y" and merged[0]["run_at"] == "t1" and merged[0]["mode"] == "quick"
    assert merged[1]["commit"] == "new"


def test_merge_without_an_old_record_is_the_new_rows(claims):
    new = [_row(CID_A, "sim", "x"), _row(CID_B, "sim", "y")]
    assert merging.merge(None, new) == (new, 0)
    assert merging.merge({"checks": []}, new) == (new, 0)
    only_recorded = {"checks": [dict(RECORDED_FIRST), dict(RECORDED_LAST)]}
    assert merging.merge(only_recorded, new) == (new, 0)


def _rows(path):
    return json.loads(path.read_text())["checks"]


def test_repeated_checks_into_one_record_hold_each_recorded_row_once_with_the_shipped_provenance(
    isolated_registry, prereg_repo, tmp_path, monkeypatch
):
    """``tiltlab check`` three times into the same ``--out`` (full, then a partial run of another
    layer, then after the shipped record was replaced): the recorded llm row is there once each
    time, with the provenance of the shipped record current at that run."""
    reg = isolated_registry
    _setup_llm(reg)
    _only_fake(monkeypatch, reg)
    shipped = _ship(tmp_path, monkeypatch, reg)
    out = tmp_path / "c.json"
    key = f"{LLM_CID}[llm:tiny]"
    for argv in (["--only", "zz_fake"], ["--only", "zz_fake"], ["--only", "zz_fake", "--layer", "data"]):
        assert _check(*argv, "--out", str(out)) == 0
        rows = _rows(out)
        keys = [record_rows.row_key(r) for r in rows]
        assert sorted(keys) == sorted(set(keys)), keys
        (llm,) = [r for r in rows if record_rows.row_key(r) == key]
        assert llm["source"] == "recorded" and llm["commit"] == prereg_repo.run[:12]
        assert all(r["source"] == "run" for r in rows if record_rows.row_key(r) != key)
        assert json.loads(out.read_text())["summary"]["recorded"] == 1
    # the shipped record is regenerated at another commit: the next run carries the new provenance
    rec = json.loads(shipped.read_text())
    rec["checks"] = [{**r, "commit": "def456"} for r in rec["checks"]]
    shipped.write_text(json.dumps(rec))
    assert _check("--only", "zz_fake", "--layer", "data", "--out", str(out)) == 0
    rows = [r for r in _rows(out) if record_rows.row_key(r) == key]
    assert [(r["source"], r["commit"]) for r in rows] == [("recorded", "def456")]


@pytest.mark.parametrize("where", ["first", "last"])
def test_ship_llm_refuses_a_run_with_one_row_of_another_layer(
    isolated_registry, prereg_repo, tmp_path, monkeypatch, where
):
    """One non-llm row, first or last, and the run is not shipped. (Its key is never an llm check's,
    so the key comparison alone refuses it: the separate ``any(layer != "llm")`` test is redundant, and
    a mutant that makes it ``all`` cannot fail this test.)"""
    reg = isolated_registry
    _setup_llm(reg)
    _only_fake(monkeypatch, reg)
    run = tmp_path / "llm_run.json"
    assert _check("--layer", "llm", "--slow", "--out", str(run)) == 0
    rec = json.loads(run.read_text())
    (llm_row,) = rec["checks"]
    other = {**llm_row, "layer": "sim", "check": "extra"}
    rec["checks"] = [other, llm_row] if where == "first" else [llm_row, other]
    run.write_text(json.dumps(rec))
    with pytest.raises(ValueError, match="not a full llm-layer run"):
        llm_record.ship_llm_record(run, tmp_path / "shipped.json", machine_desc="m")
    assert not (tmp_path / "shipped.json").exists()
    rec["checks"] = [llm_row]
    run.write_text(json.dumps(rec))
    shipped = llm_record.ship_llm_record(run, tmp_path / "shipped.json", machine_desc="m")
    assert shipped["commit"] == prereg_repo.run[:12]


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_pins_refuse_a_record_with_one_failed_row(where, tmp_path):
    rows = [_row(f"zz.p{i}", "sim", "x", ok=True, numbers={"v": 1.0 + i}) for i in range(3)]
    rows[{"first": 0, "middle": 1, "last": 2}[where]]["ok"] = False
    with pytest.raises(ValueError, match="1 failed or crashed"):
        pinning.write_pins({"checks": rows}, tmp_path / "pins.json", checks={})
    assert not (tmp_path / "pins.json").exists()


def test_llm_pins_come_from_every_ok_row_and_only_those():
    nums = {"gap": 0.2, "gap_lo": 0.1, "gap_hi": 0.3, "gap_margin": 0.02}
    rows = [
        _row("zz.a", "llm", "t", ok=True, numbers=nums),
        _row("zz.b", "llm", "t", ok=False, numbers=nums),
        _row("zz.c", "llm", "t", ok=True, numbers={**nums, "gap": 0.25}),
    ]
    pins = pinning.llm_pins({"checks": rows})
    assert pins == {
        "zz.a[llm:t]": {"gap": [0.2, pytest.approx(0.1)]},
        "zz.c[llm:t]": {"gap": [0.25, pytest.approx(0.1)]},
    }


def test_outcomes_from_rows_keep_each_rows_provenance(claims):
    rows = [
        _row(CID_A, "sim", "x", commit="one", run_at="t1", verdict="partly", ok=False),
        _row(CID_B, "llm", "tiny", source="recorded", commit="shipped", run_at="t0", ok=True),
        _row("zz_merge.removed", "sim", "z"),
    ]
    outs = record_rows.outcomes_from_rows(rows)
    assert [o.provenance["commit"] for o in outs] == ["one", "shipped"]
    assert [o.provenance["source"] for o in outs] == ["run", "recorded"]
    assert [o.result.verdict for o in outs] == [Verdict.PARTLY, Verdict.VERIFIED]
    assert [o.ok for o in outs] == [False, True]  # checks not loaded: the judgement recorded with the row


@pytest.mark.parametrize(
    "runs",
    [
        pytest.param(["llm"], id="llm-run-fresh"),
        pytest.param(["quick", "quick", "llm", "llm"], id="recorded-then-llm-run-then-again"),
        pytest.param(["llm", "quick", "quick"], id="llm-run-then-partial"),
    ],
)
def test_a_run_of_the_llm_check_is_in_the_record_once_however_often_merged(
    isolated_registry, prereg_repo, tmp_path, monkeypatch, runs
):
    """``tiltlab check`` into one ``--out`` with a shipped llm record present: a run that ran the llm
    check itself (``--layer llm --slow``) holds that check's row once, as this run's row, never also
    as the shipped (``recorded``) row, and so does every later partial run into that record (the
    run's own row is kept, docs/llm-checks.md: "use their own results instead"); merging the same
    selection again gives the same rows (idempotent). Every row key is counted by hand: once each."""
    reg = isolated_registry
    _setup_llm(reg)
    _only_fake(monkeypatch, reg)
    _ship(tmp_path, monkeypatch, reg)
    out = tmp_path / "c.json"
    key = f"{LLM_CID}[llm:tiny]"
    previous = None
    for i, mode in enumerate(runs):
        argv = ["--only", "zz_fake", "--out", str(out), *(["--layer", "llm", "--slow"] if mode == "llm" else [])]
        assert _check(*argv) == 0
        rows = _rows(out)
        counts = Counter(record_rows.row_key(r) for r in rows)
        assert counts[key] == 1, (runs[: i + 1], counts)
        assert all(c == 1 for c in counts.values()), counts
        (llm,) = [r for r in rows if record_rows.row_key(r) == key]
        # once a run into this record ran the llm check, its own row stays (never the shipped one)
        if "llm" in runs[: i + 1]:
            assert llm["source"] == "run" and "--layer llm --slow" in llm["command"]
        else:
            assert llm["source"] == "recorded"
        summary = json.loads(out.read_text())["summary"]
        assert summary["checks"] == len(rows) == sum(counts.values())
        if previous is not None and runs[i - 1] == mode:  # the same selection merged again: the same rows
            assert sorted(counts) == previous
        previous = sorted(counts)
