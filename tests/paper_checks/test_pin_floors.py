"""Pins that hold on every CPU: a check's declared ``pin_atol`` floor, and the shipped pins checked on torch's
DEFAULT CPU kernels as well as on the machine's own (AVX2 / AVX512) kernels."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from tiltlab.paper_checks import record, registry
from tiltlab.paper_checks.registry import CheckResult, Verdict, register_check
from tiltlab.sim.checks import paced_sched, training

#: the checks whose numbers are bit-reproducible per CPU kernel path only, with their margins
FLOORED = {
    "paced.replay[sim:replay_effect_toy]": paced_sched.REPLAY_MARGIN,
    "paced.tau_sweep[sim:toy_proxy]": training.PROXY_MARGIN,
}


def _row(claim, numbers, check="c"):
    return {"claim": claim, "layer": "sim", "check": check, "numbers": numbers, "ok": True}


def test_write_pins_applies_the_floor_of_its_own_check_only(tmp_path):
    rec = {"seed": 0, "commit": "abc", "checks": [_row("a.x", {"v": 2.0, "n": 20}), _row("a.y", {"v": 2.0})]}
    dest = tmp_path / "pins.json"
    record.write_pins(rec, dest, rtol=1e-4, floors={"a.x[sim:c]": 0.005})
    pins = json.loads(dest.read_text())["pins"]
    assert pins["a.x[sim:c]"] == {"v": [2.0, 0.005], "n": [20.0, 0.005]}
    assert pins["a.y[sim:c]"] == {"v": [2.0, 2e-4]}  # no floor: rtol |v|
    record.write_pins(rec, dest, rtol=1e-2, floors={"a.x[sim:c]": 0.005})  # rtol |v| above the floor wins
    assert json.loads(dest.read_text())["pins"]["a.x[sim:c]"]["v"] == [2.0, 0.02]


def test_write_pins_reads_the_floors_of_the_registered_checks_by_default(tmp_path):
    registry.discover()
    key = "paced.replay[sim:replay_effect_toy]"
    rec = {"seed": 0, "commit": "abc", "checks": [_row("paced.replay", {"v": 0.5}, check="replay_effect_toy")]}
    record.write_pins(rec, tmp_path / "p.json")
    assert json.loads((tmp_path / "p.json").read_text())["pins"][key]["v"] == [0.5, paced_sched.REPLAY_PIN_ATOL]


@pytest.mark.parametrize("bad", [-0.1, math.nan, math.inf])
def test_register_check_refuses_a_bad_floor(bad):
    with pytest.raises(ValueError, match="pin_atol must be a finite number >= 0"):
        register_check("a.b", layer="sim", pin_atol=bad)


def test_a_registered_floor_reaches_the_check(isolated_registry):
    @register_check("disa.prop1.unbiased", layer="sim", name="floored_probe", pin_atol=0.25)
    def probe(seed: int) -> CheckResult:
        return CheckResult(Verdict.VERIFIED, "s", {"x": 1.0})

    chk = next(c for c in registry.checks() if c.name == "floored_probe")
    assert chk.pin_atol == 0.25
    register_check("disa.prop1.unbiased", layer="sim", name="floored_probe", pin_atol=0.25)(probe)  # same fn: fine
    with pytest.raises(ValueError, match="registered twice"):
        register_check("disa.prop1.unbiased", layer="sim", name="floored_probe")(lambda seed: probe(seed))


def test_only_the_selection_driven_checks_have_a_floor_and_it_is_half_their_margin():
    """No other check's pins were loosened; each floor is below the smallest effect its check judges."""
    registry.discover()
    floors = {c.key: c.pin_atol for c in registry.checks() if c.pin_atol}
    assert floors == {k: m / 2 for k, m in FLOORED.items()}
    shipped = registry.pins(registry.PINS_FILE)
    for key, nums in shipped.items():
        for name, (value, tol) in nums.items():
            if key in FLOORED:
                assert tol == max(floors[key], 1e-4 * abs(value)), (key, name)
            elif "[llm:" not in key:
                assert tol == pytest.approx(max(1e-4 * abs(value), record.PIN_ATOL), rel=1e-12), (key, name)


def test_shipped_pins_hold_on_torch_default_cpu_kernels(tmp_path):
    """Every fast check run on torch's DEFAULT (non-vectorized) CPU kernels keeps its verdict, items and
    pinned numbers: the pins are not a property of one machine's AVX2 / AVX512 code paths. (The test run
    itself covers the machine's own path.)"""
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default", "TILTLAB_PROGRESS": "off"}
    out = tmp_path / "claims.json"
    p = subprocess.run(
        [sys.executable, "-m", "tiltlab.cli", "check", "--jobs", "2", "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    rows = json.loads(out.read_text())["checks"]
    ran = [r for r in rows if r.get("source") != "recorded"]
    assert len(ran) >= 150 and all(r["ok"] for r in ran)
