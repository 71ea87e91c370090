"""Policy-gradient baselines: group advantages, the KL penalty in the reward, GRPO, GSPO, PPO with KL, and TRL's other loss types
CISPO, SAPO, LUSPO, VESPO with DeepSeek-V3.2's off-policy sequence mask (``docs/math.md`` §6).

Shapes: tokens ``[B, T]`` with a float ``mask`` (1 = completion token), sequences ``[B]``,
groups ``[P, G]`` (``B = P * G``, group-major: rows ``p*G .. p*G+G-1`` share prompt ``p``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypedDict, Unpack

import torch
from torch import Tensor

from tiltlab.objectives._checks import broadcastable, ndim, no_nan_at, nonempty, same_shape, zero_padding
from tiltlab.objectives.output import LossOutput

__all__ = [
    "AggOptions",
    "KlOptions",
    "PolicyOptions",
    "SequenceOptions",
    "aggregate",
    "cispo_loss",
    "group_advantages",
    "grpo_loss",
    "gspo_loss",
    "kl_estimate",
    "kl_in_reward",
    "kl_k3",
    "luspo_loss",
    "masked_mean",
    "off_policy_sequence_mask",
    "ppo_kl_loss",
    "sapo_loss",
    "vespo_loss",
]

LossAgg = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm", "seq_mean_token_sum"]


def group_advantages(rewards: Tensor, *, scale: Literal["std", "batch", "none"] = "std", eps: float = 1e-6) -> Tensor:
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


def kl_in_reward(rewards: Tensor, logp_old_seq: Tensor, logp_ref_seq: Tensor, *, coef: float) -> Tensor:
    """The KL-regularised reward ``r' = r - coef * sg(log pi_old(y|x) - log pi_ref(y|x))``.

    Classic KL-regularised RLHF (Ziegler et al. 2019, "Fine-Tuning Language Models from Human
    Preferences", §2; InstructGPT, Ouyang et al. 2022, §3.5 eq. (2)) and veRL's
    ``algorithm.use_kl_in_reward=True`` with ``kl_penalty="kl"`` (``apply_kl_penalty``: the per-token
    k1 ``logp_old_t - logp_ref_t`` subtracted from the token-level reward, which GRPO's outcome
    advantage sums over the response). The sequence log-probs are sums over the completion tokens;
    the penalty is a detached constant of the reward, never differentiated.

    Its expected policy gradient is ``E_pi[(r - coef log(pi/pi_ref)) grad log pi] =
    grad (E_pi[r] - coef KL(pi || pi_ref))``, whose maximiser is the tilted target
    ``pi*(y|x) = pi_ref(y|x) exp(r(x, y) / coef) / Z(x)``; at ``pi*`` the penalised reward equals
    ``coef log Z(x)`` for every completion, so every group advantage (:func:`group_advantages`,
    any ``scale``) is 0 sample by sample (``docs/math.md`` §6).

    Args:
        rewards: ``[B]`` or ``[P, G]`` rewards.
        logp_old_seq: behaviour (sampling-time) sequence log-probs ``sum_t log pi_old,t``, ``rewards``' shape.
        logp_ref_seq: reference sequence log-probs ``sum_t log pi_ref,t``, ``rewards``' shape.
        coef: the KL coefficient ``c >= 0`` (``1 / beta`` for the target ``pi_ref e^{beta r} / Z``;
            TRL's ``beta``, veRL's ``kl_ctrl.kl_coef``).

    Returns:
        ``r'``, ``rewards``' shape.
    """
    nonempty("rewards", rewards, 0)
    same_shape("rewards", rewards, "logp_old_seq", logp_old_seq)
    same_shape("rewards", rewards, "logp_ref_seq", logp_ref_seq)
    if not (math.isfinite(coef) and coef >= 0.0):
        raise ValueError(f"coef must be finite and >= 0, got {coef}")
    no_nan_at(None, rewards=rewards, logp_old_seq=logp_old_seq, logp_ref_seq=logp_ref_seq)
    return rewards - coef * (logp_old_seq.detach() - logp_ref_seq.detach())


def masked_mean(x: Tensor, mask: Tensor, *, dim: int | None = None) -> Tensor:
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
    *,
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
      (Dr. GRPO);
    - ``seq_mean_token_sum``: per-sequence token sum, mean over sequences (TRL's ``"luspo"``: each
      sequence weighs its length; veRL's ``seq-mean-token-sum``).

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
    if loss_agg in ("seq_mean_token_sum_norm", "seq_mean_token_sum"):
        div: float = 1.0
        if loss_agg == "seq_mean_token_sum_norm":
            if max_len is None or not max_len > 0:
                raise ValueError(f"loss_agg='seq_mean_token_sum_norm' needs a fixed max_len > 0, got {max_len!r}")
            div = max_len
        return ((zero_padding(per_token, mask) * mask).sum(dim=1) / div).mean()
    raise ValueError(f"unknown loss_agg {loss_agg!r}")


def kl_k3(logp: Tensor, logp_ref: Tensor) -> Tensor:
    """Schulman's k3 estimator of ``KL(pi || pi_ref)`` per sample: ``e^{ref - logp} - (ref - logp) - 1 >= 0``."""
    broadcastable("logp", logp, "logp_ref", logp_ref)
    d = logp_ref - logp
    return torch.exp(d) - d - 1.0


KlEstimator = Literal["k1", "k2", "k3"]


def kl_estimate(logp: Tensor, logp_ref: Tensor, *, estimator: KlEstimator = "k3") -> Tensor:
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


class SequenceOptions(TypedDict, total=False):
    """The options every loss of the GRPO family takes (all of them: :class:`PolicyOptions`)."""

    is_weight: Tensor | None
    off_policy_threshold: float | None
    token_logp_sampler: Tensor | None


class KlOptions(SequenceOptions, total=False):
    """:class:`SequenceOptions` and the KL term's (the losses with a KL term)."""

    token_logp_ref: Tensor | None
    kl_coef: float
    kl_estimator: KlEstimator
    kl_ratio_weighted: bool


class AggOptions(KlOptions, total=False):
    """:class:`KlOptions` and the aggregation's (the losses with a choice of ``loss_agg``)."""

    loss_agg: LossAgg
    max_len: int | None
    num_tokens: Tensor | float | None


class PolicyOptions(AggOptions, total=False):
    """The keyword options shared by the GRPO family (:func:`grpo_loss`, :func:`cispo_loss`,
    :func:`sapo_loss`; :func:`vespo_loss` has all but ``log_ratio_clip``, :func:`luspo_loss` those of
    :class:`KlOptions`, :func:`gspo_loss` those of :class:`SequenceOptions`), declared and documented
    once here; each loss adds its own (clip, temperatures ...) before them.

    Attributes:
        is_weight: optional ``[B, T]`` or ``[B]`` truncated importance weight correcting a
            sampler/trainer mismatch (vLLM), multiplied into the per-token policy term (never the
            KL term: TRL adds the KL after the vLLM IS ratio; veRL weights only the policy loss).
            Detached. Default none.
        off_policy_threshold: DeepSeek-V3.2's ``delta``: drop the policy term of the sequences
            :func:`off_policy_sequence_mask` drops (TRL's ``off_policy_mask_threshold``). Default off.
        token_logp_sampler: ``[B, T]`` log-probs the tokens were sampled with, for that mask
            (default ``token_logp_old``, TRL's fallback when vLLM's are absent).
        token_logp_ref: ``[B, T]`` reference log-probs of the KL term (detached; needed when
            ``kl_coef != 0``). ``token_logp_ref = token_logp_old`` with ``kl_coef`` gives LAD's
            bandit baseline "GRPO + KL to pi_old" (:func:`ppo_kl_loss`).
        kl_coef: the KL term's weight: ``+ kl_coef * k(logp_t, ref_t)`` per token. Default 0.
        kl_estimator: ``k1`` | ``k2`` | ``k3`` (:func:`kl_estimate`; TRL: k3, the default).
        kl_ratio_weighted: multiply the KL term by the ratio (differentiable), TRL's
            ``use_bias_correction_kl`` (DeepSeek-V3.2's unbiased reverse-KL gradient). Default off.
        loss_agg: the reduction of the per-token loss (:func:`aggregate`; default ``token_mean``,
            ``seq_mean_token_mean`` for :func:`sapo_loss`).
        max_len: the fixed divisor of ``seq_mean_token_sum_norm`` (required there).
        num_tokens: the divisor of ``token_mean`` (:func:`aggregate`; default this batch's tokens).
        log_ratio_clip: clamp ``logp - logp_old`` to ``[-c, c]`` before ``exp`` (veRL: 20, always
            on; TRL: none). Default off.
    """

    log_ratio_clip: float | None


@dataclass(frozen=True)
class _Tail:
    """The values of :class:`PolicyOptions` in one call (the defaults where not given)."""

    is_weight: Tensor | None = None
    off_policy_threshold: float | None = None
    token_logp_sampler: Tensor | None = None
    token_logp_ref: Tensor | None = None
    kl_coef: float = 0.0
    kl_estimator: KlEstimator = "k3"
    kl_ratio_weighted: bool = False
    loss_agg: LossAgg = "token_mean"
    max_len: int | None = None
    num_tokens: Tensor | float | None = None
    log_ratio_clip: float | None = None


def _tail(fn: str, accepted: type, given: Mapping[str, Any], **defaults: Any) -> _Tail:
    """The options ``given`` to ``fn`` (keys of the TypedDict ``accepted``) over ``defaults``; an
    unknown keyword is refused as Python refuses one."""
    keys: frozenset[str] = accepted.__optional_keys__  # type: ignore[attr-defined]  # a TypedDict
    for k in given:
        if k not in keys:
            raise TypeError(f"{fn}() got an unexpected keyword argument {k!r}")
    return _Tail(**{**defaults, **given})


def _check_family(token_logp: Tensor, token_logp_old: Tensor, adv: Tensor, mask: Tensor, t: _Tail) -> None:
    """The GRPO family's input contract: shapes, one host sync refusing NaN at a real position
    (padded slots are ignored; the sampler's log-probs may hold NaN, see :func:`off_policy_sequence_mask`)."""
    ndim("token_logp", token_logp, 2, "[B, T]")
    nonempty("token_logp", token_logp, 0)
    same_shape("token_logp", token_logp, "token_logp_old", token_logp_old)
    same_shape("token_logp", token_logp, "mask", mask)
    if adv.shape != token_logp.shape[:1]:
        raise ValueError(f"advantages must be [B]={tuple(token_logp.shape[:1])}, got {tuple(adv.shape)}")
    w = t.is_weight
    if w is not None and w.shape not in (token_logp.shape, token_logp.shape[:1]):
        raise ValueError(f"is_weight must be [B] or [B, T]={tuple(token_logp.shape)}, got {tuple(w.shape)}")
    if t.token_logp_ref is not None:
        same_shape("token_logp", token_logp, "token_logp_ref", t.token_logp_ref)
    if t.token_logp_sampler is not None:
        same_shape("token_logp", token_logp, "token_logp_sampler", t.token_logp_sampler)
    no_nan_at(
        mask,
        token_logp=token_logp,
        token_logp_old=token_logp_old,
        adv=adv,
        token_logp_ref=t.token_logp_ref if t.kl_coef != 0.0 else None,
        is_weight=w,
        kl_coef=t.kl_coef,
        off_policy_threshold=t.off_policy_threshold,
    )
    if t.kl_coef != 0.0 and t.token_logp_ref is None:
        raise ValueError("kl_coef != 0 needs token_logp_ref")
    if t.log_ratio_clip is not None and not t.log_ratio_clip > 0.0:
        raise ValueError(f"log_ratio_clip must be > 0, got {t.log_ratio_clip}")


def _log_ratio(token_logp: Tensor, token_logp_old: Tensor, mask: Tensor, clip: float | None = None) -> Tensor:
    """``logp_t - logp_old_t`` (``pi_old`` detached), 0 at padded slots, clamped to ``[-clip, clip]``."""
    log_ratio = zero_padding(token_logp, mask) - zero_padding(token_logp_old.detach(), mask)
    return log_ratio if clip is None else log_ratio.clamp(-clip, clip)


def _clipped_surrogate(ratio: Tensor, a: Tensor, lo: float, hi: float) -> tuple[Tensor, Tensor, Tensor]:
    """PPO's ``(-min(rho A, clip(rho, 1 - lo, 1 + hi) A), clipped, unclipped)``, any broadcast shape."""
    unclipped = ratio * a
    clipped = ratio.clamp(1.0 - lo, 1.0 + hi) * a
    return -torch.minimum(unclipped, clipped), clipped, unclipped


def _sequence_log_ratio(token_logp: Tensor, token_logp_old: Tensor, mask: Tensor) -> Tensor:
    """GSPO's length-normalized sequence log-ratio ``mean_t (logp_t - logp_old_t)``, ``[B]`` (0 for an empty row)."""
    return masked_mean(_log_ratio(token_logp, token_logp_old, mask), mask, dim=1)


def off_policy_sequence_mask(
    token_logp: Tensor, token_logp_sampler: Tensor, adv: Tensor, mask: Tensor, *, threshold: float
) -> Tensor:
    """DeepSeek-V3.2's off-policy sequence mask (arXiv 2512.02556, eq. 9; TRL's
    ``off_policy_mask_threshold``): ``[B]`` float, 1 = keep, 0 = drop,

    ``keep_i = 1[A_i >= 0  or  mean_t (logp_sampler_{i,t} - logp_{i,t}) <= delta]``,

    the token mean of the sampled tokens' log-ratio estimating ``KL(pi_sampler || pi_theta)`` of
    the sequence: a negative-advantage sequence the current policy has drifted far from is dropped.
    A NaN log-prob or advantage at a real position is refused (ValueError).
    ``token_logp_sampler`` is the log-prob the sequence was sampled with (TRL: vLLM's
    ``sampling_per_token_logps`` when present, else ``pi_old``'s). A NaN sampler log-prob (a token
    vLLM could not score) counts as 0 (TRL's rule: no evidence of drift). No gradient.
    """
    ndim("token_logp", token_logp, 2, "[B, T]")
    same_shape("token_logp", token_logp, "token_logp_sampler", token_logp_sampler)
    same_shape("token_logp", token_logp, "mask", mask)
    if adv.shape != token_logp.shape[:1]:
        raise ValueError(f"advantages must be [B]={tuple(token_logp.shape[:1])}, got {tuple(adv.shape)}")
    no_nan_at(mask, token_logp=token_logp, adv=adv, threshold=threshold)  # host sync
    return _off_policy_keep(token_logp, token_logp_sampler, adv, mask, threshold)


def _off_policy_keep(
    token_logp: Tensor, token_logp_sampler: Tensor, adv: Tensor, mask: Tensor, threshold: float
) -> Tensor:
    """:func:`off_policy_sequence_mask` without the input checks (the callers made them)."""
    if not math.isfinite(threshold):
        raise ValueError(f"off-policy mask threshold must be finite, got {threshold}")
    with torch.no_grad():
        d = token_logp_sampler.detach() - token_logp.detach()
        d = torch.where(torch.isnan(token_logp_sampler), torch.zeros_like(d), d)
        kl_seq = masked_mean(d, mask, dim=1)
        return ((adv >= 0) | (kl_seq <= threshold)).to(token_logp.dtype)


def _sequence_keep(
    token_logp: Tensor, token_logp_old: Tensor, adv: Tensor, mask: Tensor, t: _Tail, metrics: dict[str, Tensor]
) -> Tensor | None:
    """The ``[B]`` off-policy keep mask of the GRPO family (None when off), from the sampler's
    log-probs or, without them, ``pi_old``'s (TRL's fallback); logs ``off_policy_kept``."""
    if t.off_policy_threshold is None:
        return None
    sampler = token_logp_old if t.token_logp_sampler is None else t.token_logp_sampler
    keep = _off_policy_keep(token_logp, sampler, adv, mask, t.off_policy_threshold)
    metrics["off_policy_kept"] = keep.mean()
    return keep


def _policy_total(
    per_token: Tensor,
    token_logp: Tensor,
    token_logp_old: Tensor,
    adv: Tensor,
    mask: Tensor,
    ratio: Tensor,
    t: _Tail,
    *,
    weighted: bool = True,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The GRPO family's common tail (TRL's order): the per-token policy term ``[B, T]`` times the
    off-policy keep mask, times ``is_weight`` (the sampler IS weight, ``[B]`` or ``[B, T]``; never
    the KL term; not with ``weighted=False``), plus ``kl_coef * k(logp, ref)`` (times ``ratio`` with
    ``kl_ratio_weighted``, TRL's ``use_bias_correction_kl``), reduced by :func:`aggregate`.
    Returns ``(loss, {kl[, off_policy_kept]})``."""
    metrics: dict[str, Tensor] = {}
    keep = _sequence_keep(token_logp, token_logp_old, adv, mask, t, metrics)
    if keep is not None:
        per_token = per_token * keep[:, None]
    if weighted and t.is_weight is not None:
        w = t.is_weight.detach()
        per_token = per_token * (w[:, None] if w.dim() == 1 else zero_padding(w, mask))
    kl = torch.zeros_like(per_token)
    if t.kl_coef != 0.0:
        assert t.token_logp_ref is not None  # _check_family
        ref = zero_padding(t.token_logp_ref.detach(), mask)
        kl = kl_estimate(zero_padding(token_logp, mask), ref, estimator=t.kl_estimator)
        per_token = per_token + t.kl_coef * (kl * ratio if t.kl_ratio_weighted else kl)
    loss = aggregate(per_token, mask, loss_agg=t.loss_agg, max_len=t.max_len, num_tokens=t.num_tokens)
    with torch.no_grad():
        metrics["kl"] = masked_mean(kl, mask)
    return loss, metrics


def grpo_loss(
    token_logp: Tensor,
    token_logp_old: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    dual_clip: float | None = None,
    **options: Unpack[PolicyOptions],
) -> LossOutput:
    """GRPO / PPO token-level clipped surrogate (``docs/math.md`` §6).

    ``rho_t = exp(logp_t - logp_old_t)``; per token
    ``l_t = -m w_t min(rho_t A, clip(rho_t, 1 - eps, 1 + eps_high) A) + kl_coef * k3(logp_t, ref_t)``,
    aggregated by ``loss_agg``, with ``w`` the optional ``is_weight`` and ``m`` the optional
    off-policy keep mask of the sequence: both multiply the policy-gradient term only, never the KL
    term.

    Args:
        token_logp: ``[B, T]`` current policy log-probs of the sampled tokens (with grad).
        token_logp_old: ``[B, T]`` behaviour log-probs (detached inside).
        adv: ``[B]`` sequence advantages, broadcast over tokens.
        mask: ``[B, T]`` float.
        clip_eps, clip_eps_high: the clip range ``[1 - eps, 1 + eps_high]`` (``eps_high`` defaults to ``eps``).
        dual_clip: veRL's dual-clip constant ``c > 1`` (``clip_ratio_c``, Ye et al. 2020): for
            ``A < 0`` the per-token loss is ``min(l_t, -c A)``, bounding it when ``rho >> 1``.
            Default off (TRL has none; veRL's default is on, ``c = 3``).
        **options: the family's shared options, :class:`PolicyOptions` (``is_weight``,
            ``token_logp_ref``, ``kl_coef``, ``loss_agg`` ...).

    Returns:
        :class:`~tiltlab.objectives.output.LossOutput` with ``clip_frac`` and ``kl`` (and ``off_policy_kept``) in metrics.
    """
    t = _tail("grpo_loss", PolicyOptions, options)
    _check_family(token_logp, token_logp_old, adv, mask, t)
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    hi = clip_eps if clip_eps_high is None else clip_eps_high
    ratio = torch.exp(_log_ratio(token_logp, token_logp_old, mask, t.log_ratio_clip))
    a = adv.detach()[:, None]
    per_token, clipped, unclipped = _clipped_surrogate(ratio, a, clip_eps, hi)
    if dual_clip is not None:
        per_token = torch.where(a < 0, torch.minimum(per_token, -dual_clip * a), per_token)
    loss, metrics = _policy_total(per_token, token_logp, token_logp_old, adv, mask, ratio, t)
    with torch.no_grad():
        metrics["clip_frac"] = masked_mean(_clipped_indicator(clipped, unclipped), mask)
    return LossOutput(loss, metrics)


def ppo_kl_loss(
    token_logp: Tensor,
    token_logp_old: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    kl_coef: float = 1.0,
    clip_eps: float = 0.2,
    loss_agg: LossAgg = "token_mean",
    clip_eps_high: float | None = None,
) -> LossOutput:
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
    *,
    clip_eps: float = 3e-4,
    clip_eps_high: float | None = 4e-4,
    **options: Unpack[SequenceOptions],
) -> LossOutput:
    """GSPO (Zheng et al. 2025; ``docs/math.md`` §6): sequence-level ratio, clipped.

    ``s = exp(mean_t (logp_t - logp_old_t))`` (length-normalized), and
    ``loss = -mean_B m w min(s A, clip(s, 1 - eps, 1 + eps_high) A)``, ``w`` the optional ``[B]``
    ``is_weight`` and ``m`` the optional off-policy keep mask (:func:`off_policy_sequence_mask`);
    the options of :class:`SequenceOptions`. The defaults are GSPO's paper values (3e-4 / 4e-4). An empty
    completion (all-zero mask row) contributes 0 and counts in the ``B`` of the mean (TRL's
    ``importance_sampling_level="sequence"``; veRL's ``seq-mean-token-mean`` leaves it out of the count).
    """
    t = _tail("gspo_loss", SequenceOptions, options)
    _check_family(token_logp, token_logp_old, adv, mask, t)
    if t.is_weight is not None and t.is_weight.dim() != 1:
        raise ValueError(f"is_weight of gspo_loss must be [B], got {tuple(t.is_weight.shape)}")
    hi = clip_eps if clip_eps_high is None else clip_eps_high
    s = torch.exp(_sequence_log_ratio(token_logp, token_logp_old, mask))
    per, clipped, unclipped = _clipped_surrogate(s, adv.detach(), clip_eps, hi)
    has_tokens = mask.sum(1) > 0
    per_seq = torch.where(has_tokens, per, torch.zeros_like(s))
    metrics: dict[str, Tensor] = {}
    keep = _sequence_keep(token_logp, token_logp_old, adv, mask, t, metrics)
    if keep is not None:
        per_seq = per_seq * keep
    if t.is_weight is not None:
        per_seq = per_seq * t.is_weight.detach()
    with torch.no_grad():
        seq_mask = has_tokens.to(s.dtype)
        metrics["clip_frac"] = masked_mean(_clipped_indicator(clipped, unclipped), seq_mask)
    return LossOutput(per_seq.mean(), metrics)


def cispo_loss(
    token_logp: Tensor,
    token_logp_old: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    ratio_max: float = 5.0,
    ratio_min: float | None = None,
    **options: Unpack[PolicyOptions],
) -> LossOutput:
    """CISPO (MiniMax-M1, arXiv 2506.13585, eq. 4-5; ScaleRL, arXiv 2510.13786): clip the
    importance weight, not the update; the weight is a constant (stop-gradient) so every token
    keeps its gradient.

    Per token ``l_t = -sg(clip(rho_t, r_min, r_max)) A logp_t`` with ``rho_t = exp(logp_t - logp_old_t)``
    (gradient ``-sg(clip(rho_t)) A grad logp_t``), then the off-policy mask, the sampler IS weight
    and the KL term of :func:`grpo_loss`, aggregated by ``loss_agg`` (default ``token_mean``: TRL's
    ``"cispo"`` passes the accumulation window's token count as ``num_tokens``, like ``"dapo"``).

    ``ratio_max`` is the cap itself, ScaleRL's ``eps_max`` and TRL's ``epsilon_high`` for
    ``loss_type="cispo"`` (recommended 5.0); ``ratio_min`` is an optional floor (TRL: none, as in
    ScaleRL; MiniMax-M1 and veRL clip to ``[1 - eps_low, 1 + eps_high]``: pass
    ``ratio_min = 1 - eps_low, ratio_max = 1 + eps_high``). The other options: :class:`PolicyOptions`.

    Returns:
        :class:`~tiltlab.objectives.output.LossOutput`: ``clip_frac`` (tokens whose weight is clipped), ``kl`` (and ``off_policy_kept``).
    """
    t = _tail("cispo_loss", PolicyOptions, options)
    _check_family(token_logp, token_logp_old, adv, mask, t)
    if ratio_min is not None and not ratio_max > ratio_min:
        raise ValueError(f"ratio_max must be > ratio_min, got {ratio_max} <= {ratio_min}")
    ratio = torch.exp(_log_ratio(token_logp, token_logp_old, mask, t.log_ratio_clip))
    weight = ratio.detach().clamp(min=ratio_min, max=ratio_max)
    per_token = -weight * adv.detach()[:, None] * zero_padding(token_logp, mask)
    loss, metrics = _policy_total(per_token, token_logp, token_logp_old, adv, mask, ratio, t)
    with torch.no_grad():
        clipped = torch.where(torch.isnan(ratio), ratio, (weight != ratio).to(ratio.dtype))
        metrics["clip_frac"] = masked_mean(clipped, mask)
    return LossOutput(loss, metrics)


def sapo_loss(
    token_logp: Tensor,
    token_logp_old: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    temp_pos: float = 1.0,
    temp_neg: float = 1.05,
    **options: Unpack[PolicyOptions],
) -> LossOutput:
    """SAPO (Soft Adaptive Policy Optimization, Qwen, arXiv 2511.20347): a smooth sigmoid gate
    in place of the hard clip.

    Per token ``l_t = -(4 / tau) sigmoid(tau (rho_t - 1)) A`` with ``rho_t = exp(logp_t - logp_old_t)``
    and ``tau = temp_pos`` for ``A > 0``, ``temp_neg`` for ``A <= 0`` (its gradient
    ``-4 sigmoid' (tau (rho - 1)) rho A grad logp`` equals the policy gradient at ``rho = 1`` and
    fades away from it); then the off-policy mask, the sampler IS weight and the KL term of
    :func:`grpo_loss`, aggregated by ``loss_agg`` (default ``seq_mean_token_mean``, TRL's and
    veRL's ``"sapo"``). The default temperatures are TRL's (``sapo_temperature_pos/neg``) and
    veRL's (``tau_pos/neg``): 1.0 / 1.05. The other options: :class:`PolicyOptions`.

    Returns:
        :class:`~tiltlab.objectives.output.LossOutput`: ``kl`` (and ``off_policy_kept``).
    """
    t = _tail("sapo_loss", PolicyOptions, options, loss_agg="seq_mean_token_mean")
    _check_family(token_logp, token_logp_old, adv, mask, t)
    if not (temp_pos > 0 and temp_neg > 0):
        raise ValueError(f"SAPO temperatures must be > 0, got temp_pos={temp_pos}, temp_neg={temp_neg}")
    ratio = torch.exp(_log_ratio(token_logp, token_logp_old, mask, t.log_ratio_clip))
    a = adv.detach()[:, None]
    tau = torch.where(a > 0, torch.full_like(a, temp_pos), torch.full_like(a, temp_neg))
    per_token = -torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau) * a
    loss, metrics = _policy_total(per_token, token_logp, token_logp_old, adv, mask, ratio, t)
    return LossOutput(loss, metrics)


def luspo_loss(
    token_logp: Tensor,
    token_logp_old: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    clip_eps: float = 3e-4,
    clip_eps_high: float | None = 4e-4,
    **options: Unpack[KlOptions],
) -> LossOutput:
    """LUSPO (Length-Unbiased Sequence Policy Optimization, arXiv 2602.05261): GSPO with each
    sequence's loss scaled by its length, removing GSPO's bias towards short sequences.

    ``s = exp(mean_t (logp_t - logp_old_t))`` as :func:`gspo_loss`; per token (every real token of
    sequence ``i`` carries the sequence term) ``l_t = -m w_t min(s A, clip(s, 1 - eps, 1 + eps_high) A)
    + kl_coef * k3(logp_t, ref_t) (* s with kl_ratio_weighted)``, then ``loss = mean_B sum_t l_t``
    (:func:`aggregate`'s ``seq_mean_token_sum``): TRL's ``loss_type="luspo"`` at
    ``importance_sampling_level="sequence"`` (its recommended setting). ``w`` is the sampler IS
    weight, ``[B]`` or ``[B, T]`` (a per-token weight multiplies each token's copy of the sequence
    term, as TRL's token-level vLLM ratio does); ``m`` the off-policy keep mask. The clip defaults
    are GSPO's paper values (LUSPO changes GSPO's normalization, not its clip). The other options:
    :class:`KlOptions`.

    Returns:
        :class:`~tiltlab.objectives.output.LossOutput`: ``clip_frac`` (over non-empty sequences), ``kl`` (and ``off_policy_kept``).
    """
    t = _tail("luspo_loss", KlOptions, options, loss_agg="seq_mean_token_sum")
    _check_family(token_logp, token_logp_old, adv, mask, t)
    hi = clip_eps if clip_eps_high is None else clip_eps_high
    s = torch.exp(_sequence_log_ratio(token_logp, token_logp_old, mask))[:, None]  # [B, 1]
    per_seq, clipped, unclipped = _clipped_surrogate(s, adv.detach()[:, None], clip_eps, hi)
    loss, metrics = _policy_total(per_seq.expand_as(token_logp), token_logp, token_logp_old, adv, mask, s, t)
    with torch.no_grad():
        seq_mask = (mask.sum(1) > 0).to(s.dtype)
        metrics["clip_frac"] = masked_mean(_clipped_indicator(clipped, unclipped)[:, 0], seq_mask)
    return LossOutput(loss, metrics)


_LOG_W_MIN, _LOG_W_MAX = math.log(1e-8), 20.0  # VESPO's clamp of log w (TRL, after the paper's code)


def vespo_loss(
    token_logp: Tensor,
    token_logp_old: Tensor,
    adv: Tensor,
    mask: Tensor,
    *,
    k_pos: float = 2.0,
    lambda_pos: float = 3.0,
    k_neg: float = 3.0,
    lambda_neg: float = 2.0,
    **options: Unpack[AggOptions],
) -> LossOutput:
    """VESPO (Variational Sequence-Level Soft Policy Optimization, arXiv 2602.10693): a smooth,
    asymmetric Gamma-shaped weight of the SEQUENCE importance ratio in place of a clip.

    ``log w = clamp(sum_t clamp(logp_t - logp_old_t, -20, 20) + sum_t log iw_t, log 1e-8, 20)``
    (the product of the token ratios times the sampler IS weight ``iw``, each ``log iw_t``
    clamped to ``[log 1e-8, 20]``); ``phi(w) = e^lambda w^k e^{-lambda w}`` (``phi(1) = 1``), with
    ``(k, lambda) = (k_pos, lambda_pos)`` for ``A >= 0`` and ``(k_neg, lambda_neg)`` otherwise
    (``lambda >= 1e-4``; an overflowing ``phi`` is 0). Per token ``l_t = -sg(phi(w)) A logp_t``
    (gradient ``-phi(w) A grad logp_t``), then the off-policy mask and the KL term of
    :func:`grpo_loss` (times the token ratio with ``kl_ratio_weighted``), aggregated by
    ``loss_agg`` (default ``token_mean``: TRL's ``"vespo"`` passes the window's token count as
    ``num_tokens``). The sampler IS weight ``is_weight`` (``[B, T]`` per token or ``[B]`` per
    sequence) enters ``w`` only and does NOT multiply the loss (TRL skips its vLLM IS factor for
    ``"vespo"``). Defaults: TRL's ``vespo_k_pos`` etc. (2, 3, 3, 2). The clamps are TRL's. The
    other options: :class:`AggOptions`.

    Returns:
        :class:`~tiltlab.objectives.output.LossOutput`: ``phi_mean`` (mean over sequences), ``kl`` (and ``off_policy_kept``).
    """
    t = _tail("vespo_loss", AggOptions, options)
    _check_family(token_logp, token_logp_old, adv, mask, t)
    for name, v in (("k_pos", k_pos), ("k_neg", k_neg), ("lambda_pos", lambda_pos), ("lambda_neg", lambda_neg)):
        if not math.isfinite(v):
            raise ValueError(f"{name} must be finite, got {v}")
    log_ratio = _log_ratio(token_logp, token_logp_old, mask)
    a = adv.detach()
    with torch.no_grad():
        log_w = (log_ratio.clamp(-20.0, 20.0) * mask).sum(1)
        if t.is_weight is not None:
            log_iw = torch.log(t.is_weight.detach()).clamp(_LOG_W_MIN, _LOG_W_MAX)
            log_w = log_w + (log_iw if log_iw.dim() == 1 else zero_padding(log_iw, mask).sum(1))
        log_w = log_w.clamp(_LOG_W_MIN, _LOG_W_MAX)
        pos = a >= 0
        k = torch.where(pos, torch.full_like(a, k_pos), torch.full_like(a, k_neg))
        lam = torch.where(pos, torch.full_like(a, lambda_pos), torch.full_like(a, lambda_neg)).clamp(min=1e-4)
        phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    per_token = -phi[:, None] * a[:, None] * zero_padding(token_logp, mask)
    ratio = torch.exp(log_ratio)
    loss, metrics = _policy_total(per_token, token_logp, token_logp_old, adv, mask, ratio, t, weighted=False)
    metrics["phi_mean"] = phi.mean()
    return LossOutput(loss, metrics)
