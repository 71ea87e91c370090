"""LAD: f-divergence matching of the advantage distribution (``docs/math.md`` §4).

LAD (Sec. 3) matches ``P_pi(y|x) = (pi_theta/pi_old) / Z_pi`` (eq. 4) to
``P_A(y|x) = e^{A/eta} / Z_A`` (eq. 5). The theoretical loss (eq. 7) is ``D_f(P_pi || P_A)``;
the practical surrogate (eq. 8), estimated on samples ``y ~ pi_old``, is

    L_LAD = E_{y ~ pi_old} [ e^{A/eta} f( (pi_theta/pi_old) e^{-A/eta} ) ]

with the same optimum ``pi_theta ∝ pi_old e^{A/eta}`` (Lemma 3.2). The six generators of
Table 5 are written once below (each with ``f(1) = 0``); both losses are built from them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from tiltlab.objectives._checks import broadcastable, fits, no_nan_at, nonempty, renamed, same_shape
from tiltlab.objectives.output import LossOutput

__all__ = ["F_DIVERGENCES", "Divergence", "get_divergence", "lad_loss", "lad_target_logprobs", "lad_theoretical_loss"]


def _xlogx(x: Tensor) -> Tensor:
    return torch.xlogy(x, x)


@dataclass(frozen=True)
class Divergence:
    """An f-divergence generator ``f: (0, inf) -> R``, convex, ``f(1) = 0`` (LAD Def. 3.1).

    Attributes:
        name: short name used in configs.
        f: the generator as printed in LAD Table 5.
        strict: LAD's "strict divergence" mark (forces exact matching at the minimum).
        formula: the generator in text.
    """

    name: str
    f: Callable[[Tensor], Tensor]
    strict: bool
    formula: str

    def __call__(self, x: Tensor) -> Tensor:
        return self.f(x)


F_DIVERGENCES: dict[str, Divergence] = {
    d.name: d
    for d in (
        Divergence("kl", lambda x: _xlogx(x), False, "x log x"),
        Divergence("rkl", lambda x: -torch.log(x), False, "-log x"),
        Divergence("jeffreys", lambda x: (x - 1.0) * torch.log(x), False, "(x - 1) log x"),
        Divergence("tv", lambda x: (x - 1.0).abs(), True, "|x - 1|"),
        Divergence("hellinger", lambda x: 0.5 * (torch.sqrt(x) - 1.0) ** 2, True, "1/2 (sqrt x - 1)^2"),
        Divergence(
            "js",
            lambda x: 0.5 * (_xlogx(x) - (x + 1.0) * torch.log((x + 1.0) / 2.0)),
            True,
            "1/2 (x log x - (x + 1) log((x + 1)/2))",
        ),
    )
}


def get_divergence(divergence: str | Divergence) -> Divergence:
    if isinstance(divergence, Divergence):
        return divergence
    try:
        return F_DIVERGENCES[divergence]
    except KeyError:
        raise ValueError(f"unknown divergence {divergence!r}; choose from {sorted(F_DIVERGENCES)}") from None


@renamed(weight="is_weight", reduction="loss_agg (reduction='mean' is loss_agg='token_mean')")
def lad_loss(
    logp: Tensor,
    logp_old: Tensor,
    adv: Tensor,
    *,
    eta: float,
    divergence: str | Divergence,
    is_weight: Tensor | None = None,
    loss_agg: Literal["token_mean", "none"] = "token_mean",
) -> LossOutput:
    """LAD eq. (8), practical loss on samples from ``pi_old``:
    ``e^{A/eta} f( exp(logp - logp_old - A/eta) )``.

    Args:
        logp: ``[B]`` sequence (or ``[B, T]`` token) log-probs under pi_theta (with grad).
        logp_old: same shape, under pi_old (detached inside).
        adv: advantages, broadcastable to ``logp`` (detached inside).
        eta: temperature ``> 0``.
        divergence: a name in :data:`F_DIVERGENCES` or a :class:`Divergence`.
        is_weight: optional per-sample importance weight (e.g. a sampler-mismatch correction),
            broadcastable to ``logp``, detached (the name of every objective's per-sample weight).
        loss_agg: ``"token_mean"`` (the mean over every entry of ``logp``: there is no padding
            here, so the token mean of :func:`~tiltlab.objectives.pg.aggregate`) or ``"none"``.

    Returns:
        :class:`~tiltlab.objectives.output.LossOutput`: the scalar mean, or with ``loss_agg="none"``
        the per-sample terms (``logp``'s shape); no metrics.
    """
    if eta <= 0:
        raise ValueError("eta must be > 0")
    same_shape("logp", logp, "logp_old", logp_old)
    nonempty("logp", logp, 0)
    fits("logp", logp, "adv", adv)
    if is_weight is not None:
        fits("logp", logp, "is_weight", is_weight)
    no_nan_at(None, logp=logp, logp_old=logp_old, adv=adv, is_weight=is_weight, eta=eta)  # host sync: refuse NaN input
    div = get_divergence(divergence)
    a = adv.detach() / eta
    c = torch.exp(logp - logp_old.detach() - a)
    per = torch.exp(a) * div.f(c)
    if is_weight is not None:
        per = per * is_weight.detach()
    if loss_agg == "none":
        return LossOutput(per)
    if loss_agg == "token_mean":
        return LossOutput(per.mean())
    raise ValueError(f"loss_agg of lad_loss must be 'token_mean' or 'none', got {loss_agg!r}")


def lad_theoretical_loss(
    logp: Tensor, logp_old: Tensor, adv: Tensor, *, eta: float, divergence: str | Divergence, dim: int = -1
) -> LossOutput:
    """LAD eq. (7) on an enumerable action space: ``D_f(P_pi || P_A) = sum_y P_A f(P_pi / P_A)``.

    ``P_pi = (pi/pi_old) / Z_pi`` and ``P_A = e^{A/eta} / Z_A`` are normalized over ``dim``.

    Args:
        logp, logp_old, adv: ``[..., K]`` over all K actions along ``dim``.
    Returns:
        :class:`~tiltlab.objectives.output.LossOutput` whose loss is the divergence per row, ``[...]``; no metrics.
    """
    if eta <= 0:
        raise ValueError("eta must be > 0")
    same_shape("logp", logp, "logp_old", logp_old)
    same_shape("logp", logp, "adv", adv)
    div = get_divergence(divergence)
    log_p_pi = torch.log_softmax(logp - logp_old.detach(), dim=dim)
    log_p_a = torch.log_softmax(adv.detach() / eta, dim=dim)
    return LossOutput((torch.exp(log_p_a) * div.f(torch.exp(log_p_pi - log_p_a))).sum(dim=dim))


def lad_target_logprobs(logp_old: Tensor, adv: Tensor, *, eta: float, dim: int = -1) -> Tensor:
    """The LAD optimum (Lemma 3.1): ``log softmax(log pi_old + A/eta)`` over ``dim``."""
    if eta <= 0:
        raise ValueError("eta must be > 0")
    broadcastable("logp_old", logp_old, "adv", adv)
    return torch.log_softmax(logp_old + adv / eta, dim=dim)
