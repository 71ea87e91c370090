"""Policy-gradient baselines: group advantages, GRPO, GSPO, PPO with KL (``docs/math.md`` §6).

Shapes: tokens ``[B, T]`` with a float ``mask`` (1 = completion token), sequences ``[B]``,
groups ``[P, G]`` (``B = P * G``, group-major: rows ``p*G .. p*G+G-1`` share prompt ``p``).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from tiltlab.objectives._checks import broadcastable, ndim, no_nan_at, nonempty, same_shape, zero_padding

__all__ = [
    "aggregate",
    "group_advantages",
    "grpo_loss",
    "gspo_loss",
    "kl_estimate",
    "kl_k3",
    "masked_mean",
    "ppo_kl_loss",
]

LossAgg = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]


def group_advantages(rewards: Tensor, scale: Literal["std", "batch", "none"] = "std", eps: float = 1e-6) -> Tensor:
    """GRPO's group-relative advantage ``(r - mean_G r) / (std_G r + eps)``.

    DeepSeekMath GRPO; also FlowRL's "group-normalized reward" (``docs/math.md`` §2, the finite-sample
    plug-in of the affine transform ``r~ = a(x) r + c(x)``). ``std`` is the unbiased (n-1)
    standard deviation, as in veRL/TRL. A group whose rewards are all equal (e.g. all zero) gets
    advantage 0 for every member: no signal, deliberately. ``eps`` defaults to 1e-6 (veRL's);
    TRL adds 1e-4: pass ``eps=1e-4`` to match TRL's advantages.

    Args:
        rewards: ``[P, G]``; ``G >= 2`` when ``scale="std"``.
        scale: ``"std"`` (GRPO, TRL ``scale_rewards="group"``), ``"batch"`` (TRL
            ``scale_rewards="batch"``: group-centered, divided by the std of all ``P * G``
            rewards) or ``"none"`` (Dr. GRPO: mean-centering only).

    Returns:
        ``[P, G]`` advantages.
    """
    ndim("rewards", rewards, 2, "[P, G]")
    nonempty("rewards", rewards, 0)
    nonempty("rewards", rewards, 1)
    no_nan_at(None, rewards=rewards)  # a host sync: refuse NaN rewards with a clear error
    centered = rewards - rewards.mean(dim=1, keepdim=True)
    if scale == "none":
        return centered
    if scale == "batch":
        if rewards.numel() < 2:
            raise ValueError("batch normalization by std needs at least 2 rewards")
        return centered / (rewards.std() + eps)
    if scale != "std":
        raise ValueError(f"scale must be 'std', 'batch' or 'none', got {scale!r}")
    if rewards.shape[1] < 2:
        raise ValueError("group normalization by std needs G >= 2 samples per prompt")
    return centered / (rewards.std(dim=1, keepdim=True) + eps)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """``sum(x * mask) / sum(mask)`` (over ``dim`` or everything); an all-zero mask gives 0.

    Padded positions are ignored even when they hold NaN or inf."""
    same_shape("x", x, "mask", mask)
    xm = zero_padding(x, mask) * mask
    num = xm.sum() if dim is None else xm.sum(dim)
    den = mask.sum() if dim is None else mask.sum(dim)
    return num / den.clamp_min(1.0)


def aggregate(
    per_token: Tensor,
    mask: Tensor,
    loss_agg: LossAgg = "token_mean",
    max_len: int | None = None,
    num_tokens: Tensor | float | None = None,
) -> Tensor:
    """Reduce a ``[B, T]`` per-token loss to a scalar.

    - ``token_mean``: token sum divided by ``num_tokens`` (default: this batch's completion tokens,
      TRL ``"bnpo"``). TRL's ``"dapo"`` (and veRL's ``token-mean`` with ``batch_num_tokens``) pass
      the token count of the whole optimizer step, so that micro-batches and processes add up to
      one token mean: ``num_tokens = tokens of the step / (processes * accumulation steps)``;
    - ``seq_mean_token_mean``: per-sequence token mean, then mean over sequences (original GRPO);
    - ``seq_mean_token_sum_norm``: per-sequence token sum divided by the fixed ``max_len``
      (required: the maximum completion length, TRL's ``max_completion_length``; never the padded
      width ``T``, which would make the value depend on the batch's padding), mean over sequences
      (Dr. GRPO).

    The sequence means divide by ``B`` (TRL); an empty completion (all-zero mask row) contributes
    0. veRL divides by the number of non-empty sequences instead (the same value without empty rows).
    """
    same_shape("per_token", per_token, "mask", mask)
    if loss_agg == "token_mean":
        if num_tokens is None:
            return masked_mean(per_token, mask)
        return (zero_padding(per_token, mask) * mask).sum() / num_tokens
    if loss_agg == "seq_mean_token_mean":
        return masked_mean(per_token, mask, dim=1).mean()
    if loss_agg == "seq_mean_token_sum_norm":
        if max_len is None or not max_len > 0:
            raise ValueError(f"loss_agg='seq_mean_token_sum_norm' needs a fixed max_len > 0, got {max_len!r}")
        return ((zero_padding(per_token, mask) * mask).sum(dim=1) / max_len).mean()
    raise ValueError(f"unknown loss_agg {loss_agg!r}")


def kl_k3(logp: Tensor, logp_ref: Tensor) -> Tensor:
    """Schulman's k3 estimator of ``KL(pi || pi_ref)`` per sample: ``e^{ref - logp} - (ref - logp) - 1 >= 0``."""
    broadcastable("logp", logp, "logp_ref", logp_ref)
    d = logp_ref - logp
    return torch.exp(d) - d - 1.0


KlEstimator = Literal["k1", "k2", "k3"]


def kl_estimate(logp: Tensor, logp_ref: Tensor, estimator: KlEstimator = "k3") -> Tensor:
    """Schulman's per-sample estimators of ``KL(pi || pi_ref)`` at ``x ~ pi``, ``d = logp - logp_ref``:
    ``k1 = d`` (unbiased, can be negative), ``k2 = d^2 / 2`` (biased, its gradient is the KL's),
    ``k3 = e^{-d} + d - 1`` (:func:`kl_k3`; unbiased, >= 0; TRL's only estimator).

    veRL's names are ``kl``/``k1``, ``mse``/``k2``, ``low_var_kl``/``k3``; veRL clamps its k3 to
    ``[-10, 10]`` (and ``d`` to ``[-20, 20]``), tiltlab does not.
    """
    if estimator == "k3":
        return kl_k3(logp, logp_ref)
    broadcastable("logp", logp, "logp_ref", logp_ref)
    d = logp - logp_ref
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d * d
    raise ValueError(f"kl_estimator must be 'k1', 'k2' or 'k3', got {estimator!r}")


def _clipped_indicator(clipped: Tensor, unclipped: Tensor) -> Tensor:
    """1 where the clipped branch is the smaller (its gradient is cut), 0 elsewhere; NaN stays NaN."""
    ind = (clipped < unclipped).to(unclipped.dtype)
    return torch.where(torch.isnan(unclipped), unclipped, ind)


def _check_tokens(
    token_logp: Tensor, token_logp_old: Tensor, adv: Tensor, mask: Tensor, is_weight: Tensor | None
) -> None:
    ndim("token_logp", token_logp, 2, "[B, T]")
    nonempty("token_logp", token_logp, 0)
    same_shape("token_logp", token_logp, "token_logp_old", token_logp_old)
    same_shape("token_logp", token_logp, "mask", mask)
    if adv.shape != token_logp.shape[:1]:
        raise ValueError(f"advantages must be [B]={tuple(token_logp.shape[:1])}, got {tuple(adv.shape)}")
    if is_weight is not None and is_weight.shape not in (token_logp.shape, token_logp.shape[:1]):
        raise ValueError(f"is_weight must be [B] or [B, T]={tuple(token_logp.shape)}, got {tuple(is_weight.shape)}")


def grpo_loss(
    token_logp: Tensor,
    token_logp_old: Tensor,
    adv: Tensor,
    mask: Tensor,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    loss_agg: LossAgg = "token_mean",
    token_logp_ref: Tensor | None = None,
    kl_coef: float = 0.0,
    is_weight: Tensor | None = None,
    max_len: int | None = None,
    num_tokens: Tensor | float | None = None,
    dual_clip: float | None = None,
    log_ratio_clip: float | None = None,
    kl_estimator: KlEstimator = "k3",
    kl_ratio_weighted: bool = False,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GRPO / PPO token-level clipped surrogate (``docs/math.md`` §6).

    ``rho_t = exp(logp_t - logp_old_t)``; per token
    ``l_t = -w_t min(rho_t A, clip(rho_t, 1 - eps, 1 + eps_high) A) + kl_coef * k3(logp_t, ref_t)``,
    aggregated by ``loss_agg``, with ``w`` the optional ``is_weight``: it multiplies the
    policy-gradient term only, never the KL term (TRL adds the KL after the vLLM IS ratio; veRL
    weights only the policy loss). ``kl_coef`` with ``token_logp_ref = token_logp_old`` gives LAD's
    bandit baseline "GRPO + KL to pi_old".

    Args:
        token_logp: ``[B, T]`` current policy log-probs of the sampled tokens (with grad).
        token_logp_old: ``[B, T]`` behaviour log-probs (detached inside).
        adv: ``[B]`` sequence advantages, broadcast over tokens.
        mask: ``[B, T]`` float.
        is_weight: optional ``[B, T]`` or ``[B]`` truncated importance weight correcting a
            sampler/trainer mismatch (vLLM), multiplied into the per-token loss.
        max_len: the fixed divisor of ``seq_mean_token_sum_norm`` (required there).
        num_tokens: the divisor of ``token_mean`` (:func:`aggregate`; default this batch's tokens).
        dual_clip: veRL's dual-clip constant ``c > 1`` (``clip_ratio_c``, Ye et al. 2020): for
            ``A < 0`` the per-token loss is ``min(l_t, -c A)``, bounding it when ``rho >> 1``.
            Default off (TRL has none; veRL's default is on, ``c = 3``).
        log_ratio_clip: clamp ``logp - logp_old`` to ``[-c, c]`` before ``exp`` (veRL: 20, always
            on; TRL: none). Default off.
        kl_estimator: ``k1`` | ``k2`` | ``k3`` (:func:`kl_estimate`; TRL: k3).
        kl_ratio_weighted: multiply the KL term by ``rho_t`` (differentiable), TRL's
            ``use_bias_correction_kl`` (DeepSeek-V3.2's unbiased reverse-KL gradient). Default off.

    Returns:
        ``(loss, metrics)`` with ``clip_frac`` and ``kl`` in metrics.
    """
    _check_tokens(token_logp, token_logp_old, adv, mask, is_weight)
    if token_logp_ref is not None:
        same_shape("token_logp", token_logp, "token_logp_ref", token_logp_ref)
    # one host sync: NaN at a real position is refused (padded slots are ignored below)
    no_nan_at(
        mask,
        token_logp=token_logp,
        token_logp_old=token_logp_old,
        adv=adv,
        token_logp_ref=token_logp_ref if kl_coef != 0.0 else None,
        is_weight=is_weight,
        kl_coef=kl_coef,
    )
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    if log_ratio_clip is not None and not log_ratio_clip > 0.0:
        raise ValueError(f"log_ratio_clip must be > 0, got {log_ratio_clip}")
    hi = clip_eps if clip_eps_high is None else clip_eps_high
    token_logp = zero_padding(token_logp, mask)
    log_ratio = token_logp - zero_padding(token_logp_old.detach(), mask)
    if log_ratio_clip is not None:
        log_ratio = log_ratio.clamp(-log_ratio_clip, log_ratio_clip)
    ratio = torch.exp(log_ratio)
    a = adv.detach()[:, None]
    unclipped = ratio * a
    clipped = ratio.clamp(1.0 - clip_eps, 1.0 + hi) * a
    per_token = -torch.minimum(unclipped, clipped)
    if dual_clip is not None:
        per_token = torch.where(a < 0, torch.minimum(per_token, -dual_clip * a), per_token)
    if is_weight is not None:
        w = is_weight.detach()
        per_token = per_token * (w[:, None] if w.dim() == 1 else zero_padding(w, mask))
    kl = torch.zeros_like(per_token)
    if kl_coef != 0.0:
        if token_logp_ref is None:
            raise ValueError("kl_coef != 0 needs token_logp_ref")
        same_shape("token_logp", token_logp, "token_logp_ref", token_logp_ref)
        kl = kl_estimate(token_logp, zero_padding(token_logp_ref.detach(), mask), kl_estimator)
        per_token = per_token + kl_coef * (kl * ratio if kl_ratio_weighted else kl)
    loss = aggregate(per_token, mask, loss_agg, max_len, num_tokens)
    with torch.no_grad():
        clip_frac = masked_mean(_clipped_indicator(clipped, unclipped), mask)
        kl_mean = masked_mean(kl, mask)
    return loss, {"clip_frac": clip_frac, "kl": kl_mean}


def ppo_kl_loss(
    token_logp: Tensor,
    token_logp_old: Tensor,
    adv: Tensor,
    mask: Tensor,
    kl_coef: float = 1.0,
    clip_eps: float = 0.2,
    loss_agg: LossAgg = "token_mean",
    clip_eps_high: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO/GRPO with a KL penalty to ``pi_old`` (LAD Sec. 4 bandit baseline, KL weight 1)."""
    return grpo_loss(
        token_logp,
        token_logp_old,
        adv,
        mask,
        clip_eps=clip_eps,
        clip_eps_high=clip_eps_high,
        loss_agg=loss_agg,
        token_logp_ref=token_logp_old,
        kl_coef=kl_coef,
    )


def gspo_loss(
    token_logp: Tensor,
    token_logp_old: Tensor,
    adv: Tensor,
    mask: Tensor,
    clip_eps: float = 3e-4,
    clip_eps_high: float | None = 4e-4,
    is_weight: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO (Zheng et al. 2025; ``docs/math.md`` §6): sequence-level ratio, clipped.

    ``s = exp(mean_t (logp_t - logp_old_t))`` (length-normalized), and
    ``loss = -mean_B min(s A, clip(s, 1 - eps, 1 + eps_high) A)``. The defaults are GSPO's
    paper values (3e-4 / 4e-4). An empty completion (all-zero mask row) contributes 0 and counts
    in the ``B`` of the mean (TRL's ``importance_sampling_level="sequence"``; veRL's
    ``seq-mean-token-mean`` leaves it out of the count).
    """
    _check_tokens(token_logp, token_logp_old, adv, mask, is_weight)
    no_nan_at(mask, token_logp=token_logp, token_logp_old=token_logp_old, adv=adv, is_weight=is_weight)  # host sync
    if is_weight is not None and is_weight.dim() != 1:
        raise ValueError(f"is_weight of gspo_loss must be [B], got {tuple(is_weight.shape)}")
    hi = clip_eps if clip_eps_high is None else clip_eps_high
    log_ratio = zero_padding(token_logp, mask) - zero_padding(token_logp_old.detach(), mask)
    log_s = masked_mean(log_ratio, mask, dim=1)  # [B]
    s = torch.exp(log_s)
    a = adv.detach()
    unclipped = s * a
    clipped = s.clamp(1.0 - clip_eps, 1.0 + hi) * a
    has_tokens = mask.sum(1) > 0
    per_seq = torch.where(has_tokens, -torch.minimum(unclipped, clipped), torch.zeros_like(s))
    if is_weight is not None:
        per_seq = per_seq * is_weight.detach()
    with torch.no_grad():
        seq_mask = has_tokens.to(s.dtype)
        clip_frac = masked_mean(_clipped_indicator(clipped, unclipped), seq_mask)
    return per_seq.mean(), {"clip_frac": clip_frac}
