"""Writing a report: both documents from a :class:`ReportInput`, or from a ``claims.json`` record."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tiltlab.claims import registry
from tiltlab.files import write_text
from tiltlab.paper_checks import catalog
from tiltlab.paper_checks.report.html import render_html
from tiltlab.paper_checks.report.markdown import render_markdown
from tiltlab.paper_checks.report.model import ReportInput


def write_report(inp: ReportInput) -> tuple[Path, Path]:
    """Write ``REPORT.md`` and ``report.html`` into ``inp.out_dir``; return their paths."""
    out = Path(inp.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md, ht = out / "REPORT.md", out / "report.html"
    write_text(md, render_markdown(inp))
    write_text(ht, render_html(inp))
    return md, ht


# --------------------------------------------------------------------------- reports from a record


def report_input_from_record(rec: Mapping[str, Any], out_dir: Path) -> ReportInput:
    """A :class:`ReportInput` rebuilt from a ``tiltlab reproduce`` record (``claims.json`` in
    ``out_dir``), e.g. after ``tiltlab check`` merged a partial run into it, over the claims the record
    counts (:mod:`tiltlab.claims.counts`). Outcomes keep their provenance, so the report says which run,
    mode and commit each number came from."""
    from types import SimpleNamespace

    from tiltlab.claims.counts import claims_counted, record_scope
    from tiltlab.claims.rows import outcomes_from_rows

    catalog.discover()
    outs = outcomes_from_rows(rec.get("checks", []))
    declared = registry.claims()
    counted = claims_counted(record_scope(rec, declared), (o.check.claim_id for o in outs))
    figs = []
    for f in rec.get("figures", []):
        d = dict(f)
        for k in ("png", "data"):
            if d.get(k):
                d[k] = Path(out_dir) / d[k]
        d.setdefault("claims", [])
        d.setdefault("findings", [])
        figs.append(SimpleNamespace(**d))
    rep = rec.get("report") or {}
    sel = rec.get("selection") or {}
    return ReportInput(
        claims={c: declared[c] for c in counted if c in declared},  # the claims the record counts
        outcomes=outs,
        figures=figs,
        missing_figures=dict(rec.get("figures_missing") or {}),
        env=dict(rec.get("environment") or {}),
        seed=int(rec.get("seed") or 0),
        quick=bool(rep.get("quick", sel.get("quick", False))),
        out_dir=Path(out_dir),
        run_line=str(rep.get("run_line", "")),
        run_id=str(rep.get("run_id", "")),
    )
