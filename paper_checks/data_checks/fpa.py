"""FPA's text against its own tables (``paper_internal``)."""

from __future__ import annotations

import math

from tiltlab.claims.registry import (
    CheckResult,
    Verdict,
    get_claim,
)

from .tables import (
    _diff_tol,
    _from_statements,
    _internal,
    _table,
    halfwidth,
)

# --------------------------------------------------------------------------- FPA

_FPA_MODELS = ("qwen3_4b", "qwen2.5_math_7b", "llama3.2_3b")


def _fpa_gains(model: str) -> CheckResult:
    pn = get_claim(f"fpa.text.gains_{model}").paper_numbers
    cid = f"fpa.table1.math_{model}"
    cols, t = _table(cid)
    actual = {c: round(t["FPA"][i] - t["Off-RL"][i], 3) for i, c in enumerate(cols)}
    parts, nums = [], {}
    for col, s in pn["stated_gain_points"].items():
        a = actual[col]
        ok = abs(a - s) <= 0.1 + halfwidth(s) + 1e-9  # difference of two 1-decimal cells, plus the stated rounding
        where = [c for c, v in actual.items() if abs(v - s) <= 0.1 + 1e-9 and c != col]
        desc = f"{col}: stated +{s:g}, table +{a:.1f}" + (
            f" (+{s:g} is the {'/'.join(where)} gain)" if not ok and where else ""
        )
        parts.append((desc, ok))
        nums[f"stated_{col}"], nums[f"table_{col}"] = s, a
    return _from_statements(parts, nums)


@_internal("fpa.text.gains_qwen3_4b", Verdict.PARTLY, holds=(True, False, False))
def fpa_gains_qwen3(seed: int) -> CheckResult:
    return _fpa_gains("qwen3_4b")


@_internal("fpa.text.gains_qwen2.5_math_7b", Verdict.VERIFIED)
def fpa_gains_qwen25(seed: int) -> CheckResult:
    return _fpa_gains("qwen2.5_math_7b")


@_internal("fpa.text.gains_llama3.2_3b", Verdict.VERIFIED)
def fpa_gains_llama(seed: int) -> CheckResult:
    return _fpa_gains("llama3.2_3b")


def _lambda_avgs(model: str) -> tuple[dict[str, float], dict[str, float]]:
    cid = f"fpa.table6.lambda_{model}"
    pn = get_claim(cid).paper_numbers
    cols, rows = _table(cid)
    se = pn["se"]
    i = cols.index("Avg")
    return {k: v[i] for k, v in rows.items()}, {k: float(se[k][i]) for k in rows}


@_internal("fpa.text.lambda_never_below_offrl", Verdict.REFUTED)
def fpa_lambda_never_below(seed: int) -> CheckResult:
    bad, nums, n = [], {}, 0
    for m in _FPA_MODELS:
        avg, se = _lambda_avgs(m)
        for lam in ("5", "10", "20"):
            if lam not in avg:
                continue
            n += 1
            d = avg[lam] - avg["0"]
            z = d / math.hypot(se[lam], se["0"])
            nums[f"{m}.lam{lam}_minus_lam0"] = round(d, 3)
            nums[f"{m}.lam{lam}_z"] = round(z, 2)
            if d < 0:
                bad.append(f"{m} lambda={lam}: {avg[lam]:g} < {avg['0']:g} (z={z:.1f})")
    nums["n_large_lambda"] = n
    nums["n_below"] = len(bad)
    if not bad:
        return CheckResult(Verdict.VERIFIED, f"paper-internal: all {n} large-lambda averages >= lambda=0", nums)
    return CheckResult(
        Verdict.REFUTED,
        f"paper-internal: {len(bad)}/{n} large-lambda averages fall below Off-RL: " + "; ".join(bad),
        nums,
    )


@_internal("fpa.text.lambda_1_2_best", Verdict.VERIFIED)
def fpa_lambda_best(seed: int) -> CheckResult:
    parts, nums = [], {}
    for m in _FPA_MODELS:
        avg, _ = _lambda_avgs(m)
        best = max(avg.values())
        arg = sorted(k for k, v in avg.items() if v == best)
        nums[f"{m}.best_avg"] = best
        parts.append((f"{m}: best Avg {best:g} at lambda={'/'.join(arg)}", all(a in ("1", "2") for a in arg)))
    return _from_statements(parts, nums)


@_internal("fpa.text.table6_matches_table1", Verdict.PARTLY, holds=(True, True, True, True, False, True))
def fpa_table6_vs_table1(seed: int) -> CheckResult:
    parts, nums = [], {}
    for m in _FPA_MODELS:
        cols, t1 = _table(f"fpa.table1.math_{m}")
        _, t6 = _table(f"fpa.table6.lambda_{m}")
        lam = get_claim(f"fpa.table1.math_{m}").paper_numbers["lam"]
        for r1, r6 in (("Off-RL", "0"), ("FPA", f"{lam:g}")):
            diff = [f"{c} {a:g} vs {b:g}" for c, a, b in zip(cols, t1[r1], t6[r6]) if a != b]
            nums[f"{m}.{r1}.cells_differing"] = len(diff)
            parts.append(
                (
                    f"{m} Table 1 {r1} = Table 6 lambda={r6}" + (f" (differs: {', '.join(diff)})" if diff else ""),
                    not diff,
                )
            )
    return _from_statements(parts, nums)


@_internal("fpa.text.offrl_competitive", Verdict.PARTLY, holds=(False, True, True))
def fpa_offrl_competitive(seed: int) -> CheckResult:
    pn = get_claim("fpa.text.offrl_competitive").paper_numbers
    z = float(pn["z"])
    parts, nums = [], {}
    for m in _FPA_MODELS:
        cid = f"fpa.table1.math_{m}"
        cols, t = _table(cid)
        se = get_claim(cid).paper_numbers["se"]
        ia = cols.index("Avg")
        rows = ["Off-RL", *pn["baselines"]]
        if not all(math.isfinite(t[b][ia]) and math.isfinite(float(se[b][ia])) for b in rows):
            raise ValueError(f"{cid}: non-finite Avg cell or SE among {rows}")
        best = max(pn["baselines"], key=lambda b: t[b][ia])
        off, top = t["Off-RL"][ia], t[best][ia]
        margin = z * math.hypot(float(se["Off-RL"][ia]), float(se[best][ia])) + _diff_tol(off, top)
        gap = off - top
        nums[f"{m}.offrl_minus_best"], nums[f"{m}.allowed"] = round(gap, 3), round(margin, 3)
        parts.append(
            (
                f"{m}: Off-RL {off:g} vs best other baseline {best} {top:g} (gap {gap:+.1f}, allowed -{margin:.2f})",
                gap >= -margin,
            )
        )
    return _from_statements(parts, nums)


@_internal("fpa.text.kl_no_gain", Verdict.VERIFIED)
def fpa_kl_no_gain(seed: int) -> CheckResult:
    cols, t = _table("fpa.table2.ablation")
    ia = cols.index("Avg")
    kl, off = t["w/ KL"][ia], t["Off-RL"][ia]
    parts = [(f"Avg w/ KL {kl:g} vs Off-RL {off:g}: no gain", kl <= off + _diff_tol(kl, off))]
    return _from_statements(parts, {"kl_avg": kl, "offrl_avg": off})


@_internal("fpa.typo.table2_kl_cells", Verdict.REFUTED)
def fpa_typo_kl_cells(seed: int) -> CheckResult:
    # every other row of Tables 1-2 scores GaoKao above OlympiadBench; a row that reverses this by a
    # wide margin has most likely transposed the two cells (the average is unaffected).
    cid = "fpa.table2.ablation"
    cols, t = _table(cid)
    ig, io = cols.index("GaoKao"), cols.index("Olympiad")
    gaps = {}
    for cidx in [cid] + [f"fpa.table1.math_{m}" for m in _FPA_MODELS]:
        c2, rows = _table(cidx)
        for r, v in rows.items():
            gaps[f"{cidx}:{r}"] = v[c2.index("GaoKao")] - v[c2.index("Olympiad")]
    kl_gap = gaps.pop(f"{cid}:w/ KL")
    others = list(gaps.values())
    parts = [
        (
            f"'w/ KL' row plausible: its GaoKao-Olympiad gap {kl_gap:+.1f} vs {min(others):+.1f}..{max(others):+.1f} in the other {len(others)} rows "
            f"(cells GaoKao {t['w/ KL'][ig]:g}, Olympiad {t['w/ KL'][io]:g} look transposed)",
            min(others) <= kl_gap,
        )
    ]
    return _from_statements(
        parts,
        {
            "kl_gaokao_minus_olym": round(kl_gap, 2),
            "others_min_gap": round(min(others), 2),
            "others_max_gap": round(max(others), 2),
        },
    )
