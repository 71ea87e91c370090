"""PACED-RL in the tabular simulator (PACED-RL §4, Alg. 1, Figs. 4 and 6, Table 2): prompt selection
from a partition-function estimate, accuracy-prioritized replay, the target-accuracy (tau) sweep and
the scheduler comparison. A toy proxy: tabular prompts do not share parameters.

Selection and replay priority from ``objectives.paced``; labels from ``objectives.estimators``;
training through :func:`tiltlab.sim.train.train`.
"""

from __future__ import annotations

import math

import torch

from tiltlab.claims import stats
from tiltlab.objectives import estimators as est
from tiltlab.objectives import paced as paced_obj
from tiltlab.sim import envs
from tiltlab.sim.api import SimConfig, make_env
from tiltlab.sim.experiments import cached
from tiltlab.sim.train import train

TAUS = (0.1, 0.3, 0.5, 0.7, 0.9)
#: Mean pass rate whose first crossing gives "steps to target".
TARGET = 0.6
#: ``paced.tau_sweep``'s settings (its check and fig08 use these): 150 steps, 20 paired seeds (4 before).
TAU_CLAIM = dict(quick=True, steps=150, seeds=20)
#: ``paced.tau_sweep``'s "fast start" step: the logged step nearest a quarter of the run, rounded down.
TAU_EARLY_STEP = 35


def base_config(quick: bool, seed: int) -> dict:
    return dict(
        env="multiprompt",
        P=64,
        K=16,
        method="tb",
        anchor="old",
        log_z="learned",
        tilt_beta=2.0,
        steps=60 if quick else 200,
        G=8,
        lr=0.05,
        logz_lr=0.1,
        seeds=2 if quick else 6,
        seed=seed,
        log_every=5,
        select_m=16,
        scheduler="logz",
        paced_tau=0.5,
    )


SCHEDULERS = {
    "PACED (log Z from 0)": dict(scheduler="logz"),
    "PACED (log Z init. from DISA)": dict(scheduler="logz", logz_init="frozen"),
    "PACED (DISA init.) + replay": dict(scheduler="logz", logz_init="frozen", paced_replay=True),
    "DISA frozen Z only (static p_ref)": dict(scheduler="frozen", logz_init="frozen"),
    "oracle p_old": dict(scheduler="oracle"),
    "random prompts": dict(scheduler="random"),
    "all 64 prompts (4x samples)": dict(select_m=0),
}


def steps_to(curve_step: list, curve: list, target: float) -> float:
    """First logged step at which ``curve >= target`` (inf if never)."""
    for s, v in zip(curve_step, curve):
        if v >= target:
            return float(s)
    return math.inf


@cached
def tau_sweep(
    quick: bool, seed: int, target: float = TARGET, steps: int | None = None, seeds: int | None = None
) -> dict:
    """Mean accuracy curves and steps-to-``target`` for PACED (DISA-initialised log Z) over ``TAUS``."""
    base = base_config(quick, seed)
    if steps is not None:
        base.update(steps=steps)
    if seeds is not None:
        base.update(seeds=seeds)
    env = make_env(SimConfig(**base))
    out = {}
    for tau in TAUS:
        res = train(SimConfig(**{**base, "logz_init": "frozen", "paced_tau": tau}), env)
        h = res.history
        out[str(tau)] = {
            "step": h["step"],
            "acc": h["reward"],
            "acc_per_seed": res.extra["reward_per_seed"].tolist(),  # [logged step][seed]
            "steps_to_target": steps_to(h["step"], h["reward"], target),
            "final_acc": h["reward"][-1],
        }
    return out


@cached
def selection(seed: int) -> dict:
    """``paced.selection``: DISA's frozen Stage-1 labels (M = 8 samples of pi_ref, beta = 2) mapped to pass
    rates by the binary-reward identity select the 16 of 64 prompts nearest tau = 0.5; overlap with the
    oracle set (exact pass rates) over 50 label draws, and how far from tau the chosen prompts are."""
    env = envs.make_multiprompt(P=64, K=16, seed=seed)
    beta, M, m, tau = 2.0, 8, 16, 0.5
    g = torch.Generator().manual_seed(seed)
    n_rep = 50
    idx = env.sample(env.logp_ref.expand(n_rep, -1, -1), M, g)  # [R, P, M] from q = pi_ref
    log_w = est.log_importance_weights(env.ref_logp_of(idx), env.ref_logp_of(idx), beta * env.rewards_of(idx))
    p_hat = est.pass_rate_from_log_z(est.log_partition_lse(log_w), beta=beta)  # [R, P]
    p_true = env.pass_rate()  # [P]
    oracle = set(paced_obj.select_prompts(p_true, tau=tau, m=m).tolist())
    prec = []
    for r in range(n_rep):
        chosen = set(paced_obj.select_prompts(p_hat[r], tau=tau, m=m).tolist())
        prec.append(len(chosen & oracle) / m)
    mean_prec = sum(prec) / n_rep
    chance = m / env.P
    # |p_hat - p| of the selected prompts vs tau: how far from tau the chosen prompts really are
    sel_dist = torch.stack(
        [(p_true[paced_obj.select_prompts(p_hat[r], tau=tau, m=m)] - tau).abs().mean() for r in range(n_rep)]
    )
    rand_dist = (p_true - tau).abs().mean()
    return {
        "overlap": mean_prec,
        "chance": chance,
        "chosen_dist": float(sel_dist.mean()),
        "all_dist": float(rand_dist),
    }


#: ``paced.replay``'s paired seeds (fixed before the run that decides the check; 6 before).
REPLAY_SEEDS = 20
#: ``paced.replay``'s arms: no replay; replay *replacing* fresh samples (the compared arm: same rollouts, same
#: number of optimizer steps, same number of sample terms per step); replay *added* to the batch (more sample
#: terms per step than without replay: reported, not judged).
REPLAY_ARMS = {
    "none": dict(paced_replay=False),
    "replace": dict(paced_replay=True, paced_replay_mode="replace"),
    "add": dict(paced_replay=True, paced_replay_mode="add"),
}


def replay_config(seed: int, seeds: int = REPLAY_SEEDS) -> dict:
    """PACED (TB anchored on pi_old, learned log Z initialised from DISA): 8 of 32 prompts per step, G = 8,
    60 steps, buffer capacity 32 (16 pushed per step)."""
    return dict(
        env="multiprompt",
        P=32,
        K=16,
        method="tb",
        anchor="old",
        log_z="learned",
        tilt_beta=2.0,
        steps=60,
        G=8,
        lr=0.05,
        logz_lr=0.1,
        seeds=seeds,
        seed=seed,
        log_every=60,
        select_m=8,
        scheduler="logz",
        paced_tau=0.5,
        logz_init="frozen",
    )


@cached
def replay(seed: int, seeds: int = REPLAY_SEEDS) -> dict:
    """``paced.replay``: each arm of :data:`REPLAY_ARMS` trained from the same start (seed ``s`` of every arm
    draws the same initial log Z labels); final mean pass rate per seed, paired differences against no
    replay, their mean and 95% t interval, the sample terms per optimizer step of each arm (and how many of
    them were replayed), and on how many seeds the replace arm ended anywhere else than no replay.

    Returns ``numbers`` (flat, finite) and the per-seed differences ``diffs`` (replace - none) and
    ``diffs_add`` (add - none)."""
    base = replay_config(seed, seeds)
    env = envs.make_multiprompt(P=32, K=16, seed=0)
    finals, terms, replayed = {}, {}, {}
    for arm, kw in REPLAY_ARMS.items():
        res = train(SimConfig(**base, **kw), env)
        finals[arm] = env.pass_rate(res.logp).mean(-1)  # [S]
        terms[arm] = res.extra["update_terms"].to(torch.float64)  # [steps, S]
        replayed[arm] = res.extra["replay_terms"].to(torch.float64)
    numbers: dict = {"pairs": seeds, "steps": base["steps"]}
    for arm in REPLAY_ARMS:
        numbers[f"final_{arm}"] = float(finals[arm].mean())
        numbers[f"terms_per_step_{arm}"] = float(terms[arm].mean())
        numbers[f"terms_per_step_min_{arm}"] = float(terms[arm].min())
        numbers[f"terms_per_step_max_{arm}"] = float(terms[arm].max())
        numbers[f"replayed_per_step_{arm}"] = float(replayed[arm].mean())
    diffs = {arm: (finals[arm] - finals["none"]).tolist() for arm in ("replace", "add")}
    for arm, d in diffs.items():
        m, lo, hi = stats.paired_t_ci(d)
        numbers |= {f"diff_{arm}": m, f"diff_{arm}_lo": lo, f"diff_{arm}_hi": hi}
    # per seed: do the compared arms take the same number of sample terms at every step?
    numbers["equal_terms_replace"] = bool(torch.equal(terms["replace"], terms["none"]))
    numbers["equal_terms_add"] = bool(torch.equal(terms["add"], terms["none"]))
    numbers["seeds_differing_replace"] = int((finals["replace"] != finals["none"]).sum())
    return {"numbers": numbers, "diffs": diffs["replace"], "diffs_add": diffs["add"]}


def tau_items(sweep: dict, early_step: int = TAU_EARLY_STEP) -> dict[str, list[float]]:
    """Per-seed paired differences of ``paced.tau_sweep``'s three items (positive = the paper's direction;
    seed ``s`` of every tau draws the same initial log Z labels), from the mean pass rate over prompts:

    * ``tau05_best``: final acc(0.5) - mean(acc(0.1), acc(0.9));
    * ``tau01_worst``: mean of the final acc of the other taus - final acc(0.1);
    * ``tau09_fast_start``: acc(0.9) - mean of the other taus at ``early_step``.
    """
    step = sweep[str(TAUS[0])]["step"]
    if early_step not in step:
        raise ValueError(f"early_step must be a logged step of the sweep ({step[:4]}...), got {early_step}")
    at = {t: torch.tensor(sweep[str(t)]["acc_per_seed"], dtype=torch.float64) for t in TAUS}  # [logged, S]
    final = {t: v[-1] for t, v in at.items()}
    early = {t: v[step.index(early_step)] for t, v in at.items()}
    others = [t for t in TAUS if t != 0.1]
    rest = [t for t in TAUS if t != 0.9]
    items = {
        "tau05_best": final[0.5] - (final[0.1] + final[0.9]) / 2,
        "tau01_worst": torch.stack([final[t] for t in others]).mean(0) - final[0.1],
        "tau09_fast_start": early[0.9] - torch.stack([early[t] for t in rest]).mean(0),
    }
    return {k: v.tolist() for k, v in items.items()}


@cached
def tau_claim(seed: int) -> dict:
    """``paced.tau_sweep``: :func:`tau_sweep` at :data:`TAU_CLAIM` settings. Returns the sweep, the per-seed item
    differences (:func:`tau_items`) and ``numbers`` (final mean pass rates, best and worst tau, each item's mean
    difference and 95% paired t interval)."""
    sw = tau_sweep(seed=seed, **TAU_CLAIM)
    final = {t: sw[str(t)]["final_acc"] for t in TAUS}
    best, worst = max(final, key=final.get), min(final, key=final.get)
    numbers = {f"acc_tau{t}": v for t, v in final.items()} | {"best_tau": best, "worst_tau": worst}
    diffs = tau_items(sw)
    for name, d in diffs.items():
        m, lo, hi = stats.paired_t_ci(d)
        numbers |= {name: m, f"{name}_lo": lo, f"{name}_hi": hi}
    numbers["pairs"] = TAU_CLAIM["seeds"]
    return {"sweep": sw, "diffs": diffs, "numbers": numbers}
