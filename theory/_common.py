"""Small helpers shared by the theory modules (sympy decision procedures, results)."""

from __future__ import annotations

import random
from collections.abc import Iterable

import sympy as sp

from tiltlab.claims.registry import CheckResult, Verdict

__all__ = [
    "CheckResult",
    "Verdict",
    "all_zero",
    "is_zero",
    "positive_symbols",
    "result",
    "simplex",
]


def is_zero(expr: sp.Expr) -> bool:
    """Decide ``expr == 0`` symbolically, cheapest method first.

    Staged: literal zero -> ``expand_log(force)`` (if logs) -> ``expand`` -> a numeric
    witness search (a clearly nonzero value at a sample point proves "not zero" and avoids a
    slow ``simplify`` on a nonzero expression) -> ``cancel(together(.))`` -> ``simplify``. Symbols should carry the assumptions (``positive=True``) that make the
    identity true; ``force=True`` in ``expand_log`` only splits logs of products/powers,
    which is valid for the positive quantities used in this package.
    """
    expr = sp.sympify(expr)
    if expr == 0:
        return True
    if expr.has(sp.log):  # split logs BEFORE expanding (expand would distribute inside log arguments)
        expr = sp.expand_log(expr, force=True)
    e = sp.expand(expr)
    if e == 0:
        return True
    if _numerically_nonzero(e):  # a witness point proves "not identically zero"; skips slow simplify
        return False
    e = sp.cancel(sp.together(e))
    if e == 0:
        return True
    return sp.simplify(e) == 0


def _numerically_nonzero(expr: sp.Expr, n: int = 1, seed: int = 12345) -> bool:
    """True if ``expr`` evaluates (30 digits) to a clearly nonzero value at some sample point.

    Only a one-sided shortcut: a nonzero value at a point is a proof that the expression is
    not identically zero; a zero value proves nothing (the symbolic stages decide). One point by
    default: on an identically zero expression every point costs a full 30-digit evaluation that
    cannot succeed, and more points never change what :func:`is_zero` answers. Positive
    symbols get values in (0.05, 0.3) (so ``1 - sum`` of up to 3 simplex coordinates stays
    positive), other symbols values in (-1, 1). Threshold 1e-20: 10 orders above 30-digit
    rounding of O(1) terms.
    """
    if expr.has(sp.Sum) or expr.has(sp.Indexed):
        return False
    syms = sorted(expr.free_symbols, key=str)
    rng = random.Random(seed)
    for _ in range(n):
        sub = {}
        for s_ in syms:
            if s_.is_positive:
                sub[s_] = sp.Rational(rng.randint(50, 300), 1000)
            else:
                sub[s_] = sp.Rational(rng.randint(-1000, 1000), 1000)
        try:
            val = complex(expr.evalf(30, subs=sub))
        except (TypeError, ValueError, ZeroDivisionError):
            continue
        if val != val or abs(val) == float("inf"):
            continue
        if abs(val) > 1e-20:
            return True
    return False


def all_zero(exprs: Iterable[sp.Expr]) -> bool:
    return all(is_zero(e) for e in exprs)


def positive_symbols(prefix: str, k: int) -> list[sp.Symbol]:
    return list(sp.symbols(f"{prefix}1:{k + 1}", positive=True))


def simplex(prefix: str, k: int) -> tuple[list[sp.Expr], list[sp.Symbol]]:
    """A symbolic probability vector of length k: free symbols p1..p_{k-1}, p_k = 1 - sum."""
    free = positive_symbols(prefix, k - 1)
    return [*free, 1 - sum(free)], free


def result(
    ok: bool,
    summary: str,
    numbers: dict | None = None,
    fail: Verdict = Verdict.REFUTED,
    ok_verdict: Verdict = Verdict.VERIFIED,
) -> CheckResult:
    """Return ``ok_verdict`` if ``ok`` else ``fail``, with a one-line summary."""
    return CheckResult(ok_verdict if ok else fail, summary, numbers=dict(numbers or {}))
