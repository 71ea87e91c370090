"""``tiltlab reproduce``: the checks and the figures of one run, written into place together."""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

from tiltlab.files import staging_dir
from tiltlab.hints import hint
from tiltlab.paper_checks.cli import runner  # _select and _run through the module: tests replace them there
from tiltlab.paper_checks.cli.console import _counts_line, _empty_selection, _print_failures
from tiltlab.paper_checks.cli.records import (
    _check_writable_dir,
    _provenance,
    _record,
    _rule_hashes,
    _runtime,
    _unchecked,
    _write_json,
)
from tiltlab.paper_checks.cli.runner import _one_thread, _progress

# --------------------------------------------------------------------------- tiltlab reproduce

#: The simulator's figure package (``FIGURES``: ``(figure id, module name)`` pairs, ``make_all``), as
#: named in the problems a run reports.
_FIGURES = "tiltlab.sim.figures"


def _make_one(fig_id: str, mod_name: str, out_dir: Path, quick: bool, seed: int):
    """One figure module -> ``(records, problems)``; never raises (runs in worker processes too)."""
    try:
        from tiltlab.sim import figures as simfig

        return simfig.make_all(out_dir, quick=quick, seed=seed, only=[fig_id]), {}
    except ModuleNotFoundError as exc:
        if exc.name == f"{_FIGURES}.{mod_name}":
            return [], {fig_id: f"module {_FIGURES}.{mod_name} is missing"}
        return [], {fig_id: f"crashed: ModuleNotFoundError: {exc}"}
    except Exception as exc:
        tb = traceback.format_exc().strip().splitlines()
        return [], {fig_id: f"crashed: {type(exc).__name__}: {exc} ({tb[-3].strip() if len(tb) >= 3 else ''})"}


def _figure_list():
    try:
        from tiltlab.sim import figures as simfig
    except Exception as exc:  # the sim layer is absent or broken: report, do not hide
        return None, {_FIGURES: f"could not import {_FIGURES}: {type(exc).__name__}: {exc}"}
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
        ex.shutdown(cancel_futures=True)  # waits for none but the running figures after an error
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
    from tiltlab.claims.provenance import git_commit

    commit = git_commit()
    if commit:
        env["git commit"] = commit
    env["threads"] = f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"
    from tiltlab.paper_checks import catalog

    env["check modules"] = ", ".join(
        f"{m} (skipped: {catalog.SKIPPED_MODULES[m]})" if m in catalog.SKIPPED_MODULES else m
        for m in catalog.check_modules()
    )
    return env


def _stage(msg: str) -> None:
    """One progress line of ``tiltlab reproduce`` on stderr (the bars show only on a terminal)."""
    print(f"[reproduce] {msg}", file=sys.stderr, flush=True)


def _cmd_reproduce(args: argparse.Namespace) -> int:
    from tiltlab.claims.llm_record import recorded_llm_rows
    from tiltlab.claims.rows import read_record

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
            + hint(
                "quick_over_full", what="it with reduced figures and without the slow checks", default="results/quick"
            )
        )
    chks = runner._select(None, None, None, include_slow=not args.quick)
    if args.llm:
        llm_chks = runner._select(None, "llm", None, include_slow=True)
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
    # an interrupted run leaves the previous outputs (or nothing), never a partial set that looks complete;
    # the temporary folders of killed runs are removed first
    with staging_dir(out) as tmp:
        rc = _reproduce_into(args, tmp, out, chks, recorded, t0)
        _move_into_place(tmp, out)
    return rc


def _reproduce_into(args, tmp: Path, out: Path, chks, recorded, t0: float) -> int:
    """The body of ``tiltlab reproduce``, writing into ``tmp`` (the report names ``out``)."""
    from tiltlab.claims import registry
    from tiltlab.claims.rows import outcomes_from_rows
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
    try:
        outs = runner._run(chks, args.seed)
    except BaseException:
        if bg is not None:  # no figure starts after the run failed or was interrupted
            bg[0].shutdown(wait=False, cancel_futures=True)
        raise
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
            f"{r0.get('run_at')}); " + hint("llm_rows_reproduce")
        )
    _print_failures(outs, args.seed)
    if problems:
        print(f"\n{len(problems)} figure(s) missing or failed:")
        for k, v in sorted(problems.items()):
            print(f"  {k}: {v}")
    return 1 if (problems or rec["summary"]["failures"]) else 0


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
