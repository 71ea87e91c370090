"""PACED-RL's text against its own tables (``paper_internal``)."""

from __future__ import annotations

import math

from tiltlab.claims.registry import (
    CheckResult,
    Verdict,
    get_claim,
)

from .tables import (
    _cell,
    _from_statements,
    _internal,
    _rel_gain_interval,
    _table,
    halfwidth,
    numeric_tables,
)

# --------------------------------------------------------------------------- PACED


@_internal("paced.text.table1_ranking", Verdict.VERIFIED)
def paced_table1_ranking(seed: int) -> CheckResult:
    parts, nums = [], {}
    for m in ("qwen2.5_math_1.5b", "qwen2.5_math_7b"):
        cols, t = _table(f"paced.table1.math_{m}")
        ia = cols.index("Avg")
        p = t["PACED-RL"][ia]
        parts.append(
            (
                f"{m}: PACED {p:g} > GRPO {t['GRPO'][ia]:g}, FlowRL {t['FlowRL'][ia]:g}",
                p > max(t["GRPO"][ia], t["FlowRL"][ia]),
            )
        )
        best_sel = max(t[k][ia] for k in ("DS", "LILO", "MoPPS"))
        parts.append((f"{m}: PACED {p:g} >= best of DS/LILO/MoPPS {best_sel:g}", p >= best_sel))
        # per-benchmark exceptions to 'consistently outperforms GRPO and FlowRL' (reported, not judged)
        exc = [
            f"{c} vs {b}"
            for c in cols[:5]
            for b in ("GRPO", "FlowRL")
            if t["PACED-RL"][cols.index(c)] < t[b][cols.index(c)]
        ]
        nums[f"{m}.per_benchmark_exceptions"] = len(exc)
        if exc:
            nums[f"{m}.exceptions"] = ", ".join(exc)
    return _from_statements(parts, nums)


@_internal("paced.text.aime24_gains", Verdict.REFUTED)
def paced_aime24_gains(seed: int) -> CheckResult:
    pn = get_claim("paced.text.aime24_gains").paper_numbers
    stated = {"GRPO": float(pn["stated_rel_gain_vs_GRPO"]), "FlowRL": float(pn["stated_rel_gain_vs_FlowRL"])}
    col = pn["benchmark"]
    fits, nums = {}, {}
    for m in ("qwen2.5_math_1.5b", "qwen2.5_math_7b"):
        cid = f"paced.table1.math_{m}"
        p = _cell(cid, "PACED-RL", col)
        ok = True
        for b, s in stated.items():
            lo, hi = _rel_gain_interval(p, _cell(cid, b, col))
            nums[f"{m}.gain_vs_{b}_pct"] = round(100 * (p / _cell(cid, b, col) - 1), 2)
            ok &= lo - halfwidth(s) <= s <= hi + halfwidth(s)
        fits[m] = ok
    said = "qwen2.5_math_7b"
    other = "qwen2.5_math_1.5b"
    msg = (
        f"stated +{stated['GRPO']:g}%/+{stated['FlowRL']:g}% vs GRPO/FlowRL on AIME24 for 7B; Table 1 gives 7B "
        f"+{nums[said + '.gain_vs_GRPO_pct']:.1f}%/+{nums[said + '.gain_vs_FlowRL_pct']:.1f}%, 1.5B "
        f"+{nums[other + '.gain_vs_GRPO_pct']:.1f}%/+{nums[other + '.gain_vs_FlowRL_pct']:.1f}%"
    )
    if fits[said]:
        return CheckResult(Verdict.VERIFIED, "paper-internal: " + msg, nums)
    if fits[other]:
        msg += " -> the text's numbers are the 1.5B model's, attributed to 7B"
    return CheckResult(Verdict.REFUTED, "paper-internal: " + msg, nums)


@_internal("paced.text.aime25_lilo_gain", Verdict.VERIFIED)
def paced_aime25_lilo(seed: int) -> CheckResult:
    pn = get_claim("paced.text.aime25_lilo_gain").paper_numbers
    cid = "paced.table1.math_qwen2.5_math_7b"
    p, lilo = _cell(cid, "PACED-RL", "AIME25_avg32"), _cell(cid, "LILO", "AIME25_avg32")
    same = (p, lilo) == (float(pn["paced"]), float(pn["lilo"]))
    lo, hi = _rel_gain_interval(p, lilo)
    s = float(pn["stated_rel_gain"])
    ok = same and lo - halfwidth(s) <= s <= hi + halfwidth(s)
    return CheckResult(
        Verdict.VERIFIED if ok else Verdict.REFUTED,
        f"paper-internal: Table 1 {p:g} vs {lilo:g} -> +{100 * (p / lilo - 1):.2f}% (rounding range {lo:.2f}..{hi:.2f}%), stated {s:g}%",
        {"gain_pct": round(100 * (p / lilo - 1), 3), "lo": round(lo, 3), "hi": round(hi, 3), "stated": s},
    )


@_internal("paced.table2.replay", Verdict.VERIFIED)
def paced_replay(seed: int) -> CheckResult:
    cols, t = _table("paced.table2.replay")
    d = {c: round(a - b, 3) for c, a, b in zip(cols, t["PACED-RL"], t["w/o Replay"])}
    ok = all(v > 0 for v in d.values())
    return CheckResult(
        Verdict.VERIFIED if ok else Verdict.REFUTED,
        "paper-internal: replay minus no-replay = " + ", ".join(f"{c} {v:+.1f}" for c, v in d.items()),
        {f"delta_{c}": v for c, v in d.items()},
    )


@_internal("paced.table3.z_overhead", Verdict.VERIFIED)
def paced_z_overhead(seed: int) -> CheckResult:
    pn = get_claim("paced.table3.z_overhead").paper_numbers
    _cols, t = list(pn["columns"]), numeric_tables(pn)["rows"]
    orders = {k: math.log10(v[1] / v[0]) for k, v in t.items()}
    need = float(pn["min_orders_of_magnitude"])
    ok = min(orders.values()) >= need
    return CheckResult(
        Verdict.VERIFIED if ok else Verdict.REFUTED,
        "paper-internal: log10(step time / Z time) = "
        + ", ".join(f"{k} {v:.1f}" for k, v in orders.items())
        + f" (need >= {need:g})",
        {f"orders_{k}": round(v, 3) for k, v in orders.items()},
    )
