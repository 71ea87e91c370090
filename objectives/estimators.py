"""Importance-sampling estimators of the partition function (DISA Stage 1).

DISA (Sec. 3.1, eqs. 7-8; reconstructed in ``docs/math.md`` §1).
For a prompt ``x`` draw ``y_1..y_M ~ q(.|x)`` and form the log importance weights

    log w_i = log pi_ref(y_i|x) + beta * r~(x, y_i) - log q(y_i|x)

The linear-scale estimate ``Z_hat_M = (1/M) sum_i w_i`` is unbiased for
``Z(x) = E_{pi_ref}[exp(beta r~)]`` under absolute continuity (Prop. 1); the label DISA uses
is its log, ``log Z_hat_M = LSE_i(log w_i) - log M``, which is biased low (Jensen) by about
``-Var_q(w) / (2 M Z^2)`` (delta method). The geometric mean ``(1/M) sum_i log w_i`` has an
M-independent bias (Prop. 2).

Conventions: ``log_w`` holds M samples along ``dim`` (default the last, shapes ``[..., M]``).
``-inf`` log-weights are legal (a sample with zero target mass contributes nothing); NaN and
``+inf`` are rejected. A prompt whose log-weights are all ``-inf`` gets ``log Z_hat = -inf``
and ESS 0.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from tiltlab.objectives._checks import as_tensor, broadcastable, no_nan, no_pos_inf, nonempty, positive

__all__ = [
    "bias_corrected_log_partition",
    "delta_method_bias",
    "effective_sample_size",
    "log_importance_weights",
    "log_partition_geomean",
    "log_partition_lse",
    "log_z_from_pass_rate",
    "max_normalized_weight",
    "normalized_weights",
    "pass_rate_from_log_z",
]


def _check_log_w(log_w: Tensor, dim: int) -> None:
    nonempty("log_w", log_w, dim)
    no_nan("log_w", log_w)
    no_pos_inf("log_w", log_w)


def log_importance_weights(logp_target: Tensor, logp_proposal: Tensor, tilt: Tensor | float) -> Tensor:
    """DISA eq. (7): ``log w = log pi_ref(y|x) + tilt - log q(y|x)``, with ``tilt = beta * r~(x, y)``.

    Args:
        logp_target: ``[...]`` sequence log-probs under pi_ref (masked token sums).
        logp_proposal: ``[...]`` sequence log-probs under the distribution actually sampled
            (temperature / top-p applied), same shape.
        tilt: ``[...]`` or scalar, ``beta * r~``.

    Returns:
        ``[...]`` log-weights. A ``-inf`` proposal log-prob (a sample the proposal could not
        have drawn) is an error; a ``-inf`` target log-prob gives a ``-inf`` weight.
    """
    logp_target = as_tensor(logp_target)
    logp_proposal = as_tensor(logp_proposal, logp_target)
    tilt = as_tensor(tilt, logp_target)
    broadcastable("logp_target", logp_target, "logp_proposal", logp_proposal)
    broadcastable("logp_target", logp_target, "tilt", tilt)
    if torch.isinf(logp_proposal).any() or torch.isnan(logp_proposal).any():
        raise ValueError("logp_proposal must be finite: a sample has zero probability under its own proposal")
    no_nan("logp_target", logp_target)
    return logp_target + tilt - logp_proposal


def log_partition_lse(log_w: Tensor, *, dim: int = -1) -> Tensor:
    """DISA eq. (8): ``log Z_hat_M = LSE_i(log w_i) - log M`` (the log of the unbiased mean).

    Args:
        log_w: ``[..., M]`` log-weights (``M`` along ``dim``).

    Returns:
        ``[...]`` the label. All ``-inf`` along ``dim`` gives ``-inf``.
    """
    log_w = as_tensor(log_w)
    _check_log_w(log_w, dim)
    m = log_w.shape[dim]
    return torch.logsumexp(log_w, dim=dim) - math.log(m)


def log_partition_geomean(log_w: Tensor, *, dim: int = -1) -> Tensor:
    """DISA Prop. 2's rejected aggregator: the geometric mean ``(1/M) sum_i log w_i``.

    Its expectation is ``E_q[log w] <= log Z`` for every M (the bias does not shrink with M).
    """
    log_w = as_tensor(log_w)
    _check_log_w(log_w, dim)
    return log_w.mean(dim=dim)


def normalized_weights(log_w: Tensor, *, dim: int = -1) -> Tensor:
    """Self-normalized weights ``u_i = w_i / sum_j w_j`` (``[..., M]``); all ``-inf`` rows give 0."""
    log_w = as_tensor(log_w)
    _check_log_w(log_w, dim)
    lse = torch.logsumexp(log_w, dim=dim, keepdim=True)
    u = torch.exp(log_w - lse)
    return torch.where(torch.isneginf(lse), torch.zeros_like(u), u)


def effective_sample_size(log_w: Tensor, *, dim: int = -1) -> Tensor:
    """Kish ESS ``(sum w)^2 / sum w^2 = 1 / sum_i u_i^2`` in ``[1, M]``; 0 for an all ``-inf`` row."""
    u = normalized_weights(log_w, dim=dim)
    s2 = (u * u).sum(dim=dim)
    return torch.where(s2 > 0, 1.0 / s2.clamp_min(torch.finfo(s2.dtype).tiny), torch.zeros_like(s2))


def max_normalized_weight(log_w: Tensor, *, dim: int = -1) -> Tensor:
    """Largest self-normalized weight ``max_i u_i`` (1 = one sample carries the whole label)."""
    return normalized_weights(log_w, dim=dim).amax(dim=dim)


def delta_method_bias(log_w: Tensor, *, dim: int = -1) -> Tensor:
    """Plug-in estimate of the LSE label's bias, ``E[log Z_hat_M] - log Z ~ -Var_q(w) / (2 M Z^2)``.

    DISA Prop. 1 (second-order delta method, ``docs/math.md`` §1). ``Var_q(w)/Z^2`` is estimated by
    the unbiased sample variance of ``w_i / Z_hat`` computed in log space:
    with ``u_i = w_i / sum_j w_j``, ``w_i / Z_hat = M u_i`` and
    ``Var_hat(w/Z_hat) = (M sum_i u_i^2 - 1) * M / (M - 1)``.

    Returns ``[...]`` values ``<= 0``. ``M = 1`` has no variance estimate: NaN. An all ``-inf``
    row returns 0 (no weight, no correction).
    """
    log_w = as_tensor(log_w)
    _check_log_w(log_w, dim)
    m = log_w.shape[dim]
    u = normalized_weights(log_w, dim=dim)
    s2 = (u * u).sum(dim=dim)
    if m == 1:
        return torch.full_like(s2, float("nan"))
    rel_var = (m * s2 - 1.0).clamp_min(0.0) * m / (m - 1)
    bias = -rel_var / (2.0 * m)
    return torch.where(s2 > 0, bias, torch.zeros_like(bias))


def bias_corrected_log_partition(log_w: Tensor, *, dim: int = -1) -> Tensor:
    """LSE label minus its delta-method bias: ``log Z_hat_M - delta_method_bias`` (>= the LSE label).

    ``docs/math.md`` §1 ("results beyond the paper"): a downward-biased label is the harmful side for
    the biased TB loss, so an upward correction is offered next to the plain label.
    """
    return log_partition_lse(log_w, dim=dim) - delta_method_bias(log_w, dim=dim)


def log_z_from_pass_rate(p: Tensor | float, *, beta: Tensor | float) -> Tensor:
    """Exact binary-reward identity (DISA §3 / ``docs/math.md`` §1): ``Z = 1 + p (e^beta - 1)``.

    For ``r in {0, 1}``, ``r~ = r``: ``Z = E_{pi_ref}[e^{beta r}] = (1 - p) + p e^beta``, computed
    as ``logaddexp(log(1 - p), log p + beta)`` (stable for large beta, exact at p = 0 and p = 1).

    Args:
        p: pass rate of pi_ref in ``[0, 1]``.
        beta: inverse temperature ``> 0`` (DISA's convention: beta multiplies the reward).
    """
    p = as_tensor(p)
    beta = as_tensor(beta, p)
    if bool(((p < 0) | (p > 1)).any()) or torch.isnan(p).any():
        raise ValueError("pass rate p must lie in [0, 1]")
    positive("beta", beta)
    return torch.logaddexp(torch.log1p(-p), torch.log(p) + beta)


def pass_rate_from_log_z(log_z: Tensor | float, *, beta: Tensor | float) -> Tensor:
    """Inverse of :func:`log_z_from_pass_rate`: ``p = (Z - 1) / (e^beta - 1)``.

    Evaluated as ``(e^{log Z - beta} - e^{-beta}) / (1 - e^{-beta})`` so that large beta does
    not overflow.

    Exact for binary rewards with ``r~ = r``. Not clipped: an estimated ``log Z`` outside
    ``[0, beta]`` maps outside ``[0, 1]``, which is diagnostic information.
    """
    log_z = as_tensor(log_z)
    beta = as_tensor(beta, log_z)
    positive("beta", beta)
    return (torch.exp(log_z - beta) - torch.exp(-beta)) / (-torch.expm1(-beta))
