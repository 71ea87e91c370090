"""``tiltlab check`` / ``tiltlab reproduce`` arguments: an empty selection, ``--list``, ``--jobs``,
an unwritable ``--out``, reproducers that carry every flag, and the JSON record (claim verdicts,
atomic write, relative paths)."""

from __future__ import annotations

import base64
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tiltlab.claims.registry import CheckResult, Verdict
from tiltlab.cli import main
from tiltlab.paper_checks import catalog
from tiltlab.paper_checks import cli as pcli
from tiltlab.paper_checks.report import claim_status


def _claim(reg, cid="zz_fake.claim"):
    return reg.declare_claim(cid, "DISA", "Sec. 0", "a fake claim for the tests", kind="empirical")


def _check(reg, name, returns, expected=None, cid="zz_fake.claim", slow=False, calls=None):
    def fn(seed: int) -> CheckResult:
        if calls is not None:
            calls.append(name)
        return CheckResult(returns, f"{name} says {returns.value}", {"x": 1.0})

    reg.register_check(cid, layer="sim", expected=expected or returns, name=name, slow=slow)(fn)


# a valid 1x1 PNG (the report embeds it)
_PNG_1X1 = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
)


@dataclass
class _FakeFigure:
    """The fields of a figure record that ``tiltlab reproduce`` and the report read."""

    id: str
    title: str
    caption: str
    png: Path
    data: Path
    claims: list = field(default_factory=list)
    findings: list = field(default_factory=list)
    seconds: float = 0.0


def _fake_png(fig_dir: Path, fid: str = "fig99_demo") -> _FakeFigure:
    """A figure written where the figure runner is told to write (``tiltlab reproduce``'s temporary folder)."""
    fig_dir.mkdir(parents=True, exist_ok=True)
    png = fig_dir / f"{fid}.png"
    png.write_bytes(_PNG_1X1)
    (fig_dir / f"{fid}.json").write_text("{}")
    return _FakeFigure(fid, "Demo", "caption", png, fig_dir / f"{fid}.json")


def _stderr_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_empty_selection_is_an_error_and_leaves_the_record(isolated_registry, tmp_path, capsys):
    out = tmp_path / "claims.json"
    out.write_text('{"previous": "record"}\n')
    assert main(["check", "--only", "nosuchprefix", "--out", str(out)]) == 2
    line = _stderr_line(capsys)
    assert line.startswith("tiltlab check: error: no check matches --only nosuchprefix") and "--list" in line
    assert out.read_text() == '{"previous": "record"}\n'


def test_only_an_llm_claim_says_to_name_the_layer(isolated_registry, tmp_path, capsys):
    """An llm-layer check selected by --only alone (the opt-in layer is not named): the error says how
    to run it, with or without --slow."""
    from tiltlab.claims.registry import CheckResult, Verdict

    cid = next(c for c in isolated_registry._CLAIMS)
    isolated_registry.register_check(cid, layer="llm", expected=Verdict.VERIFIED, name="opt_in_probe", slow=True)(
        lambda seed: CheckResult(Verdict.VERIFIED, "x")
    )
    for extra in ([], ["--slow"]):
        assert main(["check", "--only", cid, "--check", "opt_in_probe", *extra, "--out", str(tmp_path / "c.json")]) == 2
        line = _stderr_line(capsys)
        assert "add --layer llm --slow" in line, line
    # not when the check name selects nothing or another layer was asked for: the plain message
    for extra in (["--check", "no_such_check"], ["--check", "opt_in_probe", "--layer", "sim"]):
        assert main(["check", "--only", cid, *extra, "--slow", "--out", str(tmp_path / "c.json")]) == 2
        assert "add --layer llm" not in _stderr_line(capsys)
    assert not (tmp_path / "c.json").exists()


def test_layer_llm_says_no_llm_checks_exist(isolated_registry, tmp_path, capsys):
    for key in [k for k, c in isolated_registry._CHECKS.items() if c.layer == "llm"]:
        del isolated_registry._CHECKS[key]  # the message is for a registry without llm checks
    assert main(["check", "--layer", "llm", "--out", str(tmp_path / "c.json")]) == 2
    assert _stderr_line(capsys).startswith("tiltlab check: error: no llm checks exist yet")
    assert not (tmp_path / "c.json").exists()


def test_only_slow_checks_selected_says_add_slow(isolated_registry, tmp_path, capsys):
    _claim(isolated_registry)
    _check(isolated_registry, "slowpoke", Verdict.VERIFIED, slow=True)
    assert main(["check", "--only", "zz_fake", "--layer", "sim", "--out", str(tmp_path / "c.json")]) == 2
    assert _stderr_line(capsys) == "tiltlab check: error: the selected checks are all slow: add --slow"


@pytest.mark.parametrize("jobs", ["0", "-3"])
def test_jobs_below_one_is_refused(jobs, capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        main(["check", "--jobs", jobs, "--out", str(tmp_path / "c.json")])
    assert exc.value.code == 2
    assert (
        _stderr_line(capsys)
        == f"tiltlab check: error: argument --jobs: must be >= 1 (1 = run in this process), got {jobs}"
    )


def test_unwritable_out_is_refused_before_any_check_runs(isolated_registry, tmp_path, capsys):
    calls: list[str] = []
    _claim(isolated_registry)
    _check(isolated_registry, "counted", Verdict.VERIFIED, calls=calls)
    (tmp_path / "a_file").write_text("not a folder")
    bad = tmp_path / "a_file" / "claims.json"  # its parent is a file: cannot be created
    assert main(["check", "--only", "zz_fake", "--jobs", "1", "--out", str(bad)]) == 2
    assert _stderr_line(capsys).startswith(f"tiltlab check: error: cannot write --out {bad}")
    assert calls == []
    assert main(["check", "--only", "zz_fake", "--jobs", "1", "--out", str(tmp_path)]) == 2  # a directory
    assert "is a directory" in _stderr_line(capsys) and calls == []


def test_list_prints_the_selection_and_runs_nothing(isolated_registry, tmp_path, capsys):
    calls: list[str] = []
    _claim(isolated_registry)
    _check(isolated_registry, "fast_one", Verdict.VERIFIED, calls=calls)
    _check(isolated_registry, "slow_one", Verdict.VERIFIED, slow=True, calls=calls)
    out = tmp_path / "c.json"
    assert main(["check", "--only", "zz_fake", "--slow", "--list", "--out", str(out)]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].split() == ["claim", "check", "layer", "slow"]
    assert rows[1].split() == ["zz_fake.claim", "fast_one", "sim"]
    assert rows[2].split() == ["zz_fake.claim", "slow_one", "sim", "slow"]
    assert rows[3] == "2 checks of 1 claims: 2 to run (1 slow); none run"
    assert calls == [] and not out.exists()


def test_reproducer_of_a_slow_check_carries_slow(isolated_registry, tmp_path, capsys):
    _claim(isolated_registry)
    _check(isolated_registry, "slow_flip", Verdict.PARTLY, expected=Verdict.VERIFIED, slow=True)
    assert main(["check", "--only", "zz_fake", "--slow", "--jobs", "1", "--out", str(tmp_path / "c.json")]) == 1
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if "reproduce:" in ln]
    cmd = shlex.split(line.split("reproduce:", 1)[1])
    assert "--slow" in cmd
    # the reproducer selects the check again (without --slow it would select nothing)
    assert main([*cmd[1:], "--jobs", "1", "--json", "--out", str(tmp_path / "d.json")]) == 1
    assert [c["check"] for c in json.loads(capsys.readouterr().out)["checks"]] == ["slow_flip"]


def test_reproducer_of_a_downstream_check_carries_claims_and_module(isolated_registry, tmp_path, monkeypatch, capsys):
    (tmp_path / "myclaims").mkdir()
    (tmp_path / "myclaims" / "mine.toml").write_text(
        '[[paper]]\nshort = "MyProjR"\ntitle = "My project"\n\n'
        '[[claim]]\nid = "myprojr.loss_is_finite"\npaper = "MyProjR"\nsection = "eq. (5)"\n'
        'statement = "our TB loss is finite"\nkind = "beyond"\n',
        encoding="utf-8",
    )
    (tmp_path / "zz_myprojr_checks.py").write_text(
        "from tiltlab.paper_checks import register_check, CheckResult, Verdict\n"
        "@register_check('myprojr.loss_is_finite', layer='sim', expected=Verdict.VERIFIED)\n"
        "def finite(seed):\n    return CheckResult(Verdict.REFUTED, 'loss=inf', {'loss': 1e9})\n",
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", list(__import__("sys").path))
    monkeypatch.delitem(__import__("sys").modules, "zz_myprojr_checks", raising=False)
    argv = ["check", "--claims", "myclaims", "--module", "zz_myprojr_checks", "--only", "myprojr", "--jobs", "1"]
    assert main([*argv, "--out", "c.json"]) == 1
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if "reproduce:" in ln]
    cmd = shlex.split(line.split("reproduce:", 1)[1])
    assert cmd[cmd.index("--claims") + 1] == "myclaims" and cmd[cmd.index("--module") + 1] == "zz_myprojr_checks"
    rec = json.loads(Path("c.json").read_text())
    assert rec["checks"][0]["reproducer"] == line.split("reproduce:", 1)[1].strip()
    # the printed command re-runs exactly that check
    assert main([*cmd[1:], "--jobs", "1", "--json", "--out", "d.json"]) == 1
    assert [c["claim"] for c in json.loads(capsys.readouterr().out)["checks"]] == ["myprojr.loss_is_finite"]
    __import__("sys").modules.pop("zz_myprojr_checks", None)


def test_record_has_claim_verdicts_and_is_written_atomically(isolated_registry, tmp_path, capsys):
    reg = isolated_registry
    _claim(reg, "zz_fake.mixed")
    _claim(reg, "zz_fake.reach")
    _check(reg, "holds", Verdict.VERIFIED, cid="zz_fake.mixed")
    _check(reg, "breaks", Verdict.REFUTED, cid="zz_fake.mixed")
    _check(reg, "far", Verdict.OUT_OF_REACH, cid="zz_fake.reach")
    out = tmp_path / "rec" / "claims.json"
    assert main(["check", "--only", "zz_fake", "--jobs", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    rec = json.loads(out.read_text())
    claims = {row["claim"]: row for row in rec["claims"]}
    assert claims["zz_fake.mixed"]["verdict"] == "refuted"  # refuted outranks verified
    assert claims["zz_fake.reach"]["verdict"] == "out_of_reach"
    assert sorted(claims["zz_fake.mixed"]["checks"]) == ["breaks", "holds"]
    # the same rule as the report's claim rows
    outs_by_claim = {}
    for o in pcli._run(pcli._select("zz_fake", None, None, False), 0, progress=False):
        outs_by_claim.setdefault(o.check.claim_id, []).append(o)
    assert {c: claim_status(os_) for c, os_ in outs_by_claim.items()} == {
        c: row["verdict"] for c, row in claims.items()
    }
    assert "3 checks (out_of_reach 1, refuted 1, verified 1) of 2 claims" in printed
    assert sorted(p.name for p in out.parent.iterdir()) == ["claims.json"]  # no temporary left behind


def test_reproduce_stores_paths_relative_to_the_output_dir(isolated_registry, tmp_path, monkeypatch, capsys):
    reg = isolated_registry
    _claim(reg, "zz_fake.repro")
    _check(reg, "fake", Verdict.VERIFIED, cid="zz_fake.repro")
    out = tmp_path / "out"
    monkeypatch.setattr(
        pcli.runner, "_select", lambda *a, **k: [c for c in reg.checks() if c.claim_id == "zz_fake.repro"]
    )
    monkeypatch.setattr(
        pcli.reproduce, "make_figures", lambda out_dir, quick, seed, progress=True: ([_fake_png(out_dir)], {})
    )
    assert main(["reproduce", "--quick", "--jobs", "1", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    rec = json.loads((out / "claims.json").read_text())
    assert rec["figures"][0]["png"] == "figures/fig99_demo.png"
    assert rec["figures"][0]["data"] == "figures/fig99_demo.json"
    assert f"outputs in {out}/" in captured.out
    assert "[reproduce] checks done" in captured.err  # per-stage progress lines


def test_reproduce_refuses_an_out_that_is_a_file(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    assert main(["reproduce", "--quick", "--out", str(tmp_path / "f")]) == 2
    assert _stderr_line(capsys).startswith(f"tiltlab reproduce: error: --out {tmp_path / 'f'} is a file")


def test_pool_starts_the_longest_checks_first_and_keeps_the_order_of_outcomes(isolated_registry, tmp_path):
    """``--jobs N`` submits by recorded cost, longest first, an unknown check before every known one (ties
    keep claim order); the outcomes come back in the selection's order whatever the start order."""
    reg = isolated_registry
    _claim(reg)
    for name in ("a_short", "b_long", "c_new", "d_mid"):
        _check(reg, name, Verdict.VERIFIED)
    chks = pcli._select("zz_fake", None, None, False)
    costs = {c.key: s for c, s in zip(chks, (0.1, 9.0, None, 2.0)) if s is not None}
    assert [c.name for c in pcli.longest_first(chks, costs)] == ["c_new", "b_long", "d_mid", "a_short"]
    assert [c.name for c in pcli.longest_first(chks, {})] == [c.name for c in chks]  # no costs: claim order
    outs = pcli._run(chks, 0, progress=False, jobs=2)
    assert [o.check.name for o in outs] == [c.name for c in chks] and all(o.ok for o in outs)


def test_report_costs_writes_the_run_times_the_runner_reads(isolated_registry, tmp_path, capsys):
    reg = isolated_registry
    _claim(reg)
    _check(reg, "one", Verdict.VERIFIED)
    rec_path, costs_path = tmp_path / "c.json", tmp_path / "costs.json"
    assert main(["check", "--only", "zz_fake", "--jobs", "1", "--out", str(rec_path)]) == 0
    assert main(["report", "--record", str(rec_path), "--costs", "--out", str(costs_path)]) == 0
    assert "run times of 1 checks written to" in capsys.readouterr().out
    rec = json.loads(rec_path.read_text())
    assert pcli.check_costs(costs_path) == {"zz_fake.claim[sim:one]": round(rec["checks"][0]["seconds"], 3)}
    assert pcli.check_costs(tmp_path / "absent.json") == {}  # a hint only: no file, no costs


def test_shipped_costs_name_registered_checks():
    """``paper_checks/costs.json`` (``tiltlab report --costs``) covers the fast checks; a renamed check
    leaves a stale name behind: regenerate it."""
    from tiltlab.claims import registry

    catalog.discover()
    costs = pcli.check_costs()
    keys = {c.key for c in registry.checks() if c.layer in ("theory", "sim", "data") and not c.slow}
    assert costs and set(costs) <= {c.key for c in registry.checks()}, sorted(set(costs) - keys)[:5]
    assert len(keys - set(costs)) <= 5, sorted(keys - set(costs))[:10]
