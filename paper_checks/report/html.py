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
from tiltlab.paper_checks.report.folding import (
    Rule,
    all_rules,
    backbone_names,
    backbone_suffix,
    claim_groups,
    group_title,
    html_inline,
    rules_in,
    shared_statement,
)
from tiltlab.paper_checks.report.model import (
    _LAYER_ORDER,
    _REPO,
    FAILED_TITLE,
    RULES_INTRO,
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
    group_checks,
    merged_claim_findings,
    other_threshold,
    report_texts,
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


def _html_finding_linked(f: Finding, href: str | None, rules: Sequence[Rule] = ()) -> str:
    head, text, code = f
    return _html_finding_heads([(head, href)], text, code, rules)


def _html_finding_heads(heads: Sequence[tuple[str, str | None]], text: str, code: str, rules: Sequence[Rule]) -> str:
    return (
        "<li><b>"
        + ", ".join(_a(href, head) for head, href in heads)
        + f"</b> {html_inline(text, rules)}"
        + (f" <code>{html.escape(code)}</code>" if code else "")
        + "</li>"
    )


def _html_citation(c: Claim, out_dir: Path) -> str:
    return f"<i>{_a(_papers_href(c.paper, out_dir), cite(c))}</i>"


def _html_check(o: Outcome, out_dir: Path, note: str = "", rules: Sequence[Rule] = (), label: str = "") -> str:
    """A check's list item; ``label`` (HTML) names the backbone(s) it belongs to."""
    e = html.escape
    exp = "" if o.ok else f" (expected {e(o.check.expected.value)})"
    href, text = _source_ref(o, out_dir)
    src = f' <span class="src">[source: {_a(href, text)}]</span>'
    head = f"<li><b>{e(o.check.layer)}</b> <code>{e(o.check.name)}</code>{label}: "
    if o.result is None:
        last = (o.error or "").strip().splitlines()[-1:] or [""]
        return f"{head}{_v('error')}{exp} — {html_inline(last[0])}{src}</li>"
    out = f"{head}{_v(o.verdict)}{exp}{e(other_threshold(o))} — {html_inline(o.result.summary, rules)}{src}"
    if note:
        out += f'<div class="nums">{html_inline(note)}</div>'
    if o.check.name != "llm_scale":
        nums = _short_numbers(o.result.numbers)
        if nums:
            out += f'<div class="nums">{e(nums)}</div>'
    return out + "</li>"


def _html_toc(
    rows: Sequence[Mapping[str, Any]], figs: Mapping[str, Any], has_loose: bool, has_rules: bool = False
) -> str:
    """The sidebar: every claim by its full id (long ids wrap, never cut; ``title`` repeats the id)."""
    e = html.escape
    T = ['<nav id="toc"><b>Contents</b><ul>', '<li><a href="#summary">Summary</a></li>']
    T.append('<li><a href="#findings">Findings</a></li>')
    if has_rules:
        T.append('<li><a href="#rules">Decision rules</a></li>')
    by_paper: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        by_paper[r["paper"]].append(r)
    for paper, rs in by_paper.items():
        T.append(f'<li><a href="#{_html_id("paper", paper)}">{e(paper)}</a> ({len(rs)})<ul>')
        T += [
            f'<li title="{e(r["id"])}"><span class="dot {e(r["status"])}" title="{e(r["status"])}"></span>'
            f"{_claim_link(r['id'])}</li>"
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


def _html_commands(c: Claim | None, label: str = "") -> list[str]:
    e = html.escape
    if c is None or not c.llm_command:
        return []
    cmds = command_list(c.llm_command)
    if len(cmds) == 1:
        return [f"<li>LLM-scale command{label}: <code>{e(cmds[0])}</code></li>"]
    return [
        f"<li>LLM-scale commands{label}, in order ({len(cmds)}):<ol>"
        + "".join(f"<li><code>{e(cmd)}</code></li>" for cmd in cmds)
        + "</ol></li>"
    ]


def _html_claim_body(r: Mapping[str, Any], inp: ReportInput, rules: Sequence[Rule]) -> tuple[list[str], str, str]:
    """``(body, heading, citation)`` of one claim."""
    e = html.escape
    c = r["claim"]
    body: list[str] = []
    if c is not None:
        body.append(
            f'<p class="stmt">{_html_citation(c, inp.out_dir)} · {e(c.kind)}. {html_inline(c.statement, rules)}</p>'
        )
    body.append("<ul>")
    if not r["outcomes"]:
        body.append(f"<li>unchecked: {html_inline(_no_outcome_note(r['id']))}</li>")
    body += [_html_check(o, inp.out_dir, _provenance_note(o, inp), rules) for o in r["outcomes"]]
    body += _html_commands(c)
    body.append("</ul>")
    head = f"<code>{e(r['id'])}</code> {_v(r['status'])}"
    if len({o.check.layer for o in r["outcomes"]}) > 1:
        head += f" <small>decided by {e(', '.join(r['decided_by']))}</small>"
    return body, head, cite(c) if c is not None else ""


def _html_group_body(
    group: Sequence[Mapping[str, Any]], inp: ReportInput, rules: Sequence[Rule], bb_names: Mapping[str, str]
) -> tuple[list[str], str, str]:
    """``(body, heading, citation)`` of the claims of one table, one per backbone (see the Markdown twin)."""
    e = html.escape
    sfx = {r["id"]: (backbone_suffix(r["id"]) or ("", r["id"]))[1] for r in group}
    checks = group_checks(group, inp)
    T = [
        '<table class="group"><tr><th>claim</th><th>backbone</th><th>verdict</th>'
        + "".join(f"<th>{e(lay)} <code>{e(name)}</code></th>" for lay, name, _, _ in checks)
        + "</tr>"
    ]
    for r in group:
        cells = []
        for _lay, _name, _, pairs in checks:
            got = [o for x, o in pairs if x is r]
            cells.append(
                "<td>—</td>"
                if not got
                else f"<td>{_v(got[0].verdict)}"
                + ("" if got[0].ok else f" (expected {e(got[0].check.expected.value)})")
                + "</td>"
            )
        by = ""
        if len({o.check.layer for o in r["outcomes"]}) > 1:
            by = f" <small>decided by {e(', '.join(r['decided_by']))}</small>"
        # the first member's anchor is the group's element; the others' are their rows
        anchor = "" if r is group[0] else f' id="{e(_html_id("claim", r["id"]))}"'
        T.append(
            f"<tr{anchor}><td>"
            f"<code>{e(r['id'])}</code></td><td>{e(bb_names.get(sfx[r['id']], sfx[r['id']]))}</td>"
            f"<td>{_v(r['status'])}{by}</td>" + "".join(cells) + "</tr>"
        )
    T.append("</table>")
    body = ["".join(T)]
    claims = [r["claim"] for r in group]
    cite_line = ""
    if all(c is not None for c in claims):
        cites = {cite(c) for c in claims}
        lead = ""
        if len(cites) == 1:
            cite_line = next(iter(cites))
            lead = f"{_html_citation(claims[0], inp.out_dir)} · "
        kinds = {c.kind for c in claims}
        lead += f"{e(kinds.pop())}. " if len(kinds) == 1 else ""
        shared = shared_statement([c.statement for c in claims], [bb_names.get(sfx[r["id"]], "") for r in group])
        if shared is None:
            body.append(
                f'<p class="stmt">{lead}Statements:</p><ul class="stmt">'
                + "".join(
                    f"<li><code>{e(sfx[r['id']])}</code>: {html_inline(r['claim'].statement, rules)}</li>"
                    for r in group
                )
                + "</ul>"
            )
        else:
            text, parts = shared
            body.append(f'<p class="stmt">{lead}{html_inline(text, rules)}</p>')
            if any(parts):
                body.append(
                    '<p class="stmt">Where the statements differ (⟨…⟩):</p><ul class="stmt">'
                    + "".join(
                        f"<li><code>{e(sfx[r['id']])}</code>: {html_inline(p, rules)}</li>"
                        for r, p in zip(group, parts)
                    )
                    + "</ul>"
                )
    body.append("<ul>")
    for _lay, _name, shared_check, pairs in checks:
        if shared_check:
            o = pairs[0][1]
            body.append(
                _html_check(
                    o,
                    inp.out_dir,
                    _provenance_note(o, inp),
                    rules,
                    " <small>(every backbone: one run, shown once)</small>",
                )
            )
        else:
            body += [
                _html_check(o, inp.out_dir, _provenance_note(o, inp), rules, f" · <code>{e(sfx[r['id']])}</code>")
                for r, o in pairs
            ]
    for r in group:
        if not r["outcomes"]:
            body.append(f"<li><code>{e(sfx[r['id']])}</code> unchecked: {html_inline(_no_outcome_note(r['id']))}</li>")
    cmds = [c.llm_command if c is not None else None for c in claims]
    if len(set(cmds)) == 1:
        body += _html_commands(claims[0], " (every backbone)")
    else:
        for r in group:
            body += _html_commands(r["claim"], f" · <code>{e(sfx[r['id']])}</code>")
    body.append("</ul>")
    head = f"<code>{e(group_title(group))}</code> " + " ".join(_v(r["status"]) for r in group)
    return body, head, cite_line


def render_html(inp: ReportInput) -> str:
    rows = claim_rows(inp)
    counts = _counts(rows)
    figs = {f.id: f for f in inp.figures}
    e = html.escape
    rules = all_rules()
    used_rules = rules_in(report_texts(rows), rules)
    bb_names = backbone_names(inp.claims)
    claimed = {fid for r in rows for fid in r["figures"] if fid in figs}
    loose = sorted(fid for fid in figs if fid not in claimed)
    H: list[str] = [
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>tiltlab report</title>",
        f"<style>\n{_CSS}</style></head><body>",
        _html_toc(rows, figs, bool(loose), bool(used_rules)),
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
        H.append(f"<p>{html_inline(_recorded_sentence(inp))}</p>")
    n_failed = sum(not o.ok for o in inp.outcomes)
    H.append(
        f'<p class="status {"failed" if n_failed else "passed"}"><b>{html_inline(status_sentence(inp.outcomes))}</b>'
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
        if key == "claims":
            items = "".join(
                _html_finding_heads([(h, claim_href(h)) for h in heads], text, code, rules)
                for heads, text, code in merged_claim_findings(fd[key])
            )
        else:
            items = "".join(_html_finding_linked(x, link_for[key](x[0])) for x in fd[key])
        H.append(f"<h3>{title}</h3><ul>" + (items or "<li>none</li>") + "</ul>")
    if used_rules:
        H.append(f'<h2 id="rules">Decision rules</h2><p>{e(RULES_INTRO)}</p><ul class="rules">')
        H += [
            f'<li id="{e(rule.anchor)}"><b>{e(rule.name)}</b> ({e(rule.what)}): {html_inline(rule.body)}</li>'
            for rule in used_rules
        ]
        H.append("</ul>")
    shown: set[str] = set()
    first_fig = True
    groups_by_paper: dict[str, list[list[Mapping[str, Any]]]] = defaultdict(list)
    for g in claim_groups(rows):
        groups_by_paper[g[0]["paper"]].append(g)
    for paper_name in by_paper:
        paper = _paper(paper_name)
        H.append(
            f'<h2 id="{e(_html_id("paper", paper_name))}">{e(paper_name)}{" — " + e(paper.title) if paper else ""}</h2>'
        )
        if paper is not None:
            idx = _a(_papers_href(paper_name, inp.out_dir), "docs/papers.md")
            H.append(f"<p>{e(paper.authors)}; {e(paper.source)}. Index: <code>{idx}</code>.</p>")
        for group in groups_by_paper[paper_name]:
            r = group[0]
            cid = e(_html_id("claim", r["id"]))
            if len(group) == 1:
                body, head, cite_line = _html_claim_body(r, inp, rules)
            else:
                body, head, cite_line = _html_group_body(group, inp, rules, bb_names)
            for fid in sorted({fid for x in group for fid in x["figures"]}):
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
            if all(x["status"] == "out_of_reach" for x in group):
                # out of reach: the paper's numbers and the LLM command, folded away
                H.append(f'<details class="claim" id="{cid}"><summary>{head}')
                if cite_line:
                    H.append(f" — {e(cite_line)}")
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
