"""llm.base.sandbox's judge server: a judge forked from one pre-started interpreter is judged exactly as a
judge started as its own interpreter (``SandboxConfig(judge_server=False)``, the reference path).

Each case runs through both paths and must give the same (status, verdict) as written in the case;
the arm is checked to be what its label says (the judge's parent is the server, or is not).
"""

import contextlib
import multiprocessing
import os
import select
import signal
import socket
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

if not sys.platform.startswith("linux"):
    pytest.skip("the sandbox targets Linux", allow_module_level=True)

from tiltlab.llm.base.sandbox import SandboxConfig, probe, run_judged, run_many_judged, server

pytestmark = pytest.mark.filterwarnings("ignore::tiltlab.llm.base.sandbox.SandboxWarning")
SERVED = SandboxConfig(timeout_s=3.0, memory_mb=256, judge_server=True)
OWN = SandboxConfig(timeout_s=3.0, memory_mb=256, judge_server=False)
ARMS = pytest.mark.parametrize("cfg", [SERVED, OWN], ids=["served", "own"])

ADD = "def f(x):\n    return x + 1\n"
#: (name, code, tests, stdio, entry_point) -> (status, verdict): one per way a judged run can end
CASES = {
    "passes": (ADD, "assert f(1) == 2\nassert f(-1) == 0\n", False, "f", ("ok", True)),
    "assertion_fails": (ADD, "assert f(1) == 3\n", False, "f", ("failed", False)),
    "candidate_raises": ("def f(x):\n    raise ValueError(x)\n", "assert f(1) == 2\n", False, "f", ("failed", False)),
    "expected_raise": ("def f(x):\n    raise ValueError(x)\n", textwrap.dedent("""
        try:
            f(1)
        except ValueError:
            pass
        else:
            raise AssertionError
        """), False, "f", ("ok", True)),
    "syntax_error": ("def f(x)\n    return x\n", "assert f(1) == 1\n", False, "f", ("error", False)),
    "missing_entry": ("def g(x):\n    return x + 1\n", "assert f(1) == 2\n", False, "f", ("failed", False)),
    "tests_loop": (ADD, "while True:\n    pass\n", False, "f", ("timeout", False)),
    "tests_exit_0": (ADD, "import sys\nsys.exit(0)\n", False, "f", ("failed", False)),
    "tests_memory": (ADD, "x = bytearray(1 << 30)\n", False, "f", ("failed", False)),
    "module_binding": ("import math\ndef f(x):\n    return math.sqrt(x)\n", "assert math.isclose(f(4), 2)\n", False, "f",
                       ("ok", True)),
    # the judge's process as Popen(start_new_session=True, cwd=its folder, env=_env(its folder)) made it
    "own_process": (ADD, textwrap.dedent("""
        import os
        assert os.getsid(0) == os.getpid()
        assert os.path.basename(os.getcwd()).startswith("tiltlab-judge-")
        assert sorted(os.environ) == sorted(["PATH", "HOME", "LANG", "TMPDIR", "OMP_NUM_THREADS",
                                             "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"]), sorted(os.environ)
        assert os.environ["HOME"] == os.environ["TMPDIR"] == os.getcwd()
        assert f(1) == 2
        """), False, "f", ("ok", True)),
    "stdio_right": ("a, b = map(int, input().split())\nprint(a + b)\n", "assert __stdio__('1 2\\n').split() == ['3']\n",
                    True, None, ("ok", True)),
    "stdio_wrong": ("a, b = map(int, input().split())\nprint(a - b)\n", "assert __stdio__('1 2\\n').split() == ['3']\n",
                    True, None, ("failed", False)),
}  # fmt: skip


@ARMS
@pytest.mark.parametrize("name", list(CASES))
def test_every_ending_is_judged_the_same_by_both_paths(cfg, name):
    code, tests, stdio, entry, want = CASES[name]
    r = run_judged(code, tests, cfg, stdio=stdio, entry_point=entry)
    assert (r.status, r.passed) == want, (name, r.status, r.judge_stderr[-400:])


def _server_pid() -> int:
    server._JudgeServer.get()
    cur = server._JudgeServer._current
    assert cur is not None
    return cur.proc.pid


@pytest.mark.parametrize("served", [True, False])
def test_the_arm_is_what_its_label_says(served):
    """The judge's parent is the server exactly when ``judge_server=True``."""
    zpid = _server_pid()
    tests = f"import os\nassert os.getppid() == {zpid}\n"
    r = run_judged(ADD, tests, SERVED if served else OWN, entry_point="f")
    assert r.passed is served, r.judge_stderr[-400:]


@ARMS
def test_the_judge_holds_only_its_own_descriptors(cfg):
    """0-2 and the three pipes to the candidate and the parent: no server socket, no other run's pipes
    (four runs at once, so other runs' descriptors exist while each judge looks)."""
    tests = textwrap.dedent("""
        import os, time
        fds = sorted(int(n) for n in os.listdir("/proc/self/fd"))
        fds = [fd for fd in fds if os.path.exists(f"/proc/self/fd/{fd}")]  # the listing's own descriptor is gone
        assert len(fds) == 6, fds
        assert f(1) == 2
        """)
    res = run_many_judged([(ADD, tests, False, "f")] * 4, cfg, max_workers=4)
    assert [r.passed for r in res] == [True] * 4, [r.judge_stderr[-300:] for r in res]


def test_a_judge_killed_at_the_time_limit_is_gone_when_the_run_returns(monkeypatch):
    codes = []
    wait = server._ServedJudge.wait

    def spy(self, timeout=None):
        codes.append(wait(self, timeout))
        return codes[-1]

    monkeypatch.setattr(server._ServedJudge, "wait", spy)
    tests = "import os, sys\nprint('pid', os.getpid(), file=sys.stderr, flush=True)\nwhile True:\n    pass\n"
    r = run_judged(ADD, tests, SandboxConfig(timeout_s=1.0, memory_mb=256, judge_server=True), entry_point="f")
    assert r.status == "timeout" and not r.passed, (r.status, r.judge_stderr[-300:])
    assert codes == [-signal.SIGKILL]  # killed through its pidfd at the limit, not by its own CPU limit later
    pid = int(r.judge_stderr.split("pid ", 1)[1].split()[0])
    # killed and reaped before run_judged returned (a process that took the pid since is not the server's)
    assert not os.path.exists(f"/proc/{pid}") or _ppid(pid) != _server_pid()


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError):
        return None


def test_a_dead_server_is_replaced():
    first = _server_pid()
    os.kill(first, signal.SIGKILL)
    server._JudgeServer._current.proc.wait()
    r = run_judged(ADD, "assert f(1) == 2\n", SERVED, entry_point="f")
    assert r.passed, r.judge_stderr[-400:]
    assert _server_pid() != first


def test_a_judge_whose_server_died_is_judged_failed_and_the_next_run_gets_a_new_server():
    """Its exit status is lost with the server: the run is not paid on the verdict byte alone."""
    first = _server_pid()
    tests = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nassert f(1) == 2\n"
    r = run_judged(ADD, tests, SERVED, entry_point="f")
    assert not r.passed and r.status == "failed", (r.status, r.judge_stderr[-300:])
    again = run_judged(ADD, "assert f(1) == 2\n", SERVED, entry_point="f")
    assert again.passed and _server_pid() != first


def test_a_server_that_cannot_start_judges_falls_back_with_a_warning(monkeypatch):
    def broken(self, fds):
        raise OSError("no judge")

    monkeypatch.setattr(server._JudgeServer, "spawn", broken)
    monkeypatch.setattr(probe, "_warned", set())
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        r = run_judged(ADD, "import os\nassert f(1) == 2\n", SERVED, entry_point="f")
        bad = run_judged(ADD, "assert f(1) == 3\n", SERVED, entry_point="f")
    assert r.passed and not bad.passed
    assert [str(w.message) for w in seen if "judge server failed" in str(w.message)] == [
        "sandbox: the judge server failed (no judge); starting each judge as its own interpreter"
    ]


def _child_server(q):
    cur = server._JudgeServer.get()
    q.put((cur.owner == os.getpid(), cur.proc.pid))


def test_a_forked_process_starts_its_own_server():
    parent = _server_pid()
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child_server, args=(q,))
    p.start()
    owned, child_server = q.get(timeout=120)
    p.join(timeout=120)
    assert owned and child_server != parent and p.exitcode == 0


def test_the_server_exits_when_its_process_does():
    code = "from tiltlab.llm.base.sandbox import server; print(server._JudgeServer.get().proc.pid, flush=True)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    zpid = int(out.stdout.split()[-1])
    try:
        fd = os.pidfd_open(zpid)
    except ProcessLookupError:
        return  # already gone
    try:
        ready, _, _ = select.select([fd], [], [], 60)
        assert ready, f"the judge server {zpid} outlived its process"
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------
# killing a served judge: through its pidfd, never by its pid number
# ---------------------------------------------------------------------------------------------


def _reaped_pidfd() -> int:
    """A pidfd of a process that has exited and been reaped: what a served judge's pidfd refers to once the
    server reaped it (the pid number is then free for the system to give to any new process)."""
    gone = subprocess.Popen(["true"])
    fd = os.pidfd_open(gone.pid)
    gone.wait()
    return fd


def test_a_served_judge_is_killed_and_waited_on_through_its_pidfd_never_its_pid_number():
    """The pid-reuse race made deterministic: the served judge's process is gone (reaped by the server) and its
    pid number now belongs to another process, the decoy (a new session leader, as a judge is). The caller is
    not the judge's parent, so only the pidfd names the judge for sure: killing the judge (at the time limit,
    in ``run_judged``'s cleanup, or when the server went away before reporting) must leave the decoy alive,
    and waiting for it must end at once (its pidfd is readable), not when the decoy exits.
    Killing by ``os.kill(judge.pid)`` / ``os.killpg(judge.pid)``, or waiting on ``pidfd_open(judge.pid)``,
    would hit the decoy."""
    from tiltlab.llm.base.sandbox import clock, runner

    decoy = subprocess.Popen(["sleep", "60"], start_new_session=True)
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    judge = server._ServedJudge(decoy.pid, _reaped_pidfd(), mine)
    try:
        server._kill_judge(judge)  # run_judged: at the time limit and in its cleanup
        judge.kill()
        # its pidfd is readable: the wait ends as an exit (False); a wait on the decoy would run out its
        # clock and find the judge still running (True)
        assert runner._wait(judge, clock._RunDeadline(5.0, 5.0), []) is False
        theirs.close()  # the server went away before reporting the exit status: the judge is killed
        assert judge.poll() == -signal.SIGKILL
        with pytest.raises(subprocess.TimeoutExpired):
            decoy.wait(timeout=0.5)
        assert decoy.poll() is None  # the process that took the judge's pid number lives on
    finally:
        judge.close()
        decoy.kill()
        decoy.wait()


def test_a_live_served_judge_is_killed_through_its_pidfd(monkeypatch):
    """The positive half, as a spy (the race itself is not reproducible with a live judge): the kill of a live
    served judge is ``pidfd_send_signal`` on its pidfd, and its process is gone afterwards."""
    sent, killed = [], []
    real = signal.pidfd_send_signal
    monkeypatch.setattr(signal, "pidfd_send_signal", lambda fd, sig, *a: (sent.append((fd, sig)), real(fd, sig, *a)))
    monkeypatch.setattr(os, "kill", lambda pid, sig: killed.append(pid))
    monkeypatch.setattr(os, "killpg", lambda pid, sig: killed.append(pid))
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    child = subprocess.Popen(["sleep", "60"], start_new_session=True)
    judge = server._ServedJudge(child.pid, os.pidfd_open(child.pid), mine)
    try:
        server._kill_judge(judge)
        assert child.wait(timeout=10) == -signal.SIGKILL
        assert sent == [(judge.pidfd, signal.SIGKILL)] and killed == []
    finally:
        monkeypatch.undo()
        judge.close()
        theirs.close()
        with contextlib.suppress(ProcessLookupError):
            child.kill()
        child.wait()


# ---------------------------------------------------------------------------------------------
# descriptors: a run leaves none behind, in the server or in the caller
# ---------------------------------------------------------------------------------------------


def _fds(pid: int | str = "self") -> list[str]:
    """What the descriptors of ``pid`` refer to (``pipe:[...]``, ``socket:[...]``, ``anon_inode:[pidfd]``...)."""
    out = []
    for n in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            out.append(os.readlink(f"/proc/{pid}/fd/{n}"))
    return out


def _settled(count, want: int, bound_s: float = 5.0) -> int:
    """``count()`` once it is at most ``want``, or its last value after ``bound_s``: the server closes a run's
    reply socket just after it sent the exit status the run returned on, so its count may lag by a moment
    (a leak never closes: one more descriptor per run, for good)."""
    end = time.monotonic() + bound_s
    while (n := count()) > want and time.monotonic() < end:
        time.sleep(0.05)
    return n


def _low(count, window_s: float = 0.5) -> int:
    """The least of ``count()`` over ``window_s`` (a reply socket the server is about to close not counted)."""
    end, low = time.monotonic() + window_s, count()
    while time.monotonic() < end:
        time.sleep(0.05)
        low = min(low, count())
    return low


@ARMS
def test_runs_leave_no_descriptor_behind_in_the_server_or_the_caller(cfg):
    """Five runs, one at a time: the caller's descriptors, and the judge server's, and the server's pipes (each
    run sends it five, its config pipe first, all closed once the judge is forked), are the same after the
    fifth run as after the first. A descriptor kept per run (the config pipe ``jb_r`` in the caller, or
    ``fds[1]`` in the server after the fork) shows as one more per run."""
    zpid = _server_pid()

    def served():
        return len(_fds(zpid))

    def pipes():
        return sum(t.startswith("pipe:") for t in _fds(zpid))

    def own():
        return len(_fds())

    counts = []
    for _ in range(5):
        r = run_judged(ADD, "assert f(1) == 2\n", cfg, entry_point="f")
        assert r.passed, r.judge_stderr[-400:]
        if not counts:
            counts.append((_low(own), _low(served), pipes()))
    want = counts[0]
    last = (_settled(own, want[0]), _settled(served, want[1]), pipes())
    assert _server_pid() == zpid  # the same server throughout
    assert want[2] == 0, _fds(zpid)
    # at most the first run's counts (a baseline taken while a reply socket was still closing is higher
    # than the steady count, never lower); a descriptor kept per run adds four over runs 2-5
    assert all(n <= w for n, w in zip(last, want)), (want, last, _fds(zpid))


# ---------------------------------------------------------------------------------------------
# the hash secret: sets cross in an order free of it; a server forks at most JUDGES_PER_SERVER judges
# ---------------------------------------------------------------------------------------------

#: the candidate reads the raw request its server loop decoded (the encoded arguments, in wire order)
WIRE_SPY = textwrap.dedent("""
    import sys
    def f(*a):
        fr = sys._getframe(1)
        while "req" not in fr.f_locals:
            fr = fr.f_back
        return fr.f_locals["req"]["args"]
    """)
WIRE_TESTS = textwrap.dedent("""
    import json, sys
    S = {"w%d" % i for i in range(40)}
    M = frozenset([("t", 1), b"x", frozenset({"a", "b", "c"}), "s", 2, None, 2.5, ("u", ("v",))])
    wire = f(S, M)
    print("WIRE", json.dumps(wire), file=sys.stderr)
    print("MINE", json.dumps(list(S)), file=sys.stderr)
    assert wire[0] == {"s": sorted(S)}, wire[0]
    """)


@ARMS
def test_a_set_crosses_in_an_order_the_hash_secret_does_not_change(cfg, monkeypatch):
    """Two judges with different hash secrets (the second server is a new interpreter) iterate the same set
    of str in different orders; the candidate sees the same encoding from both, so it cannot learn the
    judge's order (and, with it, the secret) from a set argument."""
    monkeypatch.setattr(server, "JUDGES_PER_SERVER", 1, raising=False)
    runs = [run_judged(WIRE_SPY, WIRE_TESTS, cfg, entry_point="f") for _ in range(2)]
    assert [r.passed for r in runs] == [True, True], [r.judge_stderr[-600:] for r in runs]
    mine, wire = ([r.judge_stderr.split(k + " ", 1)[1].split("\n", 1)[0] for r in runs] for k in ("MINE", "WIRE"))
    assert mine[0] != mine[1]  # the two judges' secrets differ (40 items: equal orders are all but impossible)
    assert wire[0] == wire[1]


def _hashes(runs) -> list[tuple[int, int]]:
    out = []
    for r in runs:
        assert r.passed, r.judge_stderr[-400:]
        ppid, h = r.judge_stderr.split("H ", 1)[1].split()[:2]
        out.append((int(ppid), int(h)))
    return out


def test_a_server_forks_at_most_judges_per_server_judges_then_a_new_secret_serves(monkeypatch):
    """After JUDGES_PER_SERVER judges a fresh server (a new hash secret) takes the next runs; the retired
    one finishes the judges it has (runs in flight across a retirement pass) and then exits."""
    monkeypatch.setattr(server, "JUDGES_PER_SERVER", 2, raising=False)
    tests = "import os, sys\nprint('H', os.getppid(), hash('tiltlab'), file=sys.stderr)\nassert f(1) == 2\n"
    seq = _hashes([run_judged(ADD, tests, SERVED, entry_point="f") for _ in range(5)])
    par = _hashes(run_many_judged([(ADD, tests, False, "f")] * 8, SERVED, max_workers=3))
    by_server: dict[int, set[int]] = {}
    for zpid, h in seq + par:
        by_server.setdefault(zpid, set()).add(h)
    assert all(len(hs) == 1 for hs in by_server.values())  # one secret per server
    assert len({h for hs in by_server.values() for h in hs}) == len(by_server)  # a new one for each server
    served = [z for z, _h in seq + par]
    assert max(served.count(z) for z in by_server) <= 2 and len(by_server) >= 7  # 13 judges, 2 a server
    current = _server_pid()
    for zpid in by_server:
        if zpid == current:
            continue
        try:
            fd = os.pidfd_open(zpid)
        except ProcessLookupError:
            continue
        try:
            ready, _, _ = select.select([fd], [], [], 60)
            assert ready, f"the retired judge server {zpid} did not exit"
        finally:
            os.close(fd)


def test_a_forked_process_never_retires_its_parents_server(monkeypatch):
    """A process forked from one that holds a server starts its own; it never retires (nor asks anything of)
    the parent's, even when that one is due for retirement."""
    monkeypatch.setattr(server, "JUDGES_PER_SERVER", 1, raising=False)
    parent = server._JudgeServer.get()  # one judge asked for: due for retirement at the next get()
    pid = os.fork()
    if pid == 0:  # the child: its own server, and the parent's copy untouched
        code = 1
        try:
            mine = server._JudgeServer.get()
            code = 0 if (mine is not parent and not parent.retired and mine.owner == os.getpid()) else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert not parent.retired and parent.proc.poll() is None  # the parent's server still serves the parent


def test_dropping_a_retired_server_keeps_the_current_one(monkeypatch):
    """``drop(cur)`` forgets the server only while it is still the current one: a run whose server failed
    after a rotation never drops (nor kills) its successor."""
    monkeypatch.setattr(server, "JUDGES_PER_SERVER", 1, raising=False)
    old = server._JudgeServer.get()
    new = server._JudgeServer.get()  # ``old`` is due: retired, ``new`` takes the next runs
    assert new is not old and old.retired
    server._JudgeServer.drop(old)
    assert server._JudgeServer._current is new and new.proc.poll() is None
    server._JudgeServer.drop(new)
    assert server._JudgeServer._current is None
