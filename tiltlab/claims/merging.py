"""Merging a run into an existing record: which rows of the old record are kept, which rows of the shipped
llm record are merged as recorded, and what the merged record keeps of the old one (history, unchecked
claims, a ``tiltlab reproduce`` record's header).

A partial run (``tiltlab check --only / --layer / --check``, or without ``--slow``) *merges* into an
existing record: the rows it ran replace theirs, every other row is kept with its own provenance, so a
record never shrinks silently (:func:`merge`, :func:`check_run_rows`). ``--replace`` passes no old record.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tiltlab.claims import registry
from tiltlab.claims.counts import record_claim_rows, record_scope
from tiltlab.claims.llm_record import selects
from tiltlab.claims.rows import outcomes_from_rows, row_key

__all__ = [
    "REPRODUCE_KEYS",
    "CheckRunRows",
    "check_run_rows",
    "history_entry",
    "merge",
    "merge_record_header",
    "merge_unchecked",
]

#: Keys of a ``tiltlab reproduce`` record that a ``tiltlab check`` merged into it keeps.
REPRODUCE_KEYS = ("figures", "figures_missing", "environment", "report")

#: What else of a ``tiltlab reproduce`` record a ``tiltlab check`` merged into it keeps: it still describes
#: that run (mode, time, commit).
_REPRODUCE_HEADER = (*REPRODUCE_KEYS, "generated_at", "commit", "machine", "seed", "selection", "runtime")


def merge(old: Mapping[str, Any] | None, new_rows: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """Rows of ``old`` that this run did not re-run (and whose claim is still declared, and which
    are not ``recorded`` rows: those are merged afresh from the shipped record), then ``new_rows``.
    Returns ``(rows, kept)`` with ``kept`` the number of rows taken from ``old``."""
    if not old:
        return list(new_rows), 0
    ran = {row_key(r) for r in new_rows}
    known = registry.claims()
    kept = [
        r
        for r in old.get("checks", [])
        if row_key(r) not in ran and r.get("claim") in known and r.get("source") != "recorded"
    ]
    return [*kept, *new_rows], len(kept)


@dataclass(frozen=True)
class CheckRunRows:
    """The rows a ``tiltlab check`` run writes beside its own: ``kept`` (the old record's, measured by earlier
    runs, that this run did not re-run) and ``recorded`` (the shipped llm record's, merged as recorded)."""

    kept: list[dict[str, Any]]
    recorded: list[dict[str, Any]]


def check_run_rows(
    old: Mapping[str, Any] | None,
    ran: Iterable[str],
    shipped: Sequence[dict[str, Any]],
    *,
    prefix: str | None = None,
    layer: str | None = None,
    name: str | None = None,
) -> CheckRunRows:
    """The merge policy of ``tiltlab check`` into ``old`` (None: no record yet, or ``--replace``) for a run of
    the checks ``ran`` (their keys) selected by ``--only prefix``, ``--layer layer``, ``--check name``;
    ``shipped``: the shipped llm record's rows (``source: recorded``).

    - kept: the rows of ``old`` not re-run, whose claim is still declared and that are not recorded rows
      (:func:`merge`);
    - recorded: the shipped rows the selection names (none when it names a layer: that layer was run, or
      another one was chosen), and those the old record held as recorded (a partial run refreshes them, so
      it never drops them), except a row this run measured or one an earlier run into ``old`` measured
      (kept): a check is never in the record twice."""
    ran = set(ran)
    had = {row_key(r) for r in (old or {}).get("checks", []) if r.get("source") == "recorded"}
    wanted = had | ({row_key(r) for r in shipped if selects(r, prefix, name)} if not layer else set())
    kept = [r for r in merge(old, [])[0] if row_key(r) not in ran]
    mine = ran | {row_key(r) for r in kept}
    recorded = [r for r in shipped if row_key(r) in wanted and row_key(r) not in mine]
    return CheckRunRows(kept, recorded)


def history_entry(rec: Mapping[str, Any]) -> dict[str, Any]:
    """One run of a record's ``history``: when, at which commit, what it selected and how many checks it ran."""
    return {
        "generated_at": rec.get("generated_at"),
        "commit": rec.get("commit"),
        "selection": rec.get("selection"),
        "ran": rec.get("summary", {}).get("run", rec.get("summary", {}).get("checks")),
    }


def merge_unchecked(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Claims without a check, from both runs, minus those that have a check now."""
    have = {c.claim_id for c in registry.checks()}
    by_id = {u["claim"]: u for u in [*old, *new] if u["claim"] not in have and u["claim"] in registry.claims()}
    return [by_id[k] for k in sorted(by_id)]


def merge_record_header(
    rec: dict[str, Any], old: Mapping[str, Any] | None, unchecked: list[dict[str, Any]], run_at: str | None
) -> dict[str, Any]:
    """``rec`` (the record of a run merged into ``old``, rows already chosen by :func:`check_run_rows`) with what
    it keeps of ``old``: the ``history`` of runs (the old one's, or an entry for the old record, then this
    run's), the unchecked claims of both (:func:`merge_unchecked`), the claim verdicts over the merged rows
    and every run's selection (:func:`tiltlab.claims.counts.record_claim_rows`), and for a ``tiltlab reproduce`` record (it
    has ``figures``) its header (:data:`REPRODUCE_KEYS`, time, commit, machine, seed, selection, runtime) with
    ``updated_at`` = ``run_at``. Without ``old`` (no record, ``--replace``) ``rec`` is unchanged. Updates
    ``rec`` in place and returns it."""
    if not old:
        return rec
    rec["history"] = [*old.get("history", [history_entry(old)]), history_entry(rec)]
    rec["unchecked"] = merge_unchecked(old.get("unchecked", []), unchecked)
    # the claims of the merged rows and of every run's selection (tiltlab.claims.counts)
    rec["claims"] = record_claim_rows(outcomes_from_rows(rec.get("checks", [])), record_scope(rec))
    if "figures" in old:
        for key in _REPRODUCE_HEADER:
            if key in old:
                rec[key] = old[key]
        rec["updated_at"] = run_at
    return rec
