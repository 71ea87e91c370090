"""Stage-1 label quality against the proposal (DISA §3.3 / App. D sensitivity, and the truncated-proposal
question): exact label statistics for sequence-level tilted proposals, Monte-Carlo statistics for a
noisy token-level teacher and for top-k / top-p truncated teachers, and TB training with the frozen
label of each proposal.

Labels from ``objectives.estimators``; exact enumerations from :mod:`tiltlab.sim.exact`.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from tiltlab.objectives.estimators import log_importance_weights, log_partition_lse
from tiltlab.sim.api import SimConfig, run
from tiltlab.sim.exact import label_samples_exact, log_partition, mc_log_weights, target_logprobs
from tiltlab.sim.experiments import cached
from tiltlab.sim.experiments.labels import token_tree_prompts
from tiltlab.sim.proposals import support_mass, tilted_proposal, top_k_proposal, top_p_proposal
from tiltlab.sim.token_tree import TokenTree, bigram_env, make_reference, tilted_table

F64 = torch.float64
#: Settings of the claims' numbers (their checks and fig04 use these): prompts, Monte-Carlo repetitions.
CLAIM_PROMPTS = 8
TRUNCATION_REPS = 1500

ALPHAS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def tilt_label_stats(P: int, seed: int, beta: float = 2.0, m: int = 8, alphas=ALPHAS) -> dict:
    """Exact bias / variance of ``log Z_hat_m`` and ``E[Z_hat]/Z`` for sequence-level tilted proposals.

    Under ``q_alpha`` the weight depends on the reward only, so an M-sample is described by its
    number of correct draws: :func:`sim.exact.label_samples_exact` over the two classes is exact.
    Returns arrays ``[len(alphas), P]``."""
    d = token_tree_prompts(P, seed, beta)
    lp_ref, r = d["logp_ref"], d["reward"]
    log_star = target_logprobs(lp_ref, beta * r)
    i_c, i_w = int(torch.nonzero(r > 0.5)[0]), int(torch.nonzero(r < 0.5)[0])
    bias, var, ratio = np.zeros((len(alphas), P)), np.zeros((len(alphas), P)), np.zeros((len(alphas), P))
    for a_i, a in enumerate(alphas):
        lq = tilted_proposal(lp_ref, log_star, a)  # [P, N]
        lw = log_importance_weights(lp_ref, lq, beta * r)  # [P, N], two values per prompt
        q_c = (lq.exp() * r).sum(-1)  # [P]
        for p in range(P):
            logq2 = torch.stack([torch.log1p(-q_c[p]), torch.log(q_c[p])])
            samples, prob = label_samples_exact(logq2, torch.stack([lw[p, i_w], lw[p, i_c]]), m)
            lab = log_partition_lse(samples)
            mean = float((prob * lab).sum())
            bias[a_i, p] = mean - float(d["log_z"][p])
            var[a_i, p] = float((prob * (lab - mean) ** 2).sum())
            ratio[a_i, p] = float((prob * lab.exp()).sum()) / math.exp(float(d["log_z"][p]))
    return {
        "alpha": list(alphas),
        "bias": bias,
        "var": var,
        "mean_ratio": ratio,
        "pass_rate": d["pass_rate"].numpy(),
        "log_z": d["log_z"].numpy(),
    }


def noisy_teacher_stats(
    P: int, seed: int, beta: float = 2.0, m: int = 8, reps: int = 2000, noise: float = 0.5, alphas=ALPHAS
) -> dict:
    """Monte-Carlo bias / variance of ``log Z_hat_m`` for a token-level tilted teacher with logit noise."""
    bias, var = np.zeros((len(alphas), P)), np.zeros((len(alphas), P))
    g = torch.Generator().manual_seed(seed + 5)
    for a_i, a in enumerate(alphas):
        d = token_tree_prompts(P, seed, beta, alpha=a, noise=noise)
        lab = log_partition_lse(mc_log_weights(d["logq"], d["log_w"], m, reps, generator=g))  # [P, reps]
        bias[a_i] = (lab.mean(-1) - d["log_z"]).numpy()
        var[a_i] = lab.var(-1).numpy()
    return {"bias": bias, "var": var}


TRUNCATIONS = (
    ("top-k 3", "k", 3),
    ("top-k 2", "k", 2),
    ("top-k 1", "k", 1),
    ("top-p 0.95", "p", 0.95),
    ("top-p 0.9", "p", 0.9),
    ("top-p 0.7", "p", 0.7),
    ("top-p 0.5", "p", 0.5),
)


def truncation_stats(
    P: int, seed: int, beta: float = 2.0, alpha: float = 0.5, m: int = 8, reps: int = 4000, truncations=TRUNCATIONS
) -> dict:
    """Token-level truncated teachers on token-tree prompts. Per truncation and prompt: ``pi*(supp q)``,
    MC ``E[Z_hat]/Z`` with weights from the truncated q (and its standard error), the same with
    weights from the untruncated teacher, and the LSE label bias ``E[log Z_hat_m] - log Z``."""
    env = TokenTree(4, 5)
    be = bigram_env(env)
    g = torch.Generator().manual_seed(seed)
    rates = torch.logspace(math.log10(0.01), math.log10(0.9), P, dtype=F64)
    p_ref = make_reference(env, rates, generator=g, lead=(P,))
    teacher = tilted_table(env, p_ref, alpha * beta)  # token-level log-probs [P, L, V, V]
    lp_ref, r = env.exact_logprobs(p_ref), env.exact_rewards()
    log_z = log_partition(lp_ref, beta * r)
    log_star = target_logprobs(lp_ref, beta * r)
    lq_full = be.exact_logprobs(teacher)
    out = {k: [] for k in ("name", "supp_mass", "ratio", "ratio_se", "ratio_fullq", "lse_bias", "pred_bias")}
    for name, kind, val in truncations:
        table = top_k_proposal(teacher, int(val)) if kind == "k" else top_p_proposal(teacher, float(val))
        lq = be.exact_logprobs(table)  # [P, N], -inf outside the support
        live = torch.isfinite(lq)
        lw = torch.where(
            live,
            log_importance_weights(lp_ref, torch.where(live, lq, torch.zeros_like(lq)), beta * r),
            torch.full_like(lq, -math.inf),
        )
        lw_full = log_importance_weights(lp_ref, lq_full, beta * r)
        idx_w = mc_log_weights(lq, torch.arange(lq.shape[-1], dtype=F64).expand_as(lq), m, reps, generator=g).long()
        lw_s = torch.gather(lw, -1, idx_w.flatten(1)).reshape(idx_w.shape)  # [P, reps, m]
        lw_f = torch.gather(lw_full, -1, idx_w.flatten(1)).reshape(idx_w.shape)
        zhat = (log_partition_lse(lw_s) - log_z[:, None]).exp()  # [P, reps]
        zhat_f = (log_partition_lse(lw_f) - log_z[:, None]).exp()
        mass = support_mass(lq, log_star)  # [P] = pi*(supp q)
        out["name"].append(name)
        out["supp_mass"].append(mass.numpy())
        out["ratio"].append(zhat.mean(-1).numpy())
        out["ratio_se"].append((zhat.std(-1) / math.sqrt(reps)).numpy())
        out["ratio_fullq"].append(zhat_f.mean(-1).numpy())
        out["lse_bias"].append((log_partition_lse(lw_s) - log_z[:, None]).mean(-1).numpy())
        out["pred_bias"].append(mass.log().numpy())
    return {k: (np.asarray(v) if k != "name" else v) for k, v in out.items()} | {"pass_rate": rates.numpy()}


PROPOSALS = (
    ("π_ref", {"frozen_proposal": "ref"}),
    ("tilt α=0.25", {"frozen_proposal": "tilted", "proposal_alpha": 0.25}),
    ("tilt α=0.5", {"frozen_proposal": "tilted", "proposal_alpha": 0.5}),
    ("tilt α=0.75", {"frozen_proposal": "tilted", "proposal_alpha": 0.75}),
    ("tilt α=1 (π*)", {"frozen_proposal": "tilted", "proposal_alpha": 1.0}),
    ("top-k 8", {"frozen_proposal": "topk", "proposal_k": 8}),
    ("top-k 2", {"frozen_proposal": "topk", "proposal_k": 2}),
    ("top-p 0.9", {"frozen_proposal": "topp", "proposal_p": 0.9}),
    ("top-p 0.5", {"frozen_proposal": "topp", "proposal_p": 0.5}),
)


def trained_policy_effect(quick: bool, seed: int, proposals=PROPOSALS) -> dict:
    """Final TV(pi, pi*) of TB with the frozen label of each proposal (``sim.run``), inner steps 1 and 4."""
    base = dict(
        env="multiprompt",
        P=8 if quick else 16,
        K=16,
        method="tb",
        log_z="frozen",
        tilt_beta=2.0,
        steps=60 if quick else 150,
        G=8,
        seeds=2 if quick else 4,
        seed=seed,
        log_every=10,
    )
    if quick:
        proposals = [p for p in proposals if p[0] in ("π_ref", "tilt α=0.5", "tilt α=1 (π*)", "top-k 2", "top-p 0.5")]
    out = {"name": [p[0] for p in proposals]}
    for inner in (4,) if quick else (1, 4):
        tv, err = [], []
        for _, kw in proposals:
            res = run(SimConfig(inner_steps=inner, **base, **kw))
            tv.append(res.final("tv"))
            err.append(res.final("log_z_err"))
        ex = run(SimConfig(inner_steps=inner, **{**base, "log_z": "exact"}))
        out[f"tv_inner{inner}"], out[f"logz_err_inner{inner}"], out[f"tv_exact_inner{inner}"] = tv, err, ex.final("tv")
    return out


@cached
def proposal_claim(seed: int) -> dict:
    """``disa.sens.proposal``: exact statistics of ``log Z_hat_8`` for tilted proposals alpha = 0..1 on
    :data:`CLAIM_PROMPTS` token-tree prompts. Returns ``{"stats", "numbers"}``."""
    st = tilt_label_stats(CLAIM_PROMPTS, seed)
    v = st["var"].mean(1)
    numbers = {
        "max_mean_dev": float(np.abs(st["mean_ratio"] - 1).max()),
        "var_alpha0": float(v[0]),
        "var_alpha05": float(v[5]),
        "var_alpha09": float(v[9]),
        "var_alpha1": float(v[10]),
        "monotone": bool(np.all(np.diff(v) < 0)),
    }
    return {"stats": st, "numbers": numbers}


@cached
def truncation_claim(seed: int) -> dict:
    """``disa.open.truncated_proposal``: top-k / top-p teachers on :data:`CLAIM_PROMPTS` token-tree prompts,
    :data:`TRUNCATION_REPS` Monte-Carlo labels each. Returns ``{"stats", "numbers"}``."""
    st = truncation_stats(CLAIM_PROMPTS, seed, reps=TRUNCATION_REPS)
    # single-sequence supports have zero MC spread: 1e-12 is float64 rounding of Z_hat / Z
    z = np.abs(st["ratio"] - st["supp_mass"]) / (st["ratio_se"] + 1e-12)
    i = int(np.argmin(st["supp_mass"].mean(1)))
    numbers = {
        "max_z": float(z.max()),
        "cells": int(z.size),
        "min_support_mass": float(st["supp_mass"].min()),
        "max_support_mass": float(st["supp_mass"].max()),
        "lse_bias_most_truncated": float(st["lse_bias"][i].mean()),
        "pred_bias_most_truncated": float(st["pred_bias"][i].mean()),
        "fullq_max_dev": float(np.abs(st["ratio_fullq"] - 1).max()),
    }
    return {"stats": st, "most_truncated": st["name"][i], "numbers": numbers}
