"""Quantities the online trainer logs (no gradient flows through them).

* :func:`weight_clip_fraction`: the share of sequences whose TB rollout weight
  (:func:`tiltlab.objectives.tb.tb_importance_weight`) sits at its clip: ``w >= max_weight`` for
  FlowRL's code clip ``min(w, max_weight)``, ``w <= 1-eps or w >= 1+eps`` for FlowRL's paper clip
  ``clip(w, 1-eps, 1+eps)``, 0 without clip.
* :func:`sequence_kl_old`: ``KL(pi_old || pi_theta)`` estimated on samples of ``pi_old`` at sequence
  level, ``mean_b sum_t mask (logp_old - logp)`` (PACED Fig. 1 logs ``beta`` times it).
* :func:`residual_stats`: a step's TB residuals ``delta`` (``[B]``) as the median, 90th percentile and
  largest ``|delta|`` and the share ``delta > 0``; :func:`flip_stats`: the same batch's residuals before
  and after an optimizer step (the share whose sign changed, the mean ``|delta|`` after and its ratio to before).
* :func:`pearson` / :func:`spearman`: correlation of the objective's ``log Z(x)`` with the measured
  group accuracy (PACED App. C.1). Spearman here is Pearson of ordinal ranks (ties broken by
  position, not averaged).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from tiltlab.objectives._checks import ndim, renamed, same_shape

__all__ = ["flip_stats", "pearson", "residual_stats", "sequence_kl_old", "spearman", "weight_clip_fraction"]


@renamed(clip="weight_clip")
def weight_clip_fraction(
    weight: Tensor, *, weight_clip: str, max_weight: float = 10.0, eps: float = 0.2, eps_high: float | None = None
) -> Tensor:
    """Fraction of ``weight`` (``[B]``, already clipped with ``weight_clip``) at its clip bounds; scalar.

    ``weight_clip``: ``"max"`` | ``"eps"`` | ``"ratio"`` as in :func:`~tiltlab.objectives.tb.tb_importance_weight`.
    """
    ndim("weight", weight, 1, "[B]")
    if weight_clip == "max":
        return (weight >= max_weight).float().mean()
    if weight_clip == "eps":
        hi = eps if eps_high is None else eps_high
        return ((weight <= 1 - eps) | (weight >= 1 + hi)).float().mean()
    if weight_clip == "ratio":
        return torch.zeros((), device=weight.device)
    raise ValueError(f"weight_clip must be 'max', 'eps' or 'ratio', got {weight_clip!r}")


def sequence_kl_old(token_logp_old: Tensor, token_logp: Tensor, mask: Tensor) -> Tensor:
    """``mean_b sum_t mask_bt (logp_old_bt - logp_bt)``; shapes ``[B, T]``; scalar, detached."""
    ndim("token_logp", token_logp, 2, "[B, T]")
    same_shape("token_logp", token_logp, "token_logp_old", token_logp_old)
    same_shape("token_logp", token_logp, "mask", mask)
    return ((token_logp_old - token_logp.detach()) * mask).sum(1).mean()


def pearson(a: Tensor, b: Tensor) -> Tensor:
    """Pearson correlation of two ``[N]`` vectors (N >= 2, neither constant); scalar."""
    ndim("a", a, 1, "[N]")
    same_shape("a", a, "b", b)
    if a.numel() < 2:
        raise ValueError(f"a correlation needs at least 2 points, got {a.numel()}")
    a, b = a - a.mean(), b - b.mean()
    denom: Tensor = a.norm() * b.norm()  # Tensor.norm is typed as returning Any
    return (a * b).sum() / denom


def _ranks(x: Tensor) -> Tensor:
    return torch.argsort(torch.argsort(x, stable=True), stable=True).to(x.dtype)


def spearman(a: Tensor, b: Tensor) -> Tensor:
    """Spearman rank correlation of two ``[N]`` vectors: Pearson of their ordinal ranks; scalar."""
    ndim("a", a, 1, "[N]")
    same_shape("a", a, "b", b)
    return pearson(_ranks(a), _ranks(b))


def residual_stats(residuals: Tensor) -> dict[str, float]:
    """The step's residual diagnostics from the per-sequence residuals ``[B]``: the median, 90th percentile
    and largest ``|delta|`` and the share of positive residuals (``delta > 0``: the sequence is more likely
    under the policy than the target wants). A NaN or empty input is refused (a diagnostic must not hide one)."""
    r = residuals.detach().float().reshape(-1)
    if r.numel() == 0:
        raise ValueError("residual_stats of an empty batch")
    if not bool(torch.isfinite(r).all()):
        raise ValueError("residual_stats: non-finite residuals")
    a = r.abs()
    return {
        "residual/abs_p50": float(torch.quantile(a, 0.5)),
        "residual/abs_p90": float(torch.quantile(a, 0.9)),
        "residual/abs_max": float(a.max()),
        "residual/pos_frac": float((r > 0).float().mean()),
    }


def flip_stats(before: Tensor, after: Tensor) -> dict[str, float]:
    """Residuals of one batch before and after an optimizer step (same sequences, same order): the share
    whose sign changed (a zero residual before counts as flipped when it is nonzero after), the mean ``|delta|``
    after, and its ratio to the mean before (``> 1``: the step left its own batch further from the target)."""
    b, a = before.detach().float().reshape(-1), after.detach().float().reshape(-1)
    if b.shape != a.shape or b.numel() == 0:
        raise ValueError(
            f"flip_stats needs two equal, nonempty residual vectors, got {tuple(b.shape)} and {tuple(a.shape)}"
        )
    if not (bool(torch.isfinite(b).all()) and bool(torch.isfinite(a).all())):
        raise ValueError("flip_stats: non-finite residuals")
    flipped = torch.sign(b) != torch.sign(a)
    before_abs = float(b.abs().mean())
    after_abs = float(a.abs().mean())
    return {
        "residual/flip_frac": float(flipped.float().mean()),
        "residual/after_abs_mean": after_abs,
        "residual/after_over_before": after_abs / before_abs if before_abs > 0 else math.inf,
    }
