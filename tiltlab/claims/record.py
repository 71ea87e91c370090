"""Check records (``claims.json``): where each number came from, merging runs, the shipped llm record.

Every check row of a record carries its *provenance*: when it ran (``run_at``), the command and its
mode (``mode``: ``full`` / ``quick`` for ``tiltlab reproduce``, ``check`` for ``tiltlab check``;
``slow``: whether slow checks were part of that run), the git ``commit`` (``git describe``) and
``commit_sha`` (the full hash), the ``seed``, and
``source``: ``run`` (measured by that command) or ``recorded`` (taken from the shipped llm record,
not re-run).

A partial run (``tiltlab check --only / --layer / --check``, or without ``--slow``) *merges* into
an existing record: the rows it ran replace theirs, every other row is kept with its own
provenance, so a record never shrinks silently (:func:`merge`).

The llm layer trains small models for tens of minutes, so ``tiltlab reproduce`` and ``tiltlab
check`` do not re-run it: they merge the last full llm-layer run shipped in the repository
(``paper_checks/records/llm.json``, :data:`LLM_RECORD`), stamped with the date, machine and run time
of that run and a hash of the llm part of the registry (:func:`llm_registry_hash`: the claims the
llm checks decide, the checks, their expected verdicts and items); each row keeps the commit of the
run that produced it (:func:`git_commit` and :func:`git_sha`, taken by ``tiltlab check``, never
passed by hand) and its registration commit (:mod:`tiltlab.claims.prereg`). A test fails when
that hash lags the registry; ``tiltlab check --layer llm --slow --jobs 2 --out FILE && tiltlab
report --ship-llm FILE`` regenerates it.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import math
import os
import platform
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tiltlab import files
from tiltlab.claims import paths, pinned, prereg, registry
from tiltlab.claims.registry import Check, CheckResult, Outcome, Verdict
from tiltlab.files import write_text

__all__ = [
    "LLM_RECORD",
    "LLM_RECORD_COMMAND",
    "RecordedOutcome",
    "git_commit",
    "git_sha",
    "llm_registry_hash",
    "load_llm_record",
    "machine",
    "merge",
    "outcomes_from_rows",
    "provenance_line",
    "read_record",
    "rejudge_rows",
    "respecification_of",
    "respecified_views",
    "row_key",
    "ship_llm_record",
    "summarize_llm_rows",
]

_REPO = Path(__file__).resolve().parents[2]

#: The shipped record of the last full llm-layer run.
LLM_RECORD = paths.DATA_DIR / "records" / "llm.json"

#: The one command that regenerates :data:`LLM_RECORD` (documented in docs/llm-checks.md).
LLM_RECORD_COMMAND = (
    "tiltlab check --layer llm --slow --jobs 2 --out results/llm.json && tiltlab report --ship-llm results/llm.json"
)

#: Provenance fields copied onto every check row.
PROVENANCE_FIELDS = ("run_at", "run_id", "command", "mode", "slow", "commit", "commit_sha", "seed", "source")


def now_utc() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def git_commit(root: Path | None = None) -> str | None:
    """``git describe --always --dirty --abbrev=12`` of the checkout holding the code (None outside git)."""
    root = _REPO if root is None else root
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "describe", "--always", "--dirty", "--abbrev=12"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    text = out.stdout.strip()
    return text if out.returncode == 0 and text else None


def git_sha(root: Path | None = None) -> str | None:
    """``git rev-parse HEAD``: the full hash of the checked-out commit (None outside git), recorded
    beside :func:`git_commit` so that ancestry can be tested (``git merge-base --is-ancestor``)."""
    root = _REPO if root is None else root
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--verify", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    text = out.stdout.strip()
    return text if out.returncode == 0 and len(text) >= 40 else None


def machine() -> dict[str, Any]:
    """The machine a run used: platform, CPU model, CPU count, the 1-minute load average (None where
    unknown), and torch's CPU kernel path (``get_cpu_capability``, where torch is loaded: the pins are
    judged on whatever path a machine takes)."""
    try:
        load: float | None = round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        load = None
    out = {
        "platform": f"{platform.system()} {platform.machine()}",
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "load": load,
        "python": platform.python_version(),
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch"] = torch.__version__
        out["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    return out


def cpu_model() -> str | None:
    """The CPU's model name (``/proc/cpuinfo``; ``platform.processor()`` elsewhere; None if unknown)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def row_key(row: Mapping[str, Any]) -> str:
    """The registry key of a check row: ``claim[layer:check]`` (:attr:`Check.key`)."""
    return f"{row['claim']}[{row['layer']}:{row['check']}]"


# --------------------------------------------------------------------------- rows <-> outcomes


@dataclasses.dataclass
class RecordedOutcome(Outcome):
    """An outcome read back from a record, with the provenance of the run that produced it."""

    provenance: dict[str, Any] = dataclasses.field(default_factory=dict)
    ok_recorded: bool | None = None
    legacy: bool = False
    respecified: Mapping[str, Any] | None = None
    """The ``[[respecification]]`` whose earlier items the row was judged under (:func:`respecification_of`)."""

    @property
    def ok(self) -> bool:  # type: ignore[override]
        # a row whose check is no longer loaded, a legacy row (run under an earlier rule, see
        # preregistration.toml [[legacy]]), or a row judged under items re-specified since
        # ([[respecification]]) keeps the judgement made when it ran
        earlier = self.legacy or self.respecified is not None
        if (self.check.fn is _not_loaded or earlier) and self.ok_recorded is not None:
            return self.ok_recorded
        return super().ok


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


def _not_loaded(seed: int) -> CheckResult:  # pragma: no cover - never called
    raise RuntimeError("this check's module is not loaded; the row comes from a record")


def _check_for(row: Mapping[str, Any]) -> Check:
    """The registered check of a row, or a stand-in built from the row (its module is not loaded,
    e.g. the llm layer without the ``[llm]`` extra)."""
    chk = registry._CHECKS.get(row_key(row))
    if chk is not None:
        return chk
    items = tuple((str(k), bool(v)) for k, v in (row.get("expected_items") or {}).items())
    return Check(
        row["claim"], row["layer"], row["check"], Verdict(row["expected"]), _not_loaded, bool(row.get("slow")), items
    )


def outcomes_from_rows(rows: Iterable[Mapping[str, Any]]) -> list[RecordedOutcome]:
    """Outcomes of the check rows of a record (rows of claims no longer declared are dropped)."""
    known = registry.claims()
    legacy = {(e["check"], e["run_commit"][:7]) for e in prereg.legacy_runs()}
    respecs = prereg.respecifications()
    outs = []
    for row in rows:
        if row["claim"] not in known:
            continue
        verdict = row.get("verdict")
        result = None
        if verdict not in (None, "error"):
            result = CheckResult(
                Verdict(verdict),
                row.get("summary") or "",
                dict(row.get("numbers") or {}),
                row.get("figure"),
                dict(row.get("items") or {}),
                evidence=row.get("evidence"),
            )
        prov = {k: row[k] for k in PROVENANCE_FIELDS if k in row}
        outs.append(
            RecordedOutcome(
                _check_for(row),
                result,
                float(row.get("seconds") or 0.0),
                row.get("error"),
                prov,
                row.get("ok"),
                (row.get("check"), str(row.get("commit") or "")[:7]) in legacy,
                respecification_of(row, respecs) if row.get("layer") == "llm" else None,
            )
        )
    return outs


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


def stamp_rows(rows: Sequence[dict[str, Any]], prov: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The rows with ``prov`` (the run's provenance) written onto each."""
    return [{**row, **prov} for row in rows]


def provenance_line(prov: Mapping[str, Any]) -> str:
    """``recorded 2026-11-24 19:10 UTC, commit abc123, `tiltlab check --layer llm --slow``` (one line)."""
    what = "recorded (not re-run)" if prov.get("source") == "recorded" else "from an earlier run"
    parts = [what]
    if prov.get("run_at"):
        parts.append(str(prov["run_at"]).replace("T", " ").replace("+00:00", " UTC"))
    if prov.get("mode"):
        parts.append(f"mode {prov['mode']}" + (" with slow checks" if prov.get("slow") else ""))
    parts.append(f"commit {prov.get('commit') or 'unknown'}")
    if prov.get("command"):
        parts.append(f"`{prov['command']}`")
    return ", ".join(parts)


# --------------------------------------------------------------------------- reading / merging


def read_record(path: Path, flag: str = "--out") -> dict[str, Any] | None:
    """The record at ``path`` (None when there is no file); a file that is not a tiltlab record is
    an error (one line), so it is never overwritten by accident."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(
            f"{flag} {path} exists and is not a tiltlab record ({type(exc).__name__}); "
            "pass another path, or --replace to overwrite it"
        ) from None
    if not isinstance(rec, dict) or not isinstance(rec.get("checks"), list):
        raise ValueError(
            f"{flag} {path} exists and is not a tiltlab record (no 'checks' list); "
            "pass another path, or --replace to overwrite it"
        )
    return rec


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


# --------------------------------------------------------------------------- the shipped llm record


def llm_registry_hash() -> str:
    """sha256 (16 hex digits) of the llm part of the registry: every llm check (key, expected
    verdict, expected items, slow) and the claims they decide (every declared field)."""
    registry.require_catalogued("record.llm_registry_hash")
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


PIN_LAYERS = ("theory", "sim", "data")
"""Layers whose numbers are deterministic at a fixed seed and run in every ``tiltlab check``."""
PIN_ATOL = 1e-9
"""Absolute floor of a pin's tolerance (residuals of order 1e-17 are rounding, not evidence)."""


def llm_pins(llm_rec: Mapping[str, Any] | None) -> dict[str, dict[str, list[float]]]:
    """Pins of the shipped llm record: every judged item's mean (a number ``k`` with ``k_margin``,
    ``k_lo`` and ``k_hi`` beside it), with half its 95% interval as the tolerance. The tiny-model
    runs are bit-reproducible at a fixed thread count on one machine but not across machines; a
    re-run that moves an item's mean by more than half its interval is a regression, whatever the
    verdict."""
    out: dict[str, dict[str, list[float]]] = {}
    for r in (llm_rec or {}).get("checks", []):
        nums = r.get("numbers", {})
        pins = {}
        for k, v in nums.items():
            lo, hi = nums.get(f"{k}_lo"), nums.get(f"{k}_hi")
            numeric = all(isinstance(x, int | float) and not isinstance(x, bool) for x in (v, lo, hi))
            if f"{k}_margin" in nums and numeric and math.isfinite(float(v)):
                pins[k] = [float(v), max((float(hi) - float(lo)) / 2, PIN_ATOL)]
        if pins and r.get("ok"):
            out[row_key(r)] = dict(sorted(pins.items()))
    return out


def write_pins(
    rec: Mapping[str, Any],
    dest: Path,
    rtol: float = 1e-4,
    layers=PIN_LAYERS,
    llm_rec: Mapping[str, Any] | None = None,
    checks: Mapping[str, Any] | None = None,
) -> tuple[int, int]:
    """Pin every finite number of the record's rows of ``layers`` run at seed 0 (not recorded rows) by
    its declared kind (:meth:`registry.Check.pin_spec`): ``exact`` as ``[value, max(rtol |value|,
    PIN_ATOL), "exact"]``, ``stochastic`` with the check's floor as well, ``residual`` as ``[value,
    bound, "residual"]`` (judged ``|got| <= bound``); plus the judged items of the shipped llm record
    ``llm_rec`` (:func:`llm_pins`), written atomically to ``dest``. ``checks``: check key -> object
    with ``pin_spec(name)`` (default: the registered checks). Returns ``(checks, numbers)`` pinned.
    Refuses a record with a failed or crashed row, or a residual above its own bound (a pin of a
    wrong run would make the wrong numbers the expected ones)."""
    if not (math.isfinite(rtol) and rtol > 0):
        raise ValueError(f"--pin-rtol must be a finite number > 0, got {rtol}")
    if rec.get("seed", 0) != 0:
        raise ValueError(
            f"pins come from a run at seed 0 (what `tiltlab check` runs); this record has seed {rec.get('seed')}"
        )
    rows = [r for r in rec.get("checks", []) if r.get("layer") in layers and r.get("source") != "recorded"]
    bad = [row_key(r) for r in rows if not r.get("ok")]
    if bad:
        raise ValueError(
            f"the record has {len(bad)} failed or crashed check(s) ({', '.join(bad[:3])}); fix them before pinning"
        )
    if not rows:
        raise ValueError(f"the record has no rows of layers {', '.join(layers)} to pin")
    if checks is None:
        registry.require_catalogued("record.write_pins")
        checks = {c.key: c for c in registry.checks()}
    out: dict[str, dict[str, list[Any]]] = {}
    n = 0
    over: list[str] = []
    by_value: list[str] = []
    for r in sorted(rows, key=row_key):
        chk = checks.get(row_key(r))
        nums: dict[str, list[Any]] = {}
        for k, v in sorted(r.get("numbers", {}).items()):
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(float(v)):
                continue
            spec = chk.pin_spec(k) if chk is not None else pinned.EXACT
            if spec.kind != "residual" and pinned.looks_like_residual(k, float(v)):
                by_value.append(f"{row_key(r)} {k} = {v:.3g}")
            if spec.kind == "residual":
                if abs(float(v)) > spec.bound:
                    over.append(f"{row_key(r)} {k} {v:.3g} > {spec.bound:.3g}")
                nums[k] = [float(v), spec.bound, "residual"]
            else:
                floor = spec.bound if spec.kind == "stochastic" else 0.0
                nums[k] = [float(v), max(rtol * abs(float(v)), PIN_ATOL, floor), spec.kind]
        if nums:
            out[row_key(r)] = nums
            n += len(nums)
    if by_value:
        raise ValueError(
            f"{len(by_value)} number(s) read as residuals (named like an error, or 0 < |v| < {pinned.TINY:g}) but "
            f"would be pinned by value: {'; '.join(by_value[:3])}; declare each with register_check(pins={{name: "
            "residual(bound)}) (bound: the check's own tolerance)"
        )
    if over:
        raise ValueError(f"{len(over)} residual(s) above their check's own bound: {'; '.join(over[:3])}")
    for key, pins in llm_pins(llm_rec).items():
        out[key] = {k: [*v, "stochastic"] for k, v in pins.items()}  # seeded means: half their interval
        n += len(pins)
    payload = {
        "about": "pinned evidence numbers: [value, tolerance, kind]; exact and stochastic numbers fail "
        "`tiltlab check` when |got - value| > tolerance, a residual when |got| > its bound (the check's own "
        "tolerance; value is what the pinning run saw), even when the verdict stays; kinds are declared "
        "with each check (register_check(pins=...)); regenerate with `tiltlab check --out F && tiltlab "
        "report --record F --pin` after a change that moves them on purpose",
        "commit": rec.get("commit"),
        "rtol": rtol,
        "atol": PIN_ATOL,
        "pins": out,
    }
    write_text(Path(dest), json.dumps(payload, indent=1, sort_keys=True) + "\n")
    pinned.set_pins(None)
    return len(out), n


def write_costs(rec: Mapping[str, Any], dest: Path, layers=PIN_LAYERS) -> int:
    """Write the seconds of the record's rows of ``layers`` (run, not recorded) as the check costs
    that ``tiltlab check --jobs N`` starts longest first (``tiltlab.paper_checks.cli.longest_first``);
    from a ``--jobs 1`` run, whose seconds are each check's own. Returns the number of checks."""
    rows = [r for r in rec.get("checks", []) if r.get("layer") in layers and r.get("source") != "recorded"]
    if not rows:
        raise ValueError(f"the record has no rows of layers {', '.join(layers)} with run times")
    out = {
        "about": "seconds each fast check took in one `tiltlab check --jobs 1` run: `tiltlab check --jobs N` "
        "starts the longest first (a scheduling hint; it changes no result); regenerate with "
        "`tiltlab check --jobs 1 --out F && tiltlab report --record F --costs`",
        "commit": rec.get("commit"),
        "cpu": (rec.get("machine") or {}).get("cpu"),
        "seconds": {row_key(r): round(float(r.get("seconds", 0.0)), 3) for r in sorted(rows, key=row_key)},
    }
    write_text(dest, json.dumps(out, indent=1) + "\n")
    return len(out["seconds"])


def load_llm_record(path: Path | None = None) -> dict[str, Any] | None:
    """The shipped llm-layer record (None when there is none)."""
    path = LLM_RECORD if path is None else Path(path)
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
    rows = []
    for r in rec["checks"]:
        cid = r["claim"]
        if prefix and not (cid == prefix or cid.startswith(prefix.rstrip(".") + ".") or cid.startswith(prefix)):
            continue
        if name and r["check"] != name:
            continue
        rows.append({**r, "source": "recorded"})
    return rows, rec


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
    write it to ``dest`` (default :data:`LLM_RECORD`) atomically. The run must hold a row for every
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
    registry.require_catalogued("record.ship_llm_record")
    rec = read_record(Path(src), "--ship-llm")
    if rec is None:
        raise FileNotFoundError(f"--ship-llm {src}: no such file")
    want = {c.key for c in registry.checks() if c.layer == "llm" and not c.long}
    longs = {c.key for c in registry.checks() if c.layer == "llm" and c.long}
    if not want:
        raise ValueError("--ship-llm: no llm checks are registered (is the [llm] extra installed?)")
    rows = rec["checks"]
    got = {row_key(r) for r in rows}
    dest = LLM_RECORD if dest is None else Path(dest)
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


def pseudo_sample(mean: float, lo: float, hi: float, n: int, level: float = 0.95) -> tuple[float, ...]:
    """``n`` values whose mean is ``mean`` and whose two-sided ``level`` Student-t interval is
    ``[lo, hi]``: the t-tests of :mod:`tiltlab.claims.stats` depend on a sample only through
    (mean, sd, n), so a record that kept those re-derives every p-value through them. (Not the
    measured values: used only for rows recorded before raw values were kept.)"""
    from tiltlab.claims import stats

    if n < 2 or not (lo <= mean <= hi):
        raise ValueError(f"a pseudo-sample needs n >= 2 and lo <= mean <= hi, got n={n}, [{lo}, {mean}, {hi}]")
    sd = (hi - lo) / 2 * math.sqrt(n) / stats.t_quantile(0.5 + level / 2, n - 1)
    base = [i - (n - 1) / 2 for i in range(n)]
    b_sd = math.sqrt(sum(x * x for x in base) / (n - 1))
    return tuple(mean + sd * x / b_sd for x in base)


def posthoc_neutral(row: Mapping[str, Any]) -> dict[str, Any] | None:
    """The one decision rule applied *post hoc* to a legacy llm row that kept only each item's mean,
    95% interval and seed count: the items the registry declares now for the row's claim (their
    kinds and margins), pseudo-samples with the recorded statistics (:func:`pseudo_sample`), the
    row's "it ran" flags. ``{"verdict", "alt_verdict", "items": {name: outcome}, "missing": [...]}``,
    or None when none of the declared judged items is in the row. Not pre-registered: context for a
    reader until the re-run, never a shipped verdict."""
    from tiltlab.claims import stats

    claim = registry.claims().get(row.get("claim", ""))
    nums = row.get("numbers") or {}
    n = nums.get("seeds")
    if claim is None or not isinstance(n, int):
        return None
    items, missing = [], []
    for spec in claim.items_for(row.get("layer", "llm")).values():
        if not all(k in nums for k in (spec.name, f"{spec.name}_lo", f"{spec.name}_hi")):
            missing.append(spec.name)
            continue
        vals = pseudo_sample(float(nums[spec.name]), float(nums[f"{spec.name}_lo"]), float(nums[f"{spec.name}_hi"]), n)
        items.append(stats.Item(spec.name, vals, spec.kind, spec.margin))
    if not any(i.kind != stats.CONTEXT for i in items):
        return None
    ran = {k: bool(v) for k, v in (row.get("items") or {}).items() if k.startswith("ran_")}
    j = stats.judge(items, ran)
    return {
        "verdict": j.verdict,
        "alt_verdict": j.alt_verdict,
        "items": {k: t.outcome for k, t in j.tests.items()},
        "missing": missing,
    }


def rejudge_rows(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every row re-derived bottom up (:func:`tiltlab.claims.rejudge.rejudge_row`, ``tiltlab report
    --rejudge``) with its registered check's re-derivation of its raw values (a check whose module is not
    loaded, e.g. the llm layer without the ``[llm]`` extra, is re-derived from its item values, and says so)."""
    from tiltlab.claims import rejudge

    out = []
    for r in rows:
        chk = registry._CHECKS.get(row_key(r)) if {"claim", "layer", "check"} <= set(r) else None
        why = None if chk is not None else f"check {r.get('check')} is not loaded (is its layer's extra installed?)"
        out.append(rejudge.rejudge_row(r, None if chk is None else chk.rederive, not_loaded=why))
    return out


def set_llm_expectations(path: Path | None = None, root: Path | None = None) -> dict[str, Any]:
    """Give the shipped llm record at ``path`` (default :data:`LLM_RECORD`) today's expected verdicts
    and items: after a run under a new rule, the expectations (regression markers, not the rule) are set
    from that run in the checks' code, and the record's rows, its ``ok`` flags and its registry hash
    follow them. Verdicts, items, numbers and evidence are the run's and are not touched. The commit at
    which this was done (a clean checkout: a dirty one is refused) is written as ``expectations_set_at``;
    a row's earlier expectations, where they change, go to its ``expectations_history`` (with the commit
    until which they held); a row judged under items re-specified since (:func:`respecification_of`)
    keeps the expectations it was judged with and is marked ``respecified``. A row whose check is not
    registered is refused. Written atomically; returns the record."""
    registry.require_catalogued("record.set_llm_expectations")
    path = LLM_RECORD if path is None else Path(path)
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


def write_json(path: Path, rec: Mapping[str, Any]) -> None:
    """Write a record atomically: indent 1, keys in their order, anything else as ``str``
    (:func:`tiltlab.files.write_json`)."""
    files.write_json(path, rec, indent=1, default=str)
