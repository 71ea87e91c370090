"""Cheap input validation shared by the objectives (shapes, finiteness)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, TypeVar, cast

import torch
from torch import Tensor

F = TypeVar("F", bound=Callable[..., Any])


def renamed(**old_to_new: str) -> Callable[[F], F]:
    """Refuse the old keyword names of a function's options: ``@renamed(weight="is_weight")`` makes
    ``f(..., weight=w)`` a one-line TypeError naming the new keyword. A value after the new name in
    parentheses (``"loss_agg ('mean' is 'token_mean')"``) is printed as given."""

    def wrap(f: F) -> F:
        @functools.wraps(f)
        def checked(*args: Any, **kwargs: Any) -> Any:
            for old, new in old_to_new.items():
                if old in kwargs:
                    head, _, note = new.partition(" ")
                    raise TypeError(f"{f.__name__}: {old!r} is now {head!r}" + (f" {note}" if note else ""))
            return f(*args, **kwargs)

        return cast(F, checked)  # the same signature as f

    return wrap


def as_tensor(x: Any, like: Tensor | None = None) -> Tensor:
    """Tensor view of ``x`` (float scalars become 0-d tensors on ``like``'s device/dtype)."""
    if isinstance(x, Tensor):
        return x
    if like is not None:
        return torch.as_tensor(
            x, dtype=like.dtype if like.is_floating_point() else torch.get_default_dtype(), device=like.device
        )
    if isinstance(x, (float, int)):  # Python scalars carry float64 precision; keep it
        return torch.tensor(float(x), dtype=torch.float64)
    t = torch.as_tensor(x)
    return t if t.is_floating_point() else t.to(torch.get_default_dtype())


def same_shape(name_a: str, a: Tensor, name_b: str, b: Tensor) -> None:
    if a.shape != b.shape:
        raise ValueError(
            f"{name_a} has shape {tuple(a.shape)} but {name_b} has shape {tuple(b.shape)}; they must match"
        )


def broadcastable(name_a: str, a: Tensor, name_b: str, b: Tensor) -> None:
    if a.shape == b.shape:
        return
    try:
        torch.broadcast_shapes(a.shape, b.shape)  # type: ignore[no-untyped-call]  # untyped in torch
    except RuntimeError:
        raise ValueError(f"{name_a} {tuple(a.shape)} does not broadcast against {name_b} {tuple(b.shape)}") from None


def fits(name_a: str, a: Tensor, name_b: str, b: Tensor) -> None:
    """``b`` is a scalar or has ``a``'s rank and broadcasts to ``a``'s shape without enlarging it.

    Stricter than :func:`broadcastable`: ``[8, 8]`` against ``[8]`` (either way round) is refused
    instead of silently producing an ``[8, 8]`` result or aligning ``[8]`` with the wrong axis."""
    if b.dim() == 0 or b.shape == a.shape:
        return
    try:
        out = torch.broadcast_shapes(a.shape, b.shape)  # type: ignore[no-untyped-call]  # untyped in torch
    except RuntimeError:
        out = None
    if b.dim() != a.dim() or out != a.shape:
        raise ValueError(
            f"{name_b} {tuple(b.shape)} must be a scalar or broadcast to {name_a}'s shape {tuple(a.shape)}"
        )


def no_nan_at(mask: Tensor | None, **named: Tensor | float | None) -> None:
    """ValueError naming the first input that holds a NaN at a real position: where ``mask > 0``
    for an input of the mask's shape, everywhere for the others (``None`` inputs are skipped).

    A NaN in a padded slot is ignored (:func:`zero_padding` removes it). The check needs one
    host-device synchronization for all the inputs together (a single ``bool`` of the stacked
    flags); it is the price of refusing NaN input with a clear error instead of returning NaN."""
    names: list[str] = []
    flags: list[Tensor] = []
    for name, x in named.items():
        if x is None:
            continue
        if not isinstance(x, Tensor):
            if math.isnan(float(x)):
                raise ValueError(f"{name} is NaN")
            continue
        if not x.is_floating_point() or x.numel() == 0:
            continue
        nan = torch.isnan(x)
        if mask is not None and x.shape == mask.shape:
            nan = nan & (mask > 0)
        names.append(name)
        flags.append(nan.any())
    if flags and bool(torch.stack(flags).any()):
        for name, flag in zip(names, flags):
            if bool(flag):
                where = " at an unmasked position" if mask is not None else ""
                raise ValueError(f"{name} contains NaN{where}")


def ndim(name: str, x: Tensor, n: int, what: str) -> None:
    if x.dim() != n:
        raise ValueError(f"{name} must be {what} (rank {n}); got shape {tuple(x.shape)}")


def nonempty(name: str, x: Tensor, dim: int) -> None:
    if x.dim() == 0 or x.shape[dim] == 0:
        raise ValueError(f"{name} is empty along dim {dim} (shape {tuple(x.shape)}); need at least one sample")


def no_nan(name: str, x: Tensor) -> None:
    if torch.isnan(x).any():
        raise ValueError(f"{name} contains NaN")


def no_pos_inf(name: str, x: Tensor) -> None:
    if torch.isposinf(x).any():
        raise ValueError(f"{name} contains +inf")


def positive(name: str, x: Tensor | float) -> None:
    v = torch.as_tensor(x)
    if not bool((v > 0).all()):
        raise ValueError(f"{name} must be > 0; got {x}")


def zero_padding(x: Tensor, mask: Tensor) -> Tensor:
    """``x`` with its padded positions (``mask == 0``) replaced by 0 before any arithmetic.

    Multiplying by the mask is not enough: ``NaN * 0`` and ``inf * 0`` are NaN, and a NaN in a
    padded slot would reach the loss and (through ``0 * NaN`` in backward) the gradient. The
    padded positions get an exactly zero gradient.
    """
    return torch.where(mask > 0, x, torch.zeros_like(x))
