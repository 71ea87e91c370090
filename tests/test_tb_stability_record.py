"""docs/llm-runs.md's table of TB runs at several learning rates is generated from its record
(benchmarks/records/tb_stability.json, benchmarks/tb_stability.py), and the record's numbers are the ones
the text quotes; the renderer picks the step-1 values and the run maxima as a plain loop does."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "benchmarks" / "records" / "tb_stability.json"
DOC = ROOT / "docs" / "llm-runs.md"
spec = importlib.util.spec_from_file_location("tb_stability", ROOT / "benchmarks" / "tb_stability.py")
tb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tb)


def _record() -> dict:
    return json.loads(RECORD.read_text())


def test_the_docs_table_is_the_records():
    assert tb.update_docs(_record(), DOC, check=True), "run: python benchmarks/tb_stability.py docs " + str(RECORD)


def test_a_stale_table_is_found_and_rewritten(tmp_path):
    doc = tmp_path / "d.md"
    doc.write_text(f"# d\n\n{tb.START}\n| old |\n{tb.END}\n\n{tb.PROFILE_START}\n{tb.PROFILE_END}\n")
    assert not tb.update_docs(_record(), doc, check=True) and "| old |" in doc.read_text()
    assert tb.update_docs(_record(), doc) and tb.update_docs(_record(), doc, check=True)
    assert "| whole step (TRL's step_time) |" in doc.read_text()
    doc.write_text("# no block\n")
    with pytest.raises(ValueError, match="no <!-- tb-stability:start -->"):
        tb.update_docs(_record(), doc)


def _shows(cell: str, value: float, digits: int) -> bool:
    """``cell`` is ``value`` rounded to ``digits`` significant digits (within half a unit of the last digit)."""
    if value == 0:
        return float(cell) == 0
    unit = 10 ** (math.floor(math.log10(abs(value))) - digits + 1)
    return abs(float(cell) - value) <= 0.5 * unit * (1 + 1e-9)


def test_each_row_is_the_runs_step_one_values_and_maxima():
    rec = _record()
    rows = [ln for ln in tb.render(rec).splitlines()[2:]]
    assert len(rows) == len(rec["runs"])
    for r in rec["runs"]:
        if not r.get("steps"):
            continue
        label = f"{r['arm']}, seed {r['seed']}"
        (row,) = [x for x in rows if x.startswith(f"| {label}") and f"| {r['lr']:g} |" in x]
        cells = [c.strip() for c in row.strip("|").split("|")]
        first = r["steps"][0]
        assert _shows(cells[2], first["residual/flip_frac"], 2)
        assert _shows(cells[3], first["residual/after_over_before"], 3)
        peak = -math.inf
        for s in r["steps"]:
            peak = max(peak, s["grad_norm"])
        assert _shows(cells[5], peak, 3)


def test_the_numbers_the_text_quotes_are_the_records():
    """The collapse paragraph's numbers: DISA at 1e-4 and 1e-5, seed 0, from the record (3 significant digits)."""
    runs = {(r["arm"], r["lr"]): r for r in _record()["runs"]}
    hi, mid = runs[("disa", 1e-4)], runs[("disa", 1e-5)]
    s1 = hi["steps"][0]
    assert round(s1["residual"], 2) == 0.80
    assert round(s1["residual"] * s1["residual/after_over_before"], 1) == 24.1
    assert round(mid["steps"][0]["residual"] * mid["steps"][0]["residual/after_over_before"], 2) == 1.56
    step4 = hi["steps"][3]
    assert (round(step4["residual"], 1), round(step4["grad_norm"]), round(step4["kl_ref_seq"], 1)) == (8.3, 1514, 7.6)
    # as recorded at run time (before the KL bound existed), and as the current monitor gives them (the table)
    assert [(w["kind"], w["step"]) for w in hi["warnings"]] == [("overshoot", 3), ("residual", 4)]
    assert [(w["kind"], w["step"]) for w in tb.replay(hi)] == [("overshoot", 3), ("residual", 4), ("kl", 5)]
    assert mid["warnings"] == [] and tb.replay(mid) == []
    fhi, fmid = runs[("flowrl", 1e-4)], runs[("flowrl", 1e-5)]
    assert round(fhi["steps"][0]["residual/after_over_before"]) == 51
    assert round(max(x["kl_ref_seq"] for x in fhi["steps"]), 1) == 10.2
    assert max(x["residual"] for x in fmid["steps"][3:]) < 1.2 and max(x["kl_ref_seq"] for x in fmid["steps"]) < 0.25
    assert [w["kind"] for w in tb.replay(fmid)][:1] == ["overshoot"]
    text = DOC.read_text()
    for quoted in (
        "0.80 to 24.1", "1.56 at 1e-5", "gradient norm 1,514", "7.6 nats by step 4", "by 51", "10.2 nats",
        "below 1.2 with the KL under 0.25",
    ):  # fmt: skip
        assert quoted in text, quoted


def test_the_profile_rows_are_the_records_step_times():
    rec = _record()
    prof = rec["profile"]
    rows = {
        ln.split("|")[1].strip(): ln.split("|")[2:4]
        for ln in tb.render_profile(rec).splitlines()
        if ln.startswith("| ")
    }
    a, b = prof["step_times"]["default"], prof["step_times"]["no_is_correction"]
    got = rows["whole step (TRL's step_time)"]
    assert _shows(got[0].strip(), a["step_time"], 3) and _shows(got[1].strip(), b["step_time"], 3)
    rest = rows["loss forward, backward, optimizer (the rest)"]
    want = a["step_time"] - a["time/generate_and_score"] - a["time/residual_flips"]
    assert _shows(rest[0].strip(), want, 3)
    assert 0 < prof["max_rel_loss_diff"] < 1e-3  # the two runs train the same numbers up to the IS weights
