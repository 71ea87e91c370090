"""``report.html``: the report as one self-contained HTML page (its style sheet is ``report.css``, inlined)."""

from __future__ import annotations

import base64
import html
import os
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tiltlab.claims.registry import Claim, Outcome, cite
from tiltlab.paper_checks.report.model import (
    _LAYER_ORDER,
    _REPO,
    FAILED_TITLE,
    VERDICT_ORDER,
    Finding,
    ReportInput,
    _counts,
    _findings,
    _html_id,
    _layer_counts,
    _layer_label,
    _no_outcome_note,
    _paper,
    _papers_href,
    _provenance_note,
    _recorded_sentence,
    _repo_href,
    _short_numbers,
    _source_ref,
    claim_rows,
    command_list,
    other_threshold,
    status_sentence,
)

# --------------------------------------------------------------------------- html

#: The page's style sheet (``report.css`` beside this module), inlined into every report.
_CSS = (Path(__file__).with_name("report.css")).read_text(encoding="utf-8")


def _v(v: str) -> str:
    return f'<span class="v {html.escape(v)}">{html.escape(v)}</span>'


def _img_data(png: Path) -> str | None:
    try:
        data = Path(png).read_bytes()
    except OSError:
        return None
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def _a(href: str | None, text: str, cls: str = "") -> str:
    """An escaped link, or the escaped text alone when there is nothing to link to."""
    c = f' class="{cls}"' if cls else ""
    if href is None:
        return f"<span{c}>{html.escape(text)}</span>" if cls else html.escape(text)
    return f'<a href="{html.escape(href)}"{c}>{html.escape(text)}</a>'


def _claim_link(cid: str, status: str | None = None) -> str:
    cls = f"v {status}" if status else ""
    return _a(f"#{_html_id('claim', cid)}", cid, cls)


def _html_finding_linked(f: Finding, href: str | None) -> str:
    head, text, code = f
    return (
        f"<li><b>{_a(href, head)}</b> {html.escape(text)}"
        + (f" <code>{html.escape(code)}</code>" if code else "")
        + "</li>"
    )


def _html_citation(c: Claim, out_dir: Path) -> str:
    return f"<i>{_a(_papers_href(c.paper, out_dir), cite(c))}</i>"


def _html_check(o: Outcome, out_dir: Path, note: str = "") -> str:
    e = html.escape
    exp = "" if o.ok else f" (expected {e(o.check.expected.value)})"
    href, text = _source_ref(o, out_dir)
    src = f' <span class="src">[source: {_a(href, text)}]</span>'
    head = f"<li><b>{e(o.check.layer)}</b> <code>{e(o.check.name)}</code>: "
    if o.result is None:
        last = (o.error or "").strip().splitlines()[-1:] or [""]
        return f"{head}{_v('error')}{exp} — {e(last[0])}{src}</li>"
    out = f"{head}{_v(o.verdict)}{exp}{e(other_threshold(o))} — {e(o.result.summary)}{src}"
    if note:
        out += f'<div class="nums">{e(note)}</div>'
    if o.check.name != "llm_scale":
        nums = _short_numbers(o.result.numbers)
        if nums:
            out += f'<div class="nums">{e(nums)}</div>'
    return out + "</li>"


def _html_toc(rows: Sequence[Mapping[str, Any]], figs: Mapping[str, Any], has_loose: bool) -> str:
    e = html.escape
    T = ['<nav id="toc"><b>Contents</b><ul>', '<li><a href="#summary">Summary</a></li>']
    T.append('<li><a href="#findings">Findings</a></li>')
    by_paper: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        by_paper[r["paper"]].append(r)
    for paper, rs in by_paper.items():
        T.append(f'<li><a href="#{_html_id("paper", paper)}">{e(paper)}</a> ({len(rs)})<ul>')
        T += [
            f'<li><span class="dot {e(r["status"])}" title="{e(r["status"])}"></span>{_claim_link(r["id"])}</li>'
            for r in rs
        ]
        T.append("</ul></li>")
    if figs:
        T.append('<li><a href="#figures">Figures</a><ul>')
        T += [f'<li><a href="#{e(fid)}">{e(fid)}</a></li>' for fid in sorted(figs)]
        T.append("</ul></li>")
    if has_loose:
        T.append('<li><a href="#other-figures">Other figures</a></li>')
    T.append('<li><a href="#environment">Environment</a></li></ul></nav>')
    return "\n".join(T)


def render_html(inp: ReportInput) -> str:
    rows = claim_rows(inp)
    counts = _counts(rows)
    figs = {f.id: f for f in inp.figures}
    e = html.escape
    claimed = {fid for r in rows for fid in r["figures"] if fid in figs}
    loose = sorted(fid for fid in figs if fid not in claimed)
    H: list[str] = [
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>tiltlab report</title>",
        f"<style>\n{_CSS}</style></head><body>",
        _html_toc(rows, figs, bool(loose)),
        "<main>",
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
    if _recorded_sentence(inp):
        H.append(f"<p>{e(_recorded_sentence(inp))}</p>")
    n_failed = sum(not o.ok for o in inp.outcomes)
    H.append(
        f'<p class="status {"failed" if n_failed else "passed"}"><b>{e(status_sentence(inp.outcomes))}</b>'
        + (' <a href="#findings">Findings</a></p>' if n_failed else "</p>")
    )
    math_href, _ = _repo_href(_REPO / "docs" / "math.md", inp.out_dir)
    papers_href, _ = _repo_href(_REPO / "docs" / "papers.md", inp.out_dir)
    H.append(
        "<p>Claims are cited as paper and section (e.g. DISA §2.2 eq. (10)); see "
        f"<code>{_a(math_href, 'docs/math.md')}</code> (the objectives, estimators and claim ids in one notation) and "
        f"<code>{_a(papers_href, 'docs/papers.md')}</code> (the paper index) in the repository. Each check names "
        "the file and line that defines it.</p>"
    )
    H.append(
        "<h2 id=\"summary\">Summary</h2><p>Claims by paper (a claim's verdict is its most informative check's: "
        "error &gt; refuted &gt; partly &gt; verified &gt; inconclusive &gt; out_of_reach).</p><table><tr><th>paper</th>"
        + "".join(f"<th>{_v(v)}</th>" for v in VERDICT_ORDER)
        + "<th>total</th></tr>"
    )
    by_paper: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        by_paper[r["paper"]].append(r)
    for n in [*by_paper, "all"]:
        c = counts[n]
        lab = "<b>all</b>" if n == "all" else _a(f"#{_html_id('paper', n)}", n)
        ids = "" if n == "all" else " ".join(_claim_link(r["id"], r["status"]) for r in by_paper[n])
        H.append(
            f"<tr><td>{lab}</td>"
            + "".join(f"<td>{c.get(v, 0)}</td>" for v in VERDICT_ORDER)
            + f"<td>{sum(c.values())}</td></tr>"
            + (f'<tr><td></td><td class="ids" colspan="{len(VERDICT_ORDER) + 1}">{ids}</td></tr>' if ids else "")
        )
    H.append("</table>")
    lc = _layer_counts(inp.outcomes)
    if lc:
        H.append(
            "<p>Checks by layer:</p><table><tr><th>layer</th>"
            + "".join(f"<th>{_v(v)}</th>" for v in VERDICT_ORDER[:-1])
            + "<th>total</th></tr>"
        )
        for layer in sorted(lc, key=lambda x: _LAYER_ORDER.get(x, 9)):
            c = lc[layer]
            H.append(
                f"<tr><td>{e(_layer_label(layer, inp.outcomes))}</td>"
                + "".join(f"<td>{c.get(v, 0)}</td>" for v in VERDICT_ORDER[:-1])
                + f"<td>{sum(c.values())}</td></tr>"
            )
        H.append("</table>")
    fd = _findings(inp, rows)
    known = {r["id"] for r in rows}

    def claim_href(cid: str) -> str | None:
        return f"#{_html_id('claim', cid)}" if cid in known else None

    link_for = {
        "changed": lambda head: claim_href(head.split("[", 1)[0]),
        "missing": lambda head: None,
        "claims": claim_href,
        "figures": lambda head: f"#{head}" if head in figs else None,
    }
    H.append('<h2 id="findings">Findings</h2>')
    for key, title in (
        ("changed", FAILED_TITLE),
        ("missing", "Figures missing or failed"),
        ("claims", "Claims refuted or only partly supported"),
        ("figures", "From the simulator figures"),
    ):
        if key in ("changed", "missing") and not fd[key]:
            continue
        items = "".join(_html_finding_linked(x, link_for[key](x[0])) for x in fd[key])
        H.append(f"<h3>{title}</h3><ul>" + (items or "<li>none</li>") + "</ul>")
    shown: set[str] = set()
    first_fig = True
    for paper_name, rs in by_paper.items():
        paper = _paper(paper_name)
        H.append(
            f'<h2 id="{e(_html_id("paper", paper_name))}">{e(paper_name)}{" — " + e(paper.title) if paper else ""}</h2>'
        )
        if paper is not None:
            idx = _a(_papers_href(paper_name, inp.out_dir), "docs/papers.md")
            H.append(f"<p>{e(paper.authors)}; {e(paper.source)}. Index: <code>{idx}</code>.</p>")
        for r in rs:
            c = r["claim"]
            cid = e(_html_id("claim", r["id"]))
            body: list[str] = []
            if c is not None:
                body.append(f'<p class="stmt">{_html_citation(c, inp.out_dir)} · {e(c.kind)}. {e(c.statement)}</p>')
            body.append("<ul>")
            if not r["outcomes"]:
                body.append(f"<li>unchecked: {e(_no_outcome_note(r['id']))}</li>")
            body += [_html_check(o, inp.out_dir, _provenance_note(o, inp)) for o in r["outcomes"]]
            if c is not None and c.llm_command:
                cmds = command_list(c.llm_command)
                if len(cmds) == 1:
                    body.append(f"<li>LLM-scale command: <code>{e(cmds[0])}</code></li>")
                else:
                    body.append(
                        f"<li>LLM-scale commands, in order ({len(cmds)}):<ol>"
                        + "".join(f"<li><code>{e(cmd)}</code></li>" for cmd in cmds)
                        + "</ol></li>"
                    )
            body.append("</ul>")
            for fid in r["figures"]:
                f = figs.get(fid)
                if f is None:
                    body.append(f"<p>figure <code>{e(fid)}</code>: not produced in this run</p>")
                elif fid in shown:
                    body.append(f'<p>figure: see <a href="#{e(fid)}">{e(fid)}</a> above</p>')
                else:
                    shown.add(fid)
                    if first_fig:
                        body.append('<span id="figures"></span>')
                        first_fig = False
                    body.append(_html_figure(f, known))
            head = f"<code>{e(r['id'])}</code> {_v(r['status'])}"
            if len({o.check.layer for o in r["outcomes"]}) > 1:
                head += f" <small>decided by {e(', '.join(r['decided_by']))}</small>"
            if r["status"] == "out_of_reach":
                # out of reach: the paper's numbers and the LLM command, folded away
                H.append(f'<details class="claim" id="{cid}"><summary>{head}')
                if c is not None:
                    H.append(f" — {e(cite(c))}")
                H.append("</summary>" + "".join(body) + "</details>")
            else:
                H.append(f'<div class="claim" id="{cid}"><h3>{head}</h3>' + "".join(body) + "</div>")
    if loose:
        H.append('<h2 id="other-figures">Other figures</h2>')
        if first_fig:
            H.append('<span id="figures"></span>')
        H += [_html_figure(figs[fid], known) for fid in loose]
    H.append('<h2 id="environment">Environment</h2><ul>')
    H += [f"<li>{e(k)}: {e(str(v))}</li>" for k, v in sorted(inp.env.items())]
    H.append(f"<li>seed: {inp.seed}</li>")
    if inp.run_line:
        H.append(f"<li>{e(inp.run_line)}</li>")
    H.append("</ul></main></body></html>")
    return "\n".join(H)


def figures_json(figures: Iterable[Any], out_dir: Path) -> list[dict[str, Any]]:
    """The figure records for ``claims.json``: sorted by id, paths relative to ``out_dir`` (where the
    record is written), so a results folder can be moved or shared."""
    rows = []
    for f in sorted(figures, key=lambda f: f.id):
        d = f.to_json() if hasattr(f, "to_json") else dict(vars(f))
        for k in ("png", "data"):
            if d.get(k):
                d[k] = os.path.relpath(Path(d[k]).resolve(), Path(out_dir).resolve()).replace(os.sep, "/")
        rows.append(d)
    return rows


def _html_figure(f: Any, known: set[str] = frozenset()) -> str:
    e = html.escape
    src = _img_data(Path(f.png))
    img = (
        f'<img alt="{e(f.title)}" src="{src}">'
        if src
        else f"<p><i>image {e(Path(f.png).name)} could not be read</i></p>"
    )
    cl = [cid for cid in getattr(f, "claims", []) or [] if cid in known]
    sup = (" Claims: " + ", ".join(_claim_link(cid) for cid in cl) + ".") if cl else ""
    return (
        f'<figure id="{e(f.id)}">{img}<figcaption><b>{e(f.id)}: {e(f.title)}.</b> {e(f.caption)}{sup}</figcaption>'
        "</figure>"
    )
