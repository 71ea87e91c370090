"""LAD's text against its own tables, and the printing errors of its tables (``paper_internal``)."""

from __future__ import annotations

from decimal import Decimal

from tiltlab.claims.registry import (
    CheckResult,
    Verdict,
    get_claim,
)

from .tables import (
    _from_statements,
    _internal,
    _table,
    average_problems,
    halfwidth,
    numeric_tables,
)

# --------------------------------------------------------------------------- typos


def _typo_average(typo_id: str) -> CheckResult:
    src = get_claim(typo_id).paper_numbers["source_claim"]
    n_rows, worst, problems = average_problems(get_claim(src).paper_numbers)
    nums = {"avg_rows_checked": n_rows, "avg_max_abs_dev": round(worst, 4), "n_inconsistent": len(problems)}
    if problems:
        return CheckResult(
            Verdict.REFUTED,
            f"printing error in {src}'s table ({len(problems)} of {n_rows} averages): " + "; ".join(problems),
            nums,
        )
    return CheckResult(Verdict.VERIFIED, f"all {n_rows} printed averages of {src} match their cells", nums)


@_internal("lad.typo.table3_average", Verdict.REFUTED)
def lad_typo_table3(seed: int) -> CheckResult:
    return _typo_average("lad.typo.table3_average")


@_internal("lad.typo.table7_average", Verdict.REFUTED)
def lad_typo_table7(seed: int) -> CheckResult:
    return _typo_average("lad.typo.table7_average")


@_internal("lad.text.math_margins", Verdict.VERIFIED)
def lad_math_margins(seed: int) -> CheckResult:
    st = get_claim("lad.text.math_margins").paper_numbers["stated"]
    cols, t1 = _table("lad.table1.math_qwen2.5_7b")
    _, t7 = _table("lad.table7.pass32_qwen2.5_7b")

    def margin(t, c):
        i = cols.index(c)
        others = max(v[i] for k, v in t.items() if k != "LAD")
        return t["LAD"][i] - others

    ia = cols.index("Average")
    m_aime, m_amc = margin(t1, "AIME2024"), margin(t1, "AMC")
    second7 = sorted((k for k in t7 if k != "LAD"), key=lambda k: -t7[k][ia])[0]
    parts = [
        (
            f"LAD best Avg@32 {t1['LAD'][ia]:g} (= stated {st['avg32']:g})",
            margin(t1, "Average") > 0 and t1["LAD"][ia] == st["avg32"],
        ),
        (
            f"AIME24 margin {m_aime:.2f} vs stated {st['aime24_margin']:g}",
            abs(m_aime - st["aime24_margin"]) <= 0.01 + 1e-9,
        ),
        (
            f"AMC margin {m_amc:.2f} vs stated {st['amc_margin']:g}",
            abs(m_amc - st["amc_margin"]) <= 0.01 + halfwidth(st["amc_margin"]),
        ),
        (
            f"Pass@32 LAD {t7['LAD'][ia]:g} best, second {second7} by {t7['LAD'][ia] - t7[second7][ia]:.2f} (stated FlowRL, {st['pass32_margin_vs_flowrl']:g})",
            second7 == "FlowRL"
            and abs(t7["LAD"][ia] - t7["FlowRL"][ia] - st["pass32_margin_vs_flowrl"]) <= 0.01 + 1e-9,
        ),
    ]
    return _from_statements(parts, {"aime24_margin": round(m_aime, 3), "amc_margin": round(m_amc, 3)})


@_internal("lad.text.code_best", Verdict.VERIFIED)
def lad_code_best(seed: int) -> CheckResult:
    cols, t = _table("lad.table2.code_r1_distill_7b")
    parts, ties = [], []
    for c in (
        "LiveCodeBench_avg16",
        "LiveCodeBench_pass16",
        "HumanEvalPlus_avg16",
        "HumanEvalPlus_pass16",
        "CodeForces_percentile",
    ):
        i = cols.index(c)
        best_other = max(v[i] for k, v in t.items() if k != "LAD")
        if t["LAD"][i] == best_other:
            ties.append(c)
        parts.append((f"{c} LAD {t['LAD'][i]:g} vs best other {best_other:g}", t["LAD"][i] >= best_other))
    res = _from_statements(parts, {"n_ties": len(ties)})
    if ties:
        res.summary += f" (ties: {', '.join(ties)})"
    return res


@_internal("lad.text.diversity_best", Verdict.VERIFIED)
def lad_diversity_best(seed: int) -> CheckResult:
    cols, t = _table("lad.table4.diversity")
    parts = []
    for i, c in enumerate(cols):
        best_other = max(v[i] for k, v in t.items() if k != "LAD")
        parts.append((f"{c} LAD {t['LAD'][i]:g} > {best_other:g}", t["LAD"][i] > best_other))
    return _from_statements(parts, {})


@_internal("lad.text.backbones_beat_flowrl", Verdict.VERIFIED)
def lad_backbones(seed: int) -> CheckResult:
    cols, t = _table("lad.table3.backbones")
    ia = cols.index("Average")
    parts, exc = [], []
    for k in t:
        if k.endswith("LAD"):
            f = k[: -len("LAD")] + "FlowRL"
            parts.append((f"{k[:-4]}: LAD {t[k][ia]:g} > FlowRL {t[f][ia]:g}", t[k][ia] > t[f][ia]))
            exc += [f"{k[:-4]} {c}" for i, c in enumerate(cols[:-1]) if t[k][i] < t[f][i]]
    res = _from_statements(parts, {"per_benchmark_exceptions": len(exc)})
    if exc:
        res.summary += f" (per-benchmark exceptions: {'; '.join(exc)})"
    return res


@_internal("lad.text.eta_grid", Verdict.REFUTED)
def lad_eta_grid(seed: int) -> CheckResult:
    pn = get_claim("lad.table6.eta_sweep").paper_numbers
    text = sorted(float(x) for x in pn["text_eta_grid"])
    table = sorted(
        1.0 / float(Decimal(a) if "/" not in a else Decimal(a.split("/")[0]) / Decimal(a.split("/")[1]))
        for a in pn["inv_eta"]
    )
    inter = sorted(set(text) & set(table))
    ok = text == table
    return CheckResult(
        Verdict.VERIFIED if ok else Verdict.REFUTED,
        f"paper-internal: text eta grid {text} vs Table 6 eta = 1/(1/eta) grid {[round(x, 4) for x in table]}; common {inter}",
        {"n_text": len(text), "n_table": len(table), "n_common": len(inter)},
    )


@_internal("lad.table6.eta_sweep", Verdict.VERIFIED)
def lad_eta_vs_grpo(seed: int) -> CheckResult:
    parts, nums = [], {}
    for key in ("avg16", "pass16"):
        cols, t = _table("lad.table6.eta_sweep", key)
        ia = cols.index("Average")
        g = t["GRPO"][ia]
        wins = [k for k in t if k != "GRPO" and t[k][ia] > g]
        n = len(t) - 1
        nums[f"{key}_wins"], nums[f"{key}_settings"] = len(wins), n
        parts.append(
            (f"{key}: LAD > GRPO ({g:g}) at {len(wins)}/{n} eta", len(wins) >= n - 1)
        )  # 'nearly all' = all but one
    return _from_statements(parts, nums)


@_internal("lad.text.strict_better_table8", Verdict.PARTLY, holds=(True, True, True, False))
def lad_strict_better(seed: int) -> CheckResult:
    pn = get_claim("lad.table8.divergences").paper_numbers
    cols = list(pn["columns"])
    ia = cols.index("Average")
    parts, nums = [], {}
    for key in ("avg32", "pass32"):
        t = numeric_tables(pn)[key]
        s = {k: t[k][ia] for k in pn["strict"]}
        ns = {k: t[k][ia] for k in pn["non_strict"]}
        ms, mn = sum(s.values()) / len(s), sum(ns.values()) / len(ns)
        nums[f"{key}_strict_mean"], nums[f"{key}_nonstrict_mean"] = round(ms, 3), round(mn, 3)
        parts.append((f"{key}: strict mean {ms:.2f} > non-strict mean {mn:.2f}", ms > mn))
        beaten = [f"{a} {ns[a]:g} > {b} {s[b]:g}" for a in ns for b in s if ns[a] > s[b]]
        parts.append(
            (
                f"{key}: every strict above every non-strict" + (f" (but {', '.join(beaten)})" if beaten else ""),
                not beaten,
            )
        )
    return _from_statements(parts, nums)
