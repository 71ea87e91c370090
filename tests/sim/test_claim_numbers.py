"""One computation per claim: a figure reports a claim's numbers exactly as the claim's check does.

For every quick figure (seed 0) and every fast sim check whose result names that figure, the
figure's record and its JSON carry the check's ``CheckResult.numbers`` unchanged (exact equality:
both read the same ``tiltlab.sim.experiments`` function with the same settings). Slow checks run in
full mode only, so their figures report their numbers only in full mode (not exercised here).
"""

from __future__ import annotations

import importlib
import json

import pytest

import tiltlab.sim.checks  # noqa: F401  (registers the sim checks)
from tiltlab.claims import registry
from tiltlab.claims.registry import CheckResult, Verdict
from tiltlab.sim.figures import FIGURES


def _as_reported(numbers: dict) -> dict:
    """Numbers as the claim record stores them: CheckResult's normalization, then JSON."""
    return json.loads(json.dumps(CheckResult(Verdict.VERIFIED, "", numbers=dict(numbers)).numbers))


@pytest.fixture(scope="module")
def check_numbers() -> dict[tuple[str, str], dict]:
    """(claim id, figure id) -> numbers, for every fast sim check whose result names a figure."""
    out = {}
    for chk in registry.select(layer="sim"):
        res = chk.fn(0)
        if res.figure is not None:
            assert (chk.claim_id, res.figure) not in out, f"two checks of {chk.claim_id} name {res.figure}"
            out[(chk.claim_id, res.figure)] = _as_reported(res.numbers)
    return out


def test_every_figure_claim_with_a_check_is_compared(check_numbers):
    figure_ids = {fid for fid, _ in FIGURES}
    named = {fig for _, fig in check_numbers}
    assert named <= figure_ids, named - figure_ids
    # the pairs this test compares: one per (claim, figure) with a fast check
    assert len(check_numbers) >= 15


@pytest.mark.parametrize("fig_id", [fid for fid, _ in FIGURES])
def test_figure_numbers_equal_check_numbers(tmp_path, check_numbers, fig_id):
    mod = importlib.import_module(f"tiltlab.sim.figures.{dict(FIGURES)[fig_id]}")
    rec = mod.make(tmp_path, quick=True, seed=0)
    on_disk = json.loads(rec.data.read_text())["claim_numbers"]
    expected = {claim: nums for (claim, fig), nums in check_numbers.items() if fig == fig_id}
    # every claim of this figure with a fast check is reported, and nothing else
    assert set(rec.numbers) == set(expected), (sorted(rec.numbers), sorted(expected))
    assert set(expected) <= set(rec.claims)
    for claim, nums in expected.items():
        assert _as_reported(rec.numbers[claim]) == nums, claim
        assert on_disk[claim] == nums, claim
