"""Corrections the online trainer applies on top of an objective: the KL penalty to the reference
and the sequence-level importance weight of the sampler mismatch (vLLM vs the trained model).

* :func:`kl_penalty`: ``mean_{b,t: mask} k3(logp, logp_ref)`` with Schulman's k3 estimator
  ``e^{ref - logp} - (ref - logp) - 1`` (:func:`tiltlab.objectives.pg.kl_k3`), the token-level KL
  term of GRPO (DeepSeekMath eq. 3-4; TRL ``GRPOTrainer`` with ``beta > 0``), averaged over all
  unmasked tokens of the micro-batch. Not multiplied by any importance weight (as in TRL).
* :func:`sequence_is_weight`: TRL's vLLM importance-sampling correction
  (``importance_sampling_ratio`` = ``pi_theta_old / pi_vllm`` per token or per sequence) turned
  into one weight per sequence: a per-sequence ratio is used as is; a per-token ratio becomes the
  product over the completion's tokens, ``exp(sum_t mask_t log r_t)``, truncated at ``cap``
  (truncated importance sampling, as TRL's ``vllm_importance_sampling_mode="sequence_truncate"``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from tiltlab.objectives._checks import ndim, no_nan_at, nonempty, same_shape, zero_padding
from tiltlab.objectives.pg import KlEstimator, kl_estimate, masked_mean

__all__ = ["kl_penalty", "sequence_is_weight"]

_MAX_LOG_W = 80.0
"""Cap of the summed log-ratio before ``exp`` (``e^80`` is finite in float32)."""
_MIN_RATIO = 1e-30
"""Floor of a token ratio before ``log`` (a zero ratio would give ``-inf``)."""


def kl_penalty(token_logp: Tensor, token_logp_ref: Tensor, mask: Tensor, *, estimator: KlEstimator = "k3") -> Tensor:
    """``sum_{b,t} mask * k(logp, logp_ref) / sum_{b,t} mask``: the KL-to-reference term, ``k`` the
    ``estimator`` (:func:`~tiltlab.objectives.pg.kl_estimate`; k3 as TRL).

    Shapes: ``token_logp``, ``token_logp_ref``, ``mask`` ``[B, T]``; returns a scalar. Gradient
    flows into ``token_logp`` only when ``token_logp_ref`` is detached by the caller (TRL's
    reference log-probs are computed under ``no_grad``). An all-zero mask gives 0.
    """
    ndim("token_logp", token_logp, 2, "[B, T]")
    nonempty("token_logp", token_logp, 0)
    same_shape("token_logp", token_logp, "token_logp_ref", token_logp_ref)
    same_shape("token_logp", token_logp, "mask", mask)
    no_nan_at(mask, token_logp=token_logp, token_logp_ref=token_logp_ref)  # host sync: refuse NaN input
    # zero the padded slots of both inputs first: k3's backward would turn a NaN there into NaN gradient
    kl = kl_estimate(zero_padding(token_logp, mask), zero_padding(token_logp_ref, mask), estimator=estimator)
    return masked_mean(kl, mask)


def sequence_is_weight(ratio: Tensor, mask: Tensor, *, cap: float | None = None) -> Tensor:
    """One importance weight per sequence from TRL's ``importance_sampling_ratio``.

    ``ratio``: ``[B, 1]`` (already sequence level: returned as ``ratio[:, 0]``, ``cap`` not
    applied, as TRL applied its own) or ``[B, T]`` per token; ``mask``: ``[B, T]``. A per-token
    ratio gives ``min(exp(min(sum_t mask_t log max(r_t, 1e-30), 80)), cap)``. Returns ``[B]``.
    """
    ndim("ratio", ratio, 2, "[B, 1] or [B, T]")
    ndim("mask", mask, 2, "[B, T]")
    if ratio.shape[0] != mask.shape[0]:
        raise ValueError(f"ratio has {ratio.shape[0]} rows but mask has {mask.shape[0]}")
    if ratio.shape[1] == 1:
        return ratio[:, 0]
    same_shape("ratio", ratio, "mask", mask)
    if cap is not None and not cap > 0:
        raise ValueError(f"cap must be > 0, got {cap}")
    log_r = zero_padding(torch.log(ratio.clamp_min(_MIN_RATIO)), mask)  # a padded slot adds log 1 = 0
    log_w = log_r.sum(1)
    w = torch.exp(log_w.clamp(max=_MAX_LOG_W))
    return w.clamp(max=cap) if cap is not None else w
