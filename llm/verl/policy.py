"""veRL's policy losses and advantage estimators from tiltlab's objectives (``loss_mode`` /
``adv_estimator`` names ``tiltlab_*``), registered in veRL's ``core_algos`` by :func:`register`."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import torch
from torch import Tensor
from verl.trainer.ppo import core_algos

from tiltlab.objectives import lad, pg
from tiltlab.objectives.catalog import names
from tiltlab.objectives.output import LossOutput
from tiltlab.objectives.registry import ObjectiveBatch, get_objective

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


def _declared_policy(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: Tensor | None = None,
    *,
    name: str,
) -> tuple[Tensor, dict[str, Any]]:
    """A declared ``verl`` objective of the ``pg`` family without its own function here: the registry's
    ``name`` at its declared defaults with veRL's aggregation (``loss_agg`` and its token counts)."""
    mode = _agg(loss_agg_mode)
    mask = response_mask.to(log_prob.dtype)
    kw, factor = _aggregation_args(_global(config), mode, mask)
    out = _policy(name, old_log_prob, log_prob, advantages, mask, rollout_is_weights, loss_agg=mode, **kw)
    return out.loss * factor, _metrics({"pg_clipfrac": out.metrics["clip_frac"]} if "clip_frac" in out.metrics else {})


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
    for name in names("verl", family="pg"):  # a declared policy objective without its own function above
        if f"tiltlab_{name}" not in POLICY_LOSSES:
            _register_loss(f"tiltlab_{name}", partial(_declared_policy, name=name))
    for div in sorted(lad.F_DIVERGENCES):
        register_lad(div, 1.0, "token", name=f"tiltlab_lad_{div}")
        register_lad(div, 1.0, "sequence", name=f"tiltlab_lad_{div}_seq")
    for name, scale in (("tiltlab_grpo", "std"), ("tiltlab_grpo_batch", "batch"), ("tiltlab_drgrpo", "none")):
        _register_adv(name, ADV_ESTIMATORS.get(name) or partial(_group_adv, scale=scale))
