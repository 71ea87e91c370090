"""The objectives of :class:`~tiltlab.llm.train.online.TiltGRPOTrainer`: one loss function per entry
the TRL trainer runs (:func:`~tiltlab.llm.train.online.config.objectives`), each building an
:class:`~tiltlab.objectives.registry.ObjectiveBatch` from TRL's batch and calling the registry (no
formula is written here)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from torch import Tensor

from tiltlab.objectives.catalog import SPECS, names, tb_loss_options
from tiltlab.objectives.correction import kl_penalty
from tiltlab.objectives.output import LossOutput
from tiltlab.objectives.registry import ObjectiveBatch, get_objective


class TrainerView(Protocol):
    """What a loss function reads of :class:`~tiltlab.llm.train.online.trainer.TiltGRPOTrainer`
    (a protocol, so that this module does not import the trainer, which imports it)."""

    args: Any
    kl_coef: float

    def _dapo_num_tokens(self, inputs: dict, mode: str) -> Tensor: ...

    def _learned_log_z(self, model: Any, b: LossBatch) -> Tensor: ...

    def _paced_log_z(self, model: Any, b: LossBatch) -> Tensor: ...


@dataclass
class LossBatch:
    """What a loss function of :data:`LOSSES` gets from :meth:`TiltGRPOTrainer._compute_loss`.

    ``logp`` ``[B, T]`` current token log-probs (with gradient); ``old`` ``[B, T]`` behaviour
    log-probs (``pi_old``); ``ref`` ``[B, T]`` or None, reference log-probs; ``mask`` ``[B, T]``
    float completion mask; ``isr`` TRL's ``importance_sampling_ratio`` (``[B, 1]`` or ``[B, T]``)
    or None and ``seq_w`` ``[B]`` its per-sequence form (:func:`~tiltlab.objectives.correction.
    sequence_is_weight`) or None; ``inputs`` the batch dict (``advantages``, ``rewards``,
    ``tb_reward``, ``log_z``: ``[B]``); ``prompt_ids`` / ``prompt_mask`` ``[B, P]``; ``mode``
    ``"train"`` or ``"eval"``.
    """

    logp: Tensor
    old: Tensor
    ref: Tensor | None
    mask: Tensor
    isr: Tensor | None
    seq_w: Tensor | None
    inputs: dict
    prompt_ids: Tensor
    prompt_mask: Tensor
    mode: str = "train"


_LOSS_AGG = {
    "grpo": "seq_mean_token_mean",
    "bnpo": "token_mean",
    "dapo": "token_mean",
    "dr_grpo": "seq_mean_token_sum_norm",
    "cispo": "token_mean",
    "sapo": "seq_mean_token_mean",
    "vespo": "token_mean",
}
"""TRL ``loss_type`` -> :func:`~tiltlab.objectives.pg.aggregate` mode (``dapo``, ``cispo``, ``vespo`` with
TRL's window token count; ``luspo``'s sequence mean of token sums is fixed by its function)."""
_WINDOW_TOKENS = ("dapo", "cispo", "vespo")
"""TRL's loss types normalized by the accumulation window's token count (no division by the accumulation steps)."""


LossFn = Callable[[TrainerView, Any, LossBatch], LossOutput]
"""``loss_fn(trainer, model, batch) -> LossOutput``; a ``log_z`` metric is logged as mean/std."""


def _with_kl(trainer: TrainerView, out: LossOutput, b: LossBatch, metrics: dict[str, Tensor]) -> LossOutput:
    """``loss + kl_coef * kl_penalty`` when TRL computed reference log-probs and ``beta != 0``
    (the KL term is not importance-weighted, as in TRL), with ``metrics``."""
    loss = out.loss
    if b.ref is not None and trainer.kl_coef:
        loss = loss + trainer.kl_coef * kl_penalty(b.logp, b.ref, b.mask)
    return LossOutput(loss, metrics)


def _off_policy(trainer: TrainerView, b: LossBatch) -> tuple[dict[str, Any], Tensor | None]:
    """``(options, sampler log-probs)``: TRL's ``off_policy_mask_threshold`` and the log-probs it
    compares with (vLLM's ``sampling_per_token_logps`` when present, else None: the loss function
    falls back to ``pi_old``'s)."""
    threshold = trainer.args.off_policy_mask_threshold
    if threshold is None:
        return {}, None
    sampler = b.inputs.get("sampling_per_token_logps")
    return {"off_policy_threshold": threshold}, None if sampler is None else sampler.float()


def _kept(out: dict[str, Tensor], m: Mapping[str, Tensor | float]) -> dict[str, Tensor]:
    if "off_policy_kept" in m:
        out["off_policy_kept"] = m["off_policy_kept"]
    return out


def _token_is_weight(b: LossBatch) -> Tensor | None:
    """TRL's vLLM IS ratio as the loss functions take it: ``[B, T]`` per token or ``[B]`` per sequence."""
    return None if b.isr is None else (b.isr[:, 0] if b.isr.shape[1] == 1 else b.isr)


def _policy(
    trainer: TrainerView, name: str, b: LossBatch, is_weight: Tensor | None, ref: bool = True, **options: Any
) -> LossOutput:
    """The registry's ``name`` (a GRPO-family loss) on TRL's batch: advantages, ``pi_old``, the
    reference log-probs (with ``ref``), the IS weight, the off-policy mask."""
    opsm, sampler = _off_policy(trainer, b)
    batch = ObjectiveBatch(
        b.logp, b.mask, token_logp_old=b.old, token_logp_ref=b.ref if ref else None, token_logp_sampler=sampler,
        advantages=b.inputs["advantages"], is_weight=is_weight,
    )  # fmt: skip
    return get_objective(name)(batch, **options, **opsm)


def _family(trainer: TrainerView, b: LossBatch) -> dict[str, Any]:
    """The options the GRPO family shares in TRL: the KL to ref with ``beta`` (ratio-weighted with
    ``use_bias_correction_kl``)."""
    return {
        "kl_coef": trainer.kl_coef if b.ref is not None else 0.0,
        "kl_ratio_weighted": bool(trainer.args.use_bias_correction_kl),
    }


def cispo_objective(trainer: TrainerView, model, b: LossBatch) -> LossOutput:
    """CISPO (:func:`~tiltlab.objectives.pg.cispo_loss`), TRL's ``loss_type="cispo"``: the token ratio
    capped at ``epsilon_high`` (stop-gradient), the window token count normalization."""
    args = trainer.args
    out = _policy(
        trainer, "cispo", b, _token_is_weight(b), ratio_max=args.epsilon_high,
        num_tokens=trainer._dapo_num_tokens(b.inputs, b.mode), **_family(trainer, b),
    )  # fmt: skip
    return LossOutput(out.loss, _kept({"clip_frac": out.metrics["clip_frac"]}, out.metrics))


def sapo_objective(trainer: TrainerView, model, b: LossBatch) -> LossOutput:
    """SAPO (:func:`~tiltlab.objectives.pg.sapo_loss`), TRL's ``loss_type="sapo"``: the sigmoid gate at
    ``sapo_temperature_pos/neg``, the sequence mean of token means."""
    args = trainer.args
    out = _policy(
        trainer, "sapo", b, _token_is_weight(b), temp_pos=args.sapo_temperature_pos,
        temp_neg=args.sapo_temperature_neg, **_family(trainer, b),
    )  # fmt: skip
    return LossOutput(out.loss, _kept({}, out.metrics))


def luspo_objective(trainer: TrainerView, model, b: LossBatch) -> LossOutput:
    """LUSPO (:func:`~tiltlab.objectives.pg.luspo_loss`), TRL's ``loss_type="luspo"`` at
    ``importance_sampling_level="sequence"``: GSPO's clip (``epsilon``/``epsilon_high``), each
    sequence weighted by its length."""
    args = trainer.args
    out = _policy(
        trainer, "luspo", b, _token_is_weight(b), clip_eps=args.epsilon, clip_eps_high=args.epsilon_high,
        **_family(trainer, b),
    )  # fmt: skip
    return LossOutput(out.loss, _kept({"clip_frac": out.metrics["clip_frac"]}, out.metrics))


def vespo_objective(trainer: TrainerView, model, b: LossBatch) -> LossOutput:
    """VESPO (:func:`~tiltlab.objectives.pg.vespo_loss`), TRL's ``loss_type="vespo"``: the Gamma weight
    (``vespo_k_pos`` ...) of the sequence ratio times vLLM's IS ratio (which does not multiply the
    loss), the window token count normalization."""
    args = trainer.args
    out = _policy(
        trainer, "vespo", b, _token_is_weight(b), k_pos=args.vespo_k_pos, lambda_pos=args.vespo_lambda_pos,
        k_neg=args.vespo_k_neg, lambda_neg=args.vespo_lambda_neg,
        num_tokens=trainer._dapo_num_tokens(b.inputs, b.mode), **_family(trainer, b),
    )  # fmt: skip
    return LossOutput(out.loss, _kept({"vespo/phi_mean": out.metrics["phi_mean"]}, out.metrics))


def grpo_objective(trainer: TrainerView, model, b: LossBatch) -> LossOutput:
    """GRPO (:func:`~tiltlab.objectives.pg.grpo_loss`): token ratio, clip ``epsilon``/``epsilon_high``,
    KL to ref with TRL's ``beta`` (ratio-weighted with ``use_bias_correction_kl``); TRL's IS ratio
    per token or per sequence; TRL's ``loss_type`` normalization."""
    args = trainer.args
    loss_type = str(args.loss_type)
    out = _policy(
        trainer, "grpo", b, _token_is_weight(b), clip_eps=args.epsilon, clip_eps_high=args.epsilon_high,
        loss_agg=_LOSS_AGG[loss_type], max_len=args.max_completion_length,
        num_tokens=trainer._dapo_num_tokens(b.inputs, b.mode) if loss_type == "dapo" else None,
        dual_clip=args.dual_clip, log_ratio_clip=args.log_ratio_clip, kl_estimator=args.kl_estimator,
        **_family(trainer, b),
    )  # fmt: skip
    return LossOutput(out.loss, _kept({"clip_frac": out.metrics["clip_frac"]}, out.metrics))


def gspo_objective(trainer: TrainerView, model, b: LossBatch) -> LossOutput:
    """GSPO (:func:`~tiltlab.objectives.pg.gspo_loss`): sequence ratio, sequence IS weight, KL to ref."""
    args = trainer.args
    out = _policy(trainer, "gspo", b, b.seq_w, ref=False, clip_eps=args.epsilon, clip_eps_high=args.epsilon_high)
    return _with_kl(trainer, out, b, _kept({"clip_frac": out.metrics["clip_frac"]}, out.metrics))


def lad_objective(trainer: TrainerView, model, b: LossBatch) -> LossOutput:
    """LAD (:func:`~tiltlab.objectives.lad.lad_loss`) at token level (per-token IS ratio, mean over
    tokens then sequences) or sequence level (length-normalized log-probs, sequence IS weight)."""
    args = trainer.args
    token = args.lad_level == "token"
    batch = ObjectiveBatch(
        b.logp, b.mask, token_logp_old=b.old, advantages=b.inputs["advantages"],
        is_weight=_token_is_weight(b) if token else b.seq_w,
    )  # fmt: skip
    level = (
        {"level": "token", "loss_agg": "seq_mean_token_mean"}
        if token
        else {"level": "sequence", "logprob_scale": "mean"}
    )
    out = get_objective("lad")(batch, eta=args.lad_eta, divergence=args.lad_divergence, **level)
    return _with_kl(trainer, out, b, {})


def _tb_logged(out: LossOutput, log_z: Tensor) -> LossOutput:
    """The TB family's loss with the metrics the trainer logs: log Z, the mean absolute residual and the
    per-sequence residuals (the trainer's diagnostics: quantiles, signs), the rollout weight's clip
    fraction and mean."""
    m = out.metrics
    return LossOutput(
        out.loss,
        {
            "log_z": log_z.detach(),
            "residual": m["residual_abs_mean"],
            "residuals": m["residuals"],
            "weight_clip_frac": m["weight_clip_frac"],
            "weight_mean": m["weight_mean"],
        },
    )


def flowrl_objective(trainer: TrainerView, model, b: LossBatch) -> LossOutput:
    """FlowRL (:func:`~tiltlab.objectives.tb.flowrl_loss`) with the learned log Z head."""
    args = trainer.args
    log_z = trainer._learned_log_z(model, b)
    batch = ObjectiveBatch(
        b.logp, b.mask, token_logp_old=b.old, token_logp_ref=b.ref, rewards=b.inputs["tb_reward"][:, None],
        log_z=log_z, is_weight=b.seq_w,
    )  # fmt: skip
    out = get_objective("flowrl")(batch, group_normalize=False, **tb_loss_options(args))
    return _tb_logged(out, log_z)


def _tb_family(
    trainer: TrainerView, name: str, b: LossBatch, log_z: Tensor, reward: Tensor, **options: Any
) -> LossOutput:
    """The registry's TB entry ``name`` on TRL's batch at ``logprob_scale``, with the TB rollout weight
    (:func:`~tiltlab.objectives.tb.tb_importance_weight` at TRL's clip options) times the sampler's
    sequence IS weight; its clip fraction is of the TB weight at its own clip bounds, before the
    sampler IS weight multiplies it (as in :func:`~tiltlab.objectives.tb.flowrl_loss`)."""
    args = trainer.args
    batch = ObjectiveBatch(
        b.logp, b.mask, token_logp_old=b.old, token_logp_ref=b.ref, rewards=reward, log_z=log_z, is_weight=b.seq_w
    )
    knobs = {k: v for k, v in tb_loss_options(args).items() if k != "tilt_beta"}  # the tilt comes in options
    out = get_objective(name)(batch, **knobs, **options)
    return _tb_logged(out, log_z)


def disa_objective(trainer: TrainerView, model, b: LossBatch) -> LossOutput:
    """DISA Stage 3 (:func:`~tiltlab.objectives.tb.disa_loss`): TB with the frozen Stage-2 log Z."""
    return _tb_family(
        trainer, "disa", b, b.inputs["log_z"].float(), b.inputs["tb_reward"].float(), tilt_beta=trainer.args.tilt_beta
    )


def vargrad_objective(trainer: TrainerView, model, b: LossBatch) -> LossOutput:
    """VarGrad: TB (:func:`~tiltlab.objectives.tb.tb_loss`) at the per-group batch-optimal log Z
    computed at generation time (:func:`~tiltlab.objectives.tb.vargrad_log_z`), held fixed."""
    return _tb_family(
        trainer,
        "vargrad",
        b,
        b.inputs["log_z"].float(),
        b.inputs["tb_reward"].float(),
        tilt_beta=trainer.args.tilt_beta,
    )


def paced_objective(trainer: TrainerView, model, b: LossBatch) -> LossOutput:
    """PACED-RL: TB anchored on ``pi_old`` with tilt ``r / paced_kl_coef`` and the learned log Z head."""
    log_z = trainer._paced_log_z(model, b)
    return _tb_family(trainer, "paced", b, log_z, b.inputs["rewards"].float(), kl_coef=trainer.args.paced_kl_coef)


LOSSES: dict[str, LossFn] = {
    "grpo": grpo_objective,
    "gspo": gspo_objective,
    "cispo": cispo_objective,
    "sapo": sapo_objective,
    "luspo": luspo_objective,
    "vespo": vespo_objective,
    "flowrl": flowrl_objective,
    "disa": disa_objective,
    "vargrad": vargrad_objective,
    "lad": lad_objective,
    "paced": paced_objective,
}
"""Objective name -> the loss function of the objectives whose TRL batch or options are their own; a
declared ``online`` objective of the ``pg`` family without an entry here runs through
:func:`policy_objective` (see :func:`loss_function`)."""
if not set(LOSSES) <= set(names("online")):  # pragma: no cover - a module-level consistency check
    raise ImportError(f"LOSSES {sorted(set(LOSSES) - set(names('online')))} are not declared online objectives")


def policy_objective(trainer: TrainerView, model, b: LossBatch) -> LossOutput:
    """A GRPO-family objective on TRL's batch with the family's shared options only: the registry's
    entry ``trainer.args.objective`` at its declared defaults, TRL's IS ratio per token, the KL to ref
    with TRL's ``beta`` (its loss function takes ``kl_coef`` / ``kl_ratio_weighted``)."""
    out = _policy(trainer, str(trainer.args.objective), b, _token_is_weight(b), **_family(trainer, b))
    return LossOutput(out.loss, _kept({k: v for k, v in out.metrics.items() if k == "clip_frac"}, out.metrics))


def loss_function(objective: str) -> LossFn:
    """The TRL loss function of ``objective``: its :data:`LOSSES` entry, or :func:`policy_objective` for a
    declared ``online`` objective of the ``pg`` family; any other is a one-line error."""
    if objective in LOSSES:
        return LOSSES[objective]
    if objective not in names("online"):
        raise ValueError(f"objective {objective!r} is not run by the TRL trainer; choose from {names('online')}")
    if SPECS[objective].family == "pg":
        return policy_objective
    raise ValueError(
        f"objective {objective!r} (family {SPECS[objective].family!r}) has no TRL loss function: add one to LOSSES"
    )
