"""The report of a ``tiltlab reproduce`` run: ``REPORT.md`` and a self-contained ``report.html``.

Input: the check outcomes (:class:`tiltlab.claims.registry.Outcome`), the simulator figure
records (:class:`tiltlab.sim.figures.FigureRecord`, or any object with the same attributes), the
figure modules that were missing or crashed, and an environment mapping. Output: one
Markdown and one HTML document that read top to bottom — summary counts, findings, then
per paper every declared claim with its checks' verdicts, evidence and the figure that
shows it, then the environment.

Claims are cited as ``"<paper> <section>"`` (``DISA §2.2 eq. (10)``); the report points readers
to ``docs/math.md`` (the equations and claim ids) and ``docs/papers.md`` (the paper index), both
in the repository. :func:`render_papers_markdown` renders ``docs/papers.md`` from the index.

Deterministic: everything is sorted; the only run-dependent line is the one that names
when the report was generated and how long the run took (``run_line``). Timings per check
live in ``claims.json``, not here.

The package, one module per concern: :mod:`.model` (what a report says: claim rows, a claim's decision,
findings), :mod:`.markdown` and :mod:`.html` (the two formats; the page's style sheet is ``report.css``),
:mod:`.output` (writing both, also from a record), :mod:`.tables` (the per-claim CSV/LaTeX/Markdown table),
:mod:`.docs` (the generated sections of the project's documents) and :mod:`.papers` (``docs/papers.md``).
This module re-exports what the rest of the project uses.
"""

from __future__ import annotations

from tiltlab.claims.decision import DECISION_ORDER, claim_decision, claim_status
from tiltlab.paper_checks.report.docs import (
    DOCS_BEGIN,
    DOCS_END,
    item_rules_section,
    llm_run_section,
    posthoc_section,
    registry_counts,
    registry_sentence,
    replace_section,
    results_section,
    section_text,
    timings_section,
)
from tiltlab.paper_checks.report.html import figures_json, render_html
from tiltlab.paper_checks.report.markdown import render_markdown
from tiltlab.paper_checks.report.model import (
    _REPO,
    FAILED_TITLE,
    SPEC_DOCS,
    VERDICT_ORDER,
    ReportInput,
    _counts,
    _provenance_note,
    claim_rows,
    command_list,
    other_threshold,
    status_sentence,
)
from tiltlab.paper_checks.report.output import report_input_from_record, write_report
from tiltlab.paper_checks.report.papers import render_papers_markdown
from tiltlab.paper_checks.report.tables import TABLE_COLUMNS, claim_table, key_numbers, render_table

__all__ = [
    "DECISION_ORDER",
    "DOCS_BEGIN",
    "DOCS_END",
    "FAILED_TITLE",
    "SPEC_DOCS",
    "TABLE_COLUMNS",
    "VERDICT_ORDER",
    "_REPO",
    "ReportInput",
    "_counts",
    "_provenance_note",
    "claim_decision",
    "claim_rows",
    "claim_status",
    "claim_table",
    "command_list",
    "figures_json",
    "item_rules_section",
    "key_numbers",
    "llm_run_section",
    "other_threshold",
    "posthoc_section",
    "registry_counts",
    "registry_sentence",
    "render_html",
    "render_markdown",
    "render_papers_markdown",
    "render_table",
    "replace_section",
    "report_input_from_record",
    "results_section",
    "section_text",
    "status_sentence",
    "timings_section",
    "write_report",
]
