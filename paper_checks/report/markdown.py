"""``REPORT.md``: the report as Markdown."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
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
    md_inline,
    rules_in,
    shared_statement,
)
from tiltlab.paper_checks.report.model import (
    _LAYER_ORDER,
    FAILED_TITLE,
    RULES_INTRO,
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
    group_checks,
    merged_claim_findings,
    other_threshold,
    report_texts,
    status_sentence,
)

# --------------------------------------------------------------------------- markdown


def _md_check(o: Outcome, inp: ReportInput, rules: Sequence[Rule], label: str = "") -> list[str]:
    """A check's line (and its provenance and numbers lines); ``label`` names the backbone(s) it belongs to."""
    exp = "" if o.ok else f" (expected {o.check.expected.value})"
    head = f"- **{o.check.layer}** `{o.check.name}`{label}: "
    if o.result is None:
        last = (o.error or "").strip().splitlines()[-1:] or [""]
        return [f"{head}**error**{exp} — {md_inline(last[0])}"]
    out = [f"{head}**{o.verdict}**{exp}{other_threshold(o)} — {md_inline(o.result.summary, rules)}"]
    note = _provenance_note(o, inp)
    if note:
        out.append(f"  - {md_inline(note)}")
    if o.check.name != "llm_scale":
        nums = _short_numbers(o.result.numbers)
        if nums:
            out.append(f"  - numbers: {_md_escape(nums)}")
    return out


def _md_commands(c: Claim | None, label: str = "") -> list[str]:
    if c is None or not c.llm_command:
        return []
    cmds = command_list(c.llm_command)
    if len(cmds) == 1:
        return [f"- LLM-scale command{label}: `{cmds[0]}`"]
    return [f"- LLM-scale commands{label}, in order ({len(cmds)}):"] + [
        f"  {i}. `{cmd}`" for i, cmd in enumerate(cmds, 1)
    ]


def _md_claim(r: Mapping[str, Any], inp: ReportInput, rules: Sequence[Rule]) -> list[str]:
    c = r["claim"]
    L = [f'<a id="{_html_id("claim", r["id"])}"></a>', ""]
    by = f" (decided by {', '.join(r['decided_by'])})" if len({o.check.layer for o in r["outcomes"]}) > 1 else ""
    L += [f"### `{r['id']}` — {r['status']}{by}", ""]
    if c is not None:
        L += [f"*{_md_escape(cite(c))}* · {c.kind}. {md_inline(c.statement, rules)}", ""]
    if not r["outcomes"]:
        L.append(f"- unchecked: {md_inline(_no_outcome_note(r['id']))}")
    for o in r["outcomes"]:
        L += _md_check(o, inp, rules)
    return L + _md_commands(c)


def _md_group(
    group: Sequence[Mapping[str, Any]], inp: ReportInput, rules: Sequence[Rule], bb_names: Mapping[str, str]
) -> list[str]:
    """The claims of one table, one per backbone, as one section: what they share once, what differs per
    backbone (a table of verdicts; the statement's differing words; the checks that differ)."""
    sfx = {r["id"]: (backbone_suffix(r["id"]) or ("", r["id"]))[1] for r in group}
    L = [f'<a id="{_html_id("claim", r["id"])}"></a>' for r in group] + [""]
    L += [f"### `{group_title(group)}` — {len(group)} backbones: " + ", ".join(r["status"] for r in group), ""]
    checks = group_checks(group, inp)
    L.append("| claim | backbone | verdict | " + " | ".join(f"{lay} `{name}`" for lay, name, _, _ in checks) + " |")
    L.append("|---|---|---|" + "---|" * len(checks))
    for r in group:
        by = f" (decided by {', '.join(r['decided_by'])})" if len({o.check.layer for o in r["outcomes"]}) > 1 else ""
        cells = []
        for _lay, _name, _, pairs in checks:
            got = [o for x, o in pairs if x is r]
            cells.append(
                "—" if not got else got[0].verdict + ("" if got[0].ok else f" (expected {got[0].check.expected.value})")
            )
        L.append(
            f"| [`{r['id']}`](#{_html_id('claim', r['id'])}) | {_md_escape(bb_names.get(sfx[r['id']], sfx[r['id']]))} "
            f"| **{r['status']}**{by} | " + " | ".join(cells) + " |"
        )
    L.append("")
    claims = [r["claim"] for r in group]
    if all(c is not None for c in claims):
        cites = {cite(c) for c in claims}
        lead = f"*{_md_escape(cites.pop())}* · " if len(cites) == 1 else ""
        kinds = {c.kind for c in claims}
        lead += f"{kinds.pop()}. " if len(kinds) == 1 else ""
        shared = shared_statement([c.statement for c in claims], [bb_names.get(sfx[r["id"]], "") for r in group])
        if shared is None:
            L.append(f"{lead}Statements:")
            L += [f"- `{sfx[r['id']]}`: {md_inline(r['claim'].statement, rules)}" for r in group]
        else:
            text, parts = shared
            L.append(f"{lead}{md_inline(text, rules)}")
            if any(parts):
                L.append("")
                L.append("Where the statements differ (⟨…⟩):")
                L += [f"- `{sfx[r['id']]}`: {md_inline(p, rules)}" for r, p in zip(group, parts)]
        L.append("")
    for _lay, _name, shared_check, pairs in checks:
        if shared_check:
            L += _md_check(pairs[0][1], inp, rules, " (every backbone: one run, shown once)")
        else:
            for r, o in pairs:
                L += _md_check(o, inp, rules, f" · `{sfx[r['id']]}`")
    for r in group:
        if not r["outcomes"]:
            L.append(f"- `{sfx[r['id']]}` unchecked: {md_inline(_no_outcome_note(r['id']))}")
    cmds = [r["claim"].llm_command if r["claim"] is not None else None for r in group]
    if len(set(cmds)) == 1:
        L += _md_commands(group[0]["claim"], " (every backbone)")
    else:
        for r in group:
            L += _md_commands(r["claim"], f" · `{sfx[r['id']]}`")
    return L


def render_markdown(inp: ReportInput) -> str:
    rows = claim_rows(inp)
    counts = _counts(rows)
    figs = {f.id: f for f in inp.figures}
    rules = all_rules()
    used_rules = rules_in(report_texts(rows), rules)
    bb_names = backbone_names(inp.claims)
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
    L.append(
        "Contents: [Summary](#summary) · [Findings](#findings) · "
        + ("[Decision rules](#rules) · " if used_rules else "")
    )
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
    L += [
        "- **"
        + ", ".join(f"[{h}](#{_html_id('claim', h)})" if h in claim_ids else h for h in heads)
        + "** "
        + md_inline(text, rules)
        for heads, text, _ in merged_claim_findings(fd["claims"])
    ] or ["- none"]
    L.append("")
    L.append("### From the simulator figures")
    L.append("")
    L += [_md_finding(x) for x in fd["figures"]] or ["- none"]
    L.append("")
    # the decision rules, stated once
    if used_rules:
        L.append('<a id="rules"></a>')
        L.append("")
        L.append("## Decision rules")
        L.append("")
        L.append(RULES_INTRO)
        L.append("")
        for rule in used_rules:
            L.append(f'- <a id="{rule.anchor}"></a>**{rule.name}** ({rule.what}): {md_inline(rule.body)}')
        L.append("")
    # per paper
    shown: set[str] = set()
    current = None
    for group in claim_groups(rows):
        r = group[0]
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
        if len(group) == 1:
            L += _md_claim(r, inp, rules)
        else:
            L += _md_group(group, inp, rules, bb_names)
        for fid in sorted({fid for x in group for fid in x["figures"]}):
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
