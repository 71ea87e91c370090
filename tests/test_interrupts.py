"""Ctrl-C and SIGTERM with real signals (:mod:`tiltlab.interrupts`): each command runs as a real process in its
own process group (as a shell runs it), is sent the signal once it is demonstrably working (a progress line, its
staging folder, its worker processes), and must exit with 130 (SIGINT) or 143 (SIGTERM) and the one line
``tiltlab CMD: interrupted``, no traceback, no process of its group left, no staging folder left, and the
output folder of an earlier run as it was. The stop latency (signal to exit) is printed and recorded as the
test's ``stop_latency_s`` property; the timeouts here are hang guards, not the requirement (2 s)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process table in /proc")

#: seconds a command may take to reach its working state, and to exit after the signal (hang guards)
READY_S, EXIT_S = 180.0, 60.0


def _group(pgid: int) -> list[int]:
    """The processes of process group ``pgid`` that still run (zombies excluded), from /proc."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            raw = Path(f"/proc/{name}/stat").read_bytes()
        except OSError:
            continue
        fields = raw[raw.rindex(b")") + 2 :].split()  # state, ppid, pgrp, ...
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            found.append(int(name))
    return found


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


class Run:
    """A ``tiltlab`` process started in its own session (so its own process group), its output in files."""

    def __init__(self, tmp_path: Path, args: list[str], argv0: list[str] | None = None):
        self.err_path, self.out_path = tmp_path / "stderr.txt", tmp_path / "stdout.txt"
        self.tmpdir = tmp_path / "tmpdir"
        self.tmpdir.mkdir()
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "OMP_NUM_THREADS": "1",
            "TILTLAB_PROGRESS": "lines",
            "TILTLAB_PROGRESS_INTERVAL": "0",
            "TMPDIR": str(self.tmpdir),  # where the check pool's run cache goes
        }
        cmd = [sys.executable, *(argv0 or ["-m", "tiltlab.cli"]), *args]
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=out, stderr=err, start_new_session=True)

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def wait_until(self, ready, what: str) -> None:
        """Poll ``ready()`` until it holds (the command is working); fail when the process ends first."""
        deadline = time.monotonic() + READY_S
        while not ready():
            assert self.proc.poll() is None, f"ended ({self.proc.returncode}) before {what}:\n{self.stderr()[-3000:]}"
            assert time.monotonic() < deadline, f"not {what} after {READY_S} s:\n{self.stderr()[-3000:]}"
            time.sleep(0.05)

    def signal(self, sigs: list[signal.Signals], group: bool = True, between: float = 0.1) -> float:
        """Send ``sigs`` (``between`` seconds apart) to the process group, or to the main process only;
        returns the seconds from the first signal to the process's exit."""
        t0 = time.monotonic()
        for i, sig in enumerate(sigs):
            if i:
                time.sleep(between)
            (os.killpg if group else os.kill)(self.proc.pid, sig)
        try:
            self.proc.wait(timeout=EXIT_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            pytest.fail(f"still running {EXIT_S} s after {[s.name for s in sigs]}:\n{self.stderr()[-3000:]}")
        return time.monotonic() - t0

    def assert_interrupted(self, command: str, status: int) -> None:
        err = self.stderr()
        assert self.proc.returncode == status, err[-3000:]
        assert "Traceback" not in err, err[-3000:]
        lines = err.strip().splitlines()
        assert lines[-1] == f"{command}: interrupted", err[-3000:]
        assert sum("interrupted" in ln for ln in lines) == 1  # one line, not one per signal
        time.sleep(0.2)  # an orphan the kernel is still tearing down
        assert _group(self.proc.pid) == []  # no worker, engine or subprocess left


def _partials(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".partial-" in p.name or ".tmp-" in p.name)


def _record(record_property, command: str, how: str, seconds: float) -> None:
    record_property("stop_latency_s", round(seconds, 3))
    print(f"stop latency: {command}, {how}: {seconds:.3f} s")


#: (name, signals sent, to the group?, exit status)
SIGNALS = [
    ("SIGINT", [signal.SIGINT], True, 130),
    ("SIGTERM", [signal.SIGTERM], True, 143),
    ("double SIGINT", [signal.SIGINT, signal.SIGINT], True, 130),
]


@pytest.mark.parametrize(("how", "sigs", "group", "status"), SIGNALS, ids=[s[0] for s in SIGNALS])
def test_figures_stops_and_keeps_the_earlier_figures(tmp_path, record_property, how, sigs, group, status):
    out = tmp_path / "figs"
    out.mkdir()
    (out / "index.json").write_text(json.dumps({"quick": True, "seconds": 1.0, "figures": [{"id": "fig02_m_study"}]}))
    (out / "fig02_m_study.png").write_bytes(b"an earlier run's figure")
    before = _snapshot(out)
    # fig02 (about 2 s) is made, then the signal comes during fig09 (about 10 s)
    run = Run(tmp_path, ["figures", "--quick", "--only", "fig02", "fig09", "--out", str(out)])
    run.wait_until(lambda: "[figures] fig02_m_study" in run.stderr() and _partials(tmp_path), "making fig09")
    seconds = run.signal(sigs, group)
    run.assert_interrupted("tiltlab figures", status)
    assert _snapshot(out) == before  # fig02 was complete, but nothing moves into place before the run is
    assert _partials(tmp_path) == []
    _record(record_property, "figures", how, seconds)


CHECK_SIGNALS = [*SIGNALS, ("SIGTERM to the main process", [signal.SIGTERM], False, 143)]


@pytest.mark.parametrize(("how", "sigs", "group", "status"), CHECK_SIGNALS, ids=[s[0] for s in CHECK_SIGNALS])
def test_check_stops_its_worker_pool(tmp_path, record_property, how, sigs, group, status):
    out = tmp_path / "results" / "claims.json"
    out.parent.mkdir()
    out.write_text(json.dumps({"checks": [], "note": "an earlier record"}))
    before = _snapshot(out.parent)
    run = Run(tmp_path, ["check", "--only", "theory", "--jobs", "2", "--out", str(out)])
    # two forked workers run checks (a line per finished check)
    run.wait_until(lambda: "checks: 1/" in run.stderr() and len(_group(run.proc.pid)) >= 3, "running checks")
    seconds = run.signal(sigs, group)  # to the main process only: it stops the workers itself
    run.assert_interrupted("tiltlab check", status)
    assert _snapshot(out.parent) == before
    assert not list(run.tmpdir.glob("tiltlab-run-cache-*"))  # the workers' shared run cache is removed
    _record(record_property, "check", how, seconds)


@pytest.mark.parametrize(("how", "sigs", "group", "status"), SIGNALS, ids=[s[0] for s in SIGNALS])
def test_reproduce_quick_stops_its_figure_worker(tmp_path, record_property, how, sigs, group, status):
    """The issue's case: the figures in a worker process while the checks run; Ctrl-C stops both at once,
    removes the staging folder and leaves the earlier outputs."""
    out = tmp_path / "quick"
    (out / "figures").mkdir(parents=True)
    (out / "REPORT.md").write_text("an earlier report\n")
    (out / "figures" / "fig01_lad_bandit.png").write_bytes(b"an earlier figure")
    before = _snapshot(out)
    run = Run(tmp_path, ["reproduce", "--quick", "--jobs", "2", "--out", str(out)])
    run.wait_until(
        lambda: "checks: 1/" in run.stderr() and _partials(tmp_path) and len(_group(run.proc.pid)) >= 2,
        "running checks with the figure worker",
    )
    seconds = run.signal(sigs, group)
    run.assert_interrupted("tiltlab reproduce", status)
    assert _snapshot(out) == before
    assert _partials(tmp_path) == []
    _record(record_property, "reproduce --quick", how, seconds)


# --------------------------------------------------------------------------- a second signal, a stuck exit

#: a command whose cleanup never ends (``slow_cleanup``), that leaves a thread the interpreter's exit waits on
#: for ever (``stuck_thread``), or that starts a process ignoring SIGTERM in a session of its own, out of reach
#: of a signal to the command's group (``stubborn_child``), added to the console command's table
SCRIPT = """
import subprocess, sys, threading, time, types
from pathlib import Path
from tiltlab import cli, files

CHILD = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(600)"

def run(args):
    with files.staging_dir(args.out) as tmp:
        (tmp / "half.txt").write_text("half of an output")
        if args.mode == "stuck_thread":
            threading.Thread(target=threading.Event().wait).start()
        if args.mode == "stubborn_child":
            child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, start_new_session=True)
            child.stdout.readline()
            print(f"child {child.pid}", file=sys.stderr, flush=True)
        try:
            print("working", file=sys.stderr, flush=True)
            time.sleep(600)
        finally:
            if args.mode == "slow_cleanup":
                print("cleaning up", file=sys.stderr, flush=True)
                time.sleep(600)
    return 0

def register(sub):
    p = sub.add_parser("stopme")
    p.add_argument("--out", type=Path)
    p.add_argument("--mode", choices=["slow_cleanup", "stuck_thread", "stubborn_child"])
    p.set_defaults(func=run)

cli.COMMANDS["stopme"] = (lambda: types.SimpleNamespace(register=register), "a test command")
if "--as-library" not in sys.argv:
    sys.argv = ["tiltlab", *sys.argv[1:]]
    sys.exit(cli.main())
# a program calling main(): after the interrupt it goes on, with its handlers, and its own later processes run
import signal
earlier = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)  # the program's own (out of reach of a signal to the group): not the command's
rc = cli.main(sys.argv[2:])
handlers = signal.getsignal(signal.SIGINT) is signal.default_int_handler, signal.getsignal(signal.SIGTERM)
later = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
kept = earlier.poll() is None
earlier.kill()
print(f"main returned {rc}; handlers {handlers}; a later process ended with {later.wait()}; earlier kept {kept}", file=sys.stderr)
"""


def test_a_second_ctrl_c_exits_at_once_and_removes_the_staging_folder(tmp_path, record_property):
    out = tmp_path / "out"
    run = Run(tmp_path, ["stopme", "--out", str(out), "--mode", "slow_cleanup"], argv0=["-c", SCRIPT])
    run.wait_until(lambda: "working" in run.stderr() and _partials(tmp_path), "working")
    os.killpg(run.proc.pid, signal.SIGINT)
    run.wait_until(lambda: "cleaning up" in run.stderr(), "cleaning up")  # the first one is being handled
    seconds = run.signal([signal.SIGINT])
    run.assert_interrupted("tiltlab stopme", 130)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stderr.txt", "stdout.txt", "tmpdir"]  # no out, no partial
    _record(record_property, "a cleanup that never ends", "second SIGINT", seconds)


def test_an_exit_that_waits_for_ever_ends_after_the_interrupt(tmp_path, record_property):
    """A thread that never ends would keep the interpreter's exit waiting: the console command ends anyway."""
    out = tmp_path / "out"
    run = Run(tmp_path, ["stopme", "--out", str(out), "--mode", "stuck_thread"], argv0=["-c", SCRIPT])
    run.wait_until(lambda: "working" in run.stderr(), "working")
    seconds = run.signal([signal.SIGTERM])
    run.assert_interrupted("tiltlab stopme", 143)
    assert _partials(tmp_path) == [] and not out.exists()
    _record(record_property, "a thread the exit waits on", "SIGTERM", seconds)


def test_a_child_that_ignores_sigterm_is_killed(tmp_path, record_property):
    """The command's own child, which ignores SIGTERM (as an engine that shuts down on its own would) and is
    out of the signalled group: the command kills it (SIGKILL after the grace period) before it exits."""
    out = tmp_path / "out"
    run = Run(tmp_path, ["stopme", "--out", str(out), "--mode", "stubborn_child"], argv0=["-c", SCRIPT])
    run.wait_until(lambda: "working" in run.stderr(), "working")
    child = int(next(ln for ln in run.stderr().splitlines() if ln.startswith("child ")).split()[1])
    seconds = run.signal([signal.SIGINT])
    run.assert_interrupted("tiltlab stopme", 130)
    deadline = time.monotonic() + EXIT_S
    while Path(f"/proc/{child}").exists() and b") Z" not in Path(f"/proc/{child}/stat").read_bytes():
        assert time.monotonic() < deadline, f"the child {child} still runs"
        time.sleep(0.05)
    assert _partials(tmp_path) == [] and not out.exists()
    _record(record_property, "a child ignoring SIGTERM", "SIGINT", seconds)


def test_a_program_calling_main_goes_on_after_the_interrupt(tmp_path):
    """``main([...])`` in a program's process: the signal ends the command, not the program; the program's
    handlers are back, and the processes it started before the command and after it are left alone."""
    out = tmp_path / "out"
    run = Run(tmp_path, ["--as-library", "stopme", "--out", str(out)], argv0=["-c", SCRIPT])
    run.wait_until(lambda: "working" in run.stderr(), "working")
    run.signal([signal.SIGTERM])
    err = run.stderr()
    assert run.proc.returncode == 0 and "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-2:] == [
        "tiltlab stopme: interrupted",
        "main returned 143; handlers (True, <Handlers.SIG_DFL: 0>); a later process ended with 0; earlier kept True",
    ]
    assert _partials(tmp_path) == [] and not out.exists()


# --------------------------------------------------------------------------- in-process


def test_a_keyboardinterrupt_in_process_puts_the_handlers_back(tmp_path, monkeypatch, capsys):
    """``main([...])`` called by a program (no signal): exit 130, the one line, the caller's handlers back."""
    import tiltlab.sim.figures as simfig
    from tiltlab.cli import main

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(simfig, "make_all", interrupted)
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    assert main(["figures", "--only", "fig01", "--out", str(tmp_path / "figs")]) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == "tiltlab figures: interrupted"
    assert {s: signal.getsignal(s) for s in before} == before
    assert list(tmp_path.iterdir()) == []  # no partial folder, no empty --out


def test_a_stale_staging_folder_is_removed_by_the_next_run(tmp_path, monkeypatch):
    """Staging folders of runs that were killed (SIGKILL: no cleanup ran) go at the start of the next run of
    the same output; one of a run that is still running, and those of other outputs, stay."""
    import tiltlab.sim.figures as simfig
    from tests.sim.test_figures import _fake_make_all
    from tiltlab.cli import main

    monkeypatch.setenv("TILTLAB_PROGRESS", "off")
    monkeypatch.setattr(simfig, "make_all", _fake_make_all())
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    killed.kill()
    killed.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        names = {
            "killed": f".figs.partial-{killed.pid}-abcd1234",
            "old_style": ".figs.partial-k2j4h5g6",  # an earlier version's name: no process id
            "running": f".figs.partial-{alive.pid}-abcd1234",
            "other_output": f".other.partial-{killed.pid}-abcd1234",
        }
        for name in names.values():
            (tmp_path / name).mkdir()
            (tmp_path / name / "fig01_lad_bandit.png").write_bytes(b"half")
        assert main(["figures", "--only", "fig01", "--out", str(tmp_path / "figs")]) == 0
        left = sorted(p.name for p in tmp_path.iterdir())
        assert left == sorted(["figs", names["running"], names["other_output"]])
    finally:
        alive.kill()
        alive.wait()
