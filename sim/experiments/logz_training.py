"""Where log Z matters for TB, measured through the simulator's trainers: the gradient at pi* with a
prompt-only log Z bias (DISA App. C.3, Prop. 3(ii)), training with a fixed behaviour policy (DISA App. C.5)
and the invariance of the expected on-policy semi-gradient to a prompt-only log Z (a result beyond the
papers, ``docs/math.md`` §1).
"""

from __future__ import annotations

import torch

from tiltlab.sim import envs
from tiltlab.sim.config import SimConfig
from tiltlab.sim.experiments import cached
from tiltlab.sim.train import gradient_at, train

#: The prompt-only log Z biases b of ``disa.beyond.semigradient_invariance``.
INVARIANCE_BIASES = (0.0, -1.0, 1.0, -3.0)


def multiprompt_env(P: int = 8, K: int = 12, seed: int = 0) -> envs.BanditEnv:
    return envs.make_multiprompt(P=P, K=K, seed=seed, p_min=0.05, p_max=0.9)


def _grad_norm_at_target(bias: float, fixed_behaviour: bool, seed: int) -> float:
    env = multiprompt_env(seed=seed)
    cfg = SimConfig(env="multiprompt", method="tb", log_z="exact", log_z_bias=bias, tilt_beta=2.0, exact=True, seeds=1)
    tgt = env.target_logp(2.0)[None]  # logits = log pi*
    logp_old = None
    if fixed_behaviour:
        g = torch.Generator().manual_seed(seed + 1)
        logp_old = torch.log_softmax(torch.randn(1, env.P, env.K, generator=g, dtype=torch.float64), -1)
    return float(gradient_at(cfg, env, tgt.clone(), logp_old=logp_old).norm())


@cached
def biased_stationary(seed: int) -> dict:
    """On-policy exact semi-gradient of TB at pi* with log Z = log Z* + b, for several prompt-only b."""
    norms = {b: _grad_norm_at_target(b, False, seed) for b in (-2.0, -0.5, 0.5, 1.0)}
    return {f"grad_norm_b{b:+.1f}": v for b, v in norms.items()}


@cached
def offpolicy_drift(seed: int) -> dict:
    """Fixed behaviour pi_b != pi*: the gradient at pi* is nonzero for b != 0 and training settles elsewhere."""
    g0 = _grad_norm_at_target(0.0, True, seed)
    g5 = _grad_norm_at_target(0.5, True, seed)
    env = multiprompt_env(seed=seed)
    common = dict(
        env="multiprompt",
        method="tb",
        log_z="exact",
        tilt_beta=2.0,
        exact=True,
        steps=400,
        lr=0.1,
        init_scale=1.0,
        seeds=2,
        seed=seed,
        log_every=400,
        refresh_every=10_000,
    )
    tv0 = train(SimConfig(**common, log_z_bias=0.0), env).final("tv")
    tv5 = train(SimConfig(**common, log_z_bias=0.5), env).final("tv")
    return {"grad_b0": g0, "grad_b05": g5, "tv_b0": tv0, "tv_b05": tv5}


@cached
def semigradient_invariance(seed: int) -> dict:
    """Expected on-policy semi-gradient at random theta for several prompt-only log Z (identical), and
    the sampled-gradient variance for each (different): log Z acts as a baseline."""
    env = multiprompt_env(seed=seed)
    g = torch.Generator().manual_seed(seed)
    logits = env.logp_ref[None] + torch.randn(1, env.P, env.K, generator=g, dtype=torch.float64)
    biases = INVARIANCE_BIASES
    grads = [
        gradient_at(
            SimConfig(env="multiprompt", method="tb", log_z="exact", log_z_bias=b, tilt_beta=2.0, exact=True, seeds=1),
            env,
            logits,
        )
        for b in biases
    ]
    zero = gradient_at(
        SimConfig(env="multiprompt", method="tb", log_z="zero", tilt_beta=2.0, exact=True, seeds=1), env, logits
    )
    scale = float(grads[0].norm())
    diff = max(float((x - grads[0]).norm()) for x in [*grads[1:], zero]) / scale
    var = {}
    for b in biases:
        cfg = SimConfig(
            env="multiprompt", method="tb", log_z="exact", log_z_bias=b, tilt_beta=2.0, G=8, seeds=1, seed=seed
        )
        d = gradient_at(cfg, env, logits, draws=200)  # [D, 1, P, K]
        var[b] = float(d.var(0).sum(-1).mean())
    return {"max_rel_diff": diff, **{f"grad_var_b{b:+g}": v for b, v in var.items()}}
