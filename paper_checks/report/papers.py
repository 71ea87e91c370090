"""``docs/papers.md``: the paper index as a document (``python -m tiltlab.paper_checks.report --papers-md``)."""

from __future__ import annotations

from collections.abc import Mapping

from tiltlab.claims import registry
from tiltlab.claims.registry import Paper
from tiltlab.paper_checks.report.model import _md_escape

# --------------------------------------------------------------------------- paper index


def render_papers_markdown(papers: Mapping[str, Paper] | None = None) -> str:
    """``docs/papers.md``: the paper index (``paper_checks/papers.toml``) as a document."""
    papers = registry.papers() if papers is None else papers
    L = [
        "# Papers",
        "",
        "The sources the project implements and checks. Claims (`paper_checks/claims/*.toml`), code and",
        "reports cite a place in a paper by short name and section, e.g. **DISA §2.2 eq. (10)**.",
        "The equations themselves are restated in one notation in [math.md](math.md).",
        "",
        "This file is rendered from `paper_checks/papers.toml`; edit that file and regenerate with",
        "`python -m tiltlab.paper_checks.report --papers-md > docs/papers.md`.",
        "",
        "| short name | title | authors | source |",
        "|---|---|---|---|",
    ]
    for p in papers.values():
        L.append(f"| {p.short} | {_md_escape(p.title)} | {_md_escape(p.authors)} | {_md_escape(p.source)} |")
    L.append("")
    for p in papers.values():
        L.append(f"## {p.short}")
        L.append("")
        L.append(f"*{_md_escape(p.title)}* — {_md_escape(p.authors)}; {_md_escape(p.source)}.")
        L.append("")
        if p.about:
            L.append(_md_escape(p.about))
            L.append("")
        if p.cites:
            L.append("| cited as | what the project takes from it |")
            L.append("|---|---|")
            for ref, what in p.cites:
                L.append(f"| {p.short} {_md_escape(ref)} | {_md_escape(what)} |")
            L.append("")
    return "\n".join(L)
