"""A run store for experiments longer than one sitting: each finished run is one JSON file with where,
when and from which commit it came.

A long check's plan is a list of run keys (``tune-disa-lr1e-05-s9000``). A *shard* is every ``of``-th key
from ``index`` (:func:`shard_keys`); a sitting runs the shards it has time for, in any order, on any
machine, and :meth:`RunStore.put` writes each finished run atomically under ``<root>/runs/<key>.json``
with its provenance: the check, the commit (``git describe``) and full hash, the run-time hashes of the
check's registered rule files (:func:`tiltlab.claims.prereg.current_hashes`), the UTC time and the machine
(:func:`tiltlab.claims.provenance.machine`). :func:`verify_run` re-proves from git that a stored run's
rule was registered strictly before it (:func:`tiltlab.claims.prereg.verify_row`), so a shard run on a
modified checkout or after a rule edit is refused, not merged.

A run is written only when it finished: a sitting killed mid-run leaves no file for it, and the next
sitting runs it again. A stored run is never overwritten (:meth:`RunStore.put` refuses).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tiltlab.claims import prereg
from tiltlab.claims.provenance import git_commit, git_sha, machine, now_utc
from tiltlab.files import write_json

__all__ = ["PROVENANCE_KEYS", "RunStore", "provenance", "shard_keys", "verify_run"]

PROVENANCE_KEYS = ("check", "commit", "commit_sha", "rule_hashes", "run_at", "machine")
"""What :meth:`RunStore.put` adds to every stored run (a run's own fields never use these names)."""

_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")


def shard_keys(plan: Sequence[str], index: int, of: int) -> list[str]:
    """Shard ``index`` of ``of``: the keys ``plan[index], plan[index + of], ...`` (the shards of a plan are
    disjoint and together are the plan). ``index`` counts from 0."""
    if isinstance(of, bool) or not isinstance(of, int) or of < 1:
        raise ValueError(f"the shard count must be a positive integer, got {of!r}")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < of:
        raise ValueError(f"the shard index must be an integer in [0, {of - 1}], got {index!r}")
    if len(set(plan)) != len(plan):
        dup = sorted({k for k in plan if list(plan).count(k) > 1})
        raise ValueError(f"the plan repeats run keys: {dup[:3]}")
    return list(plan[index::of])


def provenance(check: str, root: Path | None = None) -> dict[str, Any]:
    """The provenance a run of ``check`` started now in the checkout at ``root`` gets (keys
    :data:`PROVENANCE_KEYS`)."""
    return {
        "check": check,
        "commit": git_commit(root),
        "commit_sha": git_sha(root),
        "rule_hashes": prereg.current_hashes([check], root).get(check),
        "run_at": now_utc(),
        "machine": machine(),
    }


def verify_run(run: Mapping[str, Any], claim: str, root: Path | None = None) -> str:
    """The registration commit of a stored run (:func:`tiltlab.claims.prereg.verify_row` on its
    provenance); ``ValueError`` naming the run when its rule was not registered strictly before it."""
    row = {k: run.get(k) for k in PROVENANCE_KEYS} | {"claim": claim}
    try:
        return prereg.verify_row(row, root)
    except ValueError as e:
        raise ValueError(f"stored run {run.get('key')!r}: {e}") from None


class RunStore:
    """Finished runs under ``<root>/runs/<key>.json`` (one file per run, written atomically)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def path(self, key: str) -> Path:
        if not isinstance(key, str) or not _KEY.fullmatch(key):
            raise ValueError(
                f"a run key is letters, digits and _ . + - (not starting with one of the last four), got {key!r}"
            )
        return self.root / "runs" / f"{key}.json"

    def has(self, key: str) -> bool:
        return self.path(key).is_file()

    def get(self, key: str) -> dict[str, Any]:
        p = self.path(key)
        try:
            run = json.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise KeyError(f"run {key!r} is not in the store {self.root}") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{p}: not a stored run ({e.msg} at line {e.lineno})") from None
        if not isinstance(run, dict) or run.get("key") != key:
            raise ValueError(
                f"{p}: not the stored run {key!r} (its key is {run.get('key') if isinstance(run, dict) else None!r})"
            )
        return run

    def put(self, key: str, result: Mapping[str, Any], prov: Mapping[str, Any]) -> dict[str, Any]:
        """Store ``result`` (the run's own fields) with ``prov`` (:func:`provenance`, taken when the run
        started) under ``key``; refuses a key already stored or a result that uses a provenance key."""
        p = self.path(key)
        if p.exists():
            raise FileExistsError(f"run {key!r} is already in the store ({p}); a stored run is never replaced")
        clash = sorted((set(PROVENANCE_KEYS) | {"key"}) & set(result))
        if clash:
            raise ValueError(f"run {key!r}: its result uses the provenance key(s) {clash}")
        missing = sorted(set(PROVENANCE_KEYS) - set(prov))
        if missing:
            raise ValueError(f"run {key!r}: provenance lacks {missing}")
        run = {"key": key, **result, **{k: prov[k] for k in PROVENANCE_KEYS}}
        write_json(p, run, indent=1, sort_keys=True, fsync=True)
        return run

    def keys(self) -> list[str]:
        d = self.root / "runs"
        return sorted(p.stem for p in d.glob("*.json")) if d.is_dir() else []

    def runs(self, keys: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
        """The stored runs ``keys`` (default: all), by key; a missing key raises ``KeyError``."""
        return {k: self.get(k) for k in (self.keys() if keys is None else keys)}

    def missing(self, plan: Iterable[str]) -> list[str]:
        return [k for k in plan if not self.has(k)]
