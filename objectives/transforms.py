"""The fixed reward transform of the TB objectives: ``r~ = a r + c`` with ``a > 0``.

DISA §3.1 tilts the reference by ``exp(beta r~)``; Stage 1 records ``(a, c)`` with the labels and
Stage 3 must apply the same map (a positive scale keeps the order of rewards; the shift ``c``
moves ``log Z`` by ``beta c`` and cancels in the residual only when both stages use it).
"""

from __future__ import annotations

from torch import Tensor

__all__ = ["affine_reward"]


def affine_reward(reward: Tensor, scale: float = 1.0, shift: float = 0.0) -> Tensor:
    """``scale * reward + shift`` elementwise (any shape); ``scale`` must be > 0."""
    if not scale > 0:
        raise ValueError(f"scale (a in r~ = a r + c) must be > 0, got {scale}")
    return scale * reward + shift
