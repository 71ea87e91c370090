"""``REPORT.md``: the report as Markdown."""

from __future__ import annotations

import os
from pathlib import Path

from tiltlab.claims.registry import cite
from tiltlab.paper_checks.report.model import (
    _LAYER_ORDER,
    FAILED_TITLE,
    SPEC_DOCS,
    VERDICT_ORDER,
    ReportInput,
    _counts,
    _findings,
    _html_id,
    _layer_counts,
    _layer_label,
    _md_escape,
    _md_finding,
    _no_outcome_note,
    _paper,
    _provenance_note,
    _recorded_sentence,
    _short_numbers,
    claim_rows,
    command_list,
    other_threshold,
    status_sentence,
)

# --------------------------------------------------------------------------- markdown


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
        "*inconclusive* (a toy proxy that cannot decide an LLM-scale claim; the llm layer may), "
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
    if _recorded_sentence(inp):
        L.append(_recorded_sentence(inp))
        L.append("")
    L.append(f"**{status_sentence(inp.outcomes)}**")
    L.append("")
    papers_in_order = [*dict.fromkeys(r["paper"] for r in rows)]
    claim_ids = {r["id"] for r in rows}
    L.append("Contents: [Summary](#summary) · [Findings](#findings) · ")
    L[-1] += " · ".join(f"[{p}](#{_html_id('paper', p)})" for p in papers_in_order) + " · [Environment](#environment)"
    L.append("")
    # summary
    L.append('<a id="summary"></a>')
    L.append("")
    L.append("## Summary")
    L.append("")
    L.append(
        "Claims by paper (a claim's verdict is its most informative check's: error > refuted > partly > verified > "
        "inconclusive > out_of_reach; the claim heading names the layer that decided it)."
    )
    L.append("")
    L.append("| paper | " + " | ".join(VERDICT_ORDER) + " | total |")
    L.append("|---|" + "---|" * (len(VERDICT_ORDER) + 1))
    names = [*dict.fromkeys(r["paper"] for r in rows), "all"]
    for n in names:
        c = counts[n]
        label = "**all**" if n == "all" else f"[{n}](#{_html_id('paper', n)})"
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
                f"| {_layer_label(layer, inp.outcomes)} | "
                + " | ".join(str(c.get(v, 0)) for v in VERDICT_ORDER[:-1])
                + f" | {sum(c.values())} |"
            )
        L.append("")
    # findings
    fd = _findings(inp, rows)
    L.append('<a id="findings"></a>')
    L.append("")
    L.append("## Findings")
    L.append("")
    if fd["changed"]:
        L.append(f"### {FAILED_TITLE}")
        L.append("")
        L += [_md_finding(x, claim_ids) for x in fd["changed"]]
        L.append("")
    if fd["missing"]:
        L.append("### Figures missing or failed")
        L.append("")
        L += [_md_finding(x) for x in fd["missing"]]
        L.append("")
    L.append("### Claims refuted or only partly supported")
    L.append("")
    L += [_md_finding(x, claim_ids) for x in fd["claims"]] or ["- none"]
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
            L.append(f'<a id="{_html_id("paper", current)}"></a>')
            L.append("")
            L.append(f"## {current}" + (f" — {_md_escape(paper.title)}" if paper else ""))
            L.append("")
            if paper is not None:
                L.append(f"{_md_escape(paper.authors)}; {_md_escape(paper.source)}. Index: `docs/papers.md`.")
                L.append("")
            L.append(
                "Claims: "
                + ", ".join(
                    f"[{x['id']}](#{_html_id('claim', x['id'])}) ({x['status']})" for x in rows if x["paper"] == current
                )
            )
            L.append("")
        c = r["claim"]
        L.append(f'<a id="{_html_id("claim", r["id"])}"></a>')
        L.append("")
        by = f" (decided by {', '.join(r['decided_by'])})" if len({o.check.layer for o in r["outcomes"]}) > 1 else ""
        L.append(f"### `{r['id']}` — {r['status']}{by}")
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
                    f"- **{o.check.layer}** `{o.check.name}`: **{o.verdict}**{exp}{other_threshold(o)} — "
                    f"{_md_escape(o.result.summary)}"
                )
                note = _provenance_note(o, inp)
                if note:
                    L.append(f"  - {_md_escape(note).replace(chr(92) + '`', '`')}")
                if o.check.name != "llm_scale":
                    nums = _short_numbers(o.result.numbers)
                    if nums:
                        L.append(f"  - numbers: {_md_escape(nums)}")
        if c is not None and c.llm_command:
            cmds = command_list(c.llm_command)
            if len(cmds) == 1:
                L.append(f"- LLM-scale command: `{cmds[0]}`")
            else:
                L.append(f"- LLM-scale commands, in order ({len(cmds)}):")
                L += [f"  {i}. `{cmd}`" for i, cmd in enumerate(cmds, 1)]
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
    L.append('<a id="environment"></a>')
    L.append("")
    L.append("## Environment")
    L.append("")
    for k, v in sorted(inp.env.items()):
        L.append(f"- {k}: {v}")
    L.append(f"- seed: {inp.seed}")
    if inp.run_line:
        L.append(f"- {inp.run_line}")
    L.append("")
    return "\n".join(L)
