"""llm.base.sandbox: status from the exit status, OS isolation (bwrap level and the fallback), the judge's channel.

The hostile-candidate corpus through the reward API lives in ``tests/llm/base/hostile/``.
"""

import contextlib
import os
import select
import signal
import socket
import sys
import warnings
from pathlib import Path

import pytest

if not sys.platform.startswith("linux"):
    pytest.skip("the sandbox targets Linux (rlimits, namespaces)", allow_module_level=True)

from tiltlab.llm.base import sandbox
from tiltlab.llm.base.sandbox import (
    SandboxConfig,
    SandboxWarning,
    clock,
    config,
    isolation_report,
    probe,
    programs,
    run_judged,
    run_many,
    run_many_judged,
    run_python,
    runner,
    seccomp,
    slots,
)

with warnings.catch_warnings():  # the isolation facts are asserted below, not warned about
    warnings.simplefilter("ignore", SandboxWarning)
    REPORT = isolation_report()
pytestmark = pytest.mark.filterwarnings("ignore::tiltlab.llm.base.sandbox.SandboxWarning")
FAST = SandboxConfig(timeout_s=2.0, memory_mb=256)
BWRAP = REPORT["level"] == "bwrap"
needs_bwrap = pytest.mark.skipif(
    not BWRAP, reason="bubblewrap is missing or does not work here (apt-get install -y bubblewrap)"
)


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


def test_config_validation():
    with pytest.raises(ValueError, match="timeout_s"):
        SandboxConfig(timeout_s=0)
    with pytest.raises(ValueError, match="memory_mb"):
        SandboxConfig(memory_mb=1)
    with pytest.raises(ValueError, match="memory_mb must be >= 64"):
        SandboxConfig(memory_mb=63)
    assert SandboxConfig(memory_mb=64).memory_mb == 64  # the floor itself is allowed
    with pytest.raises(ValueError, match="backend"):
        SandboxConfig(backend="docker")
    with pytest.raises(ValueError, match="disk_mb"):
        SandboxConfig(disk_mb=0)
    with pytest.raises(ValueError, match="uid_base"):
        SandboxConfig(uid_base=0)
    with pytest.raises(ValueError, match="code must be a str"):
        run_python(b"print(1)")
    with pytest.raises(ValueError, match="code and tests"):
        run_judged("x = 1", None)


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


# ---------------------------------------------------------------------------------------------
# run_judged: the judge's channel and the wire format
# ---------------------------------------------------------------------------------------------


def test_judged_pass_and_fail():
    assert run_judged("def f(x):\n    return 2 * x\n", "assert f(2) == 4", FAST).passed
    r = run_judged("def f(x):\n    return 0\n", "assert f(2) == 4", FAST)
    assert not r.passed and r.status == "failed" and "AssertionError" in r.judge_stderr


@pytest.mark.parametrize(
    "ret,test,ok",
    [
        ("[1, 2]", "assert f() == [1, 2]", True),
        ("[1, 2]", "assert f() == (1, 2)", False),  # list != tuple, as in Python
        ("(1, 'a', None, 2.5, b'x', 1j)", "assert f() == (1, 'a', None, 2.5, b'x', 1j)", True),
        ("{(1, 2): {3}, 'k': frozenset([4])}", "assert f() == {(1, 2): {3}, 'k': frozenset([4])}", True),
        ("True", "assert f() is True", True),
        ("type('I', (int,), {'__eq__': lambda s, o: True})(0)", "assert f() == 4", False),
        ("type('S', (str,), {})('4')", "assert f() == '4' and type(f()) is str", True),  # a subclass: its base value
        ("type('A', (), {'__eq__': lambda s, o: True})()", "assert f() == 4", False),
        # residual, by design: comparisons are Python's own between plain values (1 == 1.0 == True),
        # and the truth value of a non-plain result is its bool() computed in the sandbox, as in one
        # process; neither gives more than `return 1` / `return True` would
        ("1.0", "assert f() == 1", True),
        ("type('L', (), {'__len__': lambda s: 1})()", "assert f()", True),
        ("type('L', (), {'__len__': lambda s: 0})()", "assert f()", False),
        ("object()", "assert f()", True),
    ],
)
def test_judged_values_cross_as_exact_builtins(ret, test, ok):
    assert run_judged(f"def f():\n    return {ret}\n", test, FAST).passed is ok


# a subclass of each type that crosses by value, holding a value EQUAL to the plain one: it crosses as that
# base value, an exact instance of the base type (none of the subclass's methods cross); the last column is
# a test of its content. (Each liar of tests/llm/base/sandbox/test_trust.py holds a DIFFERENT value and earns 0.)
_SUB = "import collections, decimal, fractions\n"
_EXACT_TYPE_CASES = [
    ("type('L', (list,), {})([1, 2])", "[1, 2]", "assert list(f()) == [1, 2]"),
    ("type('T', (tuple,), {})((1, 2))", "(1, 2)", "assert tuple(f()) == (1, 2)"),
    ("type('D', (dict,), {})({'a': 1})", "{'a': 1}", "assert f()['a'] == 1"),
    ("type('S', (set,), {})({1, 2})", "{1, 2}", "assert sorted(f()) == [1, 2]"),
    ("type('FS', (frozenset,), {})({1, 2})", "frozenset({1, 2})", "assert len(f()) == 2"),
    ("type('I', (int,), {})(3)", "3", "assert f() is not None"),
    ("type('S', (str,), {})('ab')", "'ab'", "assert len(f()) == 2"),
    ("type('F', (float,), {})(1.5)", "1.5", "assert f() is not None"),
    ("type('B', (bytes,), {})(b'ab')", "b'ab'", "assert list(f()) == [97, 98]"),
    ("type('BA', (bytearray,), {})(b'ab')", "bytearray(b'ab')", "assert len(f()) == 2"),
    ("type('C', (complex,), {})(1j)", "1j", "assert f() is not None"),
    ("type('Q', (collections.Counter,), {})('aab')", "collections.Counter('aab')", "assert f()['a'] == 2"),
    (
        "type('O', (collections.OrderedDict,), {})([('a', 1)])",
        "collections.OrderedDict([('a', 1)])",
        "assert list(f()) == ['a']",
    ),
    (
        "type('DD', (collections.defaultdict,), {})(list, {'a': [1]})",
        "collections.defaultdict(list, {'a': [1]})",
        "assert f()['a'] == [1]",
    ),
    ("type('DQ', (collections.deque,), {})([1, 2])", "collections.deque([1, 2])", "assert list(f()) == [1, 2]"),
    ("type('FR', (fractions.Fraction,), {})(1, 3)", "fractions.Fraction(1, 3)", "assert f() is not None"),
    ("type('DE', (decimal.Decimal,), {})('1.5')", "decimal.Decimal('1.5')", "assert f() is not None"),
    # a namedtuple's subclass (bases (P,), not (tuple,)) is no namedtuple on the wire
    (
        "type('Q2', (collections.namedtuple('P', 'x y'),), {})(1, 2)",
        "(1, 2)",  # a namedtuple equals its plain tuple; two namedtuple() calls give two types
        "assert tuple(f()) == (1, 2)",
    ),
    # nested: the plain list crosses, the subclass inside it stays a handle
    ("[type('L', (list,), {})([1])]", "[[1]]", "assert len(f()) == 1 and list(f()[0]) == [1]", "[0]"),
]


@pytest.mark.parametrize("case", _EXACT_TYPE_CASES, ids=[c[0].split("'")[1] for c in _EXACT_TYPE_CASES])
def test_judged_subclass_crosses_as_its_base_value(case):
    ret, plain, usable, at = (*case, "")[:4]  # at: where the subclass sits in the value ("" = the value)
    code = f"{_SUB}def f():\n    return {ret}\n"
    tests = "import collections, decimal, fractions\n"
    # the plain builtin of that value crosses, compares equal and keeps its type; the subclass does neither
    same_type = f"assert type(f(){at}) is type(({plain}){at})"
    plain_code = f"{_SUB}def f():\n    return {plain}\n"
    assert run_judged(plain_code, tests + f"assert f() == {plain}\n" + same_type, FAST).passed
    r = run_judged(code, tests + f"assert f() == {plain}\n" + same_type, FAST)
    assert r.passed, r.judge_stderr[-500:]
    assert not run_judged(code, tests + f"assert type(f(){at}) is not type(({plain}){at})", FAST).passed
    r = run_judged(code, tests + usable, FAST)
    assert r.passed, r.judge_stderr


@pytest.mark.parametrize(
    "ret,test,ok",
    [
        ("True", "assert f() is True and type(f()) is bool", True),
        ("1", "assert f() is True", False),  # 1 == True, but 1 is not True: an int stays an int
        ("1", "assert type(f()) is int and f() == True", True),
        ("False", "assert type(f()) is bool and f() is False", True),
        ("0", "assert type(f()) is bool", False),
        ("True", "assert type(f()) is int", False),
        ("1.0", "assert type(f()) is float and f() == 1", True),
        ("1", "assert type(f()) is float", False),
        ("(1,)", "assert type(f()) is tuple and f() != [1]", True),
        ("{1: 2}", "assert type(f()) is dict", True),
        ("frozenset({1})", "assert type(f()) is frozenset and f() == {1}", True),
    ],
)
def test_judged_bool_int_float_and_containers_keep_their_exact_type(ret, test, ok):
    assert run_judged(f"def f():\n    return {ret}\n", test, FAST).passed is ok


def test_judged_handles_classes_generators_and_modules():
    code = (
        "import math\n"
        "class Acc:\n    def __init__(self):\n        self.n = 0\n"
        "    def add(self, k):\n        self.n += k\n        return self\n"
        "def gen(k):\n    yield from range(k)\n"
        "def area(r):\n    return math.pi * r * r\n"
        "def bad():\n    raise ValueError('no')\n"
    )
    tests = (
        "a = Acc()\na.add(2).add(3)\nassert a.n == 5\n"
        "assert list(gen(3)) == [0, 1, 2]\n"
        "assert math.isclose(area(1), 3.14159, rel_tol=1e-4)\n"  # the candidate's stdlib import is usable
        "try:\n    bad()\n    raise AssertionError('no raise')\nexcept ValueError:\n    pass\n"
    )
    r = run_judged(code, tests, FAST)
    assert r.passed, r.judge_stderr


def test_judged_candidate_cannot_shadow_builtins_or_forge_system_exit():
    code = "def abs(x):\n    return 0\ndef f(x):\n    raise SystemExit(0)\n"
    assert not run_judged(code, "assert abs(-3) == 0", FAST).passed  # builtins' abs, not the candidate's
    assert run_judged("import math as len\ndef f():\n    return [1]\n", "assert len(f()) == 1", FAST).passed
    assert not run_judged(code, "f(1)", FAST).passed
    # a broken exchange fails the run even when the tests swallow the error
    assert not run_judged(
        "import os\ndef f():\n    os._exit(0)\n", "try:\n    f()\nexcept BaseException:\n    pass", FAST
    ).passed


@pytest.mark.parametrize(
    "code,tests,ok",
    [
        # a correct answer to "pow(x, y): x times y" (HumanEval style): check(pow) must get the candidate's pow
        (
            "def pow(x, y):\n    return x * y\n",
            "def check(candidate):\n    assert candidate(2, 3) == 6\ncheck(pow)\n",
            True,
        ),
        # a wrong answer is not saved by the builtin of the same name
        ("def pow(x, y):\n    return 0\n", "assert pow(2, 3) == 8\n", False),
        # nor is a candidate that never defines the entry point
        ("def other():\n    pass\n", "assert pow(2, 3) == 8\n", False),
        ("def pow(x, y):\n    return x ** y\n", "assert pow(2, 3) == 8 and abs(-1) == 1\n", True),
    ],
)
def test_judged_entry_point_named_like_a_builtin_is_the_candidates(code, tests, ok):
    r = run_judged(code, tests, FAST, entry_point="pow")
    assert r.passed is ok, r.judge_stderr[-500:]


def test_judged_other_builtin_names_stay_the_judges():
    # only the named entry point is the candidate's: its other functions named like builtins are not reached
    code = "def pow(x, y):\n    return x ** y\ndef abs(x):\n    return 7\n"
    assert run_judged(code, "assert pow(2, 3) == 8 and abs(-1) == 1\n", FAST, entry_point="pow").passed
    with pytest.raises(ValueError, match="entry_point"):
        run_judged("", "", FAST, entry_point="__import__")


@pytest.mark.parametrize(
    "code,tests",
    [
        # an enum member: the same member compares equal on every call, another member does not
        (
            "import enum\nclass Color(enum.Enum):\n    RED = 1\n    GREEN = 2\ndef f():\n    return Color.GREEN\n",
            "assert f() == Color.GREEN and f() != Color.RED and f() in {Color.GREEN} and f().name == 'GREEN'",
        ),
        # str() and f-strings of a returned object, as the candidate's __str__ gives them
        (
            "class P:\n    def __str__(self):\n        return 'p!'\ndef f():\n    return P()\n",
            "assert f'{f()}' == str(f()) == 'p!'",
        ),
        # `in` over a returned object's items, compared by the judge
        (
            "class Bag:\n    def __iter__(self):\n        return iter([1, 3])\ndef f():\n    return Bag()\n",
            "assert 3 in f() and 4 not in f() and [3] not in f()",
        ),
        # repr() of a returned object is the candidate's __repr__; a truth value without __len__
        (
            "class P:\n    def __repr__(self):\n        return 'P(1)'\ndef f():\n    return P()\n",
            "assert repr(f()) == 'P(1)'",
        ),
        ("class E:\n    def __bool__(self):\n        return False\ndef f():\n    return E()\n", "assert not f()"),
    ],
)
def test_judged_protocols_of_returned_objects(code, tests):
    r = run_judged(code, tests, FAST)
    assert r.passed, r.judge_stderr[-500:]


def test_in_never_asks_the_candidates_contains():
    # `in` is the judge's own search over the object's items: a __contains__ that says yes to what the tests
    # hold is never asked, and an object that is not iterable is refused (a TypeError, as Python's fallback)
    liar = "class Bag:\n    def __contains__(self, x):\n        return True\n    def __iter__(self):\n        return iter([1])\n"
    r = run_judged(liar + "def f():\n    return Bag()\n", "assert 3 in f()", FAST)
    assert not r.passed and "AssertionError" in r.judge_stderr, r.judge_stderr[-500:]
    bag = "class Bag:\n    def __contains__(self, x):\n        return x == 3\ndef f():\n    return Bag()\n"
    r = run_judged(bag, "assert 3 in f()", FAST)
    assert not r.passed and "TypeError" in r.judge_stderr, r.judge_stderr[-500:]


# generators, as the datasets use them: a returned generator is consumed lazily, one item per exchange
_FIB = "def fib():\n    a, b = 0, 1\n    while True:\n        yield a\n        a, b = b, a + b\n"
_FIB_WRONG = "def fib():\n    a, b = 1, 1\n    while True:\n        yield a\n        a, b = b, a + b\n"


@pytest.mark.parametrize(
    "tests",
    [
        # an infinite generator consumed by the tests' islice: never listed whole
        "from itertools import islice\nassert list(islice(fib(), 6)) == [0, 1, 1, 2, 3, 5]\n",
        # next() on a returned generator, and a generator that keeps its state between next() calls
        "assert next(fib()) == 0\ng = fib()\nnext(g)\nnext(g)\nassert next(g) == 1 and next(g) == 2\n",
        # a for loop that breaks out of an infinite generator
        "out = []\nfor x in fib():\n    if x > 10:\n        break\n    out.append(x)\nassert out == [0, 1, 1, 2, 3, 5, 8]\n",
        # zip with a finite range stops the infinite generator
        "assert [x for _, x in zip(range(4), fib())] == [0, 1, 1, 2]\n",
    ],
)
def test_judged_returned_generator_is_consumed_lazily(tests):
    r = run_judged(_FIB, tests, FAST)
    assert r.passed, r.judge_stderr[-500:]
    assert not run_judged(_FIB_WRONG, tests, FAST).passed  # the wrong-answer twin earns nothing


def test_judged_finite_generator_ends_with_stop_iteration_and_errors_cross():
    code = "def gen(n):\n    yield from range(n)\n    if n == 9:\n        raise ValueError('nine')\n"
    tests = (
        "g = gen(1)\nassert next(g) == 0\ntry:\n    next(g)\n    raise AssertionError('no stop')\n"
        "except StopIteration:\n    pass\n"
        "assert next(gen(0), 'empty') == 'empty' and list(gen(3)) == [0, 1, 2] and sum(gen(4)) == 6\n"
        "try:\n    list(gen(9))\n    raise AssertionError('no raise')\nexcept ValueError:\n    pass\n"
    )
    r = run_judged(code, tests, FAST)
    assert r.passed, r.judge_stderr[-500:]


def test_judged_tests_that_list_an_infinite_generator_fail_within_the_time_limit():
    r = run_judged(_FIB, "assert list(fib())[:3] == [0, 1, 1]\n", SandboxConfig(timeout_s=1.0, memory_mb=256))
    assert not r.passed


@pytest.mark.parametrize(
    "code,ok",
    [
        ("def total(it):\n    return sum(it)\n", True),
        ("def total(it):\n    return sum(x for x in it if x % 2)\n", False),
        # the candidate may call next() on what it gets: it is an iterator, as the tests' generator was
        ("def total(it):\n    first = next(it)\n    return first + sum(it)\n", True),
    ],
)
def test_judged_generator_arguments_arrive_as_iterators(code, ok):
    tests = "assert total(x for x in range(5)) == 10\nassert total(map(int, '1234')) == 10\nassert total(iter([4, 6])) == 10\n"
    r = run_judged(code, tests, FAST)
    assert r.passed is ok, r.judge_stderr[-500:]


_NODE = "class Node:\n    def __init__(self, val, next=None):\n        self.val = val\n        self.next = next\n"


def test_judged_instances_of_a_class_both_sides_define_cross_by_value_with_sharing_and_cycles():
    code = _NODE + (
        "def cycle(n):\n    head = Node(0)\n    p = head\n    for i in range(1, n):\n        p.next = Node(i)\n"
        "        p = p.next\n    p.next = head\n    return head\n"
        "def has_cycle(head):\n    seen = set()\n    while head is not None:\n        if id(head) in seen:\n"
        "            return True\n        seen.add(id(head))\n        head = head.next\n    return False\n"
        "def same(a, b):\n    return a is b\n"
    )
    tests = _NODE + (
        "c = cycle(3)\nassert type(c) is Node and c.val == 0 and c.next.next.next is c\n"  # the judge's own Node
        "n = Node(1)\nn.next = n\nassert has_cycle(n) and not has_cycle(Node(1, Node(2)))\n"
        "t = Node(9)\nassert same(t, t) and not same(t, Node(9)) and same(a=t, b=t)\n"  # shared across arguments
    )
    r = run_judged(code, tests, FAST)
    assert r.passed, r.judge_stderr[-500:]


def test_judged_by_value_objects_are_rebuilt_from_the_judges_class_never_the_candidates():
    # the candidate's own Node says it equals anything; the judge rebuilds a Node of its own class
    code = (
        "class Node:\n    def __init__(self, val, next=None):\n        self.val = val\n        self.next = next\n"
        "    def __eq__(self, o):\n        return True\n    def __bool__(self):\n        return True\n"
        "def f():\n    return Node(5)\n"
    )
    tests = _NODE + "r = f()\nassert type(r) is Node and r.val == 5 and '__eq__' not in vars(r)\n"
    assert run_judged(code, tests, FAST).passed
    assert not run_judged(code, _NODE + "assert f() == Node(6)\n", FAST).passed
    # a class the judge does not define stays a handle, as before
    assert run_judged(code, "r = f()\nassert r.val == 5 and r == r\n", FAST).passed


_INT_ENUM = "import enum\nclass P(enum.IntEnum):\n    LOW = 1\n    HIGH = 2\n"
_VEC = "class V:\n    def __init__(self, x):\n        self.x = x\n    def __add__(self, o):\n        return V(self.x + (o.x if isinstance(o, V) else o))\n    __radd__ = __add__\n"
_DC_STR = "from dataclasses import dataclass\n@dataclass\nclass Pt:\n    x: int\n    y: int\n"


@pytest.mark.parametrize(
    "code,tests,ok",
    [
        # an IntEnum result is an int of its class: == an int, arithmetic, order, .name, the same member again
        (
            _INT_ENUM + "def f():\n    return P.HIGH\n",
            "assert f() == 2 and f() + 1 == 3 and f() > P.LOW and f().name == 'HIGH' and f() is P.HIGH\n",
            True,
        ),
        (_INT_ENUM + "def f():\n    return P.LOW\n", "assert f() == 2\n", False),
        # an IntEnum whose __eq__ says True arrives with int's ==
        (
            _INT_ENUM.replace(
                "    HIGH = 2\n",
                "    HIGH = 2\n    def __eq__(self, o):\n        return True\n    __hash__ = int.__hash__\n",
            )
            + "def f():\n    return P.LOW\n",
            "assert f() == 2\n",
            False,
        ),
        # no operator of a returned object runs (its __add__ included): by design, a false negative
        (_VEC + "def f(x):\n    return V(x)\n", "assert (f(1) + f(2)).x == 3\n", False),
        (_VEC + "def f(x):\n    return V(x)\n", "assert sum([f(1), f(2)]).x == 3\n", False),
        # its methods, called by name, are the candidate's (the task's API)
        (_VEC + "def f(x):\n    return V(x)\n", "assert f(1).x == 1 and f(2).x == 2\n", True),
        # str() of a returned dataclass with its own __str__
        (
            _DC_STR + "    def __str__(self):\n        return f'({self.x}, {self.y})'\ndef f():\n    return Pt(1, 2)\n",
            "assert str(f()) == '(1, 2)' and f'{f()}' == '(1, 2)'\n",
            True,
        ),
        (
            _DC_STR + "    def __str__(self):\n        return f'({self.y}, {self.x})'\ndef f():\n    return Pt(1, 2)\n",
            "assert str(f()) == '(1, 2)'\n",
            False,
        ),
        # the truth value of a re.Match (and None for no match)
        (
            "import re\ndef f(s):\n    return re.match(r'a+', s)\n",
            "assert f('aab') and not f('b') and f('aab').group() == 'aa'\n",
            True,
        ),
        ("import re\ndef f(s):\n    return re.search(r'b', s)\n", "assert f('aab') and not f('b')\n", False),
    ],
)
def test_judged_dataset_idioms_on_returned_objects(code, tests, ok):
    r = run_judged(code, tests, FAST)
    assert r.passed is ok, r.judge_stderr[-500:]


_STR_ENUM = "import enum\nclass C(enum.StrEnum):\n    RED = 'red'\n    BLUE = 'blue'\n"
_INT_FLAG = "import enum\nclass P(enum.IntFlag):\n    R = 4\n    W = 2\n    X = 1\n"
_FLAG = "import enum\nclass Perm(enum.Flag):\n    R = 4\n    W = 2\n    X = 1\n"
_COLOR = "import enum\nclass Color(enum.Enum):\n    RED = 1\n    GREEN = 2\n"


@pytest.mark.parametrize(
    "code,tests,ok",
    [
        # a StrEnum result equals its str, keeps .name, and is the same member again (no class in the tests)
        (
            _STR_ENUM + "def f():\n    return C.RED\n",
            "assert f() == 'red' and f().name == 'RED' and f() is f()\n",
            True,
        ),
        (_STR_ENUM + "def f():\n    return C.BLUE\n", "assert f() == 'red'\n", False),
        # an IntFlag combination equals its int
        (_INT_FLAG + "def f():\n    return P.R | P.W\n", "assert f() == 6 and f() & 4\n", True),
        (_INT_FLAG + "def f():\n    return P.R\n", "assert f() == 6\n", False),
        # a Flag combination of a class the prompt defines on both sides: the tests' own member
        (
            _FLAG + "def f():\n    return Perm.R | Perm.W\n",
            _FLAG + "assert f() == Perm.R | Perm.W and type(f()) is Perm\n",
            True,
        ),
        (_FLAG + "def f():\n    return Perm.R\n", _FLAG + "assert f() == Perm.R | Perm.W\n", False),
        # an Enum member the tests pass arrives as the candidate's own member of that class
        (
            _COLOR + "def f(c):\n    return {Color.RED: 'stop', Color.GREEN: 'go'}[c]\n",
            _COLOR + "assert f(Color.GREEN) == 'go'\n",
            True,
        ),
        (
            _COLOR + "def f(c):\n    return {Color.RED: 'go', Color.GREEN: 'stop'}[c]\n",
            _COLOR + "assert f(Color.GREEN) == 'go'\n",
            False,
        ),
        (_COLOR + "def f():\n    return Color.GREEN\n", _COLOR + "assert f() is Color.GREEN\n", True),
        # an Enum the tests do not define stays a handle: its own methods, run in the sandbox
        (
            _COLOR + "    def go(self):\n        return self is Color.GREEN\ndef f():\n    return Color.GREEN\n",
            "assert f().go() and f() == Color.GREEN and f() != Color.RED\n",
            True,
        ),
    ],
)
def test_judged_enum_members_cross(code, tests, ok):
    r = run_judged(code, tests, FAST)
    assert r.passed is ok, r.judge_stderr[-500:]


def test_judged_generators_nested_in_arguments_arrive_as_iterators():
    code = "def f(xs):\n    return [sum(g) for g in xs]\n"
    assert run_judged(code, "assert f([(x for x in range(3)), iter([5, 6])]) == [3, 11]\n", FAST).passed
    assert run_judged("def f(t):\n    return sum(t[0])\n", "assert f(((x for x in range(4)),)) == 6\n", FAST).passed
    assert not run_judged(code, "assert f([(x for x in range(3))]) == [4]\n", FAST).passed


def test_judged_handles_of_different_objects_stay_unequal():
    # an object whose __eq__ says True is still not equal to a handle of another object, nor to a value
    code = "class T:\n    def __eq__(self, o):\n        return True\n    __hash__ = object.__hash__\ndef f():\n    return T()\n"
    assert not run_judged(code, "assert f() == f()", FAST).passed
    assert not run_judged(code, "assert f() == 1", FAST).passed
    assert run_judged(code, "x = f()\nassert x == x and x != f() and str(x).startswith('<')", FAST).passed


def test_judged_stdio():
    code = "import sys\nprint(sum(map(int, sys.stdin.read().split())))\n"
    tests = "assert __stdio__('1 2\\n3').split() == ['6']\nassert __stdio__('5').strip() == '5'\n"
    assert run_judged(code, tests, FAST, stdio=True).passed
    assert not run_judged("print(7)", tests, FAST, stdio=True).passed


_STDIO_SUM = "import os, sys\nprint(sum(map(int, sys.stdin.read().split())))\nsys.stdout.flush()\n"


@pytest.mark.parametrize(
    "ending,ok",
    [
        ("", True),
        ("sys.exit()", True),
        ("sys.exit(0)", True),
        ("sys.exit(False)", True),  # SystemExit(False): status 0, as the interpreter exits
        ("sys.exit(0.0)", False),  # the interpreter prints a non-int code and exits 1
        ("sys.exit('')", False),
        ("import decimal; sys.exit(decimal.Decimal(0))", False),
        ("sys.exit(type('Z', (int,), {'__eq__': lambda s, o: True})(3))", False),  # status 3, whatever __eq__ says
        ("sys.exit(3)", False),
        ("sys.exit(True)", False),
        ("raise SystemExit('bye')", False),  # a message: status 1
        ("os._exit(2)", False),
        ("raise ValueError('late')", False),
    ],
)
def test_judged_stdio_program_that_prints_the_answer_then_exits_nonzero_fails(ending, ok):
    # the right output on stdout is not enough: a stdio program is judged, like a script, with its
    # exit status, so printing the answer and then failing (or exiting non-zero) is a failure
    tests = "assert __stdio__('1 2\\n3').split() == ['6']\n"
    r = run_judged(_STDIO_SUM + ending + "\n", tests, FAST, stdio=True)
    assert r.passed is ok, (ending, r.status, r.judge_stderr)
    if not ok:  # the failure reaches the tests as an exception naming the exit status
        caught = "try:\n    __stdio__('1')\nexcept RuntimeError as e:\n    assert 'exit status' in str(e), e\nelse:\n    raise AssertionError('no error')\n"
        assert run_judged(_STDIO_SUM + ending + "\n", caught, FAST, stdio=True).passed


# a stdio program is judged as ``python solution.py < input`` would run it: each test below fails
# when the case's child ends without the interpreter's exit steps, or sees the bootstrap's argv
def test_stdio_output_of_atexit_hooks_is_kept():
    code = "import atexit\natexit.register(print, 'late')\nprint('early')\n"
    assert run_judged(code, "assert __stdio__('').split() == ['early', 'late']", FAST, stdio=True).passed


def test_stdio_threads_finish_before_the_atexit_hooks_run():
    code = (
        "import atexit, threading\nseen = []\natexit.register(lambda: print(seen))\n"
        "threading.Thread(target=lambda: seen.append(1)).start()\n"
    )
    assert run_judged(code, "assert __stdio__('').split() == ['[1]']", FAST, stdio=True).passed


def test_stdio_buffered_output_of_the_original_stdout_is_flushed_at_exit():
    # the program swaps sys.stdout out and writes to sys.__stdout__: the interpreter flushes it at exit
    code = "import io, sys\nsys.stdout = io.StringIO()\nsys.__stdout__.write('6\\n')\n"
    assert run_judged(code, "assert __stdio__('').split() == ['6']", FAST, stdio=True).passed


@pytest.mark.parametrize(
    "code",
    [
        "import sys\nprint(sys.argv)\n",
        "import fileinput\nprint(sum(int(x) for x in fileinput.input()))\n",
        "import sys\nf = open(sys.argv[1]) if len(sys.argv) > 1 else sys.stdin\nprint(sum(int(x) for x in f))\n",
    ],
)
def test_stdio_argv_is_a_script_run_with_no_arguments(code):
    tests = "assert __stdio__('2\\n4\\n').split() in (['6'], [repr(['solution.py'])])"
    r = run_judged(code, tests, FAST, stdio=True)
    assert r.passed, r.judge_stderr[-500:]


def test_run_python_argv_is_a_script_run_with_no_arguments():
    assert run_python("import sys\nprint(sys.argv)", FAST).stdout.strip() == "['solution.py']"


def test_stdio_output_above_the_file_size_limit_is_kept_up_to_the_reply_cap():
    # the case's output is the reply (max_reply_mb), not a file: RLIMIT_FSIZE (max_file_mb) does not bound it
    code = "import sys\nsys.stdout.write('x' * (2 << 20))\n"
    tests = "assert len(__stdio__('')) == 2 << 20"
    cfg = SandboxConfig(timeout_s=2.0, memory_mb=256, max_file_mb=1.0, max_reply_mb=4.0)
    r = run_judged(code, tests, cfg, stdio=True)
    assert r.passed, r.judge_stderr[-500:]
    over = "try:\n    __stdio__('')\nexcept OverflowError:\n    pass\nelse:\n    raise AssertionError('no error')\n"
    r = run_judged(code, over, SandboxConfig(timeout_s=2.0, memory_mb=256, max_reply_mb=1.0), stdio=True)
    assert r.passed, r.judge_stderr[-500:]


def test_judged_timeout_and_many():
    r = run_judged("def f():\n    while True:\n        pass\n", "f()", FAST)
    assert r.status == "timeout" and not r.passed
    res = run_many_judged([(f"def f():\n    return {i}\n", f"assert f() == {i % 2}", False) for i in range(4)], FAST)
    assert [r.passed for r in res] == [True, True, False, False]


# ---------------------------------------------------------------------------------------------
# the wire codec, in this process (the same source runs in the candidate and in the judge)
# ---------------------------------------------------------------------------------------------


def _codec(own=None, by_ref=False):
    ns = {"_dcref": lambda v: None, "_DC_BY_REF": by_ref, "_OWN": own or {}}
    path = programs.DIR / "codec.py"
    exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), ns)  # as the programs run it
    return ns


def _handle(v):
    raise TypeError(f"handle {type(v).__name__}")


def _roundtrip(v, ns=None):
    import json

    ns = ns or _codec()
    return ns["_dec"](json.loads(json.dumps(ns["_enc"](v, _handle))), lambda k, x: ("remote", k, x))


def test_codec_values_cross_as_their_own_types():
    import collections
    import dataclasses
    import datetime
    import decimal
    import fractions

    import numpy as np

    P = collections.namedtuple("P", "x y")
    dd = collections.defaultdict(list, {1: [2]})
    values = [
        10**5000,
        -(10**5000),
        2**4096 - 1,
        collections.Counter("aab"),
        collections.OrderedDict([("b", 1), ("a", 2)]),
        dd,
        collections.deque([1, 2], maxlen=3),
        P(1, [2]),
        fractions.Fraction(-3, 9),
        decimal.Decimal("1.10"),
        datetime.date(2024, 2, 29),
        datetime.datetime(2024, 1, 2, 3, 4, 5, 6),
        datetime.timedelta(days=-1, seconds=5),
        range(1, 10, 3),
        bytearray(b"ab"),
        complex(1.5, -2.0),
        (1, [2, (3,)], {4: frozenset({5})}),
        {1, 2},
    ]
    for v in values:
        back = _roundtrip(v)
        assert type(back) is type(v) or (type(v) is P and back._fields == ("x", "y")), (v, back)
        assert back == v, (v, back)
    assert _roundtrip(dd)[9] == [] and _roundtrip(collections.defaultdict(lambda: 0)).default_factory is None
    assert _roundtrip(collections.deque([1], maxlen=3)).maxlen == 3
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    back = _roundtrip(a)
    assert back.dtype == a.dtype and back.shape == (2, 3) and (back == a).all()
    assert type(_roundtrip(np.float32(1.5))) is float

    @dataclasses.dataclass(order=True)
    class Pt:
        x: int
        y: list = dataclasses.field(compare=False)

    ns = _codec()  # one judge: one class per (name, fields) for all its values
    back = _roundtrip(Pt(1, [2]), ns)
    assert back == _roundtrip(Pt(1, [3]), ns) and back != _roundtrip(Pt(2, [2]), ns) < _roundtrip(Pt(3, [2]), ns)
    assert back < _roundtrip(Pt(2, [2]), ns) and back != _roundtrip(Pt(1, [2]))  # another judge's class
    assert type(back).__name__ == "Pt" and back.y == [2]

    @dataclasses.dataclass
    class Plain:  # eq, no order
        x: int

    @dataclasses.dataclass(eq=False)
    class Ident:
        x: int

    assert _roundtrip(Plain(1), ns) == _roundtrip(Plain(1), ns) != _roundtrip(Plain(2), ns)
    with pytest.raises(TypeError):
        _roundtrip(Plain(1), ns) < _roundtrip(Plain(2), ns)  # noqa: B015
    assert _roundtrip(Ident(1), ns) != _roundtrip(Ident(1), ns)  # eq=False: identity, as in one process
    wide = dataclasses.make_dataclass("Wide", [f"f{i}" for i in range(256)])
    assert _roundtrip(wide(*range(256)), ns).f255 == 255
    # a class of the receiving side with that name and those fields is used as is
    assert type(_roundtrip(Pt(1, [2]), _codec(own={"Pt": Pt}))) is Pt


def test_codec_deep_values_and_unknown_objects():
    ns = _codec()
    deep = []
    for _ in range(sandbox.WIRE_DEPTH):
        deep = [deep]
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(config._RECURSION)
    try:
        assert _roundtrip(deep, ns) == deep
    finally:
        sys.setrecursionlimit(old)
    with pytest.raises(TypeError, match="handle object"):
        ns["_enc"](object(), _handle)
    # a subclass crosses as its base value, read through the base's own methods (never the subclass's)
    liar = type("I", (int,), {"__index__": lambda s: 9, "__int__": lambda s: 9, "__eq__": lambda s, o: True})(3)
    assert ns["_enc"](liar, _handle) == 3 and type(ns["_enc"](liar, _handle)) is int
    t = type("T", (tuple,), {"__iter__": lambda s: iter((9,)), "__getitem__": lambda s, i: 9})((1,))
    assert ns["_enc"](t, _handle) == {"t": [1]}  # a tuple subclass that is no namedtuple: a plain tuple
    assert ns["_enc"](type("L", (list,), {"__iter__": lambda s: iter([9])})([1, 2]), _handle) == [1, 2]
    assert ns["_enc"](type("S", (str,), {"__str__": lambda s: "x"})("ab"), _handle) == "ab"
    # the class is read from type(), never from __class__ (a property that claims to be float)
    with pytest.raises(TypeError, match="handle P"):
        ns["_enc"](type("P", (), {"__class__": property(lambda s: float), "__float__": lambda s: 4.0})(), _handle)
    with pytest.raises(TypeError, match="handle F"):
        ns["_enc"](type("F", (), {"_fields": ("a",)})(), _handle)  # _fields on a non-tuple


def test_codec_dataclass_by_reference_on_the_candidate_side():
    ns = _codec(by_ref=True)
    fields = [["x", True, 1]]
    assert ns["_dec"]({"dc": ["P", fields, [True, False, False], 7]}, lambda k, x: ("remote", k, x)) == (
        "remote",
        "h",
        7,
    )
    built = ns["_dec"]({"dc": ["P", fields, [True, False, False], None]}, lambda k, x: None)
    assert type(built).__name__ == "P" and built.x == 1


@pytest.mark.parametrize(
    "bad",
    [
        {"N": ["P", ["__class__"], [1]]},
        {"N": ["P", ["_x"], [1]]},
        {"N": ["P", ["a", "a"], [1, 2]]},
        {"N": ["class", ["a"], [1]]},
        {"dc": ["P", [["__eq__", True, 1]], [True, False, False], None]},
        {"dc": ["P", [["_tl_ref", True, 1]], [True, False, False], None]},
        {"dc": ["False", [["a", True, 1]], [True, False, False], None]},
        {"dc": ["P", [[f"f{i}", True, i] for i in range(257)], [True, False, False], None]},
        {"nd": ["|O8", [1], [1]]},
        {"dt": ["timezone", "x"]},
        {"zz": 1},
        {"t": [1], "d": []},
    ],
)
def test_codec_refuses_malformed_values(bad):
    with pytest.raises(ValueError, match="malformed"):
        _codec()["_dec"](bad, lambda k, x: None)


def test_codec_rebuilds_only_this_sides_own_plain_classes():
    node = type("Node", (), {"__module__": "__main__"})
    slotted = type("Slot", (), {"__module__": "__main__", "__slots__": ("val",)})
    ns = _codec({"__name__": "__main__", "Node": node, "Slot": slotted, "f": len})
    dec = ns["_dec"]
    n = dec({"o": ["Node", 0, None, [["val", 1], ["next", {"or": 0}]]]}, lambda k, x: None)
    assert type(n) is node and n.val == 1 and n.next is n  # a cycle stays a cycle
    remote = lambda k, x: ("remote", k, x)
    assert dec({"o": ["Other", 0, 7, []]}, remote) == ("remote", "h", 7)  # no class of its own: a handle
    for name in ("Other", "f", "Slot"):
        with pytest.raises(TypeError, match="no class"):
            dec({"o": [name, 0, None, []]}, remote)
    for bad in (
        {"o": ["Node", 0, None, [["__class__", 1]]]},
        {"o": ["Node", 0, None, [["_tl_ref", 1]]]},
        {"o": ["Node", "0", None, []]},
        {"or": 0},
        {"en": ["IntEnum", "P", [["_missing_", 1]], 1]},
        {"en": ["IntEnum", "P", [["A", 1.5]], 1.5]},
        {"en": ["IntEnum", "P", [["A", 1]], 2]},
        {"en": ["IntEnum", "P", [["A", True]], True]},
        {"en": ["IntEnum", "P", [["A", 1]], True]},  # a bool value that IntEnum would take for 1
        {"en": ["StrEnum", "P", [["A", 1]], 1]},
        {"en": ["IntEnum", "P", [["A", 1]], "1"]},
        {"en": ["EnumMeta", "P", [["A", 1]], 1]},
        {"en": ["Flag", "class", [["A", 1]], 1]},
        {"it": {"a": 1}},
    ):
        with pytest.raises(ValueError, match="malformed"):
            dec(bad, remote)
    m = dec({"en": ["IntEnum", "P", [["A", 1], ["B", 2]], 2]}, remote)
    assert m == 2 and m.name == "B" and type(m).__name__ == "P"
    m = dec({"en": ["StrEnum", "C", [["RED", "red"]], "red"]}, remote)
    assert m == "red" and m.name == "RED" and type(m).__name__ == "C"
    f = dec({"en": ["Flag", "F", [["R", 1], ["W", 2]], 3]}, remote)  # a combination of members, by value
    assert type(f).__name__ == "F" and f == type(f).R | type(f).W
    assert dec({"en": ["Flag", "F", [["R", 1], ["W", 2]], 1]}, remote) is type(f).R  # one class per members
    assert list(dec({"it": [1, {"t": [2]}]}, remote)) == [1, (2,)]


def test_sync_applies_in_place_changes():
    import collections

    sync = _codec()["_sync"]
    deep = [1]
    d = {"k": deep, "gone": 1}
    sync(d, {"k": [1, 2], "new": 3})
    assert d == {"k": [1, 2], "new": 3} and d["k"] is deep and deep == [1, 2]  # nested values changed in place
    inner = [1]
    old = [inner, {"k": [2]}, 3]
    sync(old, [[1, 9], {"k": [2, 8], "n": 1}, 4])
    assert old == [[1, 9], {"k": [2, 8], "n": 1}, 4] and inner == [1, 9]
    old = [1, 2, 3]
    sync(old, [3])
    assert old == [3]
    d = collections.defaultdict(int, {"a": 1})
    sync(d, collections.defaultdict(list, {"b": 2}))
    assert d == {"b": 2} and d.default_factory is list
    s, ba, q = {1}, bytearray(b"a"), collections.deque([1])
    sync(s, {2, 3})
    sync(ba, bytearray(b"xy"))
    sync(q, collections.deque([7, 8]))
    assert s == {2, 3} and ba == b"xy" and list(q) == [7, 8]
    t = [1]
    sync(t, (2,))  # a different type: left alone
    assert t == [1]


def test_walk_gives_the_nodes_ast_walk_gives():
    import ast
    import inspect

    walk = _codec()["_walk"]
    for src in (inspect.getsource(runner), "import math\nassert math.isclose(f(2), 4.0)\nx = [a.b for a in y if a]\n"):
        tree = ast.parse(src)
        got, want = list(walk(tree)), list(ast.walk(tree))
        assert len(got) == len(want) and {id(n) for n in got} == {id(n) for n in want}


def test_restore_gives_an_object_its_new_attributes_in_place():
    restore = _codec()["_restore"]
    node = type("Node", (), {})()
    items, other = [1], object()
    node.__dict__.update(val=1, items=items, gone=2)
    restore(node, [("val", 5, False), ("items", [1, 2], True), ("next", other, False)])
    assert node.__dict__ == {"val": 5, "items": [1, 2], "next": other}
    assert node.items is items and items == [1, 2]  # a list attribute changed in place stays the caller's list
    restore(node, [("items", [4], False)])  # rebound in the callee: a new list, the old one untouched
    assert node.__dict__ == {"items": [4]} and node.items is not items and items == [1, 2]
    restore(node, [("items", (3,), True)])  # a different type replaces it
    assert node.__dict__ == {"items": (3,)}


def test_only_objects_a_call_may_have_changed_are_sent_back():
    moved = _codec()["_moved"]
    node = type("Node", (), {})
    a, b = node(), node()
    items = [1]
    a.__dict__.update(val=1, name="x", next=b, f=1.5)
    was = dict(a.__dict__)
    assert not moved(a, was, {id(b)})  # same scalars, same crossed neighbour
    assert moved(a, was, set())  # a neighbour that did not cross may have changed inside
    a.val = 2
    assert moved(a, was, {id(b)})  # rebound
    a.val = 1
    a.items = items
    assert moved(a, was, {id(b)})  # a new attribute
    was = dict(a.__dict__)
    assert moved(a, was, {id(b)})  # a list attribute may have changed in place
    del a.items
    assert moved(a, was, {id(b)})  # an attribute removed


def test_objects_of_a_calls_arguments_come_back_as_the_callers_own():
    node = type("Node", (), {"__module__": "__main__"})
    judge = _codec({"__name__": "__main__", "Node": node})
    judge["_objref"] = lambda v: None  # as in the judge: its objects carry no sandbox reference
    a, b = node(), node()
    a.__dict__.update(val=1, next=b)
    b.__dict__.update(val=2, next=None)
    keep = []
    judge["_EKEEP"] = keep
    by_value = lambda v: judge["_enc_obj"](v, by_value)  # the judge's _arg for its own plain classes
    sent = judge["_whole"](judge["_enc"], [a, b], by_value)
    judge["_EKEEP"] = None
    assert keep == [a, b] and sent == [
        {"o": ["Node", 0, None, [["val", 1], ["next", {"o": ["Node", 1, None, [["val", 2], ["next", None]]]}]]]},
        {"or": 1},
    ]
    # the sandbox's side: the call's objects are sent back by their key, new objects by value
    twin_cls = type("Node", (), {"__module__": "solution"})  # the same definition, run in the sandbox
    cand = _codec({"__name__": "solution", "Node": twin_cls})
    cand["_BYVAL"], cand["_objref"] = frozenset({"Node"}), lambda v: None
    twin = cand["_whole"](cand["_dec"], sent, None)
    x, y = twin
    assert type(x) is twin_cls and x.next is y
    fresh = twin_cls()
    fresh.__dict__.update(val=7, next=x)
    cand["_ORIG"] = {id(x): 0, id(y): 1}
    assert cand["_whole"](cand["_enc"], [y, fresh], _handle) == [
        {"ok": 1},
        {"o": ["Node", 0, None, [["val", 7], ["next", {"ok": 0}]]]},
    ]
    cand["_ORIG"] = None
    # the judge maps the keys to its own objects; without a call's objects, or out of range, a key is malformed
    judge["_DORIG"] = keep
    got = judge["_whole"](judge["_dec"], [{"ok": 1}, {"o": ["Node", 0, None, [["val", 7], ["next", {"ok": 0}]]]}], None)
    assert got[0] is b and type(got[1]) is node and got[1].next is a and got[1] is not fresh
    for bad in ({"ok": 2}, {"ok": -1}, {"ok": "0"}, {"ok": True}):
        with pytest.raises(ValueError, match="malformed"):
            judge["_dec"](bad, None)
    judge["_DORIG"] = None
    with pytest.raises(ValueError, match="malformed"):
        judge["_dec"]({"ok": 0}, None)


# ---------------------------------------------------------------------------------------------
# the clock, uid slots and the keyring filter
# ---------------------------------------------------------------------------------------------


def test_clock_discounts_cpu_starvation_and_caps_wall_time(monkeypatch):
    now = [100.0]
    stats = {}
    monkeypatch.setattr(clock.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(clock, "_tree", lambda roots: list(roots))
    monkeypatch.setattr(clock, "_run_delays", lambda pids: dict(stats))
    c = clock._RunDeadline(timeout_s=2.0, max_wall_s=10.0)
    now[0], stats[7] = 101.0, (int(0.1e9), int(0.75e9))  # 1 s of wall, 0.75 s of it waiting for a CPU
    c.sample([1])
    assert c.left() == pytest.approx(2.0 - 0.25)
    now[0], stats[7], stats[8] = 102.0, (int(0.1e9), int(1.25e9)), (0, int(4e9))  # 4.5 s waited in 1 s: 1 s counts
    c.sample([1])
    assert c.starved == pytest.approx(1.75) and c.left() == pytest.approx(2.0 - 0.25)
    now[0] = 103.5  # no waiting: wall time counts in full
    c.sample([1])
    assert c.left() == pytest.approx(2.0 - 1.75)
    # a run whose own threads keep each other waiting: the clock advances by its CPU time at least
    now[0], stats[7], stats[8] = 104.0, (int(0.45e9), int(1.5e9)), (int(0.25e9), int(4.5e9))
    c.sample([1])
    assert c.starved == pytest.approx(1.75) and c.left() == pytest.approx(2.0 - 2.25)  # ran 0.6 s in 0.5 s
    now[0], stats[7] = 111.0, (int(0.45e9), int(100e9))  # starved throughout, but the wall-clock cap holds
    c.sample([1])
    assert c.left() == pytest.approx(10.0 - 11.0)


def test_slot_uid_is_the_documented_formula():
    cfg = SandboxConfig(uid_base=0x60000000)
    base = 0x60000000 + 256 * (os.getpid() % 4096)
    assert [slots._slot_uid(cfg, k) for k in (None, 0, 1, 255)] == [base, base, base + 1, base + 255]
    for bad in (256, -1):
        with pytest.raises(RuntimeError, match="at most 256"):
            slots._slot_uid(cfg, bad)


@needs_bwrap
@pytest.mark.skipif(not REPORT["parent_is_root"], reason="as an ordinary user the candidate is uid 65534")
def test_a_run_as_root_gets_a_uid_of_this_process_slots():
    lo = SandboxConfig().uid_base + 256 * (os.getpid() % 4096)
    r = run_python("import os\nprint(os.getuid(), os.getgid())", FAST)
    uid, gid = map(int, r.stdout.split())
    assert r.passed and lo <= uid < lo + 256 and gid == uid


def test_uid_slots_rotate_and_skip_uids_still_in_use(monkeypatch):
    alive = {3}
    monkeypatch.setattr(slots, "_slot_next", [2])
    with slots._uid_slot(lambda k: k) as a, slots._uid_slot(lambda k: k) as b:
        pass
    with slots._uid_slot(lambda k: k) as c:
        pass
    assert (a, b, c) == (2, 3, 4)  # rotating, not reusing the slot just released
    monkeypatch.setattr(slots, "_uid_alive", lambda uid: uid in alive)
    monkeypatch.setattr(slots, "_slot_next", [3])
    with slots._uid_slot(lambda k: k) as d:
        pass
    assert d == 4  # slot 3's uid still has a process


def _bpf(prog: bytes, arch: int, nr: int, args: tuple[int, ...] = ()) -> int:
    """Run a classic-BPF seccomp program (the instructions seccomp_program uses) on one system call."""
    import struct

    ins = [struct.unpack("=HBBI", prog[i : i + 8]) for i in range(0, len(prog), 8)]
    data = {0: nr, 4: arch}
    for i, a in enumerate((*args, 0, 0, 0, 0, 0, 0)[:6]):
        data[16 + 8 * i], data[20 + 8 * i] = a & 0xFFFFFFFF, a >> 32
    acc = pc = 0
    while True:
        code, jt, jf, k = ins[pc]
        if code == 0x20:
            acc = data[k]
        elif code in (0x15, 0x35, 0x45):
            pc += jt if {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code] else jf
        elif code == 0x06:
            return k
        else:
            raise AssertionError(f"unexpected instruction {code:#x}")
        pc += 1


ALLOW, EPERM, ENOSYS = 0x7FFF0000, 0x00050001, 0x00050026


def test_seccomp_program_denies_the_listed_calls_only():
    for machine in ("x86_64", "aarch64"):
        arch, nrs = seccomp._SYSCALLS[machine]
        prog = sandbox.seccomp_program(machine)
        whole = {nrs[n] for n in sandbox.SECCOMP_DENIED if n in nrs}
        some = {nrs[n] for n in sandbox.SECCOMP_DENIED_ARGS}
        for nr in range(0, 460):
            want = EPERM if nr in whole else ENOSYS if nr == nrs["clone3"] else ALLOW
            if nr not in some:
                assert _bpf(prog, arch, nr, (1, 1, 1, 1, 1, 1)) == want, (machine, nr)
        assert _bpf(prog, 0x40000003, 0) == EPERM  # a foreign ABI (i386)
    x86 = sandbox.seccomp_program("x86_64")
    assert _bpf(x86, 0xC000003E, 0x40000000 + 1) == EPERM  # x32 ABI
    assert _bpf(sandbox.seccomp_program("aarch64"), 0xC00000B7, 0x40000000) == ALLOW  # no x32 check off x86_64
    assert sandbox.seccomp_program("s390x") is None


@pytest.mark.parametrize(
    "call,args,want",
    [
        ("preadv2", (3, 0, 1, 0, 0, 0), ALLOW),
        ("preadv2", (3, 0, 1, 0, 0, 0x8), EPERM),  # RWF_NOWAIT
        ("preadv2", (3, 0, 1, 0, 0, 0x8 | 0x1), EPERM),
        ("preadv2", (3, 0, 1, 0, 0, 0x1), ALLOW),  # RWF_HIPRI
        ("pwritev2", (3, 0, 1, 0, 0, 0x8), EPERM),
        ("madvise", (0, 4096, 4), ALLOW),  # MADV_DONTNEED (the allocators' own)
        ("madvise", (0, 4096, 20), EPERM),  # MADV_COLD
        ("madvise", (0, 4096, 21), EPERM),  # MADV_PAGEOUT
        ("madvise", (0, 4096, 14), ALLOW),  # MADV_HUGEPAGE
        ("fcntl", (3, 1), ALLOW),  # F_GETFD
        ("fcntl", (3, 4, 0x800), ALLOW),  # F_SETFL
        ("fcntl", (3, 1030, 0), ALLOW),  # F_DUPFD_CLOEXEC
        *[("fcntl", (3, c), EPERM) for c in (5, 6, 7, 36, 37, 38, 1024, 1026)],
        ("fcntl", (3, (1 << 32) | 6), EPERM),  # the kernel reads the low 32 bits of the command
        ("unshare", (0x10000000,), EPERM),  # CLONE_NEWUSER
        ("unshare", (0x10000000 | 0x20000,), EPERM),
        ("unshare", (0x400,), ALLOW),  # CLONE_FILES
        ("clone", (0x10000000 | 17,), EPERM),
        ("clone", (17,), ALLOW),  # fork
        ("clone", (0x3D0F00,), ALLOW),  # a thread (CLONE_VM | CLONE_FS | ... | CLONE_SETTLS ...)
    ],
)
def test_seccomp_program_reads_the_arguments(call, args, want):
    for machine in ("x86_64", "aarch64"):
        arch, nrs = seccomp._SYSCALLS[machine]
        assert _bpf(sandbox.seccomp_program(machine), arch, nrs[call], args) == want, machine


def test_seccomp_budget_program_refuses_new_processes_and_memory_outside_the_address_space():
    for machine in ("x86_64", "aarch64"):
        arch, nrs = seccomp._SYSCALLS[machine]
        prog = sandbox.seccomp_budget_program(machine)
        denied = {nrs[n] for n in sandbox.SECCOMP_BUDGET_DENIED if n in nrs}
        assert len(denied) == (4 if machine == "x86_64" else 2)  # aarch64 has no fork / vfork
        for nr in range(0, 460):
            if nr != nrs["clone"]:
                assert _bpf(prog, arch, nr) == (EPERM if nr in denied else ALLOW), (machine, nr)
        assert _bpf(prog, arch, nrs["clone"], (0x3D0F00,)) == ALLOW  # a thread (CLONE_THREAD)
        assert _bpf(prog, arch, nrs["clone"], (17,)) == EPERM  # fork
        assert _bpf(prog, arch, nrs["clone"], (0x4111,)) == EPERM  # vfork (CLONE_VM | CLONE_VFORK), posix_spawn
        assert _bpf(prog, 0x40000003, 0) == EPERM
        both = sandbox.seccomp_program(machine, budget=True)  # the two filters as one
        for nr in range(0, 460):
            if nr not in (nrs["clone"], *(nrs[n] for n in sandbox.SECCOMP_DENIED_ARGS)):
                alone = sandbox.seccomp_program(machine)
                want = EPERM if EPERM in (_bpf(alone, arch, nr), _bpf(prog, arch, nr)) else _bpf(alone, arch, nr)
                assert _bpf(both, arch, nr) == want, (machine, nr)
        for flags, want in ((0x3D0F00, ALLOW), (17, EPERM), (0x3D0F00 | 0x10000000, EPERM), (0x10000000 | 17, EPERM)):
            assert _bpf(both, arch, nrs["clone"], (flags,)) == want, (machine, flags)


def test_seccomp_program_layout():
    import struct

    prog = sandbox.seccomp_program("x86_64")
    ins = [struct.unpack("=HBBI", prog[i : i + 8]) for i in range(0, len(prog), 8)]
    assert ins[0] == (0x20, 0, 0, 4) and ins[1][3] == 0xC000003E and ins[2] == (0x20, 0, 0, 0)
    assert ins[-2] == (0x06, 0, 0, EPERM) and ins[-1] == (0x06, 0, 0, ENOSYS)
    deny = len(ins) - 2
    assert 2 + ins[1][2] == deny and ins[1][1] == 0  # a foreign architecture is denied too
    for pc, (code, jt, jf, k) in enumerate(ins):  # every jump goes forward, inside the program
        if code in (0x15, 0x35, 0x45):
            assert pc + 1 + max(jt, jf) < len(ins)
        if code == 0x20:  # loads: arch, nr, or the low word of an argument
            assert k in (0, 4) or ((k - 16) % 8 == 0 and 16 <= k < 64)
    assert sandbox.seccomp_program("aarch64") != prog


KEYCTL = (
    "import ctypes, platform\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "add, req, ctl = (248, 249, 250) if platform.machine() == 'x86_64' else (217, 218, 219)\n"
    "r = [libc.syscall(add, b'user', b'tiltlab-probe', b'x', 1, -4), libc.syscall(ctl, 0, -3, 0),"
    " libc.syscall(req, b'user', b'tiltlab-probe', None, 0)]\nprint(r, ctypes.get_errno())\n"
)


@pytest.mark.parametrize("backend", ["auto", "legacy"])
def test_keyring_calls_are_denied(backend):
    if sandbox.seccomp_program() is None:
        pytest.skip("no keyring system-call numbers for this architecture")
    r = run_python(KEYCTL, FAST, backend=backend, audit_hook=False, memory_mb=512)
    assert r.passed, r.stderr[-500:]
    assert r.stdout.split() == ["[-1,", "-1,", "-1]", "1"]  # EPERM
    assert r.isolation["seccomp"]


# Each channel below is tried by a "reader with no task logic": ``probe()`` makes the one system call
# and returns True when it was not refused (the call then tells the reader something: residency,
# a lock, an event, another process's memory), so the tests ``assert probe()`` pay it exactly when
# the channel is open. The candidate prints the errno it got.
_CHANNEL_PRELUDE = """
import ctypes, errno, fcntl, os, resource, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.syscall.restype = ctypes.c_long
NR = {nr!r}
F = os.open(sys.executable, os.O_RDONLY)  # a file every concurrent candidate shares (read-only)
ADDR = ctypes.c_void_p(libc.mmap(None, 4096, 1, 1, F, 0))  # PROT_READ, MAP_SHARED
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
SRC, DST = ctypes.create_string_buffer(b"abc"), ctypes.create_string_buffer(3)
def iov(buf):
    return ctypes.byref(iovec(ctypes.addressof(buf), 3))
def call():
    return {call}
def probe():
    ctypes.set_errno(0)
    r = None
    try:
        r = call()
        e = ctypes.get_errno() if r == -1 else 0
    except OSError as x:
        e = x.errno
    if r == 0 and os.getpid() != PID:  # a clone that went through: the child leaves at once
        os._exit(0)
    print(errno.errorcode.get(e, e), flush=True)
    return e != errno.EPERM
PID = os.getpid()
"""

_CHANNELS = {
    "mincore": "libc.mincore(ADDR, 4096, ctypes.create_string_buffer(1))",
    "preadv2 RWF_NOWAIT": "os.preadv(F, [bytearray(16)], 0, os.RWF_NOWAIT)",
    "pwritev2 RWF_NOWAIT": "os.pwritev(os.open('w', os.O_RDWR | os.O_CREAT), [b'x'], 0, os.RWF_NOWAIT)",
    "posix_fadvise DONTNEED": "os.posix_fadvise(F, 0, 0, os.POSIX_FADV_DONTNEED)",
    "madvise MADV_PAGEOUT": "libc.madvise(ADDR, 4096, 21)",
    "madvise MADV_COLD": "libc.madvise(ADDR, 4096, 20)",
    "readahead": "libc.readahead(F, ctypes.c_longlong(0), ctypes.c_size_t(4096))",
    # the kernel itself refuses cachestat on a file the caller may not write (since 6.10): probe an own file
    "cachestat": "libc.syscall(NR['cachestat'], os.open('c', os.O_RDWR | os.O_CREAT), ctypes.create_string_buffer(16),"
    " ctypes.create_string_buffer(96), 0)",
    "io_uring_setup": "libc.syscall(NR['io_uring_setup'], 1, ctypes.create_string_buffer(120))",
    "io_setup": "libc.syscall(NR['io_setup'], 1, ctypes.byref(ctypes.c_ulong(0)))",
    "flock": "fcntl.flock(F, fcntl.LOCK_SH | fcntl.LOCK_NB)",
    "fcntl F_SETLK (lockf)": "fcntl.lockf(F, fcntl.LOCK_SH | fcntl.LOCK_NB)",
    "fcntl F_OFD_GETLK": "fcntl.fcntl(F, 36, struct.pack('hhqqi4x', fcntl.F_RDLCK, 0, 0, 0, 0))",
    "inotify_init1": "libc.inotify_init1(0)",
    "unshare CLONE_NEWUSER": "libc.unshare(0x10000000)",
    "clone CLONE_NEWUSER": "libc.syscall(NR['clone'], 0x10000000 | 17, 0, 0, 0, 0)",
    "setns": "libc.setns(F, 0)",  # no /proc for a namespace file: unfiltered, the kernel answers EINVAL
    "ptrace": "libc.ptrace(0, 0, 0, 0)",  # PTRACE_TRACEME
    "process_vm_readv": "libc.process_vm_readv(os.getpid(), iov(DST), 1, iov(SRC), 1, 0)",
    "process_vm_writev": "libc.process_vm_writev(os.getpid(), iov(SRC), 1, iov(DST), 1, 0)",
    "pidfd_getfd": "libc.syscall(NR['pidfd_getfd'], F, 0, 0)",  # unfiltered, the kernel answers EBADF
    "pidfd_open": "os.pidfd_open(os.getpid())",  # its inode number counts the host's pids
    "getrusage (fault counts)": "resource.getrusage(resource.RUSAGE_SELF)",
    "sysinfo": "libc.sysinfo(ctypes.create_string_buffer(256))",
    "perf_event_open": "libc.syscall(NR['perf_event_open'], ctypes.create_string_buffer(128), 0, -1, -1, 0)",
    "process_madvise": "libc.syscall(NR['process_madvise'], 0, 0, 0, 21, 0)",
}


@pytest.mark.parametrize("channel", list(_CHANNELS))
def test_channel_system_calls_are_refused(channel):
    import platform

    if sandbox.seccomp_program() is None:
        pytest.skip("no system-call numbers for this architecture")
    nr = seccomp._SYSCALLS[platform.machine()][1]
    code = _CHANNEL_PRELUDE.format(nr=nr, call=_CHANNELS[channel])
    r = run_judged(code, "assert probe()", FAST, audit_hook=False, memory_mb=512)
    assert (r.passed, r.stdout.split()) == (False, ["EPERM"]), (r.stdout, r.stderr[-800:], r.judge_stderr[-800:])


def test_refused_system_calls_leave_threads_and_plain_reads_alone():
    # clone3 is answered ENOSYS (the C library then uses clone for threads), madvise(MADV_DONTNEED) and
    # preadv2 without RWF_NOWAIT run, fcntl's other commands run (new processes: the budget tests below)
    code = (
        "import ctypes, fcntl, os, sys, threading\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "t = threading.Thread(target=print, args=('thread',))\nt.start()\nt.join()\n"
        "f = os.open(sys.executable, os.O_RDONLY)\nprint('read', os.preadv(f, [bytearray(4)], 0, 0))\n"
        "print('flags', fcntl.fcntl(f, fcntl.F_GETFD) >= 0)\nimport mmap\n"
        "m = mmap.mmap(-1, 4096)\nm.madvise(mmap.MADV_DONTNEED)\nprint('madvise ok')\n"
    )
    r = run_python(code, FAST, audit_hook=False)
    assert r.passed, r.stderr[-800:]
    assert r.stdout.split("\n")[:4] == ["thread", "read 4", "flags True", "madvise ok"]


# Three ways to hold memory outside the address space that RLIMIT_AS bounds: each program tries to hold
# 3 x memory_mb (200 MiB at a time) and prints how much it held and the errno that stopped it.
_BUDGET_PRELUDE = """
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
CHUNK = 200 << 20
held, err = 0, 0
def grab():
{grab}
try:
    while held < 3 * {budget} << 20:
        grab()
        held += CHUNK
except OSError as e:
    err = e.errno
print(held >> 20, errno.errorcode.get(err, err), flush=True)
"""
_BUDGET_GRABS = {
    # a child allocates and tells the parent; it waits (blocked on a pipe) until the parent exits
    "fork": "    r, w = os.pipe()\n    done, hold = os.pipe()\n    if os.fork() == 0:\n"
    "        os.close(w)\n        x = bytearray(CHUNK)\n        os.write(hold, b'1')\n        os.read(r, 1)\n        os._exit(0)\n"
    "    os.read(done, 1)",
    "memfd": "    for _ in range(CHUNK >> 23):  # 8 MiB files, below RLIMIT_FSIZE\n"
    "        os.write(os.memfd_create('m'), bytes(1 << 23))",
    "SysV shm": "    i = libc.shmget(0, CHUNK, 0o1600)\n    if i < 0:\n        raise OSError(ctypes.get_errno(), 'shmget')\n"
    "    a = ctypes.c_void_p(libc.shmat(i, None, 0))\n    ctypes.memset(a, 1, CHUNK)\n    libc.shmdt(a)",
}


@pytest.mark.parametrize("way", list(_BUDGET_GRABS))
def test_memory_budget_bounds_the_whole_run(way):
    if sandbox.seccomp_budget_program() is None:
        pytest.skip("no system-call numbers for this architecture")
    code = _BUDGET_PRELUDE.format(grab=_BUDGET_GRABS[way], budget=256)
    r = run_python(code, FAST, audit_hook=False, nofile=256)
    held, err = r.stdout.split()
    assert (int(held), err) == (0, "EPERM"), (r.stdout, r.stderr[-500:])


def test_memory_budget_in_a_stdio_case():
    code = _BUDGET_PRELUDE.format(grab=_BUDGET_GRABS["fork"], budget=256)
    tests = "assert __stdio__('').split() == ['0', 'EPERM']"
    r = run_judged(code, tests, FAST, stdio=True, audit_hook=False)
    assert r.passed, r.judge_stderr[-500:]


@needs_bwrap
def test_successive_runs_get_new_uids():
    if not REPORT["parent_is_root"]:
        pytest.skip("as an ordinary user every run is uid 65534 of its own user namespace")
    uids = [int(run_python("import os\nprint(os.getuid())", FAST).stdout) for _ in range(3)]
    assert len(set(uids)) == 3


def test_judged_namespace_rules():
    shadow = "def f(x):\n    return 0\nclass math:\n    @staticmethod\n    def isclose(*a, **k):\n        return True\n"
    stop = "def f():\n    raise StopIteration\n"
    jobs = [
        ("def copy(x):\n    return [x]\n", "assert copy(1) == [1]\n", False),  # a function named like a module
        (shadow, "assert math.isclose(f(1), 2)\n", False),  # the tests' math is the judge's
        ("def f(r):\n    return 2.0 * r\n", "assert math.isclose(f(1), 2)\n", False),  # unimported math
        (stop, "assert all(map(lambda _: f(), [1]))\n", False),
        (stop, "try:\n    f()\nexcept RuntimeError as e:\n    assert 'StopIteration' in str(e)\n", False),
        ("def f():\n    raise KeyError('k')\n", "try:\n    f()\nexcept KeyError:\n    pass\n", False),
    ]
    got = [r.passed for r in run_many_judged(jobs, FAST)]
    assert got == [True, False, True, False, True, True]


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
