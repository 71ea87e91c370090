"""LAD experiments on its 50-arm three-mode bandit and in closed form (LAD §4.1 Fig. 1, §4.3 Fig. 4 /
Table 5, Lemma 3.2, Thm. B.1): the Fig. 1 comparison of GRPO, FlowRL, DISA and LAD; the final distance
to the advantage distribution per f-divergence; exact-gradient convergence; the surrogate gap order.

Losses from ``objectives.lad``; training through :func:`tiltlab.sim.train.train`.
"""

from __future__ import annotations

import numpy as np
import torch

from tiltlab.claims import stats
from tiltlab.objectives import lad as lad_obj
from tiltlab.objectives.lad import F_DIVERGENCES, lad_loss, lad_theoretical_loss
from tiltlab.objectives.metrics import tv_distance
from tiltlab.sim import envs
from tiltlab.sim.api import SimConfig, make_env
from tiltlab.sim.experiments import cached
from tiltlab.sim.train import train

DIVS = ("kl", "rkl", "jeffreys", "tv", "hellinger", "js")
#: ``lad.c1.exact_matching``: a run "matches exactly" when TV(pi, target) after its exact-gradient steps is below this.
EXACT_MATCH_TV = 1e-3
#: gamma = delta grid of ``lad.thmB1`` (its check and fig10 use it).
THM_B1_EPS = tuple(float(e) for e in np.logspace(-4, -1, 8))
#: The three methods ``lad.fig1.bandit`` judges (labels of :func:`method_configs`).
FIG1_GRPO = "GRPO + KL(π_old), clip 0.2"
FIG1_LAD = "LAD (JS)"
FIG1_FLOWRL = "FlowRL as coded (β=15·Â, ref=π_0)"
#: The three mode windows of the LAD bandit's mixture (``envs.lad_mixture`` defaults): centre +- 2 sigma.
MODE_WINDOWS = ((0.18, 0.05), (0.5, 0.06), (0.82, 0.05))


def method_configs(quick: bool, seed: int) -> dict[str, dict]:
    """Label -> SimConfig overrides, on top of :func:`base_config`."""
    return {
        "GRPO + KL(π_old), clip 0.2": dict(method="grpo", kl_coef=1.0, advantage="raw", clip_eps=0.2),
        "GRPO + KL(π_old), no clip": dict(method="grpo", kl_coef=1.0, advantage="raw", clip_eps=1e6),
        "GRPO on-policy (π_old every step)": dict(method="grpo", kl_coef=0.0, advantage="group", refresh_every=1),
        "FlowRL as coded (β=15·Â, ref=π_0)": dict(
            method="flowrl", anchor="ref", tilt_beta=15.0, flowrl_group_normalize=True, logz_lr=5e-2
        ),
        "FlowRL matched (A/η, ref=π_old)": dict(
            method="flowrl", anchor="old", tilt_beta=1.0, flowrl_group_normalize=False, logz_lr=5e-2
        ),
        "DISA (TB, frozen IS log Z, M=8)": dict(method="tb", anchor="old", log_z="frozen", tilt_beta=1.0, frozen_M=8),
        "LAD (JS)": dict(method="lad", lad_divergence="js"),
        "LAD (KL)": dict(method="lad", lad_divergence="kl"),
    }


def base_config(quick: bool, seed: int) -> dict:
    steps = 450 if quick else 4000
    return dict(
        env="lad_bandit",
        K=50,
        lad_eta=1.0,
        steps=steps,
        G=32,
        temperature=1.5,
        lr=5e-3,
        refresh_every=steps // 3 + 1,
        uniform_init=True,
        seeds=2,
        seed=seed,
        log_every=steps // 20,
    )


def _before_refresh(hist: dict, refresh_every: int) -> float:
    """TV(P_pi, P_A) at the last logged step before the first pi_old refresh (nan when not logged)."""
    pairs = [(s, v) for s, v in zip(hist["step"], hist.get("tv_ratio", [])) if s < refresh_every]
    return float(pairs[-1][1]) if pairs else float("nan")


@cached
def bandit_run(label: str, quick: bool, seed: int) -> dict:
    """One method of :func:`method_configs` on the LAD bandit at :func:`base_config` settings."""
    base = base_config(quick, seed)
    env = make_env(SimConfig(**base))
    cfg = SimConfig(**{**base, **method_configs(quick, seed)[label]})
    res = train(cfg, env)
    return {"logp": res.logp[:, 0], "logp_old": res.logp_old[:, 0], "history": res.history, "config": cfg}


def run_all(quick: bool, seed: int) -> dict:
    """Every method of :func:`method_configs`: final policy, P_pi, distances to P_A, curves."""
    base = base_config(quick, seed)
    env = make_env(SimConfig(**base))
    p_a = torch.softmax(env.reward[0] / base["lad_eta"], -1)
    out = {}
    for label, kw in method_configs(quick, seed).items():
        run = bandit_run(label, quick, seed)
        cfg, hist = run["config"], run["history"]
        logp = run["logp"]  # [S, K]
        p_pi = torch.log_softmax(logp - run["logp_old"], -1)
        out[label] = {
            "config": kw,
            "policy": logp.exp().mean(0),
            "policy_seeds": logp.exp(),  # [S, K]: a mean over seeds hides seeds that collapse onto different arms
            "max_pi_seeds": [float(v) for v in logp.exp().max(-1).values],
            "argmax_seeds": [int(v) for v in logp.exp().argmax(-1)],
            "P_pi": p_pi.exp().mean(0),
            "tv_Ppi_PA": float(tv_distance(p_pi, p_a.log()).mean()),
            "tv_Ppi_PA_std": float(tv_distance(p_pi, p_a.log()).std()) if logp.shape[0] > 1 else 0.0,
            "tv_pi_PA": float(tv_distance(logp, p_a.log()).mean()),
            "max_pi": float(logp.exp().max(-1).values.mean()),
            "entropy_pi": float(-(logp.exp() * logp).sum(-1).mean()),
            "history_tv_ratio": hist.get("tv_ratio", []),
            "tv_phase1": _before_refresh(hist, cfg.refresh_every),
            "history_step": hist["step"],
        }
    return {"P_A": p_a, "entropy_PA": float(-(p_a * p_a.log()).sum()), "methods": out, "base": base}


@cached
def divergence_sweep(steps: int, seeds: int, seed: int, exact: bool, refreshes: int = 0, lr: float = 5e-3) -> dict:
    """Train LAD with every divergence on the LAD bandit; TV(P_pi, P_A) at the end of phase 1 and at the end.

    Sampled mode uses the Fig. 1 settings (G = 32 at temperature 1.5); exact mode the exact
    expectation under pi_old (temperature 1).
    """
    base = dict(
        env="lad_bandit",
        K=50,
        lad_eta=1.0,
        steps=steps,
        G=32,
        temperature=1.0 if exact else 1.5,
        lr=lr,
        refresh_every=steps // (refreshes + 1) + 1,
        uniform_init=True,
        seeds=seeds,
        seed=seed,
        log_every=max(1, steps // 20),
        exact=exact,
        method="lad",
    )
    env = make_env(SimConfig(**base))
    p_a = torch.log_softmax(env.reward[0], -1)
    out = {}
    for d in DIVS:
        res = train(SimConfig(**base, lad_divergence=d), env)
        p_pi = torch.log_softmax(res.logp[:, 0] - res.logp_old[:, 0], -1)
        tv = tv_distance(p_pi, p_a)  # [S]
        hist = res.history
        ph1 = [v for s, v in zip(hist["step"], hist["tv_ratio"]) if s < base["refresh_every"]]
        out[d] = {
            "tv_final": float(tv.mean()),
            "tv_final_std": float(tv.std()) if tv.numel() > 1 else 0.0,
            "tv_final_per_seed": tv.tolist(),
            "tv_phase1": float(ph1[-1]),
            "curve_step": hist["step"],
            "curve_tv": hist["tv_ratio"],
        }
    return out


def surrogate_gap(eps, n_inst: int = 32, K: int = 50, seed: int = 0) -> dict:
    """``|L_theorem - L_LAD|`` (exact, float64) for ``gamma = delta = eps``; mean over random instances.

    ``L_LAD`` is eq. (8) in expectation, ``sum_y pi_old e^{A} f(pi/pi_old e^{-A})`` (``lad_loss``
    over all K arms with weight ``K pi_old``); ``L_theorem`` is eq. (7) (``lad_theoretical_loss``).
    """
    g = torch.Generator().manual_seed(seed)
    logp_old = torch.log_softmax(torch.randn(n_inst, K, generator=g, dtype=torch.float64), -1)
    a_unit = 2 * torch.rand(n_inst, K, generator=g, dtype=torch.float64) - 1
    u = 2 * torch.rand(n_inst, K, generator=g, dtype=torch.float64) - 1
    u = u - (logp_old.exp() * u).sum(-1, keepdim=True)  # keeps sum_y pi = 1
    u = u / u.abs().amax(-1, keepdim=True)  # |u| <= 1
    eps = np.asarray(eps)
    out = {d: [] for d in DIVS}
    for e in eps:
        adv = 0.999 * e * a_unit
        logp = logp_old + torch.log1p(0.999 * e * u)
        w = K * logp_old.exp()
        for d in DIVS:
            theo = lad_theoretical_loss(logp, logp_old, adv, eta=1.0, divergence=d).loss  # [n]
            prac = lad_loss(logp, logp_old, adv, eta=1.0, divergence=d, is_weight=w, loss_agg="none").loss.mean(-1)
            out[d].append(float((theo - prac).abs().mean()))
    slopes = {}
    x = np.log(2 * eps)
    for d in DIVS:
        y = np.log(np.maximum(np.asarray(out[d]), 1e-300))
        slopes[d] = float(np.polyfit(x[: len(x) // 2], y[: len(x) // 2], 1)[0])  # small-eps half: asymptotic order
    return {"gamma_plus_delta": 2 * eps, "gap": out, "order": slopes}


@cached
def thm_b1(seed: int) -> dict:
    """``lad.thmB1``: :func:`surrogate_gap` on :data:`THM_B1_EPS`. Returns the gap data and ``numbers``."""
    gap = surrogate_gap(THM_B1_EPS, seed=seed)
    return {**gap, "numbers": {f"order_{k}": v for k, v in gap["order"].items()}}


@cached
def practical(seed: int) -> dict:
    """``lad.practical``: exact-gradient LAD (eq. (8) in expectation under pi_old) from pi_old on a K = 10
    bandit, 400 Adam steps per divergence; where a run stops away from the target, the gap between the
    exact practical loss there and at the target (equal losses: a second minimizer, Lemma 3.2 needs f
    strictly convex)."""
    env = envs.make_bandit(K=10, seed=seed, ref_scale=1.0)
    res, nonunique = {}, {}
    for d in lad_obj.F_DIVERGENCES:
        cfg = SimConfig(
            env="bandit",
            method="lad",
            lad_divergence=d,
            lad_eta=1.0,
            exact=True,
            steps=400,
            lr=0.1,
            refresh_every=10_000,
            seeds=1,
            seed=seed,
            log_every=400,
        )
        out = train(cfg, env)
        res[d] = float(tv_distance(out.logp, out.target_logp).max())
        if res[d] >= EXACT_MATCH_TV:
            old, adv = out.logp_old[0, 0], env.reward[0]
            w = env.K * old.exp()

            def loss_at(lp, d=d, old=old, adv=adv, w=w):
                return float(lad_obj.lad_loss(lp, old, adv, eta=1.0, divergence=d, is_weight=w).loss)

            nonunique[d] = abs(loss_at(out.logp[0, 0]) - loss_at(out.target_logp[0, 0]))
    return {f"tv_{k}": v for k, v in res.items()} | {f"loss_gap_{k}": v for k, v in nonunique.items()}


#: ``lad.strict_better``'s two sweeps (slow): exact gradient, one phase; sampled with Fig. 1's settings.
STRICT_EXACT = dict(steps=1500, seeds=1, exact=True, refreshes=0, lr=2e-2)
STRICT_SAMPLED = dict(steps=4000, seeds=20, exact=False, refreshes=2)  # 20 paired seeds (2 before)


def strict_better(seed: int) -> dict:
    """``lad.strict_better`` (slow): mean final TV(P_pi, P_A) of the strict (TV, Hellinger, JS) and the
    non-strict (KL, rKL, Jeffreys) divergences, exact-gradient and sampled. Returns both sweeps, ``numbers``
    (with the gaps non-strict - strict: the exact one and the sampled one's mean and 95% paired t interval) and
    the sampled per-seed gaps ``diffs``."""
    ex = divergence_sweep(seed=seed, **STRICT_EXACT)
    sa = divergence_sweep(seed=seed, **STRICT_SAMPLED)
    strict = [d for d, f in F_DIVERGENCES.items() if f.strict]
    weak = [d for d in F_DIVERGENCES if d not in strict]
    numbers = {}
    for name, sweep in (("exact", ex), ("sampled", sa)):
        numbers[f"{name}_strict"] = float(np.mean([sweep[d]["tv_final"] for d in strict]))
        numbers[f"{name}_nonstrict"] = float(np.mean([sweep[d]["tv_final"] for d in weak]))
        numbers.update({f"{name}_tv_{d}": float(sweep[d]["tv_final"]) for d in F_DIVERGENCES})
    # per seed (seed s of every divergence starts from the same draw): mean non-strict TV - mean strict TV,
    # positive = the strict divergences end closer to the target (the paper's direction)
    per_seed = {d: torch.tensor(sa[d]["tv_final_per_seed"], dtype=torch.float64) for d in F_DIVERGENCES}
    diffs = (
        torch.stack([per_seed[d] for d in weak]).mean(0) - torch.stack([per_seed[d] for d in strict]).mean(0)
    ).tolist()
    m, lo, hi = stats.paired_t_ci(diffs)
    numbers |= {"sampled_gap": m, "sampled_gap_lo": lo, "sampled_gap_hi": hi, "sampled_pairs": len(diffs)}
    numbers["exact_gap"] = numbers["exact_nonstrict"] - numbers["exact_strict"]  # one deterministic run
    return {"exact": ex, "sampled": sa, "numbers": numbers, "diffs": diffs}


#: LAD Fig. 1's GRPO clips the ratio pi/pi_old to [1 - 0.2, 1 + 0.2] and refreshes pi_old twice (3 phases):
#: from the uniform start over 50 arms no arm can exceed (1/50) * 1.2^3 = 0.0346, so "collapse to one
#: arm" is unreachable at these settings by construction (reported with ``lad.fig1.bandit``'s numbers).
FIG1_GRPO_MAX_PI_BOUND = (1 / 50) * 1.2**3


def fig1_bandit(seed: int) -> dict:
    """``lad.fig1.bandit`` (slow): GRPO + KL(pi_old), LAD-JS and FlowRL as coded at the paper's Fig. 1
    settings (:func:`base_config` with ``quick=False``): TV(P_pi, P_A), the largest arm probability and
    LAD's mass in each mode window relative to P_A's. Returns the claim's numbers."""
    env = envs.make_lad_bandit(50)
    p_a = torch.log_softmax(env.reward[0], -1)
    x = torch.linspace(0, 1, 50, dtype=torch.float64)
    windows = [(x - c).abs() <= 2 * w for c, w in MODE_WINDOWS]

    def go(label):
        r = bandit_run(label, False, seed)
        p_pi = torch.log_softmax(r["logp"] - r["logp_old"], -1)
        ratios = [float(p_pi.exp()[:, win].sum(-1).mean() / p_a.exp()[win].sum()) for win in windows]
        return float(tv_distance(p_pi, p_a).mean()), float(r["logp"].exp().max(-1).values.mean()), ratios

    tv_g, max_g, _ = go(FIG1_GRPO)
    tv_l, max_l, modes_l = go(FIG1_LAD)
    tv_f, max_f, _ = go(FIG1_FLOWRL)
    return {
        "grpo_max_pi": max_g,
        "grpo_tv": tv_g,
        "lad_js_tv": tv_l,
        "lad_js_max_pi": max_l,
        **{f"lad_mode{i}_ratio": m for i, m in enumerate(modes_l)},
        "flowrl_tv": tv_f,
        "flowrl_max_pi": max_f,
        "grpo_max_pi_bound": FIG1_GRPO_MAX_PI_BOUND,
    }
