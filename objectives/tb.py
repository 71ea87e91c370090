"""Trajectory balance with frozen / learned / batch log Z, and FlowRL's coded variant.

DISA (eqs. 5, 6, 10; ``docs/math.md`` §1):

    delta(x, y) = log Z(x) + log pi_theta(y|x) - log pi_ref(y|x) - beta * r~(x, y)
    J = E_x E_{y ~ pi_b} [ w(x, y) * delta(x, y)^2 ]

FlowRL learns ``log Z`` jointly (gradient reaches it); DISA freezes a Stage-2 prediction
(``sg(log Z_psi)``); VarGrad / PACED use the per-prompt batch-optimal value
``mean_G(beta r - logp + logp_ref)``. PACED's TB is anchored on ``pi_old`` and writes the tilt as
``r / kl_coef``: call :func:`tb_residual` with ``logp_ref = logp_old`` and ``beta = 1 / kl_coef``.

Shapes: tokens ``[B, T]`` + float ``mask``; sequences ``[B]``; groups ``[P, G]`` (group-major).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from tiltlab.objectives._checks import as_tensor, fits, ndim, no_nan_at, nonempty, renamed, same_shape, zero_padding
from tiltlab.objectives.diagnostics import weight_clip_fraction
from tiltlab.objectives.output import LossOutput
from tiltlab.objectives.pg import group_advantages

__all__ = [
    "disa_loss",
    "flowrl_loss",
    "group_normalized_reward",
    "sequence_logprob",
    "tb_importance_weight",
    "tb_loss",
    "tb_residual",
    "vargrad_log_z",
    "vargrad_loss",
]


def sequence_logprob(token_logp: Tensor, mask: Tensor, *, normalize: Literal["sum", "mean"] = "sum") -> Tensor:
    """Sequence log-prob from token log-probs: masked sum (``"sum"``, the true ``log pi(y|x)``)
    or masked mean (``"mean"``, FlowRL's length-normalized code path, ``docs/math.md`` §2).

    Args:
        token_logp: ``[B, T]``; mask: ``[B, T]`` float (padding = 0; padded values are ignored
            even when non-finite).
    Returns:
        ``[B]``.
    """
    ndim("token_logp", token_logp, 2, "[B, T]")
    same_shape("token_logp", token_logp, "mask", mask)
    masked = zero_padding(token_logp, mask) * mask
    total = masked.sum(dim=1)
    if normalize == "sum":
        return total
    if normalize == "mean":
        return total / mask.sum(dim=1).clamp_min(1.0)
    raise ValueError(f"normalize must be 'sum' or 'mean', got {normalize!r}")


def tb_residual(
    logp: Tensor, logp_ref: Tensor, reward: Tensor, log_z: Tensor | float, *, beta: float | Tensor
) -> Tensor:
    """DISA eq. (5): ``delta = log_z + logp - logp_ref - beta * reward``.

    Args:
        logp: ``[B]`` (or ``[P, G]``) sequence log-probs under pi_theta (with grad).
        logp_ref: same shape, under pi_ref.
        reward: same shape, the transformed reward ``r~``.
        log_z: broadcastable to ``logp`` (``[B]``, ``[P, 1]`` or a scalar). Pass it detached for
            a frozen log Z (DISA), attached for a learned one (FlowRL).
        beta: inverse temperature multiplying the reward.
    Returns:
        residual of ``logp``'s shape.
    """
    nonempty("logp", logp, 0)
    same_shape("logp", logp, "logp_ref", logp_ref)
    same_shape("logp", logp, "reward", reward)
    log_z = as_tensor(log_z, logp)
    fits("logp", logp, "log_z", log_z)
    # one host sync: NaN input is refused with the argument's name
    no_nan_at(None, logp=logp, logp_ref=logp_ref, reward=reward, log_z=log_z, beta=beta)
    return log_z + logp - logp_ref - beta * reward


@renamed(weight="is_weight")
def tb_loss(residual: Tensor, *, is_weight: Tensor | None = None) -> LossOutput:
    """DISA eq. (6): ``mean(w * delta^2)`` (``w = 1`` on-policy; ``is_weight`` is detached). No metrics.

    ``is_weight`` is the per-sample importance weight ``w(x, y)`` of eq. (6), the name of every
    objective's per-sample weight (here it may be FlowRL's rollout weight times a sampler correction)."""
    if residual.numel() == 0:
        raise ValueError("tb_loss of an empty batch")
    sq = residual * residual
    if is_weight is None:
        return LossOutput(sq.mean())
    same_shape("residual", residual, "is_weight", is_weight)
    return LossOutput((is_weight.detach() * sq).mean())


@renamed(weight="is_weight")
def disa_loss(
    logp: Tensor,
    logp_ref: Tensor,
    reward: Tensor,
    log_z_frozen: Tensor,
    *,
    beta: float,
    is_weight: Tensor | None = None,
) -> LossOutput:
    """DISA Stage 3, eq. (10): TB with ``sg(log Z_psi(x))`` (the frozen Stage-2 prediction).

    Only ``logp`` receives gradient: ``logp_ref``, ``reward``, ``log_z_frozen`` and ``is_weight`` are detached.
    No metrics.
    """
    residual = tb_residual(logp, logp_ref.detach(), reward.detach(), log_z_frozen.detach(), beta=beta)
    return tb_loss(residual, is_weight=is_weight)


def vargrad_log_z(logp: Tensor, logp_ref: Tensor, reward: Tensor, *, beta: float, detach: bool = False) -> Tensor:
    """Per-prompt batch-optimal ``log Z`` (VarGrad; PACED ``paced.vargrad``):

        log Z_hat(x_p) = (1/G) sum_g (beta * r_pg - logp_pg + logp_ref_pg)

    the minimizer over a shared ``log Z`` of ``sum_g delta_pg^2``.

    Args: ``[P, G]`` tensors. Returns ``[P]``. ``detach=True`` stops the gradient through the
    estimate (the loss gradient is the same either way: at the minimizer ``dL/dlogZ = 0``).
    """
    ndim("logp", logp, 2, "[P, G]")
    same_shape("logp", logp, "logp_ref", logp_ref)
    same_shape("logp", logp, "reward", reward)
    if logp.shape[1] == 0:
        raise ValueError("vargrad_log_z needs G >= 1 samples per prompt")
    no_nan_at(None, logp=logp, logp_ref=logp_ref, reward=reward, beta=beta)  # host sync: refuse NaN input
    est = (beta * reward - logp + logp_ref).mean(dim=1)
    return est.detach() if detach else est


def vargrad_loss(logp: Tensor, logp_ref: Tensor, reward: Tensor, *, beta: float) -> LossOutput:
    """TB at the batch-optimal ``log Z`` (= the within-group variance of ``logp - logp_ref - beta r``,
    population form). Built from :func:`tb_residual` and :func:`tb_loss`; ``logp_ref`` and ``reward``
    are detached. No metrics."""
    logp_ref, reward = logp_ref.detach(), reward.detach()
    log_z = vargrad_log_z(logp, logp_ref, reward, beta=beta)
    return tb_loss(tb_residual(logp, logp_ref, reward, log_z[:, None], beta=beta))


def group_normalized_reward(rewards: Tensor, *, eps: float = 1e-6) -> Tensor:
    """FlowRL's reward ``(r - mean_G r) / (std_G r + eps)`` (= :func:`objectives.pg.group_advantages`)."""
    return group_advantages(rewards, scale="std", eps=eps)


@renamed(clip="weight_clip")
def tb_importance_weight(
    token_logp: Tensor,
    token_logp_old: Tensor,
    mask: Tensor,
    *,
    weight_clip: Literal["max", "ratio", "eps"] = "max",
    max_weight: float = 10.0,
    eps: float = 0.2,
    eps_high: float | None = None,
) -> Tensor:
    """Rollout weight of FlowRL's loss (``docs/math.md`` §2), detached:

        w = exp( sum_t mask_t (logp_t - logp_old_t) )      (token SUM)

    ``weight_clip="max"``: ``min(w, max_weight)`` (FlowRL's code, 10); ``"eps"``: ``clip(w, 1-eps, 1+eps_high)``
    (FlowRL's paper; ``eps_high`` defaults to ``eps``; one of FlowRL's recipes clips asymmetrically to
    ``[0.8, 1.28]``: ``eps=0.2, eps_high=0.28``); ``"ratio"``: unclipped (the log-ratio is capped at
    80 so float32 stays finite).

    Returns ``[B]``.
    """
    ndim("token_logp", token_logp, 2, "[B, T]")
    same_shape("token_logp", token_logp, "token_logp_old", token_logp_old)
    same_shape("token_logp", token_logp, "mask", mask)
    diff = zero_padding(token_logp.detach(), mask) - zero_padding(token_logp_old.detach(), mask)
    log_ratio = (diff * mask).sum(dim=1)
    w = torch.exp(log_ratio.clamp(max=80.0))
    if weight_clip == "max":
        return w.clamp(max=max_weight)
    if weight_clip == "eps":
        return w.clamp(1.0 - eps, 1.0 + (eps if eps_high is None else eps_high))
    if weight_clip == "ratio":
        return w
    raise ValueError(f"weight_clip must be 'max', 'eps' or 'ratio', got {weight_clip!r}")


def flowrl_loss(
    token_logp: Tensor,
    token_logp_ref: Tensor,
    token_logp_old: Tensor,
    mask: Tensor,
    rewards: Tensor,
    log_z: Tensor,
    *,
    beta: float = 15.0,
    group_size: int | None = None,
    length_normalize: bool = True,
    group_normalize: bool = True,
    weight_clip: Literal["max", "ratio", "eps"] = "max",
    max_weight: float = 10.0,
    eps: float = 0.2,
    is_weight: Tensor | None = None,
    eps_high: float | None = None,
) -> LossOutput:
    """FlowRL's loss as coded (``docs/math.md`` §2), each code choice an option:

        A   = (r - mean_G r)/(std_G r + 1e-6)          if group_normalize else r
        lp  = masked mean (length_normalize) or sum of token log-probs, same for lp_ref
        delta = log_z + lp - lp_ref - beta * A
        w   = clip(exp(sum_t (logp - logp_old)))       detached
        loss = mean_B (w * delta^2)

    Args:
        token_logp, token_logp_ref, token_logp_old, mask: ``[B, T]``, ``B = P * G`` group-major.
        rewards: ``[P, G]``, or ``[B]`` with ``group_size`` given.
        log_z: ``[B]`` (per completion) or ``[P]`` (per prompt); keep it attached for a learned log Z.
        is_weight: optional ``[B]`` sampler-mismatch importance weight (vLLM), multiplied in.
        weight_clip, max_weight, eps, eps_high: the weight's clip (:func:`tb_importance_weight`).
    Returns:
        :class:`~tiltlab.objectives.output.LossOutput`; metrics ``log_z_mean``, ``log_z_std``,
        ``residual_abs_mean``, ``residuals`` (``[B]``, detached), ``weight_mean`` (after ``is_weight``), ``weight_clip_frac`` (before it).
    """
    ndim("token_logp", token_logp, 2, "[B, T]")
    nonempty("token_logp", token_logp, 0)
    same_shape("token_logp", token_logp, "token_logp_ref", token_logp_ref)
    same_shape("token_logp", token_logp, "token_logp_old", token_logp_old)
    same_shape("token_logp", token_logp, "mask", mask)
    no_nan_at(mask, token_logp=token_logp, token_logp_ref=token_logp_ref, token_logp_old=token_logp_old)  # host sync
    b = token_logp.shape[0]
    if rewards.dim() == 1:
        if group_size is None or b % group_size:
            raise ValueError("rewards given as [B] need group_size dividing B")
        rewards = rewards.view(-1, group_size)
    if rewards.numel() != b:
        raise ValueError(f"rewards has {rewards.numel()} entries for B={b} completions")
    p, g = rewards.shape
    reward = group_normalized_reward(rewards) if group_normalize else rewards
    reward = reward.reshape(b)
    if log_z.shape == (p,) and p != b:
        log_z = log_z.repeat_interleave(g)
    if log_z.shape != (b,):
        raise ValueError(f"log_z must be [B]={b} or [P]={p}, got {tuple(log_z.shape)}")
    if is_weight is not None and is_weight.shape != (b,):
        raise ValueError(f"is_weight must be [B]={b}, got {tuple(is_weight.shape)}")
    norm: Literal["sum", "mean"] = "mean" if length_normalize else "sum"
    lp = sequence_logprob(token_logp, mask, normalize=norm)
    lp_ref = sequence_logprob(token_logp_ref.detach(), mask, normalize=norm)
    delta = tb_residual(lp, lp_ref, reward.detach().to(lp.dtype), log_z, beta=beta)
    w = tb_importance_weight(
        token_logp, token_logp_old.detach(), mask,
        weight_clip=weight_clip, max_weight=max_weight, eps=eps, eps_high=eps_high,
    )  # fmt: skip
    with torch.no_grad():  # the clip fraction of the TB weight, before is_weight
        clip_frac = weight_clip_fraction(w, weight_clip=weight_clip, max_weight=max_weight, eps=eps, eps_high=eps_high)
    if is_weight is not None:
        w = w * is_weight.detach()
    loss = tb_loss(delta, is_weight=w).loss
    with torch.no_grad():
        metrics = {
            "log_z_mean": log_z.float().mean(),
            "log_z_std": log_z.float().std() if log_z.numel() > 1 else torch.zeros(()),
            "residual_abs_mean": delta.abs().float().mean(),
            "residuals": delta.detach().float(),
            "weight_mean": w.float().mean(),
            "weight_clip_frac": clip_frac,
        }
    return LossOutput(loss, metrics)
