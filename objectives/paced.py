"""PACED-RL: the partition function as a difficulty scheduler (``docs/math.md`` §3).

PACED writes the TB target with ``exp(r / beta)`` where its beta is a KL coefficient; here that
coefficient is ``kl_coef`` and the TB tilt is ``r / kl_coef`` (``docs/math.md`` §0, §3). Its TB is
anchored on the rollout policy: ``objectives.tb.tb_residual(logp, logp_old, r, log_z, beta=1 / kl_coef)``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any, Generic, TypeVar

import torch
from torch import Tensor

from tiltlab.objectives._checks import as_tensor, broadcastable, no_nan_at, nonempty

__all__ = ["ReplayBuffer", "accuracy_from_log_z", "replay_priority", "select_prompts", "top_priority"]


def accuracy_from_log_z(
    log_z: Tensor | float,
    *,
    kl_coef: float,
    kl: Tensor | float = 0.0,
    r_low: float = 0.0,
    r_high: float = 1.0,
    clip: bool = True,
) -> Tensor:
    """PACED Prop. 4.1 (and its {a, b}-reward form, ``docs/math.md`` §3):

        p_old(x) = (kl_coef * (log Z*(x) - KL(pi_old || pi_theta)) - r_low) / (r_high - r_low)

    With ``kl = 0`` and ``clip=True`` this is PACED's practical estimate
    ``p_hat = clip(kl_coef * log Z_phi(x), 0, 1)`` (Sec. 4.2). For DISA's frozen ``Z`` with
    ``beta`` multiplying a binary reward use :func:`objectives.estimators.pass_rate_from_log_z`.
    """
    if kl_coef <= 0:
        raise ValueError("kl_coef must be > 0")
    if r_high <= r_low:
        raise ValueError("need r_high > r_low")
    log_z = as_tensor(log_z)
    kl_t = as_tensor(kl, log_z)
    broadcastable("log_z", log_z, "kl", kl_t)
    no_nan_at(None, log_z=log_z, kl=kl_t)
    p = (kl_coef * (log_z - kl_t) - r_low) / (r_high - r_low)
    return p.clamp(0.0, 1.0) if clip else p


def select_prompts(p_hat: Tensor, *, tau: float = 0.5, m: int = 1) -> Tensor:
    """PACED Sec. 4.2: indices of the ``m`` prompts with the smallest ``|p_hat - tau|``
    (ties broken by lower index). ``p_hat``: ``[N]``, or ``[B, N]`` for ``B`` prompt sets at once
    (row ``b`` of the result is ``select_prompts(p_hat[b], tau=tau, m=m)``). Returns ``[m]`` (``[B, m]``) int64."""
    if p_hat.dim() not in (1, 2):
        raise ValueError(f"p_hat must be [N] or [B, N], got {tuple(p_hat.shape)}")
    nonempty("p_hat", p_hat, p_hat.dim() - 1)
    no_nan_at(None, p_hat=p_hat, tau=tau)
    if not 1 <= m <= p_hat.shape[-1]:
        raise ValueError(f"m must be in [1, {p_hat.shape[-1]}], got {m}")
    dist = (p_hat.detach().double() - tau).abs()
    order = torch.argsort(dist, dim=-1, stable=True)
    return order[..., :m]


def replay_priority(n_correct: Tensor | float, n: Tensor | float, p_hat: Tensor | float) -> Tensor:
    """PACED Sec. 4.4: accuracy-estimation-error priority ``|N_correct / N - p_hat(x)|``."""
    n_correct = as_tensor(n_correct)
    n = as_tensor(n, n_correct)
    p_hat_t = as_tensor(p_hat, n_correct)
    broadcastable("n_correct", n_correct, "n", n)
    broadcastable("n_correct", n_correct, "p_hat", p_hat_t)
    no_nan_at(None, n_correct=n_correct, n=n, p_hat=p_hat_t)
    if bool((n <= 0).any()):
        raise ValueError("n must be > 0")
    return (n_correct / n - p_hat_t).abs()


def top_priority(priority: Tensor, *, k: int) -> Tensor:
    """Indices of the ``k`` largest priorities (stable), ``k`` capped at ``len(priority)``."""
    k = min(k, priority.shape[0])
    return torch.argsort(-priority.detach().double(), stable=True)[:k]


T = TypeVar("T")


class ReplayBuffer(Generic[T]):
    """PACED's replay buffer (Sec. 4.4): FIFO of capacity ``B_max`` (128) holding only correct
    samples; each step the ``B_add`` (64) correct samples of highest priority are added, and the
    whole buffer augments the next batch. Oldest entries leave first, bounding staleness."""

    def __init__(self, *, capacity: int = 128, n_add: int = 64) -> None:
        if capacity <= 0 or n_add <= 0:
            raise ValueError("capacity and n_add must be > 0")
        self.capacity, self.n_add = capacity, n_add
        self._items: deque[T] = deque(maxlen=capacity)

    def add(self, items: list[T], priority: Tensor, correct: Tensor) -> int:
        """Add up to ``n_add`` correct items by descending priority; returns how many were added."""
        if not (len(items) == priority.shape[0] == correct.shape[0]):
            raise ValueError("items, priority and correct must have the same length")
        idx = torch.nonzero(correct.bool(), as_tuple=False).flatten()
        if idx.numel() == 0:
            return 0
        chosen = idx[top_priority(priority[idx], k=self.n_add)]
        for i in chosen.tolist():
            self._items.append(items[i])
        return int(chosen.numel())

    def contents(self) -> list[T]:
        return list(self._items)

    def state_dict(self) -> dict[str, Any]:
        """The buffer's items, oldest first (for checkpoints; items must be picklable)."""
        return {"capacity": self.capacity, "n_add": self.n_add, "items": list(self._items)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the contents by ``state["items"]`` (the newest ``capacity`` of them)."""
        self._items = deque(state["items"], maxlen=self.capacity)

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterable[Any]:
        return iter(self._items)
