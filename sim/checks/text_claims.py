"""Numeric checks of claims from the papers' text (remarks, section statements, figure readings).

``disa.remark2.calibration``   DISA §2.2 Remark 2: calibration errors in log Z distort policy updates.
``disa.stage2.denoising``      DISA §2.2 Stage 2: the regressor denoises the Stage-1 labels.
``paced.eq5.tb_kl_gradient``   PACED-RL §3 eq. (5): TB and KL(pi||pi*) have the same expected gradient.
``paced.s53.retains_near_tau`` PACED-RL §5.3: the schedule keeps selecting prompts near tau as the policy improves.
``fpa.s22.future_favours_correct`` FPA §2.2: the future policy puts more mass on correct answers.
``fpa.fig3.offrl_collapse``    FPA §3.3 / Fig. 3: Off-RL training collapses below the starting accuracy.
``lad.c1.exact_matching``      LAD §4.3 / App. C.1 (Table 5's *): only TV, HD, JS force exact matching.
``lad.fig2.practical_theory_align`` LAD §4.4 / Fig. 2: practical and theoretical LAD follow the same path.
``lad.b3.proof_constant``      LAD App. B.3: Theorem B.1's proof constant C and the number of responses.

Every formula comes from ``tiltlab.objectives`` (or the simulator's exact helpers); each check
states its criterion in its docstring and its claim statement, and records per-item outcomes.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch

from tiltlab.claims import stats
from tiltlab.claims.pinned import residual
from tiltlab.claims.registry import CheckResult, Verdict, register_check
from tiltlab.objectives import estimators as est
from tiltlab.objectives import lad as lad_obj
from tiltlab.objectives import paced as paced_obj
from tiltlab.objectives import pg as pg_obj
from tiltlab.objectives.metrics import tv_distance
from tiltlab.objectives.offline import future_policy_logprobs, offrl_loss
from tiltlab.objectives.tb import tb_residual
from tiltlab.sim.exact import log_partition, target_logprobs
from tiltlab.sim.experiments import fpa_entanglement, lad, logz_training
from tiltlab.sim.train import kl_divergence

V = Verdict
F64 = torch.float64


# ----------------------------------------------------------------------------- DISA Remark 2
#: ``disa.remark2.calibration``: the on-policy expected update "changes" when its relative difference across b
#: exceeds REMARK2_REL_TOL (float64 round-off ~1e-16); the off-policy gradient at pi* is "nonzero" above
#: REMARK2_GRAD_TOL; a trained TV below REMARK2_TV_FLOOR counts as at pi* (the 10x comparison uses the floor).
REMARK2_REL_TOL, REMARK2_GRAD_TOL, REMARK2_TV_FLOOR = 1e-10, 1e-3, 1e-4


@register_check(
    "disa.remark2.calibration",
    layer="sim",
    expected=V.PARTLY,
    name="onpolicy_vs_offpolicy",
    expected_items={
        "onpolicy_expected_update_changes": False,
        "onpolicy_variance_changes": True,
        "offpolicy_update_changes": True,
    },
    pins={
        "max_rel_diff": residual(REMARK2_REL_TOL),
        "tv_b0": residual(REMARK2_TV_FLOOR),
        # reported, not judged: the b = 0 control of the "gradient at pi* nonzero" criterion (grad_b05)
        "grad_b0": residual(REMARK2_GRAD_TOL),
    },
)
def remark2_calibration(seed: int) -> CheckResult:
    """A prompt-level log Z error b: does it change the policy update? On-policy semi-gradient (DISA's
    Stage 3 as written): expected update identical for every b (relative difference < 1e-10), only the
    sampled-gradient variance changes (max/min variance over b > 1.5). Fixed behaviour policy: the
    gradient at pi* is nonzero for b = 0.5 (> 1e-3) and training settles > 10x farther from pi*.
    Holds off-policy only -> partly."""
    inv = logz_training.semigradient_invariance(seed)
    off = logz_training.offpolicy_drift(seed)
    var = [v for k, v in inv.items() if k.startswith("grad_var_b")]
    items = {
        "onpolicy_expected_update_changes": inv["max_rel_diff"] > REMARK2_REL_TOL,
        "onpolicy_variance_changes": max(var) / min(var) > 1.5,
        "offpolicy_update_changes": off["grad_b05"] > REMARK2_GRAD_TOL
        and off["tv_b05"] > 10 * max(off["tv_b0"], REMARK2_TV_FLOOR),
    }
    if items["onpolicy_expected_update_changes"] and items["offpolicy_update_changes"]:
        verdict = V.VERIFIED
    elif items["offpolicy_update_changes"] or items["onpolicy_expected_update_changes"]:
        verdict = V.PARTLY
    else:
        verdict = V.REFUTED
    return CheckResult(
        verdict,
        f"on-policy semi-gradient: expected update differs across log Z errors by {inv['max_rel_diff']:.1e} (relative; "
        f"invariant), gradient variance {min(var):.2e}..{max(var):.2e}; fixed behaviour policy, b=0.5: |grad| at pi* "
        f"{off['grad_b05']:.3f}, trained TV(pi, pi*) {off['tv_b05']:.3f} vs {off['tv_b0']:.1e} at b=0 — the error "
        "distorts updates only off-policy (importance-weighted or replayed samples)",
        numbers={**inv, **off},
        items=items,
    )


# ----------------------------------------------------------------------------- DISA Stage 2
STAGE2_PROMPTS, STAGE2_M, STAGE2_BETA, STAGE2_DEGREE, STAGE2_DRAWS = 256, 8, 2.0, 5, 5


def stage2_denoising(seed: int, M: int = STAGE2_M, degree: int = STAGE2_DEGREE) -> dict:
    """Toy Stage 2: prompts with a difficulty feature d ~ U(-3, 3), pass rate sigmoid(d), binary
    reward; Stage-1 labels ``log_partition_lse(beta r)`` from M = 8 samples of pi_ref; a degree-5
    polynomial least-squares regressor on d fit on 256 training prompts; on 256 held-out prompts,
    mean squared error to the exact log Z of the regressor vs of the held-out prompts' own labels.
    Averaged over 5 label draws."""
    g = torch.Generator().manual_seed(seed)
    out = {"mse_labels": 0.0, "mse_regressor": 0.0, "bias_labels": 0.0, "bias_regressor": 0.0}
    for _ in range(STAGE2_DRAWS):
        d = 6 * torch.rand(2 * STAGE2_PROMPTS, generator=g, dtype=F64) - 3
        p = torch.sigmoid(d)
        logp_ref = torch.stack([torch.log1p(-p), torch.log(p)], -1)  # outcomes (wrong, right)
        exact = log_partition(logp_ref, torch.tensor([0.0, STAGE2_BETA], dtype=F64))
        r = (torch.rand(2 * STAGE2_PROMPTS, M, generator=g, dtype=F64) < p[:, None]).to(F64)
        labels = est.log_partition_lse(STAGE2_BETA * r)  # q = pi_ref: log w = beta r
        X = torch.stack([d**k for k in range(degree + 1)], -1)
        tr, te = slice(0, STAGE2_PROMPTS), slice(STAGE2_PROMPTS, None)
        coef = torch.linalg.lstsq(X[tr], labels[tr, None]).solution
        pred = (X[te] @ coef).squeeze(-1)
        out["mse_labels"] += float(((labels[te] - exact[te]) ** 2).mean()) / STAGE2_DRAWS
        out["mse_regressor"] += float(((pred - exact[te]) ** 2).mean()) / STAGE2_DRAWS
        out["bias_labels"] += float((labels[te] - exact[te]).mean()) / STAGE2_DRAWS
        out["bias_regressor"] += float((pred - exact[te]).mean()) / STAGE2_DRAWS
    return out


@register_check(
    "disa.stage2.denoising",
    layer="sim",
    expected=V.VERIFIED,
    name="toy_regressor_heldout",
    expected_items={"regressor_closer_than_labels": True, "regressor_keeps_label_bias": True},
)
def stage2_denoising_check(seed: int) -> CheckResult:
    """Verified when the held-out regressor predictions are closer (MSE) to the exact log Z than the raw
    labels; the regressor averages noise, not the log-Jensen bias (recorded: both biases negative)."""
    n = stage2_denoising(seed)
    items = {
        "regressor_closer_than_labels": n["mse_regressor"] < n["mse_labels"],
        "regressor_keeps_label_bias": n["bias_regressor"] < 0 and n["bias_labels"] < 0,
    }
    return CheckResult(
        V.VERIFIED if items["regressor_closer_than_labels"] else V.REFUTED,
        f"TOY (log Z a smooth function of one known prompt feature; M={STAGE2_M}, beta={STAGE2_BETA:g}, "
        f"{STAGE2_DRAWS} draws): held-out MSE to exact log Z: regressor {n['mse_regressor']:.2e} vs raw labels "
        f"{n['mse_labels']:.2e}; mean error regressor {n['bias_regressor']:+.3f}, labels {n['bias_labels']:+.3f} "
        "(denoising removes variance, not the log-Jensen bias)",
        numbers=n,
        items=items,
    )


# ----------------------------------------------------------------------------- PACED eq. 5
def tb_kl_gradients(seed: int, K: int = 6, beta: float = 1.5, b: float = 0.7) -> dict:
    """Exact gradients at a random softmax policy of: the on-policy semi-gradient TB loss
    ``E_{sg(pi)}[delta^2]``, the full-gradient ``E_pi[delta^2]``, the off-policy ``E_q[delta^2]``,
    against ``2 grad KL(pi || pi*)``; delta from ``objectives.tb.tb_residual`` with log Z = log Z* + b."""
    g = torch.Generator().manual_seed(seed)
    logp_ref = torch.log_softmax(torch.randn(K, generator=g, dtype=F64), -1)
    reward = (torch.rand(K, generator=g, dtype=F64) < 0.4).to(F64)
    log_star = target_logprobs(logp_ref, beta * reward)
    log_z = log_partition(logp_ref, beta * reward) + b
    q = torch.softmax(torch.randn(K, generator=g, dtype=F64), -1)
    theta0 = torch.randn(K, generator=g, dtype=F64)

    def grad(kind: str) -> torch.Tensor:
        th = theta0.clone().requires_grad_(True)
        lp = torch.log_softmax(th, -1)
        if kind == "kl":
            loss = 2 * kl_divergence(lp, log_star)
        else:
            d = tb_residual(lp, logp_ref, reward, log_z, beta=beta)
            w = {"semi": lp.exp().detach(), "full": lp.exp(), "off": q}[kind]
            loss = (w * d * d).sum()
        return torch.autograd.grad(loss, th)[0]

    ref = grad("kl")
    rel = {k: float((grad(k) - ref).norm() / ref.norm()) for k in ("semi", "full", "off")}
    return {f"rel_diff_{k}": v for k, v in rel.items()}


#: ``paced.eq5.tb_kl_gradient``: "equal" = relative difference to 2 grad KL(pi||pi*) below this (float64 ~1e-16).
TB_KL_EQUAL_REL = 1e-10


@register_check(
    "paced.eq5.tb_kl_gradient",
    layer="sim",
    expected=V.PARTLY,
    name="exact_gradients",
    expected_items={"semi_onpolicy_equal": True, "full_gradient_equal": False, "offpolicy_equal": False},
    pins={"rel_diff_semi": residual(TB_KL_EQUAL_REL)},  # rel_diff_full / rel_diff_off: large effects, exact
)
def tb_kl_gradient(seed: int) -> CheckResult:
    """Equal = relative difference to 2 grad KL(pi||pi*) below 1e-10 (float64 round-off ~1e-16). True for
    the on-policy semi-gradient only -> partly; refuted if even that differs."""
    n = tb_kl_gradients(seed)
    items = {
        "semi_onpolicy_equal": n["rel_diff_semi"] < TB_KL_EQUAL_REL,
        "full_gradient_equal": n["rel_diff_full"] < TB_KL_EQUAL_REL,
        "offpolicy_equal": n["rel_diff_off"] < TB_KL_EQUAL_REL,
    }
    verdict = V.REFUTED if not items["semi_onpolicy_equal"] else (V.VERIFIED if all(items.values()) else V.PARTLY)
    return CheckResult(
        verdict,
        "softmax K=6, log Z = log Z* + 0.7: relative |grad - 2 grad KL(pi||pi*)|: on-policy semi-gradient "
        f"{n['rel_diff_semi']:.1e}, full gradient of E_pi[delta^2] {n['rel_diff_full']:.2f}, fixed behaviour q "
        f"{n['rel_diff_off']:.2f} (the equivalence needs sg(pi) sampling)",
        numbers=n,
        items=items,
    )


# ----------------------------------------------------------------------------- PACED §5.3
RETAIN_SHIFTS = (0.0, 1.0, 2.0)


def retains_near_tau(seed: int, P: int = 64, m: int = 16, M: int = 8, beta: float = 2.0, tau: float = 0.5) -> dict:
    """Prompts with pass rate sigmoid(d + s) at policy stages s in RETAIN_SHIFTS (the policy improves,
    pass rates rise); at each stage PACED selects m of P prompts by |p_hat - tau| with p_hat from
    log_partition_lse labels of M samples of the current policy (``pass_rate_from_log_z``). Mean
    |p - tau| of the chosen prompts vs of the pool, over 20 label draws per stage."""
    g = torch.Generator().manual_seed(seed)
    d = 6 * torch.rand(P, generator=g, dtype=F64) - 4
    out = {}
    for s in RETAIN_SHIFTS:
        p = torch.sigmoid(d + s)
        chosen = []
        for _ in range(20):
            r = (torch.rand(P, M, generator=g, dtype=F64) < p[:, None]).to(F64)
            p_hat = est.pass_rate_from_log_z(est.log_partition_lse(beta * r), beta=beta)
            idx = paced_obj.select_prompts(p_hat, tau=tau, m=m)
            chosen.append(float((p[idx] - tau).abs().mean()))
        out[f"s{s:g}_chosen_dist"] = float(np.mean(chosen))
        out[f"s{s:g}_pool_dist"] = float((p - tau).abs().mean())
        out[f"s{s:g}_pool_mean"] = float(p.mean())
    return out


@register_check(
    "paced.s53.retains_near_tau",
    layer="sim",
    expected=V.VERIFIED,
    name="selection_across_stages",
    expected_items={f"stage{s:g}_chosen_nearer": True for s in RETAIN_SHIFTS},
)
def retains_near_tau_check(seed: int) -> CheckResult:
    """Verified when at every stage the chosen prompts are nearer tau (mean |p - tau|) than the pool."""
    n = retains_near_tau(seed)
    items = {f"stage{s:g}_chosen_nearer": n[f"s{s:g}_chosen_dist"] < n[f"s{s:g}_pool_dist"] for s in RETAIN_SHIFTS}
    return CheckResult(
        V.of_items(items.values()),
        "pool pass rate / mean |p - tau| of chosen vs pool, by stage: "
        + "; ".join(
            f"{n[f's{s:g}_pool_mean']:.2f}: {n[f's{s:g}_chosen_dist']:.3f} vs {n[f's{s:g}_pool_dist']:.3f}"
            for s in RETAIN_SHIFTS
        ),
        numbers=n,
        items=items,
    )


# ----------------------------------------------------------------------------- FPA §2.2
FUTURE_LAMBDAS = (1.0, 2.0)


def future_policy_mass(seed: int, P: int = 64, K: int = 16, N: int = 8, steps: int = 20, lr: float = 1.0) -> dict:
    """Softmax bandit per prompt (K answers, about a third correct): Off-RL (``offrl_loss``, |y| = 1) on
    N offline samples of pi_ref per prompt, ``steps`` SGD steps; mass on the correct answers under
    pi_ref, pi_theta and the future policy (``future_policy_logprobs``) for each lambda."""
    g = torch.Generator().manual_seed(seed)
    h_ref = torch.randn(P, K, generator=g, dtype=F64)
    correct = torch.rand(P, K, generator=g, dtype=F64) < 1 / 3
    idx = torch.multinomial(torch.softmax(h_ref, -1), N, replacement=True, generator=g)  # [P, N]
    R = correct.gather(-1, idx).to(F64) * 2 - 1
    th = h_ref.clone().requires_grad_(True)
    for _ in range(steps):
        lp = torch.log_softmax(th, -1).gather(-1, idx)
        loss = offrl_loss(lp.reshape(-1), torch.ones(P * N, dtype=F64), R.reshape(-1)).loss
        (gr,) = torch.autograd.grad(loss, th)
        th = (th - lr * P * gr).detach().requires_grad_(True)  # lr per prompt (the loss averages over P*N)

    def mass(logp: torch.Tensor) -> float:
        return float((logp.exp() * correct).sum(-1).mean())

    all_ids = torch.arange(K).expand(P, K)
    out = {"mass_ref": mass(torch.log_softmax(h_ref, -1)), "mass_theta": mass(torch.log_softmax(th.detach(), -1))}
    for lam in FUTURE_LAMBDAS:
        lf = future_policy_logprobs(
            th.detach()[:, None, :].expand(P, K, K), h_ref[:, None, :].expand(P, K, K), all_ids, lam=lam
        )
        out[f"mass_future_lam{lam:g}"] = mass(lf)
    return out


@register_check(
    "fpa.s22.future_favours_correct",
    layer="sim",
    expected=V.VERIFIED,
    name="bandit_offrl",
    expected_items={f"future_above_theta_lam{lam:g}": True for lam in FUTURE_LAMBDAS} | {"theta_above_ref": True},
)
def future_favours_correct(seed: int) -> CheckResult:
    """Verified when the future policy's mass on correct answers exceeds the trained policy's, which
    exceeds pi_ref's, for lambda = 1 and 2 (bandit: no tokens shared between answers)."""
    n = future_policy_mass(seed)
    items = {"theta_above_ref": n["mass_theta"] > n["mass_ref"]} | {
        f"future_above_theta_lam{lam:g}": n[f"mass_future_lam{lam:g}"] > n["mass_theta"] for lam in FUTURE_LAMBDAS
    }
    return CheckResult(
        V.VERIFIED if all(items.values()) else V.REFUTED,
        f"bandit, Off-RL on 8 offline samples per prompt: mass on correct answers pi_ref {n['mass_ref']:.3f}, pi_theta "
        f"{n['mass_theta']:.3f}, future policy "
        + ", ".join(f"lambda={lam:g} {n[f'mass_future_lam{lam:g}']:.3f}" for lam in FUTURE_LAMBDAS),
        numbers=n,
        items=items,
    )


# ----------------------------------------------------------------------------- FPA §3.3 / Fig. 3
#: ``fpa.fig3.offrl_collapse``: smallest accuracy drop of interest (one percentage point).
COLLAPSE_MARGIN = 0.01


def collapse_verdict(diffs: list[float]) -> tuple[V, stats.Decision]:
    """Per-seed start accuracy minus Off-RL's final accuracy (positive = collapse, the paper's direction):
    95% paired t interval above +margin -> verified, below -margin -> refuted, else inconclusive."""
    d = stats.decide({"offrl_below_start": diffs}, COLLAPSE_MARGIN, "greater")
    return V(d.verdict), d


@register_check(
    "fpa.fig3.offrl_collapse",
    layer="sim",
    expected=V.INCONCLUSIVE,
    name="token_tree_direction",
    expected_items={
        "offrl_below_start": False,
        "offrl_above_start": False,
        "correct_only_below_start": False,
        "offrl_trained": True,
    },
)
def offrl_collapse(seed: int) -> CheckResult:
    """The fpa.entanglement runs (token tree, 20 paired seeds, 120 SGD steps): does Off-RL's final accuracy fall
    below the reference policy's (:func:`collapse_verdict`)? Correct-only FPA's is recorded. The direction
    only: the step counts (~14K on Qwen, Llama) are LLM-scale and not checked."""
    claim = fpa_entanglement.entanglement_claim(seed)
    n, diffs = claim["numbers"], claim["diffs"]
    verdict, dec = collapse_verdict(diffs["offrl_below_start"])
    it = dec.items["offrl_below_start"]
    cor = stats.paired_t_ci(diffs["cor_only_below_start"])
    items = {
        "offrl_below_start": it.outcome == stats.SUPPORTS,
        "offrl_above_start": it.outcome == stats.AGAINST,
        "correct_only_below_start": cor[1] > COLLAPSE_MARGIN,
        # it ran: Off-RL moved the correct sequences' log-prob (a run that trains nothing keeps every accuracy)
        "offrl_trained": abs(n["offrl_corr"]) > fpa_entanglement.FPA_MOVES_NATS,
    }
    keys = ("ref_acc", "offrl_acc", "offrl_corr", "cor_only_acc", "fpa2_acc", "pairs")
    keys += tuple(f"d_{k}{e}" for k in ("offrl_below_start", "cor_only_below_start") for e in ("", "_lo", "_hi"))
    return CheckResult(
        verdict,
        f"token tree, {n['pairs']} paired seeds: accuracy start {n['ref_acc']:.3f} -> Off-RL {n['offrl_acc']:.3f}, "
        f"correct-only {n['cor_only_acc']:.3f} (FPA lambda=2 {n['fpa2_acc']:.3f}); start minus Off-RL {it.mean:+.3f} "
        f"[{it.lo:+.3f}, {it.hi:+.3f}] -> {it.outcome} (margin {COLLAPSE_MARGIN}); start minus correct-only "
        f"{cor[0]:+.3f} [{cor[1]:+.3f}, {cor[2]:+.3f}] (recorded); direction only, step counts LLM-scale",
        numbers={k: n[k] for k in keys},
        items=items,
        evidence=dec.judgement.evidence(),
    )


# ----------------------------------------------------------------------------- LAD §4.3 / App. C.1
LAD_PAPER_STRICT = {"kl": False, "rkl": False, "jeffreys": False, "tv": True, "hellinger": True, "js": True}


@register_check(
    "lad.c1.exact_matching",
    layer="sim",
    expected=V.REFUTED,
    name="exact_gradient_runs",
    expected_items={"kl": True, "rkl": True, "jeffreys": True, "tv": False, "hellinger": True, "js": True},
    # the f that match exactly (TV to the target -> 0); tv_tv (TV's f, ~1e-1: it does not) stays exact
    pins={f"tv_{d}": residual(lad.EXACT_MATCH_TV) for d in ("kl", "rkl", "jeffreys", "hellinger", "js")},
)
def exact_matching(seed: int) -> CheckResult:
    """lad.practical's runs: does exact-gradient LAD reach TV(pi, target) < 1e-3 (exact matching) for
    each f? The paper marks TV, HD, JS (*) as forcing exact matching and KL, rKL, JF as not. Verified
    if the measured pattern equals the paper's; refuted when both sides of the split fail (a non-*
    f matches exactly and a * f does not); partly otherwise. Items: matched exactly, per f."""
    n = lad.practical(seed)
    items = {d: n[f"tv_{d}"] < lad.EXACT_MATCH_TV for d in LAD_PAPER_STRICT}
    agree = {d: items[d] == want for d, want in LAD_PAPER_STRICT.items()}
    nonstrict_match = any(items[d] for d, s in LAD_PAPER_STRICT.items() if not s)
    strict_miss = any(not items[d] for d, s in LAD_PAPER_STRICT.items() if s)
    verdict = V.VERIFIED if all(agree.values()) else (V.REFUTED if nonstrict_match and strict_miss else V.PARTLY)
    return CheckResult(
        verdict,
        "exact matching (TV < 1e-3 after 400 exact-gradient steps): "
        + ", ".join(f"{d}{'*' if s else ''} {'yes' if items[d] else 'no'}" for d, s in LAD_PAPER_STRICT.items())
        + " — every strictly convex f matches exactly (Lemma 3.2), TV (marked *) does not",
        numbers={f"tv_{d}": n[f"tv_{d}"] for d in LAD_PAPER_STRICT},
        items=items,
    )


# ----------------------------------------------------------------------------- LAD Fig. 2
FIG2_DIVS = ("hellinger", "js")


def practical_theory_paths(seed: int, K: int = 10, steps: int = 300, lr: float = 0.5) -> dict:
    """Gradient descent (plain: Adam's sign-like first steps would make every path look alike) from
    pi_old on the exact losses of a K-armed bandit (eta = 1): practical LAD (eq. 8 in
    expectation, ``lad_loss`` with weight K pi_old), theoretical LAD (eq. 7, ``lad_theoretical_loss``)
    and GRPO + KL(pi_old) unclipped as the simulator codes it (``grpo_loss`` with exact weights K pi_old on
    the policy-gradient term; its k3 term is averaged over the K answers). Mean over the path of
    TV(pi_practical(t), pi_theoretical(t)) and TV(pi_GRPO(t), pi_theoretical(t))."""
    g = torch.Generator().manual_seed(seed)
    logp_old = torch.log_softmax(torch.randn(K, generator=g, dtype=F64), -1)
    adv = torch.randn(K, generator=g, dtype=F64)
    w = K * logp_old.exp()
    ones = torch.ones(K, 1, dtype=F64)

    def path(loss_fn) -> torch.Tensor:
        th = logp_old.clone().requires_grad_(True)
        opt = torch.optim.SGD([th], lr=lr)
        out = []
        for _ in range(steps):
            loss = loss_fn(torch.log_softmax(th, -1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            out.append(torch.log_softmax(th.detach(), -1))
        return torch.stack(out)

    def grpo(lp):
        return pg_obj.grpo_loss(
            lp[:, None],
            logp_old[:, None],
            adv,
            ones,
            clip_eps=1e6,
            token_logp_ref=logp_old[:, None],
            kl_coef=1.0,
            is_weight=w,
        ).loss

    p_grpo = path(grpo)
    out = {}
    for d in FIG2_DIVS:
        p_thm = path(lambda lp, d=d: lad_obj.lad_theoretical_loss(lp, logp_old, adv, eta=1.0, divergence=d).loss)
        p_prac = path(lambda lp, d=d: lad_obj.lad_loss(lp, logp_old, adv, eta=1.0, divergence=d, is_weight=w).loss)
        out[f"{d}_practical_vs_theory"] = float(tv_distance(p_prac, p_thm).mean())
        out[f"{d}_grpo_vs_theory"] = float(tv_distance(p_grpo, p_thm).mean())
        out[f"{d}_start_to_end"] = float(tv_distance(p_thm[-1], logp_old))
    return out


@register_check(
    "lad.fig2.practical_theory_align",
    layer="sim",
    expected=V.VERIFIED,
    name="bandit_adam_paths",
    expected_items={f"{d}_practical_closer_than_grpo": True for d in FIG2_DIVS},
)
def practical_theory_align(seed: int) -> CheckResult:
    """Verified when, for Hellinger and JS (Fig. 2's divergences), the practical path's mean TV to the
    theoretical path is below GRPO's."""
    n = practical_theory_paths(seed)
    items = {
        f"{d}_practical_closer_than_grpo": n[f"{d}_practical_vs_theory"] < n[f"{d}_grpo_vs_theory"] for d in FIG2_DIVS
    }
    return CheckResult(
        V.of_items(items.values()),
        "K=10 bandit, 300 gradient steps from pi_old, mean TV to the theoretical-LAD path: "
        + "; ".join(
            f"{d}: practical {n[f'{d}_practical_vs_theory']:.4f} vs GRPO+KL {n[f'{d}_grpo_vs_theory']:.4f} "
            f"(path length scale {n[f'{d}_start_to_end']:.3f})"
            for d in FIG2_DIVS
        ),
        numbers=n,
        items=items,
    )


# ----------------------------------------------------------------------------- LAD App. B.3
B3_SIZES = (4, 64, 1024)
B3_EPS = (1e-3, 2e-3)


B3_P_MAX = 0.5  # a policy with one dominant response (an LLM's greedy answer often holds this much)


def proof_constant(seed: int) -> dict:
    """Theorem B.1's proof constant ``C = e^{gamma/eta} N max(p_max, e^{gamma/eta}/N)`` (N = number of
    responses, p_max = B3_P_MAX, gamma = 1e-3, eta = 1) vs the measured
    ``|L_thm - L_LAD| / (gamma + delta)`` (:func:`tiltlab.sim.experiments.lad.surrogate_gap`, mean over
    32 instances) for N in B3_SIZES."""
    out = {}
    gamma = B3_EPS[0]
    for N in B3_SIZES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # two eps values: the order fit is not used here
            gap = lad.surrogate_gap(list(B3_EPS), n_inst=32, K=N, seed=seed)
        measured = max(v[0] for v in gap["gap"].values()) / (2 * gamma)
        out[f"N{N}_proof_C"] = math.exp(gamma) * N * max(B3_P_MAX, math.exp(gamma) / N)
        out[f"N{N}_measured_constant"] = measured
    return out


#: ``lad.b3.proof_constant``: the measured gap constant "grows with N" when C_meas(1024) / C_meas(4) > 1 + B3_MARGIN,
#: "does not grow" when below 1 - B3_MARGIN (a 10% change of an exact average over 32 instances), else undecided.
B3_MARGIN = 0.1


def b3_verdict(n: dict) -> V:
    """From the measured constant only (the proof's C is a formula: its growth with N holds by construction and
    decides nothing): does not grow -> verified (the bound holds with an N-independent constant here); grows ->
    partly (the O(gamma + delta) order holds, lad.thmB1, but the constant grows with N as the proof's does);
    within the margin -> inconclusive."""
    lo, hi = B3_SIZES[0], B3_SIZES[-1]
    a, b = n[f"N{lo}_measured_constant"], n[f"N{hi}_measured_constant"]
    if not (math.isfinite(a) and math.isfinite(b) and a > 0):
        raise ValueError(f"measured constants must be finite with C_meas({lo}) > 0, got {a}, {b}")
    ratio = b / a
    if ratio < 1 - B3_MARGIN:
        return V.VERIFIED
    return V.PARTLY if ratio > 1 + B3_MARGIN else V.INCONCLUSIVE


@register_check(
    "lad.b3.proof_constant",
    layer="sim",
    expected=V.VERIFIED,
    name="constant_vs_responses",
    expected_items={"proof_constant_grows": True, "measured_constant_grows": False},
)
def b3_proof_constant(seed: int) -> CheckResult:
    """Decided by the measured constant (:func:`b3_verdict`); the proof's constant C, which grows with N
    (C(1024) > 10 C(4)) by its formula, is recorded as an item, not counted."""
    n = proof_constant(seed)
    verdict = b3_verdict(n)  # first: it refuses non-finite or zero constants
    lo, hi = B3_SIZES[0], B3_SIZES[-1]
    ratio = n[f"N{hi}_measured_constant"] / n[f"N{lo}_measured_constant"]
    items = {
        "proof_constant_grows": n[f"N{hi}_proof_C"] > 10 * n[f"N{lo}_proof_C"],
        "measured_constant_grows": ratio > 1 + B3_MARGIN,
    }
    return CheckResult(
        verdict,
        f"measured max_f |L_thm - L_LAD|/(gamma+delta) vs the proof constant C = e^(gamma/eta) N max(p_max, "
        f"e^(gamma/eta)/N) at p_max = {B3_P_MAX:g}: "
        + "; ".join(f"N={N}: measured {n[f'N{N}_measured_constant']:.3g}, C {n[f'N{N}_proof_C']:.3g}" for N in B3_SIZES)
        + f"; measured C({hi})/C({lo}) = {ratio:.3f} (grows if > {1 + B3_MARGIN:g}, does not if < {1 - B3_MARGIN:g})"
        + (
            " — the gap's constant does not grow with the number of responses; the proof's C does (for an LLM, "
            "|V|^L): the bound is loose, not wrong"
            if ratio < 1 - B3_MARGIN
            else ""
        ),
        numbers=n,
        items=items,
    )
