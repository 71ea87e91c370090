"""Scriptable entry point: ``sim.run(SimConfig(...)) -> RunResult``.

Example::

    from tiltlab import sim
    res = sim.run(sim.SimConfig(env="multiprompt", method="tb", log_z="frozen", steps=300))
    print(res.history["tv"][-1])

The same dataclass backs ``tiltlab sim`` (every field is a command-line option) and the tests.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from tiltlab.sim.config import LOG_Z_MODES, RunResult, SimConfig, methods
from tiltlab.sim.train import train

__all__ = ["LOG_Z_MODES", "RunResult", "SimConfig", "make_env", "methods", "run"]


def make_env(cfg: SimConfig):
    """Build the environment a config names."""
    from tiltlab.sim import envs

    if cfg.env == "multiprompt":
        return envs.make_multiprompt(P=cfg.P, K=cfg.K, seed=cfg.env_seed, p_min=cfg.p_min, p_max=cfg.p_max)
    if cfg.env == "bandit":
        return envs.make_bandit(K=cfg.K, seed=cfg.env_seed)
    if cfg.env == "lad_bandit":
        return envs.make_lad_bandit(K=50 if cfg.K == 16 else cfg.K, eta=cfg.lad_eta)
    if cfg.env == "two_outcome":
        return envs.make_two_outcome()
    raise ValueError(f"unknown env {cfg.env!r} (multiprompt|bandit|lad_bandit|two_outcome)")


def run(cfg: SimConfig, env=None) -> RunResult:
    """Run one experiment (``env`` overrides the config's environment)."""
    cfg.validate()
    return train(cfg, make_env(cfg) if env is None else env)


def config_fields() -> list[tuple[str, type, Any]]:
    return [(f.name, f.type, f.default) for f in fields(SimConfig)]
