"""DISA's inverse-temperature sensitivity (DISA §3.3, App. D.7): Stage-1 label quality against beta for
fixed proposals, and TB training with the frozen label against exact log Z.

Labels and weight diagnostics from ``objectives.estimators``; training through :func:`tiltlab.sim.api.run`.
"""

from __future__ import annotations

import numpy as np
import torch

from tiltlab.objectives.estimators import (
    effective_sample_size,
    log_importance_weights,
    log_partition_lse,
    max_normalized_weight,
)
from tiltlab.sim.api import SimConfig, run
from tiltlab.sim.exact import log_partition, mc_log_weights
from tiltlab.sim.experiments import cached
from tiltlab.sim.experiments.labels import token_tree_prompts

#: Settings of ``disa.sens.beta_cliff`` (its check and fig03 use these).
CLAIM_LABEL_BETAS = (0.25, 1.0, 4.0, 16.0)
CLAIM_TRAIN_BETAS = (0.25, 1.0, 16.0)

BETAS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)


def label_vs_beta(P: int, seed: int, betas=BETAS, m: int = 8, reps: int = 1000) -> dict:
    """Label statistics ``[len(betas), P]`` for two fixed proposals: ``ref`` (q = pi_ref) and
    ``teacher`` (a noisy token-level tilt fixed at beta0 = 2, alpha = 0.5)."""
    d = token_tree_prompts(P, seed, beta=2.0, alpha=0.5, noise=0.5)
    lp_ref, r = d["logp_ref"], d["reward"]
    g = torch.Generator().manual_seed(seed + 3)
    out = {"beta": list(betas), "pass_rate": d["pass_rate"].numpy()}
    for name, lq in (("ref", lp_ref), ("teacher", d["logq"])):
        stats = {k: np.zeros((len(betas), P)) for k in ("var", "bias", "rel_bias", "ess", "maxw")}
        for i, b in enumerate(betas):
            lw = log_importance_weights(lp_ref, lq, b * r)  # [P, N]
            idx = mc_log_weights(
                lq, torch.arange(lq.shape[-1], dtype=lq.dtype).expand_as(lq), m, reps, generator=g
            ).long()
            lw_s = torch.gather(lw, -1, idx.flatten(1)).reshape(idx.shape)  # [P, reps, m]
            lab = log_partition_lse(lw_s)  # [P, reps]
            lz = log_partition(lp_ref, b * r)  # [P]
            stats["var"][i] = lab.var(-1).numpy()
            stats["bias"][i] = (lab.mean(-1) - lz).numpy()
            stats["rel_bias"][i] = ((lab.mean(-1) - lz).abs() / lz.abs()).numpy()
            stats["ess"][i] = (effective_sample_size(lw_s) / m).mean(-1).numpy()
            stats["maxw"][i] = max_normalized_weight(lw_s).mean(-1).numpy()
        out[name] = stats
    return out


def training_vs_beta(quick: bool, seed: int, betas=None) -> dict:
    """Final TV to pi*_beta of TB with DISA's frozen label (q = pi_ref, M = 8) vs exact log Z (``sim.run``)."""
    betas = betas or ((0.25, 1.0, 4.0, 16.0) if quick else (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0))
    base = dict(
        env="multiprompt",
        P=8 if quick else 16,
        K=16,
        method="tb",
        frozen_proposal="ref",
        frozen_M=8,
        steps=60 if quick else 150,
        G=8,
        seeds=2 if quick else 4,
        seed=seed,
        log_every=10,
    )
    out = {"beta": list(betas)}
    for inner in (4,) if quick else (1, 4):
        modes = ("frozen", "exact") if quick else ("frozen", "frozen_bc", "exact")
        for mode in modes:
            tv, rew, err = [], [], []
            for b in betas:
                # frozen_bc: the delta-method bias-corrected label (objectives.estimators.bias_corrected_log_partition)
                extra = {"log_z": "frozen", "frozen_bias_correct": True} if mode == "frozen_bc" else {"log_z": mode}
                res = run(SimConfig(tilt_beta=b, inner_steps=inner, **extra, **base))
                tv.append(res.final("tv"))
                rew.append(res.final("reward"))
                err.append(res.final("log_z_err"))
            out[f"tv_{mode}_inner{inner}"], out[f"reward_{mode}_inner{inner}"] = tv, rew
            if mode == "frozen":
                out[f"logz_err_inner{inner}"] = err
    return out


def summarize_sweep(lab: dict, tr: dict) -> dict:
    """Decisive numbers for the plateau / cliff reading."""
    B = list(lab["beta"])
    i8 = B.index(8.0) if 8.0 in B else len(B) // 2
    tb = list(tr["beta"])
    ex = np.asarray(tr["tv_frozen_inner4"]) - np.asarray(tr["tv_exact_inner4"])
    small = [i for i, b in enumerate(tb) if b <= 1.0]
    tvf = np.asarray(tr["tv_frozen_inner4"])
    return {
        "ess_ref_lo": float(lab["ref"]["ess"][0].mean()),
        "ess_ref_hi": float(lab["ref"]["ess"][-1].mean()),
        "maxw_ref_hi": float(lab["ref"]["maxw"][-1].mean()),
        "bias_ref_lo": float(np.abs(lab["ref"]["bias"][0]).mean()),
        "bias_ref_hi": float(np.abs(lab["ref"]["bias"][-1]).mean()),
        "var_ref_lo": float(lab["ref"]["var"][0].mean()),
        "var_ref_hi": float(lab["ref"]["var"][-1].mean()),
        "maxw_teacher_hi": float(lab["teacher"]["maxw"][-1].mean()),
        "ess_teacher_lo": float(lab["teacher"]["ess"][0].mean()),
        "ess_teacher_hi": float(lab["teacher"]["ess"][-1].mean()),
        "var_teacher_mid": float(lab["teacher"]["var"][i8].mean()),
        "var_teacher_hi": float(lab["teacher"]["var"][-1].mean()),
        "excess_lo": float(ex[0]),
        "excess_hi": float(ex[-1]),
        "excess_ratio": float(ex[-1] / max(ex[0], 1e-4)),
        "tv_frozen_lo": float(tvf[0]),
        "tv_frozen_hi": float(tvf[-1]),
        "plateau_ratio": float(tvf[small].max() / tvf[small].min()) if len(small) > 1 else float("nan"),
    }


@cached
def beta_cliff_claim(seed: int) -> dict:
    """``disa.sens.beta_cliff``: label statistics at :data:`CLAIM_LABEL_BETAS` (8 prompts, 200 repetitions)
    and quick TB training at :data:`CLAIM_TRAIN_BETAS`. Returns ``{"label", "training", "numbers"}``."""
    lab = label_vs_beta(8, seed, betas=CLAIM_LABEL_BETAS, reps=200)
    tr = training_vs_beta(True, seed, betas=CLAIM_TRAIN_BETAS)
    v_ref = lab["ref"]["var"].mean(1)
    maxw = lab["teacher"]["maxw"].mean(1)
    excess = np.asarray(tr["tv_frozen_inner4"]) - np.asarray(tr["tv_exact_inner4"])
    label_cliff = bool(v_ref[-1] > 100 * v_ref[0] and maxw[-1] > maxw[0])
    train_cliff = bool(excess[-1] > 0.02 and excess[-1] > 3 * max(excess[0], 0.005))
    # plateau: at small beta the frozen label costs little (excess TV at beta <= 1 below a quarter of beta = 16's)
    plateau = bool(max(excess[0], excess[1]) < 0.25 * excess[-1])
    numbers = {
        "var_ref_b025": float(v_ref[0]),
        "var_ref_b16": float(v_ref[-1]),
        "maxw_teacher_b025": float(maxw[0]),
        "maxw_teacher_b16": float(maxw[-1]),
        "excess_b025": float(excess[0]),
        "excess_b1": float(excess[1]),
        "excess_b16": float(excess[-1]),
        "label_cliff": label_cliff,
        "train_cliff": train_cliff,
        "plateau": plateau,
    }
    return {"label": lab, "training": tr, "numbers": numbers}
