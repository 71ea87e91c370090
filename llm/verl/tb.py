"""The trajectory-balance family as veRL's whole actor loss (:func:`tb_loss_fn`), its settings
(:class:`TBSettings`) and the learned log Z head engine (:func:`log_z_engine_class`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from typing import Any

import torch
from torch import Tensor

from tiltlab.llm.base.models import masked_mean_pool
from tiltlab.llm.disa.logz_head import attach_log_z_head, get_log_z_head, is_log_z_head_param
from tiltlab.objectives.catalog import (
    TB_OPTIONS,
    default_logprob_scale,
    names,
    options_dataclass,
    refuse_old_names,
    renamed,
    tb_loss_options,
)
from tiltlab.objectives.registry import ObjectiveBatch, get_objective
from tiltlab.objectives.transforms import affine_reward

from .policy import _cfg_get

# ----------------------------------------------------------------- trajectory balance (actor loss)


def tb_objectives() -> tuple[str, ...]:
    """The TB objectives the veRL plug-in runs as the whole actor loss: declared with trainer ``verl``,
    family ``tb``."""
    return names("verl", family="tb")


LOG_Z_KEY = "tiltlab_log_z"
"""Where the data step writes DISA's frozen label (``extra_info[LOG_Z_KEY]`` of each row) and where the
log Z head engine puts the learned log Z in the model output."""


_TBOptions = options_dataclass("_TBOptions", TB_OPTIONS)


@dataclass
class TBSettings(_TBOptions):
    """The TB objective run inside veRL's actor (``actor_rollout_ref.tiltlab`` in the Hydra config).

    Besides the fields below, the TB family's knobs (``tilt_beta``, ``reward_scale``, ``reward_shift``,
    ``logprob_scale``, ``weight_clip``, ``max_weight``, ``weight_eps``, ``weight_eps_high``) are the
    fields of :data:`~tiltlab.objectives.catalog.TB_OPTIONS`, under the names the registry and the TRL
    trainer use (``reward_scale`` / ``reward_shift`` must equal Stage 1's for DISA labels;
    ``logprob_scale`` None is the objective's default: ``mean`` for flowrl, ``sum`` otherwise)."""

    objective: str = "disa"
    """``disa`` (frozen Stage-2 ``log Z`` from the label column), ``flowrl`` or ``paced`` (learned
    ``log Z`` from the model output ``tiltlab_log_z``)."""
    paced_kl_coef: float = 1.0
    """PACED's tilt ``r / paced_kl_coef`` (the TB anchor is ``pi_old``)."""
    log_z_key: str = "tiltlab_log_z"
    """the per-row frozen ``log Z`` column (disa) / the model-output key of the learned one."""
    log_z_hidden: int = 256
    """width of the learned log Z head (flowrl, paced; :class:`tiltlab.llm.disa.logz_head.LogZHead`)."""
    log_z_layers: int = 3
    """Linear layers of the head (FlowRL: 3)."""
    log_z_dropout: float = 0.1
    """dropout in the head (FlowRL: 0.1)."""

    def __post_init__(self) -> None:
        if self.objective not in tb_objectives():
            raise ValueError(f"objective must be one of {tb_objectives()}, got {self.objective!r}")
        if not self.tilt_beta > 0 or not self.paced_kl_coef > 0:
            raise ValueError(f"tilt_beta and paced_kl_coef must be > 0, got {self.tilt_beta}, {self.paced_kl_coef}")
        if self.logprob_scale is None:
            self.logprob_scale = default_logprob_scale(self.objective)
        for option in TB_OPTIONS:
            option.check(getattr(self, option.name))

    @classmethod
    def from_config(cls, cfg: Any) -> TBSettings:
        """From a mapping (an omegaconf node or a dict); old and unknown keys are refused by name."""
        d = dict(cfg or {})
        renamed(d, "actor_rollout_ref.tiltlab", _RENAMED)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"actor_rollout_ref.tiltlab: unknown keys {unknown}; expected some of {sorted(known)}")
        return cls(**d)


_RENAMED = {"beta": "tilt_beta (the tilt multiplying the reward)"}
refuse_old_names(TBSettings, "TBSettings", _RENAMED)  # old knob names refused naming the new


def _label_column(data: Any, key: str, n: int) -> Tensor:
    """The frozen per-row ``log Z`` of veRL's batch, ``[n]``: ``extra_info[key]`` (where the data step
    writes it: veRL keeps ``extra_info`` with the batch through generation) or a top-level column
    ``key`` (a tensor, or the NonTensorStack that ``DataProto.to_tensordict`` makes of a
    ``non_tensor_batch`` entry)."""
    if key in data:
        col = data[key]
        if isinstance(col, Tensor) and not col.is_nested:
            out = col.reshape(-1).to(torch.float64)
        else:
            out = torch.tensor([float(x) for x in col.tolist()], dtype=torch.float64)
    elif "extra_info" in data:
        infos = data["extra_info"].tolist()
        if not all(isinstance(i, dict) and key in i for i in infos):
            raise ValueError(f"extra_info[{key!r}]: DISA needs the frozen log Z in every row's extra_info")
        out = torch.tensor([float(i[key]) for i in infos], dtype=torch.float64)
    else:
        raise ValueError(
            f"{key}: DISA needs the frozen log Z per row (extra_info[{key!r}], written by the data step "
            "`python -m tiltlab.llm.verl prepare`), found neither it nor extra_info in the batch"
        )
    if out.shape != (n,):
        raise ValueError(f"{key} must hold one value per row ({n}), got {tuple(out.shape)}")
    return out


def tb_loss_fn(
    config: Any, model_output: dict[str, Any], data: Any, dp_group: Any = None, *, settings: TBSettings
) -> tuple[Tensor, dict[str, Any]]:
    """veRL engine actor loss for the TB family (replaces ``verl.workers.utils.losses.ppo_loss``).

    Reads from veRL's micro-batch ``data`` (a TensorDict): ``old_log_probs`` and ``ref_log_prob``
    ``[B, T]`` (the reference worker runs when ``actor.use_kl_loss=true``), ``response_mask``, the
    reward ``token_level_scores`` ``[B, T]`` (summed over the response), and for DISA the frozen
    label column ``settings.log_z_key``; from ``model_output`` the current log-probs (veRL's nested
    ``log_probs``) and, for FlowRL / PACED, the learned ``log Z`` ``[B]`` under ``settings.log_z_key``.

    The loss of a micro-batch is tiltlab's mean over its ``B`` sequences times
    ``B * dp_size / global_batch_size``: veRL sums micro-batch gradients and averages ranks, so the
    optimizer step sees the mean over the mini-batch (as veRL's own seq-mean losses).
    """
    from verl.workers.utils.padding import no_padding_2_padding

    if _cfg_get(config, "use_kl_loss", False) and float(_cfg_get(config, "kl_loss_coef", 0.0)) != 0.0:
        raise ValueError(
            "actor.kl_loss_coef: TB is anchored on pi_ref itself; set kl_loss_coef=0 (use_kl_loss=true only "
            "makes veRL compute the reference log-probs)"
        )
    log_prob = no_padding_2_padding(model_output["log_probs"], data)  # [B, T]
    keys = ["response_mask", "old_log_probs", "token_level_scores"]
    if settings.objective != "paced":
        keys.append("ref_log_prob")
    missing = [k for k in keys if k not in data]
    if missing:
        raise ValueError(
            f"data: the TB loss needs {missing} in veRL's batch (ref_log_prob: set actor.use_kl_loss=true)"
        )
    if "rollout_is_weights" in data:
        raise ValueError("rollout_is_weights: the TB recipe does not apply veRL's rollout correction; turn it off")
    d = data.select(*keys).to_padded_tensor()
    mask = d["response_mask"].to(log_prob.dtype)
    old = d["old_log_probs"].to(log_prob.dtype)
    b = mask.shape[0]
    reward = affine_reward(
        d["token_level_scores"].sum(-1).to(log_prob.dtype), settings.reward_scale, settings.reward_shift
    )
    ref = d["ref_log_prob"].to(log_prob.dtype) if settings.objective != "paced" else None
    if settings.objective == "disa":
        log_z = _label_column(data, settings.log_z_key, b).to(log_prob.device)
    else:
        if settings.log_z_key not in model_output:
            raise ValueError(
                f"model_output[{settings.log_z_key!r}]: {settings.objective} needs the learned log Z [B] from the "
                "model (a log Z head on the actor); the model output has none"
            )
        log_z = model_output[settings.log_z_key].reshape(-1)
    log_z = log_z.to(log_prob.dtype)
    batch = ObjectiveBatch(log_prob, mask, token_logp_old=old, token_logp_ref=ref, rewards=reward, log_z=log_z)
    # the TB family's knobs under their one name (the reward transform is applied above)
    options = tb_loss_options(settings)
    if settings.objective == "flowrl":  # FlowRL's loss with its code choices off: TB on r~ at beta, learned log Z
        batch = replace(batch, rewards=reward[:, None])
        options["group_normalize"] = False
    elif settings.objective == "paced":  # TB anchored on pi_old with the tilt r / kl_coef
        del options["tilt_beta"]
        options["kl_coef"] = settings.paced_kl_coef
    out = get_objective(settings.objective)(batch, **options)
    loss = out.loss
    dp = int(_get_non_tensor(data, "dp_size", 1) or 1)
    gbs = _get_non_tensor(data, "global_batch_size", None)
    factor = 1.0 if gbs is None else b * dp / float(gbs)
    metrics = {
        "actor/tb_loss": float(loss.detach()),
        "actor/log_z_mean": float(log_z.detach().float().mean()),
        "actor/residual_abs_mean": float(out.metrics["residual_abs_mean"]),
        "actor/weight_mean": float(out.metrics["weight_mean"]),
    }
    return loss * factor, metrics


def _get_non_tensor(data: Any, key: str, default: Any) -> Any:
    from verl.utils import tensordict_utils as tu

    return tu.get_non_tensor_data(data=data, key=key, default=default)


# ------------------------------------------------------------------------------ learned log Z head
ENGINE_VENDOR = "tiltlab_log_z"
"""veRL engine-registry vendor key of :func:`log_z_engine_class` (selected with ``VERL_ENGINE_VENDOR``)."""
_LOG_Z_ENGINE: list[type] = []


def _prompt_lengths(data: Any) -> Tensor:
    """``[B]`` prompt token counts of veRL's micro-batch (as ``no_padding_2_padding`` computes them)."""
    prompts = data["prompts"]
    if prompts.is_nested:
        return prompts.offsets().diff()
    return data["attention_mask"][:, : prompts.shape[1]].sum(dim=1)


def pool_prompt_hidden(hidden: Tensor, data: Any, remove_padding: bool) -> Tensor:
    """``[B, H]``: each row's mean final hidden state over its prompt tokens, from the hidden states of
    veRL's forward -- packed ``[1, N, H]`` (``use_remove_padding``: rows back to back, row ``i`` from
    ``offsets[i]``) or ``[B, S, H]`` (each row's tokens first, right-padded). Prompt tokens come first
    in every row, so this is FlowRL's input to its log Z head (a masked mean over the prompt)."""

    p = _prompt_lengths(data).to(hidden.device)
    if remove_padding:
        starts = data["input_ids"].offsets()[:-1].to(hidden.device)
        n = hidden.shape[-2]
        pos = torch.arange(n, device=hidden.device)[None, :]
        w = ((pos >= starts[:, None]) & (pos < (starts + p)[:, None])).to(hidden.dtype)  # [B, N]
        return (w @ hidden.reshape(n, -1)) / p[:, None].to(hidden.dtype)
    mask = torch.arange(hidden.shape[1], device=hidden.device)[None, :] < p[:, None]
    return masked_mean_pool(hidden, mask)


def log_z_engine_class() -> type:
    """veRL's FSDP LM engine with FlowRL's learned ``log Z`` head on the policy (built once per process).

    - the head (:func:`tiltlab.llm.disa.logz_head.attach_log_z_head`) is attached before FSDP wraps
      the model, so FSDP shards it and the optimizer trains it with the policy (FlowRL's recipe does the
      same in its worker);
    - each forward runs the head inside the model's forward (a hook on the decoder's final norm, where
      FSDP holds the parameters unsharded) on the prompt-pooled hidden state
      (:func:`pool_prompt_hidden`), and puts ``[B]`` log Z in the model output under :data:`LOG_Z_KEY`;
    - the head's parameters are left out of the weights sent to the rollout engine (vLLM has no such module).
    """
    if _LOG_Z_ENGINE:
        return _LOG_Z_ENGINE[0]
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    class TiltlabLogZEngine(FSDPEngineWithLMHead):  # type: ignore[misc, valid-type]
        head_kwargs: dict[str, Any] = {}  # noqa: RUF012 - set by the worker from TBSettings

        def _build_module(self) -> Any:
            module = super()._build_module()
            if not self.engine_config.forward_only:  # the trained policy gets a head; pi_ref needs none
                attach_log_z_head(module, **self.head_kwargs)
            return module

        def forward_step(self, micro_batch: Any, loss_function: Any, forward_only: bool) -> Any:
            head = get_log_z_head(self.module, required=False)
            if head is None:
                return super().forward_step(micro_batch, loss_function, forward_only)
            if self.use_ulysses_sp:
                raise NotImplementedError("the log Z head does not support Ulysses sequence parallelism")
            remove_padding = tu.get_non_tensor_data(data=micro_batch, key="use_remove_padding", default=True)
            box = self._tiltlab_box = {}

            def run_head(module: Any, inputs: Any, output: Any) -> None:
                hidden = output[0] if isinstance(output, tuple) else output
                box["log_z"] = head(pool_prompt_hidden(hidden, micro_batch, remove_padding))

            handle = self.module.get_decoder().norm.register_forward_hook(run_head)
            try:
                return super().forward_step(micro_batch, loss_function, forward_only)
            finally:
                handle.remove()
                box.clear()

        def prepare_model_outputs(self, output: Any, output_args: Any, micro_batch: Any, logits_processor_func: Any):
            out = super().prepare_model_outputs(output, output_args, micro_batch, logits_processor_func)
            box = getattr(self, "_tiltlab_box", {})
            if "log_z" in box:
                out[LOG_Z_KEY] = box.pop("log_z")
            return out

        def get_per_tensor_param(self, *args: Any, **kwargs: Any) -> Any:
            gen, meta = super().get_per_tensor_param(*args, **kwargs)
            return (x for x in gen if not is_log_z_head_param(x[0])), meta

        def get_per_tensor_param_shard(self, *args: Any, **kwargs: Any) -> Any:
            gen, meta = super().get_per_tensor_param_shard(*args, **kwargs)
            return (x for x in gen if not is_log_z_head_param(x[0])), meta

    _LOG_Z_ENGINE.append(TiltlabLogZEngine)
    return TiltlabLogZEngine


def use_log_z_engine(settings: TBSettings) -> type:
    """Register :func:`log_z_engine_class` in veRL's engine registry under :data:`ENGINE_VENDOR` and select
    it for this process (``VERL_ENGINE_VENDOR``), with the head sized by ``settings``."""

    from verl.workers.engine.base import EngineRegistry

    cls = log_z_engine_class()
    cls.head_kwargs = {
        "hidden": settings.log_z_hidden,
        "n_layers": settings.log_z_layers,
        "dropout": settings.log_z_dropout,
    }
    table = EngineRegistry._engines.get("language_model", {})
    if ("cuda", ENGINE_VENDOR) not in table.get("fsdp", {}):
        EngineRegistry.register("language_model", ["fsdp", "fsdp2"], device="cuda", vendor=ENGINE_VENDOR)(cls)
    os.environ["VERL_ENGINE_VENDOR"] = ENGINE_VENDOR
    return cls
