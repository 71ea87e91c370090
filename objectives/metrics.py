"""Evaluation estimators (``docs/math.md`` §6): Mean@k, unbiased pass@k, distinct-n; and the total variation
distance between two distributions (the simulator's and the llm checks' distance to the target)."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["distinct_n", "mean_at_k", "pass_at_k", "total_variation", "tv_distance"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): ``1 - C(n - c, k) / C(n, k)`` from ``c`` correct of ``n``.

    Computed as ``1 - prod_{i = n-c+1}^{n} (1 - k / i)`` to avoid huge binomials.
    """
    if not (0 <= c <= n) or n <= 0:
        raise ValueError(f"need 0 <= c <= n and n > 0, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def mean_at_k(correct: Sequence[float | bool]) -> float:
    """Mean@k: average accuracy over the k samples of one prompt."""
    if len(correct) == 0:
        raise ValueError("mean_at_k of no samples")
    return float(sum(float(c) for c in correct)) / len(correct)


def distinct_n(texts: Iterable[str] | Iterable[Sequence[Hashable]], n: int = 2) -> float:
    """distinct-n: unique n-grams / total n-grams over all texts (whitespace tokens for strings,
    elements for sequences). 0 when there is no n-gram."""
    if n < 1:
        raise ValueError("n must be >= 1")
    total = 0
    seen: set[tuple[Hashable, ...]] = set()
    for t in texts:
        toks: list[Hashable] = list(t.split()) if isinstance(t, str) else list(t)
        for i in range(len(toks) - n + 1):
            seen.add(tuple(toks[i : i + n]))
            total += 1
    return len(seen) / total if total else 0.0


def total_variation(p: Any, q: Any) -> Any:
    """``1/2 sum |p - q|`` over the last axis of two probability arrays of one shape (torch tensors or numpy
    arrays: ``abs`` and ``.sum(-1)`` of their type)."""
    return 0.5 * abs(p - q).sum(-1)


def tv_distance(log_p: Tensor, log_q: Tensor) -> Tensor:
    """``[...]`` total variation ``1/2 sum_y |p - q|`` over the last axis, from log-probabilities (tensors)."""
    out: Tensor = total_variation(log_p.exp(), log_q.exp())
    return out
