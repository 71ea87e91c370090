"""Each claim's simulator numbers, computed once.

A module here runs one experiment (an M study, a tau sweep, ...) and returns its numbers; the
claim check (``tiltlab.sim.checks``) judges them and the figure (``tiltlab.sim.figures``) plots
them, so a claim's numbers are identical in the check output, the figure and the report.

Functions that compute a claim's numbers take the settings and the seed and are wrapped in
:func:`cached` (``functools.lru_cache`` keyed on the arguments), so a check and a figure run in one
process compute the experiment once. Each caller receives its own deep copy of the cached result.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import TypeVar

if __name__ != "tiltlab.sim.experiments":  # imported by its bare folder name
    raise ImportError(f"import this package as tiltlab.sim.experiments, not as {__name__!r}")

__all__ = ["cached"]

F = TypeVar("F", bound=Callable)


def cached(fn: F) -> F:
    """``functools.lru_cache`` on the (hashable) settings; every call returns a deep copy of the result."""
    inner = functools.lru_cache(maxsize=None)(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return copy.deepcopy(inner(*args, **kwargs))

    wrapper.cache_clear = inner.cache_clear  # type: ignore[attr-defined]
    wrapper.cache_info = inner.cache_info  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]
