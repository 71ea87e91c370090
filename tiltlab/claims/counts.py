"""How many claims and checks a record holds, counted one way for every place that prints the numbers:
``tiltlab check`` and ``check --list``, ``tiltlab reproduce``, the report and README's generated results.

A record's checks are its rows. Its claims are the claims of its rows and every declared claim its runs
speak for (:func:`record_scope`): a run of everything speaks for every declared claim, so a claim without a
row in it (no check registered, or only checks the run did not select: slow ones without ``--slow``) is
counted, as ``unchecked``, instead of vanishing from the total.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tiltlab.claims import registry
from tiltlab.claims.decision import claim_rows
from tiltlab.claims.registry import Outcome

__all__ = ["RecordCounts", "claims_counted", "record_claim_rows", "record_counts", "record_scope", "selection_scope"]


def selection_scope(selection: Mapping[str, Any] | None, declared: Iterable[str]) -> set[str]:
    """The ``declared`` claims a run with this selection speaks for: all of them for a run of everything
    (no ``--only``, ``--layer`` or ``--check``; every ``tiltlab reproduce``), those under the prefix for
    ``--only PREFIX`` alone, none for ``--layer`` or ``--check`` (only the claims of its rows count)."""
    sel = selection or {}
    if sel.get("layer") or sel.get("check"):
        return set()
    prefix = sel.get("only") or ""
    return {c for c in declared if c.startswith(prefix)}


def record_scope(rec: Mapping[str, Any], declared: Iterable[str] | None = None) -> set[str]:
    """:func:`selection_scope` of every run a record holds (its ``history`` after a merge, else its own
    ``selection``); ``declared``: the registry's claims by default."""
    declared = list(registry.claims() if declared is None else declared)
    runs = rec.get("history") or [rec]
    return set().union(*(selection_scope(r.get("selection"), declared) for r in runs))


def claims_counted(scope: Iterable[str], claims_with_rows: Iterable[str]) -> list[str]:
    """The claims a record (or a listed selection) counts, sorted: its scope and the claims of its rows."""
    return sorted(set(scope) | set(claims_with_rows))


def record_claim_rows(outs: Sequence[Outcome], scope: Iterable[str]) -> list[dict[str, Any]]:
    """The record's ``claims``: one row per counted claim (:func:`claims_counted`), the verdict of its most
    informative check (:func:`tiltlab.claims.decision.claim_rows`), ``unchecked`` without a row."""
    rows = {r["claim"]: r for r in claim_rows(outs)}
    empty = {"verdict": "unchecked", "decided_by": [], "checks": []}
    return [rows.get(c) or {"claim": c, **empty} for c in claims_counted(scope, rows)]


@dataclass(frozen=True)
class RecordCounts:
    """A record's numbers: ``checks`` (verdict -> rows), ``claims`` (verdict -> counted claims, with
    ``unchecked``), ``recorded`` (rows merged from the shipped llm record) and ``not_run`` (counted claims
    that have registered checks but no row: their checks were not selected)."""

    checks: Counter[str]
    claims: Counter[str]
    recorded: int
    not_run: tuple[str, ...]

    @property
    def n_checks(self) -> int:
        return sum(self.checks.values())

    @property
    def n_claims(self) -> int:
        return sum(self.claims.values())


def record_counts(rec: Mapping[str, Any], outs: Sequence[Outcome] | None = None) -> RecordCounts:
    """The numbers of ``rec`` from its rows (``outs``: their outcomes, when the caller has them) and
    :func:`record_scope`: what ``tiltlab check`` / ``reproduce`` print, the report and README show."""
    from tiltlab.claims.rows import outcomes_from_rows

    outs = outcomes_from_rows(rec.get("checks", [])) if outs is None else outs
    rows = record_claim_rows(outs, record_scope(rec))
    with_checks = {c.claim_id for c in registry.checks()}
    return RecordCounts(
        checks=Counter(o.verdict for o in outs),
        claims=Counter(str(r["verdict"]) for r in rows),
        recorded=sum(o.source == "recorded" for o in outs),
        not_run=tuple(str(r["claim"]) for r in rows if not r["checks"] and r["claim"] in with_checks),
    )
