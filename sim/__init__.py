"""tiltlab.sim: an exact, enumerable simulator of distribution-matching RL.

Policies are tabular softmax logits ``[S, P, K]`` (seeds, prompts, outcomes) in float64, so every
expectation has an exact value next to its Monte-Carlo estimate. All loss math is imported from
``objectives``; this package only supplies log-probabilities, rewards and samplers.

Entry points: :func:`tiltlab.sim.run` with :class:`tiltlab.sim.SimConfig` (script; defined in
``sim.config``, re-exported by ``sim.api``), ``tiltlab sim`` / ``tiltlab figures`` (command line).

Internal layers, each importing only the ones below it: ``cli`` > ``figures`` | ``checks`` >
``experiments`` > ``api`` > ``train`` > ``config``, with the environments and samplers (``envs``,
``proposals``, ``exact``, ``token_tree``) underneath ``train``.
"""

from __future__ import annotations

if __name__ != "tiltlab.sim":  # imported by its bare folder name (the repo root is on sys.path)
    raise ImportError(f"import this package as tiltlab.sim, not as {__name__!r}")


__all__ = ["RunResult", "SimConfig", "run"]


def __getattr__(name: str):  # lazy: importing sim must not import torch-heavy modules eagerly
    if name in ("RunResult", "SimConfig"):
        from tiltlab.sim import config

        return getattr(config, name)
    if name == "run":
        from tiltlab.sim import api

        return api.run
    raise AttributeError(f"module 'sim' has no attribute {name!r}")
