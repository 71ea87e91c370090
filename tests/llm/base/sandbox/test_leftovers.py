"""Nothing of a run is left behind, even when the trainer is SIGKILLed with runs in flight: its host folders
(``tiltlab-judge-*``, ``tiltlab-sbx-*``) are named after their owner and swept by the next process's first run,
and its processes (the candidate's sandbox, the judge server and its judges) die with it.

Every test here works in a private TMPDIR, so that concurrent tests' folders are not in the way.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

if not sys.platform.startswith("linux"):
    pytest.skip("the sandbox targets Linux", allow_module_level=True)

import tiltlab
from tiltlab.llm.base.sandbox import SandboxConfig

REPO = os.path.dirname(os.path.dirname(os.path.abspath(tiltlab.__file__)))  # the checkout under test
DEADLINE_S = 120.0  # generous: polled, never asserted as a duration


def _stat(pid: int) -> tuple[int, int, int] | None:
    """(ppid, start time, uid) of a live process, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[1]), int(fields[19]), os.stat(f"/proc/{pid}").st_uid
    except (OSError, ValueError, IndexError):
        return None


def _procs() -> dict[int, tuple[int, int, int]]:
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st is not None:
                out[int(name)] = st
    return out


def _tree(root: int) -> dict[int, int]:
    """pid -> start time of ``root``'s descendants."""
    procs = _procs()
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _s, _u) in procs.items():
        kids.setdefault(ppid, []).append(pid)
    out, todo = {}, [root]
    while todo:
        for k in kids.get(todo.pop(), ()):
            out[k] = procs[k][1]
            todo.append(k)
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def _env(tmp) -> dict:
    return {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}


# ---------------------------------------------------------------------------------------------
# the sweep
# ---------------------------------------------------------------------------------------------


def test_the_sweep_removes_exactly_the_folders_whose_owner_is_gone(tmp_path):
    from tiltlab.llm.base.sandbox import leftovers

    gone = subprocess.Popen(["sleep", "60"])
    start = _stat(gone.pid)[1]
    gone.kill()
    gone.wait()
    ns, boot = leftovers._HOST
    parent = os.getppid()
    mine = leftovers.owner_tag()
    names = {
        f"tiltlab-judge-{gone.pid}.{start}.{ns}.{boot}-a": False,  # owner exited
        f"tiltlab-sbx-{gone.pid}.{start}.{ns}.{boot}-b": False,
        f"tiltlab-judge-{parent}.{_stat(parent)[1] + 1}.{ns}.{boot}-c": False,  # the pid now another process's
        f"tiltlab-judge-{parent}.{_stat(parent)[1]}.{ns}.{boot}-d": True,  # owner alive
        f"tiltlab-judge-{mine}-e": True,  # this process's own
        f"tiltlab-judge-{gone.pid}.{start}.{ns + 1}.{boot}-f": True,  # another pid namespace: owner unseen
        f"tiltlab-judge-{gone.pid}.{start}.{ns}.{'0' * 8 if boot != '0' * 8 else '1' * 8}-g": True,  # another boot
        "tiltlab-judge-h": True,  # no owner in the name
        "other-i": True,
    }
    for n in names:
        os.mkdir(tmp_path / n)
        (tmp_path / n / "f").write_text("x")
    # a stale name that is no folder (rmtree fails on it): the sweep goes on, and leaves it
    odd = f"tiltlab-judge-{gone.pid}.{start}.{ns}.{boot}-z"
    (tmp_path / odd).write_text("not a folder")
    names[odd] = True
    removed = leftovers.sweep(str(tmp_path))
    assert sorted(os.path.basename(p) for p in removed) == sorted(n for n, keep in names.items() if not keep)
    assert sorted(os.listdir(tmp_path)) == sorted(n for n, keep in names.items() if keep)


def test_a_run_folder_names_its_owner(tmp_path, monkeypatch):
    from tiltlab.llm.base.sandbox import leftovers

    monkeypatch.setattr(leftovers.tempfile, "tempdir", str(tmp_path))
    with leftovers.tempdir("tiltlab-judge-") as d:
        owner = leftovers.owner_of(os.path.basename(d))
        assert owner is not None and owner[:2] == (os.getpid(), _stat(os.getpid())[1])
        assert owner[2:] == leftovers._HOST and os.path.dirname(d) == str(tmp_path)
    assert not os.path.exists(d)


def test_a_process_sweeps_at_its_first_run_then_at_most_every_sweep_every_s(tmp_path, monkeypatch):
    from tiltlab.llm.base.sandbox import leftovers

    swept = []
    monkeypatch.setattr(leftovers.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(leftovers, "sweep", lambda folder=None: swept.append(folder) or [])
    monkeypatch.setattr(leftovers, "_last", {})
    monkeypatch.setattr(leftovers, "SWEEP_EVERY_S", 3600.0)
    for _ in range(3):
        leftovers.mkdtemp("tiltlab-judge-")
    assert swept == [str(tmp_path)]  # the first run only
    leftovers._last[str(tmp_path)] = (os.getpid() + 1, leftovers._last[str(tmp_path)][1])  # as after a fork
    leftovers.mkdtemp("tiltlab-sbx-")
    monkeypatch.setattr(leftovers, "SWEEP_EVERY_S", 0.0)
    leftovers.mkdtemp("tiltlab-sbx-")
    assert swept == [str(tmp_path)] * 3


# ---------------------------------------------------------------------------------------------
# a trainer SIGKILLed mid-batch
# ---------------------------------------------------------------------------------------------

TRAINER = textwrap.dedent("""
    import sys
    from tiltlab.llm.base.rewards import make_code_reward
    from tiltlab.llm.base.sandbox import SandboxConfig
    backend = sys.argv[1]
    cfg = SandboxConfig(timeout_s=120.0, memory_mb=256, backend=backend)
    sleeps = "```python\\nimport time\\ndef f(x):\\n    time.sleep(600)\\n    return x\\n```"
    quick = "```python\\ndef f(x):\\n    return x\\n```"
    # two candidates that sleep through the batch (their judges wait), two judges that spin in the tests
    comps = [sleeps, quick, sleeps, quick]
    tests = ["assert f(1) == 1\\n", "assert f(1) == 1\\nwhile True:\\n    pass\\n"] * 2
    make_code_reward(cfg, max_workers=4)(None, comps, tests=tests, entry_point=["f"] * 4)
    print("the batch ended", flush=True)
    """)

NEXT = textwrap.dedent("""
    import sys
    from tiltlab.llm.base.rewards import make_code_reward
    from tiltlab.llm.base.sandbox import SandboxConfig
    cfg = SandboxConfig(timeout_s=10.0, memory_mb=256, backend=sys.argv[1])
    r = make_code_reward(cfg)(None, ["```python\\ndef f(x):\\n    return x + 1\\n```"], tests=["assert f(1) == 2\\n"],
                              entry_point=["f"])
    assert r == [1.0], r
    """)


def _runs(tmp, prefix: str = "tiltlab-") -> list[str]:
    """The run folders in the private TMPDIR (any name, owner-named or not: only the trainer writes there
    before it is killed, and the next call's own folders are gone when it returns)."""
    return [n for n in os.listdir(tmp) if n.startswith(prefix) and n.split("-")[1] in ("judge", "sbx")]


@pytest.mark.parametrize("backend", ["auto", "legacy"])
def test_a_trainer_killed_mid_batch_leaves_nothing_after_the_next_reward_call(tmp_path, backend):
    """A real SIGKILL of a process whose four runs are in flight (found by polling for their folders and the
    served judges, not by sleeping); then one reward call in a fresh process; then no folder of the dead pid,
    no process of its tree, no process or kernel key of its uid slots."""
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, backend],
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    seen: dict[int, int] = {}
    deadline = time.monotonic() + DEADLINE_S
    try:
        while True:
            assert trainer.poll() is None, trainer.communicate()
            seen.update(_tree(trainer.pid))
            servers = [p for p in seen if "judge_server.py" in _cmdline(p)]
            judges = [p for p in seen if _stat(p) is not None and _stat(p)[0] in servers]
            sandboxes = [p for p in seen if _stat(p) is not None and "boot.py" in _cmdline(p)]
            folders = _runs(tmp_path, "tiltlab-judge-")
            if len(folders) == 4 and len(judges) >= 4 and len(sandboxes) >= 4:
                break
            assert time.monotonic() < deadline, ("the runs never were all in flight", folders, seen)
            time.sleep(0.05)
        seen.update(_tree(trainer.pid))
        if backend == "legacy":
            assert len(_runs(tmp_path, "tiltlab-sbx-")) == 4
        os.kill(trainer.pid, signal.SIGKILL)
        trainer.wait()
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()
    dead = trainer.pid
    assert _runs(tmp_path), "the killed trainer's folders were expected to be there until the next call"
    subprocess.run(
        [sys.executable, "-c", NEXT, backend], env=_env(tmp_path), check=True, timeout=DEADLINE_S, capture_output=True
    )
    cfg = SandboxConfig()
    slots = range(cfg.uid_base + 256 * (dead % 4096), cfg.uid_base + 256 * (dead % 4096) + 256)
    left = None
    deadline = time.monotonic() + DEADLINE_S
    while True:
        procs = _procs()
        left = {
            "folders": _runs(tmp_path),
            "processes": sorted(p for p, s in seen.items() if p in procs and procs[p][1] == s),
            "slot processes": sorted(p for p, (_pp, _s, uid) in procs.items() if uid in slots),
            "slot keys": [
                ln for ln in Path("/proc/key-users").read_text().splitlines() if int(ln.split(":")[0]) in slots
            ],
        }
        if not any(left.values()):
            break
        assert time.monotonic() < deadline, (left, {p: _cmdline(p) for p in left["processes"]})
        time.sleep(0.1)
    assert not os.listdir(tmp_path), os.listdir(tmp_path)  # nothing else either
