"""The shipped llm record (``records/llm.json`` of the data folder): the last full llm-layer run.

The llm layer trains small models for tens of minutes, so ``tiltlab reproduce`` and ``tiltlab
check`` do not re-run it: they merge the last full llm-layer run shipped in the repository
(:func:`llm_record_path`), stamped with the date, machine and run time of that run and a hash of the llm
part of the registry (:func:`llm_registry_hash`: the claims the llm checks decide, the checks, their
expected verdicts and items); each row keeps the commit of the run that produced it
(:func:`tiltlab.claims.provenance.git_commit` and ``git_sha``, taken by ``tiltlab check``, never passed by
hand) and its registration commit (:mod:`tiltlab.claims.prereg`). A test fails when that hash lags the
registry; ``tiltlab check --layer llm --slow --jobs 2 --out FILE && tiltlab report --ship-llm FILE``
regenerates it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tiltlab.claims import paths, prereg, registry
from tiltlab.claims.provenance import git_commit
from tiltlab.claims.registry import PROVENANCE_FIELDS
from tiltlab.claims.rows import outcomes_from_rows, read_record, respecification_of, row_key, write_json
from tiltlab.hints import hint

__all__ = [
    "LLM_RECORD",
    "LLM_RECORD_COMMAND",
    "llm_record_path",
    "llm_registry_hash",
    "load_llm_record",
    "recorded_llm_rows",
    "selects",
    "set_llm_expectations",
    "ship_llm_record",
    "summarize_llm_rows",
]

#: A shipped llm record that replaces the data folder's (tests); None: :func:`llm_record_path`'s default.
LLM_RECORD: Path | None = None


def llm_record_path() -> Path:
    """The shipped record of the last full llm-layer run: :data:`LLM_RECORD` where set, else
    ``records/llm.json`` of the data folder (:func:`tiltlab.claims.paths.data_dir`)."""
    return LLM_RECORD if LLM_RECORD is not None else paths.data_dir() / "records" / "llm.json"


#: The one command that regenerates the shipped llm record (documented in docs/llm-checks.md).
LLM_RECORD_COMMAND = (
    "tiltlab check --layer llm --slow --jobs 2 --out results/llm.json && tiltlab report --ship-llm results/llm.json"
)


def llm_registry_hash() -> str:
    """sha256 (16 hex digits) of the llm part of the registry: every llm check (key, expected
    verdict, expected items, slow) and the claims they decide (every declared field)."""
    registry.require_catalogued("llm_record.llm_registry_hash")
    chks = sorted((c for c in registry.checks() if c.layer == "llm"), key=lambda c: c.key)
    claims = registry.claims()
    payload = {
        "checks": [
            {"key": c.key, "expected": c.expected.value, "items": sorted(c.expected_items), "slow": c.slow}
            for c in chks
        ],
        "claims": [dataclasses.asdict(claims[cid]) for cid in sorted({c.claim_id for c in chks}) if cid in claims],
    }
    text = json.dumps(payload, sort_keys=True, default=str, ensure_ascii=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def load_llm_record(path: Path | None = None) -> dict[str, Any] | None:
    """The shipped llm-layer record (None when there is none)."""
    path = llm_record_path() if path is None else Path(path)
    if not path.is_file():
        return None
    rec = json.loads(path.read_text(encoding="utf-8"))
    return rec if isinstance(rec, dict) and isinstance(rec.get("checks"), list) else None


def recorded_llm_rows(
    prefix: str | None = None, name: str | None = None, path: Path | None = None
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The shipped record's rows (``source: recorded``) matching a check selection, and the record."""
    rec = load_llm_record(path)
    if rec is None:
        return [], None
    return [{**r, "source": "recorded"} for r in rec["checks"] if selects(r, prefix, name)], rec


def selects(row: Mapping[str, Any], prefix: str | None = None, name: str | None = None) -> bool:
    """Whether a check selection (``--only prefix``, ``--check name``; None: any) takes the row."""
    cid = row["claim"]
    if prefix and not (cid == prefix or cid.startswith(prefix.rstrip(".") + ".") or cid.startswith(prefix)):
        return False
    return not (name and row["check"] != name)


def ship_llm_record(
    src: Path,
    dest: Path | None = None,
    *,
    machine_desc: str | None = None,
    run_seconds: float | None = None,
    date: str | None = None,
    root: Path | None = None,
) -> dict[str, Any]:
    """Stamp the record of a full llm-layer run (``tiltlab check --layer llm --slow --out src``) and
    write it to ``dest`` (default :func:`llm_record_path`) atomically. The run must hold a row for every
    registered llm check that is not long, and nothing else but long llm checks
    (:attr:`~tiltlab.claims.registry.Check.long`, ``tiltlab check --layer llm --long --check NAME``).
    A run of long checks only ships those rows into the existing record, keeping its layer rows and
    its top-level provenance; a layer run keeps the existing record's long rows it did not re-run.

    Provenance comes from the run, never from the caller: each row keeps its own ``commit``,
    ``commit_sha``, ``run_at`` (and command, seed, run id) where it has them, the record's otherwise.
    Refused, one line naming the check: a commit that is unknown or ``-dirty``, a row listed as
    ``[[legacy]]``, and a row that is not strictly pre-registered in the clone at ``root``
    (:func:`tiltlab.claims.prereg.verify_row`: no registration, registered in the run's own
    commit, or a rule file whose run-time hash differs from the registered one; ``root``: the clone,
    default the checkout holding the code). Each shipped row gets
    ``rule_commit``: its registration commit. ``machine``, ``summary.seconds`` and ``generated_at``
    default to the record's."""
    registry.require_catalogued("llm_record.ship_llm_record")
    rec = read_record(Path(src), "--ship-llm", hint("record_to_ship"))
    if rec is None:
        raise FileNotFoundError(f"--ship-llm {src}: no such file")
    want = {c.key for c in registry.checks() if c.layer == "llm" and not c.long}
    longs = {c.key for c in registry.checks() if c.layer == "llm" and c.long}
    if not want:
        raise ValueError("--ship-llm: no llm checks are registered (is the [llm] extra installed?)")
    rows = rec["checks"]
    got = {row_key(r) for r in rows}
    dest = llm_record_path() if dest is None else Path(dest)
    long_only = bool(got) and got <= longs and all(r.get("layer") == "llm" for r in rows)
    old = _read_shipped(dest) if (long_only or longs) else None
    if long_only and old is None:
        raise ValueError(
            f"--ship-llm {src}: a run of long checks only ships into an existing llm record; {dest} has none"
        )
    if not long_only and (any(r.get("layer") != "llm" for r in rows) or (got - longs) != want):
        missing, extra = sorted(want - got), sorted(got - want - longs)
        raise ValueError(
            f"--ship-llm {src} is not a full llm-layer run (missing {len(missing)} llm check(s)"
            + (f": {', '.join(missing[:3])}" if missing else "")
            + f"; {len(extra) + sum(r.get('layer') != 'llm' for r in rows if row_key(r) in want)} other row(s)); "
            "run `tiltlab check --layer llm --slow --jobs 2 --out FILE` first"
        )
    commit = rec.get("commit")
    if not commit or str(commit).endswith("-dirty"):
        raise ValueError(
            f"--ship-llm {src}: the run's commit is {commit or 'unknown'}; ship only a run of a clean, committed checkout"
        )
    mach: Any = machine_desc or rec.get("machine")
    if not mach:
        raise ValueError(f"--ship-llm {src}: the record names no machine; pass --machine 'what ran it'")
    seconds = run_seconds if run_seconds is not None else (rec.get("summary") or {}).get("seconds")
    date = date or rec.get("generated_at")
    command = "tiltlab check --layer llm --slow" + (
        f" --seed {rec['seed']}" if rec.get("seed") not in (None, 0) else ""
    )
    long_names = {c.key: c.name for c in registry.checks() if c.long}
    stamp = {
        "run_at": date,
        "command": command,
        "mode": "check",
        "slow": True,
        "commit": commit,
        "commit_sha": rec.get("commit_sha"),
        "seed": rec.get("seed"),
        "run_id": "llm-record",
    }
    legacy = prereg.legacy_runs(prereg.repo_root(root) / prereg.PREREG_PATH)
    shipped_rows = []
    for r in sorted(rows, key=row_key):
        if r.get("source") == "recorded":
            raise ValueError(f"--ship-llm {src}: check {r['check']} ({r['claim']}) is a recorded row, not a run")
        own = {k: r[k] for k in stamp if r.get(k) not in (None, "")}
        if row_key(r) in long_names and "command" not in own:
            own["command"] = f"tiltlab check --layer llm --long --check {long_names[row_key(r)]}" + (
                f" --seed {rec['seed']}" if rec.get("seed") not in (None, 0) else ""
            )
        if "commit" in own:  # a row's own commit goes with its own full hash (from git), never the record's
            own["commit_sha"] = r.get("commit_sha") or prereg.resolve(str(own["commit"]), root)
        row = {**{k: v for k, v in r.items() if k not in PROVENANCE_FIELDS}, **stamp, **own, "source": "run"}
        leg = prereg.legacy_for(row, legacy)
        if leg is not None:
            raise ValueError(
                f"--ship-llm {src}: check {row['check']} ({row['claim']}) ran at {row['commit']}, listed as a "
                f"[[legacy]] registration in {prereg.PREREG_PATH}; legacy runs are never shipped again"
            )
        try:
            row["rule_commit"] = prereg.verify_row(row, root)
        except ValueError as exc:
            raise ValueError(f"--ship-llm {src}: {exc}") from None
        shipped_rows.append(row)
    if old is not None:  # rows of the existing record this run does not replace
        mine = {row_key(r) for r in shipped_rows}
        keep = [r for r in old.get("checks", []) if row_key(r) not in mine and (long_only or row_key(r) in longs)]
        shipped_rows = sorted([*shipped_rows, *keep], key=row_key)
    if long_only:
        assert old is not None
        summary, claims = summarize_llm_rows(shipped_rows, (old.get("summary") or {}).get("seconds"))
        shipped = {
            **old,
            "summary": summary,
            "claims": claims,
            "checks": shipped_rows,
            "registry_hash": llm_registry_hash(),
        }
        write_json(dest, shipped)
        return shipped
    summary, claims = summarize_llm_rows(shipped_rows, seconds)
    shipped = {
        "record": "tiltlab llm-layer record",
        "regenerate": LLM_RECORD_COMMAND,
        "commit": commit,
        "commit_sha": rec.get("commit_sha"),
        "date": date,
        "machine": mach,
        "run_seconds": seconds,
        "registry_hash": llm_registry_hash(),
        "tiltlab": rec.get("tiltlab"),
        "seed": rec.get("seed"),
        "summary": summary,
        "claims": claims,
        "checks": shipped_rows,  # "source": "run" (measured); merged elsewhere as "recorded" (recorded_llm_rows)
    }
    write_json(dest, shipped)
    return shipped


def summarize_llm_rows(
    rows: Sequence[Mapping[str, Any]], seconds: Any = None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(summary, claims)`` of a shipped llm record counted from the rows it holds (the layer's rows and
    the long checks' merged into it): checks, verdicts, failures, and one row per claim
    (:func:`tiltlab.claims.decision.claim_rows`)."""
    from tiltlab.claims.decision import claim_rows

    verdicts = Counter(str(r.get("verdict")) for r in rows)
    summary = {
        "checks": len(rows),
        "run": len(rows),
        "kept": 0,
        "recorded": 0,
        "failures": sum(not r.get("ok") for r in rows),
        "verdicts": dict(sorted(verdicts.items())),
        "seconds": seconds,
    }
    return summary, claim_rows(outcomes_from_rows(rows))


def _read_shipped(path: Path) -> dict[str, Any] | None:
    """The shipped llm record at ``path`` (None when there is none)."""
    if not Path(path).is_file():
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def set_llm_expectations(path: Path | None = None, root: Path | None = None) -> dict[str, Any]:
    """Give the shipped llm record at ``path`` (default :func:`llm_record_path`) today's expected verdicts
    and items: after a run under a new rule, the expectations (regression markers, not the rule) are set
    from that run in the checks' code, and the record's rows, its ``ok`` flags and its registry hash
    follow them. Verdicts, items, numbers and evidence are the run's and are not touched. The commit at
    which this was done (a clean checkout: a dirty one is refused) is written as ``expectations_set_at``;
    a row's earlier expectations, where they change, go to its ``expectations_history`` (with the commit
    until which they held); a row judged under items re-specified since (:func:`respecification_of`)
    keeps the expectations it was judged with and is marked ``respecified``. A row whose check is not
    registered is refused. Written atomically; returns the record."""
    registry.require_catalogued("llm_record.set_llm_expectations")
    path = llm_record_path() if path is None else Path(path)
    rec = load_llm_record(path)
    if rec is None:
        raise FileNotFoundError(f"no llm record at {path}")
    at = git_commit(root)
    if not at or at.endswith("-dirty"):
        raise ValueError(
            f"--set-llm-expectations: the checkout is {at or 'not a git checkout'}; commit the expectations first, so "
            "that the record names the commit they were set at"
        )
    chks = {c.key: c for c in registry.checks() if c.layer == "llm"}
    rows = rec["checks"]
    orphans = [row_key(r) for r in rows if row_key(r) not in chks]
    if orphans:
        raise ValueError(f"rows of checks that are not registered: {', '.join(orphans[:3])}")
    respecs = prereg.respecifications(prereg.repo_root(root) / prereg.PREREG_PATH)
    for r in rows:
        c = chks[row_key(r)]
        earlier = respecification_of(r, respecs)
        if earlier is not None:  # judged under items re-specified since: it keeps what it was judged with
            r["respecified"] = {"before": earlier["before"], "reason": earlier["reason"]}
            continue
        want = dict(c.expected_items)
        if (r.get("expected"), r.get("expected_items")) != (c.expected.value, want) and "expected" in r:
            r.setdefault("expectations_history", []).append(
                {"until": at, "expected": r.get("expected"), "expected_items": r.get("expected_items")}
            )
        r["expected"] = c.expected.value
        r["expected_items"] = want
        items = r.get("items") or {}
        r["ok"] = bool(r.get("verdict") == c.expected.value and all(items.get(k) == v for k, v in want.items()))
    rec["registry_hash"] = llm_registry_hash()
    rec["expectations_set_at"] = at
    rec["summary"], rec["claims"] = summarize_llm_rows(rows, (rec.get("summary") or {}).get("seconds"))
    write_json(path, rec)
    return rec
