"""docs/papers.md is the rendering of paper_checks/papers.toml; the two must agree."""

from __future__ import annotations

from pathlib import Path

from tiltlab.paper_checks.report import render_papers_markdown

PAPERS_MD = Path(__file__).resolve().parents[2] / "docs" / "papers.md"


def test_docs_papers_md_is_the_rendered_index():
    assert PAPERS_MD.read_text(encoding="utf-8") == render_papers_markdown(), (
        "docs/papers.md differs from paper_checks/papers.toml; regenerate it with "
        "`python -m tiltlab.paper_checks.report --papers-md > docs/papers.md`"
    )
