"""The report's model: what a report says, independent of its format (claim rows, a claim's decision
from its checks' verdicts, findings, provenance notes, number formatting)."""

from __future__ import annotations

import html
import inspect
import os
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tiltlab.claims import registry
from tiltlab.claims.decision import _LAYER_ORDER, claim_decision, claim_status
from tiltlab.claims.registry import Claim, Outcome, Paper, cite
from tiltlab.hints import hint
from tiltlab.paper_checks.report.folding import md_plain

#: The documents, in the repository, that a report sends its reader to.
SPEC_DOCS = (
    "`docs/math.md` (the objectives, estimators and claim ids in one notation) and `docs/papers.md` (the paper index)"
)

#: Column order of the summary tables.
VERDICT_ORDER = ("verified", "partly", "refuted", "inconclusive", "out_of_reach", "error", "unchecked")


#: The repository root (the folder holding ``paper_checks/``); source and doc links are relative to it.
_REPO = Path(__file__).resolve().parents[2]


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


def _check_source(o: Outcome) -> tuple[Path, int] | None:
    """File and first line of an outcome's registered check function (``None`` for a row read back whose
    check module is not loaded, :attr:`Outcome.loaded`, and for a builtin or lost source)."""
    if not o.loaded:
        return None
    fn = inspect.unwrap(o.check.fn)  # type: ignore[union-attr]
    try:
        path = inspect.getsourcefile(fn)
        line = inspect.getsourcelines(fn)[1]
    except (OSError, TypeError):
        return None
    return (Path(path), line) if path else None


def _source_ref(o: Outcome, out_dir: Path) -> tuple[str | None, str]:
    """``(href, text)`` naming where an outcome's check is defined: ``sim/checks/estimators.py:120``."""
    src = _check_source(o)
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
    prov = o.provenance
    if not prov:
        return ""
    if prov.get("source") != "recorded" and (not inp.run_id or prov.get("run_id") == inp.run_id):
        return ""
    from tiltlab.claims.prereg import legacy_for, legacy_runs
    from tiltlab.claims.provenance import provenance_line

    line = provenance_line(prov)
    if prov.get("source") == "recorded" and legacy_for({**prov, "check": o.check.name}, legacy_runs()):
        line += ", legacy pre-registration (not strictly pre-registered: paper_checks/preregistration.toml)"
    respec = o.respecified
    if respec is not None:
        line += (
            f", judged under its earlier items (re-specified after {str(respec['before'])[:7]}: "
            "[[respecification]] in paper_checks/preregistration.toml; docs/llm-checks.md shows it under both)"
        )
    return line


def _recorded_sentence(inp: ReportInput) -> str:
    """One sentence on the outcomes not measured by this run (shipped llm record, earlier runs)."""
    notes = [(o, _provenance_note(o, inp)) for o in inp.outcomes]
    rec = [o for o, n in notes if n and o.source == "recorded"]
    old = [o for o, n in notes if n and o.source != "recorded"]
    parts = []
    if rec:
        p = rec[0].provenance
        parts.append(
            f"{len(rec)} {'llm ' if all(o.check.layer == 'llm' for o in rec) else ''}checks are recorded, not re-run: "
            f"they come from the last full llm-layer run shipped with the repository (commit {p.get('commit')}, "
            f"{p.get('run_at')}); `tiltlab reproduce --llm` re-runs them. Their Holm families are one per check, "
            "as registered; the verdicts under one family per experiment, and re-specified claims under both item "
            "sets, are in docs/llm-checks.md (the shipped record, re-derived)."
        )
    if old:
        parts.append(
            f"{len(old)} checks come from earlier runs merged into this record; each names its time, mode and commit."
        )
    return " ".join(parts)


def _layer_label(layer: str, outs: Sequence[Outcome]) -> str:
    """``llm (recorded)`` when every outcome of the layer comes from the shipped record."""
    mine = [o for o in outs if o.check.layer == layer]
    rec = [o for o in mine if o.source == "recorded"]
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
        return f"not run in this mode: its checks are slow ({hint('slow_not_run')})."
    return "no check registered yet."


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


def _md_escape(s: str) -> str:
    """Plain text inside Markdown: no table breaks, no accidental emphasis or raw HTML."""
    return md_plain(s)


def other_threshold(o: Outcome) -> str:
    """`` (other threshold: refuted)``: the verdict a statistical check's raw values give under the other
    threshold choice (direction <-> effect; ``stats.Judgement.alt_verdict``), when it differs ('' otherwise,
    and for checks without recorded raw values)."""
    ev = None if o.result is None else o.result.evidence
    alt = (ev or {}).get("alt_verdict")
    return f" (other threshold: {alt})" if alt and alt != o.verdict else ""


def outcome_key(o: Outcome, inp: ReportInput) -> tuple:
    """What a report shows of an outcome: two outcomes with the same key read the same (a run shared by the
    claims of several backbones is shown once)."""
    res = o.result
    body = (
        (o.error or "") if res is None else (res.summary, tuple(sorted((k, _fmt(v)) for k, v in res.numbers.items())))
    )
    return (
        o.check.layer,
        o.check.name,
        o.verdict,
        o.ok,
        o.check.expected.value,
        other_threshold(o),
        body,
        _provenance_note(o, inp),
    )


def group_checks(
    group: Sequence[Mapping[str, Any]], inp: ReportInput
) -> list[tuple[str, str, bool, list[tuple[Mapping[str, Any], Outcome]]]]:
    """The checks of a group of claims (one per backbone), in layer then name order: ``(layer, name, shared,
    [(row, outcome), ...])``; ``shared`` when every member has the check and all read the same
    (:func:`outcome_key`)."""
    keys = sorted(
        {(o.check.layer, o.check.name) for r in group for o in r["outcomes"]},
        key=lambda k: (_LAYER_ORDER.get(k[0], 9), k[1]),
    )
    out = []
    for layer, name in keys:
        pairs = [(r, o) for r in group for o in r["outcomes"] if (o.check.layer, o.check.name) == (layer, name)]
        shared = len(pairs) == len(group) and len({outcome_key(o, inp) for _, o in pairs}) == 1
        out.append((layer, name, shared, pairs))
    return out


def merged_claim_findings(findings: Sequence[Finding]) -> list[tuple[list[str], str, str]]:
    """The claim findings with the same text (a run shared by several claims) as one: ``(heads, text, code)``,
    in the order of their first head."""
    out: list[tuple[list[str], str, str]] = []
    at: dict[tuple[str, str], int] = {}
    for head, text, code in findings:
        k = (text, code)
        if k in at:
            out[at[k]][0].append(head)
        else:
            at[k] = len(out)
            out.append(([head], text, code))
    return out


#: The first line of the report's "Decision rules" section.
RULES_INTRO = (
    "The rules below are stated once; a claim or check whose registered text holds one links here by its "
    "short name instead of repeating it (the record, claims.json, keeps every statement and summary in full)."
)


def report_texts(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The claim statements and check summaries a report shows (where decision rules are looked for)."""
    out = [r["claim"].statement for r in rows if r["claim"] is not None]
    return out + [o.result.summary for r in rows for o in r["outcomes"] if o.result is not None]
