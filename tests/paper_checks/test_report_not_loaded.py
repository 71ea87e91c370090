"""The report of a record holding a row whose check module is not loaded (the llm layer without the
``[llm]`` extra): the report asks :attr:`Outcome.loaded` (no source link) and shows the judgement the row
was recorded with."""

from __future__ import annotations

from tiltlab.claims import rows
from tiltlab.paper_checks import report as P

LLM_CID = "zz_fake.llm_not_loaded"


def _row(ok: bool) -> dict:
    return {
        "claim": LLM_CID, "layer": "llm", "check": "gone", "expected": "verified", "verdict": "partly", "ok": ok,
        "summary": "two of three items hold", "numbers": {"a": 1.0}, "items": {"x": True},
        "expected_items": {"x": True}, "seconds": 2.5, "source": "recorded", "commit": "c0ffee",
        "run_at": "2026-01-01T00:00:00+00:00",
    }  # fmt: skip


def test_a_row_whose_check_is_not_loaded_renders_with_its_recorded_judgement(isolated_registry, tmp_path):
    reg = isolated_registry
    reg.declare_claim(LLM_CID, "DISA", "Sec. 9", "a fake LLM-scale claim", kind="empirical")
    (o,) = rows.outcomes_from_rows([_row(ok=True)])
    assert not o.loaded and P.model._check_source(o) is None
    inp = P.ReportInput(claims={LLM_CID: reg.claims()[LLM_CID]}, outcomes=[o], out_dir=tmp_path)
    md, page = P.render_markdown(inp), P.render_html(inp)
    line = next(ln for ln in md.splitlines() if "`gone`" in ln)
    assert "**partly**" in line and "two of three items hold" in line
    assert "expected verified" not in md  # recorded as ok: not a failure, though partly != verified
    assert "Status: all 1 checks as expected" in md and "source unavailable" in page
    assert "recorded (not re-run)" in md and "commit c0ffee" in md
    # the same row recorded as not ok is a failure of the report
    (bad,) = rows.outcomes_from_rows([_row(ok=False)])
    bad_md = P.render_markdown(P.ReportInput(claims=inp.claims, outcomes=[bad], out_dir=tmp_path))
    assert "Status: 1 of 1 checks failed" in bad_md and "returned partly, expected verified" in bad_md
