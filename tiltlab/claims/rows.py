"""A record's rows and the outcomes they hold: reading and writing a record (``claims.json``), a row's
key, the outcome of a row (:meth:`tiltlab.claims.registry.Outcome.from_row`, judged by its registered
check where that is loaded), and what the pre-registration says of a row (re-specified items)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tiltlab import files
from tiltlab.claims import prereg, registry
from tiltlab.claims.registry import Outcome

__all__ = [
    "outcome_of_row",
    "outcomes_from_rows",
    "read_record",
    "respecification_of",
    "respecified_views",
    "row_key",
    "write_json",
]


def row_key(row: Mapping[str, Any]) -> str:
    """The registry key of a check row: ``claim[layer:check]`` (:attr:`Check.key`)."""
    return f"{row['claim']}[{row['layer']}:{row['check']}]"


def _judged_items(items: Iterable[Mapping[str, Any]]) -> set[tuple[str, str, float]]:
    return {(str(i["name"]), str(i["kind"]), float(i["margin"])) for i in items if str(i["kind"]) != "context"}


def respecification_of(
    row: Mapping[str, Any], respecs: Iterable[Mapping[str, Any]] | None = None
) -> Mapping[str, Any] | None:
    """The ``[[respecification]]`` (:func:`tiltlab.claims.prereg.respecifications`) a row was judged
    before: its evidence's judged items are the entry's earlier items and not the ones the registry
    declares now (a row run after the change is judged under the new items and gets None)."""
    respecs = prereg.respecifications() if respecs is None else respecs
    ev = row.get("evidence") or {}
    got = _judged_items(ev.get("items") or [])
    if _judged_items(_declared_items(row)) == got:  # judged under the items registered now
        return None
    for r in respecs:
        if r["claim"] == row.get("claim") and r["check"] == row.get("check") and _judged_items(r["items"]) == got:
            return r
    return None


def _declared_items(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The items the registry declares now for the row's claim and layer, as ``{"name", "kind", "margin"}``."""
    claim = registry.claims().get(str(row.get("claim")))
    if claim is None:
        return []
    return [{"name": n, "kind": i.kind, "margin": i.margin} for n, i in claim.items_for(str(row.get("layer"))).items()]


def outcome_of_row(
    row: Mapping[str, Any],
    legacy: set[tuple[str, str]] | None = None,
    respecs: Iterable[Mapping[str, Any]] | None = None,
) -> Outcome:
    """The outcome of one row of a record (:meth:`Outcome.from_row`): judged by its registered check when its
    module is loaded, else by the check the row names (:attr:`Outcome.loaded` False); ``legacy`` when the
    row's check and commit are a ``[[legacy]]`` run, ``respecified`` for an llm row judged under items
    re-specified since (:func:`respecification_of`). ``legacy``: ``{(check, run commit[:7])}``, ``respecs``:
    the ``[[respecification]]`` entries (default: the registration file's)."""
    if legacy is None:
        legacy = {(e["check"], e["run_commit"][:7]) for e in prereg.legacy_runs()}
    respecs = prereg.respecifications() if respecs is None else respecs
    return Outcome.from_row(
        row,
        registry._CHECKS.get(row_key(row)),
        legacy=(row.get("check"), str(row.get("commit") or "")[:7]) in legacy,
        respecified=respecification_of(row, respecs) if row.get("layer") == "llm" else None,
    )


def outcomes_from_rows(rows: Iterable[Mapping[str, Any]]) -> list[Outcome]:
    """Outcomes of the check rows of a record (:func:`outcome_of_row`; rows of claims no longer declared are dropped)."""
    known = registry.claims()
    legacy = {(e["check"], e["run_commit"][:7]) for e in prereg.legacy_runs()}
    respecs = prereg.respecifications()
    return [outcome_of_row(row, legacy, respecs) for row in rows if row["claim"] in known]


def respecified_views(
    row: Mapping[str, Any], respecs: Iterable[Mapping[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """For each ``[[respecification]]`` of the row's claim: the row's verdict under the earlier items and
    under the items the registry declares now (:func:`tiltlab.claims.rejudge.under_items`, from the values
    the row keeps): ``[{"before", "reason", "earlier", "now", "earlier_items"}]``, so a run is shown under
    the item set it was first registered with whichever set judged it."""
    from tiltlab.claims import rejudge

    respecs = prereg.respecifications() if respecs is None else respecs
    now_items = _declared_items(row)
    out = []
    for r in respecs:
        if r["claim"] != row.get("claim") or r["check"] != row.get("check"):
            continue
        earlier = rejudge.under_items(row, r["items"])
        now = rejudge.under_items(row, now_items) if now_items else {"verdict": None}
        out.append(
            {
                "before": r["before"],
                "reason": r["reason"],
                "earlier": earlier["verdict"],
                "earlier_items": earlier["items"],
                "now": now["verdict"],
            }
        )
    return out


def read_record(path: Path, flag: str = "--out", hint: str = "pass another path") -> dict[str, Any] | None:
    """The record at ``path`` (None when there is no file); a file that is not a tiltlab record is
    an error (one line ending in ``hint``: what the command the flag belongs to accepts instead, from
    :data:`tiltlab.hints.HINTS`), so it is never overwritten."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{flag} {path} exists and is not a tiltlab record ({type(exc).__name__}); {hint}") from None
    if not isinstance(rec, dict) or not isinstance(rec.get("checks"), list):
        raise ValueError(f"{flag} {path} exists and is not a tiltlab record (no 'checks' list); {hint}")
    return rec


def write_json(path: Path, rec: Mapping[str, Any]) -> None:
    """Write a record atomically: indent 1, keys in their order, anything else as ``str``
    (:func:`tiltlab.files.write_json`)."""
    files.write_json(path, rec, indent=1, default=str)
