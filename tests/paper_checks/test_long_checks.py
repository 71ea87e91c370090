"""Long checks (hours; :attr:`registry.Check.long`): never part of a layer's run, run with ``--long``,
shipped into the llm record beside the layer's rows, each keeping its own provenance."""

from __future__ import annotations

import json

import pytest

from tiltlab.claims import llm_record
from tiltlab.claims import rows as record_rows
from tiltlab.claims.registry import CheckResult, Verdict
from tiltlab.cli import main
from tiltlab.paper_checks import cli as pcli

from .test_records import LLM_CID, _check, _only_fake, _setup_llm


def _setup_long(reg, calls=None):
    """The fake llm layer of the record tests (check ``tiny``) plus a long llm check ``tiny2`` (the
    second check ``prereg_repo`` registers)."""
    _setup_llm(reg, calls=calls)

    def long_fn(seed):
        if calls is not None:
            calls.append(("long", seed))
        return CheckResult(Verdict.PARTLY, "hours of training", {"d": 0.1, "d_lo": -0.1, "d_hi": 0.3})

    reg.register_check(LLM_CID, layer="llm", expected=Verdict.PARTLY, name="tiny2", long=True)(long_fn)


def _keys(path) -> set[str]:
    return {record_rows.row_key(r) for r in json.loads(path.read_text())["checks"]}


TINY, LONG = f"{LLM_CID}[llm:tiny]", f"{LLM_CID}[llm:tiny2]"


def test_a_long_check_is_selected_only_with_include_long(isolated_registry, monkeypatch):
    reg = isolated_registry
    _setup_long(reg)
    _only_fake(monkeypatch, reg)
    keys = lambda **kw: {c.key for c in reg.select(layer="llm", **kw)}
    assert keys() == set() and keys(include_slow=True) == {TINY}
    assert keys(include_long=True) == {TINY, LONG}  # long implies slow
    assert keys(include_slow=True, include_long=True) == {TINY, LONG}
    (chk,) = [c for c in reg.checks() if c.name == "tiny2"]
    assert chk.long and chk.slow  # a long check is slow too: no fast run ever takes it
    assert pcli.reproducer(chk, 3).endswith("--check tiny2 --seed 3 --long")
    (tiny,) = [c for c in reg.checks() if c.name == "tiny"]
    assert not tiny.long and pcli.reproducer(tiny, 0).endswith("--slow")


def test_the_layer_run_leaves_the_long_check_out_and_long_runs_it(isolated_registry, monkeypatch, tmp_path, capsys):
    reg = isolated_registry
    calls: list = []
    _setup_long(reg, calls=calls)
    _only_fake(monkeypatch, reg)
    out = tmp_path / "run.json"
    assert _check("--layer", "llm", "--slow", "--out", str(out)) == 0
    assert _keys(out) >= {TINY} and LONG not in _keys(out) and ("long", 0) not in calls
    calls.clear()
    out2 = tmp_path / "long.json"
    assert _check("--layer", "llm", "--long", "--check", "tiny2", "--seed", "2", "--out", str(out2)) == 0
    assert calls == [("long", 2)]
    (row,) = [r for r in json.loads(out2.read_text())["checks"] if record_rows.row_key(r) == LONG]
    assert row["command"] == "tiltlab check --layer llm --check tiny2 --long --seed 2" and row["slow"]
    capsys.readouterr()
    assert _check("--layer", "llm", "--check", "tiny2", "--out", str(tmp_path / "x.json")) == 2
    assert "the selected checks are all long: add --long" in capsys.readouterr().err
    assert _check("--layer", "llm", "--long", "--list") == 0
    listed = capsys.readouterr().out
    assert any(line.split()[1:4] == ["tiny2", "llm", "long"] for line in listed.splitlines() if "tiny2" in line)


def test_ship_keeps_layer_and_long_rows_apart(isolated_registry, prereg_repo, monkeypatch, tmp_path, capsys):
    reg = isolated_registry
    _setup_long(reg)
    _only_fake(monkeypatch, reg)
    shipped = tmp_path / "records" / "llm.json"
    monkeypatch.setattr(llm_record, "LLM_RECORD", shipped)
    long_run = tmp_path / "long.json"
    assert _check("--layer", "llm", "--long", "--check", "tiny2", "--out", str(long_run), "--replace") == 0
    # a long run alone has no layer rows to ship into
    assert main(["report", "--ship-llm", str(long_run), "--machine", "m"]) == 2
    assert "ships into an existing llm record" in capsys.readouterr().err and not shipped.exists()
    layer_run = tmp_path / "layer.json"
    assert _check("--layer", "llm", "--slow", "--out", str(layer_run), "--replace") == 0
    assert main(["report", "--ship-llm", str(layer_run), "--machine", "layer box"]) == 0  # no long row needed
    assert _keys(shipped) == {TINY}
    top = json.loads(shipped.read_text())
    assert main(["report", "--ship-llm", str(long_run), "--machine", "long box"]) == 0
    after = json.loads(shipped.read_text())
    assert _keys(shipped) == {TINY, LONG}
    # the layer's rows and top-level provenance are the layer run's, untouched by the long one; the summary
    # and the per-claim rows count what the record holds (the long row too)
    counted = ("checks", "summary", "claims")
    assert {k: v for k, v in after.items() if k not in counted} == {k: v for k, v in top.items() if k not in counted}
    assert (top["summary"]["checks"], after["summary"]["checks"]) == (1, 2)
    assert after["summary"]["verdicts"] == {"partly": 1, "verified": 1}
    assert after["summary"]["seconds"] == top["summary"]["seconds"]
    (claim,) = after["claims"]
    assert sorted(claim["checks"]) == ["tiny", "tiny2"] and claim["verdict"] == "partly"  # the most informative
    rows = {record_rows.row_key(r): r for r in after["checks"]}
    assert rows[TINY] == top["checks"][0]
    assert (
        rows[LONG]["command"] == "tiltlab check --layer llm --check tiny2 --long" and rows[LONG]["verdict"] == "partly"
    )
    assert rows[LONG]["rule_commit"] == prereg_repo.reg
    # a later layer run keeps the long row it did not re-run
    assert main(["report", "--ship-llm", str(layer_run), "--machine", "layer box 2"]) == 0
    again = {record_rows.row_key(r): r for r in json.loads(shipped.read_text())["checks"]}
    assert set(again) == {TINY, LONG} and again[LONG] == rows[LONG]


def test_a_layer_run_missing_a_non_long_check_is_still_refused(isolated_registry, prereg_repo, monkeypatch, tmp_path):
    reg = isolated_registry
    _setup_long(reg)
    _only_fake(monkeypatch, reg)
    monkeypatch.setattr(llm_record, "LLM_RECORD", tmp_path / "records" / "llm.json")
    run = tmp_path / "long.json"
    assert _check("--layer", "llm", "--long", "--check", "tiny2", "--out", str(run), "--replace") == 0
    rec = json.loads(run.read_text())
    rec["checks"].append({**rec["checks"][0], "layer": "sim"})  # not only long llm rows: a partial layer run
    run.write_text(json.dumps(rec))
    with pytest.raises(ValueError, match="is not a full llm-layer run"):
        llm_record.ship_llm_record(run, machine_desc="m")
