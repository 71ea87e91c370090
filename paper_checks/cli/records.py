"""A run's record (``claims.json``): rows, provenance, the rule-file hashes, history, written atomically."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tiltlab.paper_checks import catalog
from tiltlab.paper_checks.cli.console import reproducer


def _check_writable_file(path: Path, flag: str = "--out") -> None:
    """Raise ``ValueError`` (one line) unless a file can be created at ``path``: checked before
    any work, so a bad ``--out`` does not cost a whole run. Creates the missing parent folders."""
    if path.is_dir():
        raise ValueError(f"{flag} {path} is a directory; pass a file path such as {path / 'claims.json'}")
    _check_writable_dir(path.parent, flag, shown=path)


def _check_writable_dir(path: Path, flag: str = "--out", shown: Path | None = None) -> None:
    """Raise ``ValueError`` (one line) unless files can be created in the folder ``path``; the folders made
    to find out are removed again (the run makes them when it writes, so a failed run leaves none)."""
    shown = path if shown is None else shown
    missing = [p for p in (path, *path.parents) if not p.exists()]
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".tiltlab-write-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ValueError(f"cannot write {flag} {shown} ({reason}); pass {flag} with a writable path") from None
    finally:
        for p in missing:  # innermost first
            with contextlib.suppress(OSError):
                p.rmdir()


def _unchecked(prefix: str | None) -> list[dict[str, Any]]:
    from tiltlab.claims import registry

    have = {c.claim_id for c in registry.checks()}
    rows = []
    for cid, c in sorted(registry.claims().items()):
        if cid in have:
            continue
        if prefix and not cid.startswith(prefix):
            continue
        rows.append(
            {
                "claim": cid,
                "paper": c.paper,
                "section": c.section,
                "cite": registry.cite(c),
                "statement": c.statement,
                "kind": c.kind,
                "verdict": "unchecked",
                "llm_command": c.llm_command,
            }
        )
    return rows


def _record(
    outs,
    unchecked,
    seed: int,
    selection: dict[str, Any],
    seconds: float,
    claim_dirs=(),
    modules=(),
    prov: dict[str, Any] | None = None,
    kept_rows: Sequence[dict[str, Any]] = (),
    recorded_rows: Sequence[dict[str, Any]] = (),
    rule_hashes: Mapping[str, Mapping[str, str | None]] | None = None,
) -> dict[str, Any]:
    """The JSON record: this run's rows (stamped with ``prov``, and each llm row with ``rule_hashes``:
    the sha256 of its check's registered rule files when the run started, :func:`_rule_hashes`), then
    ``kept_rows`` (earlier runs' rows this run did not re-run) and ``recorded_rows`` (the shipped llm
    record); the summary and the claim verdicts cover all of them, ``summary.failures`` only this run's
    checks."""
    from tiltlab import __version__
    from tiltlab.claims.rows import outcomes_from_rows

    prov = prov or {}
    checks = []
    for o in outs:
        row = o.to_row(seed)
        row["reproducer"] = reproducer(o.check, seed, claim_dirs, modules)
        if o.check.layer == "llm" and o.check.name in (rule_hashes or {}):
            row["rule_hashes"] = dict(rule_hashes[o.check.name])  # type: ignore[index]
        checks.append({**row, **prov})
    rows = [*checks, *kept_rows, *recorded_rows]
    all_outs = [*outs, *outcomes_from_rows([*kept_rows, *recorded_rows])]
    counts = Counter(o.verdict for o in all_outs)
    counts.update({"unchecked": len(unchecked)} if unchecked else {})
    return {
        "tiltlab": __version__,
        "skipped_modules": dict(sorted(catalog.SKIPPED_MODULES.items())),
        "generated_at": prov.get("run_at") or _now(),
        "commit": prov.get("commit"),
        "commit_sha": prov.get("commit_sha"),
        "machine": _machine(),
        "seed": seed,
        "selection": selection,
        "summary": {
            "checks": len(rows),
            "run": len(outs),
            "kept": len(kept_rows),
            "recorded": len(recorded_rows),
            "failures": sum(not o.ok for o in outs),
            "verdicts": dict(sorted(counts.items())),
            "seconds": round(seconds, 3),
        },
        "claims": _claim_verdicts(all_outs, selection),
        "checks": sorted(rows, key=lambda r: (r["claim"], r["layer"], r["check"])),
        "unchecked": unchecked,
    }


def _now() -> str:
    from tiltlab.claims.provenance import now_utc

    return now_utc()


def _machine() -> dict[str, Any]:
    from tiltlab.claims.provenance import machine

    return machine()


def _provenance(command: str, mode: str, slow: bool, seed: int, run_at: str | None = None) -> dict[str, Any]:
    import uuid

    from tiltlab.claims.provenance import git_commit, git_sha

    return {
        "run_at": run_at or _now(),
        "run_id": uuid.uuid4().hex[:12],
        "command": command,
        "mode": mode,
        "slow": slow,
        "commit": git_commit(),
        "commit_sha": git_sha(),
        "seed": seed,
        "source": "run",
    }


def _rule_hashes(chks) -> dict[str, dict[str, str | None]]:
    """``{check name: {path: sha256}}`` of the registered rule files of the selected llm checks, read
    now, before they run (:func:`tiltlab.claims.prereg.current_hashes`)."""
    names = {c.name for c in chks if c.layer == "llm"}
    if not names:
        return {}
    from tiltlab.claims.prereg import current_hashes

    return current_hashes(names)


def _write_json(path: Path, rec: dict[str, Any]) -> None:
    """Write ``rec`` atomically (:func:`tiltlab.claims.rows.write_json`)."""
    from tiltlab.claims.rows import write_json

    write_json(path, rec)


def _claim_verdicts(outs, selection: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per claim the run counts (:func:`tiltlab.claims.counts.record_claim_rows`: the claims of
    ``outs`` and those its selection speaks for, ``unchecked`` without a row)."""
    from tiltlab.claims import registry
    from tiltlab.claims.counts import record_claim_rows, selection_scope

    return record_claim_rows(outs, selection_scope(selection, registry.claims()))


def _runtime(wall: float) -> dict[str, Any]:
    """Wall time, CPU time (this process and its finished children) and peak memory of the run."""
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    return {
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "max_rss_mib": round(max(me.ru_maxrss, kids.ru_maxrss) / 1024, 0),
        "machine": _machine(),
    }
