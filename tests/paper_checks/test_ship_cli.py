"""The documented regenerate commands of the shipped llm record, run as a user runs them: the
``tiltlab`` console command in a subprocess, no fixture, no registry set up by the test.

``tiltlab report --ship-llm FILE`` and ``tiltlab report --set-llm-expectations`` need every
registered check (the llm layer's too); a test that calls the functions after a fixture's
``catalog.discover()`` cannot see a CLI path that forgets it (they crashed with "call discover() first").
The small record is the shipped one's rows as the run wrote them: real rows, real commits, verified
against this clone's git history (so the test needs the history: CI clones it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.claims.test_preregistration import SHIPPED, _in_git_checkout

ROOT = Path(__file__).resolve().parents[2]


def _tiltlab(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("tiltlab")
    cmd = [exe] if exe else [sys.executable, "-c", "import sys; from tiltlab.cli import main; sys.exit(main())"]
    # the checkout under test first on the path: the console script then runs this checkout's code even
    # where the installed tiltlab is another checkout's (a git worktree, a mutation run)
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONPATH": path}
    return subprocess.run([*cmd, *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=300)


def _run_record(tmp_path: Path, rows_edit=None) -> Path:
    """The record a full ``tiltlab check --layer llm --slow --out FILE`` run writes, rebuilt from the
    shipped record's rows (each keeps its own commit, hashes and values)."""
    pytest.importorskip("trl", reason="the llm layer's checks need the [llm] extra")
    shipped = json.loads(SHIPPED.read_text(encoding="utf-8"))
    rows = [{k: v for k, v in r.items() if k != "rule_commit"} for r in shipped["checks"]]
    if rows_edit is not None:
        rows_edit(rows)
    rec = {
        "commit": shipped["commit"],
        "commit_sha": shipped["commit_sha"],
        "generated_at": shipped["date"],
        "machine": shipped["machine"],
        "seed": shipped["seed"],
        "summary": shipped["summary"],
        "claims": shipped["claims"],
        "checks": rows,
    }
    path = tmp_path / "llm.json"
    path.write_text(json.dumps(rec), encoding="utf-8")
    return path


def test_the_documented_ship_command_runs_from_the_cli(tmp_path):
    _in_git_checkout()
    run = _run_record(tmp_path)
    dest = tmp_path / "shipped.json"
    out = _tiltlab("report", "--ship-llm", str(run), "--out", str(dest), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith(f"shipped llm record written to {dest}: 26 checks"), out.stdout
    new, old = json.loads(dest.read_text()), json.loads(SHIPPED.read_text())
    assert [r["claim"] for r in new["checks"]] == [r["claim"] for r in old["checks"]]
    for a, b in zip(new["checks"], old["checks"]):
        for k in ("verdict", "items", "numbers", "evidence", "commit", "commit_sha", "rule_hashes", "rule_commit"):
            assert a.get(k) == b.get(k), (a["claim"], k)
    assert new["registry_hash"] == old["registry_hash"]  # the shipped record is current with the registry
    assert (new["machine"], new["run_seconds"]) == (old["machine"], old["run_seconds"])  # the run's own
    # --machine and --run-seconds away from the run's: the shipped record says what the flags say
    dest2 = tmp_path / "shipped2.json"
    out = _tiltlab(
        "report", "--ship-llm", str(run), "--out", str(dest2), "--machine", "box B", "--run-seconds", "12.5",
        cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    again = json.loads(dest2.read_text())
    assert (again["machine"], again["run_seconds"]) == ("box B", 12.5)


def test_a_forged_results_file_is_refused_from_the_cli(tmp_path):
    """One row's hash of one rule file replaced by the hash of the file as it is now (a later commit's
    content): the registered hashes are recomputed from ``git show <run commit>:<path>``, so the
    ship is refused in one line naming the check and the file, and nothing is written."""
    _in_git_checkout()
    forged: dict[str, str] = {}

    def edit(rows):
        row = rows[0]
        path = "llm/checks/rules.py"
        assert path in row["rule_hashes"]
        import hashlib

        now = hashlib.sha256((ROOT / path).read_bytes()).hexdigest()
        assert now != row["rule_hashes"][path]  # the file moved on since the run
        row["rule_hashes"] = {**row["rule_hashes"], path: now}
        forged.update(check=row["check"], claim=row["claim"], path=path, sha=now)

    run = _run_record(tmp_path, edit)
    dest = tmp_path / "shipped.json"
    out = _tiltlab("report", "--ship-llm", str(run), "--out", str(dest), cwd=tmp_path)
    print(out.stderr)
    assert out.returncode == 2
    err = out.stderr.strip().splitlines()[-1]
    assert err.startswith(
        f"tiltlab report: error: --ship-llm {run}: check {forged['check']} ({forged['claim']}): {forged['path']}: "
        f"the row's run-time sha256 {forged['sha'][:12]} is not the file's at its run commit"
    ), err
    assert not dest.exists()


def test_the_documented_set_expectations_command_runs_from_the_cli(tmp_path):
    _in_git_checkout()
    pytest.importorskip("trl", reason="the llm layer's checks need the [llm] extra")
    dest = tmp_path / "llm.json"
    shutil.copy(SHIPPED, dest)
    out = _tiltlab("report", "--set-llm-expectations", "--out", str(dest), cwd=tmp_path)
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()  # fmt: skip
    if dirty:  # a developer's modified checkout: refused in one line, the record untouched
        assert out.returncode == 2 and "commit the expectations first" in out.stderr.strip().splitlines()[-1]
        assert dest.read_bytes() == SHIPPED.read_bytes()
        return
    assert out.returncode == 0, out.stderr[-2000:]  # CI's clean clone: every shipped row meets the expectations
    assert out.stdout.startswith(f"{dest}: expectations of 26 rows set from the registry"), out.stdout
    rec = json.loads(dest.read_text())
    assert rec["expectations_set_at"] and all(r["ok"] for r in rec["checks"])
