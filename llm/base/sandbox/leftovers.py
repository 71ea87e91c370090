"""Folders a run makes on the host, named after the process that owns them, and the sweep that removes those
whose owner is gone (a trainer killed with runs in flight cannot remove its own)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import threading
import time

#: the prefixes of the host folders a run makes: the judge's working directory (every level) and the
#: candidate's below the bwrap level
PREFIXES = ("tiltlab-judge-", "tiltlab-sbx-")
#: a process sweeps at its first run, then at most once per this many seconds (a listing of its TMPDIR)
SWEEP_EVERY_S = 30.0
_NAME = re.compile(r"^tiltlab-(?:judge|sbx)-(\d+)\.(\d+)\.(\d+)\.([0-9a-f]{8})-")

_lock = threading.Lock()
_last: dict[str, tuple[int, float]] = {}  # folder -> (pid that swept, when)


def _start_time(pid: int | str) -> int | None:
    """Field 22 of /proc/<pid>/stat: the start time in clock ticks since boot (tells a reused pid apart)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _host() -> tuple[int, str]:
    """This pid namespace's inode and the first 8 hex digits of the boot id: pids and start times name a
    process only within one namespace and one boot."""
    try:
        ns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        ns = 0
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip().replace("-", "")[:8]
    except OSError:
        boot = "0" * 8
    return ns, boot if re.fullmatch(r"[0-9a-f]{8}", boot) else "0" * 8


_HOST = _host()


def owner_tag() -> str:
    """``<pid>.<start time>.<pid namespace>.<boot>`` of this process: what a folder's name says of its owner."""
    pid = os.getpid()
    if _tag[0] != pid:
        _tag[:] = [pid, f"{pid}.{_start_time(pid) or 0}.{_HOST[0]}.{_HOST[1]}"]
    return _tag[1]


_tag: list = [None, ""]


def owner_of(name: str) -> tuple[int, int, int, str] | None:
    """(pid, start time, pid namespace, boot) of an owner-named folder, or None (another name)."""
    m = _NAME.match(name)
    return (int(m[1]), int(m[2]), int(m[3]), m[4]) if m else None


def _gone(owner: tuple[int, int, int, str]) -> bool:
    """Is the owner of a folder of this namespace and boot no longer running (its pid free or another
    process's)? Folders of other namespaces or boots are never judged gone: their owners cannot be seen."""
    pid, start, ns, boot = owner
    if (ns, boot) != _HOST:
        return False
    return _start_time(pid) != start


def sweep(folder: str | None = None) -> list[str]:
    """Remove the run folders in ``folder`` (the TMPDIR) whose owner process is gone; the removed paths."""
    folder = folder or tempfile.gettempdir()
    out = []
    try:
        names = os.listdir(folder)
    except OSError:
        return out
    me = os.getpid()
    for name in names:
        if not name.startswith(PREFIXES):
            continue
        owner = owner_of(name)
        if owner is None or owner[0] == me or not _gone(owner):
            continue
        path = os.path.join(folder, name)
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            out.append(path)
    return out


def _maybe_sweep(folder: str) -> None:
    """:func:`sweep` at the first run of this process (a fork is a new process), then at most every
    :data:`SWEEP_EVERY_S` seconds."""
    now = time.monotonic()
    with _lock:
        pid, when = _last.get(folder, (None, 0.0))
        if pid == os.getpid() and now - when < SWEEP_EVERY_S:
            return
        _last[folder] = (os.getpid(), now)
    with contextlib.suppress(OSError):
        sweep(folder)


def mkdtemp(prefix: str) -> str:
    """``tempfile.mkdtemp`` in the TMPDIR, named ``<prefix><owner tag>-XXXXXXXX`` (after a sweep when due)."""
    folder = tempfile.gettempdir()
    _maybe_sweep(folder)
    return tempfile.mkdtemp(prefix=f"{prefix}{owner_tag()}-", dir=folder)


@contextlib.contextmanager
def tempdir(prefix: str):
    """:func:`mkdtemp` as a context: the folder is removed on exit (as ``tempfile.TemporaryDirectory``)."""
    path = mkdtemp(prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
