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

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from tiltlab.objectives import lad, pg
from tiltlab.objectives.output import LossOutput
from tiltlab.objectives.registry import ObjectiveBatch, get_objective
from tiltlab.objectives.transforms import affine_reward

try:  # veRL's core_algos imports ray, tensordict, omegaconf, codetiming, pyvers and orjson
    from verl.trainer.ppo import core_algos
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "tiltlab.llm.verl needs veRL 0.9.1 and the packages its core_algos imports: "
        "pip install --no-deps verl==0.9.1 tensordict==0.15.3 && pip install 'tiltlab[verl]' "
        f"({type(e).__name__}: {e})"
    ) from e

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
    "use_log_z_engine",
    "verl_rows",
    "worker_class",
]

VERL_AGG: dict[str, pg.LossAgg] = {
    "token-mean": "token_mean",
    "seq-mean-token-mean": "seq_mean_token_mean",
    "seq-mean-token-sum-norm": "seq_mean_token_sum_norm",
}
"""veRL ``loss_agg_mode`` -> tiltlab aggregation (:func:`tiltlab.objectives.pg.aggregate`). veRL's
``token-sum`` and ``seq-mean-token-sum`` have no tiltlab counterpart and are refused."""

POLICY_LOSSES: dict[str, Callable[..., tuple[Tensor, dict[str, Any]]]] = {}
"""Every policy loss this module registered in veRL: name -> function."""

ADV_ESTIMATORS: dict[str, Callable[..., tuple[Tensor, Tensor]]] = {}
"""Every advantage estimator this module registered in veRL: name -> function."""


# ------------------------------------------------------------------------------------- adapters
def _agg(loss_agg_mode: str) -> pg.LossAgg:
    try:
        return VERL_AGG[loss_agg_mode]
    except KeyError:
        raise ValueError(
            f"loss_agg_mode must be one of {sorted(VERL_AGG)} for tiltlab losses, got {loss_agg_mode!r}"
        ) from None


def _cfg_get(config: Any, key: str, default: Any = None) -> Any:
    if config is None:
        return default
    if isinstance(config, dict):
        return config.get(key, default)
    getter = getattr(config, "get", None)
    if callable(getter):
        return getter(key, default)
    return getattr(config, key, default)


def _clip(config: Any) -> tuple[float, float]:
    """``(low, high)`` clip ranges from veRL's actor config (``clip_ratio_low/high`` fall back to ``clip_ratio``)."""
    if config is None:
        raise ValueError("config: tiltlab's veRL policy losses need the actor config (clip ranges), got None")
    eps = _cfg_get(config, "clip_ratio", 0.2)
    lo = _cfg_get(config, "clip_ratio_low", None)
    hi = _cfg_get(config, "clip_ratio_high", None)
    return float(eps if lo is None else lo), float(eps if hi is None else hi)


def _global(config: Any) -> dict[str, Any]:
    """veRL's global-batch info (``config.global_batch_info``: ``dp_size``, ``batch_num_tokens``,
    ``global_batch_size``, ``loss_scale_factor``), set by the actor before each micro-batch."""
    info = _cfg_get(config, "global_batch_info", None)
    return dict(info) if info else {}


def _aggregation_args(info: dict[str, Any], agg: pg.LossAgg, mask: Tensor) -> tuple[dict[str, Any], float]:
    """``(kwargs for pg.aggregate, factor)`` that turn tiltlab's per-micro-batch aggregation into veRL's
    global-batch one: a micro-batch loss that veRL sums over micro-batches and averages over
    ``dp_size`` data-parallel ranks.

    - ``token_mean``: divide by the mini-batch's token count over all ranks, ``batch_num_tokens``
      (``num_tokens = batch_num_tokens / dp_size``: the rank average then gives one token mean);
    - the sequence means: tiltlab divides by this micro-batch's ``B``; the factor
      ``B * dp_size / global_batch_size`` makes it a share of the mini-batch's sequence mean;
    - ``seq_mean_token_sum_norm`` divides by ``loss_scale_factor`` (tiltlab's fixed ``max_len``).
      veRL falls back to the padded width when it is unset; tiltlab refuses that (the value would
      depend on padding).
    """
    dp = int(info.get("dp_size") or 1)
    kw: dict[str, Any] = {}
    factor = 1.0
    if agg == "token_mean":
        n = info.get("batch_num_tokens")
        if n is not None:
            kw["num_tokens"] = float(n) / dp
    else:
        gbs = info.get("global_batch_size")
        if gbs is not None:
            factor = mask.shape[0] * dp / float(gbs)
        if agg == "seq_mean_token_sum_norm":
            max_len = info.get("loss_scale_factor")
            if max_len is None:
                raise ValueError(
                    "actor.loss_scale_factor: seq-mean-token-sum-norm needs the fixed maximum response length "
                    "(tiltlab never divides by the padded width), got None"
                )
            kw["max_len"] = int(max_len)
    return kw, factor


def sequence_advantages(advantages: Tensor, response_mask: Tensor) -> Tensor:
    """veRL's token advantages ``[B, T]`` -> tiltlab's sequence advantages ``[B]``.

    veRL broadcasts an outcome advantage over the response tokens; tiltlab's losses take one value
    per sequence. The value of each row's valid tokens is returned (0 for an empty row); token-varying
    advantages (GAE) are refused with a clear error rather than averaged."""
    mask = response_mask.to(advantages.dtype)
    n = mask.sum(-1)
    seq = (advantages * mask).sum(-1) / n.clamp_min(1.0)
    spread = ((advantages - seq[:, None]).abs() * mask).amax() if mask.numel() else advantages.new_zeros(())
    if float(spread) > 1e-6 * (1.0 + float(seq.abs().max()) if seq.numel() else 1.0):
        raise ValueError(
            "advantages: tiltlab's veRL losses need one advantage per sequence (an outcome estimator such as "
            f"grpo / tiltlab_grpo), got values that vary along a response (max spread {float(spread):.3g})"
        )
    return seq


def _sequence_weight(weights: Tensor | None, mask: Tensor, name: str) -> Tensor | None:
    """veRL's ``rollout_is_weights`` ``[B, T]`` -> ``[B]`` for the sequence-level losses (refused when the
    weight varies along a response: a token-level correction has no sequence-level meaning)."""
    if weights is None:
        return None
    if weights.dim() == 1:
        return weights
    m = mask.to(weights.dtype)
    seq = (weights * m).sum(-1) / m.sum(-1).clamp_min(1.0)
    if float(((weights - seq[:, None]).abs() * m).amax()) > 1e-6 * (1.0 + float(seq.abs().max())):
        raise ValueError(
            f"rollout_is_weights: {name} needs sequence-level rollout weights (algorithm.rollout_correction."
            "rollout_is=sequence), got weights that vary along a response"
        )
    return seq


def _metrics(m: dict[str, Tensor], prefix: str = "actor/") -> dict[str, Any]:
    return {f"{prefix}{k}": float(v.detach()) for k, v in m.items()}


# -------------------------------------------------------------------------------- policy losses
def _policy(
    name: str,
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    mask: Tensor,
    is_weight: Tensor | None,
    **options: Any,
) -> LossOutput:
    """The registry's ``name`` on veRL's response tensors (sequence advantages, no reference: veRL adds
    its KL loss itself)."""
    batch = ObjectiveBatch(
        log_prob, mask, token_logp_old=old_log_prob, advantages=sequence_advantages(advantages, mask),
        is_weight=is_weight,
    )  # fmt: skip
    return get_objective(name)(batch, **options)


def _grpo(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: Tensor | None = None,
    *,
    agg: pg.LossAgg | None = None,
) -> tuple[Tensor, dict[str, Any]]:
    """:func:`tiltlab.objectives.pg.grpo_loss` on veRL's arguments (no KL: veRL adds its KL loss itself)."""
    lo, hi = _clip(config)
    mode = agg if agg is not None else _agg(loss_agg_mode)
    mask = response_mask.to(log_prob.dtype)
    kw, factor = _aggregation_args(_global(config), mode, mask)
    dual = _cfg_get(config, "clip_ratio_c", None)
    out = _policy(
        "grpo", old_log_prob, log_prob, advantages, mask, rollout_is_weights, clip_eps=lo, clip_eps_high=hi,
        loss_agg=mode, dual_clip=None if dual is None else float(dual), **kw,
    )  # fmt: skip
    return out.loss * factor, _metrics({"pg_clipfrac": out.metrics["clip_frac"]})


def _gspo(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Any = None,
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Any]]:
    """:func:`tiltlab.objectives.pg.gspo_loss` (a mean over sequences, whatever ``loss_agg_mode``)."""
    lo, hi = _clip(config)
    mask = response_mask.to(log_prob.dtype)
    _, factor = _aggregation_args(_global(config), "seq_mean_token_mean", mask)
    w = _sequence_weight(rollout_is_weights, mask, "tiltlab_gspo")
    out = _policy("gspo", old_log_prob, log_prob, advantages, mask, w, clip_eps=lo, clip_eps_high=hi)
    return out.loss * factor, _metrics({"pg_clipfrac": out.metrics["clip_frac"]})


def _cispo(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Any]]:
    """:func:`tiltlab.objectives.pg.cispo_loss`: the stop-gradient ratio clipped to
    ``[1 - clip_ratio_low, 1 + clip_ratio_high]`` (veRL's CISPO), veRL's log-ratio clamp at 20."""
    lo, hi = _clip(config)
    mode = _agg(loss_agg_mode)
    mask = response_mask.to(log_prob.dtype)
    kw, factor = _aggregation_args(_global(config), mode, mask)
    out = _policy(
        "cispo", old_log_prob, log_prob, advantages, mask, rollout_is_weights, ratio_min=1.0 - lo,
        ratio_max=1.0 + hi, loss_agg=mode, log_ratio_clip=20.0, **kw,
    )  # fmt: skip
    return out.loss * factor, _metrics({"pg_clipfrac": out.metrics["clip_frac"]})


def _sapo(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Any = None,
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Any]]:
    """:func:`tiltlab.objectives.pg.sapo_loss` at the actor's ``tau_pos`` / ``tau_neg`` (veRL's defaults
    1.0 / 1.05), a sequence mean of token means whatever ``loss_agg_mode`` says (veRL's ``sapo``
    ignores it too), veRL's log-ratio clamp at 20."""
    mask = response_mask.to(log_prob.dtype)
    _, factor = _aggregation_args(_global(config), "seq_mean_token_mean", mask)
    out = _policy(
        "sapo", old_log_prob, log_prob, advantages, mask, rollout_is_weights,
        temp_pos=float(_cfg_get(config, "tau_pos", 1.0)), temp_neg=float(_cfg_get(config, "tau_neg", 1.05)),
        log_ratio_clip=20.0,
    )  # fmt: skip
    return out.loss * factor, {}


def _lad(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: Tensor | None = None,
    *,
    divergence: str,
    eta: float,
    level: str,
) -> tuple[Tensor, dict[str, Any]]:
    """:func:`tiltlab.objectives.lad.lad_loss`: per token then veRL's aggregation (``level="token"``), or on
    length-normalized sequence log-probs, mean over sequences (``level="sequence"``)."""
    mask = response_mask.to(log_prob.dtype)
    info = _global(config)
    if level == "token":
        mode = _agg(loss_agg_mode)
        kw, factor = _aggregation_args(info, mode, mask)
        opts: dict[str, Any] = {"level": "token", "loss_agg": mode, **kw}
        w = rollout_is_weights
    else:
        _, factor = _aggregation_args(info, "seq_mean_token_mean", mask)
        opts = {"level": "sequence", "logprob_scale": "mean"}
        w = _sequence_weight(rollout_is_weights, mask, "tiltlab_lad_*_seq")
    out = _policy("lad", old_log_prob, log_prob, advantages, mask, w, eta=eta, divergence=divergence, **opts)
    return out.loss * factor, {}


def _register_loss(name: str, fn: Callable[..., tuple[Tensor, dict[str, Any]]]) -> None:
    POLICY_LOSSES[name] = fn
    core_algos.register_policy_loss(name)(fn)  # type: ignore[arg-type]


def register_lad(divergence: str, eta: float, level: str = "token", name: str | None = None) -> str:
    """Register LAD with ``divergence`` (a name in :data:`tiltlab.objectives.lad.F_DIVERGENCES`) at
    temperature ``eta`` as a veRL policy loss; returns its name (default
    ``tiltlab_lad_<divergence>[_seq]_eta<eta>``). Call it from a module veRL imports in every worker
    (``VERL_USE_EXTERNAL_MODULES=<module>``), since Ray workers import their registrations afresh."""
    lad.get_divergence(divergence)  # a clear error for an unknown name
    if not eta > 0:
        raise ValueError(f"eta must be > 0, got {eta}")
    if level not in ("token", "sequence"):
        raise ValueError(f"level must be 'token' or 'sequence', got {level!r}")
    if name is None:
        name = f"tiltlab_lad_{divergence}{'_seq' if level == 'sequence' else ''}_eta{eta:g}"
    _register_loss(name, partial(_lad, divergence=divergence, eta=float(eta), level=level))
    return name


# -------------------------------------------------------------------------- advantage estimators
def _group_rows(index: Any, b: int) -> Tensor:
    """Row order that puts each prompt's completions together: ``[P, G]`` indices (groups in order of
    first appearance; every group must have the same size ``G``)."""
    if index is None:
        raise ValueError("index: tiltlab's group advantages need veRL's per-row prompt uid (non_tensor_batch['uid'])")
    ids = np.asarray(index)
    if ids.shape != (b,):
        raise ValueError(f"index must hold one uid per row ({b}), got shape {ids.shape}")
    groups: dict[Any, list[int]] = {}
    for i, u in enumerate(ids.tolist()):
        groups.setdefault(u, []).append(i)
    sizes = {len(v) for v in groups.values()}
    if len(sizes) != 1:
        raise ValueError(f"index: tiltlab's group advantages need equal group sizes, got sizes {sorted(sizes)}")
    return torch.tensor(list(groups.values()), dtype=torch.long)


def _group_adv(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    index: Any = None,
    config: Any = None,
    *,
    scale: str,
    eps: float = 1e-6,
    **_: Any,
) -> tuple[Tensor, Tensor]:
    """:func:`tiltlab.objectives.pg.group_advantages` on veRL's outcome rewards, broadcast over the response."""
    scores = token_level_rewards.sum(-1)
    rows = _group_rows(index, scores.shape[0])  # [P, G]
    adv_pg = pg.group_advantages(scores[rows], scale=scale, eps=eps)  # type: ignore[arg-type]
    adv = torch.empty_like(scores)
    adv[rows.reshape(-1)] = adv_pg.reshape(-1)
    out = adv[:, None] * response_mask.to(adv.dtype)
    return out, out


def _register_adv(name: str, fn: Callable[..., tuple[Tensor, Tensor]]) -> None:
    existing = core_algos.ADV_ESTIMATOR_REGISTRY.get(name)
    if existing is not None and getattr(getattr(existing, "func", None), "__qualname__", "") != "_group_adv":
        raise ValueError(f"veRL already has another advantage estimator named {name!r}")
    core_algos.ADV_ESTIMATOR_REGISTRY.pop(name, None)  # ours from an earlier import of this module
    ADV_ESTIMATORS[name] = fn
    core_algos.register_adv_est(name)(fn)


def register() -> None:
    """Register every tiltlab loss and estimator in veRL (idempotent; runs at import)."""
    _register_loss("tiltlab_grpo", _grpo)
    for mode in VERL_AGG.values():
        _register_loss(f"tiltlab_grpo_{mode}", partial(_grpo, agg=mode))
    _register_loss("tiltlab_gspo", _gspo)
    _register_loss("tiltlab_cispo", _cispo)
    _register_loss("tiltlab_sapo", _sapo)
    for div in sorted(lad.F_DIVERGENCES):
        register_lad(div, 1.0, "token", name=f"tiltlab_lad_{div}")
        register_lad(div, 1.0, "sequence", name=f"tiltlab_lad_{div}_seq")
    for name, scale in (("tiltlab_grpo", "std"), ("tiltlab_grpo_batch", "batch"), ("tiltlab_drgrpo", "none")):
        _register_adv(name, ADV_ESTIMATORS.get(name) or partial(_group_adv, scale=scale))


# ----------------------------------------------------------------- trajectory balance (actor loss)
TB_OBJECTIVES = ("disa", "flowrl", "paced")
LOG_Z_KEY = "tiltlab_log_z"
"""Where the data step writes DISA's frozen label (``extra_info[LOG_Z_KEY]`` of each row) and where the
log Z head engine puts the learned log Z in the model output."""


@dataclass
class TBSettings:
    """The TB objective run inside veRL's actor (``actor_rollout_ref.tiltlab`` in the Hydra config)."""

    objective: str = "disa"
    """``disa`` (frozen Stage-2 ``log Z`` from the label column), ``flowrl`` or ``paced`` (learned
    ``log Z`` from the model output ``tiltlab_log_z``)."""
    beta: float = 15.0
    """inverse temperature multiplying the transformed reward (disa, flowrl)."""
    reward_scale: float = 1.0
    """``a`` in ``r~ = a r + c`` (must equal Stage 1's for DISA labels)."""
    reward_shift: float = 0.0
    """``c`` in ``r~ = a r + c``."""
    length_normalize: bool = False
    """sequence log-prob as the token mean (FlowRL's code) instead of the sum (DISA eq. 6)."""
    weight_clip: str = "max"
    """TB rollout weight clip: ``max`` | ``eps`` | ``none`` (:func:`tiltlab.objectives.tb.tb_importance_weight`)."""
    max_weight: float = 10.0
    """cap of the rollout weight for ``weight_clip=max``."""
    weight_eps: float = 0.2
    """lower eps of the ``[1 - eps, 1 + eps_high]`` weight clip."""
    weight_eps_high: float | None = None
    """upper eps of the weight clip (None = ``weight_eps``)."""
    paced_kl_coef: float = 1.0
    """PACED's tilt ``r / paced_kl_coef`` (the TB anchor is ``pi_old``)."""
    log_z_key: str = "tiltlab_log_z"
    """the per-row frozen ``log Z`` column (disa) / the model-output key of the learned one."""
    log_z_hidden: int = 256
    """width of the learned log Z head (flowrl, paced; :class:`tiltlab.llm.trainers.logz_head.LogZHead`)."""
    log_z_layers: int = 3
    """Linear layers of the head (FlowRL: 3)."""
    log_z_dropout: float = 0.1
    """dropout in the head (FlowRL: 0.1)."""

    def __post_init__(self) -> None:
        if self.objective not in TB_OBJECTIVES:
            raise ValueError(f"objective must be one of {TB_OBJECTIVES}, got {self.objective!r}")
        if not self.beta > 0 or not self.paced_kl_coef > 0:
            raise ValueError(f"beta and paced_kl_coef must be > 0, got {self.beta}, {self.paced_kl_coef}")
        if self.weight_clip not in ("max", "eps", "none"):
            raise ValueError(f"weight_clip must be max | eps | none, got {self.weight_clip!r}")

    @classmethod
    def from_config(cls, cfg: Any) -> TBSettings:
        """From a mapping (an omegaconf node or a dict); unknown keys are refused by name."""
        d = dict(cfg or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"actor_rollout_ref.tiltlab: unknown keys {unknown}; expected some of {sorted(known)}")
        return cls(**d)


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
    weight = {
        "weight_clip": settings.weight_clip, "max_weight": settings.max_weight, "eps": settings.weight_eps,
        "eps_high": settings.weight_eps_high,
    }  # fmt: skip
    norm = "mean" if settings.length_normalize else "sum"
    if settings.objective == "flowrl":  # FlowRL's loss with its code choices off: TB on r~ at beta, learned log Z
        batch = replace(batch, rewards=reward[:, None])
        options = {"beta": settings.beta, "length_normalize": settings.length_normalize, "group_normalize": False}
    elif settings.objective == "disa":
        options = {"beta": settings.beta, "logprob_scale": norm}
    else:  # paced: TB anchored on pi_old with the tilt r / kl_coef
        options = {"kl_coef": settings.paced_kl_coef, "logprob_scale": norm}
    out = get_objective(settings.objective)(batch, **weight, **options)
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
    from tiltlab.llm.models import masked_mean_pool

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

    - the head (:func:`tiltlab.llm.trainers.logz_head.attach_log_z_head`) is attached before FSDP wraps
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

    from tiltlab.llm.trainers.logz_head import attach_log_z_head, get_log_z_head, is_log_z_head_param

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
    import os

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


# ------------------------------------------------------------------------ worker and entry point
def worker_class() -> type:
    """veRL's engine ``ActorRolloutRefWorker`` with the actor loss replaced by :func:`tb_loss_fn`
    (settings from ``actor_rollout_ref.tiltlab``); for ``flowrl`` / ``paced`` its engine is
    :func:`log_z_engine_class` (the learned head). Imported inside Ray workers: it needs a GPU
    (veRL has no CPU engine)."""
    from verl.single_controller.base.decorator import Dispatch, register
    from verl.workers.engine_workers import ActorRolloutRefWorker

    class TiltlabActorRolloutRefWorker(ActorRolloutRefWorker):  # type: ignore[misc, valid-type]
        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def init_model(self) -> None:
            settings = TBSettings.from_config(self.config.get("tiltlab"))
            if settings.objective != "disa":
                use_log_z_engine(settings)
            super().init_model()
            if "actor" in self.role:
                actor_config = self.loss_fn.keywords["config"]
                self.loss_fn = partial(tb_loss_fn, config=actor_config, settings=settings)
                self.actor.set_loss_fn(self.loss_fn)

    return TiltlabActorRolloutRefWorker


def _task_runner() -> Any:
    """veRL's (v0) TaskRunner that places :func:`worker_class` as the actor/rollout/ref worker."""
    import ray
    from verl.trainer.main_ppo_v0 import TaskRunner

    base = TaskRunner.__ray_actor_class__  # veRL's TaskRunner is already a Ray actor class: subclass its class

    class TiltlabTaskRunner(base):  # type: ignore[misc, valid-type]
        def add_actor_rollout_worker(self, config: Any) -> Any:
            _, group_cls = super().add_actor_rollout_worker(config)
            cls = worker_class()
            for role in list(self.role_worker_mapping):
                self.role_worker_mapping[role] = ray.remote(cls)
            return cls, group_cls

    return ray.remote(num_cpus=1)(TiltlabTaskRunner)


def verl_rows(
    rows: list[dict[str, Any]], log_z: Tensor | list[float] | None = None, data_source: str = "tiltlab_math"
) -> list[dict[str, Any]]:
    """tiltlab prompt rows (``{id, prompt, answer}``, :func:`tiltlab.llm.data.load_prompts`) -> rows of
    veRL's RL dataset: ``data_source`` (a label; the reward is :func:`compute_score`, set as veRL's
    custom reward function), ``prompt`` as one user message, ``reward_model.ground_truth``, and
    ``extra_info`` with the row's index, id and, given ``log_z`` ``[N]``, DISA's frozen label
    (veRL keeps ``extra_info`` with each completion from the dataset to the actor update)."""
    if log_z is not None:
        z = torch.as_tensor(log_z, dtype=torch.float64).reshape(-1)
        if z.shape != (len(rows),):
            raise ValueError(f"log_z must hold one value per row ({len(rows)}), got {tuple(z.shape)}")
        if not bool(torch.isfinite(z).all()):
            raise ValueError("log_z must be finite for every row")
    out = []
    for i, r in enumerate(rows):
        if "prompt" not in r or "answer" not in r:
            raise ValueError(f"rows[{i}] must have 'prompt' and 'answer', got keys {sorted(r)}")
        extra: dict[str, Any] = {"index": i, "id": str(r.get("id", i))}
        if log_z is not None:
            extra[LOG_Z_KEY] = float(z[i])
        out.append(
            {
                "data_source": data_source,
                "prompt": [{"role": "user", "content": str(r["prompt"])}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(r["answer"])},
                "extra_info": extra,
            }
        )
    return out


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None, **_: Any) -> float:
    """tiltlab's math reward as veRL's custom reward function (``reward.custom_reward_function.path=
    pkg://tiltlab.llm.verl``, ``name=compute_score``): :func:`tiltlab.llm.rewards.math_reward`, 1 iff the
    last boxed answer equals ``ground_truth`` (math-verify), else 0 -- the reward Stage 1 labelled with.
    veRL's built-in ``math_dapo`` scorer gives -1 / 1 instead, another reward transform than the labels'."""
    from tiltlab.llm.rewards import math_reward

    (r,) = math_reward([""], [solution_str], answer=[ground_truth])
    return float(r or 0.0)


def prepare(config: str, out: str, data_source: str = "tiltlab_math") -> int:  # pragma: no cover - loads models
    """The DISA data step: the tiltlab run config's dataset, labelled by its Stage-2 regressor
    (``disa.stage2_dir``; checked against Stage 1's manifest as the TRL trainer checks it), written
    as a veRL parquet with the label in ``extra_info``. Returns the number of rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tiltlab.llm.data import load_prompts
    from tiltlab.llm.trainers.cli import _disa_predictor
    from tiltlab.llm.trainers.config import load_run_config
    from tiltlab.llm.trainers.disa_labels import check_label_compat

    cfg = load_run_config(config)
    d = cfg.disa
    log_z_fn, manifest = _disa_predictor(cfg)
    check_label_compat(
        manifest,
        beta=float(cfg.tilt_beta),
        reward_transform=("affine", float(d.get("reward_scale", 1.0)), float(d.get("reward_shift", 0.0))),
        logprob_scale="mean" if d.get("length_normalize", False) else "sum",
        chat_template=True,
    )
    rows = load_prompts(cfg.dataset)
    log_z = log_z_fn([[{"role": "user", "content": r["prompt"]}] for r in rows])
    table = pa.Table.from_pylist(verl_rows(rows, log_z, data_source))
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out)
    return len(rows)


def main(argv: list[str] | None = None) -> None:  # pragma: no cover - launches a Ray cluster on GPUs
    """``python -m tiltlab.llm.verl prepare --config <tiltlab run config> --out <parquet>`` (the DISA data
    step), or ``python -m tiltlab.llm.verl --config-path <abs dir> --config-name <name> [overrides]``:
    veRL's ``main_ppo`` with the tiltlab worker (``configs/verl/``, ``docs/verl.md``)."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["prepare"]:
        import argparse

        ap = argparse.ArgumentParser(prog="python -m tiltlab.llm.verl prepare")
        ap.add_argument("--config", required=True, help="the tiltlab run config (configs/disa_*.yaml)")
        ap.add_argument("--out", required=True, help="the veRL parquet to write")
        ap.add_argument("--data-source", default="tiltlab_math", help="the rows' data_source label")
        a = ap.parse_args(args[1:])
        print(f"wrote {prepare(a.config, a.out, a.data_source)} rows to {a.out}")
        return

    import hydra
    from verl.trainer.main_ppo import run_ppo

    @hydra.main(config_path=None, config_name=None, version_base=None)
    def _main(config: Any) -> None:
        if config.trainer.get("use_v1", False):
            raise ValueError("trainer.use_v1: the tiltlab worker runs on veRL's v0 trainer; set trainer.use_v1=false")
        TBSettings.from_config(config.actor_rollout_ref.get("tiltlab"))  # fail before Ray starts
        run_ppo(config, task_runner_class=_task_runner())

    sys.argv = [sys.argv[0], *args]
    _main()


register()

if __name__ == "__main__":  # pragma: no cover
    main()
