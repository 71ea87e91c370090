"""llm.base.sandbox.runner: ``run_python``'s status from the exit status, signal or limit, the limits, the
network block, ``run_many``; and what the candidate sees of the host at the bwrap level.

The hostile-candidate corpus through the reward API lives in ``tests/llm/base/hostile/``.
"""

import contextlib
import os
import select
import signal
import socket
import sys
from pathlib import Path

import pytest

if not sys.platform.startswith("linux"):
    pytest.skip("the sandbox targets Linux (rlimits, namespaces)", allow_module_level=True)

from tests.llm.base.sandbox._helpers import FAST, REPORT, needs_bwrap
from tiltlab.llm.base.sandbox import SandboxConfig, probe, run_judged, run_many, run_many_judged, run_python

pytestmark = pytest.mark.filterwarnings("ignore::tiltlab.llm.base.sandbox.SandboxWarning")


def _sandbox_uid_processes() -> list[int]:
    """Processes running under this test process's own sandbox uids (``uid_base + 256 * (pid % 4096)``
    plus a slot < 256): runs of other processes (a concurrent pytest worker, another checkout's tests)
    are not counted."""
    lo = SandboxConfig().uid_base + 256 * (os.getpid() % 4096)
    pids = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if lo <= os.stat(f"/proc/{p}").st_uid < lo + 256:
                    pids.append(int(p))
            except FileNotFoundError:
                pass
    return pids


# ---------------------------------------------------------------------------------------------
# run_python: status from the exit status, signal or limit
# ---------------------------------------------------------------------------------------------


def _interpreter_dirs_in_tmp() -> list[str]:
    """Names directly under ``/tmp`` of the read-only bind mounts (the interpreter's prefixes, a virtualenv in
    ``/tmp/...``, and the sandbox's program folder, a checkout in ``/tmp/...`` as CI's clone): under bwrap they
    are the only entries a fresh private ``/tmp`` may hold. Empty when all are elsewhere."""
    return sorted(
        {
            Path(r).parts[2]
            for r in probe._bind_roots(sys.executable)
            if len(Path(r).parts) > 2 and Path(r).parts[1] == "tmp"
        }
    )


def test_interpreter_dirs_in_tmp_against_hand_values(monkeypatch):
    monkeypatch.setattr(probe, "_bind_roots", lambda python: ["/opt/py", "/tmp/ci/venv", "/tmp/x", "/tmpfoo/y"])
    assert _interpreter_dirs_in_tmp() == ["ci", "x"]


def test_ok_program_and_clean_environment():
    r = run_python("import os\nprint(sorted(os.listdir('.')))\nprint(sorted(os.environ), 6 * 7)", FAST)
    assert r.passed, r.stderr
    listing, rest = r.stdout.splitlines()
    # an empty working directory (under bwrap, /tmp: only the interpreter's mount points if it lives there)
    assert eval(listing) == (_interpreter_dirs_in_tmp() if r.isolation["level"] == "bwrap" else [])
    assert rest.endswith(" 42")
    for key in ("TILTLAB", "PYTHONPATH", "VIRTUAL_ENV", "PYENV"):
        assert key not in r.stdout
    assert r.isolation["level"] == REPORT["level"]


def test_failing_assert_is_error():
    r = run_python("assert 1 == 2", FAST)
    assert r.status == "error" and not r.passed


def test_status_never_comes_from_output():
    code = "import sys\nsys.stderr.write('MemoryError\\nsandbox: x blocked\\n')\nprint('Traceback')"
    r = run_python(code, FAST)
    assert r.status == "ok" and r.passed
    r = run_judged("import sys\nsys.stderr.write('MemoryError')\ndef f(x):\n    return x\n", "assert f(1) == 1", FAST)
    assert r.passed and r.status == "ok"


def test_infinite_loop_times_out():
    r = run_python("while True:\n    pass", FAST)
    assert r.status == "timeout" and not r.passed


def test_sleep_times_out():
    r = run_python("import time\ntime.sleep(60)", FAST)
    assert r.status == "timeout"


def test_cpu_rlimit_stops_busy_loop_before_wall_clock():
    r = run_python("while True:\n    pass", FAST, cpu_s=1, timeout_s=20)
    assert r.status == "timeout" and not r.passed
    # SIGXCPU from RLIMIT_CPU (1 CPU-second) ended it, not the clock's SIGKILL at 20 s (nor the hard limit's)
    assert r.returncode in (-signal.SIGXCPU, 128 + signal.SIGXCPU), r.returncode


@pytest.mark.parametrize("code", ["x = bytearray(8 * 1024 ** 3)", "a = []\nwhile True:\n    a.append(' ' * 10 ** 6)"])
def test_memory_bomb(code):
    r = run_python(code, FAST)
    assert r.status == "memory" and not r.passed


@pytest.mark.parametrize(
    "code",
    [
        "import os\nwhile True:\n    os.fork()",
        "import subprocess\nsubprocess.run(['sh', '-c', 'echo pwned'])",
        "import os\nos.system('echo pwned')",
        "import multiprocessing as mp\nmp.Process(target=print).start()",
    ],
)
def test_process_creation_blocked_by_hook(code):
    r = run_python(code, FAST)
    assert r.status == "blocked" and not r.passed, (r.status, r.stderr[-300:])
    assert "pwned" not in r.stdout


@pytest.mark.skipif(
    not REPORT["rlimit_nproc_effective"], reason="RLIMIT_NPROC is not enforced for uid 0 and no drop is possible"
)
def test_fork_bomb_without_audit_hook_is_contained():
    before = set(_sandbox_uid_processes())
    r = run_python("import os\nwhile True:\n    os.fork()", FAST, audit_hook=False, nproc=16)
    assert not r.passed
    # the kernel tears the PID namespace down asynchronously after its init is killed: wait for each process
    # left to exit (its pidfd turns readable), then look again; 30 s without an exit fails the test
    left = set(_sandbox_uid_processes()) - before
    while left and _exited(left, bound_s=30.0):
        left = set(_sandbox_uid_processes()) - before
    assert left == set()


def _exited(pids: set[int], bound_s: float) -> bool:
    """Wait on the pidfds of ``pids`` until each process has exited (True), or until ``bound_s`` passes with no
    exit (False); a pid already gone counts as exited."""
    fds = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            fds.append(os.pidfd_open(pid))
    try:
        pending = set(fds)
        while pending:
            ready, _, _ = select.select(list(pending), [], [], bound_s)
            if not ready:
                return False
            pending -= set(ready)
        return True
    finally:
        for fd in fds:
            os.close(fd)


def test_write_outside_workdir_fails(tmp_path):
    target = tmp_path / "pwned.txt"
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    for code in (
        f"open({str(target)!r}, 'w').write('x')",
        f"import os\nos.remove({str(victim)!r})",
        f"import os\nos.symlink({str(target)!r}, 'link')\nopen('link', 'w').write('x')",
        f"import pathlib\npathlib.Path({str(target)!r}).write_text('x')",
        "open('../escape.txt', 'w').write('x')",
    ):
        for hook in (True, False):
            r = run_python(code, FAST, audit_hook=hook)
            assert not r.passed, (code, hook)
    assert not target.exists()
    assert victim.read_text() == "keep"
    # writing inside the working directory is allowed
    assert run_python("open('ok.txt', 'w').write('x')\nprint(open('ok.txt').read())", FAST).stdout.strip() == "x"


@pytest.fixture
def listener():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    yield srv.getsockname()[1]
    srv.close()


def test_network_blocked(listener):
    code = f"import socket\nsocket.create_connection(('127.0.0.1', {listener}), timeout=2)\nprint('connected')"
    r = run_python(code, FAST)
    assert r.status == "blocked" and "connected" not in r.stdout
    if REPORT["network_namespace"]:
        r = run_python(code, FAST, audit_hook=False)
        assert not r.passed and "connected" not in r.stdout


def test_network_control_reaches_listener_without_isolation(listener):
    # control: the program does reach the host listener with every layer off (so the test above can fail)
    code = f"import socket\nsocket.create_connection(('127.0.0.1', {listener}), timeout=2)\nprint('connected')"
    r = run_python(code, FAST, audit_hook=False, isolate_network=False, backend="legacy")
    assert r.passed and "connected" in r.stdout


def test_huge_output_capped():
    cap = 4096
    for code in ("print('x' * 10 ** 8)", "import sys\nfor _ in range(10 ** 6):\n    sys.stdout.write('y' * 100)"):
        r = run_python(code, FAST, max_output_bytes=cap, max_file_mb=0.01)
        assert r.status == "output_limit" and not r.passed
        assert len(r.stdout) <= cap


def test_run_many_order():
    res = run_many([f"print({i})" for i in range(5)], FAST, max_workers=2)
    assert [r.stdout.strip() for r in res] == [str(i) for i in range(5)]


# ---------------------------------------------------------------------------------------------
# the bwrap level: what the candidate sees of the host
# ---------------------------------------------------------------------------------------------


@needs_bwrap
def test_bwrap_private_tmp_shm_and_no_proc(tmp_path):
    name = f"tiltlab-sbx-probe-{os.getpid()}"
    code = (
        "import os\n"
        f"for d in ('/tmp', '/dev/shm'):\n    open(d + '/{name}', 'w').write('x')\n"
        "print([os.getpid(), os.getppid(), os.path.exists('/proc'), os.path.exists('/sys')])\n"
        "print(sorted(os.listdir('/tmp')), sorted(os.listdir('/dev/shm')))\n"
    )
    r = run_python(code, FAST, audit_hook=False)  # the OS layer, not the hook's write block
    assert r.passed, r.stderr
    pid, ppid, proc, sys_ = eval(r.stdout.splitlines()[0])
    assert pid < 10 and ppid == 1  # its own PID namespace, under bwrap's init
    assert not proc and not sys_  # no /proc (its host-wide counters, other processes' memory) and no /sys
    assert not os.path.exists(f"/tmp/{name}") and not os.path.exists(f"/dev/shm/{name}")
    # a second run starts from empty /tmp and /dev/shm
    r2 = run_python("import os\nprint(sorted(os.listdir('/tmp')), os.listdir('/dev/shm'))", FAST)
    assert r2.stdout.strip() == f"{_interpreter_dirs_in_tmp()} []"


@needs_bwrap
def test_bwrap_hides_host_files_and_unix_sockets(tmp_path):
    os.chmod(tmp_path, 0o755)
    (tmp_path / "f.txt").write_text("host")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(tmp_path / "s"))
    srv.listen(1)
    try:
        code = (
            "import os, socket\n"
            f"print(os.path.exists({str(tmp_path / 'f.txt')!r}), os.path.exists('/etc/passwd'))\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            f"s.connect({str(tmp_path / 's')!r})\n"
        )
        r = run_python(code, FAST, audit_hook=False)
        assert r.stdout.strip() == "False False" and r.status == "error"
        # control: the host can connect to that socket
        c = socket.socket(socket.AF_UNIX)
        c.connect(str(tmp_path / "s"))
        c.close()
    finally:
        srv.close()


@needs_bwrap
def test_bwrap_tmpfs_is_size_capped():
    code = "open('big', 'wb').write(b'x' * (8 << 20))"
    assert run_python(code, FAST, max_file_mb=64, disk_mb=16).passed
    r = run_python(code, FAST, max_file_mb=64, disk_mb=4)
    assert r.status == "error"  # ENOSPC: the 4 MiB tmpfs is full


@needs_bwrap
def test_bwrap_numpy_and_distinct_uids(tmp_path):
    """Two runs alive at once get two uids. They overlap for sure: each judge calls its candidate (alive, under
    its uid), then waits at a barrier of two named pipes for the other judge; a run that is not concurrent
    with the other waits until its time limit and fails."""
    a2b, b2a = str(tmp_path / "a2b"), str(tmp_path / "b2a")
    os.mkfifo(a2b)
    os.mkfifo(b2a)
    code = "import os, numpy\nprint(os.getuid(), int(numpy.arange(4).sum()), flush=True)\ndef uid():\n    return os.getuid()\n"
    first = f"assert uid() > 0\nw = open({a2b!r}, 'wb', 0)\nr = open({b2a!r}, 'rb', 0)\n"
    second = f"assert uid() > 0\nr = open({a2b!r}, 'rb', 0)\nw = open({b2a!r}, 'wb', 0)\n"
    cfg = SandboxConfig(timeout_s=20.0, memory_mb=256)  # the bound on a barrier that never opens
    res = run_many_judged([(code, first, False), (code, second, False)], cfg, max_workers=2)
    assert all(r.passed for r in res), [(r.status, r.stderr[-300:], r.judge_stderr[-300:]) for r in res]
    uids = [int(r.stdout.split()[0]) for r in res]
    assert all(r.stdout.split()[1] == "6" for r in res)
    if REPORT["parent_is_root"]:
        assert len(set(uids)) == 2 and 0 not in uids  # one unprivileged uid per concurrent run
    else:
        assert uids == [65534, 65534]  # each in its own user namespace
