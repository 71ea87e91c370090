"""The one return type of every loss in :mod:`tiltlab.objectives`.

Every public ``*_loss`` function returns a :class:`LossOutput`: the differentiable loss tensor and
a read-only mapping of detached diagnostics (empty when the loss has none). A caller writes
``out = grpo_loss(...); out.loss.backward(); log(out.metrics)`` whatever the objective.

It deliberately does not unpack as a ``(loss, metrics)`` tuple: one spelling for every loss, and a
caller written for the older conventions (a bare tensor from some losses, a 2-tuple from others)
fails loudly (``cannot unpack`` / no ``backward``) instead of running with the wrong object.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from torch import Tensor

__all__ = ["LossOutput"]


@dataclass(frozen=True)
class LossOutput:
    """What a loss returns.

    Attributes:
        loss: the loss tensor (a scalar, or per-sample values where the function's ``loss_agg``
            asks for them); it carries the gradient.
        metrics: name -> detached diagnostic (a 0-d tensor or a float), read-only.
    """

    loss: Tensor
    metrics: Mapping[str, Tensor | float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.loss, Tensor):
            raise TypeError(f"LossOutput.loss must be a torch.Tensor, got {type(self.loss).__name__}")
        for k, v in self.metrics.items():
            if not isinstance(k, str):
                raise TypeError(f"LossOutput.metrics keys must be str, got {k!r}")
            if not isinstance(v, (Tensor, float, int)):
                raise TypeError(f"LossOutput.metrics[{k!r}] must be a tensor or a number, got {type(v).__name__}")
        object.__setattr__(self, "metrics", MappingProxyType(dict(self.metrics)))
