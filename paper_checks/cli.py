"""``tiltlab check`` and ``tiltlab reproduce``.

``tiltlab check`` runs every fast check (theory, sim, data; ``--slow`` adds the slow ones; the opt-in
``llm`` layer runs only with ``--layer llm``),
prints one row per check (claim, source as "DISA §2.2 eq. (10)", layer, verdict, one line of
evidence) plus one row per declared claim that has no check yet, merges them into ``results/claims.json`` (a
partial run never shrinks the record: rows of checks not run now are kept with their own time, mode and
commit; ``--replace`` writes this run only) and exits non-zero only
when a check returns a verdict other than the one recorded as expected for it, or crashes. The llm-layer
rows come from the shipped record of its last full run, marked ``recorded`` (:mod:`.record`).
Each failure is followed by the command that re-runs just that check. Arguments are checked
before any check runs: an empty selection, ``--jobs`` < 1 or an ``--out`` that cannot be written
is an error (exit 2) and leaves the record untouched. ``--list`` prints the selection only.

``tiltlab reproduce`` runs all checks (``--llm`` re-runs the llm layer instead of merging its shipped record) and all
simulator figures and writes ``claims.json``, ``REPORT.md`` and a self-contained ``report.html`` (figures embedded)
into ``--out`` (``results/``; ``results/quick/`` with ``--quick``), through a temporary folder moved into place at the
end. ``tiltlab report`` works from a record: the report again, the per-claim table (csv, latex, md), the README's
generated sections, and stamping the shipped llm record.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import importlib
import json
import math
import os
import platform
import shlex
import shutil
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tiltlab.files import write_text
from tiltlab.paper_checks.registry import FIGURE_MODULE

LAYERS = ("theory", "sim", "data", "llm")

_CHECK_HELP = """Run the claim checks and compare every verdict with the one recorded as expected.

The llm-layer checks (small real models trained on CPU, all slow) run only when asked for:
`--layer llm --slow` (or `--only llm --slow`); otherwise their last full run, shipped with the
project, is merged and marked "recorded" (not re-run; never affects the exit status).

The record is merged, never shrunk: a partial run replaces the rows of the checks it ran and keeps
the others, each with the time, command, mode and commit of its run; --replace writes this run only.
An --out that is not a tiltlab record is refused.
A check that records expected per-item outcomes fails when an item changes, even if its verdict
does not.

Exit status: 0 when every selected check returns its expected verdict (a claim that is
refuted and stays refuted is green); 1 when a verdict changed or a check crashed; 2 on
bad arguments (an empty selection included; the record is then left untouched). Failing
checks are followed by a reproducer line. --list prints the selection without running it."""

_REPRO_HELP = """Run all checks and all simulator figures and write the report:
OUT/claims.json, OUT/figures/*.png|json, OUT/REPORT.md and OUT/report.html (self-contained).

Everything is written into a temporary folder next to OUT and moved into place at the end, so an
interrupted run leaves the previous outputs. --quick writes to results/quick/ by default and refuses
an OUT that holds a full run. The llm layer comes from its shipped record (marked recorded) unless --llm."""


_REPORT_HELP = """Work from a record instead of re-running checks.

  tiltlab report                      rewrite REPORT.md and report.html next to a reproduce record
  tiltlab report --format csv|latex|md  the per-claim table (claim, paper, section, verdict, deciding
                                      layers, key numbers with CIs, commit, source) on stdout or --out
  tiltlab report --docs               rewrite the generated sections of README.md and docs/llm-checks.md
  tiltlab report --ship-llm FILE      ship a full llm-layer run as the shipped llm record (refused
                                      unless every row is strictly pre-registered, see --preregister)
  tiltlab report --preregister [CHECK]  write the sha256 of CHECK's (default: all llm checks') rule
                                      files into paper_checks/preregistration.toml
  tiltlab report --rejudge FILE       re-derive every verdict of a record from its raw per-unit
                                      values; exit 1 when one differs from the recorded verdict

The llm-layer checks of the shipped record are merged (marked recorded) into a record that lacks them."""


#: ``tiltlab report --preregister`` without a check name: every ``[[rule]]`` of the file.
_ALL_LLM = "*all*"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "check",
        help="run the claim checks (theory + sim + data)",
        description=_CHECK_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--only", metavar="PREFIX", help="claim-id prefix (e.g. disa.prop1) or a layer name (theory, sim, data, llm)"
    )
    p.add_argument("--layer", choices=LAYERS, help="only checks of this layer")
    p.add_argument("--check", metavar="NAME", help="only the check with this name (as printed in reproducer lines)")
    p.add_argument("--seed", type=int, default=0, help="seed passed to every check (default 0)")
    p.add_argument("--slow", action="store_true", help="include checks marked slow")
    p.add_argument(
        "--long",
        action="store_true",
        help="include checks marked long (hours; never part of a layer's run; implies --slow)",
    )
    p.add_argument("--json", action="store_true", help="print the JSON record to stdout instead of the table")
    p.add_argument(
        "--list", action="store_true", help="print the selected checks (claim, check, layer, slow) and run none"
    )
    p.add_argument(
        "--jobs",
        type=_positive_int,
        default=min(2, os.cpu_count() or 1),
        help="run checks in this many forked processes (default: min(2, CPUs); 1 = in this process); llm-layer "
        "checks run one at a time, each with its seeds in this many processes",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("results/claims.json"),
        help="where to write the JSON record (default results/claims.json)",
    )
    p.add_argument(
        "--claims",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="also read [[claim]] TOML files from DIR (repeatable; for your own project's claims)",
    )
    p.add_argument(
        "--module",
        action="append",
        default=[],
        metavar="NAME",
        help="also import this module, which registers checks with paper_checks.register_check (repeatable; "
        "the current directory is importable)",
    )
    p.add_argument(
        "--replace",
        action="store_true",
        help="write only this run's checks to --out (default: merge into an existing record, keeping the rows of "
        "checks not run now with their own time, mode and commit)",
    )
    p.set_defaults(func=_cmd_check)

    r = subparsers.add_parser(
        "reproduce", help="all checks + all simulator figures -> REPORT.md and report.html", description=_REPRO_HELP
    )
    r.add_argument("--quick", action="store_true", help="fast figure settings, skip slow checks (under 2 minutes)")
    r.add_argument(
        "--llm",
        action="store_true",
        help="also run the llm-layer checks (small real models trained on CPU; tens of minutes; needs the [llm] extra)",
    )
    r.add_argument("--seed", type=int, default=0, help="seed for every check and figure (default 0)")
    r.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output directory (default results/, and results/quick/ with --quick so a quick run never replaces a "
        "full one)",
    )
    r.add_argument(
        "--jobs",
        type=_positive_int,
        default=min(2, os.cpu_count() or 1),
        help="processes: figures run in JOBS-1 worker processes while the checks run (default: min(2, CPUs))",
    )
    r.set_defaults(func=_cmd_reproduce)

    t = subparsers.add_parser(
        "report",
        help="the report, the per-claim table (csv, latex, md) or the README sections, from a record",
        description=_REPORT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    t.add_argument(
        "--record",
        type=Path,
        default=Path("results/claims.json"),
        help="the record to read (default results/claims.json, written by tiltlab reproduce / check)",
    )
    t.add_argument("--format", choices=("csv", "latex", "md"), help="print the per-claim table in this format")
    t.add_argument("--out", type=Path, help="write the table here instead of stdout (--format), or the shipped record")
    t.add_argument(
        "--docs",
        action="store_true",
        help="rewrite the generated sections of README.md (counts, verdict table, timings) and docs/llm-checks.md",
    )
    t.add_argument(
        "--timings",
        type=Path,
        action="append",
        default=[],
        metavar="RECORD",
        help="with --docs: records whose run times fill the timings table (repeatable; default: --record)",
    )
    t.add_argument("--readme", type=Path, default=None, help="with --docs: the README to rewrite (default: the repo's)")
    t.add_argument(
        "--ship-llm",
        type=Path,
        metavar="RECORD",
        help="stamp the record of a full llm-layer run and write it as the shipped llm record "
        "(paper_checks/records/llm.json, or --out)",
    )
    t.add_argument(
        "--set-llm-expectations",
        action="store_true",
        help="after an llm-layer run under a new rule, once its expectations are set from it in the checks' code: "
        "give the shipped llm record (or --out) today's expected verdicts and items, ok flags and registry hash "
        "(the run's verdicts, items and numbers are not touched)",
    )
    t.add_argument(
        "--rejudge",
        type=Path,
        metavar="RECORD",
        help="re-derive every verdict of RECORD (a claims.json or the shipped llm record) from its raw per-unit "
        "values with the one decision rule; exit 1 when a recorded verdict is not what its values give",
    )
    t.add_argument(
        "--preregister",
        nargs="?",
        const=_ALL_LLM,
        metavar="CHECK",
        help="write the sha256 of the rule files of CHECK (default: every registered llm check) into "
        "paper_checks/preregistration.toml; commit it before the run that decides the rule",
    )
    t.add_argument(
        "--pin",
        action="store_true",
        help="write the numbers of the record's theory, sim and data checks as the pinned numbers "
        "(paper_checks/pins.json, or --out) with a relative tolerance of --pin-rtol",
    )
    t.add_argument(
        "--pin-rtol",
        type=float,
        default=1e-4,
        help="with --pin: relative tolerance of every pinned number (default 1e-4; absolute floor 1e-9)",
    )
    t.add_argument(
        "--costs",
        action="store_true",
        help="write the run times of the record's theory, sim and data checks (from a `tiltlab check --jobs 1` run) "
        "as the costs by which `tiltlab check` starts the longest checks first (paper_checks/costs.json, or --out)",
    )
    t.add_argument("--machine", help="with --ship-llm: the machine that ran it (default: the record's)")
    t.add_argument("--run-seconds", type=float, help="with --ship-llm: its wall time (default: the record's)")
    t.set_defaults(func=_cmd_report)


# --------------------------------------------------------------------------- shared


def _positive_int(text: str) -> int:
    """argparse type of ``--jobs``: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 (1 = run in this process), got {value}")
    return value


def _check_writable_file(path: Path, flag: str = "--out") -> None:
    """Raise ``ValueError`` (one line) unless a file can be created at ``path``: checked before
    any work, so a bad ``--out`` does not cost a whole run. Creates the missing parent folders."""
    if path.is_dir():
        raise ValueError(f"{flag} {path} is a directory; pass a file path such as {path / 'claims.json'}")
    _check_writable_dir(path.parent, flag, shown=path)


def _check_writable_dir(path: Path, flag: str = "--out", shown: Path | None = None) -> None:
    shown = path if shown is None else shown
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".tiltlab-write-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ValueError(f"cannot write {flag} {shown} ({reason}); pass {flag} with a writable path") from None


def _progress(total: int | None, desc: str, unit: str, enabled: bool = True):
    """The shared progress reporter (:mod:`tiltlab.progress`): a bar with ETA on a terminal, a line
    every ``TILTLAB_PROGRESS_INTERVAL`` seconds elsewhere; nothing when ``enabled`` is false."""
    from tiltlab.progress import progress

    return progress(total, desc, unit, **({} if enabled else {"mode": "off"}))


def _load_extra(claim_dirs: Sequence[Path] = (), modules: Sequence[str] = ()) -> None:
    """Claims and check modules of another project (``tiltlab check --claims DIR --module NAME``)."""
    import importlib

    from tiltlab.paper_checks import registry

    registry.discover()
    for d in claim_dirs:
        registry.load_claims(d)
    if modules and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    for m in modules:
        importlib.import_module(m)


def _select(
    args_only: str | None,
    layer: str | None,
    name: str | None,
    include_slow: bool,
    include_llm: bool | None = None,
    include_long: bool = False,
):
    from tiltlab.paper_checks import registry

    registry.discover()
    registry.validate()
    chks = registry.select(args_only, layer, include_slow, include_llm, include_long)
    if name:
        chks = [c for c in chks if c.name == name]
    return chks


def _one_thread() -> None:
    """Pool initializer (and main process while a pool runs): one torch thread per process, so
    ``jobs`` processes on ``jobs`` cores do not oversubscribe them (measured: reproduce --quick
    125 s with the default thread count vs the sum of its parts, ~60 s, sequentially)."""
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:  # pragma: no cover - torch is a core dependency
        pass


def _run_key(key: str, seed: int):
    """Worker side of :func:`_run`: run one check of the (forked) registry; picklable result."""
    from tiltlab.paper_checks import registry

    out = registry.run_one(registry._CHECKS[key], seed)
    return key, out.result, out.seconds, out.error


#: Environment variable naming the folder where the forked workers of one run share the simulator's
#: experiment results (read by ``tiltlab.sim.experiments.cached``; a test pins the two names together).
RUN_CACHE_ENV = "TILTLAB_RUN_CACHE"

#: Imported once before the workers fork, instead of once in each of them: modules the checks import
#: on first use (the first optimizer step imports torch._dynamo, ~1 CPU-s; the theory checks scipy.optimize;
#: the t intervals scipy.special, ~0.3 CPU-s; sympy's simplify sympy.physics.units, ~0.4 CPU-s).
_PRELOAD = ("torch._dynamo", "scipy.optimize", "scipy.special", "sympy.physics.units")


def _preload() -> None:
    for name in _PRELOAD:
        with contextlib.suppress(ImportError):  # a speed-up only: a check that needs it reports the problem
            importlib.import_module(name)


@contextlib.contextmanager
def _run_cache():
    """A folder shared by the workers of one run (experiments computed once across them), removed
    at the end; an outer value of the variable is restored."""
    old = os.environ.get(RUN_CACHE_ENV)
    with tempfile.TemporaryDirectory(prefix="tiltlab-run-cache-") as tmp:
        os.environ[RUN_CACHE_ENV] = tmp
        try:
            yield tmp
        finally:
            if old is None:
                os.environ.pop(RUN_CACHE_ENV, None)
            else:
                os.environ[RUN_CACHE_ENV] = old


#: Seconds each fast check took in one ``tiltlab check --jobs 1`` run (``tiltlab report --costs``).
COSTS_FILE = Path(__file__).resolve().parent / "costs.json"


def check_costs(path: Path | None = None) -> dict[str, float]:
    """``{check key: seconds}`` from :data:`COSTS_FILE` (empty when there is none or it cannot be
    read: the costs only order the work, never change a result)."""
    try:
        raw = json.loads((path or COSTS_FILE).read_text(encoding="utf-8"))
        return {str(k): float(v) for k, v in raw.get("seconds", {}).items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def longest_first(chks, costs: dict[str, float] | None = None) -> list:
    """``chks`` in the order a pool should start them: by recorded cost, longest first (a long check
    started last would make the run's wall time its length plus everything before it); a check
    without a recorded cost (new, or another project's) is taken as the longest. Ties keep ``chks``
    order."""
    costs = check_costs() if costs is None else costs
    return sorted(chks, key=lambda c: -costs.get(c.key, math.inf))


#: The module whose ``seed_jobs(n)`` shards the seeds of an llm-layer check over ``n`` forked processes
#: (``map_seeds``), imported by name: ``paper_checks`` holds no import of a check layer.
SEED_SHARDS_MODULE = "tiltlab.llm.checks.task"

#: Layers whose checks ``--jobs N`` runs in this process one after another, each sharding its seeds over N
#: processes: their memoized runs are shared by several checks, so one process per check would train them anew.
SEED_SHARDED_LAYERS = ("llm",)


def _run(chks, seed: int, progress: bool = True, jobs: int = 1):
    """Run the checks; with ``jobs > 1`` the llm-layer checks (:data:`SEED_SHARDED_LAYERS`) run in this
    process one after another with their seeds in ``jobs`` forked processes (:data:`SEED_SHARDS_MODULE`),
    the others in a pool of forked processes, started longest first (:func:`longest_first`; each check
    is seeded on its own, so verdicts do not depend on where or when it runs). Outcomes keep ``chks`` order."""
    sharded = [c for c in chks if c.layer in SEED_SHARDED_LAYERS] if jobs > 1 else []
    if not sharded:
        return _run_checks(chks, seed, progress, jobs)
    keys = {c.key for c in sharded}
    done = {o.check.key: o for o in _run_checks([c for c in chks if c.key not in keys], seed, progress, jobs)}
    with importlib.import_module(SEED_SHARDS_MODULE).seed_jobs(jobs):
        done.update((o.check.key, o) for o in _run_checks(sharded, seed, progress, 1))
    return [done[c.key] for c in chks]


def _run_checks(chks, seed: int, progress: bool, jobs: int):
    """:func:`_run` with one process per check (``jobs > 1``: a pool of forked processes)."""
    import multiprocessing as mp

    from tiltlab.paper_checks import registry

    if jobs > 1 and len(chks) > 1 and "fork" in mp.get_all_start_methods():
        from concurrent.futures import ProcessPoolExecutor, as_completed

        by_key = {c.key: c for c in chks}
        done = {}
        _preload()
        with (
            _run_cache(),
            ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("fork"), initializer=_one_thread) as ex,
            _progress(len(chks), "checks", "check", progress) as bar,
        ):
            futs = [ex.submit(_run_key, c.key, seed) for c in longest_first(chks)]
            for fut in as_completed(futs):
                key, res, sec, err = fut.result()
                done[key] = registry.Outcome(by_key[key], res, sec, err)
                bar.update(1, postfix=key)
        return [done[c.key] for c in chks]
    outs = []
    with _progress(len(chks), "checks", "check", progress) as bar:
        for c in chks:
            outs.append(registry.run_one(c, seed))
            bar.update(1, postfix=c.key)
    return outs


def _unchecked(prefix: str | None) -> list[dict[str, Any]]:
    from tiltlab.paper_checks import registry

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
    from tiltlab.paper_checks import registry
    from tiltlab.paper_checks.record import outcomes_from_rows

    prov = prov or {}
    checks = []
    for o in outs:
        row = o.to_json(seed)
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
        "skipped_modules": dict(sorted(registry.SKIPPED_MODULES.items())),
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
        "claims": _claim_verdicts(all_outs),
        "checks": sorted(rows, key=lambda r: (r["claim"], r["layer"], r["check"])),
        "unchecked": unchecked,
    }


def _now() -> str:
    from tiltlab.paper_checks.record import now_utc

    return now_utc()


def _machine() -> dict[str, Any]:
    from tiltlab.paper_checks.record import machine

    return machine()


def _provenance(command: str, mode: str, slow: bool, seed: int, run_at: str | None = None) -> dict[str, Any]:
    import uuid

    from tiltlab.paper_checks.record import git_commit, git_sha

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
    now, before they run (:func:`tiltlab.paper_checks.prereg.current_hashes`)."""
    names = {c.name for c in chks if c.layer == "llm"}
    if not names:
        return {}
    from tiltlab.paper_checks.prereg import current_hashes

    return current_hashes(names)


def _write_json(path: Path, rec: dict[str, Any]) -> None:
    """Write ``rec`` atomically (:func:`tiltlab.paper_checks.record.write_json`)."""
    from tiltlab.paper_checks.record import write_json

    write_json(path, rec)


def _claim_verdicts(outs) -> list[dict[str, Any]]:
    """One row per claim with checks in ``outs``: the claim's verdict is its most informative
    check's (the report's rule, :func:`tiltlab.paper_checks.report.claim_status`)."""
    from collections import defaultdict

    from tiltlab.paper_checks.report import claim_decision

    by_claim: dict[str, list] = defaultdict(list)
    for o in outs:
        by_claim[o.check.claim_id].append(o)
    rows = []
    for cid, os_ in sorted(by_claim.items()):
        verdict, layers = claim_decision(os_)
        rows.append({"claim": cid, "verdict": verdict, "decided_by": layers, "checks": [o.check.name for o in os_]})
    return rows


def reproducer(check, seed: int, claim_dirs: Sequence[Path] = (), modules: Sequence[str] = ()) -> str:
    """The command that re-runs exactly ``check``: the registry's line plus ``--slow`` for a slow
    check and the ``--claims`` / ``--module`` of another project's claims and checks."""
    line = check.reproducer(seed)
    if check.long and "--long" not in line.split():
        line += " --long"
    elif check.slow and "--slow" not in line.split():
        line += " --slow"
    line += "".join(f" --claims {shlex.quote(str(d))}" for d in claim_dirs)
    line += "".join(f" --module {shlex.quote(m)}" for m in modules)
    return line


def _counts_line(rec: dict[str, Any]) -> str:
    """Check counts and claim counts, each labelled: "137 checks (verified 80, ...) of 70 claims
    (claim verdicts: verified 46, ...)"."""
    checks = ", ".join(f"{k} {v}" for k, v in rec["summary"]["verdicts"].items() if k != "unchecked")
    claims = Counter(row["verdict"] for row in rec["claims"])
    n_unchecked = len(rec.get("unchecked", []))
    if n_unchecked:
        claims["unchecked"] = n_unchecked
    per_claim = ", ".join(f"{k} {v}" for k, v in sorted(claims.items()))
    return (
        f"{rec['summary']['checks']} checks ({checks}) of {sum(claims.values())} claims "
        f"(per claim, its most informative check's verdict: {per_claim})"
    )


def _print_failures(outs, seed: int, stream=None, claim_dirs=(), modules=()) -> None:
    stream = stream or sys.stdout
    bad = [o for o in outs if not o.ok]
    if not bad:
        return
    from tiltlab.paper_checks.report import FAILED_TITLE

    print(f"\n{FAILED_TITLE}: {len(bad)}", file=stream)
    for o in bad:
        print(f"  FAIL {o.check.key}: {o.failure}", file=stream)
        print(f"       reproduce: {reproducer(o.check, seed, claim_dirs, modules)}", file=stream)


def _short(text: str, width: int = 36) -> str:
    """A citation cut to one table column (the full citation is in the JSON record)."""
    return text if len(text) <= width else text[: width - 1] + "…"


def _table(outs, unchecked, stream=None) -> None:
    stream = stream or sys.stdout
    from tiltlab.paper_checks.registry import cite, get_claim

    rows = []
    for o in outs:
        ev = (
            o.result.summary
            if o.result is not None
            else "CRASHED: " + ((o.error or "").strip().splitlines()[-1:] or ["?"])[0]
        )
        verdict = (
            o.verdict
            if o.ok
            else (
                f"{o.verdict}!={o.check.expected.value}"
                if o.verdict != o.check.expected.value
                else f"{o.verdict}(items!)"
            )
        )
        if (getattr(o, "provenance", None) or {}).get("source") == "recorded":
            verdict += " (recorded)"
        rows.append((o.check.claim_id, _short(cite(get_claim(o.check.claim_id))), o.check.layer, verdict, ev))
    for u in unchecked:
        rows.append((u["claim"], _short(u["cite"]), "-", "unchecked", "no check registered"))
    order = {layer: i for i, layer in enumerate(LAYERS)}
    rows.sort(key=lambda r: (r[0], order.get(r[2], len(order))))  # per claim: theory, sim, data, llm
    if not rows:
        print("no checks selected", file=stream)
        return
    w = [max(len(r[i]) for r in [*rows, ("claim", "source", "layer", "verdict", "")]) for i in range(4)]
    width = shutil.get_terminal_size((200, 24)).columns if stream.isatty() else 200
    ev_w = max(40, width - sum(w) - 8)
    head = ("claim", "source", "layer", "verdict", "evidence")
    print("  ".join(h.ljust(w[i]) if i < 4 else h for i, h in enumerate(head)), file=stream)
    print("  ".join("-" * (w[i] if i < 4 else 8) for i in range(5)), file=stream)
    for r in rows:
        ev = r[4] if len(r[4]) <= ev_w else r[4][: ev_w - 1] + "…"
        print("  ".join(x.ljust(w[i]) for i, x in enumerate(r[:4])) + "  " + ev, file=stream)


# --------------------------------------------------------------------------- tiltlab check


def _cmd_check(args: argparse.Namespace) -> int:
    prefix, layer = args.only, args.layer
    if prefix in LAYERS:
        if layer and layer != prefix:
            raise ValueError(f"--only {prefix} (a layer) conflicts with --layer {layer}; give one of them")
        prefix, layer = None, prefix
    t0 = time.perf_counter()
    try:
        _load_extra(args.claims, args.module)
    except ImportError as exc:
        raise ValueError(f"--module: {exc} (the module must be importable from the current directory)") from None
    long_ = bool(getattr(args, "long", False))
    chks = _select(prefix, layer, args.check, args.slow, include_long=long_)
    unchecked = [] if (layer or args.check) else _unchecked(prefix)
    if not chks and not unchecked:
        raise ValueError(_empty_selection(prefix, layer, args.check, args.slow or long_))
    if args.list:
        _list(chks, unchecked)
        return 0
    _check_writable_file(args.out)  # before any check runs
    from tiltlab.paper_checks.record import merge, read_record, recorded_llm_rows, row_key

    old = None if args.replace else read_record(args.out)  # a non-record --out is refused before any run
    prov = _provenance(_check_command(args), "check", bool(args.slow) or long_, args.seed)
    hashes = _rule_hashes(chks)  # the rule files as this run finds them, with the commit it runs at
    outs = _run(chks, args.seed, progress=True, jobs=args.jobs)
    seconds = time.perf_counter() - t0
    sel = {
        "only": prefix,
        "layer": layer,
        "check": args.check,
        "slow": bool(args.slow),
        "long": long_,
        "claims": [str(d) for d in args.claims],
        "module": list(args.module),
    }
    # the last full llm-layer run, shipped with the repository: merged as recorded (not re-run)
    # unless this run ran the llm layer or selected another layer; a partial run also refreshes the
    # recorded rows the old record held, so it never drops them
    ran = {o.check.key for o in outs}
    had = {row_key(r) for r in (old or {}).get("checks", []) if r.get("source") == "recorded"}
    wanted = had | ({row_key(r) for r in recorded_llm_rows(prefix, args.check)[0]} if not layer else set())
    recorded = [r for r in recorded_llm_rows()[0] if row_key(r) in wanted and row_key(r) not in ran]
    kept = [r for r in merge(old, [])[0] if row_key(r) not in ran]
    rec = _record(outs, unchecked, args.seed, sel, seconds, args.claims, args.module, prov, kept, recorded, hashes)
    rec["runtime"] = _runtime(seconds)
    if old:
        rec["history"] = [*old.get("history", [_history_entry(old)]), _history_entry(rec)]
        rec["unchecked"] = _merge_unchecked(old.get("unchecked", []), unchecked)
        if "figures" in old:  # a `tiltlab reproduce` record: it still describes that run (mode, time, commit)
            for key in (*_REPRODUCE_KEYS, "generated_at", "commit", "machine", "seed", "selection", "runtime"):
                if key in old:
                    rec[key] = old[key]
            rec["updated_at"] = prov["run_at"]
    _write_json(args.out, rec)
    rerendered = _rerender_report(args.out, rec) if old else None
    rc = 1 if rec["summary"]["failures"] else 0
    try:
        _report_check(args, outs, unchecked, rec, seconds, recorded, len(kept), rerendered)
    except BrokenPipeError:  # e.g. `tiltlab check | head`: the record is written, keep the exit status
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return rc


def _check_command(args: argparse.Namespace) -> str:
    """The ``tiltlab check`` command line of this run (without ``--out``/``--json``/``--jobs``)."""
    parts = ["tiltlab check"]
    for flag, value in (("--only", args.only), ("--layer", args.layer), ("--check", args.check)):
        if value:
            parts.append(f"{flag} {shlex.quote(value)}")
    if args.slow:
        parts.append("--slow")
    if getattr(args, "long", False):
        parts.append("--long")
    if args.seed:
        parts.append(f"--seed {args.seed}")
    return " ".join(parts)


#: Keys of a ``tiltlab reproduce`` record that a ``tiltlab check`` merged into it keeps.
_REPRODUCE_KEYS = ("figures", "figures_missing", "environment", "report")


def _history_entry(rec: dict[str, Any]) -> dict[str, Any]:
    return {
        "generated_at": rec.get("generated_at"),
        "commit": rec.get("commit"),
        "selection": rec.get("selection"),
        "ran": rec.get("summary", {}).get("run", rec.get("summary", {}).get("checks")),
    }


def _merge_unchecked(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Claims without a check, from both runs, minus those that have a check now."""
    from tiltlab.paper_checks import registry

    have = {c.claim_id for c in registry.checks()}
    by_id = {u["claim"]: u for u in [*old, *new] if u["claim"] not in have and u["claim"] in registry.claims()}
    return [by_id[k] for k in sorted(by_id)]


def _rerender_report(out: Path, rec: dict[str, Any]) -> Path | None:
    """After merging into a ``tiltlab reproduce`` record, rewrite its REPORT.md and report.html from
    the merged record, so the report never disagrees with the record next to it."""
    folder = out.parent
    if "figures" not in rec or out.name != "claims.json" or not (folder / "REPORT.md").is_file():
        return None
    from tiltlab.paper_checks.report import report_input_from_record, write_report

    write_report(report_input_from_record(rec, folder))
    return folder / "REPORT.md"


def _empty_selection(prefix: str | None, layer: str | None, name: str | None, slow: bool) -> str:
    """Why nothing was selected, and what to pass instead (one line)."""
    from tiltlab.paper_checks import registry

    all_checks = registry.checks()
    layers_with_checks = [x for x in LAYERS if any(c.layer == x for c in all_checks)]
    if layer and layer not in layers_with_checks:
        skipped = "".join(
            f"; check module {m} was skipped ({why})" for m, why in sorted(registry.SKIPPED_MODULES.items())
        )
        return (
            f"no {layer} checks exist yet (layers with checks: {', '.join(layers_with_checks)}); "
            f"the LLM-scale claims are recorded as data: use --layer data{skipped}"
        )
    if (
        not slow
        and registry.select(prefix, layer, True)
        and (not name or any(c.name == name for c in registry.select(prefix, layer, True)))
    ):
        return "the selected checks are all slow: add --slow"
    longs = [c for c in registry.select(prefix, layer, True, include_long=True) if not name or c.name == name]
    if longs and all(c.long for c in longs):
        return "the selected checks are all long (hours): add --long"
    opt_in = [
        c
        for c in registry.select(prefix, None, True, include_llm=True)
        if c.layer in registry.OPT_IN_LAYERS and (not name or c.name == name) and not layer
    ]
    if opt_in:
        return (
            f"--only {prefix} selects only {opt_in[0].layer}-layer checks, which run only when named: "
            f"add --layer {opt_in[0].layer} --slow"
        )
    what = " ".join(
        f"{flag} {value}" for flag, value in (("--only", prefix), ("--layer", layer), ("--check", name)) if value
    )
    return f"no check matches {what}; `tiltlab check --list` prints every check (claim, check name, layer)"


def _list(chks, unchecked=()) -> None:
    """``tiltlab check --list``: one row per selected check (and per selected claim without a
    check), nothing run."""
    rows = [(c.claim_id, c.name, c.layer, "long" if c.long else "slow" if c.slow else "") for c in chks]
    rows += [(u["claim"], "(no check yet)", "-", "") for u in unchecked]
    head = ("claim", "check", "layer", "slow")
    w = [max(len(r[i]) for r in [*rows, head]) for i in range(3)]
    print("  ".join(h.ljust(w[i]) if i < 3 else h for i, h in enumerate(head)).rstrip())
    for r in rows:
        print("  ".join(x.ljust(w[i]) if i < 3 else x for i, x in enumerate(r)).rstrip())
    print(f"{len(rows)} check(s) selected ({sum(c.slow for c in chks)} slow); none run")


def _report_check(args, outs, unchecked, rec, seconds, recorded=(), n_kept=0, rerendered=None) -> None:
    if args.json:
        json.dump(rec, sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
        _print_failures(outs, args.seed, sys.stderr, args.claims, args.module)
    else:
        from tiltlab.paper_checks.record import outcomes_from_rows

        _table([*outs, *outcomes_from_rows(recorded)], unchecked)
        print(
            f"\n{_counts_line(rec)}; ran {len(outs)} in {seconds:.1f} s; {rec['summary']['failures']} changed/crashed."
        )
        print(f"record written to {args.out}")
        if recorded:
            r0 = recorded[0]
            print(
                f"note: {len(recorded)} llm check(s) shown as 'recorded' come from the shipped record of the last full "
                f"llm-layer run (commit {r0.get('commit')}, {r0.get('run_at')}), not re-run; "
                "`tiltlab check --layer llm --slow` runs them"
            )
        if n_kept:
            print(
                f"note: merged into the existing record: {n_kept} check(s) kept from earlier runs with their own "
                "time, mode and commit (--replace writes this run only)"
            )
        if rerendered is not None:
            print(f"report rewritten from the merged record: {rerendered}")
        for m, why in rec["skipped_modules"].items():
            print(f"note: check module {m} was skipped ({why})")
        _print_failures(outs, args.seed, None, args.claims, args.module)


# --------------------------------------------------------------------------- tiltlab reproduce


def _make_one(fig_id: str, mod_name: str, out_dir: Path, quick: bool, seed: int):
    """One figure module -> ``(records, problems)``; never raises (runs in worker processes too)."""
    try:
        simfig = importlib.import_module(FIGURE_MODULE)
        return simfig.make_all(out_dir, quick=quick, seed=seed, only=[fig_id]), {}
    except ModuleNotFoundError as exc:
        if exc.name == f"{FIGURE_MODULE}.{mod_name}":
            return [], {fig_id: f"module {FIGURE_MODULE}.{mod_name} is missing"}
        return [], {fig_id: f"crashed: ModuleNotFoundError: {exc}"}
    except Exception as exc:
        tb = traceback.format_exc().strip().splitlines()
        return [], {fig_id: f"crashed: {type(exc).__name__}: {exc} ({tb[-3].strip() if len(tb) >= 3 else ''})"}


def _figure_list():
    try:
        simfig = importlib.import_module(FIGURE_MODULE)
    except Exception as exc:  # the sim layer is absent or broken: report, do not hide
        return None, {FIGURE_MODULE: f"could not import {FIGURE_MODULE}: {type(exc).__name__}: {exc}"}
    return list(simfig.FIGURES), {}


def make_figures(out_dir: Path, quick: bool, seed: int, progress: bool = True):
    """Run every simulator figure module in this process; a missing or crashing module does
    not stop the others. Returns ``(records, problems)`` (``problems``: figure id -> reason)."""
    figs, problems = _figure_list()
    if figs is None:
        return [], problems
    records = []
    with _progress(len(figs), "figures", "figure", progress) as bar:
        for fig_id, mod_name in figs:
            recs, probs = _make_one(fig_id, mod_name, out_dir, quick, seed)
            records += recs
            problems.update(probs)
            bar.update(1, postfix=fig_id)
    return records, problems


def _start_figures_in_background(out_dir: Path, quick: bool, seed: int, workers: int):
    """Submit every figure to a process pool (fork) so the checks run meanwhile in this process.
    Returns ``(executor, futures, problems)`` or ``None`` where a pool cannot be used."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    if workers < 1 or "fork" not in mp.get_all_start_methods():
        return None
    figs, problems = _figure_list()
    if figs is None:
        return None
    ex = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("fork"), initializer=_one_thread)
    futs = [ex.submit(_make_one, fid, mod, out_dir, quick, seed) for fid, mod in figs]
    return ex, futs, problems


def _collect_figures(bg) -> tuple[list, dict]:
    from concurrent.futures import as_completed

    ex, futs, problems = bg
    records = []
    try:
        with _progress(len(futs), "figures", "figure") as bar:
            for fut in as_completed(futs):
                recs, probs = fut.result()
                records += recs
                problems.update(probs)
                bar.update(1, postfix=", ".join([r.id for r in recs] + sorted(probs)))
    finally:
        ex.shutdown()
    return records, problems


def environment() -> dict[str, str]:
    """Versions and the git commit; deterministic for a given checkout and install."""
    env = {"python": platform.python_version(), "platform": f"{platform.system()} {platform.machine()}"}
    for mod in ("torch", "sympy", "numpy", "scipy", "matplotlib"):
        try:
            env[mod] = __import__(mod).__version__
        except Exception:
            env[mod] = "not installed"
    from tiltlab import __version__

    env["tiltlab"] = __version__
    from tiltlab.paper_checks.record import git_commit

    commit = git_commit()
    if commit:
        env["git commit"] = commit
    env["threads"] = f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"
    from tiltlab.paper_checks import registry

    env["check modules"] = ", ".join(
        f"{m} (skipped: {registry.SKIPPED_MODULES[m]})" if m in registry.SKIPPED_MODULES else m
        for m in registry.CHECK_MODULES
    )
    return env


def _stage(msg: str) -> None:
    """One progress line of ``tiltlab reproduce`` on stderr (the bars show only on a terminal)."""
    print(f"[reproduce] {msg}", file=sys.stderr, flush=True)


def _cmd_reproduce(args: argparse.Namespace) -> int:
    from tiltlab.paper_checks.record import read_record, recorded_llm_rows

    t0 = time.perf_counter()
    out: Path = args.out if args.out is not None else Path("results/quick" if args.quick else "results")
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; pass a directory (default results/)")
    _check_writable_dir(out)
    try:
        old = read_record(out / "claims.json", "--out")
    except ValueError:
        old = None  # not a record: it is replaced like any other output file
    if args.quick and old and not old.get("selection", {}).get("quick", True):
        raise ValueError(
            f"--out {out} holds a full-mode run ({old.get('generated_at')}, commit {old.get('commit') or 'unknown'}); "
            "--quick would replace it with reduced figures and without the slow checks: pass another --out "
            "(the default for --quick is results/quick)"
        )
    chks = _select(None, None, None, include_slow=not args.quick)
    if args.llm:
        llm_chks = _select(None, "llm", None, include_slow=True)
        if not llm_chks:
            raise ValueError(_empty_selection(None, "llm", None, True))
        chks = chks + llm_chks
    recorded = [] if args.llm else recorded_llm_rows()[0]
    n_figs = len(_figure_list()[0] or [])
    _stage(
        f"{len(chks)} checks and {n_figs} figures ({'quick' if args.quick else 'full'} mode) -> {out}/"
        + (f"; {len(recorded)} llm checks from the shipped record (not re-run)" if recorded else "")
    )
    # everything is written into a temporary folder next to --out and moved into place at the end:
    # an interrupted run leaves the previous outputs (or nothing), never a partial set that looks complete
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))
    try:
        rc = _reproduce_into(args, tmp, out, chks, recorded, t0)
        _move_into_place(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rc


def _reproduce_into(args, tmp: Path, out: Path, chks, recorded, t0: float) -> int:
    """The body of ``tiltlab reproduce``, writing into ``tmp`` (the report names ``out``)."""
    from tiltlab.paper_checks import registry
    from tiltlab.paper_checks.record import outcomes_from_rows
    from tiltlab.paper_checks.report import ReportInput, figures_json, write_report

    mode = "quick" if args.quick else "full"
    command = "tiltlab reproduce" + (" --quick" if args.quick else "") + (" --llm" if args.llm else "")
    command += f" --seed {args.seed}" if args.seed else ""
    prov = _provenance(command, mode, not args.quick, args.seed)
    hashes = _rule_hashes(chks)
    # figures in worker processes while the checks run here (each figure is seeded on its own,
    # so the results do not depend on where it runs); --jobs 1 runs everything in this process
    bg = _start_figures_in_background(tmp / "figures", args.quick, args.seed, args.jobs - 1) if args.jobs > 1 else None
    if bg is not None:
        _one_thread()  # the checks share the cores with the figure workers
    outs = _run(chks, args.seed)
    t_checks = time.perf_counter() - t0
    _stage(f"checks done in {t_checks:.1f} s; " + ("waiting for the figures" if bg else "making the figures"))
    figs, problems = _collect_figures(bg) if bg else make_figures(tmp / "figures", args.quick, args.seed)
    _stage(f"figures done ({len(figs)}) after {time.perf_counter() - t0:.1f} s; writing the report")
    figs = sorted(figs, key=lambda f: f.id)
    t_figs = time.perf_counter() - t0 - (0.0 if bg else t_checks)
    unchecked = _unchecked(None)
    rec = _record(
        outs,
        unchecked,
        args.seed,
        {"reproduce": True, "quick": bool(args.quick), "llm": bool(args.llm)},
        time.perf_counter() - t0,
        prov=prov,
        recorded_rows=recorded,
        rule_hashes=hashes,
    )
    rec["figures"] = figures_json(figs, tmp)
    rec["figures_missing"] = dict(sorted(problems.items()))
    runtime = time.perf_counter() - t0
    now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    env = environment()
    run_line = f"generated {now}; runtime {runtime:.1f} s (checks {t_checks:.1f} s, figures {t_figs:.1f} s" + (
        f", {args.jobs} processes)" if bg else ")"
    )
    rec["environment"] = env
    rec["report"] = {"run_line": run_line, "quick": bool(args.quick), "run_id": prov["run_id"]}
    rec["runtime"] = _runtime(runtime)
    _write_json(tmp / "claims.json", rec)
    inp = ReportInput(
        claims=registry.claims(),
        outcomes=[*outs, *outcomes_from_rows(recorded)],
        figures=figs,
        missing_figures=problems,
        env=env,
        seed=args.seed,
        quick=bool(args.quick),
        out_dir=tmp,
        run_line=run_line,
        run_id=prov["run_id"],
    )
    md, ht = write_report(inp)
    print(f"{_counts_line(rec)}; {len(figs)} figures; {runtime:.1f} s")
    print(f"outputs in {out}/: claims.json, {Path(md).name}, {Path(ht).name}, figures/")
    if recorded:
        r0 = recorded[0]
        print(
            f"{len(recorded)} llm checks recorded, not re-run (the shipped llm-layer record: commit {r0.get('commit')}, "
            f"{r0.get('run_at')}); `tiltlab reproduce --llm` runs them"
        )
    _print_failures(outs, args.seed)
    if problems:
        print(f"\n{len(problems)} figure(s) missing or failed:")
        for k, v in sorted(problems.items()):
            print(f"  {k}: {v}")
    return 1 if (problems or rec["summary"]["failures"]) else 0


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


#: What ``tiltlab reproduce`` writes into ``--out``, moved into place in this order (the record last).
_OUTPUTS = ("figures", "REPORT.md", "report.html", "claims.json")


def _move_into_place(tmp: Path, out: Path) -> None:
    """Move the finished outputs from ``tmp`` into ``out``: a folder replaces the old folder (the old
    one is renamed away first, then deleted), a file replaces the old file; the record goes last."""
    out.mkdir(parents=True, exist_ok=True)
    for name in _OUTPUTS:
        src, dst = tmp / name, out / name
        if not src.exists():
            continue
        if src.is_dir():
            trash = None
            if dst.exists():
                trash = Path(tempfile.mkdtemp(dir=out, prefix=f".{name}.old-"))
                os.replace(dst, trash / name)
            os.replace(src, dst)
            if trash is not None:
                shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(src, dst)


# --------------------------------------------------------------------------- tiltlab report


def _with_recorded_llm(rec: dict[str, Any]) -> dict[str, Any]:
    """``rec`` plus the shipped llm record's rows (as ``recorded``) when it has no llm rows."""
    from tiltlab.paper_checks.record import recorded_llm_rows

    if any(r.get("layer") == "llm" for r in rec.get("checks", [])):
        return rec
    rows, _ = recorded_llm_rows()
    return {**rec, "checks": [*rec.get("checks", []), *rows]} if rows else rec


def _rejudge(path: Path) -> int:
    """``tiltlab report --rejudge FILE``: a table of recorded against re-derived verdicts; 1 on a difference."""
    from tiltlab.paper_checks import record as R

    rec = R.read_record(path, "--rejudge")
    if rec is None:
        raise FileNotFoundError(f"--rejudge {path}: no such file")
    rows = R.rejudge_rows(rec.get("checks", []))
    w = max([len(str(r["claim"])) for r in rows] + [5])
    print(f"{'claim':<{w}}  {'layer':<6} {'recorded':<13} {'re-derived':<13} {'other threshold':<16} status")
    for r in rows:
        print(
            f"{r['claim']:<{w}}  {r['layer']:<6} {r['recorded']:<13} {r['rejudged'] or '-':<13} "
            f"{r['other_threshold'] or '-':<16} {r['status']}"
        )
    n = {k: sum(r["status"] == k for r in rows) for k in ("same", "differs", "no raw values")}
    print(
        f"\n{len(rows)} rows: {n['same']} re-derived as recorded, {n['differs']} differ, "
        f"{n['no raw values']} without raw values (deterministic checks or rows recorded before raw values were kept)"
    )
    return 1 if n["differs"] else 0


def _cmd_report(args: argparse.Namespace) -> int:
    from tiltlab.paper_checks import record as R
    from tiltlab.paper_checks import report as P

    if args.ship_llm is not None:
        dest = args.out or R.LLM_RECORD
        shipped = R.ship_llm_record(args.ship_llm, dest, machine_desc=args.machine, run_seconds=args.run_seconds)
        commits = sorted({str(r["commit"]) for r in shipped["checks"]})
        print(
            f"shipped llm record written to {dest}: {len(shipped['checks'])} checks, run at commit(s) "
            f"{', '.join(commits)}, each strictly pre-registered; registry hash {shipped['registry_hash']}"
        )
        return 0
    if args.set_llm_expectations:
        dest = args.out or R.LLM_RECORD
        rec = R.set_llm_expectations(dest)
        bad = [R.row_key(r) for r in rec["checks"] if not r["ok"]]
        print(
            f"{dest}: expectations of {len(rec['checks'])} rows set from the registry (registry hash "
            f"{rec['registry_hash']}); {len(bad)} row(s) do not meet them" + (f": {', '.join(bad)}" if bad else "")
        )
        return 1 if bad else 0
    if args.preregister is not None:
        return _preregister(args.preregister)
    if args.rejudge is not None:
        return _rejudge(args.rejudge)
    rec = R.read_record(args.record, "--record")
    if rec is None:
        raise FileNotFoundError(
            f"--record {args.record}: no such file; run `tiltlab reproduce` (or `tiltlab check`) first"
        )
    if args.pin:
        from tiltlab.paper_checks import registry

        dest = args.out or registry.PINS_FILE
        n_checks, n_nums = R.write_pins(rec, dest, rtol=args.pin_rtol, llm_rec=R.load_llm_record())
        print(f"pinned {n_nums} numbers of {n_checks} checks (rtol {args.pin_rtol:g}) in {dest}")
        return 0
    if args.costs:
        dest = args.out or COSTS_FILE
        n = R.write_costs(rec, dest)
        print(f"run times of {n} checks written to {dest}")
        return 0
    rec = _with_recorded_llm(rec)
    if args.format:
        from tiltlab.paper_checks import registry

        registry.discover()
        text = P.render_table(
            P.claim_table(registry.claims(), R.outcomes_from_rows(rec["checks"]), rec.get("commit")), args.format
        )
        if args.out:
            _check_writable_file(args.out)
            write_text(args.out, text)
            print(f"per-claim table ({args.format}) written to {args.out}")
        else:
            sys.stdout.write(text)
        return 0
    if args.docs:
        return _write_docs(args, rec)
    if "figures" not in rec:
        raise ValueError(
            f"--record {args.record} is a `tiltlab check` record (no figures); the full report needs a "
            "`tiltlab reproduce` record, or pass --format / --docs"
        )
    md, ht = P.write_report(P.report_input_from_record(rec, args.record.parent))
    print(f"report rewritten from {args.record}: {md}, {ht}")
    return 0


def _preregister(check: str) -> int:
    """``tiltlab report --preregister [CHECK]``: the registered rule files' hashes of CHECK (or every
    ``[[rule]]``) rewritten in paper_checks/preregistration.toml, atomically, other lines kept."""
    from tiltlab.paper_checks import prereg, registry

    path = registry.PREREG_FILE
    text, changed = prereg.preregister_text(
        path.read_text(encoding="utf-8"), None if check == _ALL_LLM else [check], path.parents[1]
    )
    write_text(path, text)
    by_check = Counter(c for c, _ in changed)
    what = ", ".join(f"{c}: {n} file(s) changed" for c, n in sorted(by_check.items())) or "no hash changed"
    print(
        f"rule-file hashes written to {path} ({what}); commit it, then run: the registration commit "
        "must be a strict ancestor of the run's commit"
    )
    return 0


def _write_docs(args: argparse.Namespace, rec: dict[str, Any]) -> int:
    """``tiltlab report --docs``: README's results and timings sections, docs/llm-checks.md's last run,
    benchmarks/README.md's GPU section (in a checkout)."""
    from tiltlab.paper_checks import gpu_record
    from tiltlab.paper_checks import record as R
    from tiltlab.paper_checks import report as P

    root = Path(__file__).resolve().parents[1]
    readme = args.readme or root / "README.md"
    llm_rec = R.load_llm_record()
    timing_recs = [rec]
    for path in args.timings:
        other = R.read_record(path, "--timings")
        if other is None:
            raise FileNotFoundError(f"--timings {path}: no such file")
        timing_recs.append(other)
    text = readme.read_text(encoding="utf-8")
    text = P.replace_section(text, "results", P.results_section(rec, llm_rec), str(readme))
    text = P.replace_section(text, "timings", P.timings_section(timing_recs, llm_rec), str(readme))
    written = [readme]
    llm_doc = root / "docs" / "llm-checks.md"
    new_llm = None
    if llm_rec is not None and args.readme is None and llm_doc.is_file():
        new_llm = P.replace_section(
            llm_doc.read_text(encoding="utf-8"), "llm-run", P.llm_run_section(llm_rec), str(llm_doc)
        )
        new_llm = P.replace_section(new_llm, "llm-items", P.item_rules_section("llm"), str(llm_doc))
        new_llm = P.replace_section(new_llm, "llm-posthoc", P.posthoc_section(llm_rec), str(llm_doc))
    gpu = gpu_record.rendered_readme(root) if args.readme is None else None
    write_text(readme, text)  # after every section rendered: nothing half-written on an error
    if new_llm is not None:
        write_text(llm_doc, new_llm)
        written.append(llm_doc)
    if gpu is not None:
        write_text(*gpu)
        written.append(gpu[0])
    print("generated sections rewritten in " + ", ".join(str(w) for w in written))
    return 0
