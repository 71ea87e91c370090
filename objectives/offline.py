"""Offline objectives of the FPA paper (``docs/math.md`` §5).

Sequence quantities are ``[B]``: ``logp`` = masked token sum of ``log pi_theta(y|x)``,
``lengths`` = ``|y|`` (token count, > 0), ``reward`` ``R in {+1, -1}`` (Off-RL / FPA) or ``{0, 1}``
(A*-PO). Pairs for DPO-style losses are ``(y_w, y_l)`` with ``[B]`` tensors each.

One argument order for all of them: log-probs first (the policy's, then the reference's or the
future policy's), then lengths, then rewards / labels; a paired loss gives each quantity winner
first, then loser (``logp_w, logp_l, ref_w, ref_l, len_w, len_l``: the order of TRL's and the DPO
paper's ``dpo_loss``). Options (``beta``, ``kl_tau`` ...) are keyword-only. Every loss returns a
:class:`~tiltlab.objectives.output.LossOutput` (no metrics).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from tiltlab.objectives._checks import as_tensor, broadcastable, ndim, no_nan_at, nonempty, same_shape, zero_padding
from tiltlab.objectives.estimators import log_partition_lse
from tiltlab.objectives.output import LossOutput

__all__ = [
    "apo_loss",
    "apo_value",
    "dpo_loss",
    "fpa_loss",
    "future_policy_logprobs",
    "kto_loss",
    "offrl_loss",
    "rpo_loss",
    "sft_loss",
    "simper_loss",
]


def _check_lengths(logp: Tensor, lengths: Tensor) -> Tensor:
    same_shape("logp", logp, "lengths", lengths)
    lengths = lengths.to(logp.dtype)
    if bool((lengths <= 0).any()):
        raise ValueError("lengths (|y|) must be > 0")
    return lengths


def offrl_loss(
    logp: Tensor,
    lengths: Tensor,
    reward: Tensor,
    *,
    logp_ref: Tensor | None = None,
    kl_tau: float = 0.0,
) -> LossOutput:
    """Off-RL, FPA eq. (1), as a loss to minimize: ``-E[R * pi_theta(y|x)^{1/|y|}]``.

    Gradient (eq. 2): ``-E[(1/|y|) R pi^{1/|y|} grad log pi]``. With ``kl_tau > 0`` adds the
    forward-KL penalty of App. B.6 (eq. 31) on the offline data (``y ~ pi_ref``):
    ``+ tau * E[logp_ref - logp]`` (``tau = 0.04`` in the paper's Table 2 "w/ KL").
    """
    nonempty("logp", logp, 0)
    lengths = _check_lengths(logp, lengths)
    same_shape("logp", logp, "reward", reward)
    if logp_ref is not None:
        same_shape("logp", logp, "logp_ref", logp_ref)
    no_nan_at(None, logp=logp, reward=reward, logp_ref=logp_ref, kl_tau=kl_tau)
    loss = -(reward.detach() * torch.exp(logp / lengths)).mean()
    if kl_tau:
        if logp_ref is None:
            raise ValueError("kl_tau > 0 needs logp_ref")
        loss = loss + kl_tau * (logp_ref.detach() - logp).mean()
    return LossOutput(loss)


def fpa_loss(logp: Tensor, logp_future: Tensor, lengths: Tensor, reward: Tensor) -> LossOutput:
    """FPA, eq. (3): a surrogate whose gradient is ``-E[(1/|y|) R sg(pi_hat(y|x))^{1/|y|} grad log pi]``.

    ``loss = -mean( R * exp(sg(logp_future) / |y|) * logp / |y| )``; ``logp_future`` is the
    sequence log-prob under the extrapolated policy (:func:`future_policy_logprobs` summed over
    tokens) and is detached here. With ``lambda = 0`` (``logp_future = logp``) its gradient
    equals :func:`offrl_loss`'s.
    """
    nonempty("logp", logp, 0)
    lengths = _check_lengths(logp, lengths)
    same_shape("logp", logp, "reward", reward)
    same_shape("logp", logp, "logp_future", logp_future)
    no_nan_at(None, logp=logp, logp_future=logp_future, reward=reward)
    weight = torch.exp(logp_future.detach() / lengths)
    return LossOutput(-(reward.detach() * weight * logp / lengths).mean())


def future_policy_logprobs(logits_theta: Tensor, logits_ref: Tensor, ids: Tensor, *, lam: float) -> Tensor:
    """FPA eqs. (4)-(5), naive full-vocabulary version:
    ``log softmax((1 + lam) h_theta - lam h_ref)[ids]``, i.e. ``pi_hat ∝ pi_theta^{1+lam} pi_ref^{-lam}``
    normalized per token.

    Args:
        logits_theta, logits_ref: ``[B, T, V]``. ids: ``[B, T]`` (int64).
    Returns:
        ``[B, T]`` token log-probs under the future policy (memory-lean version:
        :func:`objectives.fused.fused_linear_future_logprobs`).
    """
    ndim("logits_theta", logits_theta, 3, "[B, T, V]")
    same_shape("logits_theta", logits_theta, "logits_ref", logits_ref)
    if ids.shape != logits_theta.shape[:2]:
        raise ValueError(f"ids must be [B, T]={tuple(logits_theta.shape[:2])}, got {tuple(ids.shape)}")
    z = (1.0 + lam) * logits_theta - lam * logits_ref
    if z.dtype in (torch.float16, torch.bfloat16):  # normalize in float32 for half inputs
        z = z.float()
    return torch.log_softmax(z, dim=-1).gather(-1, ids.long().unsqueeze(-1)).squeeze(-1).to(logits_theta.dtype)


def dpo_loss(logp_w: Tensor, logp_l: Tensor, ref_w: Tensor, ref_l: Tensor, *, beta: float = 0.1) -> LossOutput:
    """DPO (FPA App. B.2): ``-E log sigmoid(beta[(logp_w - ref_w) - (logp_l - ref_l)])``, beta = 0.1."""
    nonempty("logp_w", logp_w, 0)
    for n, t in (("logp_l", logp_l), ("ref_w", ref_w), ("ref_l", ref_l)):
        same_shape("logp_w", logp_w, n, t)
    no_nan_at(None, logp_w=logp_w, logp_l=logp_l, ref_w=ref_w, ref_l=ref_l, beta=beta)
    margin = (logp_w - ref_w.detach()) - (logp_l - ref_l.detach())
    return LossOutput(-F.logsigmoid(beta * margin).mean())


def rpo_loss(
    logp_w: Tensor,
    logp_l: Tensor,
    ref_w: Tensor,
    ref_l: Tensor,
    len_w: Tensor,
    *,
    beta: float = 0.1,
    alpha: float = 1.0,
) -> LossOutput:
    """RPO (FPA App. B.2): DPO ``- alpha * E[(1/|y_w|) log pi_theta(y_w|x)]``, alpha = 1."""
    len_w = _check_lengths(logp_w, len_w)
    return LossOutput(dpo_loss(logp_w, logp_l, ref_w, ref_l, beta=beta).loss - alpha * (logp_w / len_w).mean())


def kto_loss(
    logp: Tensor,
    logp_ref: Tensor,
    correct: Tensor,
    *,
    beta: float = 0.1,
    lambda_w: float = 1.0,
    lambda_l: float = 1.0,
    z0: Tensor | float | None = None,
) -> LossOutput:
    """KTO as the FPA paper defines it (App. B.2):

    r = logp - logp_ref,   z0 = mean r over the data (batch mean when not given; detached either way)
    v = lambda_w sigma(beta (r - z0)) if correct else lambda_l sigma(beta (z0 - r))
    L = E[lambda_y - v]
    """
    nonempty("logp", logp, 0)
    same_shape("logp", logp, "logp_ref", logp_ref)
    same_shape("logp", logp, "correct", correct)
    no_nan_at(None, logp=logp, logp_ref=logp_ref, beta=beta, z0=z0)
    r = logp - logp_ref.detach()
    z0_t = r.detach().mean() if z0 is None else as_tensor(z0, r).detach()
    broadcastable("logp", logp, "z0", z0_t)
    c = correct.bool()
    v = torch.where(c, lambda_w * torch.sigmoid(beta * (r - z0_t)), lambda_l * torch.sigmoid(beta * (z0_t - r)))
    lam = torch.where(c, torch.full_like(r, lambda_w), torch.full_like(r, lambda_l))
    return LossOutput((lam - v).mean())


def simper_loss(logp_w: Tensor, logp_l: Tensor, len_w: Tensor, len_l: Tensor) -> LossOutput:
    """SimPER (FPA App. A.1, eq. 9): ``-E[exp(logp_w/|y_w|) - exp(logp_l/|y_l|)]``.

    Prop. A.1: its gradient equals Off-RL's on the same pairs (``R = +1`` for y_w, ``-1`` for y_l).
    """
    nonempty("logp_w", logp_w, 0)
    len_w = _check_lengths(logp_w, len_w)
    len_l = _check_lengths(logp_l, len_l)
    no_nan_at(None, logp_w=logp_w, logp_l=logp_l)
    return LossOutput(-(torch.exp(logp_w / len_w) - torch.exp(logp_l / len_l)).mean())


def apo_value(rewards: Tensor, *, beta1: float = 0.5, dim: int = -1) -> Tensor:
    """A*-PO stage 1 (FPA App. B.2): ``V_hat(x) = beta1 * log((1/N) sum_i exp(r_i / beta1))``, ``y_i ~ pi_ref``.

    This is DISA's Stage-1 LSE label with proposal ``q = pi_ref`` (log-weights ``r / beta1``),
    scaled by ``beta1``: it calls :func:`objectives.estimators.log_partition_lse`.
    """
    if beta1 <= 0:
        raise ValueError("beta1 must be > 0")
    return beta1 * log_partition_lse(rewards / beta1, dim=dim)


def apo_loss(logp: Tensor, logp_ref: Tensor, reward: Tensor, v_hat: Tensor, *, beta2: float = 1e-3) -> LossOutput:
    """Offline A*-PO stage 2: ``E[(beta2 log(pi/pi_ref) - (r - V_hat(x)))^2]`` (beta2 = 1e-3)."""
    nonempty("logp", logp, 0)
    same_shape("logp", logp, "logp_ref", logp_ref)
    same_shape("logp", logp, "reward", reward)
    broadcastable("logp", logp, "v_hat", v_hat)
    no_nan_at(None, logp=logp, logp_ref=logp_ref, reward=reward, v_hat=v_hat)
    return LossOutput(((beta2 * (logp - logp_ref.detach()) - (reward.detach() - v_hat.detach())) ** 2).mean())


def sft_loss(token_logp: Tensor, mask: Tensor) -> LossOutput:
    """SFT on correct trajectories: token-mean negative log-likelihood ``-sum(mask logp) / sum(mask)``."""
    ndim("token_logp", token_logp, 2, "[B, T]")
    nonempty("token_logp", token_logp, 0)
    same_shape("token_logp", token_logp, "mask", mask)
    no_nan_at(mask, token_logp=token_logp)
    return LossOutput(-(zero_padding(token_logp, mask) * mask).sum() / mask.sum().clamp_min(1.0))
