"""FlowRL's numbers as the other papers print them (``paper_internal``, cross-paper)."""

from __future__ import annotations

from tiltlab.claims.registry import (
    CheckResult,
    Verdict,
)

from .tables import (
    _cell,
    _diff_tol,
    _from_statements,
    _internal,
)

# --------------------------------------------------------------------------- FlowRL (cross-paper)


@_internal("flowrl.disa_matches_flowrl", Verdict.VERIFIED)
def flowrl_disa_matches(seed: int) -> CheckResult:
    parts = []
    for bb in ("qwen2.5_7b", "qwen3_4b"):
        d, f = _cell(f"disa.table1.math_{bb}", "DISA", "Avg"), _cell(f"disa.table1.math_{bb}", "FlowRL", "Avg")
        parts.append((f"{bb}: DISA {d:g} vs FlowRL {f:g}", d >= f - _diff_tol(d, f)))
    return _from_statements(parts, {})


@_internal("flowrl.vs_grpo_across_papers", Verdict.PARTLY, holds=(True, True, False, False, False))
def flowrl_vs_grpo(seed: int) -> CheckResult:
    comps = [
        ("DISA Qwen2.5-7B", "disa.table1.math_qwen2.5_7b", "Avg"),
        ("DISA Qwen3-4B", "disa.table1.math_qwen3_4b", "Avg"),
        ("PACED Qwen2.5-Math-1.5B", "paced.table1.math_qwen2.5_math_1.5b", "Avg"),
        ("PACED Qwen2.5-Math-7B", "paced.table1.math_qwen2.5_math_7b", "Avg"),
        ("LAD Qwen2.5-7B", "lad.table1.math_qwen2.5_7b", "Average"),
    ]
    parts, nums = [], {}
    for name, cid, col in comps:
        f, g = _cell(cid, "FlowRL", col), _cell(cid, "GRPO", col)
        nums[f"{name}.flowrl_minus_grpo"] = round(f - g, 3)
        parts.append((f"{name}: FlowRL {f:g} vs GRPO {g:g}", f > g + _diff_tol(f, g)))
    return _from_statements(parts, nums)
