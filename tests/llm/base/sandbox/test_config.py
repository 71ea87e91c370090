"""llm.base.sandbox.config: ``SandboxConfig``'s validation and the entry points' refusals of bad input."""

import sys

import pytest

if not sys.platform.startswith("linux"):
    pytest.skip("the sandbox targets Linux (rlimits, namespaces)", allow_module_level=True)

from tiltlab.llm.base.sandbox import SandboxConfig, run_judged, run_python

pytestmark = pytest.mark.filterwarnings("ignore::tiltlab.llm.base.sandbox.SandboxWarning")


def test_config_validation():
    with pytest.raises(ValueError, match="timeout_s"):
        SandboxConfig(timeout_s=0)
    with pytest.raises(ValueError, match="memory_mb"):
        SandboxConfig(memory_mb=1)
    with pytest.raises(ValueError, match="memory_mb must be >= 64"):
        SandboxConfig(memory_mb=63)
    assert SandboxConfig(memory_mb=64).memory_mb == 64  # the floor itself is allowed
    with pytest.raises(ValueError, match="backend"):
        SandboxConfig(backend="docker")
    with pytest.raises(ValueError, match="disk_mb"):
        SandboxConfig(disk_mb=0)
    with pytest.raises(ValueError, match="uid_base"):
        SandboxConfig(uid_base=0)
    with pytest.raises(ValueError, match="code must be a str"):
        run_python(b"print(1)")
    with pytest.raises(ValueError, match="code and tests"):
        run_judged("x = 1", None)
