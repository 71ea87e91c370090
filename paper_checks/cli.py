"""``tiltlab check`` and ``tiltlab reproduce``.

``tiltlab check`` runs every fast check (theory, sim, data; ``--slow`` adds the slow ones; the opt-in
``llm`` layer runs only with ``--layer llm``),
prints one row per check (claim, source as "DISA §2.2 eq. (10)", layer, verdict, one line of
evidence) plus one row per declared claim that has no check yet, writes ``results/claims.json`` and exits non-zero only
when a check returns a verdict other than the one recorded as expected for it, or crashes.
Each failure is followed by the command that re-runs just that check. Arguments are checked
before any check runs: an empty selection, ``--jobs`` < 1 or an ``--out`` that cannot be written
is an error (exit 2) and leaves the record untouched. ``--list`` prints the selection only.

``tiltlab reproduce`` runs all checks (``--llm`` adds the llm layer) and all simulator figures and writes ``claims.json``,
``REPORT.md`` and a self-contained ``report.html`` (figures embedded) into ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import importlib
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tiltlab.paper_checks.registry import FIGURE_MODULE

LAYERS = ("theory", "sim", "data", "llm")

_CHECK_HELP = """Run the claim checks and compare every verdict with the one recorded as expected.

The llm-layer checks (small real models trained on CPU, all slow) run only when asked for:
`--layer llm --slow` (or `--only llm --slow`); `tiltlab reproduce --llm` adds them to the report.
A check that records expected per-item outcomes fails when an item changes, even if its verdict
does not.

Exit status: 0 when every selected check returns its expected verdict (a claim that is
refuted and stays refuted is green); 1 when a verdict changed or a check crashed; 2 on
bad arguments (an empty selection included; the record is then left untouched). Failing
checks are followed by a reproducer line. --list prints the selection without running it."""

_REPRO_HELP = """Run all checks and all simulator figures and write the report:
OUT/claims.json, OUT/figures/*.png|json, OUT/REPORT.md and OUT/report.html (self-contained)."""


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
    p.add_argument("--json", action="store_true", help="print the JSON record to stdout instead of the table")
    p.add_argument(
        "--list", action="store_true", help="print the selected checks (claim, check, layer, slow) and run none"
    )
    p.add_argument(
        "--jobs",
        type=_positive_int,
        default=min(2, os.cpu_count() or 1),
        help="run checks in this many forked processes (default: min(2, CPUs); 1 = in this process)",
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
    r.add_argument("--out", type=Path, default=Path("results"), help="output directory (default results/)")
    r.add_argument(
        "--jobs",
        type=_positive_int,
        default=min(2, os.cpu_count() or 1),
        help="processes: figures run in JOBS-1 worker processes while the checks run (default: min(2, CPUs))",
    )
    r.set_defaults(func=_cmd_reproduce)


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


def _progress(iterable: Any, desc: str, enabled: bool = True, total: int | None = None):
    """tqdm on stderr when it is a terminal (silent in CI logs and under --json pipes)."""
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is a core dependency
        return iterable
    return tqdm(
        iterable,
        desc=desc,
        unit="check" if desc == "checks" else "fig",
        file=sys.stderr,
        total=total,
        disable=None if enabled else True,
        leave=False,
        dynamic_ncols=True,
    )


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
    args_only: str | None, layer: str | None, name: str | None, include_slow: bool, include_llm: bool | None = None
):
    from tiltlab.paper_checks import registry

    registry.discover()
    registry.validate()
    chks = registry.select(args_only, layer, include_slow, include_llm)
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
#: on first use (the first optimizer step imports torch._dynamo, ~1 CPU-s; the theory checks scipy.optimize).
_PRELOAD = ("torch._dynamo", "scipy.optimize")


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


def _run(chks, seed: int, progress: bool = True, jobs: int = 1):
    """Run the checks in order; with ``jobs > 1`` in a pool of forked processes (each check is
    seeded on its own, so verdicts do not depend on where it runs). Outcomes keep ``chks`` order."""
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
        ):
            futs = [ex.submit(_run_key, c.key, seed) for c in chks]
            for fut in _progress(as_completed(futs), "checks", progress, total=len(futs)):
                key, res, sec, err = fut.result()
                done[key] = registry.Outcome(by_key[key], res, sec, err)
        return [done[c.key] for c in chks]
    outs = []
    bar = _progress(chks, "checks", progress)
    for c in bar:
        if hasattr(bar, "set_postfix_str"):
            bar.set_postfix_str(c.claim_id, refresh=False)
        outs.append(registry.run_one(c, seed))
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
    outs, unchecked, seed: int, selection: dict[str, Any], seconds: float, claim_dirs=(), modules=()
) -> dict[str, Any]:
    from tiltlab import __version__

    counts = Counter(o.verdict for o in outs)
    counts.update({"unchecked": len(unchecked)} if unchecked else {})
    from tiltlab.paper_checks import registry

    checks = []
    for o in outs:
        row = o.to_json(seed)
        row["reproducer"] = reproducer(o.check, seed, claim_dirs, modules)
        checks.append(row)
    return {
        "tiltlab": __version__,
        "skipped_modules": dict(sorted(registry.SKIPPED_MODULES.items())),
        "generated_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "seed": seed,
        "selection": selection,
        "summary": {
            "checks": len(outs),
            "failures": sum(not o.ok for o in outs),
            "verdicts": dict(sorted(counts.items())),
            "seconds": round(seconds, 3),
        },
        "claims": _claim_verdicts(outs),
        "checks": checks,
        "unchecked": unchecked,
    }


def _write_json(path: Path, rec: dict[str, Any]) -> None:
    """Write ``rec`` atomically: a temporary file in the same folder, then ``os.replace`` (a reader,
    or a run that dies while writing, sees the old record or the new one, never half of one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(rec, indent=1, sort_keys=False, default=str) + "\n"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


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
    if check.slow and "--slow" not in line.split():
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
    print(f"\n{len(bad)} check(s) changed verdict or crashed:", file=stream)
    for o in bad:
        if o.result is None:
            last = (o.error or "").strip().splitlines()[-1:] or ["?"]
            print(f"  FAIL {o.check.key}: crashed: {last[0]}", file=stream)
        elif o.result.verdict != o.check.expected:
            print(
                f"  FAIL {o.check.key}: returned {o.verdict}, expected {o.check.expected.value} — {o.result.summary}",
                file=stream,
            )
        else:
            print(f"  FAIL {o.check.key}: verdict {o.verdict} as expected, but {_items_line(o)}", file=stream)
        print(f"       reproduce: {reproducer(o.check, seed, claim_dirs, modules)}", file=stream)


def _items_line(o) -> str:
    """The per-item outcomes that changed: "items changed: a expected True got False, ..."."""
    return "items changed: " + ", ".join(
        f"{k} expected {exp} got {'missing' if got is None else got}" for k, (exp, got) in o.item_changes.items()
    )


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
    chks = _select(prefix, layer, args.check, args.slow)
    unchecked = [] if (layer or args.check) else _unchecked(prefix)
    if not chks and not unchecked:
        raise ValueError(_empty_selection(prefix, layer, args.check, args.slow))
    if args.list:
        _list(chks, unchecked)
        return 0
    _check_writable_file(args.out)  # before any check runs
    outs = _run(chks, args.seed, progress=True, jobs=args.jobs)
    seconds = time.perf_counter() - t0
    sel = {
        "only": prefix,
        "layer": layer,
        "check": args.check,
        "slow": bool(args.slow),
        "claims": [str(d) for d in args.claims],
        "module": list(args.module),
    }
    rec = _record(outs, unchecked, args.seed, sel, seconds, args.claims, args.module)
    _write_json(args.out, rec)
    rc = 1 if rec["summary"]["failures"] else 0
    try:
        _report_check(args, outs, unchecked, rec, seconds)
    except BrokenPipeError:  # e.g. `tiltlab check | head`: the record is written, keep the exit status
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return rc


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
    what = " ".join(
        f"{flag} {value}" for flag, value in (("--only", prefix), ("--layer", layer), ("--check", name)) if value
    )
    return f"no check matches {what}; `tiltlab check --list` prints every check (claim, check name, layer)"


def _list(chks, unchecked=()) -> None:
    """``tiltlab check --list``: one row per selected check (and per selected claim without a
    check), nothing run."""
    rows = [(c.claim_id, c.name, c.layer, "slow" if c.slow else "") for c in chks]
    rows += [(u["claim"], "(no check yet)", "-", "") for u in unchecked]
    head = ("claim", "check", "layer", "slow")
    w = [max(len(r[i]) for r in [*rows, head]) for i in range(3)]
    print("  ".join(h.ljust(w[i]) if i < 3 else h for i, h in enumerate(head)).rstrip())
    for r in rows:
        print("  ".join(x.ljust(w[i]) if i < 3 else x for i, x in enumerate(r)).rstrip())
    print(f"{len(rows)} check(s) selected ({sum(c.slow for c in chks)} slow); none run")


def _report_check(args, outs, unchecked, rec, seconds) -> None:
    if args.json:
        json.dump(rec, sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
        _print_failures(outs, args.seed, sys.stderr, args.claims, args.module)
    else:
        _table(outs, unchecked)
        print(f"\n{_counts_line(rec)} in {seconds:.1f} s; {rec['summary']['failures']} changed/crashed.")
        print(f"record written to {args.out}")
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
    for fig_id, mod_name in _progress(figs, "figures", progress):
        recs, probs = _make_one(fig_id, mod_name, out_dir, quick, seed)
        records += recs
        problems.update(probs)
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
    ex, futs, problems = bg
    records = []
    try:
        for fut in _progress(futs, "figures"):
            recs, probs = fut.result()
            records += recs
            problems.update(probs)
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
    root = Path(__file__).resolve().parents[1]
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "describe", "--always", "--dirty", "--abbrev=12"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if out.returncode == 0 and out.stdout.strip():
            env["git commit"] = out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
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
    from tiltlab.paper_checks import registry
    from tiltlab.paper_checks.report import ReportInput, figures_json, write_report

    t0 = time.perf_counter()
    out: Path = args.out
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; pass a directory (default results/)")
    _check_writable_dir(out)
    chks = _select(None, None, None, include_slow=not args.quick)
    if args.llm:
        llm_chks = _select(None, "llm", None, include_slow=True)
        if not llm_chks:
            raise ValueError(_empty_selection(None, "llm", None, True))
        chks = chks + llm_chks
    n_figs = len(_figure_list()[0] or [])
    _stage(f"{len(chks)} checks and {n_figs} figures ({'quick' if args.quick else 'full'} mode) -> {out}/")
    # figures in worker processes while the checks run here (each figure is seeded on its own,
    # so the results do not depend on where it runs); --jobs 1 runs everything in this process
    bg = _start_figures_in_background(out / "figures", args.quick, args.seed, args.jobs - 1) if args.jobs > 1 else None
    if bg is not None:
        _one_thread()  # the checks share the cores with the figure workers
    outs = _run(chks, args.seed)
    t_checks = time.perf_counter() - t0
    _stage(f"checks done in {t_checks:.1f} s; " + ("waiting for the figures" if bg else "making the figures"))
    figs, problems = _collect_figures(bg) if bg else make_figures(out / "figures", args.quick, args.seed)
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
    )
    rec["figures"] = figures_json(figs, out)
    rec["figures_missing"] = dict(sorted(problems.items()))
    _write_json(out / "claims.json", rec)
    runtime = time.perf_counter() - t0
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    inp = ReportInput(
        claims=registry.claims(),
        outcomes=outs,
        figures=figs,
        missing_figures=problems,
        env=environment(),
        seed=args.seed,
        quick=bool(args.quick),
        out_dir=out,
        run_line=f"generated {now}; runtime {runtime:.1f} s (checks {t_checks:.1f} s, figures {t_figs:.1f} s"
        + (f", {args.jobs} processes)" if bg else ")"),
    )
    md, ht = write_report(inp)
    print(f"{_counts_line(rec)}; {len(figs)} figures; {runtime:.1f} s")
    print(f"outputs in {out}/: claims.json, {Path(md).name}, {Path(ht).name}, figures/")
    _print_failures(outs, args.seed)
    if problems:
        print(f"\n{len(problems)} figure(s) missing or failed:")
        for k, v in sorted(problems.items()):
            print(f"  {k}: {v}")
    return 1 if (problems or rec["summary"]["failures"]) else 0
