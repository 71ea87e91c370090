"""Hostile programs in llm.sandbox: each must fail (score 0), none may hang or touch the host."""

import os
import socket
import sys
import time
import warnings

import pytest

if not sys.platform.startswith("linux"):
    pytest.skip("the sandbox targets Linux (rlimits, namespaces)", allow_module_level=True)

from tiltlab.llm import sandbox
from tiltlab.llm.rewards import code_reward
from tiltlab.llm.sandbox import SandboxConfig, SandboxWarning, isolation_report, run_many, run_python

with warnings.catch_warnings():  # the isolation facts are asserted below, not warned about
    warnings.simplefilter("ignore", SandboxWarning)
    REPORT = isolation_report()
pytestmark = pytest.mark.filterwarnings("ignore::tiltlab.llm.sandbox.SandboxWarning")
FAST = SandboxConfig(timeout_s=2.0, memory_mb=256)
# Wall-time bound for a run that must be cut by the 2 s timeout: timeout + interpreter start/kill slack.
# 3 s slack covers a loaded 2-core machine; a hang would exceed it by far.
BOUND = FAST.timeout_s + 3.0


def _uid_processes(uid: int) -> list[int]:
    pids = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if os.stat(f"/proc/{p}").st_uid == uid:
                    pids.append(int(p))
            except FileNotFoundError:
                pass
    return pids


def test_ok_program_and_clean_environment():
    r = run_python("import os\nprint(sorted(os.listdir('.')), sorted(os.environ), 6 * 7)", FAST)
    assert r.passed, r.stderr
    assert r.stdout.startswith("[] ")  # empty working directory
    assert r.stdout.strip().endswith(" 42")
    for key in ("TILTLAB", "PYTHONPATH", "VIRTUAL_ENV", "PYENV"):
        assert key not in r.stdout


def test_failing_assert_is_error():
    r = run_python("assert 1 == 2", FAST)
    assert r.status == "error" and not r.passed


def test_infinite_loop_times_out():
    t = time.monotonic()
    r = run_python("while True:\n    pass", FAST)
    assert r.status == "timeout" and not r.passed
    assert time.monotonic() - t < BOUND


def test_sleep_times_out():
    t = time.monotonic()
    r = run_python("import time\ntime.sleep(60)", FAST)
    assert r.status == "timeout"
    assert time.monotonic() - t < BOUND


def test_cpu_rlimit_stops_busy_loop_before_wall_clock():
    r = run_python("while True:\n    pass", FAST, cpu_s=1, timeout_s=20)
    assert r.status == "timeout" and not r.passed
    assert r.wall_s < 10  # 1 CPU-second (+1 s to the hard limit); far below the 20 s wall clock


@pytest.mark.parametrize(
    "code",
    [
        "x = bytearray(8 * 1024 ** 3)",
        "a = []\nwhile True:\n    a.append(' ' * 10 ** 6)",
    ],
)
def test_memory_bomb(code):
    t = time.monotonic()
    r = run_python(code, FAST)
    assert r.status == "memory" and not r.passed
    assert time.monotonic() - t < BOUND


@pytest.mark.parametrize(
    "code",
    [
        "import os\nwhile True:\n    os.fork()",
        "import subprocess\nsubprocess.run(['sh', '-c', 'echo pwned'])",
        "import os\nos.system('echo pwned')",
        "import multiprocessing as mp\nmp.Process(target=print).start()",
        "import ctypes\nctypes.CDLL(None).fork()",
    ],
)
def test_process_creation_blocked(code):
    r = run_python(code, FAST)
    assert r.status == "blocked" and not r.passed, (r.status, r.stderr[-300:])
    assert "pwned" not in r.stdout


@pytest.mark.skipif(
    not REPORT["rlimit_nproc_effective"],
    reason="RLIMIT_NPROC is not enforced for root and no privilege drop is possible here",
)
def test_fork_bomb_without_audit_hook_is_contained_by_rlimit():
    uid = REPORT["runs_as_uid"]
    before = set(_uid_processes(uid)) if REPORT["privileges_dropped"] else set()
    t = time.monotonic()
    r = run_python("import os\nwhile True:\n    os.fork()", FAST, audit_hook=False, nproc=16)
    assert not r.passed
    assert time.monotonic() - t < BOUND
    if REPORT["privileges_dropped"]:
        time.sleep(0.2)
        assert set(_uid_processes(uid)) - before == set()  # nothing survives the run


def test_write_outside_workdir_blocked(tmp_path):
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
        r = run_python(code, FAST)
        assert not r.passed, code
    assert not target.exists()
    assert victim.read_text() == "keep"
    # writing inside the working directory is allowed
    assert run_python("open('ok.txt', 'w').write('x')\nprint(open('ok.txt').read())", FAST).stdout.strip() == "x"


@pytest.mark.skipif(not REPORT["privileges_dropped"], reason="no privilege drop here")
def test_write_outside_workdir_denied_by_os_without_hook(tmp_path):
    os.chmod(tmp_path, 0o755)
    r = run_python(f"open({str(tmp_path / 'x')!r}, 'w').write('x')", FAST, audit_hook=False)
    assert r.status == "error" and "Permission denied" in r.stderr
    assert not (tmp_path / "x").exists()


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


@pytest.mark.skipif(not REPORT["network_namespace"], reason="no network namespace on this OS")
def test_network_namespace_without_hook(listener):
    code = f"import socket\nsocket.create_connection(('127.0.0.1', {listener}), timeout=2)\nprint('connected')"
    r = run_python(code, FAST, audit_hook=False)
    assert not r.passed and "connected" not in r.stdout
    # control: the same program reaches the host listener when both layers are off (the test can fail)
    r = run_python(code, FAST, audit_hook=False, isolate_network=False)
    assert r.passed and "connected" in r.stdout


def test_huge_output_capped():
    cap = 4096
    for code in ("print('x' * 10 ** 8)", "import sys\nfor _ in range(10 ** 6):\n    sys.stdout.write('y' * 100)"):
        t = time.monotonic()
        r = run_python(code, FAST, max_output_bytes=cap, max_file_mb=0.01)
        assert r.status == "output_limit" and not r.passed
        assert len(r.stdout) <= cap
        assert time.monotonic() - t < BOUND


def test_hostile_solutions_score_zero(tmp_path, listener):
    tests = "assert f(2) == 4\n"
    good = "def f(x):\n    return 2 * x\n"
    hostile = [
        "while True:\n    pass\n" + good,
        "x = bytearray(8 * 1024 ** 3)\n" + good,
        "import os\nos.fork()\n" + good,
        f"open({str(tmp_path / 'p')!r}, 'w').write('x')\n" + good,
        f"import socket\nsocket.create_connection(('127.0.0.1', {listener}), timeout=1)\n" + good,
        "print('z' * 10 ** 8)\n" + good,
    ]
    comps = [f"```python\n{c}```" for c in [good, *hostile]]
    rew = sandbox_reward(comps, tests)
    assert rew == [1.0] + [0.0] * len(hostile)


def sandbox_reward(comps, tests):
    from tiltlab.llm.rewards import make_code_reward

    fn = make_code_reward(SandboxConfig(timeout_s=2.0, memory_mb=256, max_output_bytes=1 << 16, max_file_mb=0.1))
    return fn(None, comps, tests=[tests] * len(comps))


def test_run_many_order():
    res = run_many([f"print({i})" for i in range(5)], FAST, max_workers=2)
    assert [r.stdout.strip() for r in res] == [str(i) for i in range(5)]


def test_default_code_reward_runs():
    assert code_reward(None, ["def f(x):\n    return x"], tests=["assert f(3) == 3"]) == [1.0]


def test_config_validation():
    with pytest.raises(ValueError, match="timeout_s"):
        SandboxConfig(timeout_s=0)
    with pytest.raises(ValueError, match="memory_mb"):
        SandboxConfig(memory_mb=1)
    with pytest.raises(ValueError, match="code must be a str"):
        run_python(b"print(1)")


def test_warns_and_still_blocks_without_namespaces(monkeypatch):
    monkeypatch.setattr(sandbox, "_unshare_prefix", lambda net, pids: None)
    monkeypatch.setattr(sandbox, "_warned", set())
    with pytest.warns(SandboxWarning) as rec:
        r = run_python("import socket\nsocket.socket()", FAST)
    assert any("network namespaces are unavailable" in str(w.message) for w in rec)
    assert r.status == "blocked"
    assert r.isolation["network_namespace"] is False
