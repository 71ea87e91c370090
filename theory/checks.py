"""Register every theory check with the claims registry (``layer="theory"``).

Imported by :func:`tiltlab.paper_checks.catalog.discover`. Each registered function calls the
``check_*`` of its paper module with the paper's (correct) candidate; ``expected`` is the
verdict it currently returns (a change makes ``tiltlab check`` fail loudly).
"""

from __future__ import annotations

from tiltlab.claims.pinned import residual
from tiltlab.claims.registry import CheckResult, Verdict, register_check
from tiltlab.theory import disa, disa_beyond, fpa, lad, paced

V, R, P = Verdict.VERIFIED, Verdict.REFUTED, Verdict.PARTLY

# ----------------------------------------------------------------------------- DISA


@register_check("disa.prop1.unbiased", layer="theory", expected=V)
def prop1_unbiased(seed: int) -> CheckResult:
    return disa.check_prop1_unbiased()


@register_check("disa.prop1.log_jensen", layer="theory", expected=V)
def prop1_log_jensen(seed: int) -> CheckResult:
    return disa.check_prop1_log_jensen()


@register_check("disa.prop2.geomean_bias", layer="theory", expected=V)
def prop2_geomean_bias(seed: int) -> CheckResult:
    return disa.check_prop2_geomean_bias()


@register_check("disa.prop3i.exact_fixed_point", layer="theory", expected=V)
def prop3i_exact_fixed_point(seed: int) -> CheckResult:
    return disa.check_prop3i_exact_fixed_point()


@register_check("disa.prop3ii.biased_stationary", layer="theory", expected=V)
def prop3ii_biased_stationary(seed: int) -> CheckResult:
    return disa.check_prop3ii_biased_stationary()


@register_check("disa.c5.offpolicy_breaks", layer="theory", expected=V)
def c5_offpolicy_breaks(seed: int) -> CheckResult:
    return disa.check_c5_offpolicy_breaks()


@register_check("disa.c5.counterexample", layer="theory", expected=V)
def c5_counterexample(seed: int) -> CheckResult:
    return disa.check_c5_counterexample()


@register_check("disa.prop4.envelope", layer="theory", expected=V)
def prop4_envelope(seed: int) -> CheckResult:
    return disa.check_prop4_envelope(seed=seed)


@register_check("disa.beyond.local_threshold", layer="theory", expected=V)
def beyond_local_threshold(seed: int) -> CheckResult:
    return disa_beyond.check_local_threshold()


@register_check("disa.beyond.semigradient_invariance", layer="theory", expected=V)
def beyond_semigradient_invariance(seed: int) -> CheckResult:
    return disa_beyond.check_semigradient_invariance()


@register_check(
    "disa.beyond.global_threshold",
    layer="theory",
    expected=V,
    # lemma_grid_min: the grid holds F's zeros x = 0, x = a, so min F <= float64 rounding << tol, and |min| <= tol
    # is the check's own min >= -tol
    pins={
        "lemma_grid_min": residual(disa_beyond.GLOBAL_LEMMA_TOL),
        "max_err": residual(disa_beyond.GLOBAL_THRESHOLD_TOL),
    },
)
def beyond_global_threshold(seed: int) -> CheckResult:
    return disa_beyond.check_global_threshold(seed=seed)


# ----------------------------------------------------------------------------- PACED


@register_check("paced.prop41", layer="theory", expected=V)
def paced_prop41(seed: int) -> CheckResult:
    return paced.check_prop41()


@register_check("paced.prop41_ab", layer="theory", expected=V)
def paced_prop41_ab(seed: int) -> CheckResult:
    return paced.check_prop41_ab()


@register_check("paced.vargrad", layer="theory", expected=V)
def paced_vargrad(seed: int) -> CheckResult:
    return paced.check_vargrad()


@register_check("paced.estimator", layer="theory", expected=V)
def paced_estimator(seed: int) -> CheckResult:
    return paced.check_estimator_bias()


# ----------------------------------------------------------------------------- LAD


@register_check("lad.lemma31", layer="theory", expected=V)
def lad_lemma31(seed: int) -> CheckResult:
    return lad.check_lemma31()


_LEMMA32_EXPECTED = {"kl": V, "rkl": V, "jeffreys": V, "tv": R, "hellinger": V, "js": V}
_TABLE5_EXPECTED = {"kl": V, "rkl": P, "jeffreys": V, "tv": V, "hellinger": P, "js": R}


def _register_per_divergence() -> None:
    for div, exp in _LEMMA32_EXPECTED.items():
        register_check("lad.lemma32", layer="theory", expected=exp, name=f"lemma32_{div}")(
            lambda seed, d=div: lad.check_lemma32(d)
        )
    for div, exp in _TABLE5_EXPECTED.items():
        register_check(f"lad.table5.{div}", layer="theory", expected=exp, name=f"table5_{div}")(
            lambda seed, d=div: lad.check_table5(d)
        )
    for div in lad.F_DIVERGENCES:
        register_check("lad.thmB1", layer="theory", expected=V, name=f"thmB1_{div}")(
            lambda seed, d=div: lad.check_thmB1(d)
        )


_register_per_divergence()


@register_check("lad.practical", layer="theory", expected=P)
def lad_practical(seed: int) -> CheckResult:
    """The practical loss is Lemma 3.2 with g1 = g2 = pi_old e^{A/eta} (sum != 1): per f."""
    res = {d: lad.check_lemma32(d) for d in lad.F_DIVERGENCES}
    good = [d for d, r in res.items() if r.verdict == Verdict.VERIFIED]
    bad = [d for d, r in res.items() if r.verdict != Verdict.VERIFIED]
    verdict = V if not bad else (P if good else R)
    return CheckResult(
        verdict,
        f"optimum pi_old e^(A/eta)/Z is the unique minimizer of L_LAD for {good}; not unique for {bad} "
        "(TV: every pi <= pi_old e^(A/eta) componentwise minimizes it when E_pi_old[e^(A/eta)] > 1)",
        {"n_unique": len(good), "n_not_unique": len(bad)},
    )


@register_check("lad.B5.flowrl_special_case", layer="theory", expected=V)
def lad_b5(seed: int) -> CheckResult:
    return lad.check_B5_flowrl()


@register_check("lad.B5.eq18", layer="theory", expected=P)
def lad_b5_eq18(seed: int) -> CheckResult:
    return lad.check_B5_eq18()


# ----------------------------------------------------------------------------- FPA


@register_check("fpa.eq5", layer="theory", expected=V)
def fpa_eq5(seed: int) -> CheckResult:
    return fpa.check_eq5()


@register_check("fpa.dpo_equiv", layer="theory", expected=V)
def fpa_dpo_equiv(seed: int) -> CheckResult:
    return fpa.check_dpo_bandit()


@register_check("fpa.dpo_token_level", layer="theory", expected=R)
def fpa_dpo_token_level(seed: int) -> CheckResult:
    return fpa.check_dpo_token_level()


@register_check("fpa.simper", layer="theory", expected=V)
def fpa_simper(seed: int) -> CheckResult:
    return fpa.check_simper()


@register_check("fpa.apo_value", layer="theory", expected=V)
def fpa_apo_value(seed: int) -> CheckResult:
    return fpa.check_apo_value()


# ----------------------------------------------------------------------------- added claims (text)


@register_check("lad.lemma31.stated", layer="theory", expected=R, name="eq2_trust_region_numeric")
def lad_lemma31_stated(seed: int) -> CheckResult:
    return lad.check_lemma31_stated("stated", seed=seed)


@register_check(
    "lad.lemma31",
    layer="theory",
    expected=V,
    name="proof_trust_region_numeric",
    pins={
        "max_optimum_error": residual(lad.LEMMA31_OPTIMUM_TOL),
        # reported, not judged: A . (pi_opt - pi_eta), 0 when the optimum criterion holds; that criterion's tolerance
        "max_objective_gain": residual(lad.LEMMA31_OPTIMUM_TOL),
    },
)
def lad_lemma31_proof_numeric(seed: int) -> CheckResult:
    return lad.check_lemma31_stated("proof", seed=seed)


@register_check("lad.s41.grpo_optimum", layer="theory", expected=V)
def lad_grpo_optimum(seed: int) -> CheckResult:
    return lad.check_grpo_optimum()


@register_check(
    "lad.eq9.gradient",
    layer="theory",
    expected=V,
    name="symbolic_gradient",
    pins={"max_abs_diff": residual(lad.EQ9_GRAD_TOL)},
)
def lad_eq9(seed: int) -> CheckResult:
    return lad.check_eq9_gradients("eq9", seed=seed)


@register_check(
    "lad.b4.theoretical_gradient",
    layer="theory",
    expected=V,
    name="symbolic_gradient",
    pins={"max_abs_diff": residual(lad.EQ9_GRAD_TOL)},
)
def lad_b4(seed: int) -> CheckResult:
    return lad.check_eq9_gradients("B4", seed=seed)


@register_check("fpa.s21.grad_norm", layer="theory", expected=R)
def fpa_grad_norm(seed: int) -> CheckResult:
    return fpa.check_grad_norm("softmax")


# ----------------------------------------------------------------------------- claims registered for issue 22


@register_check(
    "disa.s41.reward_lowers_diversity",
    layer="theory",
    expected=P,
    name="tilt_entropy_grid",
    expected_items={"closed_form": True, "some_reference_gains_entropy": True},
)
def disa_reward_lowers_diversity(seed: int) -> CheckResult:
    return disa_beyond.check_tilt_entropy()


@register_check("paced.s42.kl_second_order", layer="theory", expected=V)
def paced_kl_second_order(seed: int) -> CheckResult:
    return paced.check_kl_second_order()


@register_check("fpa.s23.linear_logits", layer="theory", expected=V, name="extrapolation_error")
def fpa_linear_logits(seed: int) -> CheckResult:
    return fpa.check_linear_extrapolation()


@register_check(
    "fpa.s24.optimistic_md",
    layer="theory",
    expected=P,
    expected_items={"cumulative_gradient": True, "omd_if_constant_gradient": True, "omd_in_general": False},
)
def fpa_optimistic_md(seed: int) -> CheckResult:
    return fpa.check_optimistic_md()
