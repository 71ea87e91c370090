"""Numeric (layer="sim") checks of DISA's estimator and bias propositions.

Paper: DISA, ``000_97b17fcb5a92948e.txt`` App. C (its equations were lost in extraction;
``shared/notes/math.md`` Sec. 1 reconstructs them). Every label is computed by
``objectives.estimators`` and every residual by ``objectives.tb``; this module supplies exact
enumerated distributions (``sim.exact``), random instances and the comparisons. Each check
computes its verdict from what it measures.
"""

from __future__ import annotations

import math

import torch

from tiltlab.objectives.estimators import (
    delta_method_bias,
    log_importance_weights,
    log_partition_geomean,
    log_partition_lse,
)
from tiltlab.objectives.tb import tb_residual
from tiltlab.paper_checks.registry import CheckResult, Verdict, register_check
from tiltlab.sim.exact import (
    label_samples_exact,
    log_partition,
    mc_log_weights,
    relative_weight_variance,
    target_logprobs,
)
from tiltlab.sim.proposals import tilted_proposal
from tiltlab.sim.token_tree import TokenTree, bigram_env, make_reference, tilted_table

F64 = torch.float64
M_GRID = (1, 2, 4, 8, 16, 32, 64)


def _instance(seed: int, k: int = 4, beta: float = 1.0, q_scale: float = 0.7):
    """A small random instance: pi_ref, a graded reward, a full-support proposal q [K]."""
    g = torch.Generator().manual_seed(seed)
    logp_ref = torch.log_softmax(torch.randn(k, generator=g, dtype=F64), -1)
    reward = torch.rand(k, generator=g, dtype=F64)
    logq = torch.log_softmax(q_scale * torch.randn(k, generator=g, dtype=F64), -1)
    log_w = log_importance_weights(logp_ref, logq, beta * reward)  # [K]
    return logp_ref, reward, logq, log_w


def _exact_label_stats(logq, log_w, m, aggregator):
    """Exact mean / variance of ``aggregator(log_w sample)`` and exact mean of the linear ``Z_hat``."""
    samples, prob = label_samples_exact(logq, log_w, m)  # [C, M], [C]
    lab = aggregator(samples)  # [C]
    mean = (prob * lab).sum()
    var = (prob * (lab - mean) ** 2).sum()
    return float(mean), float(var), samples, prob


# ----------------------------------------------------------------------------- Prop. 1
@register_check("disa.prop1.unbiased", layer="sim", expected=Verdict.VERIFIED)
def prop1_unbiased(seed: int) -> CheckResult:
    """Exact enumeration (K=4, M=1..32) of E[Z_hat_M] and M Var(Z_hat_M) / Var_q(w), plus a Monte-Carlo
    run on the token tree (1024 sequences, a noisy token-level teacher, M=8) against the exact Z."""
    logp_ref, reward, logq, log_w = _instance(seed)
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
    # float64 enumeration: the sums have ~1e3-1e4 terms, rounding ~1e-12; 1e-9 leaves margin.
    # MC: |z| < 4 at a fixed seed (4 sigma, two-sided false alarm 6e-5).
    ok = max_rel_mean < 1e-9 and max_var_dev < 1e-9 and abs(zscore) < 4
    return CheckResult(
        Verdict.VERIFIED if ok else Verdict.REFUTED,
        f"exact K=4, M<=32: max |E[Z_M]/Z-1|={max_rel_mean:.1e}, max |M Var(Z_M)/Var_q(w)-1|={max_var_dev:.1e}; "
        f"token-tree MC (n={n}, M=8): z-score {zscore:+.2f}",
        numbers={"max_rel_mean_err": max_rel_mean, "max_var_ratio_dev": max_var_dev, "mc_zscore": zscore, "chi2": chi2},
    )


@register_check("disa.prop1.log_jensen", layer="sim", expected=Verdict.VERIFIED)
def prop1_log_jensen(seed: int) -> CheckResult:
    """Exact E[log Z_hat_M] - log Z for M=1..64 (K=3) against the delta method -Var_q(w)/(2 M Z^2)."""
    logp_ref, reward, logq, log_w = _instance(seed, k=3)
    log_z = float(log_partition(logp_ref, reward))
    chi2 = float(relative_weight_variance(target_logprobs(logp_ref, reward), logq))
    biases, ratios, plug = [], [], None
    for m in M_GRID:
        mean, _, samples, prob = _exact_label_stats(logq, log_w, m, log_partition_lse)
        b = mean - log_z
        biases.append(b)
        ratios.append(b / (-chi2 / (2 * m)))
        if m == 64:  # exact expectation of the sample plug-in objectives.delta_method_bias
            plug = float((prob * delta_method_bias(samples)).sum())
    all_neg = all(b < 0 for b in biases)
    r8, r64 = ratios[M_GRID.index(8)], ratios[-1]
    # the delta method is asymptotic: require the ratio to approach 1 (|r64 - 1| < 5% and shrinking).
    ok = all_neg and abs(r64 - 1) < 0.05 and abs(r64 - 1) < abs(r8 - 1) + 1e-12
    return CheckResult(
        Verdict.VERIFIED if ok else Verdict.REFUTED,
        f"E[log Z_M] - log Z < 0 for all M: {all_neg}; bias/delta-method ratio M=1: {ratios[0]:.3f}, M=8: {r8:.3f}, "
        f"M=64: {r64:.4f} (-> 1); exact E[plug-in delta_method_bias] at M=64 = {plug:.2e} vs true bias {biases[-1]:.2e}",
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
@register_check("disa.prop2.geomean_bias", layer="sim", expected=Verdict.VERIFIED)
def prop2_geomean_bias(seed: int) -> CheckResult:
    """Exact geometric-mean label bias for M=1..64 (constant in M) vs LSE bias * M, on a low-variance
    instance (tilted proposal alpha = 0.8, where the second-order statements should hold) and a
    high-variance one (random proposal; reported, not judged)."""
    out = {}
    for tag, alpha, beta in (("low", 0.8, 1.0), ("high", None, 3.0)):
        logp_ref, reward, logq, log_w = _instance(seed + 7, k=3, beta=beta, q_scale=1.5)
        tilt = beta * reward
        if alpha is not None:  # a good proposal: close to pi*, small weight variance
            logq = tilted_proposal(logp_ref, target_logprobs(logp_ref, tilt), alpha)
            log_w = log_importance_weights(logp_ref, logq, tilt)
        log_z = float(log_partition(logp_ref, tilt))
        chi2 = float(relative_weight_variance(target_logprobs(logp_ref, tilt), logq))
        geo = [(_exact_label_stats(logq, log_w, m, log_partition_geomean)[0] - log_z) for m in M_GRID]
        lse = [(_exact_label_stats(logq, log_w, m, log_partition_lse)[0] - log_z) for m in M_GRID]
        out[tag] = {
            "chi2": chi2,
            "geo_bias": geo[0],
            "geo_spread": max(geo) - min(geo),
            "geo_vs_second_order": geo[0] / (-chi2 / 2),
            "lseM_over_geo_M64": lse[-1] * 64 / geo[0],
            "lse_bias_M64": lse[-1],
        }
    lo, hi = out["low"], out["high"]
    # float64 enumeration: geomean of identical-count samples, rounding ~1e-13; M-independence to 1e-10.
    ok = (
        lo["geo_spread"] < 1e-10
        and hi["geo_spread"] < 1e-10
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
        numbers={f"{t}_{k}": v for t, d in out.items() for k, v in d.items()},
    )


# ----------------------------------------------------------------------------- C.5
def two_outcome_loss(p: torch.Tensor, b: float, beta: float = 1.0) -> torch.Tensor:
    """On-policy biased TB loss ``L(p) = E_pi[delta^2]`` for DISA App. C.5's example:
    ``Y = {y1, y2}``, ``pi_ref = (1/2, 1/2)``, ``r = (1, 0)``, ``pi = (p, 1 - p)``, ``log Z_psi = log Z + b``.
    ``p [N] -> [N]`` (0 log^2 0 = 0 at the end points)."""
    logp_ref = torch.full((2,), math.log(0.5), dtype=F64)
    reward = torch.tensor([1.0, 0.0], dtype=F64)
    log_z = log_partition(logp_ref, beta * reward) + b
    pi = torch.stack([p, 1 - p], -1)  # [N, 2]
    safe = torch.where(pi > 0, pi, torch.ones_like(pi)).log()
    d = tb_residual(safe, logp_ref.expand_as(safe), reward.expand_as(safe), log_z, beta)
    return torch.where(pi > 0, pi * d * d, torch.zeros_like(pi)).sum(-1)


@register_check("disa.c5.counterexample", layer="sim", expected=Verdict.VERIFIED)
def c5_counterexample(seed: int) -> CheckResult:
    """The two-outcome example of math.md (b = -0.5): L(1, 0) < b^2 = L(pi*), and argmin L != pi*."""
    b = -0.5
    p = torch.linspace(0, 1, 100001, dtype=F64)
    loss = two_outcome_loss(p, b)
    p_star = math.e / (math.e + 1)
    l_star = float(two_outcome_loss(torch.tensor([p_star], dtype=F64), b))
    l_one = float(loss[-1])
    p_min = float(p[loss.argmin()])
    z = (math.e + 1) / 2
    # math.md's numbers: Z = 1.8591, pi*(y1) = 0.7311, L(1,0) ~ 0.035 < 0.25; 1e-3 matches its 3 digits.
    ok = l_one < l_star and abs(l_one - 0.035) < 1e-3 and abs(l_star - b * b) < 1e-12 and abs(p_min - p_star) > 0.05
    return CheckResult(
        Verdict.VERIFIED if ok else Verdict.REFUTED,
        f"Z={z:.4f}, pi*(y1)={p_star:.4f}; b=-0.5: L(pi*)={l_star:.4f}=b^2, L((1,0))={l_one:.4f}; "
        f"grid argmin p={p_min:.4f} (min L={float(loss.min()):.4f})",
        numbers={
            "Z": z,
            "pi_star_y1": p_star,
            "L_pi_star": l_star,
            "L_vertex": l_one,
            "argmin_p": p_min,
            "min_L": float(loss.min()),
        },
        figure="fig05_bias_landscape",
    )


@register_check("disa.c5.offpolicy_breaks", layer="sim", expected=Verdict.VERIFIED)
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
    d = tb_residual(torch.log_softmax(theta, -1), logp_ref, reward, log_z, beta)
    (grad,) = torch.autograd.grad((pi_b * d * d).sum(), theta)
    closed = 2 * b * (pi_b - log_star.exp())
    err_tab = float((grad - closed).abs().max())
    theta2 = log_star.clone().requires_grad_(True)
    lp = torch.log_softmax(theta2, -1)
    d2 = tb_residual(lp, logp_ref, reward, log_z, beta)
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
    dt = tb_residual(lp_t, lp_ref, r, lz, beta)
    (g_tree,) = torch.autograd.grad((pb * dt * dt).sum(), star, retain_graph=True)
    (g_score,) = torch.autograd.grad((pb * lp_t).sum(), star)
    err_tree = float((g_tree - 2 * b * g_score).abs().max())
    # float64 autograd of exact sums: agreement to 1e-10 (values are O(1)).
    ok = err_tab < 1e-10 and err_tree < 1e-10 and float(closed.norm()) > 1e-3 and float(g_on.abs().max()) < 1e-10
    return CheckResult(
        Verdict.VERIFIED if ok else Verdict.REFUTED,
        f"off-policy gradient at pi* = 2b(pi_b - pi*) to {err_tab:.1e} (norm {float(closed.norm()):.3f}); token tree "
        f"= 2b grad E_pib[log pi] to {err_tree:.1e} (norm {float(g_tree.norm()):.3f}); on-policy gradient max "
        f"{float(g_on.abs().max()):.1e}",
        numbers={
            "err_tabular": err_tab,
            "grad_norm": float(closed.norm()),
            "err_tree": err_tree,
            "tree_grad_norm": float(g_tree.norm()),
            "onpolicy_grad_max": float(g_on.abs().max()),
        },
    )


# ----------------------------------------------------------------------------- Prop. 4
def envelope_instances(
    n: int,
    p: int,
    k: int,
    generator: torch.Generator,
    at_target: bool = False,
    unit_mean: bool = True,
    toward_target: bool = False,
):
    """Random instances of DISA Prop. 4: returns (|J_Zpsi - J_Z| [n], bound [n], E[Delta^2] [n], J_Z [n]).

    Each instance: ``p`` prompts (uniform), ``k`` outcomes, random pi_ref, graded reward, beta, a
    behaviour policy pi_b, nonnegative weights with ``E_{pi_b}[w | x] = 1`` (``unit_mean``),
    a policy pi_theta (= pi* when ``at_target``; a random geometric mix of a random policy and pi*
    concentrated near pi* when ``toward_target``) and a prompt-only error ``Delta(x)``.
    """
    g = generator
    logp_ref = torch.log_softmax(torch.randn(n, p, k, generator=g, dtype=F64), -1)
    reward = torch.rand(n, p, k, generator=g, dtype=F64)
    beta = 0.5 + 2.5 * torch.rand(n, 1, 1, generator=g, dtype=F64)
    log_z = log_partition(logp_ref, beta * reward).unsqueeze(-1)  # [n, p, 1]
    pi_b = torch.softmax(torch.randn(n, p, k, generator=g, dtype=F64), -1)
    w = torch.rand(n, p, k, generator=g, dtype=F64) ** 3 * 5
    if unit_mean:
        w = w / (pi_b * w).sum(-1, keepdim=True)
    if at_target:
        logp = target_logprobs(logp_ref, beta * reward)
    else:
        scale = torch.rand(n, 1, 1, generator=g, dtype=F64) * 2
        logp = torch.log_softmax(scale * torch.randn(n, p, k, generator=g, dtype=F64), -1)
        if toward_target:
            mix = 1 - torch.rand(n, 1, 1, generator=g, dtype=F64) ** 2
            logp = torch.log_softmax(mix * target_logprobs(logp_ref, beta * reward) + (1 - mix) * logp, -1)
    delta_err = torch.randn(n, p, 1, generator=g, dtype=F64) * torch.rand(n, 1, 1, generator=g, dtype=F64)
    d_exact = tb_residual(logp, logp_ref, reward, log_z, beta)
    d_psi = tb_residual(logp, logp_ref, reward, log_z + delta_err, beta)
    j_z = (pi_b * w * d_exact**2).sum(-1).mean(-1)
    j_psi = (pi_b * w * d_psi**2).sum(-1).mean(-1)
    e_d2 = (delta_err.squeeze(-1) ** 2).mean(-1)
    bound = e_d2 + 2 * e_d2.sqrt() * j_z.sqrt()
    return (j_psi - j_z).abs(), bound, e_d2, j_z


@register_check("disa.prop4.envelope", layer="sim", expected=Verdict.VERIFIED)
def prop4_envelope(seed: int) -> CheckResult:
    """max |J_Zpsi - J_Z| / bound over 4000 random instances (<= 1), = 1 at pi = pi*; non-unit-mean weights reported."""
    g = torch.Generator().manual_seed(seed)
    gap, bound, _, _ = envelope_instances(4000, 5, 6, g)
    ratio = float((gap / bound).max())
    gap_t, bound_t, _, jz_t = envelope_instances(200, 5, 6, g, at_target=True)
    tight = gap_t / bound_t
    gap_n, bound_n, _, _ = envelope_instances(4000, 5, 6, g, unit_mean=False)
    ratio_n = float((gap_n / bound_n).max())
    # float64: the tight case is an identity (J_Z = 0 up to ~1e-30); 1e-9 covers rounding of the ratio.
    ok = ratio <= 1 + 1e-9 and float((tight - 1).abs().max()) < 1e-9 and float(jz_t.max()) < 1e-20
    return CheckResult(
        Verdict.VERIFIED if ok else Verdict.REFUTED,
        f"unit-mean weights: max ratio |J_Zpsi-J_Z|/bound = {ratio:.4f} over 4000 random instances; at pi=pi*: ratio "
        f"{float(tight.min()):.6f}..{float(tight.max()):.6f} (tight); weights not unit-mean: max ratio {ratio_n:.2f}",
        numbers={
            "max_ratio": ratio,
            "tight_min": float(tight.min()),
            "tight_max": float(tight.max()),
            "max_ratio_nonunit": ratio_n,
        },
        figure="fig06_envelope",
    )


# ----------------------------------------------------------------------------- beyond
def biased_loss(logits: torch.Tensor, log_star: torch.Tensor, b) -> torch.Tensor:
    """``L = E_pi[(b + log pi/pi*)^2]`` via :func:`objectives.tb.tb_residual` with pi_ref = pi*, r = 0,
    log Z = b (so delta = b + log pi - log pi*). ``logits [..., K]`` may hold -inf (a face of the
    simplex; 0 log^2 0 = 0). ``b`` broadcasts against ``[...]``."""
    lp = torch.log_softmax(logits, -1)
    pi = lp.exp()
    live = pi > 0
    safe = torch.where(live, lp, torch.zeros_like(lp))
    b = torch.as_tensor(b, dtype=lp.dtype)
    d = tb_residual(safe, log_star.expand_as(safe), torch.zeros_like(safe), b.unsqueeze(-1).expand_as(safe), 0.0)
    return torch.where(live, pi * d * d, torch.zeros_like(pi)).sum(-1)


@register_check("disa.beyond.local_threshold", layer="sim", expected=Verdict.VERIFIED)
def local_threshold(seed: int) -> CheckResult:
    """Autograd Hessian of L in the logits at pi* vs 2(1+b)(diag pi* - pi* pi*^T); tangent-space eigenvalue sign vs b."""
    g = torch.Generator().manual_seed(seed)
    k = 5
    log_star = torch.log_softmax(torch.randn(k, generator=g, dtype=F64), -1)
    ps = log_star.exp()
    fisher = torch.diag(ps) - torch.outer(ps, ps)
    # tangent basis: orthonormal complement of the all-ones direction (softmax shift invariance)
    basis = torch.linalg.qr(torch.cat([torch.ones(k, 1, dtype=F64), torch.eye(k, dtype=F64)[:, : k - 1]], 1))[0][:, 1:]
    bs = (-1.3, -1.05, -1.01, -0.99, -0.95, -0.5, 0.0, 0.4)
    errs, mins = [], []
    for b in bs:
        hess = torch.autograd.functional.hessian(lambda u: biased_loss(u, log_star, b), log_star.clone())
        errs.append(float((hess - 2 * (1 + b) * fisher).abs().max()))
        mins.append(float(torch.linalg.eigvalsh(basis.T @ hess @ basis).min()))
    signs_ok = all((m > 0) == (b > -1) for b, m in zip(bs, mins))
    ok = max(errs) < 1e-9 and signs_ok  # float64 autograd Hessian of O(1) values
    return CheckResult(
        Verdict.VERIFIED if ok else Verdict.REFUTED,
        f"Hessian at pi* = 2(1+b)(diag pi* - pi* pi*^T) to {max(errs):.1e}; min tangent eigenvalue "
        + ", ".join(f"b={b}: {m:+.3f}" for b, m in zip(bs, mins)),
        numbers={"max_hessian_err": max(errs), **{f"min_eig_b{b}": m for b, m in zip(bs, mins)}},
        figure="fig05_bias_landscape",
    )


def simplex_min(
    log_star: torch.Tensor, b: torch.Tensor, starts: int = 4, steps: int = 250, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Numeric global minimum of ``L`` over the simplex: multistart Adam on every face.

    ``log_star [n, K]`` (K <= 5), ``b [n, nb]``. Every nonempty support subset is searched
    (logits -inf off the support) from ``starts`` random inits plus pi* restricted to the face.
    Returns ``[n, nb]`` the smallest loss found.
    """
    n, k = log_star.shape
    nb = b.shape[1]
    subsets = torch.tensor([[(s >> i) & 1 for i in range(k)] for s in range(1, 2**k)], dtype=torch.bool)  # [S, K]
    S = subsets.shape[0]
    init = torch.randn(n, nb, S, starts, k, generator=generator, dtype=F64) * 2
    init[..., 0, :] = log_star[:, None, None, :]
    u = init.clone().requires_grad_(True)
    mask = subsets[None, None, :, None, :].expand(n, nb, S, starts + 0, k)
    ls = log_star[:, None, None, None, :]
    bb = b[:, :, None, None]
    opt = torch.optim.Adam([u], lr=0.05)
    for _ in range(steps):
        opt.zero_grad()
        loss = biased_loss(u.masked_fill(~mask, float("-inf")), ls, bb)
        loss.sum().backward()
        opt.step()
    with torch.no_grad():
        loss = biased_loss(u.masked_fill(~mask, float("-inf")), ls, bb)
    return loss.flatten(2).amin(-1)


@register_check("disa.beyond.global_threshold", layer="sim", expected=Verdict.VERIFIED)
def global_threshold(seed: int) -> CheckResult:
    """Random instances (K = 3, 4): numeric global min of L at b slightly above / below the conjectured
    threshold b_c = 1/2 log(1 - min pi*) (+-0.01, +-0.05), at b_c/2 and at b = 0.3; agreement rate with the conjecture."""
    g = torch.Generator().manual_seed(seed)
    agree, total, worst = 0, 0, 0.0
    details = {}
    for k, n in ((3, 30), (4, 16)):
        log_star = torch.log_softmax(torch.randn(n, k, generator=g, dtype=F64) * 1.2, -1)
        bc = 0.5 * torch.log1p(-log_star.exp().min(-1).values)  # [n]
        offs = torch.tensor([-0.05, -0.01, 0.01, 0.05], dtype=F64)
        b = torch.cat([bc[:, None] + offs, (bc / 2)[:, None], torch.full((n, 1), 0.3, dtype=F64)], 1)  # [n, 6]
        mins = simplex_min(log_star, b, generator=g)
        below = mins < b**2 - 1e-9  # some pi beats pi* (L(pi*) = b^2)
        predicted = b < bc[:, None]
        agree += int((below == predicted).sum())
        total += below.numel()
        # largest improvement over b^2 found where the conjecture says pi* is global
        gain = torch.where(~predicted, b**2 - mins, torch.zeros_like(mins))
        worst = max(worst, float(gain.max()))
        details[f"K{k}_agree"] = float((below == predicted).to(F64).mean())
    rate = agree / total
    verdict = Verdict.VERIFIED if agree == total else (Verdict.PARTLY if rate > 0.5 else Verdict.REFUTED)
    return CheckResult(
        verdict,
        f"conjecture b_c = 1/2 log(1 - min pi*) agrees with the numeric global minimum in {agree}/{total} "
        f"(instance, b) cases (K=3: {details['K3_agree']:.3f}, K=4: {details['K4_agree']:.3f}); largest violation "
        f"L(pi*) - min L above b_c = {worst:.2e}",
        numbers={"agreement": rate, "cases": total, "max_violation_above_threshold": worst, **details},
        figure="fig05_bias_landscape",
    )


# ----------------------------------------------------------------------------- empirical (App. D)
@register_check("disa.d3.m_study", layer="sim", expected=Verdict.PARTLY)
def d3_m_study(seed: int) -> CheckResult:
    """The App. D.3 protocol on 12 token-tree prompts (pool 512, 400 subsamples per M): monotone decrease of
    variance and relative bias, and whether the curves flatten *at* M = 8 (log-log slope after 8 less
    than half the slope before) or follow one power law."""
    import numpy as np

    from tiltlab.sim.figures.fig02_m_study import m_study, summarize

    res = m_study(P=12, pool=512, reps=400, seed=seed)
    s = summarize(res)
    M = np.asarray(res["M"], dtype=float)
    i8 = list(res["M"]).index(8)

    def slopes(y):
        y = np.log(np.asarray(y))
        return float((y[i8] - y[0]) / (np.log(8))), float((y[-1] - y[i8]) / (np.log(M[-1] / 8)))

    v_before, v_after = slopes(s["mean_var"])
    b_before, b_after = slopes(s["median_rel_bias"])
    monotone = s["var_monotone"] and s["bias_monotone"]
    knee = abs(v_after) < 0.5 * abs(v_before) and abs(b_after) < 0.5 * abs(b_before)
    verdict = Verdict.VERIFIED if (monotone and knee) else (Verdict.PARTLY if monotone else Verdict.REFUTED)
    return CheckResult(
        verdict,
        f"variance and median relative bias decrease monotonically: {monotone}; M=1->8 drops {100 * s['var_drop_1_to_8']:.0f}% / "
        f"{100 * s['bias_drop_1_to_8']:.0f}%, extra 8->16 gain {100 * s['var_extra_8_to_16_pp']:.1f} / "
        f"{100 * s['bias_extra_8_to_16_pp']:.1f} pp; log-log slopes before/after M=8: variance {v_before:.2f}/{v_after:.2f}, bias "
        f"{b_before:.2f}/{b_after:.2f} -> {'a knee at 8' if knee else 'one ~1/M power law: the flattening is the linear-axis view, not a knee at 8'}",
        numbers={
            **{k: v for k, v in s.items() if not isinstance(v, list)},
            "var_slope_before": v_before,
            "var_slope_after": v_after,
            "bias_slope_before": b_before,
            "bias_slope_after": b_after,
            "knee_at_8": knee,
        },
        figure="fig02_m_study",
    )


@register_check("disa.sens.proposal", layer="sim", expected=Verdict.VERIFIED)
def sens_proposal(seed: int) -> CheckResult:
    """Exact label statistics for tilted proposals alpha = 0..1 on 8 token-tree prompts (M = 8): E[Z_hat]/Z = 1
    for every alpha, Var(log Z_hat_8) increases as the proposal weakens (alpha decreases)."""
    import numpy as np

    from tiltlab.sim.figures.fig04_proposal_strength import tilt_label_stats

    st = tilt_label_stats(8, seed)
    dev = float(np.abs(st["mean_ratio"] - 1).max())
    v = st["var"].mean(1)
    monotone = bool(np.all(np.diff(v) < 0))
    ok = dev < 1e-9 and monotone  # float64 exact enumeration (9 compositions per prompt)
    return CheckResult(
        Verdict.VERIFIED if ok else Verdict.REFUTED,
        f"max |E[Z_8]/Z - 1| = {dev:.1e} over alpha in [0,1]; mean Var(log Z_8): alpha=0 {v[0]:.3f}, alpha=0.5 {v[5]:.4f}, "
        f"alpha=0.9 {v[9]:.1e}, alpha=1 {v[10]:.1e} (strictly decreasing in alpha: {monotone})",
        numbers={
            "max_mean_dev": dev,
            "var_alpha0": float(v[0]),
            "var_alpha05": float(v[5]),
            "var_alpha09": float(v[9]),
            "monotone": monotone,
        },
        figure="fig04_proposal_strength",
    )


@register_check("disa.open.truncated_proposal", layer="sim", expected=Verdict.VERIFIED)
def open_truncated_proposal(seed: int) -> CheckResult:
    """Token-level top-k / top-p teachers on 8 token-tree prompts: MC E[Z_hat_8]/Z against pi*(supp q)."""
    import numpy as np

    from tiltlab.sim.figures.fig04_proposal_strength import truncation_stats

    st = truncation_stats(8, seed, reps=1500)
    # single-sequence supports have zero MC spread: 1e-12 is float64 rounding of Z_hat / Z
    z = np.abs(st["ratio"] - st["supp_mass"]) / (st["ratio_se"] + 1e-12)
    worst = float(z.max())
    min_mass = float(st["supp_mass"].min())
    i = int(np.argmin(st["supp_mass"].mean(1)))
    # 4.5 sigma over 56 (truncation, prompt) cells: family-wise false alarm ~4e-4
    ok = worst < 4.5 and min_mass < 0.9
    full_dev = float(np.abs(st["ratio_fullq"] - 1).max())
    return CheckResult(
        Verdict.VERIFIED if ok else Verdict.REFUTED,
        f"E[Z_8]/Z = pi*(supp q) within MC error (max |z| = {worst:.2f} over {z.size} cells); tilted mass kept ranges "
        f"{min_mass:.3f}..{float(st['supp_mass'].max()):.3f}; {st['name'][i]}: mean LSE label bias {st['lse_bias'][i].mean():+.2f} nats "
        f"vs log pi*(supp) {st['pred_bias'][i].mean():+.2f}; weights from the untruncated teacher: |E[Z]/Z - 1| up to {full_dev:.2f}",
        numbers={
            "max_z": worst,
            "min_support_mass": min_mass,
            "lse_bias_most_truncated": float(st["lse_bias"][i].mean()),
            "pred_bias_most_truncated": float(st["pred_bias"][i].mean()),
            "fullq_max_dev": full_dev,
        },
        figure="fig04_proposal_strength",
    )


@register_check("disa.sens.beta_cliff", layer="sim", expected=Verdict.VERIFIED)
def sens_beta_cliff(seed: int) -> CheckResult:
    """Label statistics vs beta (8 token-tree prompts, q = pi_ref and a fixed teacher) and a short TB run with
    the frozen label vs exact log Z (``sim.run``, 4 optimizer steps per batch) at beta = 0.25, 1, 16."""
    import numpy as np

    from tiltlab.sim.figures.fig03_beta_sensitivity import label_vs_beta, training_vs_beta

    lab = label_vs_beta(8, seed, betas=(0.25, 1.0, 4.0, 16.0), reps=200)
    tr = training_vs_beta(True, seed, betas=(0.25, 1.0, 16.0))
    v_ref = lab["ref"]["var"].mean(1)
    maxw = lab["teacher"]["maxw"].mean(1)
    tvf, tve = np.asarray(tr["tv_frozen_inner4"]), np.asarray(tr["tv_exact_inner4"])
    excess = tvf - tve
    label_cliff = bool(v_ref[-1] > 100 * v_ref[0] and maxw[-1] > maxw[0])
    train_cliff = bool(excess[-1] > 0.02 and excess[-1] > 3 * max(excess[0], 0.005))
    # plateau: at small beta the frozen label costs little (excess TV at beta <= 1 below a quarter of beta = 16's)
    plateau = bool(max(excess[0], excess[1]) < 0.25 * excess[-1])
    n = label_cliff + train_cliff + plateau
    verdict = Verdict.VERIFIED if n == 3 else (Verdict.PARTLY if n >= 1 else Verdict.REFUTED)
    return CheckResult(
        verdict,
        f"label: Var(log Z_8) with q=pi_ref {v_ref[0]:.1e} (beta=0.25) -> {v_ref[-1]:.1f} (beta=16), teacher max normalized weight "
        f"{maxw[0]:.2f} -> {maxw[-1]:.2f}; training: excess TV over exact log Z {excess[0]:+.4f} (beta=0.25), {excess[1]:+.4f} (1), "
        f"{excess[-1]:+.4f} (16) (plateau at small beta: {plateau}; cliff at large beta: {train_cliff}); note: with q = pi_ref "
        "the failure is M-samples with no correct draw (equal weights, label ~0), not only few dominant weights",
        numbers={
            "var_ref_b025": float(v_ref[0]),
            "var_ref_b16": float(v_ref[-1]),
            "maxw_teacher_b16": float(maxw[-1]),
            "excess_b025": float(excess[0]),
            "excess_b1": float(excess[1]),
            "excess_b16": float(excess[-1]),
            "label_cliff": label_cliff,
            "train_cliff": train_cliff,
            "plateau": plateau,
        },
        figure="fig03_beta_sensitivity",
    )
