"""Numeric (layer="sim") checks of DISA's estimator and bias propositions.

Paper: DISA App. C (the equations in one notation: ``docs/math.md`` §1). Every label is computed by
``objectives.estimators`` and every residual by ``objectives.tb``; this module supplies exact
enumerated distributions (``sim.exact``), random instances and the comparisons. Each check
computes its verdict from what it measures.
"""

from __future__ import annotations

import math

import torch

from tiltlab.claims import stats
from tiltlab.claims.pinned import residual
from tiltlab.claims.registry import CheckResult, Verdict, register_check
from tiltlab.objectives.estimators import (
    delta_method_bias,
    log_importance_weights,
    log_partition_lse,
)
from tiltlab.objectives.tb import tb_residual
from tiltlab.sim.exact import (
    label_samples_exact,
    log_partition,
    mc_log_weights,
    relative_weight_variance,
    target_logprobs,
)
from tiltlab.sim.experiments import beta_sensitivity, bias, labels, proposal_strength
from tiltlab.sim.experiments.labels import M_GRID, exact_label_stats, random_instance
from tiltlab.sim.token_tree import TokenTree, bigram_env, make_reference, tilted_table

F64 = torch.float64


# ----------------------------------------------------------------------------- Prop. 1
#: ``disa.prop1.unbiased``: float64 enumeration, the sums have ~1e3-1e4 terms, rounding ~1e-12; 1e-9 leaves
#: margin (bound on max |E[Z_M]/Z - 1| and max |M Var(Z_M)/Var_q(w) - 1|).
PROP1_EXACT_TOL = 1e-9


@register_check(
    "disa.prop1.unbiased",
    layer="sim",
    expected=Verdict.VERIFIED,
    pins={"max_rel_mean_err": residual(PROP1_EXACT_TOL), "max_var_ratio_dev": residual(PROP1_EXACT_TOL)},
)
def prop1_unbiased(seed: int) -> CheckResult:
    """Exact enumeration (K=4, M=1..32) of E[Z_hat_M] and M Var(Z_hat_M) / Var_q(w), plus a Monte-Carlo
    run on the token tree (1024 sequences, a noisy token-level teacher, M=8) against the exact Z."""
    logp_ref, reward, logq, log_w = random_instance(seed)
    log_z = log_partition(logp_ref, reward)
    z = math.exp(float(log_z))
    chi2 = float(relative_weight_variance(target_logprobs(logp_ref, reward), logq))  # Var_q(w)/Z^2
    max_rel_mean, max_var_dev = 0.0, 0.0
    for m in M_GRID[:-1]:
        samples, prob = label_samples_exact(logq, log_w, m)
        zhat = log_partition_lse(samples).exp()  # [C]
        mean = float((prob * zhat).sum())
        var = float((prob * (zhat - mean) ** 2).sum())
        max_rel_mean = max(max_rel_mean, abs(mean / z - 1.0))
        max_var_dev = max(max_var_dev, abs(m * var / (chi2 * z * z) - 1.0))
    # Monte Carlo on the token tree (sequence-level proposal)
    env = TokenTree(4, 5)
    g = torch.Generator().manual_seed(1000 + seed)
    p_ref = make_reference(env, 0.15, generator=g)
    lp_ref, r = env.exact_logprobs(p_ref), env.exact_rewards()
    beta = 2.0
    # a noisy token-level teacher (tilt at half strength + logit noise): weights vary across sequences
    teacher = tilted_table(env, p_ref, 0.5 * beta) + 0.5 * torch.randn(env.param_shape, generator=g, dtype=F64)
    lq = bigram_env(env).exact_logprobs(teacher)
    lw = log_importance_weights(lp_ref, lq, beta * r)
    n = 20000
    zhat = log_partition_lse(mc_log_weights(lq, lw, 8, n, generator=g)).exp()  # [n]
    z_tree = float(log_partition(lp_ref, beta * r).exp())
    se = float(zhat.std()) / math.sqrt(n)
    zscore = (float(zhat.mean()) - z_tree) / se
    # exact enumeration: PROP1_EXACT_TOL; MC: |z| < 4 at a fixed seed (4 sigma, two-sided false alarm 6e-5).
    ok = max_rel_mean < PROP1_EXACT_TOL and max_var_dev < PROP1_EXACT_TOL and abs(zscore) < 4
    return CheckResult(
        Verdict.VERIFIED if ok else Verdict.REFUTED,
        f"exact K=4, M<=32: max |E[Z_M]/Z-1|={max_rel_mean:.1e}, max |M Var(Z_M)/Var_q(w)-1|={max_var_dev:.1e}; "
        f"token-tree MC (n={n}, M=8): z-score {zscore:+.2f}",
        numbers={"max_rel_mean_err": max_rel_mean, "max_var_ratio_dev": max_var_dev, "mc_zscore": zscore, "chi2": chi2},
    )


@register_check(
    "disa.prop1.log_jensen",
    layer="sim",
    expected=Verdict.VERIFIED,
    expected_items={"bias_negative": True, "ratio_tends_to_1": True, "plugin_matches_bias": True},
)
def prop1_log_jensen(seed: int) -> CheckResult:
    """Exact E[log Z_hat_M] - log Z for M=1..64 (K=3) against the delta method -Var_q(w)/(2 M Z^2)."""
    logp_ref, reward, logq, log_w = random_instance(seed, k=3)
    log_z = float(log_partition(logp_ref, reward))
    chi2 = float(relative_weight_variance(target_logprobs(logp_ref, reward), logq))
    biases, ratios, plug = [], [], None
    for m in M_GRID:
        mean, _, samples, prob = exact_label_stats(logq, log_w, m, log_partition_lse)
        b = mean - log_z
        biases.append(b)
        ratios.append(b / (-chi2 / (2 * m)))
        if m == 64:  # exact expectation of the sample plug-in objectives.delta_method_bias
            plug = float((prob * delta_method_bias(samples)).sum())
    all_neg = all(b < 0 for b in biases)
    r8, r64 = ratios[M_GRID.index(8)], ratios[-1]
    # the delta method is asymptotic: require the ratio to approach 1 (|r64 - 1| < 5% and shrinking).
    # The sample plug-in (objectives.delta_method_bias) estimates the same -chi2/(2M) term with an O(1/M)
    # relative error of its own (Var_hat(w/Z_hat) uses Z_hat for Z): its exact expectation must match the
    # true bias to the same 5% at M = 64 (a factor-2 or 1/M slip in the plug-in misses by >= 50%).
    items = {
        "bias_negative": all_neg,
        "ratio_tends_to_1": abs(r64 - 1) < 0.05 and abs(r64 - 1) < abs(r8 - 1) + 1e-12,
        "plugin_matches_bias": abs(plug / biases[-1] - 1) < 0.05,
    }
    ok = all(items.values())
    return CheckResult(
        Verdict.VERIFIED if ok else Verdict.REFUTED,
        f"E[log Z_M] - log Z < 0 for all M: {all_neg}; bias/delta-method ratio M=1: {ratios[0]:.3f}, M=8: {r8:.3f}, "
        f"M=64: {r64:.4f} (-> 1); exact E[plug-in delta_method_bias] at M=64 = {plug:.2e} vs true bias {biases[-1]:.2e} "
        f"(ratio {plug / biases[-1]:.3f}, must be within 5% of 1)",
        items=items,
        numbers={
            "chi2": chi2,
            "ratio_M1": ratios[0],
            "ratio_M8": r8,
            "ratio_M64": r64,
            "bias_M64": biases[-1],
            "plugin_M64": plug,
            "bias_M1": biases[0],
        },
    )


# ----------------------------------------------------------------------------- Prop. 2
#: ``disa.prop2.geomean_bias``: float64 enumeration, geomean of identical-count samples, rounding ~1e-13;
#: M-independence of the geomean bias (its spread over M) to 1e-10.
PROP2_SPREAD_TOL = 1e-10


@register_check(
    "disa.prop2.geomean_bias",
    layer="sim",
    expected=Verdict.VERIFIED,
    pins={"*_geo_spread": residual(PROP2_SPREAD_TOL)},
)
def prop2_geomean_bias(seed: int) -> CheckResult:
    """Exact geometric-mean label bias for M=1..64 (constant in M) vs LSE bias * M, on a low-variance
    instance (tilted proposal alpha = 0.8, where the second-order statements should hold) and a
    high-variance one (random proposal; reported, not judged)."""
    n = labels.geomean_bias(seed)
    lo, hi = ({k[len(t) + 1 :]: v for k, v in n.items() if k.startswith(t + "_")} for t in ("low", "high"))
    ok = (
        lo["geo_spread"] < PROP2_SPREAD_TOL
        and hi["geo_spread"] < PROP2_SPREAD_TOL
        and lo["geo_bias"] < 0
        and hi["geo_bias"] < 0
        and abs(lo["geo_vs_second_order"] - 1) < 0.1
        and abs(lo["lseM_over_geo_M64"] - 1) < 0.1
    )
    return CheckResult(
        Verdict.VERIFIED if ok else Verdict.REFUTED,
        f"geomean bias constant in M (spread {max(lo['geo_spread'], hi['geo_spread']):.1e}) and < 0; low-variance "
        f"(chi2={lo['chi2']:.3f}): bias/(-Var/2Z^2)={lo['geo_vs_second_order']:.3f}, 64*LSE bias/geo bias="
        f"{lo['lseM_over_geo_M64']:.3f}; high-variance (chi2={hi['chi2']:.2f}): {hi['geo_vs_second_order']:.2f} and "
        f"{hi['lseM_over_geo_M64']:.2f} (second order is only a small-variance statement)",
        numbers=n,
        figure="fig02_m_study",
    )


# ----------------------------------------------------------------------------- C.5
@register_check("disa.c5.counterexample", layer="sim", expected=Verdict.VERIFIED)
def c5_counterexample(seed: int) -> CheckResult:
    """The two-outcome example of DISA App. C.5 (b = -0.5): L(1, 0) < b^2 = L(pi*), and argmin L != pi*."""
    n = bias.counterexample()
    b, l_one, l_star, p_min, p_star = -0.5, n["L_vertex"], n["L_pi_star"], n["argmin_p"], n["pi_star_y1"]
    # DISA App. C.5's numbers: Z = 1.8591, pi*(y1) = 0.7311, L(1,0) ~ 0.035 < 0.25; 1e-3 matches its 3 digits.
    ok = l_one < l_star and abs(l_one - 0.035) < 1e-3 and abs(l_star - b * b) < 1e-12 and abs(p_min - p_star) > 0.05
    return CheckResult(
        Verdict.VERIFIED if ok else Verdict.REFUTED,
        f"Z={n['Z']:.4f}, pi*(y1)={p_star:.4f}; b=-0.5: L(pi*)={l_star:.4f}=b^2, L((1,0))={l_one:.4f}; "
        f"grid argmin p={p_min:.4f} (min L={n['min_L']:.4f})",
        numbers=n,
        figure="fig05_bias_landscape",
    )


#: ``disa.c5.offpolicy_breaks``: float64 autograd of exact sums, agreement to 1e-10 (values are O(1)): the
#: closed forms' errors and the on-policy gradient (zero at pi*).
C5_GRAD_TOL = 1e-10


@register_check(
    "disa.c5.offpolicy_breaks",
    layer="sim",
    expected=Verdict.VERIFIED,
    pins={
        "err_tabular": residual(C5_GRAD_TOL),
        "err_tree": residual(C5_GRAD_TOL),
        "onpolicy_grad_max": residual(C5_GRAD_TOL),
    },
)
def c5_offpolicy_breaks(seed: int) -> CheckResult:
    """Autograd gradient at pi* of E_{pi_b}[delta^2] with log Z + b: tabular softmax (closed form
    2b(pi_b - pi*)) and the token tree (2b grad E_{pi_b}[log pi_theta]); on-policy (sg(pi)) it vanishes."""
    g = torch.Generator().manual_seed(seed)
    k, beta, b = 6, 1.5, 0.3
    logp_ref = torch.log_softmax(torch.randn(k, generator=g, dtype=F64), -1)
    reward = (torch.rand(k, generator=g, dtype=F64) < 0.4).to(F64)
    log_star = target_logprobs(logp_ref, beta * reward)
    pi_b = torch.softmax(torch.randn(k, generator=g, dtype=F64), -1)
    log_z = log_partition(logp_ref, beta * reward) + b
    theta = log_star.clone().requires_grad_(True)
    d = tb_residual(torch.log_softmax(theta, -1), logp_ref, reward, log_z, beta=beta)
    (grad,) = torch.autograd.grad((pi_b * d * d).sum(), theta)
    closed = 2 * b * (pi_b - log_star.exp())
    err_tab = float((grad - closed).abs().max())
    theta2 = log_star.clone().requires_grad_(True)
    lp = torch.log_softmax(theta2, -1)
    d2 = tb_residual(lp, logp_ref, reward, log_z, beta=beta)
    (g_on,) = torch.autograd.grad((lp.exp().detach() * d2 * d2).sum(), theta2)
    # token tree: parameters shared across sequences
    env = TokenTree(3, 4)
    p_ref = make_reference(env, 0.3, generator=g)
    be = bigram_env(env)
    star = tilted_table(env, p_ref, beta).clone().requires_grad_(True)
    lp_ref, r = env.exact_logprobs(p_ref), env.exact_rewards()
    lz = log_partition(lp_ref, beta * r) + b
    pb = env.exact_logprobs(make_reference(env, 0.6, generator=g)).exp()  # a fixed behaviour policy
    lp_t = be.exact_logprobs(star)
    dt = tb_residual(lp_t, lp_ref, r, lz, beta=beta)
    (g_tree,) = torch.autograd.grad((pb * dt * dt).sum(), star, retain_graph=True)
    (g_score,) = torch.autograd.grad((pb * lp_t).sum(), star)
    err_tree = float((g_tree - 2 * b * g_score).abs().max())
    g_on_max = float(g_on.abs().max())
    ok = err_tab < C5_GRAD_TOL and err_tree < C5_GRAD_TOL and float(closed.norm()) > 1e-3 and g_on_max < C5_GRAD_TOL
    return CheckResult(
        Verdict.VERIFIED if ok else Verdict.REFUTED,
        f"off-policy gradient at pi* = 2b(pi_b - pi*) to {err_tab:.1e} (norm {float(closed.norm()):.3f}); token tree "
        f"= 2b grad E_pib[log pi] to {err_tree:.1e} (norm {float(g_tree.norm()):.3f}); on-policy gradient max "
        f"{g_on_max:.1e}",
        numbers={
            "err_tabular": err_tab,
            "grad_norm": float(closed.norm()),
            "err_tree": err_tree,
            "tree_grad_norm": float(g_tree.norm()),
            "onpolicy_grad_max": g_on_max,
        },
    )


# ----------------------------------------------------------------------------- Prop. 4
#: ``disa.prop4.envelope``: at pi = pi* J_Z is 0 by identity (float64 leaves ~1e-30).
PROP4_JZ_AT_TARGET_TOL = 1e-20


@register_check(
    "disa.prop4.envelope",
    layer="sim",
    expected=Verdict.VERIFIED,
    pins={"max_J_Z_at_target": residual(PROP4_JZ_AT_TARGET_TOL)},
)
def prop4_envelope(seed: int) -> CheckResult:
    """max |J_Zpsi - J_Z| / bound over 4000 random instances (<= 1), = 1 at pi = pi*; non-unit-mean weights reported."""
    n = bias.envelope(seed)["numbers"]
    ratio, ratio_n = n["max_ratio"], n["max_ratio_nonunit"]
    # float64: the tight case is an identity (J_Z = 0 up to ~1e-30); 1e-9 covers rounding of the ratio.
    tight_dev = max(abs(n["tight_min"] - 1), abs(n["tight_max"] - 1))
    ok = ratio <= 1 + 1e-9 and tight_dev < 1e-9 and n["max_J_Z_at_target"] < PROP4_JZ_AT_TARGET_TOL
    return CheckResult(
        Verdict.VERIFIED if ok else Verdict.REFUTED,
        f"unit-mean weights: max ratio |J_Zpsi-J_Z|/bound = {ratio:.4f} over 4000 random instances; at pi=pi*: ratio "
        f"{n['tight_min']:.6f}..{n['tight_max']:.6f} (tight); weights not unit-mean: max ratio {ratio_n:.2f}",
        numbers=n,
        figure="fig06_envelope",
    )


# ----------------------------------------------------------------------------- beyond
#: ``disa.beyond.local_threshold``: float64 autograd Hessian of O(1) values vs its closed form.
HESSIAN_TOL = 1e-9


@register_check(
    "disa.beyond.local_threshold",
    layer="sim",
    expected=Verdict.VERIFIED,
    pins={"max_hessian_err": residual(HESSIAN_TOL)},
)
def local_threshold(seed: int) -> CheckResult:
    """Autograd Hessian of L in the logits at pi* vs 2(1+b)(diag pi* - pi* pi*^T); tangent-space eigenvalue sign vs b."""
    n = bias.local_threshold(seed)
    bs = bias.LOCAL_BS
    mins = [n[f"min_eig_b{b}"] for b in bs]
    max_err = n["max_hessian_err"]
    signs_ok = all((m > 0) == (b > -1) for b, m in zip(bs, mins))
    ok = max_err < HESSIAN_TOL and signs_ok
    return CheckResult(
        Verdict.VERIFIED if ok else Verdict.REFUTED,
        f"Hessian at pi* = 2(1+b)(diag pi* - pi* pi*^T) to {max_err:.1e}; min tangent eigenvalue "
        + ", ".join(f"b={b}: {m:+.3f}" for b, m in zip(bs, mins)),
        numbers=n,
        figure="fig05_bias_landscape",
    )


@register_check(
    "disa.beyond.global_threshold",
    layer="sim",
    expected=Verdict.VERIFIED,
    # a gain over L(pi*) = b^2 above bias.BEATS_TOL counts as a disagreement above b_c (bias.global_threshold)
    pins={"max_violation_above_threshold": residual(bias.BEATS_TOL)},
)
def global_threshold(seed: int) -> CheckResult:
    """Random instances (K = 3, 4): numeric global min of L at b slightly above / below the conjectured
    threshold b_c = 1/2 log(1 - min pi*) (+-0.01, +-0.05), at b_c/2 and at b = 0.3; agreement rate with the conjecture."""
    n = bias.global_threshold(seed)
    agree, total, rate, worst = n["agreed"], n["cases"], n["agreement"], n["max_violation_above_threshold"]
    verdict = Verdict.VERIFIED if agree == total else (Verdict.PARTLY if rate > 0.5 else Verdict.REFUTED)
    return CheckResult(
        verdict,
        f"counterexample search, not an independent estimate: the multistart search on every face starts from pi* "
        f"restricted to the face, which includes the drop-least-likely policy that beats pi* below b_c by "
        f"construction; above b_c = 1/2 log(1 - min pi*) it found no policy beating pi*: conjecture consistent in "
        f"{agree}/{total} (instance, b) cases (K=3: {n['K3_agree']:.3f}, K=4: {n['K4_agree']:.3f}); largest "
        f"L(pi*) - min L found above b_c = {worst:.2e}",
        numbers=n,
        figure="fig05_bias_landscape",
    )


# ----------------------------------------------------------------------------- empirical (App. D)
#: ``disa.d3.m_study``: "flattens at M = 8" = |log-log slope after 8| < KNEE_RATIO x |slope before|, judged with a
#: margin of KNEE_MARGIN on the ratio: a knee below 0.4, no knee above 0.6, undecided between.
KNEE_RATIO, KNEE_MARGIN = 0.5, 0.1


def knee_outcome(slope_before: float, slope_after: float) -> str:
    """One curve's knee at M = 8 from its log-log slopes: :data:`stats.SUPPORTS` (knee), :data:`stats.AGAINST`
    (one power law through 8) or :data:`stats.UNDECIDED` (the ratio within :data:`KNEE_MARGIN` of the criterion)."""
    if not (math.isfinite(slope_before) and math.isfinite(slope_after)) or slope_before == 0:
        raise ValueError(f"slopes must be finite with slope_before != 0, got {slope_before}, {slope_after}")
    r = abs(slope_after) / abs(slope_before)
    if r < KNEE_RATIO - KNEE_MARGIN:
        return stats.SUPPORTS
    if r > KNEE_RATIO + KNEE_MARGIN:
        return stats.AGAINST
    return stats.UNDECIDED


def m_study_verdict(numbers: dict) -> tuple[Verdict, dict[str, str]]:
    """The decrease in M holds by construction for an M-sample estimator (E log Z_M rises with M, Var falls
    ~1/M): it is required (a curve that does not decrease is refuted) but counts as no support. The claim's
    content, the knee at 8, decides per curve (:func:`knee_outcome`) with :func:`stats.aggregate`."""
    out = {c: knee_outcome(numbers[f"{c}_slope_before"], numbers[f"{c}_slope_after"]) for c in ("var", "bias")}
    if not (numbers["var_monotone"] and numbers["bias_monotone"]):
        return Verdict.REFUTED, out
    return Verdict(stats.aggregate(list(out.values()))), out


@register_check(
    "disa.d3.m_study",
    layer="sim",
    expected=Verdict.REFUTED,
    expected_items={
        "var_and_bias_decrease": True,
        "var_knee": False,
        "var_no_knee": True,
        "bias_knee": False,
        "bias_no_knee": True,
    },
)
def d3_m_study(seed: int) -> CheckResult:
    """The App. D.3 protocol on 12 token-tree prompts (pool 512, 400 subsamples per M): monotone decrease of
    variance and relative bias (required, by construction), and whether each curve flattens *at* M = 8
    (:func:`m_study_verdict`) or follows one power law."""
    n = labels.m_study_claim(seed)["numbers"]
    monotone = n["var_monotone"] and n["bias_monotone"]
    verdict, knees = m_study_verdict(n)
    v_before, v_after, b_before, b_after = (
        n[k] for k in ("var_slope_before", "var_slope_after", "bias_slope_before", "bias_slope_after")
    )
    return CheckResult(
        verdict,
        f"variance and median relative bias decrease monotonically: {monotone} (by construction); M=1->8 drops "
        f"{100 * n['var_drop_1_to_8']:.0f}% / {100 * n['bias_drop_1_to_8']:.0f}%, extra 8->16 gain "
        f"{100 * n['var_extra_8_to_16_pp']:.1f} / {100 * n['bias_extra_8_to_16_pp']:.1f} pp; log-log slopes "
        f"before/after M=8: variance {v_before:.2f}/{v_after:.2f} (ratio {abs(v_after / v_before):.2f}: "
        f"{knees['var']}), bias {b_before:.2f}/{b_after:.2f} (ratio {abs(b_after / b_before):.2f}: {knees['bias']}); "
        f"knee = ratio < {KNEE_RATIO - KNEE_MARGIN:.1f}, none = ratio > {KNEE_RATIO + KNEE_MARGIN:.1f}"
        + (
            " -> the flattening is the linear-axis view of one ~1/M power law, not a knee at 8"
            if set(knees.values()) == {stats.AGAINST}
            else ""
        ),
        numbers=n,
        figure="fig02_m_study",
        items={
            "var_and_bias_decrease": bool(monotone),
            **{f"{c}_knee": o == stats.SUPPORTS for c, o in knees.items()},
            **{f"{c}_no_knee": o == stats.AGAINST for c, o in knees.items()},
        },
    )


#: ``disa.sens.proposal``: float64 exact enumeration (9 compositions per prompt) of E[Z_8]/Z - 1.
SENS_MEAN_DEV_TOL = 1e-9
#: ``disa.sens.proposal``: Var(log Z_8) at alpha = 1 (the exact tilted proposal: every weight equals Z, the label
#: is exact) is zero up to rounding; a mean within SENS_MEAN_DEV_TOL of Z moves log Z_8 by ~1e-9, so its square.
SENS_VAR_ALPHA1_TOL = SENS_MEAN_DEV_TOL**2


@register_check(
    "disa.sens.proposal",
    layer="sim",
    expected=Verdict.VERIFIED,
    pins={"max_mean_dev": residual(SENS_MEAN_DEV_TOL), "var_alpha1": residual(SENS_VAR_ALPHA1_TOL)},
)
def sens_proposal(seed: int) -> CheckResult:
    """Exact label statistics for tilted proposals alpha = 0..1 on 8 token-tree prompts (M = 8): E[Z_hat]/Z = 1
    for every alpha, Var(log Z_hat_8) increases as the proposal weakens (alpha decreases)."""
    n = proposal_strength.proposal_claim(seed)["numbers"]
    dev, monotone = n["max_mean_dev"], n["monotone"]
    ok = dev < SENS_MEAN_DEV_TOL and monotone and abs(n["var_alpha1"]) < SENS_VAR_ALPHA1_TOL
    return CheckResult(
        Verdict.VERIFIED if ok else Verdict.REFUTED,
        f"max |E[Z_8]/Z - 1| = {dev:.1e} over alpha in [0,1]; mean Var(log Z_8): alpha=0 {n['var_alpha0']:.3f}, "
        f"alpha=0.5 {n['var_alpha05']:.4f}, alpha=0.9 {n['var_alpha09']:.1e}, alpha=1 {n['var_alpha1']:.1e} (exact label: below {SENS_VAR_ALPHA1_TOL:.0e}) "
        f"(strictly decreasing in alpha: {monotone})",
        numbers=n,
        figure="fig04_proposal_strength",
    )


@register_check("disa.open.truncated_proposal", layer="sim", expected=Verdict.VERIFIED)
def open_truncated_proposal(seed: int) -> CheckResult:
    """Token-level top-k / top-p teachers on 8 token-tree prompts: MC E[Z_hat_8]/Z against pi*(supp q)."""
    claim = proposal_strength.truncation_claim(seed)
    n = claim["numbers"]
    worst, min_mass = n["max_z"], n["min_support_mass"]
    # 4.5 sigma over 56 (truncation, prompt) cells: family-wise false alarm ~4e-4
    ok = worst < 4.5 and min_mass < 0.9
    return CheckResult(
        Verdict.VERIFIED if ok else Verdict.REFUTED,
        f"E[Z_8]/Z = pi*(supp q) within MC error (max |z| = {worst:.2f} over {n['cells']} cells); tilted mass kept "
        f"ranges {min_mass:.3f}..{n['max_support_mass']:.3f}; {claim['most_truncated']}: mean LSE label bias "
        f"{n['lse_bias_most_truncated']:+.2f} nats vs log pi*(supp) {n['pred_bias_most_truncated']:+.2f}; weights "
        f"from the untruncated teacher: |E[Z]/Z - 1| up to {n['fullq_max_dev']:.2f}",
        numbers=n,
        figure="fig04_proposal_strength",
    )


@register_check("disa.sens.beta_cliff", layer="sim", expected=Verdict.VERIFIED)
def sens_beta_cliff(seed: int) -> CheckResult:
    """Label statistics vs beta (8 token-tree prompts, q = pi_ref and a fixed teacher) and a short TB run with
    the frozen label vs exact log Z (``sim.run``, 4 optimizer steps per batch) at beta = 0.25, 1, 16."""
    n = beta_sensitivity.beta_cliff_claim(seed)["numbers"]
    nok = n["label_cliff"] + n["train_cliff"] + n["plateau"]
    verdict = Verdict.VERIFIED if nok == 3 else (Verdict.PARTLY if nok >= 1 else Verdict.REFUTED)
    return CheckResult(
        verdict,
        f"label: Var(log Z_8) with q=pi_ref {n['var_ref_b025']:.1e} (beta=0.25) -> {n['var_ref_b16']:.1f} (beta=16), "
        f"teacher max normalized weight {n['maxw_teacher_b025']:.2f} -> {n['maxw_teacher_b16']:.2f}; training: excess "
        f"TV over exact log Z {n['excess_b025']:+.4f} (beta=0.25), {n['excess_b1']:+.4f} (1), {n['excess_b16']:+.4f} "
        f"(16) (plateau at small beta: {n['plateau']}; cliff at large beta: {n['train_cliff']}); note: with q = pi_ref "
        "the failure is M-samples with no correct draw (equal weights, label ~0), not only few dominant weights",
        numbers=n,
        figure="fig03_beta_sensitivity",
    )
