"""Exact (enumerated) distributions of DISA's Stage-1 labels, and population reference values.

Used by the experiments (``sim/experiments``) and the checks: every quantity here is an
exact float64 expectation (or a Monte-Carlo draw, for :func:`mc_log_weights`), never a loss.
The estimators themselves (LSE / geometric-mean labels) are always applied through
``objectives.estimators``; this module only supplies the samples and their probabilities.

Sources: DISA App. C.1-C.2 (Props. 1-2); ``docs/math.md`` §1.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "compositions",
    "exact_label_moments",
    "label_samples_exact",
    "log_partition",
    "mc_log_weights",
    "relative_weight_variance",
    "target_logprobs",
]


def log_partition(logp_ref: Tensor, tilt: Tensor) -> Tensor:
    """Exact ``log Z = log sum_y pi_ref(y) exp(tilt(y))`` over an enumerable last axis ``[..., K] -> [...]``
    (DISA eq. 4, ``tilt = beta * r~``)."""
    return torch.logsumexp(logp_ref + tilt, dim=-1)


def target_logprobs(logp_ref: Tensor, tilt: Tensor) -> Tensor:
    """The reward-tilted target ``log pi*(y) = log pi_ref(y) + tilt(y) - log Z``: ``[..., K]`` (DISA eq. 4)."""
    return logp_ref + tilt - log_partition(logp_ref, tilt).unsqueeze(-1)


def relative_weight_variance(logp_target: Tensor, logq: Tensor) -> Tensor:
    """Population ``Var_q(w) / Z^2 = sum_y pi*(y)^2 / q(y) - 1`` (the chi-square divergence
    ``chi2(pi* || q)``) over ``[..., K] -> [...]``.

    ``w / Z = pi* / q`` for the IS weight ``w = pi_ref e^{beta r~} / q``; this is the quantity in
    DISA's delta-method statements (Prop. 1: ``E[log Z_M] - log Z ~ -Var_q(w) / (2 M Z^2)``).
    ``+inf`` when ``q`` misses part of ``pi*``'s support.
    """
    miss = torch.isinf(logq) & torch.isfinite(logp_target)
    val = torch.where(torch.isfinite(logq), torch.exp(2 * logp_target - logq), torch.zeros_like(logq)).sum(-1) - 1.0
    return torch.where(miss.any(-1), torch.full_like(val, math.inf), val)


def compositions(m: int, k: int) -> Tensor:
    """All count vectors ``n in N^k`` with ``sum n = m``: ``[C(m+k-1, k-1), k]`` int64."""
    if m < 0 or k < 1:
        raise ValueError(f"need m >= 0 and k >= 1, got m={m}, k={k}")
    if k == 1:
        return torch.tensor([[m]], dtype=torch.long)
    rows = []
    for first in range(m + 1):
        rest = compositions(m - first, k - 1)
        rows.append(torch.cat([torch.full((rest.shape[0], 1), first, dtype=torch.long), rest], dim=1))
    return torch.cat(rows, dim=0)


def label_samples_exact(logq: Tensor, log_w: Tensor, m: int) -> tuple[Tensor, Tensor]:
    """The exact distribution of an i.i.d. M-sample of log-weights from ``q`` over ``K`` outcomes.

    Every M-sample is, up to order, a composition ``n`` of ``M`` into ``K`` counts with
    multinomial probability ``M! / prod n_k! * prod q_k^{n_k}``. Returns
    ``(log_w_samples [C, M], prob [C])`` where row ``c`` lists each outcome's log-weight ``n_k``
    times; apply any permutation-invariant aggregator (``objectives.estimators``) along the last
    axis and take ``(prob * value).sum()`` for its exact expectation. Outcomes with ``q = 0``
    are dropped. ``C = binom(M + K - 1, K - 1)``: keep ``K <= 4`` for ``M = 64``.
    """
    if logq.dim() != 1 or logq.shape != log_w.shape:
        raise ValueError(f"logq and log_w must both be [K]; got {tuple(logq.shape)} and {tuple(log_w.shape)}")
    keep = torch.isfinite(logq)
    logq, log_w = logq[keep], log_w[keep]
    k = logq.shape[0]
    counts = compositions(int(m), k)  # [C, K]
    log_prob = (
        math.lgamma(m + 1)
        - torch.lgamma(counts.to(torch.float64) + 1).sum(-1)
        + (counts.to(torch.float64) * logq).sum(-1)
    )
    # row c: outcome index at slot j = number of cumulative counts <= j
    csum = counts.cumsum(-1)  # [C, K]
    slots = torch.arange(m).expand(counts.shape[0], m).contiguous()
    idx = torch.searchsorted(csum.contiguous(), slots, right=True)  # [C, M]
    return log_w[idx], log_prob.exp()


def exact_label_moments(values: Tensor, prob: Tensor) -> tuple[float, float]:
    """Mean and variance of a discrete distribution ``(values [C], prob [C])``."""
    mean = (prob * values).sum()
    var = (prob * (values - mean) ** 2).sum()
    return float(mean), float(var)


def mc_log_weights(logq: Tensor, log_w: Tensor, m: int, reps: int, generator: torch.Generator | None = None) -> Tensor:
    """Monte-Carlo M-samples of log-weights: ``[..., reps, M]`` from ``q [..., K]`` (i.i.d., with replacement)."""
    from tiltlab.sim.proposals import sample

    idx = sample(logq, int(reps) * int(m), generator=generator)  # [..., reps*M]
    lw = torch.gather(log_w, -1, idx)
    return lw.reshape(*logq.shape[:-1], int(reps), int(m))
