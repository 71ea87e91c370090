"""tiltlab's objectives inside veRL 0.9.1 (optional extra ``tiltlab[verl]``; ``docs/verl.md``).

Importing this module registers, in veRL's own registries (``verl.trainer.ppo.core_algos``):

* policy losses (``actor_rollout_ref.actor.policy_loss.loss_mode=<name>``), called by veRL's actor
  as ``fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
  rollout_is_weights) -> (loss, metrics)`` on ``[B, T]`` response tensors:

  - ``tiltlab_grpo``: :func:`tiltlab.objectives.pg.grpo_loss` with veRL's ``loss_agg_mode`` mapped
    to tiltlab's aggregation (:data:`VERL_AGG`), clip ``clip_ratio_low`` / ``clip_ratio_high`` and
    the dual clip ``clip_ratio_c``; ``tiltlab_grpo_<agg>`` fixes the aggregation to one of
    tiltlab's modes (``token_mean``, ``seq_mean_token_mean``, ``seq_mean_token_sum_norm``)
    whatever ``loss_agg_mode`` says;
  - ``tiltlab_gspo``: :func:`tiltlab.objectives.pg.gspo_loss` (sequence ratio);
  - ``tiltlab_cispo``: :func:`tiltlab.objectives.pg.cispo_loss` with veRL's CISPO clip of the
    stop-gradient ratio to ``[1 - clip_ratio_low, 1 + clip_ratio_high]`` and veRL's aggregation
    (TRL's ``cispo`` caps at ``epsilon_high`` with no floor: see that function);
  - ``tiltlab_sapo``: :func:`tiltlab.objectives.pg.sapo_loss` at veRL's ``tau_pos`` / ``tau_neg``,
    a sequence mean of token means whatever ``loss_agg_mode`` says (as veRL's ``sapo``);
  - ``tiltlab_lad_<divergence>`` (token ratios, veRL's aggregation) and
    ``tiltlab_lad_<divergence>_seq`` (length-normalized sequence ratios):
    :func:`tiltlab.objectives.lad.lad_loss` at ``eta = 1`` for each of the six f-divergences;
    :func:`register_lad` adds other temperatures.

* advantage estimators (``algorithm.adv_estimator=<name>``), called by veRL's driver as
  ``fn(token_level_rewards, response_mask, config, index) -> (advantages, returns)``:
  ``tiltlab_grpo`` / ``tiltlab_grpo_batch`` / ``tiltlab_drgrpo`` =
  :func:`tiltlab.objectives.pg.group_advantages` with ``scale="std"`` / ``"batch"`` / ``"none"``.

The trajectory-balance family does not fit the policy-loss interface (it needs ``pi_ref``
log-probs, the reward and a ``log Z`` per sequence): :func:`tb_loss_fn` replaces veRL's whole
actor loss (veRL's engine path, ``loss_fn(config, model_output, data, dp_group)``), installed by
:func:`worker_class` (an ``ActorRolloutRefWorker`` subclass) and launched by :func:`main`
(``python -m tiltlab.llm.verl``; a Hydra entry on top of veRL's ``ppo_trainer`` config). DISA's frozen
label travels in each row's ``extra_info`` (:func:`verl_rows`, the ``prepare`` step); FlowRL's and
PACED's learned log Z comes from a head on the policy (:func:`log_z_engine_class`).

All loss math is tiltlab's (``tiltlab.objectives``); this module only maps veRL's shapes, names
and global-batch normalization onto it. veRL conventions that differ are stated where they apply.
"""

from __future__ import annotations

try:  # veRL's core_algos imports ray, tensordict, omegaconf, codetiming, pyvers and orjson
    from verl.trainer.ppo import core_algos  # noqa: F401  (the import that needs the extra)
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "tiltlab.llm.verl needs veRL 0.9.1 and the packages its core_algos imports: "
        "pip install --no-deps verl==0.9.1 tensordict==0.15.3 && pip install 'tiltlab[verl]' "
        f"({type(e).__name__}: {e})"
    ) from e

from .policy import ADV_ESTIMATORS, POLICY_LOSSES, VERL_AGG, register, register_lad, sequence_advantages
from .runner import compute_score, main, prepare, verl_rows, worker_class
from .tb import (
    ENGINE_VENDOR,
    LOG_Z_KEY,
    TBSettings,
    log_z_engine_class,
    pool_prompt_hidden,
    tb_loss_fn,
    tb_objectives,
    use_log_z_engine,
)

__all__ = [
    "ADV_ESTIMATORS",
    "ENGINE_VENDOR",
    "LOG_Z_KEY",
    "POLICY_LOSSES",
    "VERL_AGG",
    "TBSettings",
    "compute_score",
    "log_z_engine_class",
    "main",
    "pool_prompt_hidden",
    "prepare",
    "register",
    "register_lad",
    "sequence_advantages",
    "tb_loss_fn",
    "tb_objectives",
    "use_log_z_engine",
    "verl_rows",
    "worker_class",
]


register()
