"""Each claim's simulator numbers, computed once.

A module here runs one experiment (an M study, a tau sweep, ...) and returns its numbers; the
claim check (``tiltlab.sim.checks``) judges them and the figure (``tiltlab.sim.figures``) plots
them, so a claim's numbers are identical in the check output, the figure and the report.

Functions that compute a claim's numbers take the settings and the seed and are wrapped in
:func:`cached` (``functools.lru_cache`` keyed on the arguments), so a check and a figure run in one
process compute the experiment once. Each caller receives its own deep copy of the cached result.

Across the processes of one run: when the environment variable named by :data:`RUN_CACHE_ENV`
holds a folder (``tiltlab check --jobs N`` creates one for the run, hands it to its forked workers
and deletes it at the end), a result is also stored there (pickle, keyed on the function and its
arguments), and a second process asking for the same experiment waits for the first one and loads
its result instead of computing it again. The folder lives for one run only, so nothing computed
by an older checkout is ever read.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from tiltlab.files import write_bytes

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: the per-process cache only
    fcntl = None  # type: ignore[assignment]

if __name__ != "tiltlab.sim.experiments":  # imported by its bare folder name
    raise ImportError(f"import this package as tiltlab.sim.experiments, not as {__name__!r}")

__all__ = ["RUN_CACHE_ENV", "cached"]

F = TypeVar("F", bound=Callable)

#: Environment variable holding the folder of the cache shared by the processes of one run
#: (unset: each process caches for itself). Set by the check runner for one run; not a user setting.
RUN_CACHE_ENV = "TILTLAB_RUN_CACHE"


def _key(fn: Callable, args: tuple, kwargs: dict) -> str:
    """File name of one result: the function and its (hashable, repr-exact) arguments, hashed."""
    text = repr((fn.__module__, fn.__qualname__, args, sorted(kwargs.items())))
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def _store(path: Path, value: Any) -> None:
    """Write atomically: a reader sees the whole result or none."""
    write_bytes(path, pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


def _shared(fn: Callable, args: tuple, kwargs: dict) -> Any:
    """``fn(*args, **kwargs)`` through the run's shared folder (when there is one)."""
    root = os.environ.get(RUN_CACHE_ENV)
    if not root or fcntl is None:
        return fn(*args, **kwargs)
    path = Path(root) / f"{_key(fn, args, kwargs)}.pkl"
    # One lock per result. An experiment that needs another one takes that lock while holding its own;
    # the experiments do not call themselves (directly or through others), so locks are always taken
    # along that acyclic call graph and two processes can never wait for each other.
    with path.with_suffix(".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a process computing the same experiment finishes first
        try:
            if path.exists():
                with path.open("rb") as fh:
                    return pickle.load(fh)
            value = fn(*args, **kwargs)
            _store(path, value)
            return value
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def cached(fn: F) -> F:
    """``functools.lru_cache`` on the (hashable) settings, shared by the processes of one run when
    :data:`RUN_CACHE_ENV` names a folder; every call returns a deep copy of the result."""

    @functools.cache
    def inner(*args, **kwargs):
        return _shared(fn, args, kwargs)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return copy.deepcopy(inner(*args, **kwargs))

    wrapper.cache_clear = inner.cache_clear  # type: ignore[attr-defined]
    wrapper.cache_info = inner.cache_info  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]
