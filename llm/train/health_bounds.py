"""The bounds of :class:`~tiltlab.llm.train.health.HealthMonitor`'s warnings (:class:`HealthBounds`) and
their values from a trainer config (:func:`bounds_of`). Import-light (standard library only): the run-config
pre-check (:mod:`tiltlab.llm.train.precheck`) checks a config's ``health_*`` fields with them before TRL loads;
:mod:`tiltlab.llm.train.health` re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class HealthBounds:
    """The warning bounds (``TiltGRPOConfig.health_*``); see the module docstring."""

    patience: int = 3
    residual_factor: float = 3.0
    grad_norm_factor: float = 10.0
    flip_frac: float = 0.5
    kl_bound: float | None = None

    def __post_init__(self) -> None:
        if self.patience < 1:
            raise ValueError(f"health_patience must be >= 1, got {self.patience}")
        for name in ("residual_factor", "grad_norm_factor"):
            if not getattr(self, name) > 1.0:
                raise ValueError(f"health_{name} must be > 1, got {getattr(self, name)}")
        if self.kl_bound is not None and not self.kl_bound > 0.0:
            raise ValueError(f"health_kl_bound must be > 0, got {self.kl_bound}")
        if not 0.0 < self.flip_frac < 1.0:
            raise ValueError(f"health_flip_frac must lie in (0, 1), got {self.flip_frac}")


KL_BOUNDED = ("disa", "flowrl", "vargrad")
"""The objectives whose target is ``pi_ref e^{tilt_beta r~} / Z`` (the KL bound's default applies to them)."""


def default_kl_bound(args: Any) -> float | None:
    """``tilt_beta x reward_scale`` for :data:`KL_BOUNDED` objectives with an affine reward transform (rewards in
    [0, 1]), else None (no KL warning): the module docstring says why."""
    if args.objective in KL_BOUNDED and getattr(args, "reward_transform", None) == "affine":
        return float(args.tilt_beta) * float(args.reward_scale)
    return None


def bounds_of(args: Any) -> HealthBounds:
    """:class:`HealthBounds` from a trainer config's ``health_*`` fields (``health_kl_bound`` None:
    :func:`default_kl_bound`)."""
    kl = getattr(args, "health_kl_bound", None)
    return HealthBounds(
        patience=int(args.health_patience),
        residual_factor=float(args.health_residual_factor),
        grad_norm_factor=float(args.health_grad_norm_factor),
        flip_frac=float(args.health_flip_frac),
        kl_bound=float(kl) if kl is not None else default_kl_bound(args),
    )
