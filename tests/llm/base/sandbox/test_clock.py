"""llm.base.sandbox.clock: the run's time limit discounts CPU starvation and caps wall time."""

import sys

import pytest

if not sys.platform.startswith("linux"):
    pytest.skip("the sandbox targets Linux (rlimits, namespaces)", allow_module_level=True)

from tiltlab.llm.base.sandbox import clock

pytestmark = pytest.mark.filterwarnings("ignore::tiltlab.llm.base.sandbox.SandboxWarning")


# ---------------------------------------------------------------------------------------------
# the clock
# ---------------------------------------------------------------------------------------------


def test_clock_discounts_cpu_starvation_and_caps_wall_time(monkeypatch):
    now = [100.0]
    stats = {}
    monkeypatch.setattr(clock.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(clock, "_tree", lambda roots: list(roots))
    monkeypatch.setattr(clock, "_run_delays", lambda pids: dict(stats))
    c = clock._RunDeadline(timeout_s=2.0, max_wall_s=10.0)
    now[0], stats[7] = 101.0, (int(0.1e9), int(0.75e9))  # 1 s of wall, 0.75 s of it waiting for a CPU
    c.sample([1])
    assert c.left() == pytest.approx(2.0 - 0.25)
    now[0], stats[7], stats[8] = 102.0, (int(0.1e9), int(1.25e9)), (0, int(4e9))  # 4.5 s waited in 1 s: 1 s counts
    c.sample([1])
    assert c.starved == pytest.approx(1.75) and c.left() == pytest.approx(2.0 - 0.25)
    now[0] = 103.5  # no waiting: wall time counts in full
    c.sample([1])
    assert c.left() == pytest.approx(2.0 - 1.75)
    # a run whose own threads keep each other waiting: the clock advances by its CPU time at least
    now[0], stats[7], stats[8] = 104.0, (int(0.45e9), int(1.5e9)), (int(0.25e9), int(4.5e9))
    c.sample([1])
    assert c.starved == pytest.approx(1.75) and c.left() == pytest.approx(2.0 - 2.25)  # ran 0.6 s in 0.5 s
    now[0], stats[7] = 111.0, (int(0.45e9), int(100e9))  # starved throughout, but the wall-clock cap holds
    c.sample([1])
    assert c.left() == pytest.approx(10.0 - 11.0)
