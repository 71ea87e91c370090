"""Quick versions of the part-B figures (2, 3, 4, 5, 6, 9) run, write PNG + JSON, and state their findings."""

from __future__ import annotations

import importlib
import json

import pytest

from sim.figures import FIGURES, FigureRecord

PART_B = ("fig02_m_study", "fig03_beta_sensitivity", "fig04_proposal_strength", "fig05_bias_landscape",
          "fig06_envelope", "fig09_fpa_entanglement")


def test_part_b_figures_are_registered():
    ids = [fid for fid, _ in FIGURES]
    assert all(f in ids for f in PART_B)


@pytest.mark.parametrize("fig_id", PART_B)
def test_quick_figure(tmp_path, fig_id):
    mod = importlib.import_module(f"sim.figures.{fig_id}")
    rec = mod.make(tmp_path, quick=True, seed=0)
    assert isinstance(rec, FigureRecord) and rec.id == fig_id
    assert rec.png.exists() and rec.png.stat().st_size > 10_000  # a real plot, not an empty canvas
    data = json.loads(rec.data.read_text())
    assert data["caption"] == rec.caption
    assert ".txt" in rec.caption  # names the paper file it reproduces
    assert rec.findings and all(any(ch.isdigit() for ch in f) for f in rec.findings)  # findings carry numbers
    assert rec.claims
