"""Quick versions of all ten figures run, write PNG + JSON, and state their findings; the CLI filter."""

from __future__ import annotations

import importlib
import json

import pytest

from tiltlab.sim.figures import FIGURES, FigureRecord

FIG_IDS = [fid for fid, _ in FIGURES]


def test_all_ten_figures_are_registered():
    assert len(FIG_IDS) == 10 and len(set(FIG_IDS)) == 10
    for fid, mod in FIGURES:
        assert importlib.util.find_spec(f"tiltlab.sim.figures.{mod}") is not None, fid


@pytest.mark.parametrize("fig_id", FIG_IDS)
def test_quick_figure(tmp_path, fig_id):
    mod = importlib.import_module(f"tiltlab.sim.figures.{dict(FIGURES)[fig_id]}")
    rec = mod.make(tmp_path, quick=True, seed=0)
    assert isinstance(rec, FigureRecord) and rec.id == fig_id
    assert rec.png.exists() and rec.png.stat().st_size > 10_000  # a real plot, not an empty canvas
    data = json.loads(rec.data.read_text())
    assert data["caption"] == rec.caption
    # names the paper it reproduces by its short name, never by a file name
    assert any(name in rec.caption for name in ("DISA", "FlowRL", "PACED-RL", "LAD", "FPA")), rec.caption
    assert ".txt" not in rec.caption
    assert rec.findings and all(any(ch.isdigit() for ch in f) for f in rec.findings)  # findings carry numbers
    assert rec.claims


def test_cli_figures_only(tmp_path):
    from tiltlab.cli import main

    assert main(["figures", "--quick", "--only", "fig08", "--out", str(tmp_path)]) == 0
    index = json.loads((tmp_path / "index.json").read_text())
    assert [f["id"] for f in index["figures"]] == ["fig08_paced"]
    assert main(["figures", "--only", "fig99_nope", "--out", str(tmp_path)]) == 2
