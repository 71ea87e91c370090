"""Re-judging a record's rows with the registry: every row re-derived bottom up (``tiltlab report --rejudge``,
:func:`rejudge_rows`), and the one rule applied *post hoc* to a legacy llm row that kept only summary
statistics (:func:`posthoc_neutral`). The rule-level re-derivation itself is :mod:`tiltlab.claims.rejudge`."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from tiltlab.claims import registry
from tiltlab.claims.rows import row_key

__all__ = ["posthoc_neutral", "pseudo_sample", "rejudge_rows"]


def pseudo_sample(mean: float, lo: float, hi: float, n: int, level: float = 0.95) -> tuple[float, ...]:
    """``n`` values whose mean is ``mean`` and whose two-sided ``level`` Student-t interval is
    ``[lo, hi]``: the t-tests of :mod:`tiltlab.claims.stats` depend on a sample only through
    (mean, sd, n), so a record that kept those re-derives every p-value through them. (Not the
    measured values: used only for rows recorded before raw values were kept.)"""
    from tiltlab.claims import stats

    if n < 2 or not (lo <= mean <= hi):
        raise ValueError(f"a pseudo-sample needs n >= 2 and lo <= mean <= hi, got n={n}, [{lo}, {mean}, {hi}]")
    sd = (hi - lo) / 2 * math.sqrt(n) / stats.t_quantile(0.5 + level / 2, n - 1)
    base = [i - (n - 1) / 2 for i in range(n)]
    b_sd = math.sqrt(sum(x * x for x in base) / (n - 1))
    return tuple(mean + sd * x / b_sd for x in base)


def posthoc_neutral(row: Mapping[str, Any]) -> dict[str, Any] | None:
    """The one decision rule applied *post hoc* to a legacy llm row that kept only each item's mean,
    95% interval and seed count: the items the registry declares now for the row's claim (their
    kinds and margins), pseudo-samples with the recorded statistics (:func:`pseudo_sample`), the
    row's "it ran" flags. ``{"verdict", "alt_verdict", "items": {name: outcome}, "missing": [...]}``,
    or None when none of the declared judged items is in the row. Not pre-registered: context for a
    reader until the re-run, never a shipped verdict."""
    from tiltlab.claims import stats

    claim = registry.claims().get(row.get("claim", ""))
    nums = row.get("numbers") or {}
    n = nums.get("seeds")
    if claim is None or not isinstance(n, int):
        return None
    items, missing = [], []
    for spec in claim.items_for(row.get("layer", "llm")).values():
        if not all(k in nums for k in (spec.name, f"{spec.name}_lo", f"{spec.name}_hi")):
            missing.append(spec.name)
            continue
        vals = pseudo_sample(float(nums[spec.name]), float(nums[f"{spec.name}_lo"]), float(nums[f"{spec.name}_hi"]), n)
        items.append(stats.Item(spec.name, vals, spec.kind, spec.margin))
    if not any(i.kind != stats.CONTEXT for i in items):
        return None
    ran = {k: bool(v) for k, v in (row.get("items") or {}).items() if k.startswith("ran_")}
    j = stats.judge(items, ran)
    return {
        "verdict": j.verdict,
        "alt_verdict": j.alt_verdict,
        "items": {k: t.outcome for k, t in j.tests.items()},
        "missing": missing,
    }


def rejudge_rows(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every row re-derived bottom up (:func:`tiltlab.claims.rejudge.rejudge_row`, ``tiltlab report
    --rejudge``) with its registered check's re-derivation of its raw values (a check whose module is not
    loaded, e.g. the llm layer without the ``[llm]`` extra, is re-derived from its item values, and says so)."""
    from tiltlab.claims import rejudge

    out = []
    for r in rows:
        chk = registry._CHECKS.get(row_key(r)) if {"claim", "layer", "check"} <= set(r) else None
        why = None if chk is not None else f"check {r.get('check')} is not loaded (is its layer's extra installed?)"
        out.append(rejudge.rejudge_row(r, None if chk is None else chk.rederive, not_loaded=why))
    return out
