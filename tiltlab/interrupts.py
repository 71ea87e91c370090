"""Ctrl-C and SIGTERM: a ``tiltlab`` command stops at once, and the processes it started stop with it.

:func:`tiltlab.cli.main` runs every command inside :func:`handling`, which replaces the handlers of SIGINT and
SIGTERM while the command runs (in the main thread; elsewhere it changes nothing). On the first signal:

1. every process the command started, directly or through another (the check and figure pools' workers, vLLM's
   engine, subprocesses; not those running before it, with what they start), gets SIGTERM, and SIGKILL when it still runs :data:`GRACE_S` seconds later; the handler
   returns when they are gone, so none of them writes into a folder after the run removed it;
2. ``KeyboardInterrupt`` is raised in the main thread: the run unwinds through its ``finally`` blocks (its staging
   folder is removed, :func:`tiltlab.files.staging_dir`; a pool's shutdown returns at once, its workers being
   gone), and a process started while it unwinds (a thread pool's next subprocess) is stopped the same way;
3. ``main`` prints the one line ``tiltlab CMD: interrupted`` and returns :func:`exit_status`: 130 after SIGINT,
   143 after SIGTERM (128 + the signal's number, what a shell reports for a process the signal ended).

A second signal does not wait for any of that: the processes left get SIGKILL, the folders in use are removed
(:func:`tiltlab.files.remove_folders_in_use`), the line is printed (when it was not yet) and the process exits at
once with the same status (``os._exit``); for the console command, during the interpreter's exit too.

A process forked while a command runs (a pool's worker) starts with SIGINT doing nothing and SIGTERM at its
default (the process ends wherever it is): a terminal's Ctrl-C reaches the whole process group, and the main
process alone decides what stops.

The processes are found in ``/proc`` (Linux); elsewhere only the children :mod:`multiprocessing` started are.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import NoReturn

from tiltlab import files

__all__ = [
    "EXIT_AFTER_S",
    "GRACE_S",
    "announce",
    "descendants",
    "exit_status",
    "handling",
    "received",
    "set_command",
    "stop_processes",
]

GRACE_S = 1.0
"""Seconds a process has after SIGTERM before it gets SIGKILL."""

EXIT_AFTER_S = 1.0
"""Seconds the console command's process may take to exit after the interrupted command returned
(:func:`handling`'s ``own_process``)."""

SIGNALS = (signal.SIGINT, signal.SIGTERM)

#: A process: its id and its start time (clock ticks after boot, from ``/proc``; 0 where unknown), so a process
#: id the system has given to another process since is never signalled.
Proc = tuple[int, int]


class _State:
    """The interrupt state of the running command (one per process)."""

    def __init__(self, command: str = "tiltlab") -> None:
        self.command = command
        self.active = False
        self.own_process = False
        self.received: int | None = None
        self.announced = False
        self.exit_at = math.inf
        self.sweeping = False
        self.before: frozenset[Proc] = frozenset()  # the processes running before the command: never signalled


_state = _State()
_fork_hook_registered = False


def received() -> int | None:
    """The signal that interrupted the running command (None: none did)."""
    return _state.received


def exit_status() -> int:
    """The exit status of the interrupted command: 128 + the signal's number (130 for SIGINT, 143 for
    SIGTERM); 130 for a ``KeyboardInterrupt`` no signal raised."""
    return 128 + (_state.received or signal.SIGINT)


def set_command(command: str) -> None:
    """Name the running command in the line :func:`announce` prints (e.g. ``tiltlab llm eval``)."""
    _state.command = command


def announce(raw: bool = False) -> None:
    """Print ``<command>: interrupted`` on stderr, once per command. ``raw``: write to file descriptor 2 directly
    (in a signal handler, which may run while the main thread is inside a write to ``sys.stderr``)."""
    if _state.announced:
        return
    _state.announced = True
    line = f"{_state.command}: interrupted"
    if raw:
        os.write(2, (line + "\n").encode())
    else:
        print(line, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- processes


def _stat(pid: int | str) -> tuple[int, bytes, int] | None:
    """``(parent id, state letter, start time)`` of a process from ``/proc/PID/stat``; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    fields = raw[raw.rindex(b")") + 2 :].split()  # after the name, which may hold spaces and parentheses
    return int(fields[1]), fields[0], int(fields[19])


def descendants(pid: int | None = None, exclude: frozenset[Proc] = frozenset()) -> list[Proc]:
    """The running processes ``pid`` (default: this process) started, directly or through another, parents
    first; zombies (ended, not yet reaped) are not running. ``exclude``: processes left out with all they started."""
    root = os.getpid() if pid is None else pid
    if not os.path.isdir("/proc/self"):
        import multiprocessing

        kids = multiprocessing.active_children() if root == os.getpid() else []
        return [(p.pid, 0) for p in kids if p.pid is not None and (p.pid, 0) not in exclude]
    children: dict[int, list[Proc]] = {}
    for name in os.listdir("/proc"):
        st = _stat(name) if name.isdigit() else None
        if st is not None and st[1] not in (b"Z", b"X"):
            children.setdefault(st[0], []).append((int(name), st[2]))
    out: list[Proc] = []
    todo = [root]
    while todo:
        for proc in children.get(todo.pop(0), []):
            if proc not in exclude:
                out.append(proc)
                todo.append(proc[0])
    return out


def _started() -> list[Proc]:
    """The running processes the command started (:func:`descendants` without those running before it: a
    program calling ``main([...])`` keeps its own)."""
    return descendants(exclude=_state.before)


def _running(proc: Proc) -> bool:
    pid, start = proc
    if start == 0:  # no /proc: a process counts as running until it is reaped
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    st = _stat(pid)
    return st is not None and st[1] not in (b"Z", b"X") and st[2] == start


def _send(procs: list[Proc], sig: int) -> None:
    for proc in procs:
        if _running(proc):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(proc[0], sig)


def stop_processes(procs: list[Proc], grace: float = GRACE_S) -> None:
    """SIGTERM each of ``procs``, SIGKILL those still running ``grace`` seconds later, and return when all of
    them are gone (or ``grace`` seconds after the SIGKILL, for a process the system cannot end at once)."""
    _send(procs, signal.SIGTERM)
    deadline, killed = time.monotonic() + grace, False
    while procs := [p for p in procs if _running(p)]:
        if time.monotonic() >= deadline:
            if killed:
                return
            _send(procs, signal.SIGKILL)
            deadline, killed = time.monotonic() + grace, True
        time.sleep(0.01)


def _sweep(state: _State) -> None:
    """After the first signal, until the command's :func:`handling` block ends (the process ends, for the
    console command): stop every process started since (SIGTERM, SIGKILL after :data:`GRACE_S`), and end the
    process at ``state.exit_at``."""
    signalled: dict[Proc, float] = {}
    while state.sweeping:
        now = time.monotonic()
        if now >= state.exit_at:
            _exit_now()
        for proc in descendants(exclude=state.before):
            if proc not in signalled:
                _send([proc], signal.SIGTERM)
                signalled[proc] = now
            elif now - signalled[proc] >= GRACE_S:
                _send([proc], signal.SIGKILL)
        time.sleep(0.05)


def _exit_now() -> NoReturn:
    """Kill what runs, remove the folders in use, print the line, exit with :func:`exit_status` at once."""
    _send(_started(), signal.SIGKILL)
    files.remove_folders_in_use()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # e.g. a reentrant call inside the main thread's write
            stream.flush()
    announce(raw=True)
    os._exit(exit_status())


# ---------------------------------------------------------------- handlers


def _handle(signum: int, frame: FrameType | None) -> None:
    if _state.received is not None:
        _exit_now()  # asked again: wait for nothing
    _state.received, _state.sweeping = signum, True
    stop_processes(_started())
    threading.Thread(target=_sweep, args=(_state,), name="tiltlab-interrupt", daemon=True).start()
    raise KeyboardInterrupt


def _nothing(signum: int, frame: FrameType | None) -> None:
    """SIGINT in a forked worker: the main process decides."""


def _after_fork_in_child() -> None:
    global _state
    if not _state.active:
        return
    _state = _State()
    with contextlib.suppress(ValueError):  # not the main thread (cannot happen right after fork)
        signal.signal(signal.SIGINT, _nothing)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _at_exit() -> None:
    """An exit hook, registered when this module is imported (so it runs after those of the libraries imported
    later): after an interrupt, the command's own process ends here, with its status, without the modules'
    teardown, during which a second signal would end it with its default action."""
    if _state.received is not None and _state.own_process:
        _exit_now()


atexit.register(_at_exit)


@contextlib.contextmanager
def handling(command: str, *, own_process: bool = False) -> Iterator[None]:
    """Run the ``with`` block under this module's handlers of SIGINT and SIGTERM (see the module's docstring);
    ``command`` names it in the line :func:`announce` prints. The previous handlers are back after the block.

    ``own_process``: the process is the command (the console script), not a caller's; after a signal the
    handlers then stay, so that a second signal still ends the process at once while the interpreter exits, and
    the process ends (``os._exit``, :func:`exit_status`) at the latest :data:`EXIT_AFTER_S` seconds after the
    block, should the interpreter's exit wait on something (a thread pool's last items, a library's exit hook)."""
    global _fork_hook_registered, _state
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if not _fork_hook_registered and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _fork_hook_registered = True
    previous = {s: signal.getsignal(s) for s in SIGNALS}
    _state = _State(command)
    _state.active, _state.own_process = True, own_process
    _state.before = frozenset(descendants())
    for s in SIGNALS:
        signal.signal(s, _handle)
    try:
        yield
    finally:
        if _state.received is not None:
            stop_processes(_started())  # any the sweeper has not ended yet
        if _state.received is not None and own_process:
            _state.exit_at = time.monotonic() + EXIT_AFTER_S
        else:
            _state.active = _state.sweeping = False
            for s, h in previous.items():
                signal.signal(s, h if h is not None else signal.SIG_DFL)
