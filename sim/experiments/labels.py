"""DISA Stage-1 label experiments: the exact geometric-mean bias (DISA App. C.2, Prop. 2) and the
App. D.3 M study (variance and relative bias of ``log Z_hat_M`` against a large-M pool).

Labels come from ``objectives.estimators`` (LSE, DISA eq. (8), and the geometric mean); exact
enumerations from :mod:`tiltlab.sim.exact`; token-tree prompts from :mod:`tiltlab.sim.token_tree`.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from tiltlab.objectives.estimators import log_importance_weights, log_partition_geomean, log_partition_lse
from tiltlab.sim.exact import label_samples_exact, log_partition, relative_weight_variance, target_logprobs
from tiltlab.sim.experiments import cached
from tiltlab.sim.proposals import sample, tilted_proposal
from tiltlab.sim.token_tree import TokenTree, bigram_env, make_reference, tilted_table

F64 = torch.float64
M_GRID = (1, 2, 4, 8, 16, 32, 64)
M_VALUES = M_GRID
#: The M study's settings (the claim ``disa.d3.m_study``: its check and fig02 use these).
M_STUDY = dict(P=12, pool=512, reps=400)


def random_instance(seed: int, k: int = 4, beta: float = 1.0, q_scale: float = 0.7):
    """A small random instance: pi_ref, a graded reward, a full-support proposal q [K]."""
    g = torch.Generator().manual_seed(seed)
    logp_ref = torch.log_softmax(torch.randn(k, generator=g, dtype=F64), -1)
    reward = torch.rand(k, generator=g, dtype=F64)
    logq = torch.log_softmax(q_scale * torch.randn(k, generator=g, dtype=F64), -1)
    log_w = log_importance_weights(logp_ref, logq, beta * reward)  # [K]
    return logp_ref, reward, logq, log_w


def exact_label_stats(logq, log_w, m, aggregator):
    """Exact mean / variance of ``aggregator(log_w sample)`` and exact mean of the linear ``Z_hat``."""
    samples, prob = label_samples_exact(logq, log_w, m)  # [C, M], [C]
    lab = aggregator(samples)  # [C]
    mean = (prob * lab).sum()
    var = (prob * (lab - mean) ** 2).sum()
    return float(mean), float(var), samples, prob


def token_tree_prompts(
    P: int,
    seed: int,
    beta: float,
    alpha: float = 0.5,
    noise: float = 0.5,
    p_min: float = 0.01,
    p_max: float = 0.9,
    vocab: int = 4,
    length: int = 5,
):
    """``P`` token-tree prompts with pass rates log-spaced in [p_min, p_max] and a noisy tilted teacher.

    Returns dict with ``logp_ref [P, N]``, ``reward [N]``, ``logq [P, N]``, ``log_w [P, N]`` (from
    ``objectives.estimators.log_importance_weights``), ``log_z [P]`` exact and ``pass_rate [P]``.
    """
    env = TokenTree(vocab, length)
    g = torch.Generator().manual_seed(seed)
    rates = torch.logspace(math.log10(p_min), math.log10(p_max), P, dtype=torch.float64)
    p_ref = make_reference(env, rates, generator=g, lead=(P,))
    teacher = tilted_table(env, p_ref, alpha * beta) + noise * torch.randn(
        P, *env.param_shape, generator=g, dtype=torch.float64
    )
    be = bigram_env(env)
    lp_ref = env.exact_logprobs(p_ref)  # [P, N]
    lq = be.exact_logprobs(teacher)  # [P, N]
    r = env.exact_rewards()  # [N]
    return {
        "env": env,
        "logp_ref": lp_ref,
        "reward": r,
        "logq": lq,
        "log_w": log_importance_weights(lp_ref, lq, beta * r),
        "log_z": log_partition(lp_ref, beta * r),
        "pass_rate": rates,
    }


def m_study(
    P: int = 24,
    pool: int = 512,
    reps: int = 200,
    seed: int = 0,
    beta: float = 2.0,
    alpha: float = 0.5,
    noise: float = 0.5,
    m_values=M_VALUES,
) -> dict:
    """Run the D.3 protocol. Returns per-M arrays ``[len(M), P]`` for each aggregator."""
    d = token_tree_prompts(P, seed, beta, alpha, noise)
    g = torch.Generator().manual_seed(seed + 1)
    idx = sample(d["logq"], pool, generator=g)  # [P, pool]
    lw_pool = torch.gather(d["log_w"], -1, idx)  # [P, pool]
    lz_pool = log_partition_lse(lw_pool)  # [P]
    perm = torch.rand(P, reps, pool, generator=g).argsort(-1)  # nested subsamples without replacement
    out = {
        "M": list(m_values),
        "pass_rate": d["pass_rate"].numpy(),
        "log_z": d["log_z"].numpy(),
        "log_z_pool": lz_pool.numpy(),
    }
    for name, agg in (("lse", log_partition_lse), ("geo", log_partition_geomean)):
        var, rel, rel_exact, bias_exact = [], [], [], []
        for m in m_values:
            lab = agg(torch.gather(lw_pool.unsqueeze(1).expand(P, reps, pool), -1, perm[..., :m]))  # [P, reps]
            var.append(lab.var(-1).numpy())
            rel.append(((lab.mean(-1) - lz_pool).abs() / lz_pool.abs()).numpy())
            rel_exact.append(((lab.mean(-1) - d["log_z"]).abs() / d["log_z"].abs()).numpy())
            bias_exact.append((lab.mean(-1) - d["log_z"]).numpy())
        out[name] = {
            "var": np.asarray(var),
            "rel_bias": np.asarray(rel),
            "rel_bias_exact": np.asarray(rel_exact),
            "bias_exact": np.asarray(bias_exact),
        }
    return out


def summarize_m_study(res: dict) -> dict:
    """The D.3 numbers: drops from M=1 to M=8, the extra gain 8 -> 16, monotonicity, log-log slopes."""
    M = np.asarray(res["M"], dtype=float)
    i1, i8, i16 = list(res["M"]).index(1), list(res["M"]).index(8), list(res["M"]).index(16)
    lse = res["lse"]
    mv = lse["var"].mean(1)
    mb = np.median(lse["rel_bias"], 1)
    slope_var = float(np.polyfit(np.log(M), np.log(mv), 1)[0])
    slope_bias = float(np.polyfit(np.log(M[1:]), np.log(mb[1:]), 1)[0])
    geo_b = np.median(res["geo"]["rel_bias"], 1)
    return {
        "var_drop_1_to_8": float(1 - mv[i8] / mv[i1]),
        "bias_drop_1_to_8": float(1 - mb[i8] / mb[i1]),
        "var_extra_8_to_16_pp": float((mv[i8] - mv[i16]) / mv[i1]),
        "bias_extra_8_to_16_pp": float((mb[i8] - mb[i16]) / mb[i1]),
        "var_monotone": bool(np.all(np.diff(mv) < 0)),
        "bias_monotone": bool(np.all(np.diff(mb) < 0)),
        "slope_var": slope_var,
        "slope_bias": slope_bias,
        "geo_bias_M1": float(geo_b[i1]),
        "geo_bias_M64": float(geo_b[-1]),
        "mean_var": mv.tolist(),
        "median_rel_bias": mb.tolist(),
    }


@cached
def geomean_bias(seed: int) -> dict:
    """Exact geometric-mean label bias for M=1..64 (constant in M) vs LSE bias * M, on a low-variance
    instance (tilted proposal alpha = 0.8, where the second-order statements should hold) and a
    high-variance one (random proposal; reported, not judged)."""
    out = {}
    for tag, alpha, beta in (("low", 0.8, 1.0), ("high", None, 3.0)):
        logp_ref, reward, logq, log_w = random_instance(seed + 7, k=3, beta=beta, q_scale=1.5)
        tilt = beta * reward
        if alpha is not None:  # a good proposal: close to pi*, small weight variance
            logq = tilted_proposal(logp_ref, target_logprobs(logp_ref, tilt), alpha)
            log_w = log_importance_weights(logp_ref, logq, tilt)
        log_z = float(log_partition(logp_ref, tilt))
        chi2 = float(relative_weight_variance(target_logprobs(logp_ref, tilt), logq))
        geo = [(exact_label_stats(logq, log_w, m, log_partition_geomean)[0] - log_z) for m in M_GRID]
        lse = [(exact_label_stats(logq, log_w, m, log_partition_lse)[0] - log_z) for m in M_GRID]
        out[tag] = {
            "chi2": chi2,
            "geo_bias": geo[0],
            "geo_spread": max(geo) - min(geo),
            "geo_vs_second_order": geo[0] / (-chi2 / 2),
            "lseM_over_geo_M64": lse[-1] * 64 / geo[0],
            "lse_bias_M64": lse[-1],
        }
    return {f"{t}_{k}": v for t, d in out.items() for k, v in d.items()}


@cached
def m_study_claim(seed: int) -> dict:
    """``disa.d3.m_study``: the D.3 protocol at :data:`M_STUDY` settings. Returns ``{"study", "numbers"}``:
    the per-M arrays of :func:`m_study` and the claim's numbers (the scalar summary of
    :func:`summarize_m_study` plus log-log slopes before / after M = 8 and whether they show a knee at 8)."""
    res = m_study(**M_STUDY, seed=seed)
    s = summarize_m_study(res)
    M = np.asarray(res["M"], dtype=float)
    i8 = list(res["M"]).index(8)

    def slopes(y):
        y = np.log(np.asarray(y))
        return float((y[i8] - y[0]) / (np.log(8))), float((y[-1] - y[i8]) / (np.log(M[-1] / 8)))

    v_before, v_after = slopes(s["mean_var"])
    b_before, b_after = slopes(s["median_rel_bias"])
    knee = abs(v_after) < 0.5 * abs(v_before) and abs(b_after) < 0.5 * abs(b_before)
    numbers = {
        **{k: v for k, v in s.items() if not isinstance(v, list)},
        "var_slope_before": v_before,
        "var_slope_after": v_after,
        "bias_slope_before": b_before,
        "bias_slope_after": b_after,
        "knee_at_8": knee,
    }
    return {"study": res, "summary": s, "numbers": numbers}
