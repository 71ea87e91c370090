"""What the split sandbox tests share: the machine's isolation facts (read once per process), the fast
config and the bwrap marker."""

import warnings

import pytest

from tiltlab.llm.base.sandbox import SandboxConfig, SandboxWarning, isolation_report

with warnings.catch_warnings():  # the isolation facts are asserted by the tests, not warned about
    warnings.simplefilter("ignore", SandboxWarning)
    REPORT = isolation_report()
FAST = SandboxConfig(timeout_s=2.0, memory_mb=256)
BWRAP = REPORT["level"] == "bwrap"
needs_bwrap = pytest.mark.skipif(
    not BWRAP, reason="bubblewrap is missing or does not work here (apt-get install -y bubblewrap)"
)
