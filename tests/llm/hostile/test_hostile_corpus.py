"""The hostile corpus (``corpus.py``) through ``resolve_reward("code")``, as root and as an ordinary user.

Every row must earn exactly its expected reward (0.0 for the attacks, 1.0 for the correct
controls) and nothing may be left on the host. The oracle attacks are also run unsandboxed, to
show that they do succeed where nothing stops them (so a 0.0 is the sandbox's doing).
"""

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
import warnings
from pathlib import Path

import pytest

if not sys.platform.startswith("linux"):
    pytest.skip("the sandbox targets Linux (namespaces, rlimits)", allow_module_level=True)

from tiltlab.llm.sandbox import SandboxWarning, isolation_report

_spec = importlib.util.spec_from_file_location("tiltlab_hostile_corpus", Path(__file__).with_name("corpus.py"))
corpus = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(corpus)

pytestmark = pytest.mark.filterwarnings("ignore::tiltlab.llm.sandbox.SandboxWarning")
ROWS = corpus.cases("/nonexistent", 1, "/nonexistent")
NAMES = [r["name"] for r in ROWS]
REPO = Path(__file__).resolve().parents[3]
# Rows only the bwrap level wins: the fallback (unshare + rlimits, no mount namespace) shows the
# host's /proc, file-system Unix sockets and world-readable files, and as root it drops to
# `nobody` with the system python (no numpy). The verdict rows hold at every level.
BWRAP_ONLY = {
    "host process list / trainer cmdline",
    "host Unix socket (hook off)",
    "private files (host dir, /etc/shadow, /root)",
    "control: correct with numpy",
}
with warnings.catch_warnings():
    warnings.simplefilter("ignore", SandboxWarning)
    LEVEL = isolation_report()["level"]


@pytest.fixture(scope="module")
def report():
    return corpus.run_corpus()


def test_corpus_size():
    hostile = [r for r in ROWS if r["expected"] == 0.0]
    assert len(hostile) >= 20 and len(set(NAMES)) == len(NAMES)
    assert any(r["expected"] == 1.0 and "numpy" in r["completion"] for r in ROWS)


@pytest.mark.parametrize("name", NAMES)
def test_row_earns_its_reward(report, name):
    if LEVEL != "bwrap" and name in BWRAP_ONLY:
        pytest.skip(
            f"isolation level {LEVEL!r} cannot stop this row; install bubblewrap (apt-get install -y bubblewrap)"
        )
    row = next(r for r in report["rows"] if r["class"] == name)
    assert row["reward"] == row["expected"], row


def test_nothing_left_behind(report):
    assert report["left"] == []


def test_isolation_level_is_reported(report):
    assert {r["level"] for r in report["rows"]} == {LEVEL}


# ---------------------------------------------------------------------------------------------
# the oracle attacks succeed without the sandbox (so their 0.0 above is the sandbox's doing)
# ---------------------------------------------------------------------------------------------


def _host_run(code: str) -> str:
    prog = code + "\nprint(f(5))\n"
    return subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=60).stdout.strip()


def _code(rows, name):
    comp = next(r for r in rows if r["name"] == name)["completion"]
    return comp.removeprefix("```python\n").removesuffix("```")


@pytest.mark.skipif(os.geteuid() != 0, reason="the private-file oracle reads a root-only file")
def test_oracle_attacks_work_unsandboxed(tmp_path):
    os.chmod(tmp_path, 0o700)
    (tmp_path / "secret.txt").write_text("private")
    us = socket.socket(socket.AF_UNIX)
    us.bind(str(tmp_path / "sock"))
    us.listen(8)
    ts = socket.socket()
    ts.bind(("127.0.0.1", 0))
    ts.listen(8)
    rows = corpus.cases(str(tmp_path / "sock"), ts.getsockname()[1], str(tmp_path))
    try:
        for name in (
            "host process list / trainer cmdline",
            "host Unix socket (hook off)",
            "host TCP 127.0.0.1 (hook off)",
            "private files (host dir, /etc/shadow, /root)",
            "import the project's reward module",
        ):
            assert _host_run(_code(rows, name)) == "10", name
    finally:
        us.close()
        ts.close()


def test_cross_candidate_oracle_works_unsandboxed():
    rows = corpus.cases("/nonexistent", 1, "/nonexistent")
    writer = subprocess.Popen([sys.executable, "-c", _code(rows, "cross-candidate write (/tmp, /dev/shm)")])
    try:
        assert _host_run(_code(rows, "cross-candidate read (/tmp, /dev/shm)")) == "10"
    finally:
        writer.wait(timeout=30)
        for d in ("/tmp", "/dev/shm"):
            Path(d, f"{corpus.MARK}-cross").unlink(missing_ok=True)


def test_read_tests_oracle_finds_tests_on_disk(tmp_path):
    # the old sandbox left code + tests in a file under /tmp; the attack finds such a file
    d = Path(tempfile.mkdtemp(prefix=f"{corpus.MARK}-tests-", dir="/tmp"))
    try:
        (d / "program.py").write_text("def f(x):\n    return 0\n" + corpus.TESTS)
        code = _code(ROWS, "read the tests from disk / /proc").replace(
            "('/tmp', '/dev/shm', '/var/tmp', os.getcwd())", f"({str(d)!r},)"
        )
        assert _host_run(code) == "10"
    finally:
        shutil.rmtree(d)


# ---------------------------------------------------------------------------------------------
# the same corpus as an ordinary user
# ---------------------------------------------------------------------------------------------


def _untraversable_ancestor(path: str) -> Path | None:
    """The topmost ancestor directory of ``path`` that other users cannot enter, or None."""
    parts = Path(path).resolve().parts
    for i in range(2, len(parts) + 1):
        d = Path(*parts[:i])
        if not d.stat().st_mode & 0o001:
            return d
    return None


@pytest.fixture
def throwaway_user():
    if os.geteuid() != 0:
        pytest.skip("creating a throwaway user needs root (run the suite as root to test the non-root path)")
    for tool in ("useradd", "userdel", "runuser", "unshare"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    name = "tlsbx" + uuid.uuid4().hex[:8]
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], check=False)


def test_corpus_as_ordinary_user(throwaway_user, tmp_path):
    # The user must be able to run this environment's interpreter. When it lives in a directory
    # others cannot enter (e.g. /root/.pyenv), a private mount namespace of this test only covers
    # that directory with an empty tmpfs and binds back just the interpreter and the repository,
    # as a normal per-user install would look; the host's mounts are untouched.
    need = sorted({os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, str(REPO))})
    script = ["set -e", "mount --make-rprivate /"]
    hidden = {}
    for i, p in enumerate(need):
        a = _untraversable_ancestor(p)
        if a is not None:
            hidden.setdefault(str(a), []).append((p, str(tmp_path / f"stage{i}")))
    for a, items in hidden.items():
        for p, stage in items:
            script += [f"mkdir -p '{stage}'", f"mount --bind '{p}' '{stage}'"]
        script.append(f"mount -t tmpfs -o mode=0755 tmpfs '{a}'")
        for p, stage in items:
            script += [f"mkdir -p '{p}'", f"mount --bind '{stage}' '{p}'"]
    os.chmod(tmp_path, 0o755)
    run = [
        "runuser",
        "-u",
        throwaway_user,
        "--",
        "env",
        "-i",
        "PATH=/usr/bin:/bin",
        "HOME=/nonexistent",
        "PYTHONDONTWRITEBYTECODE=1",
        "OMP_NUM_THREADS=1",
        sys.executable,
        str(Path(__file__).with_name("corpus.py")),
        "--json",
    ]
    script.append(" ".join(f"'{a}'" for a in run))
    r = subprocess.run(["unshare", "-m", "sh", "-c", "\n".join(script)], capture_output=True, text=True, timeout=300)
    assert r.stdout.strip(), r.stderr[-2000:]
    rep = json.loads(r.stdout.strip().splitlines()[-1])
    assert rep["uid"] != 0
    levels = {row["level"] for row in rep["rows"]}
    assert len(levels) == 1
    skip = BWRAP_ONLY if levels != {"bwrap"} else set()
    wrong = [
        (row["class"], row["reward"], row["status"])
        for row in rep["rows"]
        if row["reward"] != row["expected"] and row["class"] not in skip
    ]
    assert wrong == []
    assert rep["left"] == []
    assert corpus.leftovers() == []
