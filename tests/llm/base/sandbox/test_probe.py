"""llm.base.sandbox.probe: the isolation plan (the fallback without bwrap, bwrap's mount order) and
``isolation_report``'s facts."""

import os
import sys

import pytest

if not sys.platform.startswith("linux"):
    pytest.skip("the sandbox targets Linux (rlimits, namespaces)", allow_module_level=True)

from tests.llm.base.sandbox._helpers import FAST
from tiltlab.llm.base.sandbox import SandboxConfig, SandboxWarning, probe, run_judged, run_python

pytestmark = pytest.mark.filterwarnings("ignore::tiltlab.llm.base.sandbox.SandboxWarning")


# ---------------------------------------------------------------------------------------------
# fallback without bwrap
# ---------------------------------------------------------------------------------------------


def test_fallback_without_bwrap_warns_reports_and_still_blocks(monkeypatch):
    monkeypatch.setattr(probe, "_bwrap_works", lambda python, root: False)
    monkeypatch.setattr(probe, "_unshare_prefix", lambda net, pids: None)
    monkeypatch.setattr(probe, "_warned", set())
    with pytest.warns(SandboxWarning) as rec:
        r = run_python("import socket\nsocket.socket()", FAST)
    msgs = " ".join(str(w.message) for w in rec)
    assert "apt-get install -y bubblewrap" in msgs and "network namespaces are unavailable" in msgs
    assert r.status == "blocked"
    assert r.isolation["level"] == "process" and r.isolation["network_namespace"] is False
    assert run_judged("def f(x):\n    return x + 1\n", "assert f(1) == 2", FAST).passed


def test_backend_bwrap_required(monkeypatch):
    monkeypatch.setattr(probe, "_bwrap_works", lambda python, root: False)
    with pytest.raises(RuntimeError, match="bubblewrap"):
        run_python("pass", FAST, backend="bwrap")


def test_legacy_backend_runs_and_says_so():
    r = run_python("print(1)", FAST, backend="legacy")
    assert r.passed and r.isolation["level"] in ("namespaces", "process")


def test_bwrap_mounts_tmp_before_the_interpreter_prefixes(tmp_path):
    """bwrap mounts in argument order: the private tmpfs /tmp must come before the bind of an interpreter
    prefix under /tmp (a virtualenv there), or it hides it."""
    import shutil
    import subprocess

    if shutil.which("bwrap") is None:
        pytest.fail("bubblewrap is missing") if os.environ.get("CI") else pytest.skip("bubblewrap is missing")
    venv = tmp_path / "venv"  # pytest's tmp_path lies under /tmp
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    args = probe._bwrap_args(py, os.geteuid() == 0, 1)
    tmpfs_at = max(i for i, a in enumerate(args) if a == "--tmpfs" and args[i + 1] == "/tmp")
    binds = [i for i, a in enumerate(args) if a == "--ro-bind" and args[i + 1] == str(venv)]
    assert binds and min(binds) > tmpfs_at
    assert probe._bwrap_works(py, os.geteuid() == 0)  # the interpreter starts inside the sandbox


@pytest.mark.parametrize(
    "plan, uid",
    [
        ({"level": "bwrap", "ids": "slot", "root_parent": True}, "uid_base + 256 * (pid % 4096) + slot"),
        ({"level": "bwrap", "ids": None, "root_parent": False}, 65534),
        ({"level": "namespaces", "ids": (61000, 61000), "root_parent": True}, 61000),
        ({"level": "process", "ids": None, "root_parent": False}, "euid"),
    ],
    ids=["bwrap-slot", "bwrap-user", "namespaces-ids", "process"],
)
def test_isolation_report_states_each_plans_facts(plan, uid, monkeypatch):
    """The report is the plan's facts, one key each, on four plans where they differ: the uid line names
    the per-slot uid only for slot ids, bwrap's mount namespace and private /tmp only under bwrap."""
    import tiltlab.llm.base.sandbox as sb

    full = {"prefix": ["unshare", "-n"], "net_ns": True, "pid_ns": False, "python": "/usr/bin/python3", **plan}
    monkeypatch.setattr(probe, "_plan", lambda cfg: full)
    rep = sb.isolation_report(SandboxConfig(audit_hook=False))
    bwrap = plan["level"] == "bwrap"
    assert rep == {
        "level": plan["level"],
        "network_namespace": True,
        "pid_namespace": False,
        "mount_namespace": bwrap,
        "private_tmp": bwrap,
        "unshare_prefix": "unshare -n",
        "parent_is_root": plan["root_parent"],
        "runs_as_uid": os.geteuid() if uid == "euid" else uid,
        "privileges_dropped": plan["ids"] is not None or (bwrap and not plan["root_parent"]),
        "rlimit_nproc_effective": plan["ids"] is not None or not plan["root_parent"],
        "python": "/usr/bin/python3",
        "audit_hook": False,
    }
