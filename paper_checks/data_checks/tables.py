"""The paper's tables as numbers, and the helpers every ``paper_internal`` check shares: rounding
half-widths, cells, the verdict over several statements, and the registration decorator."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from tiltlab.claims.registry import (
    CheckResult,
    Verdict,
    get_claim,
)

# --------------------------------------------------------------------------- helpers


def halfwidth(x: float) -> float:
    """Rounding half-width of a printed number: ``0.5 * 10**-decimals`` (``12.3`` -> 0.05)."""
    # repr keeps the printed decimals of a float (10.0 -> "10.0": one decimal); only trailing
    # zeros beyond the first are lost (40.10 -> "40.1"), which widens the interval, never narrows it
    exp = Decimal(repr(x)).as_tuple().exponent
    decimals = max(0, -int(exp))  # type: ignore[arg-type]
    return 0.5 * 10.0 ** (-decimals)


def numeric_tables(pn: Mapping[str, Any]) -> dict[str, dict[str, list[float]]]:
    """The tables inside ``paper_numbers``: every mapping ``row -> list`` whose lists have
    ``len(columns)`` numeric entries (``rows``, ``avg16``, ``pass32`` ...; ``se`` excluded)."""
    cols = pn.get("columns")
    out: dict[str, dict[str, list[float]]] = {}
    if not cols:
        return out
    for key, val in pn.items():
        if key in ("se", "averages", "stated", "stated_gain_points") or not isinstance(val, Mapping) or not val:
            continue
        if all(isinstance(r, list) for r in val.values()):
            for name, r in val.items():
                if len(r) != len(cols) or not all(isinstance(v, (int, float)) for v in r):
                    raise ValueError(f"table {key!r} row {name!r} has {len(r)} cells, columns has {len(cols)}")
            out[key] = {str(name): [float(x) for x in row] for name, row in val.items()}
    return out


def average_problems(pn: Mapping[str, Any]) -> tuple[int, float, list[str]]:
    """Check every ``averages`` column against the mean of its components.

    Returns ``(rows_checked, largest |printed - recomputed|, problems)``; a problem is a row
    whose deviation exceeds the worst-case rounding ``h_avg + mean_i h_i``.
    """
    cols = list(pn.get("columns", []))
    avgs = pn.get("averages", {})
    n, worst, problems = 0, 0.0, []
    for avg_col, comps in avgs.items():
        if avg_col not in cols or any(c not in cols for c in comps):
            raise ValueError(f"averages {avg_col!r} -> {comps} names columns not in {cols}")
        ia, ic = cols.index(avg_col), [cols.index(c) for c in comps]
        for tname, rows in numeric_tables(pn).items():
            for rname, row in rows.items():
                printed = row[ia]
                comp = [row[i] for i in ic]
                mean = sum(comp) / len(comp)
                # worst-case rounding: the printed average's half-width plus the mean of the
                # components' half-widths (a float drops trailing zeros, which only widens this)
                tol = halfwidth(printed) + sum(halfwidth(v) for v in comp) / len(comp)
                dev = abs(printed - mean)
                worst = max(worst, dev)
                n += 1
                if dev > tol + 1e-9:
                    problems.append(f"{tname}[{rname}].{avg_col}={printed:g} but mean of cells={mean:.3f}")
    return n, worst, problems


# --------------------------------------------------------------------------- paper_internal helpers


def _table(claim_id: str, key: str = "rows") -> tuple[list[str], dict[str, list[float]]]:
    pn = get_claim(claim_id).paper_numbers
    tabs = numeric_tables(pn)
    if key not in tabs:
        raise ValueError(f"{claim_id}: paper_numbers has no table {key!r}")
    return list(pn["columns"]), tabs[key]


def _cell(claim_id: str, row: str, col: str, key: str = "rows") -> float:
    cols, rows = _table(claim_id, key)
    return rows[row][cols.index(col)]


def _from_statements(parts: Sequence[tuple[str, bool]], numbers: dict[str, Any]) -> CheckResult:
    """VERIFIED if every sub-statement holds, REFUTED if none does, else PARTLY."""
    ok = [d for d, b in parts if b]
    bad = [d for d, b in parts if not b]
    numbers = dict(numbers, n_statements=len(parts), n_hold=len(ok))
    items = {f"s{i + 1}": bool(b) for i, (_, b) in enumerate(parts)}
    if not bad:
        v = Verdict.VERIFIED
        summary = f"paper-internal: all {len(parts)} statements hold in the tables: " + "; ".join(ok)
    elif not ok:
        v = Verdict.REFUTED
        summary = f"paper-internal: none of {len(parts)} statements holds: " + "; ".join(bad)
    else:
        v = Verdict.PARTLY
        summary = f"paper-internal: {len(ok)}/{len(parts)} hold; fails: " + "; ".join(bad)
    return CheckResult(v, summary, numbers, items=items)


def _diff_tol(a: float, b: float) -> float:
    return halfwidth(a) + halfwidth(b)


def _rel_gain_interval(new: float, old: float) -> tuple[float, float]:
    """Relative gain (new/old - 1) in percent over the rounding intervals of both numbers."""
    hn, ho = halfwidth(new), halfwidth(old)
    return (100 * ((new - hn) / (old + ho) - 1), 100 * ((new + hn) / (old - ho) - 1))


_INTERNAL: dict[str, tuple[Verdict, Callable[[int], CheckResult], dict[str, bool] | None]] = {}


def _internal(
    claim_id: str, expected: Verdict, holds: Sequence[bool] | None = None
) -> Callable[[Callable[[int], CheckResult]], Callable[[int], CheckResult]]:
    """Register a paper-internal check. ``holds``: for a ``partly`` verdict over several statements,
    which statements (in order) are known to hold; a change in any of them fails the check even when
    the verdict stays ``partly`` (for ``verified`` / ``refuted`` all / none hold by definition)."""

    def deco(fn: Callable[[int], CheckResult]) -> Callable[[int], CheckResult]:
        items = None if holds is None else {f"s{i + 1}": bool(b) for i, b in enumerate(holds)}
        _INTERNAL[claim_id] = (expected, fn, items)
        return fn

    return deco
