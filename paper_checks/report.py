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
import inspect
import os
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tiltlab.files import write_text
from tiltlab.paper_checks import registry
from tiltlab.paper_checks.registry import Claim, Outcome, Paper, cite

__all__ = [
    "SPEC_DOCS",
    "VERDICT_ORDER",
    "ReportInput",
    "claim_decision",
    "claim_rows",
    "claim_status",
    "figures_json",
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
VERDICT_ORDER = ("verified", "partly", "refuted", "inconclusive", "out_of_reach", "error", "unchecked")

#: Which verdict decides a claim with several checks, most decisive first.
DECISION_ORDER = ("error", "refuted", "partly", "verified", "inconclusive", "out_of_reach")

_LAYER_ORDER = {"theory": 0, "sim": 1, "data": 2, "llm": 3}


#: The repository root (the folder holding ``paper_checks/``); source and doc links are relative to it.
_REPO = Path(__file__).resolve().parents[1]


def _paper(short: str) -> Paper | None:
    return registry.papers().get(short)


def _slug(text: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped, spaces -> ``-``."""
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def _html_id(prefix: str, text: str) -> str:
    return f"{prefix}-" + re.sub(r"[^A-Za-z0-9_.\-]", "-", text)


def _repo_href(target: Path, out_dir: Path, fragment: str = "") -> tuple[str | None, str | None]:
    """``(href, label)`` for a file of the repository seen from a report written into ``out_dir``.

    ``label`` is the path relative to the repository (``None`` when ``target`` is outside it);
    ``href`` is a relative link, given only when ``out_dir`` is inside the repository too (a report
    copied elsewhere would otherwise carry dead links)."""
    try:
        label = Path(target).resolve().relative_to(_REPO).as_posix()
    except ValueError:
        return None, None
    try:
        Path(out_dir).resolve().relative_to(_REPO)
    except ValueError:
        return None, label
    href = os.path.relpath(Path(target).resolve(), Path(out_dir).resolve()).replace(os.sep, "/")
    return href + fragment, label


def _check_source(check: Any) -> tuple[Path, int] | None:
    """File and first line of a registered check function (``None`` for a builtin or lost source)."""
    fn = inspect.unwrap(check.fn)
    if getattr(fn, "__name__", "") == "_not_loaded":  # a recorded row whose check module is not loaded
        return None
    try:
        path = inspect.getsourcefile(fn)
        line = inspect.getsourcelines(fn)[1]
    except (OSError, TypeError):
        return None
    return (Path(path), line) if path else None


def _source_ref(check: Any, out_dir: Path) -> tuple[str | None, str]:
    """``(href, text)`` naming where a check is defined: ``sim/checks/estimators.py:120``."""
    src = _check_source(check)
    if src is None:
        return None, "source unavailable"
    path, line = src
    href, label = _repo_href(path, out_dir, f"#L{line}")
    return href, f"{label or path}:{line}"


def _papers_href(paper: str, out_dir: Path) -> str | None:
    """Link to the paper's section of ``docs/papers.md`` (``None`` when that file is not reachable)."""
    doc = _REPO / "docs" / "papers.md"
    if not doc.is_file() or f"## {paper}\n" not in doc.read_text(encoding="utf-8"):
        return None
    return _repo_href(doc, out_dir, f"#{_slug(paper)}")[0]


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
    run_id: str = ""


def _provenance_note(o: Outcome, inp: ReportInput) -> str:
    """Where a number came from, when not from the run this report describes: the shipped llm
    record (``recorded``) or an earlier run merged into the record (time, mode, commit, command)."""
    prov = getattr(o, "provenance", None) or {}
    if not prov:
        return ""
    if prov.get("source") != "recorded" and (not inp.run_id or prov.get("run_id") == inp.run_id):
        return ""
    from tiltlab.paper_checks.prereg import legacy_for
    from tiltlab.paper_checks.record import provenance_line
    from tiltlab.paper_checks.registry import legacy_runs

    line = provenance_line(prov)
    if prov.get("source") == "recorded" and legacy_for({**prov, "check": o.check.name}, legacy_runs()):
        line += ", legacy pre-registration (not strictly pre-registered: paper_checks/preregistration.toml)"
    return line


def _recorded_sentence(inp: ReportInput) -> str:
    """One sentence on the outcomes not measured by this run (shipped llm record, earlier runs)."""
    notes = [(o, _provenance_note(o, inp)) for o in inp.outcomes]
    rec = [o for o, n in notes if n and (o.provenance or {}).get("source") == "recorded"]  # type: ignore[attr-defined]
    old = [o for o, n in notes if n and (o.provenance or {}).get("source") != "recorded"]  # type: ignore[attr-defined]
    parts = []
    if rec:
        p = rec[0].provenance  # type: ignore[attr-defined]
        parts.append(
            f"{len(rec)} {'llm ' if all(o.check.layer == 'llm' for o in rec) else ''}checks are recorded, not re-run: "
            f"they come from the last full llm-layer run shipped with the repository (commit {p.get('commit')}, "
            f"{p.get('run_at')}); `tiltlab reproduce --llm` re-runs them."
        )
    if old:
        parts.append(
            f"{len(old)} checks come from earlier runs merged into this record; each names its time, mode and commit."
        )
    return " ".join(parts)


def _layer_label(layer: str, outs: Sequence[Outcome]) -> str:
    """``llm (recorded)`` when every outcome of the layer comes from the shipped record."""
    mine = [o for o in outs if o.check.layer == layer]
    rec = [o for o in mine if (getattr(o, "provenance", None) or {}).get("source") == "recorded"]
    return f"{layer} (recorded)" if mine and len(rec) == len(mine) else layer


def command_list(command: str) -> list[str]:
    """A chained LLM-scale command (``a && b && c``) as the list of its commands, in order."""
    return [part.strip() for part in command.split(" && ") if part.strip()]


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
                "status": claim_status(outs),
                "decided_by": claim_decision(outs)[1],
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


def claim_decision(outs: Sequence[Outcome]) -> tuple[str, list[str]]:
    """One verdict per claim and the layers whose checks decided it.

    An error wins, then the most informative decided verdict (refuted > partly > verified), then
    ``inconclusive`` (a toy proxy that cannot decide), then ``out_of_reach``. So a claim whose data
    check is out of reach, or whose sim proxy is inconclusive, takes the verdict of the layer that
    decided it (e.g. ``llm``); ``(unchecked, [])`` without checks."""
    if not outs:
        return "unchecked", []
    vs = {o.verdict for o in outs}
    for v in DECISION_ORDER:
        if v in vs:
            layers = sorted({o.check.layer for o in outs if o.verdict == v}, key=lambda x: _LAYER_ORDER.get(x, 9))
            return v, layers
    v = sorted(vs)[0]
    return v, sorted({o.check.layer for o in outs if o.verdict == v})


def claim_status(outs: Sequence[Outcome]) -> str:
    """The verdict of :func:`claim_decision` (``unchecked`` without checks)."""
    return claim_decision(outs)[0]


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


#: The heading of the failed checks in the terminal, REPORT.md and report.html (the same words).
FAILED_TITLE = "Checks that failed (a changed verdict, item or pinned number, or a crash)"


def status_sentence(outcomes: Sequence[Any]) -> str:
    """One line on whether every check came out as expected (what the exit status of
    ``tiltlab check`` says): the terminal prints the same failures under :data:`FAILED_TITLE`."""
    bad = sum(not o.ok for o in outcomes)
    if not bad:
        return f"Status: all {len(outcomes)} checks as expected (verdicts, items and pinned numbers)."
    return f"Status: {bad} of {len(outcomes)} checks failed (a changed verdict, item or pinned number, or a crash; `tiltlab check` exits 1); each is listed under Findings."


Finding = tuple[str, str, str]
"""``(head, text, code)``: rendered as **head** text `code` (code may be empty)."""


def _findings(inp: ReportInput, rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Finding]]:
    out: dict[str, list[Finding]] = {"claims": [], "figures": [], "changed": [], "missing": []}
    for r in rows:
        for o in r["outcomes"]:
            if o.result is not None and o.result.verdict.value in ("refuted", "partly", "inconclusive"):
                out["claims"].append(
                    (
                        r["id"],
                        f"({cite(r['claim']) if r['claim'] else r['paper']}, {o.check.layer}) — {o.verdict}: {o.result.summary}",
                        "",
                    )
                )
            if not o.ok:
                what = o.failure
                out["changed"].append((o.check.key, f"{what}; reproduce:", o.check.reproducer(inp.seed)))
    for f in sorted(inp.figures, key=lambda f: f.id):
        for line in getattr(f, "findings", []) or []:
            out["figures"].append((f.id, f"— {line}", ""))
    for fid, why in sorted(inp.missing_figures.items()):
        out["missing"].append((fid, f"— {why}", ""))
    return out


def _md_finding(f: Finding, claim_ids: frozenset[str] | set[str] = frozenset()) -> str:
    head, text, code = f
    label = f"[{head}](#{_html_id('claim', head)})" if head in claim_ids else head
    return f"- **{label}** {_md_escape(text)}" + (f" `{code}`" if code else "")


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


def other_threshold(o: Outcome) -> str:
    """`` (other threshold: refuted)``: the verdict a statistical check's raw values give under the other
    threshold choice (direction <-> effect; ``stats.Judgement.alt_verdict``), when it differs ('' otherwise,
    and for checks without recorded raw values)."""
    ev = None if o.result is None else o.result.evidence
    alt = (ev or {}).get("alt_verdict")
    return f" (other threshold: {alt})" if alt and alt != o.verdict else ""


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


# --------------------------------------------------------------------------- html

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;line-height:1.45;color:#222}
nav#toc{position:fixed;top:0;left:0;bottom:0;width:240px;overflow-y:auto;padding:.8em;background:#f7f7f9;border-right:1px solid #ddd;font-size:.85em}
nav#toc ul{list-style:none;padding-left:.8em;margin:.2em 0}nav#toc>ul{padding-left:0}nav#toc a{text-decoration:none;color:#1a4f8a}
nav#toc li{white-space:nowrap;overflow:hidden;text-overflow:ellipsis}.dot{display:inline-block;width:.7em;height:.7em;border-radius:50%;margin-right:.35em;border:1px solid #999;vertical-align:middle}
main{margin-left:270px;max-width:1100px;padding:0 1.5em 3em 1em}
@media (max-width:900px){nav#toc{position:static;width:auto;border-right:none;border-bottom:1px solid #ddd}main{margin-left:0}}
h1{border-bottom:2px solid #444}h2{border-bottom:1px solid #bbb;margin-top:2em}h3{margin-bottom:.3em;font-size:1.02em}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th:first-child,td:first-child{text-align:left;white-space:nowrap}
td.ids{text-align:left;font-size:.85em;line-height:1.9}td.ids a{text-decoration:none;margin-right:.25em;white-space:nowrap;font-weight:400;display:inline-block}
code{background:#f4f4f4;padding:0 3px;border-radius:3px;font-size:.92em;word-break:break-word}
.v{font-weight:600;padding:0 5px;border-radius:3px}
.verified{background:#d8f0d8}.partly{background:#fbecc4}.refuted{background:#f7d0d0}.inconclusive{background:#ece0f5}.out_of_reach{background:#dde6f5}.error{background:#f09090}.unchecked{background:#eee}.status.failed{background:#f7d0d0;padding:.4em}.status.passed{background:#d8f0d8;padding:.4em}
.claim{margin:0 0 1.2em 0;padding:.3em .8em;border-left:4px solid #ddd;display:block}.stmt{color:#444}.nums{color:#555;font-size:.88em}
details.claim>summary{cursor:pointer;padding:.2em 0}.src{font-size:.85em;color:#666}
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
    href, text = _source_ref(o.check, out_dir)
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
        f"<style>{_CSS}</style></head><body>",
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
    ``out_dir``), e.g. after ``tiltlab check`` merged a partial run into it. Outcomes keep their
    provenance, so the report says which run, mode and commit each number came from."""
    from types import SimpleNamespace

    from tiltlab.paper_checks.record import outcomes_from_rows

    registry.discover()
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
        claims=registry.claims(),
        outcomes=outcomes_from_rows(rec.get("checks", [])),
        figures=figs,
        missing_figures=dict(rec.get("figures_missing") or {}),
        env=dict(rec.get("environment") or {}),
        seed=int(rec.get("seed") or 0),
        quick=bool(rep.get("quick", sel.get("quick", False))),
        out_dir=Path(out_dir),
        run_line=str(rep.get("run_line", "")),
        run_id=str(rep.get("run_id", "")),
    )


# --------------------------------------------------------------------------- the per-claim table

#: Columns of the exported per-claim table (``tiltlab report --format csv|latex|md``).
TABLE_COLUMNS = ("claim", "paper", "section", "verdict", "decided_by", "key_numbers", "commit", "source")


def key_numbers(numbers: Mapping[str, Any], limit: int = 4) -> str:
    """The numbers of a check, those with a confidence interval first: ``acc 0.5 [0.4, 0.6]``
    for ``acc``, ``acc_lo``, ``acc_hi``; at most ``limit`` entries, in name order within each group."""
    with_ci, plain = [], []
    for k in sorted(numbers):
        base = k[:-3]
        if k.endswith(("_lo", "_hi")) and base in numbers and f"{base}_lo" in numbers and f"{base}_hi" in numbers:
            continue  # shown inside its interval
        lo, hi = numbers.get(f"{k}_lo"), numbers.get(f"{k}_hi")
        if lo is not None and hi is not None:
            with_ci.append(f"{k} {_fmt(numbers[k])} [{_fmt(lo)}, {_fmt(hi)}]")
        else:
            plain.append(f"{k} {_fmt(numbers[k])}")
    return "; ".join([*with_ci, *plain][:limit])


def claim_table(
    claims: Mapping[str, Claim], outcomes: Sequence[Outcome], commit: str | None = None
) -> list[dict[str, str]]:
    """One row per declared claim: paper, section, verdict, the deciding layers, the key numbers of
    the deciding check(s) with their CIs, and the commit (and source: run / recorded) they came from."""
    inp = ReportInput(claims=claims, outcomes=outcomes)
    table = []
    for r in claim_rows(inp):
        c = r["claim"]
        deciding = [o for o in r["outcomes"] if o.verdict == r["status"] and o.check.layer in r["decided_by"]]
        nums = "; ".join(
            f"{o.check.name}: {key_numbers(o.result.numbers)}"
            for o in deciding
            if o.result is not None and o.result.numbers and o.check.name != "llm_scale"
        )
        provs = [getattr(o, "provenance", None) or {} for o in deciding]
        commits = sorted({p.get("commit") or commit or "" for p in provs} - {""}) or ([commit] if commit else [])
        sources = sorted({p.get("source", "run") for p in provs}) or ([] if not deciding else ["run"])
        table.append(
            {
                "claim": r["id"],
                "paper": r["paper"],
                "section": c.section if c is not None else "",
                "verdict": r["status"],
                "decided_by": ", ".join(r["decided_by"]),
                "key_numbers": nums,
                "commit": ", ".join(commits),
                "source": ", ".join(sources),
            }
        )
    return table


def _latex_escape(text: str) -> str:
    out = []
    for ch in text:
        out.append(_LATEX_ESCAPES.get(ch, ch))
    return "".join(out)


_LATEX_ESCAPES = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}


def render_table(table: Sequence[Mapping[str, str]], fmt: str) -> str:
    """The per-claim table as ``csv``, ``md`` (a GitHub pipe table) or ``latex`` (a ``tabular``)."""
    cols = TABLE_COLUMNS
    if fmt == "csv":
        import csv
        import io

        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
        w.writeheader()
        w.writerows({k: row.get(k, "") for k in cols} for row in table)
        return buf.getvalue()
    if fmt == "md":

        def cell(x: str) -> str:
            return x.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")

        lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(cell(row.get(k, "")) for k in cols) + " |" for row in table]
        return "\n".join(lines) + "\n"
    if fmt == "latex":
        spec = "lllll" + "p{6cm}" + "ll"
        lines = [
            "% generated by `tiltlab report --format latex`; needs no package beyond LaTeX itself",
            f"\\begin{{tabular}}{{{spec}}}",
            "\\hline",
            " & ".join(_latex_escape(c) for c in cols) + " \\\\",
            "\\hline",
        ]
        lines += [" & ".join(_latex_escape(row.get(k, "")) for k in cols) + " \\\\" for row in table]
        lines += ["\\hline", "\\end{tabular}"]
        return "\n".join(lines) + "\n"
    raise ValueError(f"--format must be one of csv, latex, md; got {fmt!r}")


# --------------------------------------------------------------------------- generated doc sections

#: ``<!-- tiltlab report --docs: NAME -->`` ... ``<!-- end NAME -->`` delimit a generated section.
DOCS_BEGIN = "<!-- generated by `tiltlab report --docs`: {name} -->"
DOCS_END = "<!-- end of generated section: {name} -->"


def registry_counts() -> dict[str, int]:
    """Claims and checks the registry declares now (llm checks counted when their module loads)."""
    registry.discover()
    chks = registry.checks()
    fast_layers = [c for c in chks if c.layer not in registry.OPT_IN_LAYERS]
    return {
        "claims": len(registry.claims()),
        "checks": len(fast_layers),
        "slow": sum(c.slow for c in fast_layers),
        "llm": sum(c.layer == "llm" for c in chks),
    }


def registry_sentence(counts: Mapping[str, int] | None = None) -> str:
    """``The registry declares 127 claims, with 157 checks in the theory, sim and data layers (12 of
    them slow) and 19 llm-layer checks.``"""
    n = registry_counts() if counts is None else counts
    return (
        f"The registry declares {n['claims']} claims, with {n['checks']} checks in the theory, sim and data layers "
        f"({n['slow']} of them slow) and {n['llm']} llm-layer checks."
    )


def _when(stamp: Any) -> str:
    return str(stamp or "unknown date").replace("T", " ").replace("+00:00", " UTC")


def _machine_text(m: Any) -> str:
    if isinstance(m, Mapping):
        load = m.get("load")
        return f"{m.get('platform', '?')}, {m.get('cpus', '?')} CPUs, load {load if load is not None else '?'}"
    return str(m or "unknown machine")


def results_section(rec: Mapping[str, Any], llm_rec: Mapping[str, Any] | None) -> str:
    """The README's results section: registry counts, the run's claim / check counts and the
    verdict table per paper, stamped with the run's date, commit, machine and load."""
    from tiltlab.paper_checks.record import outcomes_from_rows

    registry.discover()
    outs = outcomes_from_rows(rec.get("checks", []))
    inp = ReportInput(claims=registry.claims(), outcomes=outs)
    rows = claim_rows(inp)
    counts = _counts(rows)
    per_check = Counter(o.verdict for o in outs)
    sel = rec.get("selection") or {}
    mode = "quick mode" if sel.get("quick") else "full mode"
    mach = (rec.get("runtime") or {}).get("machine") or rec.get("machine")
    n_rec = sum(1 for o in outs if (o.provenance or {}).get("source") == "recorded")
    L = [registry_sentence(), ""]
    what = "`tiltlab reproduce" + (" --quick" if sel.get("quick") else "") + "`"
    if not sel.get("reproduce"):
        what = f"`{(rec.get('checks') or [{}])[0].get('command') or 'tiltlab check'}`"
    L.append(
        f"{what} (seed {rec.get('seed', 0)}, {mode}; run {_when(rec.get('generated_at'))} at commit "
        f"{rec.get('commit') or 'unknown'} on {_machine_text(mach)}) judged {len(rows)} claims with {len(outs)} checks"
        + (
            f", {n_rec} of them the llm-layer checks recorded in the shipped llm record "
            f"(commit {llm_rec.get('commit')}, {_when(llm_rec.get('date'))}; not re-run)"
            if n_rec and llm_rec
            else ""
        )
        + ". Two counts, labelled the way `reproduce` and `check` print them"
        + (" (claims whose checks are all slow count as unchecked in quick mode)" if sel.get("quick") else "")
        + ":"
    )
    L.append("")
    c = counts["all"]
    L.append(
        "- **per claim** (a claim takes the verdict of its most informative check: error > refuted > partly > "
        "verified > inconclusive > out of reach): "
        + ", ".join(f"{c[v]} {v.replace('_', ' ')}" for v in VERDICT_ORDER if c.get(v))
        + ";"
    )
    L.append(
        "- **per check**: "
        + ", ".join(f"{per_check[v]} {v.replace('_', ' ')}" for v in VERDICT_ORDER if per_check.get(v))
        + "."
    )
    L.append("")
    L.append("| paper | " + " | ".join(v.replace("_", " ") for v in VERDICT_ORDER) + " | total |")
    L.append("|---|" + "---:|" * (len(VERDICT_ORDER) + 1))
    for n in [*dict.fromkeys(r["paper"] for r in rows), "all"]:
        cn = counts[n]
        L.append(
            f"| {'**all**' if n == 'all' else n} | "
            + " | ".join(str(cn.get(v, 0)) for v in VERDICT_ORDER)
            + f" | {sum(cn.values())} |"
        )
    return "\n".join(L)


def timings_section(records: Sequence[Mapping[str, Any]], llm_rec: Mapping[str, Any] | None) -> str:
    """The timings table: one row per record given (wall, CPU, peak memory, date, machine and load),
    plus the shipped llm-layer run."""
    L = [
        "| command | wall | CPU (user + sys) | max RSS | run | machine (load at the end) | commit |",
        "| --- | ---: | ---: | ---: | --- | --- | --- |",
    ]
    for rec in records:
        rt = rec.get("runtime") or {}
        sel = rec.get("selection") or {}
        if sel.get("reproduce"):
            cmd = "tiltlab reproduce" + (" --quick" if sel.get("quick") else "") + (" --llm" if sel.get("llm") else "")
        else:
            cmd = "tiltlab check" + (" --slow" if sel.get("slow") else "")
        cpu, rss = rt.get("cpu_s"), rt.get("max_rss_mib")
        L.append(
            f"| `{cmd}` | {rt.get('wall_s', (rec.get('summary') or {}).get('seconds', '?'))} s | "
            f"{'—' if cpu is None else f'{cpu} s'} | {'—' if rss is None else f'{rss:.0f} MiB'} | "
            f"{_when(rec.get('generated_at'))} | {_machine_text(rt.get('machine') or rec.get('machine'))} | "
            f"{rec.get('commit') or '?'} |"
        )
    if llm_rec:
        L.append(
            f"| `tiltlab check --layer llm --slow --jobs 1` | {llm_rec.get('run_seconds', '?')} s | — | — | "
            f"{_when(llm_rec.get('date'))} | {_machine_text(llm_rec.get('machine'))} | {llm_rec.get('commit')} |"
        )
    return "\n".join(L)


def item_rules_section(layer: str = "llm") -> str:
    """The judged items of every claim a ``layer`` check decides, as the registry declares them
    (``[[claim.item]]``: name, kind, margin, why), one table per claim: docs/llm-checks.md states the
    rules from this, so no rule text in the docs can drift from what the checks run."""
    registry.discover()
    lines = [
        f"Generated from the registry's `[[claim.item]]` declarations ({layer} layer). Kinds: direction (threshold "
        "0 on both sides), effect (±margin on both sides), equivalence (inside ±margin), context (holds by "
        "construction: reported, never in a family).",
        "",
    ]
    for cid, claim in sorted(registry.claims().items()):
        items = [i for i in claim.items if i.layer == layer]
        if not items:
            continue
        lines += [f"**{cid}**", "", "| item | kind | margin | why |", "|---|---|---|---|"]
        lines += [f"| `{i.name}` | {i.kind} | {i.margin:g} | {i.why.replace('|', '/')} |" for i in items]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def posthoc_section(llm_rec: Mapping[str, Any]) -> str:
    """docs/llm-checks.md's re-derivation of the shipped llm record: each row's recorded verdict beside the
    verdict :func:`tiltlab.paper_checks.record.rejudge_rows` re-derives from the row's raw per-seed values (what
    ``tiltlab report --rejudge`` prints) and the verdict under the other threshold choice. A row without raw
    values (a legacy row of an older run) is re-judged *post hoc* instead, from its means, 95% intervals and
    seed counts (:func:`tiltlab.paper_checks.record.posthoc_neutral`; not pre-registered, marked as such)."""
    from tiltlab.paper_checks.record import posthoc_neutral, rejudge_rows

    registry.discover()
    rows = sorted(llm_rec.get("checks", []), key=lambda r: (r["claim"], r["check"]))
    rejudged = rejudge_rows(rows)
    n_raw = sum(1 for j in rejudged if j["status"] != "no raw values")
    n_same = sum(1 for j in rejudged if j["status"] == "same")
    lines = [
        f"{n_raw} of {len(rows)} rows carry their raw per-seed values; re-deriving their verdicts from those values "
        f"(`tiltlab report --rejudge paper_checks/records/llm.json`) gives the recorded verdict for {n_same} of "
        f"them. A row without raw values, if any, is re-judged post hoc from its recorded means, 95% intervals and "
        "seed counts under today's item declarations (not pre-registered: context only).",
        "",
        "| claim | check | recorded | re-derived | other threshold | from |",
        "|---|---|---|---|---|---|",
    ]
    for r, j in zip(rows, rejudged):
        if j["status"] != "no raw values":
            moved = "**" if j["status"] != "same" else ""
            lines.append(
                f"| `{r['claim']}` | {r['check']} | {r['verdict']} | {moved}{j['rejudged']}{moved} "
                f"| {j['other_threshold']} | raw values |"
            )
            continue
        ph = posthoc_neutral(r)
        if ph is None:
            lines.append(f"| `{r['claim']}` | {r['check']} | {r['verdict']} | – | – | no raw values, no judged item |")
            continue
        moved = "**" if ph["verdict"] != r["verdict"] else ""
        lines.append(
            f"| `{r['claim']}` | {r['check']} | {r['verdict']} | {moved}{ph['verdict']}{moved} | {ph['alt_verdict']} "
            "| summary statistics (post hoc) |"
        )
    return "\n".join(lines) + "\n"


def llm_run_section(llm_rec: Mapping[str, Any]) -> str:
    """docs/llm-checks.md's "last full run": the stamp of the shipped llm record and one row per check."""
    from tiltlab.paper_checks.record import outcomes_from_rows

    registry.discover()  # rows of undeclared claims are dropped: the claims must be loaded
    outs = sorted(outcomes_from_rows(llm_rec.get("checks", [])), key=lambda o: o.check.key)
    # counted from the rows (each carries ``ok``: verdict and items as expected), not from the record's
    # summary, which describes only the last invocation that wrote the record
    bad = sorted(str(r.get("claim")) for r in llm_rec.get("checks", []) if not r.get("ok", True))
    from tiltlab.paper_checks.record import row_key
    from tiltlab.paper_checks.registry import legacy_runs

    by_key = {row_key(r): r for r in llm_rec.get("checks", [])}
    legacy, used = legacy_runs(), []  # used: the legacy entries of this record's rows, in row order
    changed = f"{len(bad)} changed or crashed" + (f" ({', '.join(bad)})" if bad else "")
    L = [
        f"`{llm_rec.get('regenerate', 'tiltlab check --layer llm --slow').split(' --out')[0]}` "
        f"(seed {llm_rec.get('seed', 0)}), run {_when(llm_rec.get('date'))} "
        f"at commit {llm_rec.get('commit')} on {_machine_text(llm_rec.get('machine'))}: {len(outs)} checks, "
        f"{changed}, {llm_rec.get('run_seconds', '?')} s wall. "
        f"Registry hash of the llm part: `{llm_rec.get('registry_hash')}`.",
        "",
        "| claim | check | verdict (first 3 / 5 seeds) | pre-registration: rule commit -> run commit "
        "| key numbers (95% t-intervals) |",
        "| --- | --- | --- | --- | --- |",
    ]
    L += [_prereg_row(o, by_key.get(o.check.key, {}), llm_rec, legacy, used) for o in outs]
    if used:
        L += ["", "Legacy registrations (`[[legacy]]` in paper_checks/preregistration.toml; never shipped again):"]
        L += [f"- `{leg['check']}` run at {leg['run_commit']}: {leg['reason']}" for leg in used]
    from tiltlab.paper_checks.registry import shared_runs

    shared = shared_runs()
    if shared:
        L += ["", "Experiments read by more than one claim (one run each: a reuse, not independent evidence):"]
        L += [f"- {run}: {', '.join(f'`{c}`' for c in claims)}" for run, claims in shared]
    return "\n".join(L)


def _prereg_row(o: Outcome, row: Mapping[str, Any], llm_rec: Mapping[str, Any], legacy, used: list) -> str:
    """One row of :func:`llm_run_section`: a strictly pre-registered row shows ``reg -> run
    (registered)`` (``rule_commit``, stamped by ``--ship-llm`` after :func:`prereg.verify_row`), a
    legacy one ``**legacy** rule -> run`` (its reason listed under the table, collected in ``used``),
    any other ``not registered -> run``."""
    from tiltlab.paper_checks.prereg import legacy_for

    nums = key_numbers(o.result.numbers, limit=3) if o.result is not None else (o.error or "").strip()[-80:]
    got = o.result.numbers if o.result is not None else {}
    early = [str(got[k]) for k in ("verdict_at_3_seeds", "verdict_at_5_seeds") if k in got]
    verdict = o.verdict + (f" ({' / '.join(early)})" if early else "") + other_threshold(o)
    run = row.get("commit") or llm_rec.get("commit")
    leg = legacy_for({**row, "commit": run}, legacy)
    if row.get("rule_commit"):
        reg = f"{str(row['rule_commit'])[:12]} -> {run} (registered)"
    elif leg is not None:
        reg = f"**legacy** {leg['rule_commit']} -> {run}"
        if leg not in used:
            used.append(leg)
    else:
        reg = f"not registered -> {run}"
    return f"| `{o.check.claim_id}` | `{o.check.name}` | {verdict} | {reg} | {_md_escape(nums)} |"


def replace_section(text: str, name: str, body: str, where: str = "README.md") -> str:
    """``text`` with the generated section ``name`` replaced by ``body`` (its markers must exist)."""
    begin, end = DOCS_BEGIN.format(name=name), DOCS_END.format(name=name)
    i, j = text.find(begin), text.find(end)
    if i < 0 or j < i:
        raise ValueError(f"{where} has no generated section {name!r} (expected the lines {begin!r} ... {end!r})")
    return text[: i + len(begin)] + "\n" + body.rstrip("\n") + "\n" + text[j:]


def section_text(text: str, name: str) -> str | None:
    """The body of the generated section ``name`` of ``text`` (None without its markers)."""
    begin, end = DOCS_BEGIN.format(name=name), DOCS_END.format(name=name)
    i, j = text.find(begin), text.find(end)
    return None if i < 0 or j < i else text[i + len(begin) : j].strip("\n")


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
