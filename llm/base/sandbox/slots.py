"""Uid slots: one unprivileged uid per concurrent run of this process (as root under bubblewrap)."""

from __future__ import annotations

import contextlib
import os
import threading

from .config import SandboxConfig
from .probe import _plan

_slots_lock = threading.Lock()
_slots_busy: set[int] = set()
_slot_next = [0]


def _uid_alive(uid: int) -> bool:
    """Does any process of ``uid`` exist on this machine (a previous run's, still being torn down)?"""
    for e in os.scandir("/proc"):
        if e.name.isdigit():
            with contextlib.suppress(OSError):
                if e.stat().st_uid == uid:
                    return True
    return False


@contextlib.contextmanager
def _uid_slot(uid_of=None):
    """A slot number no other run of this process holds (one uid per concurrent run).

    Slots rotate (a slot is reused only after the 255 others), and with ``uid_of`` a slot whose uid
    still has a process anywhere on the machine is skipped: nothing of one run (its processes, and
    with them anything charged to the uid) is there when the next run gets that uid.
    """
    with _slots_lock:
        for i in range(256):
            k = (_slot_next[0] + i) % 256
            if k in _slots_busy or (uid_of is not None and _uid_alive(uid_of(k))):
                continue
            _slots_busy.add(k)
            _slot_next[0] = (k + 1) % 256
            break
        else:
            raise RuntimeError("sandbox: no free uid slot (256 runs of this process at once, or their uids still busy)")
    try:
        yield k
    finally:
        with _slots_lock:
            _slots_busy.discard(k)


def _slot_uid(cfg: SandboxConfig, slot: int | None) -> int:
    if not 0 <= int(slot or 0) < 256:
        raise RuntimeError("sandbox: at most 256 concurrent runs per process")
    return cfg.uid_base + 256 * (os.getpid() % 4096) + int(slot or 0)


def _slot_for(cfg: SandboxConfig):
    """The uid-slot context of one run: slots whose uid still has a process are skipped when the
    sandbox switches to a uid of its own (as root under bwrap)."""
    plan = _plan(cfg)
    return _uid_slot((lambda k: _slot_uid(cfg, k)) if plan["ids"] == "slot" else None)
