"""The seeds of an llm check and the pool that runs them: the seed list (:func:`seeds_for`), the torch thread
count every training loop runs at (:func:`fixed_threads`), and :func:`map_seeds`, which runs one function per
seed in this process or in a pool of forked processes (:func:`set_jobs` / :func:`seed_jobs` set how many,
:func:`get_jobs` reads it), with :func:`gather` to combine the per-seed results."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import multiprocessing as mp
import pickle
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait

import torch
from tqdm.auto import tqdm

__all__ = [
    "CHECK_THREADS",
    "N_SEEDS",
    "fixed_threads",
    "gather",
    "get_jobs",
    "map_seeds",
    "seed_jobs",
    "seeds_for",
    "set_jobs",
]

N_SEEDS = 20
"""Model seeds per check (the claim statements' rules name the same count)."""

#: Torch threads used by every training loop of the llm checks: a float reduction's order depends on
#: the thread count, so the same seed gives the same numbers only at a fixed count.
CHECK_THREADS = 1


def fixed_threads(fn):
    """Run ``fn`` with ``torch.set_num_threads(CHECK_THREADS)``, restoring the caller's count."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        before = torch.get_num_threads()
        torch.set_num_threads(CHECK_THREADS)
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(before)

    return wrapper


def seeds_for(seed: int, n: int, desc: str | None = None):
    """The ``n`` model seeds a check run at ``--seed seed`` uses (with a progress bar when ``desc``)."""
    seeds = [seed * 100 + i for i in range(n)]
    if desc is None:
        return seeds

    return tqdm(seeds, desc=f"llm check {desc}", unit="seed", leave=False)


# ---------------------------------------------------------------- seed-sharded runs
_JOBS = 1
"""Processes :func:`map_seeds` runs the seeds of one check in (set by :func:`set_jobs`; 1 = in this process)."""
_SEED_FN: Callable | None = None
"""The per-seed function of the running :func:`map_seeds`, inherited by its forked workers (never pickled)."""


def _check_jobs(jobs: int) -> int:
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be an integer >= 1 (1 = in this process), got {jobs!r}")
    return jobs


def set_jobs(jobs: int) -> int:
    """Run the seeds of every later :func:`map_seeds` in ``jobs`` forked processes; returns the previous count."""
    global _JOBS
    before, _JOBS = _JOBS, _check_jobs(jobs)
    return before


def get_jobs() -> int:
    """The process count later :func:`map_seeds` calls run their seeds in (:func:`set_jobs`; 1 = in this process)."""
    return _JOBS


@contextlib.contextmanager
def seed_jobs(jobs: int) -> Iterator[None]:
    """:func:`set_jobs` ``(jobs)`` for the ``with`` block, the previous count restored after it."""
    before = set_jobs(jobs)
    try:
        yield
    finally:
        set_jobs(before)


def _worker_init() -> None:
    """A seed worker: one torch thread, and its own seeds run in it (no pool inside a pool)."""
    global _JOBS
    torch.set_num_threads(1)
    _JOBS = 1


def _run_seed(s: int):
    """Worker side of :func:`map_seeds`: ``fn(s)``, its error re-raised with the seed named (:func:`_seed_error`)."""
    assert _SEED_FN is not None  # set before the pool forked its workers
    try:
        return _SEED_FN(s)
    except Exception as exc:
        raise _seed_error(exc, s) from exc


def _seed_error(exc: BaseException, s: int) -> BaseException:
    """``exc`` of seed ``s`` as the same exception type with ``"seed <s>: "`` before its message, or a
    ``RuntimeError`` naming the type where that one cannot be built from one message or sent back
    from the worker (pickled)."""

    msg = f"seed {s}: {exc}"
    try:
        out = type(exc)(msg)
        if str(out) == msg and str(pickle.loads(pickle.dumps(out))) == msg:
            return out
    except Exception:
        pass
    return RuntimeError(f"seed {s}: {type(exc).__name__}: {exc}")


def map_seeds(fn: Callable[[int], object], seeds: Sequence[int], desc: str | None = None, jobs: int | None = None):
    """``[fn(s) for s in seeds]``, in seed order, with a progress bar per finished seed when ``desc``.

    ``jobs`` (default: the count of :func:`set_jobs`) > 1 runs the seeds in a pool of that many forked
    processes, each with one torch thread; ``fn`` reaches them through the fork (it may be a closure),
    its results through pickling. ``fn(s)`` must depend on ``s`` only (its own generators seeded by
    ``s``), so a seed's result does not depend on the process that runs it. An error of a worker is
    raised here with its seed named; ``jobs = 1`` runs ``fn`` in this process, errors unchanged."""
    global _SEED_FN
    jobs = _JOBS if jobs is None else _check_jobs(jobs)
    seeds = list(seeds)
    bar = None
    if desc is not None:
        bar = tqdm(total=len(seeds), desc=f"llm check {desc}", unit="seed", leave=False)
    try:
        if jobs == 1 or not seeds:
            out = []
            for s in seeds:
                out.append(fn(s))
                if bar is not None:
                    bar.update(1)
            return out

        before, _SEED_FN = _SEED_FN, fn
        ex = ProcessPoolExecutor(
            max_workers=min(jobs, len(seeds)), mp_context=mp.get_context("fork"), initializer=_worker_init
        )
        try:
            futs = {ex.submit(_run_seed, s): i for i, s in enumerate(seeds)}
            results: list = [None] * len(seeds)
            todo = set(futs)
            while todo:
                done, todo = wait(todo, return_when=FIRST_EXCEPTION)
                failed = [futs[f] for f in done if f.exception() is not None]
                if failed:
                    # as jobs = 1 would: the first failing seed in seed order, whichever worker failed first
                    earlier = [f for f in futs if futs[f] < min(failed)]
                    wait(earlier)
                    first = min(futs[f] for f in (*done, *earlier) if f.exception() is not None)
                    raise next(f for f in futs if futs[f] == first).exception()  # its seed named by _run_seed
                for fut in sorted(done, key=futs.__getitem__):
                    results[futs[fut]] = fut.result()
                    if bar is not None:
                        bar.update(1)
            return results
        finally:
            ex.shutdown(wait=True, cancel_futures=True)
            _SEED_FN = before
    finally:
        if bar is not None:
            bar.close()


def gather(parts: Sequence):
    """One run's result from its per-seed results (:func:`map_seeds`), each shaped as the run's result with
    that seed's values: every list is the concatenation of the seeds' lists in seed order (a dict key by
    key, a tuple or a dataclass field by field), so it equals the lists a loop over the seeds appends to."""
    if not parts:
        raise ValueError("gather needs the results of at least one seed, got none")
    first = parts[0]
    if isinstance(first, list):
        return [x for p in parts for x in p]
    if isinstance(first, dict):
        if any(list(p) != list(first) for p in parts):
            raise ValueError(f"seeds returned different keys: {[list(p) for p in parts]}")
        return {k: gather([p[k] for p in parts]) for k in first}
    if isinstance(first, tuple):
        return tuple(gather([p[i] for p in parts]) for i in range(len(first)))
    if dataclasses.is_dataclass(first) and not isinstance(first, type):
        return type(first)(**{f.name: gather([getattr(p, f.name) for p in parts]) for f in dataclasses.fields(first)})
    raise TypeError(f"gather combines lists, dicts, tuples and dataclasses of lists, got {type(first).__name__}")
