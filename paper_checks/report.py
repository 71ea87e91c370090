"""The report of a ``tiltlab reproduce`` run: ``REPORT.md`` and a self-contained ``report.html``.

Input: the check outcomes (:class:`tiltlab.paper_checks.registry.Outcome`), the simulator figure
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
"""

from __future__ import annotations

import base64
import html
import os
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tiltlab.paper_checks import registry
from tiltlab.paper_checks.registry import Claim, Outcome, Paper, cite

__all__ = [
    "SPEC_DOCS",
    "VERDICT_ORDER",
    "ReportInput",
    "claim_rows",
    "render_html",
    "render_markdown",
    "render_papers_markdown",
    "write_report",
]

#: The documents, in the repository, that a report sends its reader to.
SPEC_DOCS = (
    "`docs/math.md` (the objectives, estimators and claim ids in one notation) and `docs/papers.md` (the paper index)"
)

#: Column order of the summary tables.
VERDICT_ORDER = ("verified", "partly", "refuted", "out_of_reach", "error", "unchecked")

_LAYER_ORDER = {"theory": 0, "sim": 1, "data": 2, "llm": 3}


def _paper(short: str) -> Paper | None:
    return registry.papers().get(short)


@dataclass
class ReportInput:
    """Everything a report is rendered from.

    Attributes:
        claims: every declared claim (id -> Claim); claims without a check are "unchecked".
        outcomes: the check outcomes of this run.
        figures: figure records (``id``, ``title``, ``caption``, ``png``, ``claims``, ``findings``).
        missing_figures: ``figure id -> reason`` for figure modules missing or crashed.
        env: environment lines (name -> value), rendered in sorted order.
        seed: the seed of the run.
        quick: whether ``--quick`` was used.
        run_line: the one run-dependent line (generation time, runtime).
        out_dir: where the report is written (figure paths are made relative to it).
    """

    claims: Mapping[str, Claim]
    outcomes: Sequence[Outcome]
    figures: Sequence[Any] = ()
    missing_figures: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    seed: int = 0
    quick: bool = False
    run_line: str = ""
    out_dir: Path = Path(".")


# --------------------------------------------------------------------------- model


def _sorted_outcomes(outs: Iterable[Outcome]) -> list[Outcome]:
    return sorted(outs, key=lambda o: (o.check.claim_id, _LAYER_ORDER.get(o.check.layer, 9), o.check.name))


def claim_rows(inp: ReportInput) -> list[dict[str, Any]]:
    """One row per declared claim (and per undeclared claim that has an outcome), sorted
    by paper then id, with its outcomes and the figure ids that show it."""
    by_claim: dict[str, list[Outcome]] = defaultdict(list)
    for o in _sorted_outcomes(inp.outcomes):
        by_claim[o.check.claim_id].append(o)
    fig_for: dict[str, list[str]] = defaultdict(list)
    for f in inp.figures:
        for cid in getattr(f, "claims", []) or []:
            fig_for[cid].append(f.id)
    for o in inp.outcomes:
        if o.result is not None and o.result.figure:
            fig_for[o.check.claim_id].append(o.result.figure)
    rows = []
    for cid in sorted(set(inp.claims) | set(by_claim)):
        c = inp.claims.get(cid)
        outs = by_claim.get(cid, [])
        rows.append(
            {
                "id": cid,
                "claim": c,
                "paper": c.paper if c else "(undeclared)",
                "outcomes": outs,
                "figures": sorted(set(fig_for.get(cid, []))),
                "status": _claim_status(outs),
            }
        )
    order = {p: i for i, p in enumerate(registry.papers())}
    rows.sort(key=lambda r: (order.get(r["paper"], len(order)), r["paper"], r["id"]))
    return rows


def _no_outcome_note(claim_id: str) -> str:
    """Why a claim has no outcome in this run: no check at all, or only slow checks (skipped)."""
    if any(c.claim_id == claim_id for c in registry.checks()):
        return "not run in this mode: its checks are slow (run `tiltlab reproduce` without --quick, or `tiltlab check --slow`)."
    return "no check registered yet."


def _claim_status(outs: Sequence[Outcome]) -> str:
    """One verdict per claim: an error wins, then the most informative non-``out_of_reach``
    verdict (refuted > partly > verified), then ``out_of_reach``; no check -> unchecked."""
    if not outs:
        return "unchecked"
    vs = {o.verdict for o in outs}
    for v in ("error", "refuted", "partly", "verified", "out_of_reach"):
        if v in vs:
            return v
    return sorted(vs)[0]


def _counts(rows: Sequence[Mapping[str, Any]]) -> dict[str, Counter]:
    per: dict[str, Counter] = defaultdict(Counter)
    for r in rows:
        per[r["paper"]][r["status"]] += 1
        per["all"][r["status"]] += 1
    return per


def _layer_counts(outs: Sequence[Outcome]) -> dict[str, Counter]:
    per: dict[str, Counter] = defaultdict(Counter)
    for o in outs:
        per[o.check.layer][o.verdict] += 1
    return per


Finding = tuple[str, str, str]
"""``(head, text, code)``: rendered as **head** text `code` (code may be empty)."""


def _findings(inp: ReportInput, rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Finding]]:
    out: dict[str, list[Finding]] = {"claims": [], "figures": [], "changed": [], "missing": []}
    for r in rows:
        for o in r["outcomes"]:
            if o.result is not None and o.result.verdict.value in ("refuted", "partly"):
                out["claims"].append(
                    (
                        r["id"],
                        f"({cite(r['claim']) if r['claim'] else r['paper']}, {o.check.layer}) — {o.verdict}: {o.result.summary}",
                        "",
                    )
                )
            if not o.ok:
                what = "crashed" if o.result is None else f"returned {o.verdict}, expected {o.check.expected.value}"
                out["changed"].append((o.check.key, f"{what}; reproduce:", o.check.reproducer(inp.seed)))
    for f in sorted(inp.figures, key=lambda f: f.id):
        for line in getattr(f, "findings", []) or []:
            out["figures"].append((f.id, f"— {line}", ""))
    for fid, why in sorted(inp.missing_figures.items()):
        out["missing"].append((fid, f"— {why}", ""))
    return out


def _md_finding(f: Finding) -> str:
    head, text, code = f
    return f"- **{head}** {_md_escape(text)}" + (f" `{code}`" if code else "")


def _html_finding(f: Finding) -> str:
    head, text, code = f
    return (
        f"<li><b>{html.escape(head)}</b> {html.escape(text)}"
        + (f" <code>{html.escape(code)}</code>" if code else "")
        + "</li>"
    )


def _short_numbers(numbers: Mapping[str, Any], limit: int = 8) -> str:
    if not numbers:
        return ""
    items = sorted(numbers.items())
    shown = ", ".join(f"{k}={_fmt(v)}" for k, v in items[:limit])
    more = f", … (+{len(items) - limit} in claims.json)" if len(items) > limit else ""
    return shown + more


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


# --------------------------------------------------------------------------- markdown


def _md_escape(s: str) -> str:
    """Plain text inside Markdown: no table breaks, no accidental emphasis or raw HTML."""
    # (underscores are left alone: GitHub Markdown does not emphasize inside words)
    for a, b in (("|", "\\|"), ("*", "\\*"), ("`", "\\`"), ("<", "&lt;"), ("\n", " ")):
        s = s.replace(a, b)
    return s


def render_markdown(inp: ReportInput) -> str:
    rows = claim_rows(inp)
    counts = _counts(rows)
    figs = {f.id: f for f in inp.figures}
    L: list[str] = []
    L.append("# tiltlab — claims of the five papers, checked")
    L.append("")
    L.append(
        f"Seed {inp.seed}{' (quick mode)' if inp.quick else ''}. {len(rows)} claims, {len(inp.outcomes)} checks, "
        f"{len(inp.figures)} figures. Verdicts: *verified* (our check agrees), *partly*, *refuted* (a finding), "
        "*out_of_reach* (needs the LLM layer on GPUs; the paper's numbers and the command are recorded), "
        "*unchecked* (declared, no check yet), *error* (the check crashed)."
    )
    L.append("")
    L.append(
        "Layers: `theory` = symbolic (sympy), `sim` = exact float64 simulator, `data` = the paper's own numbers "
        "(`llm_scale`: recorded and cross-checked, not re-measured; `paper_internal`: the paper's text recomputed from its tables)."
    )
    L.append("")
    L.append(f"Claims are cited as paper and section (e.g. DISA §2.2 eq. (10)); see {SPEC_DOCS} in the repository.")
    L.append("")
    # summary
    L.append("## Summary")
    L.append("")
    L.append(
        "Claims by paper (a claim's verdict is its most informative check's: error > refuted > partly > verified > out_of_reach)."
    )
    L.append("")
    L.append("| paper | " + " | ".join(VERDICT_ORDER) + " | total |")
    L.append("|---|" + "---|" * (len(VERDICT_ORDER) + 1))
    names = [*dict.fromkeys(r["paper"] for r in rows), "all"]
    for n in names:
        c = counts[n]
        label = "**all**" if n == "all" else n
        L.append(f"| {label} | " + " | ".join(str(c.get(v, 0)) for v in VERDICT_ORDER) + f" | {sum(c.values())} |")
    L.append("")
    lc = _layer_counts(inp.outcomes)
    if lc:
        L.append("Checks by layer:")
        L.append("")
        L.append("| layer | " + " | ".join(VERDICT_ORDER[:-1]) + " | total |")
        L.append("|---|" + "---|" * len(VERDICT_ORDER))
        for layer in sorted(lc, key=lambda x: _LAYER_ORDER.get(x, 9)):
            c = lc[layer]
            L.append(
                f"| {layer} | " + " | ".join(str(c.get(v, 0)) for v in VERDICT_ORDER[:-1]) + f" | {sum(c.values())} |"
            )
        L.append("")
    # findings
    fd = _findings(inp, rows)
    L.append("## Findings")
    L.append("")
    if fd["changed"]:
        L.append("### Checks whose verdict changed or that crashed")
        L.append("")
        L += [_md_finding(x) for x in fd["changed"]]
        L.append("")
    if fd["missing"]:
        L.append("### Figures missing or failed")
        L.append("")
        L += [_md_finding(x) for x in fd["missing"]]
        L.append("")
    L.append("### Claims refuted or only partly supported")
    L.append("")
    L += [_md_finding(x) for x in fd["claims"]] or ["- none"]
    L.append("")
    L.append("### From the simulator figures")
    L.append("")
    L += [_md_finding(x) for x in fd["figures"]] or ["- none"]
    L.append("")
    # per paper
    shown: set[str] = set()
    current = None
    for r in rows:
        if r["paper"] != current:
            current = r["paper"]
            paper = _paper(current)
            L.append(f"## {current}" + (f" — {_md_escape(paper.title)}" if paper else ""))
            L.append("")
            if paper is not None:
                L.append(f"{_md_escape(paper.authors)}; {_md_escape(paper.source)}. Index: `docs/papers.md`.")
                L.append("")
        c = r["claim"]
        L.append(f"### `{r['id']}` — {r['status']}")
        L.append("")
        if c is not None:
            L.append(f"*{_md_escape(cite(c))}* · {c.kind}. {_md_escape(c.statement)}")
            L.append("")
        if not r["outcomes"]:
            L.append(f"- unchecked: {_no_outcome_note(r['id'])}")
        for o in r["outcomes"]:
            exp = "" if o.ok else f" (expected {o.check.expected.value})"
            if o.result is None:
                last = (o.error or "").strip().splitlines()[-1:] or [""]
                L.append(f"- **{o.check.layer}** `{o.check.name}`: **error**{exp} — {_md_escape(last[0])}")
            else:
                L.append(
                    f"- **{o.check.layer}** `{o.check.name}`: **{o.verdict}**{exp} — {_md_escape(o.result.summary)}"
                )
                if o.check.name != "llm_scale":
                    nums = _short_numbers(o.result.numbers)
                    if nums:
                        L.append(f"  - numbers: {_md_escape(nums)}")
        if c is not None and c.llm_command:
            L.append(f"- LLM-scale command: `{c.llm_command}`")
        for fid in r["figures"]:
            f = figs.get(fid)
            if f is None:
                L.append(f"- figure `{fid}`: not produced in this run")
                continue
            rel = os.path.relpath(Path(f.png), inp.out_dir).replace(os.sep, "/")
            if fid in shown:
                L.append(f"- figure: see [{fid}](#{fid}) above")
            else:
                shown.add(fid)
                L.append("")
                L.append(f'<a id="{fid}"></a>')
                L.append(f"![{_md_escape(f.title)}]({rel})")
                L.append("")
                L.append(f"*{fid}: {_md_escape(f.title)}.* {_md_escape(f.caption)}")
        L.append("")
    # figures not tied to any claim
    loose = sorted(fid for fid in figs if fid not in shown)
    if loose:
        L.append("## Other figures")
        L.append("")
        for fid in loose:
            f = figs[fid]
            rel = os.path.relpath(Path(f.png), inp.out_dir).replace(os.sep, "/")
            L.append(f"![{_md_escape(f.title)}]({rel})")
            L.append("")
            L.append(f"*{fid}: {_md_escape(f.title)}.* {_md_escape(f.caption)}")
            L.append("")
    # environment
    L.append("## Environment")
    L.append("")
    for k, v in sorted(inp.env.items()):
        L.append(f"- {k}: {v}")
    L.append(f"- seed: {inp.seed}")
    if inp.run_line:
        L.append(f"- {inp.run_line}")
    L.append("")
    return "\n".join(L)


# --------------------------------------------------------------------------- html

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;line-height:1.45;color:#222}
h1{border-bottom:2px solid #444}h2{border-bottom:1px solid #bbb;margin-top:2em}h3{margin-bottom:.3em;font-size:1.02em}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th:first-child,td:first-child{text-align:left}
code{background:#f4f4f4;padding:0 3px;border-radius:3px;font-size:.92em;word-break:break-word}
.v{font-weight:600;padding:0 5px;border-radius:3px}
.verified{background:#d8f0d8}.partly{background:#fbecc4}.refuted{background:#f7d0d0}.out_of_reach{background:#dde6f5}.error{background:#f09090}.unchecked{background:#eee}
.claim{margin:0 0 1.2em 0;padding:.3em .8em;border-left:4px solid #ddd}.stmt{color:#444}.nums{color:#555;font-size:.88em}
figure{margin:.8em 0}figure img{max-width:100%;border:1px solid #ddd}figcaption{font-size:.9em;color:#444}
"""


def _v(v: str) -> str:
    return f'<span class="v {html.escape(v)}">{html.escape(v)}</span>'


def _img_data(png: Path) -> str | None:
    try:
        data = Path(png).read_bytes()
    except OSError:
        return None
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def render_html(inp: ReportInput) -> str:
    rows = claim_rows(inp)
    counts = _counts(rows)
    figs = {f.id: f for f in inp.figures}
    e = html.escape
    H: list[str] = [
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        "<title>tiltlab report</title>",
        f"<style>{_CSS}</style></head><body>",
    ]
    H.append("<h1>tiltlab — claims of the five papers, checked</h1>")
    H.append(
        f"<p>Seed {inp.seed}{' (quick mode)' if inp.quick else ''}. {len(rows)} claims, {len(inp.outcomes)} checks, "
        f"{len(inp.figures)} figures. " + " ".join(_v(v) for v in VERDICT_ORDER) + "</p>"
    )
    H.append(
        "<p>Layers: <code>theory</code> symbolic (sympy), <code>sim</code> exact float64 simulator, <code>data</code> the paper's "
        "own numbers (<code>llm_scale</code>: recorded and cross-checked, not re-measured; <code>paper_internal</code>: the text recomputed from the tables).</p>"
    )
    H.append(
        "<p>Claims are cited as paper and section (e.g. DISA §2.2 eq. (10)); see <code>docs/math.md</code> (the objectives, "
        "estimators and claim ids in one notation) and <code>docs/papers.md</code> (the paper index) in the repository.</p>"
    )
    H.append(
        "<h2>Summary</h2><table><tr><th>paper</th>"
        + "".join(f"<th>{_v(v)}</th>" for v in VERDICT_ORDER)
        + "<th>total</th></tr>"
    )
    names = [*dict.fromkeys(r["paper"] for r in rows), "all"]
    for n in names:
        c = counts[n]
        lab = f"<b>{e(n)}</b>" if n == "all" else e(n)
        H.append(
            f"<tr><td>{lab}</td>"
            + "".join(f"<td>{c.get(v, 0)}</td>" for v in VERDICT_ORDER)
            + f"<td>{sum(c.values())}</td></tr>"
        )
    H.append("</table>")
    lc = _layer_counts(inp.outcomes)
    if lc:
        H.append(
            "<table><tr><th>layer</th>"
            + "".join(f"<th>{_v(v)}</th>" for v in VERDICT_ORDER[:-1])
            + "<th>total</th></tr>"
        )
        for layer in sorted(lc, key=lambda x: _LAYER_ORDER.get(x, 9)):
            c = lc[layer]
            H.append(
                f"<tr><td>{e(layer)}</td>"
                + "".join(f"<td>{c.get(v, 0)}</td>" for v in VERDICT_ORDER[:-1])
                + f"<td>{sum(c.values())}</td></tr>"
            )
        H.append("</table>")
    fd = _findings(inp, rows)
    H.append("<h2>Findings</h2>")
    for key, title in (
        ("changed", "Checks whose verdict changed or that crashed"),
        ("missing", "Figures missing or failed"),
        ("claims", "Claims refuted or only partly supported"),
        ("figures", "From the simulator figures"),
    ):
        if key in ("changed", "missing") and not fd[key]:
            continue
        H.append(f"<h3>{title}</h3><ul>" + ("".join(_html_finding(x) for x in fd[key]) or "<li>none</li>") + "</ul>")
    shown: set[str] = set()
    current = None
    for r in rows:
        if r["paper"] != current:
            current = r["paper"]
            paper = _paper(current)
            H.append(f"<h2>{e(current)}{' — ' + e(paper.title) if paper else ''}</h2>")
            if paper is not None:
                H.append(f"<p>{e(paper.authors)}; {e(paper.source)}. Index: <code>docs/papers.md</code>.</p>")
        c = r["claim"]
        H.append(f'<div class="claim" id="claim-{e(r["id"])}"><h3><code>{e(r["id"])}</code> {_v(r["status"])}</h3>')
        if c is not None:
            H.append(f'<p class="stmt"><i>{e(cite(c))}</i> · {e(c.kind)}. {e(c.statement)}</p>')
        H.append("<ul>")
        if not r["outcomes"]:
            H.append(f"<li>unchecked: {e(_no_outcome_note(r['id']))}</li>")
        for o in r["outcomes"]:
            exp = "" if o.ok else f" (expected {e(o.check.expected.value)})"
            if o.result is None:
                last = (o.error or "").strip().splitlines()[-1:] or [""]
                H.append(
                    f"<li><b>{e(o.check.layer)}</b> <code>{e(o.check.name)}</code>: {_v('error')}{exp} — {e(last[0])}</li>"
                )
            else:
                H.append(
                    f"<li><b>{e(o.check.layer)}</b> <code>{e(o.check.name)}</code>: {_v(o.verdict)}{exp} — {e(o.result.summary)}"
                )
                if o.check.name != "llm_scale":
                    nums = _short_numbers(o.result.numbers)
                    if nums:
                        H.append(f'<div class="nums">{e(nums)}</div>')
                H.append("</li>")
        if c is not None and c.llm_command:
            H.append(f"<li>LLM-scale command: <code>{e(c.llm_command)}</code></li>")
        H.append("</ul>")
        for fid in r["figures"]:
            f = figs.get(fid)
            if f is None:
                H.append(f"<p>figure <code>{e(fid)}</code>: not produced in this run</p>")
            elif fid in shown:
                H.append(f'<p>figure: see <a href="#{e(fid)}">{e(fid)}</a> above</p>')
            else:
                shown.add(fid)
                H.append(_html_figure(f))
        H.append("</div>")
    loose = sorted(fid for fid in figs if fid not in shown)
    if loose:
        H.append("<h2>Other figures</h2>")
        H += [_html_figure(figs[fid]) for fid in loose]
    H.append("<h2>Environment</h2><ul>")
    H += [f"<li>{e(k)}: {e(str(v))}</li>" for k, v in sorted(inp.env.items())]
    H.append(f"<li>seed: {inp.seed}</li>")
    if inp.run_line:
        H.append(f"<li>{e(inp.run_line)}</li>")
    H.append("</ul></body></html>")
    return "\n".join(H)


def _html_figure(f: Any) -> str:
    e = html.escape
    src = _img_data(Path(f.png))
    img = f'<img alt="{e(f.title)}" src="{src}">' if src else f"<p><i>image {e(str(f.png))} could not be read</i></p>"
    return (
        f'<figure id="{e(f.id)}">{img}<figcaption><b>{e(f.id)}: {e(f.title)}.</b> {e(f.caption)}</figcaption></figure>'
    )


def write_report(inp: ReportInput) -> tuple[Path, Path]:
    """Write ``REPORT.md`` and ``report.html`` into ``inp.out_dir``; return their paths."""
    out = Path(inp.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md, ht = out / "REPORT.md", out / "report.html"
    md.write_text(render_markdown(inp), encoding="utf-8")
    ht.write_text(render_html(inp), encoding="utf-8")
    return md, ht


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


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--papers-md"]:
        sys.exit("usage: python -m tiltlab.paper_checks.report --papers-md > docs/papers.md")
    sys.stdout.write(render_papers_markdown())
