"""Running checks: selecting them, and running them in this process or in a pool of forked workers (longest
first, sharing the simulator's experiments within one run; the llm layer's seeds sharded)."""

from __future__ import annotations

import contextlib
import importlib
import json
import math
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from tiltlab.files import removed_after
from tiltlab.paper_checks import catalog

LAYERS = ("theory", "sim", "data", "llm")

_ALL_LLM = "*all*"


def _progress(total: int | None, desc: str, unit: str, enabled: bool = True):
    """The shared progress reporter (:mod:`tiltlab.progress`): a bar with ETA on a terminal, a line
    every ``TILTLAB_PROGRESS_INTERVAL`` seconds elsewhere; nothing when ``enabled`` is false."""
    from tiltlab.progress import progress

    return progress(total, desc, unit, **({} if enabled else {"mode": "off"}))


def _load_extra(claim_dirs: Sequence[Path] = (), modules: Sequence[str] = ()) -> None:
    """Claims and check modules of another project (``tiltlab check --claims DIR --module NAME``)."""
    import importlib

    from tiltlab.claims import registry

    catalog.discover()
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
    from tiltlab.claims import registry

    catalog.discover()
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
    from tiltlab.claims import registry

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
    at the end (also by a second Ctrl-C, :mod:`tiltlab.interrupts`); an outer value of the variable is restored."""
    old = os.environ.get(RUN_CACHE_ENV)
    with removed_after(tempfile.mkdtemp(prefix="tiltlab-run-cache-")) as path:
        tmp = str(path)
        os.environ[RUN_CACHE_ENV] = tmp
        try:
            yield tmp
        finally:
            if old is None:
                os.environ.pop(RUN_CACHE_ENV, None)
            else:
                os.environ[RUN_CACHE_ENV] = old


#: Seconds each fast check took in one ``tiltlab check --jobs 1`` run (``tiltlab report --costs``).
COSTS_FILE = Path(__file__).resolve().parents[1] / "costs.json"


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


#: Layers whose checks ``--jobs N`` runs in this process one after another, each sharding its seeds over N
#: processes: their memoized runs are shared by several checks, so one process per check would train them anew.
SEED_SHARDED_LAYERS = ("llm",)


def _run(chks, seed: int, progress: bool = True, jobs: int = 1):
    """Run the checks; with ``jobs > 1`` the llm-layer checks (:data:`SEED_SHARDED_LAYERS`) run in this
    process one after another with their seeds in ``jobs`` forked processes (``tiltlab.llm.experiments.pool.seed_jobs``),
    the others in a pool of forked processes, started longest first (:func:`longest_first`; each check
    is seeded on its own, so verdicts do not depend on where or when it runs). Outcomes keep ``chks`` order."""
    sharded = [c for c in chks if c.layer in SEED_SHARDED_LAYERS] if jobs > 1 else []
    if not sharded:
        return _run_checks(chks, seed, progress, jobs)
    keys = {c.key for c in sharded}
    done = {o.check.key: o for o in _run_checks([c for c in chks if c.key not in keys], seed, progress, jobs)}
    from tiltlab.llm.experiments import pool  # imported only when llm checks run (they imported it already)

    with pool.seed_jobs(jobs):
        done.update((o.check.key, o) for o in _run_checks(sharded, seed, progress, 1))
    return [done[c.key] for c in chks]


def _run_checks(chks, seed: int, progress: bool, jobs: int):
    """:func:`_run` with one process per check (``jobs > 1``: a pool of forked processes)."""
    import multiprocessing as mp

    from tiltlab.claims import registry

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
            try:
                for fut in as_completed(futs):
                    key, res, sec, err = fut.result()
                    done[key] = registry.Outcome(by_key[key], res, sec, err)
                    bar.update(1, postfix=key)
            except BaseException:  # no check starts after the run failed or was interrupted
                ex.shutdown(wait=False, cancel_futures=True)
                raise
        return [done[c.key] for c in chks]
    outs = []
    with _progress(len(chks), "checks", "check", progress) as bar:
        for c in chks:
            outs.append(registry.run_one(c, seed))
            bar.update(1, postfix=c.key)
    return outs
