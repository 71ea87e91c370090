"""The clock of a run: wall time that does not count the time its processes waited for a CPU."""

from __future__ import annotations

import os
import time


def _tree(roots: list[int]) -> list[int]:
    """``roots`` and all their descendants (from the parent pids in ``/proc/<pid>/stat``)."""
    kids: dict[int, list[int]] = {}
    for e in os.scandir("/proc"):
        if e.name.isdigit():
            try:
                with open(f"/proc/{e.name}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            kids.setdefault(ppid, []).append(int(e.name))
    out, todo = [], list(roots)
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, ()))
    return out


def _run_delays(pids: list[int]) -> dict[int, tuple[int, int]]:
    """Per thread of ``pids``: (nanoseconds on a CPU, nanoseconds runnable but waiting for one) (``schedstat``)."""
    out = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                    cpu, delay = f.read().split()[:2]
                out[int(tid)] = (int(cpu), int(delay))
            except (OSError, ValueError, IndexError):
                continue
    return out


class _RunDeadline:
    """The limit of one run: ``timeout_s`` of wall time, not counting the time its processes sat
    runnable without a CPU (a loaded machine), and never more than ``max_wall_s`` of plain wall time.

    The clock always advances by at least the CPU time the run itself used, so a run that keeps
    many of its own threads or processes runnable (a fork bomb) cannot stretch its limit by
    starving itself."""

    def __init__(self, timeout_s: float, max_wall_s: float):
        self.t0 = self.last = time.monotonic()
        self.timeout, self.cap = timeout_s, max_wall_s
        self.starved = 0.0
        self.seen: dict[int, tuple[int, int]] = {}

    def sample(self, roots: list[int]) -> None:
        stats = _run_delays(_tree(roots))
        now = time.monotonic()
        dt = now - self.last
        ran = sum(max(0, c - self.seen.get(t, (0, 0))[0]) for t, (c, _) in stats.items()) / 1e9
        waited = sum(max(0, d - self.seen.get(t, (0, 0))[1]) for t, (_, d) in stats.items()) / 1e9
        self.seen.update(stats)
        self.starved += max(0.0, min(waited, dt, dt - ran))
        self.last = now

    def left(self) -> float:
        now = time.monotonic()
        return min(self.timeout - (now - self.t0 - self.starved), self.cap - (now - self.t0))
