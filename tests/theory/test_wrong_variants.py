"""Each theory check rejects a deliberately wrong variant of its statement (it can fail)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import sympy as sp

from tiltlab.claims.registry import Verdict
from tiltlab.theory import disa, disa_beyond, fpa, lad, paced

REF, VER = Verdict.REFUTED, Verdict.VERIFIED


# ----------------------------------------------------------------------------- DISA
@pytest.mark.parametrize(
    "kw",
    [dict(estimator="sum_over_m_plus_1"), dict(support="truncated"), dict(weight="target_only")],
    ids=["biased-normalizer", "truncated-proposal", "missing-likelihood-ratio"],
)
def test_prop1_unbiased_rejects(kw):
    assert disa.check_prop1_unbiased(Ks=(2,), Ms=(1, 2), **kw).verdict == REF


@pytest.mark.parametrize(
    "claimed",
    [lambda v, Z, M: -v / (M * Z**2), lambda v, Z, M: -v / (2 * Z**2), lambda v, Z, M: v / (2 * M * Z**2)],
    ids=["missing-half", "M-independent", "sign"],
)
def test_prop1_log_jensen_rejects(claimed):
    assert disa.check_prop1_log_jensen(claimed, Ks=(2,), Ms=(2,)).verdict == REF


def test_prop2_rejects_decaying_geomean_bias_and_wrong_ratio():
    assert disa.check_prop2_geomean_bias(claimed_geomean=lambda v, Z, M: -v / (2 * M * Z**2), Ms=(1, 2)).verdict == REF
    assert disa.check_prop2_geomean_bias(claimed_ratio=lambda M: sp.Integer(1), Ms=(2,)).verdict == REF


@pytest.mark.parametrize(
    "kw",
    [dict(log_z_offset=sp.Symbol("b", positive=True)), dict(log_z_offset=sp.Rational(1, 2)), dict(reward_sign=+1)],
    ids=["symbolic-bias", "bias-1/2", "reward-sign"],
)
def test_prop3i_rejects(kw):
    assert disa.check_prop3i_exact_fixed_point(K=2, **kw).verdict == REF


@pytest.mark.parametrize("kw", [dict(sampling="off_policy"), dict(bias="y_dependent")])
def test_prop3ii_rejects(kw):
    assert disa.check_prop3ii_biased_stationary(K=2, **kw).verdict == REF


@pytest.mark.parametrize(
    "claimed",
    [lambda b, pib, ps: [b * (pib[k] - ps[k]) for k in range(len(ps))], lambda b, pib, ps: [0 * b for _ in ps]],
    ids=["missing-2", "zero"],
)
def test_c5_offpolicy_rejects(claimed):
    assert disa.check_c5_offpolicy_breaks(claimed).verdict == REF


def test_c5_counterexample_rejects_positive_bias_and_wrong_closed_form():
    assert disa.check_c5_counterexample(b=sp.Rational(1, 2)).verdict == REF
    wrong = lambda p, b: (
        p * (sp.log(p) + 1 + sp.log(sp.E + 1) + b) ** 2 + (1 - p) * (sp.log(1 - p) + sp.log(sp.E + 1) + b) ** 2
    )
    assert disa.check_c5_counterexample(closed_form=wrong).verdict == REF


def test_prop4_rejects_bound_without_factor_2_and_non_unit_weights():
    assert disa.check_prop4_envelope(bound=lambda e, j: e + math.sqrt(e) * math.sqrt(j), n_random=20).verdict == REF
    assert disa.check_prop4_envelope(weight_mean=2, n_random=20).verdict == REF


@pytest.mark.parametrize("claimed", [lambda b: 1 - b, lambda b: 1 + 2 * b, lambda b: sp.Integer(1)])
def test_local_threshold_rejects(claimed):
    assert disa_beyond.check_local_threshold(claimed).verdict == REF


@pytest.mark.parametrize("mode", ["full", "offpolicy_semi"])
def test_semigradient_rejects(mode):
    assert disa_beyond.check_semigradient_invariance(mode=mode, K=2).verdict == REF


@pytest.mark.parametrize(
    "thr",
    [lambda ps: 0.5 * math.log1p(-float(np.max(ps))), lambda ps: -1.0, lambda ps: 0.5 * math.log(float(np.min(ps)))],
    ids=["max", "local", "log-min"],
)
def test_global_threshold_rejects(thr):
    assert disa_beyond.check_global_threshold(thr, n_instances=2, Ks=(3,)).verdict == REF


# ----------------------------------------------------------------------------- PACED
@pytest.mark.parametrize(
    "claimed",
    [
        lambda beta, lz, kl, klr: beta * lz - beta * klr,
        lambda beta, lz, kl, klr: beta * lz + beta * kl,
        lambda beta, lz, kl, klr: lz - kl,
    ],
    ids=["KL-reversed", "sign", "missing-beta"],
)
def test_prop41_rejects(claimed):
    assert paced.check_prop41(claimed, Ks=(2,)).verdict == REF


def test_prop41_ab_rejects():
    assert (
        paced.check_prop41_ab(lambda beta, lz, kl, a, b: (beta * lz - beta * kl - a) / (b + a), Ks=(2,)).verdict == REF
    )


@pytest.mark.parametrize(
    "est",
    [
        lambda R, lp: sp.log(sum(sp.exp(r - l) for r, l in zip(R, lp)) / len(R)),
        lambda R, lp: sum(r + l for r, l in zip(R, lp)) / len(R),
    ],
    ids=["log-mean-exp", "sign"],
)
def test_vargrad_rejects(est):
    assert paced.check_vargrad(est, Ns=(2, 3)).verdict == REF


def test_estimator_bias_rejects_reversed_kl():
    assert paced.check_estimator_bias(lambda beta, kl, klr: beta * klr, K=2).verdict == REF


# ----------------------------------------------------------------------------- LAD
@pytest.mark.parametrize(
    "cand",
    [
        lambda po, A, eta: [po[i] * sp.exp(-A[i] / eta) for i in range(len(po))],
        lambda po, A, eta: [po[i] ** 2 * sp.exp(A[i] / eta) for i in range(len(po))],
    ],
    ids=["sign", "pi_old-squared"],
)
def test_lemma31_rejects(cand):
    assert lad.check_lemma31(cand, K=2).verdict == REF


def test_lemma32_rejects_concave_f_and_y_dependent_ratio():
    assert lad.check_lemma32(lambda u: -u * sp.log(u), K=2).verdict == REF
    assert lad.check_lemma32("kl", ratio="y_dependent", K=2).verdict == REF


def test_lemma32_tv_holds_when_weights_normalized():
    # the TV refutation is specific to sum g1 != 1 (the practical loss); with sum g1 = 1 it holds
    assert lad.check_lemma32("tv", normalized_g=True).verdict == VER


def test_table5_rejects_wrong_sign_and_accepts_correct_transcriptions():
    wrong_kl = lambda pt, po, a: pt / po * (sp.log(pt / po) + a)
    assert lad.check_table5("kl", wrong_kl).verdict == REF
    right_js = lambda pt, po, a: sp.exp(a) * lad.F_DIVERGENCES["js"](pt / po * sp.exp(-a))
    assert lad.check_table5("js", right_js).verdict == VER
    half_hel = lambda pt, po, a: sp.exp(a) * (sp.sqrt(pt / po) * sp.exp(-a / 2) - 1) ** 2 / 2
    assert lad.check_table5("hellinger", half_hel).verdict == VER


@pytest.mark.parametrize("div", sorted(lad.F_DIVERGENCES))
def test_thmB1_rejects_probability_instead_of_ratio(div):
    assert lad.check_thmB1(div, ratio_form="prob").verdict == REF


def test_B5_rejects_other_f():
    assert lad.check_B5_flowrl(lambda u: u * sp.log(u)).verdict == REF
    assert lad.check_B5_eq18(f=lambda u: u * sp.log(u)).verdict == REF
    # and eq. 18 with the derivable constant log(Z_A/Z_pi) is accepted
    assert lad.check_B5_eq18(paper_log_z=lambda ZA, Zp: sp.log(ZA / Zp)).verdict == VER


# ----------------------------------------------------------------------------- FPA
def test_eq5_rejects_wrong_exponent():
    assert fpa.check_eq5(lambda lp, lr, l_: (1 + l_) * lp + l_ * lr).verdict == REF


@pytest.mark.parametrize("factor", [lambda l_: l_, lambda l_: sp.Integer(1), lambda l_: 1 + 2 * l_])
def test_dpo_bandit_rejects(factor):
    assert fpa.check_dpo_bandit(factor).verdict == REF


def test_dpo_token_level_can_verify_and_rejects_wrong_extra_term():
    assert fpa.check_dpo_token_level(shared_prefix=True).verdict == VER
    with pytest.raises(ValueError):
        fpa.check_dpo_token_level(lambda b, yw, yl, p, r: -fpa.token_level_extra(b, yw, yl, p, r))


@pytest.mark.parametrize("kw", [dict(offrl="no_length_norm"), dict(grad_form="no_inv_len")])
def test_simper_rejects(kw):
    assert fpa.check_simper(len_w=1, len_l=2, **kw).verdict == REF


@pytest.mark.parametrize("variant", ["beta_is_beta1", "geomean"])
def test_apo_value_rejects(variant):
    assert fpa.check_apo_value(variant, Ns=(2, 3)).verdict == REF


# ----------------------------------------------------------------------------- claims from the papers' text
def test_lemma31_stated_form_is_refuted_and_the_proof_form_is_the_control():
    stated = lad.check_lemma31_stated("stated", n_instances=3)
    proof = lad.check_lemma31_stated("proof", n_instances=3)
    assert stated.verdict == REF and stated.numbers["max_optimum_gap"] > 1e-3
    assert stated.numbers["max_objective_gain"] > 0  # the true optimum of the stated problem does better
    assert proof.verdict == VER and proof.numbers["max_optimum_error"] < 1e-12
    with pytest.raises(ValueError, match="constraint"):
        lad.trust_region_optimum(np.ones(2) / 2, np.zeros(2), 0.1, "reverse")


def test_trust_region_optimum_is_feasible_and_beats_random_feasible_points():
    rng = np.random.default_rng(3)
    po, A = rng.dirichlet(np.ones(3)), rng.normal(size=3)
    eps = 0.05
    opt = lad.trust_region_optimum(po, A, eps, "stated")
    assert abs(float(np.sum(po * np.log(po / opt))) - eps) < 1e-10  # the constraint is active
    pts = rng.dirichlet(np.ones(3) * 0.5, size=20000)
    feas = pts[np.sum(po * np.log(po / pts), axis=1) <= eps]
    assert len(feas) > 100 and float((feas @ A).max()) <= float(A @ opt) + 1e-12


def test_grad_norm_holds_only_for_the_direct_parameterization():
    assert fpa.check_grad_norm("softmax").verdict == REF
    assert fpa.check_grad_norm("direct").verdict == VER


def test_eq9_rejects_a_gradient_without_the_policy_weight():
    assert lad.check_eq9_gradients("eq9_no_expectation", n_points=1).verdict == REF


def test_grpo_optimum_differs_for_a_kl_weight_other_than_eta():
    eta = sp.Symbol("eta", positive=True)
    assert lad.check_grpo_optimum(kl_weight=2 * eta).verdict == REF
