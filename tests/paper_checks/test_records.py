"""Records are never silently replaced: a partial ``tiltlab check`` merges into the existing record
(per-check time, mode, commit), ``--replace`` writes only the run, a non-record ``--out`` is refused,
``tiltlab reproduce`` writes into a temporary folder and moves into place (an interrupted run leaves
nothing that looks complete), ``--quick`` never replaces a full run, and the report says where each
number came from. Also: the shipped llm record (merged as ``recorded``), progress per check/figure."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tiltlab.claims import llm_record, merging, provenance
from tiltlab.claims import rows as record_rows
from tiltlab.claims.registry import CheckResult, Verdict
from tiltlab.cli import main
from tiltlab.paper_checks import cli as pcli
from tiltlab.paper_checks.cli import records as cli_records

from .test_check_cli import _fake_png

CID_A, CID_B = "zz_fake.alpha", "zz_fake.beta"
_REAL_SELECT = pcli._select
_REAL_MAKE_FIGURES = pcli.make_figures


def _setup(reg, verdicts=None, calls=None):
    """Two fake claims: alpha with a sim and a data check, beta with a sim check and a slow one."""
    verdicts = verdicts if verdicts is not None else {}
    for cid in (CID_A, CID_B):
        reg.declare_claim(cid, "DISA", "Sec. 0", f"fake claim {cid}", kind="empirical")

    def make(name):
        def fn(seed: int) -> CheckResult:
            if calls is not None:
                calls.append(name)
            v = verdicts.get(name, Verdict.VERIFIED)
            return CheckResult(v, f"{name} seed={seed}", {"x": float(seed)})

        return fn

    reg.register_check(CID_A, layer="sim", name="a_sim")(make("a_sim"))
    reg.register_check(CID_A, layer="data", name="a_data")(make("a_data"))
    reg.register_check(CID_B, layer="sim", name="b_sim")(make("b_sim"))
    reg.register_check(CID_B, layer="sim", name="b_slow", slow=True)(make("b_slow"))


def _rows(path: Path) -> dict[str, dict]:
    return {record_rows.row_key(r): r for r in json.loads(path.read_text())["checks"]}


def _fake_make_one(fid, mod, out_dir, quick, seed):
    """A figure module stand-in (module level: the figure worker processes receive it by name)."""
    return [_fake_png(Path(out_dir), fid)], {}


def _check(*argv: str) -> int:
    return main(["check", "--jobs", "1", *argv])


# --------------------------------------------------------------------------- tiltlab check


@pytest.mark.parametrize(
    ("partial", "ran"),
    [
        (["--only", CID_B], {"zz_fake.beta[sim:b_sim]"}),
        (["--only", "zz_fake", "--layer", "data"], {"zz_fake.alpha[data:a_data]"}),
        (["--only", "zz_fake", "--check", "a_sim"], {"zz_fake.alpha[sim:a_sim]"}),
        (["--only", "zz_fake"], {"zz_fake.alpha[sim:a_sim]", "zz_fake.alpha[data:a_data]", "zz_fake.beta[sim:b_sim]"}),
    ],
)
def test_a_partial_check_merges_into_the_full_record(isolated_registry, tmp_path, capsys, partial, ran):
    _setup(isolated_registry)
    out = tmp_path / "claims.json"
    assert _check("--only", "zz_fake", "--slow", "--seed", "1", "--out", str(out)) == 0
    full = _rows(out)
    assert len(full) == 4 and all(r["mode"] == "check" and r["slow"] and r["seed"] == 1 for r in full.values())
    assert all(r["source"] == "run" and r["run_at"] and "commit" in r for r in full.values())
    capsys.readouterr()
    assert _check(*partial, "--seed", "2", "--out", str(out)) == 0
    printed = capsys.readouterr().out
    merged = _rows(out)
    assert set(merged) == set(full)  # never shrinks
    for key, row in merged.items():
        if key in ran:
            assert row["seed"] == 2 and row["summary"].endswith("seed=2") and row["slow"] is False
            assert row["command"].startswith("tiltlab check ") and "--seed 2" in row["command"]
        else:  # kept with its own provenance
            assert row == full[key]
    rec = json.loads(out.read_text())
    assert (
        rec["summary"]["checks"] == 4 and rec["summary"]["run"] == len(ran) and rec["summary"]["kept"] == 4 - len(ran)
    )
    assert [h["ran"] for h in rec["history"]] == [4, len(ran)]
    assert f"{4 - len(ran)} check(s) kept from earlier runs" in printed


def test_replace_writes_only_this_run(isolated_registry, tmp_path):
    _setup(isolated_registry)
    out = tmp_path / "claims.json"
    assert _check("--only", "zz_fake", "--slow", "--out", str(out)) == 0
    assert _check("--only", CID_B, "--replace", "--out", str(out)) == 0
    assert set(_rows(out)) == {"zz_fake.beta[sim:b_sim]"}


def test_a_kept_row_keeps_its_verdict_and_a_rerun_replaces_it(isolated_registry, tmp_path):
    verdicts = {"a_sim": Verdict.VERIFIED}
    _setup(isolated_registry, verdicts)
    out = tmp_path / "claims.json"
    assert _check("--only", "zz_fake", "--out", str(out)) == 0
    verdicts["a_sim"] = Verdict.REFUTED  # the check changed its verdict
    assert _check("--only", CID_A, "--check", "a_sim", "--out", str(out)) == 1
    rec = json.loads(out.read_text())
    assert {r["claim"]: r["verdict"] for r in rec["claims"]} == {CID_A: "refuted", CID_B: "verified"}
    assert rec["summary"]["failures"] == 1  # only this run's checks count for the exit status
    assert _check("--only", CID_B, "--out", str(out)) == 0  # a run that does not touch a_sim exits 0 ...
    assert _rows(out)["zz_fake.alpha[sim:a_sim]"]["verdict"] == "refuted"  # ... and keeps its row


def test_an_out_that_is_not_a_record_is_refused_before_any_check_runs(isolated_registry, tmp_path, capsys):
    calls: list[str] = []
    _setup(isolated_registry, calls=calls)
    out = tmp_path / "claims.json"
    out.write_text("my notes, not a record\n")
    assert _check("--only", "zz_fake", "--out", str(out)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"tiltlab check: error: --out {out} exists and is not a tiltlab record")
    assert err.endswith(f"pass another --out ({out} is left as it is)") and "--replace" not in err
    assert calls == [] and out.read_text() == "my notes, not a record\n"
    # --replace writes over a record, never over a file that is not one
    assert _check("--only", "zz_fake", "--replace", "--out", str(out)) == 2
    assert calls == [] and out.read_text() == "my notes, not a record\n"
    assert _check("--only", "zz_fake", "--out", str(out.with_name("other.json"))) == 0
    assert _check("--only", "zz_fake", "--replace", "--out", str(out.with_name("other.json"))) == 0
    assert len(_rows(out.with_name("other.json"))) == 3


@pytest.mark.parametrize("content", ['{"claims": []}', "[1, 2]", '{"checks": "not a list"}'])
def test_json_that_is_not_a_record_is_refused_too(isolated_registry, tmp_path, capsys, content):
    _setup(isolated_registry)
    out = tmp_path / "claims.json"
    out.write_text(content)
    assert _check("--only", "zz_fake", "--out", str(out)) == 2
    assert "is not a tiltlab record (no 'checks' list)" in capsys.readouterr().err
    assert out.read_text() == content


def test_a_plain_check_record_next_to_a_report_does_not_rewrite_it(isolated_registry, tmp_path, capsys):
    _setup(isolated_registry)
    (tmp_path / "REPORT.md").write_text("someone's report\n")
    out = tmp_path / "claims.json"
    assert _check("--only", "zz_fake", "--out", str(out)) == 0
    assert _check("--only", CID_B, "--out", str(out)) == 0  # merged, but not a reproduce record
    assert (tmp_path / "REPORT.md").read_text() == "someone's report\n"
    assert "report rewritten" not in capsys.readouterr().out


def test_rows_of_claims_no_longer_declared_are_dropped_on_merge(isolated_registry, tmp_path):
    _setup(isolated_registry)
    out = tmp_path / "claims.json"
    assert _check("--only", "zz_fake", "--out", str(out)) == 0
    rec = json.loads(out.read_text())
    rec["checks"].append({**rec["checks"][0], "claim": "zz_fake.removed_claim"})
    out.write_text(json.dumps(rec))
    assert _check("--only", CID_B, "--out", str(out)) == 0
    assert "zz_fake.removed_claim" not in {r["claim"] for r in json.loads(out.read_text())["checks"]}


# --------------------------------------------------------------------------- tiltlab reproduce


def _fake_reproduce(monkeypatch, reg, fail_in_figures: BaseException | None = None):
    monkeypatch.setattr(
        pcli.runner,
        "_select",
        lambda only, layer, name, include_slow, include_long=False: reg.select("zz_fake", layer, include_slow),
    )

    def figs(out_dir, quick, seed, progress=True):
        fig = _fake_png(Path(out_dir), "fig99_demo")
        if fail_in_figures is not None:
            raise fail_in_figures
        return [fig], {}

    monkeypatch.setattr(pcli.reproduce, "make_figures", figs)


def _reproduce(out: Path, *extra: str) -> int:
    return main(["reproduce", "--jobs", "1", "--out", str(out), *extra])


def test_an_interrupted_reproduce_leaves_nothing_that_looks_complete(isolated_registry, tmp_path, monkeypatch):
    _setup(isolated_registry)
    _fake_reproduce(monkeypatch, isolated_registry, KeyboardInterrupt())
    out = tmp_path / "results"
    assert main(["reproduce", "--jobs", "1", "--out", str(out)]) == 130  # interrupted
    # the temporary folder is removed, and so is the --out folder this run would have made: no claims.json,
    # no report, no partial figures, no empty folder
    assert list(tmp_path.iterdir()) == []


def test_an_interrupted_reproduce_keeps_the_previous_outputs(isolated_registry, tmp_path, monkeypatch):
    _setup(isolated_registry)
    out = tmp_path / "results"
    _fake_reproduce(monkeypatch, isolated_registry)
    assert _reproduce(out) == 0
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert {str(p) for p in before} >= {"claims.json", "REPORT.md", "report.html", "figures/fig99_demo.png"}
    _fake_reproduce(monkeypatch, isolated_registry, RuntimeError("figure crashed the run"))
    assert _reproduce(out) == 1
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results"]


def test_reproduce_replaces_its_outputs_and_leaves_other_files(isolated_registry, tmp_path, monkeypatch):
    _setup(isolated_registry)
    out = tmp_path / "results"
    (out / "figures").mkdir(parents=True)
    (out / "figures" / "stale_fig.png").write_bytes(b"old")
    (out / "mine.txt").write_text("keep me")
    _fake_reproduce(monkeypatch, isolated_registry)
    assert _reproduce(out) == 0
    assert sorted(p.name for p in (out / "figures").iterdir()) == ["fig99_demo.json", "fig99_demo.png"]
    assert (out / "mine.txt").read_text() == "keep me"
    assert sorted(p.name for p in out.iterdir()) == ["REPORT.md", "claims.json", "figures", "mine.txt", "report.html"]
    rec = json.loads((out / "claims.json").read_text())
    assert rec["figures"][0]["png"] == "figures/fig99_demo.png"
    assert {r["mode"] for r in rec["checks"]} == {"full"} and all(r["slow"] for r in rec["checks"])
    assert rec["runtime"]["wall_s"] >= 0 and rec["runtime"]["cpu_s"] > 0


def test_quick_never_replaces_a_full_run(isolated_registry, tmp_path, monkeypatch, capsys):
    _setup(isolated_registry)
    _fake_reproduce(monkeypatch, isolated_registry)
    out = tmp_path / "results"
    assert _reproduce(out) == 0
    before = (out / "claims.json").read_bytes()
    capsys.readouterr()
    assert _reproduce(out, "--quick") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"tiltlab reproduce: error: --out {out} holds a full-mode run") and "results/quick" in err
    assert (out / "claims.json").read_bytes() == before
    # by default a quick run goes to its own folder
    monkeypatch.chdir(tmp_path)
    assert main(["reproduce", "--quick", "--jobs", "1"]) == 0
    quick = json.loads((tmp_path / "results" / "quick" / "claims.json").read_text())
    assert quick["selection"]["quick"] and {r["mode"] for r in quick["checks"]} == {"quick"}
    assert (out / "claims.json").read_bytes() == before
    # a full run may replace a quick one (it holds everything the quick one did)
    assert _reproduce(tmp_path / "results" / "quick") == 0


def test_a_check_into_a_reproduce_folder_rewrites_its_report(isolated_registry, tmp_path, monkeypatch, capsys):
    verdicts: dict[str, Verdict] = {}
    _setup(isolated_registry, verdicts)
    _fake_reproduce(monkeypatch, isolated_registry)
    out = tmp_path / "results"
    assert _reproduce(out) == 0
    md0 = (out / "REPORT.md").read_text()
    assert "from an earlier run" not in md0
    monkeypatch.setattr(pcli.runner, "_select", _REAL_SELECT)
    verdicts["b_sim"] = Verdict.PARTLY
    capsys.readouterr()
    assert _check("--only", CID_B, "--out", str(out / "claims.json")) == 1
    assert f"report rewritten from the merged record: {out / 'REPORT.md'}" in capsys.readouterr().out
    md = (out / "REPORT.md").read_text()
    html = (out / "report.html").read_text()
    rec = json.loads((out / "claims.json").read_text())
    assert len(rec["checks"]) == 4 and rec["figures"][0]["id"] == "fig99_demo"
    # the record still describes the reproduce run (a later --quick must not replace it), plus the merge
    assert rec["selection"] == {"reproduce": True, "quick": False, "llm": False} and rec["updated_at"]
    assert [h["ran"] for h in rec["history"]] == [4, 1]
    capsys.readouterr()
    assert _reproduce(out, "--quick") == 2 and "holds a full-mode run" in capsys.readouterr().err
    # the re-run check's line says which run, mode and commit it came from; the report's own rows do not
    assert "**sim** `b_sim`: **partly** (expected verified)" in md
    (note,) = [ln for ln in md.splitlines() if "from an earlier run" in ln]
    assert "mode check" in note and "`tiltlab check --only zz_fake.beta`" in note and "commit" in note
    assert md.count("from an earlier run") == 1 and "from an earlier run" in html
    assert "data:image/png;base64," in html  # figures still embedded
    # `tiltlab report` renders the same from the record
    (out / "REPORT.md").unlink()
    assert main(["report", "--record", str(out / "claims.json")]) == 0
    assert (out / "REPORT.md").read_text() == md


# --------------------------------------------------------------------------- the shipped llm record


LLM_CID = "zz_fake.llm_decided"


def _setup_llm(reg, verdict=Verdict.VERIFIED, calls=None):
    reg.declare_claim(LLM_CID, "DISA", "Sec. 9", "a fake LLM-scale claim", kind="empirical")

    def data(seed):
        return CheckResult(Verdict.OUT_OF_REACH, "recorded in the paper")

    def llm(seed):
        if calls is not None:
            calls.append(seed)
        return CheckResult(verdict, "small model", {"gap": 0.2, "gap_lo": 0.1, "gap_hi": 0.3})

    reg.register_check(LLM_CID, layer="data", expected=Verdict.OUT_OF_REACH, name="llm_scale")(data)
    reg.register_check(LLM_CID, layer="llm", expected=Verdict.VERIFIED, name="tiny", slow=True)(llm)


def _only_fake(monkeypatch, reg):
    monkeypatch.setattr(reg, "_CHECKS", {k: c for k, c in reg._CHECKS.items() if c.claim_id.startswith("zz_fake")})


def _ship(tmp_path, monkeypatch, reg) -> Path:
    """Run the fake llm layer, ship it as the llm record (to a test path) and return that path. Needs
    the ``prereg_repo`` fixture: the run's commit and rule hashes come from that repository."""
    run = tmp_path / "llm_run.json"
    assert _check("--layer", "llm", "--slow", "--out", str(run)) == 0
    shipped = tmp_path / "records" / "llm.json"
    monkeypatch.setattr(llm_record, "LLM_RECORD", shipped)
    assert main(["report", "--ship-llm", str(run), "--machine", "test box"]) == 0
    return shipped


def test_ship_llm_stamps_the_record(isolated_registry, prereg_repo, tmp_path, monkeypatch, capsys):
    reg = isolated_registry
    _setup_llm(reg)
    _only_fake(monkeypatch, reg)
    shipped = json.loads(_ship(tmp_path, monkeypatch, reg).read_text())
    commit = prereg_repo.run[:12]  # `git describe --always --dirty --abbrev=12` of the clean run commit
    assert shipped["commit"] == commit and shipped["commit_sha"] == prereg_repo.run and shipped["machine"] == "test box"
    assert shipped["registry_hash"] == llm_record.llm_registry_hash() and shipped["run_seconds"] >= 0
    assert shipped["date"] and shipped["regenerate"] == llm_record.LLM_RECORD_COMMAND
    (row,) = shipped["checks"]
    assert row["commit"] == commit and row["command"] == "tiltlab check --layer llm --slow" and row["slow"]
    assert row["rule_commit"] == prereg_repo.reg and set(row["rule_hashes"]) == {"rules/tiny.py", "claims.toml"}
    assert "shipped llm record written to" in capsys.readouterr().out
    # docs/llm-checks.md's generated "last full run" section, from the shipped record
    from tiltlab.paper_checks.report import llm_run_section

    text = llm_run_section(shipped)
    assert f"at commit {commit} on test box: 1 checks, 0 changed or crashed" in text
    # the registration commit found by git, then the run commit of the row
    reg_to_run = f"{prereg_repo.reg[:12]} -> {commit} (registered)"
    assert f"| `{LLM_CID}` | `tiny` | verified | {reg_to_run} | gap 0.2 [0.1, 0.3] |" in text
    unregistered = {**shipped, "checks": [{k: v for k, v in row.items() if k != "rule_commit"}]}
    assert f"| not registered -> {commit} |" in llm_run_section(unregistered)
    # a row whose verdict or items differed from the expected ones is counted and named, whatever the
    # record's summary (it describes only the last invocation that wrote the record) says
    bad = {**shipped, "checks": [{**row, "ok": False}], "summary": {"failures": 0}}
    assert f"1 checks, 1 changed or crashed ({LLM_CID})" in llm_run_section(bad)


def test_ship_llm_refuses_a_partial_run(isolated_registry, tmp_path, monkeypatch, capsys):
    reg = isolated_registry
    _setup_llm(reg)
    reg.register_check(LLM_CID, layer="llm", expected=Verdict.VERIFIED, name="tiny2", slow=True)(
        lambda s: CheckResult(Verdict.VERIFIED, "x")
    )
    _only_fake(monkeypatch, reg)
    run = tmp_path / "llm_run.json"
    assert _check("--layer", "llm", "--check", "tiny", "--slow", "--out", str(run)) == 0
    dest = tmp_path / "shipped.json"
    capsys.readouterr()
    assert main(["report", "--ship-llm", str(run), "--machine", "m", "--out", str(dest)]) == 2
    assert "is not a full llm-layer run (missing 1 llm check(s)" in capsys.readouterr().err
    assert not dest.exists()


def test_the_registry_hash_follows_the_llm_part_only(isolated_registry):
    reg = isolated_registry
    _setup_llm(reg)
    h0 = llm_record.llm_registry_hash()
    reg.register_check(LLM_CID, layer="sim", name="unrelated")(lambda s: CheckResult(Verdict.VERIFIED, "x"))
    assert llm_record.llm_registry_hash() == h0  # a sim check does not touch the llm part
    key = f"{LLM_CID}[llm:tiny]"
    chk = reg._CHECKS[key]
    reg._CHECKS[key] = type(chk)(chk.claim_id, chk.layer, chk.name, Verdict.PARTLY, chk.fn, chk.slow)
    assert llm_record.llm_registry_hash() != h0  # an expected verdict changed
    reg._CHECKS[key] = chk
    assert llm_record.llm_registry_hash() == h0
    old = reg._CLAIMS[LLM_CID]
    reg._CLAIMS[LLM_CID] = type(old)(**{**old.__dict__, "statement": "a reworded claim"})
    assert llm_record.llm_registry_hash() != h0  # a claim the llm layer decides changed


def test_check_and_reproduce_merge_the_shipped_llm_record_as_recorded(
    isolated_registry, prereg_repo, tmp_path, monkeypatch, capsys
):
    reg = isolated_registry
    calls: list[int] = []
    _setup_llm(reg, calls=calls)
    _only_fake(monkeypatch, reg)
    _ship(tmp_path, monkeypatch, reg)
    calls.clear()
    capsys.readouterr()
    out = tmp_path / "c.json"
    assert _check("--only", "zz_fake", "--out", str(out)) == 0
    printed = capsys.readouterr().out
    assert calls == []  # not re-run
    rows = _rows(out)
    llm_row = rows[f"{LLM_CID}[llm:tiny]"]
    assert llm_row["source"] == "recorded" and llm_row["commit"] == prereg_repo.run[:12]
    assert rows[f"{LLM_CID}[data:llm_scale]"]["source"] == "run"
    rec = json.loads(out.read_text())
    assert {r["claim"]: r["decided_by"] for r in rec["claims"]}[LLM_CID] == ["llm"]
    assert rec["summary"]["recorded"] == 1
    assert "verified (recorded)" in printed and "not re-run" in printed
    # another layer selected: no recorded llm rows; the llm layer run: its own rows, not recorded ones
    assert _check("--only", "zz_fake", "--layer", "data", "--replace", "--out", str(out)) == 0
    assert {r["layer"] for r in json.loads(out.read_text())["checks"]} == {"data"}
    assert _check("--layer", "llm", "--slow", "--replace", "--out", str(out)) == 0
    assert calls == [0] and [r["source"] for r in json.loads(out.read_text())["checks"]] == ["run"]
    # --check selects among the recorded rows too
    assert _check("--only", "zz_fake", "--check", "llm_scale", "--replace", "--out", str(out)) == 0
    assert [r["check"] for r in json.loads(out.read_text())["checks"]] == ["llm_scale"]
    assert _check("--only", "zz_fake", "--check", "tiny", "--slow", "--replace", "--out", str(out)) == 2  # llm: --layer
    assert calls == [0]
    # reproduce: the report has the llm layer, marked recorded, and names the commit
    monkeypatch.setattr(pcli.reproduce, "make_figures", lambda out_dir, quick, seed, progress=True: ([], {}))
    res = tmp_path / "results"
    assert _reproduce(res, "--quick") == 0
    md = (res / "REPORT.md").read_text()
    assert "| llm (recorded) | 1 |" in md and f"### `{LLM_CID}` — verified (decided by llm)" in md
    assert "recorded (not re-run)" in md and f"commit {prereg_repo.run[:12]}" in md
    assert "llm (recorded)" in (res / "report.html").read_text()
    assert calls == [0]
    assert _reproduce(tmp_path / "with_llm", "--quick", "--llm") == 0  # --llm runs the layer instead
    md = (tmp_path / "with_llm" / "REPORT.md").read_text()
    assert calls == [0, 0] and "| llm | 1 |" in md and "recorded (not re-run)" not in md


# --------------------------------------------------------------------------- progress


def test_check_and_reproduce_report_progress_per_check_and_figure(isolated_registry, tmp_path, monkeypatch, capsys):
    _setup(isolated_registry)
    monkeypatch.setenv("TILTLAB_PROGRESS", "lines")
    monkeypatch.setenv("TILTLAB_PROGRESS_INTERVAL", "0")
    assert _check("--only", "zz_fake", "--out", str(tmp_path / "c.json")) == 0
    err = capsys.readouterr().err.splitlines()
    assert [ln.split(" ", 2)[1] for ln in err if ln.startswith("checks:")] == ["1/3", "2/3", "3/3"]
    _fake_reproduce(monkeypatch, isolated_registry)
    # the real figure runner over two fake figure modules: one progress step per figure
    monkeypatch.setattr(pcli.reproduce, "make_figures", _REAL_MAKE_FIGURES)
    monkeypatch.setattr(pcli.reproduce, "_figure_list", lambda: ([("fig98_a", "a"), ("fig99_b", "b")], {}))
    monkeypatch.setattr(pcli.reproduce, "_make_one", _fake_make_one)
    for jobs in ("1", "2"):  # in this process, and in a worker process while the checks run
        assert main(["reproduce", "--quick", "--jobs", jobs, "--out", str(tmp_path / f"r{jobs}")]) == 0
        err = capsys.readouterr().err.splitlines()
        assert any(ln.startswith("checks: 3/3 check") for ln in err)
        figs = [ln.split(" ", 2)[1] for ln in err if ln.startswith("figures:")]
        assert figs == ["1/2", "2/2"], err
        assert sorted(p.name for p in (tmp_path / f"r{jobs}" / "figures").glob("*.png")) == [
            "fig98_a.png",
            "fig99_b.png",
        ]
    monkeypatch.setenv("TILTLAB_PROGRESS", "off")
    assert _check("--only", "zz_fake", "--out", str(tmp_path / "c.json")) == 0
    assert not any(ln.startswith("checks:") for ln in capsys.readouterr().err.splitlines())


def test_rows_of_checks_not_loaded_keep_their_recorded_judgement(isolated_registry):
    """Without the [llm] extra the llm checks are not registered: their recorded rows still count,
    with the verdict and ok flag they were recorded with."""
    reg = isolated_registry
    reg.declare_claim(LLM_CID, "DISA", "Sec. 9", "a fake LLM-scale claim", kind="empirical")
    row = {
        "claim": LLM_CID,
        "layer": "llm",
        "check": "gone",
        "expected": "verified",
        "verdict": "partly",
        "ok": False,
        "summary": "s",
        "numbers": {"a": 1.0},
        "items": {"x": True},
        "expected_items": {"x": True},
        "seconds": 2.5,
        "source": "recorded",
        "commit": "c0ffee",
    }
    (o,) = record_rows.outcomes_from_rows([row, {**row, "claim": "zz_fake.undeclared"}])
    assert o.check.key == f"{LLM_CID}[llm:gone]" and o.verdict == "partly" and o.ok is False
    assert o.provenance == {"source": "recorded", "commit": "c0ffee"} and o.seconds == 2.5
    assert record_rows.outcomes_from_rows([{**row, "verdict": "verified", "ok": True}])[0].ok is True
    # a registered check is judged again against its current expectation
    reg.register_check(LLM_CID, layer="llm", expected=Verdict.PARTLY, name="gone", slow=True)(
        lambda s: CheckResult(Verdict.PARTLY, "x", items={"x": True})
    )
    assert record_rows.outcomes_from_rows([row])[0].ok is True


def test_the_machine_stamp_names_every_field_against_a_direct_reading(monkeypatch):
    """Each field of a record's machine stamp equals what the system reports, read here directly: a
    field dropped or read from the wrong source is a record that cannot say where its numbers came from."""
    import os
    import platform

    import torch

    monkeypatch.setattr(os, "getloadavg", lambda: (1.2345, 9.0, 9.0))
    got = provenance.machine()
    cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace") if Path("/proc/cpuinfo").exists() else ""
    names = [ln.split(":", 1)[1].strip() for ln in cpuinfo.splitlines() if ln.lower().startswith("model name")]
    assert got == {
        "platform": f"{platform.system()} {platform.machine()}",
        "cpu": names[0] if names else (platform.processor() or None),
        "cpus": os.cpu_count(),
        "load": 1.23,  # the 1-minute average, rounded to 2 places
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def test_the_machine_stamp_says_unknown_load_as_none(monkeypatch):
    import os

    def no_load():
        raise OSError("no load average here")

    monkeypatch.setattr(os, "getloadavg", no_load)
    assert provenance.machine()["load"] is None


@pytest.mark.parametrize(
    "stdout,code,commit,sha",
    [
        ("0123456789ab\n", 0, "0123456789ab", None),  # describe's output is no full hash
        ("f" * 40 + "\n", 0, "f" * 40, "f" * 40),
        ("fatal-but-on-stdout\n", 128, None, None),  # a failing git is no commit, whatever it prints
        ("", 0, None, None),
    ],
)
def test_provenance_is_what_git_says_only_when_git_succeeds(tmp_path, monkeypatch, stdout, code, commit, sha):
    """``git_commit`` / ``git_sha`` take git's answer only from a successful call, and a full hash only
    when it is one (a fake ``git`` first on PATH gives each answer)."""
    fake = tmp_path / "bin" / "git"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\nprintf '%s' '{stdout}'\nexit {code}\n", encoding="utf-8")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    assert provenance.git_commit(tmp_path) == commit
    assert provenance.git_sha(tmp_path) == sha


# --------------------------------------------------------------------------- the record's own fields


def test_an_unwritable_out_names_the_reason_or_the_errors_kind(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("x", encoding="utf-8")
    with pytest.raises(ValueError, match=r"cannot write --out .*claims.json \(File exists\); pass --out"):
        cli_records._check_writable_file(blocker / "claims.json")

    def no_reason(*a, **k):
        raise PermissionError()  # an OSError without strerror

    monkeypatch.setattr(cli_records.tempfile, "mkstemp", no_reason)
    with pytest.raises(ValueError, match=r"\(PermissionError\); pass --record"):
        cli_records._check_writable_dir(tmp_path, "--record")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]  # no probe left behind


def test_an_unchecked_claims_row_and_the_merge_of_unchecked_claims(isolated_registry):
    reg = isolated_registry
    c = reg.declare_claim("zz_un.a", "DISA", "Sec. 9", "an unchecked claim", kind="empirical")
    reg.declare_claim("zz_un.b", "DISA", "Sec. 9", "a checked claim", kind="empirical")
    reg.register_check("zz_un.b", layer="sim", name="b")(lambda s: CheckResult(Verdict.VERIFIED, "x"))
    rows = cli_records._unchecked("zz_un")
    assert rows == [
        {
            "claim": "zz_un.a", "paper": "DISA", "section": "Sec. 9", "cite": reg.cite(c),
            "statement": "an unchecked claim", "kind": "empirical", "verdict": "unchecked",
            "llm_command": c.llm_command,
        }
    ]  # fmt: skip
    old = [{"claim": "zz_un.a", "v": "old"}, {"claim": "zz_un.b", "v": "old"}, {"claim": "zz_gone", "v": "old"}]
    new = [{"claim": "zz_un.a", "v": "new"}]
    # a claim with a check now and a claim no longer declared both leave; the newer row wins
    assert merging.merge_unchecked(old, new) == [{"claim": "zz_un.a", "v": "new"}]


def test_a_records_time_is_its_runs_and_its_history_entry_names_the_run():
    prov = {"run_at": "2020-01-02T03:04:05Z", "commit": "abc", "commit_sha": "f" * 40}
    rec = cli_records._record([], [], 0, {"only": None}, 1.0, prov=prov)
    assert (rec["generated_at"], rec["commit"], rec["commit_sha"]) == ("2020-01-02T03:04:05Z", "abc", "f" * 40)
    fresh = cli_records._record([], [], 0, {}, 1.0)
    assert fresh["generated_at"] and fresh["generated_at"] != prov["run_at"] and fresh["commit"] is None
    assert merging.history_entry({**rec, "summary": {"run": 3, "checks": 7}}) == {
        "generated_at": "2020-01-02T03:04:05Z",
        "commit": "abc",
        "selection": {"only": None},
        "ran": 3,
    }
    assert merging.history_entry({"summary": {"checks": 7}})["ran"] == 7  # an older record's count


def test_the_runtime_sums_own_and_childrens_cpu_and_takes_the_larger_peak(monkeypatch):
    import resource
    from types import SimpleNamespace

    me = SimpleNamespace(ru_utime=1.25, ru_stime=0.5, ru_maxrss=4096)
    kids = SimpleNamespace(ru_utime=2.0, ru_stime=0.25, ru_maxrss=10240)
    monkeypatch.setattr(resource, "getrusage", lambda who: me if who == resource.RUSAGE_SELF else kids)
    rt = cli_records._runtime(12.34)
    assert (rt["wall_s"], rt["cpu_s"], rt["max_rss_mib"]) == (12.3, 4.0, 10.0)
    assert rt["machine"] == cli_records._machine()
