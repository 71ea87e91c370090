"""The generic checks run on every :class:`tests.objectives.opinfo.OpInfo` entry.

Each ``check_*`` raises ``AssertionError`` (or ``pytest.fail``) on a violation, so the same
function serves ``test_generic.py`` (every entry must pass) and
``test_generic_kills_mutants.py`` (a deliberately wrong variant must fail).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import pytest
import torch
from torch import Tensor
from torch.autograd.gradcheck import GradcheckError

from tests.objectives.opinfo import OpInfo

F64 = torch.float64
# float64 value/gradient vs. the loop reference: both are exact formulas evaluated in float64 on
# O(10) terms of magnitude <= ~30, so they agree to ~1e-14 relative; 1e-10 leaves room for
# summation-order differences and is still 1e5 times below any wrong-formula discrepancy.
RTOL, ATOL = 1e-10, 1e-12


def _is_float(t: Tensor) -> bool:
    return t.is_floating_point()


def _clone(inputs: Mapping[str, Tensor], grad: tuple[str, ...] = ()) -> dict[str, Tensor]:
    out = {}
    for k, v in inputs.items():
        c = v.detach().clone()
        out[k] = c.requires_grad_(True) if k in grad else c
    return out


def _cotangent(out: Tensor) -> Tensor:
    """A fixed, non-uniform cotangent, so per-element outputs are not merely summed."""
    return torch.linspace(0.5, 1.5, out.numel(), dtype=out.dtype).reshape(out.shape)


def _scalar(out: Tensor) -> Tensor:
    return out if out.dim() == 0 else (out * _cotangent(out)).sum()


def _grads(f, inputs: dict[str, Tensor], names: tuple[str, ...]) -> list[Tensor]:
    out = _scalar(f(inputs))
    gs = torch.autograd.grad(out, [inputs[n] for n in names], allow_unused=True)
    return [torch.zeros_like(inputs[n]) if g is None else g for n, g in zip(names, gs)]


def _close(a: Tensor, b: Tensor, what: str, rtol: float = RTOL, atol: float = ATOL) -> None:
    torch.testing.assert_close(
        a.detach().to(F64), b.detach().to(F64), rtol=rtol, atol=atol, equal_nan=False, msg=lambda m: f"{what}: {m}"
    )


# ------------------------------------------------------------------------------------ checks
def check_value(op: OpInfo, seed: int = 0) -> None:
    """The fast function equals the independent loop reference (float64)."""
    x = op.sample(seed)
    _close(op(x), op.reference(x), f"{op.name} value vs reference")


def check_grad(op: OpInfo, seed: int = 0) -> None:
    """The gradient w.r.t. every trainable input equals the reference's autograd gradient."""
    if not op.grad:
        pytest.skip("no trainable input")
    x = op.sample(seed)
    got = _grads(op, _clone(x, op.grad), op.grad)
    want = _grads(op.reference, _clone(x, op.grad), op.grad)
    for n, a, b in zip(op.grad, got, want):
        _close(a, b, f"{op.name} d/d{n} vs reference")
        assert float(b.abs().max()) > 0, f"{op.name}: reference gradient w.r.t. {n} is zero; the sample tests nothing"


def check_gradcheck(op: OpInfo, seed: int = 0) -> None:
    """float64 ``torch.autograd.gradcheck`` (finite differences) on the trainable inputs."""
    if not op.grad:
        pytest.skip("no trainable input")
    if not op.gradcheck:
        pytest.skip("a stop-gradient surrogate: its gradient is not the derivative of its value")
    x = op.sample(seed)

    def f(*ts: Tensor) -> Tensor:
        return op({**x, **dict(zip(op.grad, ts))})

    leaves = tuple(x[n].detach().clone().requires_grad_(True) for n in op.grad)
    try:
        torch.autograd.gradcheck(f, leaves, eps=1e-6, atol=1e-6, rtol=1e-5)
    except GradcheckError as e:
        raise AssertionError(f"{op.name}: gradcheck failed: {str(e).splitlines()[0]}") from None


def check_detach(op: OpInfo, seed: int = 0) -> None:
    """Frozen inputs (reference/old log-probs, frozen log Z, z0, advantages, rewards, weights)
    get no gradient, while the trainable ones do."""
    x = op.sample(seed)
    xs = _clone(x, op.frozen + op.grad)
    out = op(xs)
    if out.requires_grad:
        _scalar(out).backward()
    for n in op.frozen:
        g = xs[n].grad
        assert g is None or not bool(g.any()), f"{op.name}: gradient leaked into frozen input {n!r}"
    for n in op.grad:
        g = xs[n].grad
        assert g is not None and bool(g.any()), f"{op.name}: no gradient reached trainable input {n!r}"


_GARBAGE = (math.nan, math.inf, -math.inf, 1e30, -3.0)


def _garbage_like(t: Tensor) -> Tensor:
    vals = torch.tensor(_GARBAGE, dtype=t.dtype)
    return vals[torch.arange(t.numel()) % len(_GARBAGE)].reshape(t.shape)


def pad_with_garbage(op: OpInfo, x: Mapping[str, Tensor], extra: int = 3) -> dict[str, Tensor]:
    """``extra`` padded columns on every token input (mask 0), and every padded slot (old and new)
    filled with NaN / +-inf / huge values."""
    assert op.mask is not None
    mask = x[op.mask]
    b = mask.shape[0]
    wide_mask = torch.cat([mask, torch.zeros(b, extra, dtype=mask.dtype)], dim=1)
    out = dict(x)
    out[op.mask] = wide_mask
    for n in op.tokens:
        if n not in x:
            continue
        t = x[n]
        wide = torch.cat([t, torch.zeros(b, extra, dtype=t.dtype)], dim=1)
        out[n] = torch.where(wide_mask > 0, wide, _garbage_like(wide))
    return out


def check_padding(op: OpInfo, seed: int = 0) -> None:
    """Extra padded columns holding garbage (NaN, inf) change neither the value nor the gradient
    at real positions, and padded positions get exactly zero gradient."""
    if op.mask is None:
        pytest.skip("not token-level")
    x = op.sample(seed)
    xp = pad_with_garbage(op, x)
    a, b = _clone(x, op.grad), _clone(xp, op.grad)
    va, vb = op(a), op(b)
    _close(vb, va, f"{op.name} value with garbage padding")
    if not op.grad:
        return
    ga, gb = _grads(op, a, op.grad), _grads(op, b, op.grad)
    t = x[op.mask].shape[1]
    wide_mask = xp[op.mask]
    for n, g0, g1 in zip(op.grad, ga, gb):
        if n in op.tokens:
            _close(g1[:, :t], g0, f"{op.name} d/d{n} with garbage padding")
            pad = g1[wide_mask == 0]
            assert bool((pad == 0).all()), f"{op.name}: padded positions of {n!r} get gradient {pad.tolist()}"
        else:
            _close(g1, g0, f"{op.name} d/d{n} with garbage padding")


def _split_inputs(op: OpInfo, x: Mapping[str, Tensor], k: int) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    assert op.split is not None
    first, second = dict(x), dict(x)
    for n, rows in op.split.rows.items():
        if n in x:
            first[n], second[n] = x[n][: k * rows], x[n][k * rows :]
    return first, second


def check_split(op: OpInfo, seed: int = 0) -> None:
    """Micro-batch split invariance: the loss (and gradient) of the whole batch is the weighted
    combination of the losses of two uneven micro-batches, with the entry's weighting."""
    if op.split is None:
        pytest.skip("the aggregation couples the batch")
    x = op.sample(seed)
    name, rows = next(iter(op.split.rows.items()))
    units = x[name].shape[0] // rows
    assert units >= 3, f"{op.name}: need >= 3 units to split unevenly"
    xs = _clone(x, op.grad)
    full = op(xs)
    parts = _split_inputs(op, xs, 1)
    outs = [op(p) for p in parts]
    if op.split.weighting == "concat":
        combined = torch.cat([o.reshape(-1, *o.shape[1:]) for o in outs])
    else:
        if op.split.weighting == "mean":
            ws = [p[name].shape[0] / rows / units for p in parts]
        else:
            m = x[op.mask]
            ws = [float(p[op.mask].sum() / m.sum()) for p in parts]
        combined = sum(w * o for w, o in zip(ws, outs))
    _close(combined, full, f"{op.name} split into micro-batches ({op.split.weighting})")
    if op.grad:
        g_full = torch.autograd.grad(_scalar(full), [xs[n] for n in op.grad], retain_graph=True)
        g_comb = torch.autograd.grad(_scalar(combined), [xs[n] for n in op.grad])
        for n, a, b in zip(op.grad, g_comb, g_full):
            _close(a, b, f"{op.name} d/d{n} split into micro-batches")


# Low precision. The check compares the low-precision result with float64 evaluated on the SAME
# rounded inputs, so only the arithmetic's rounding counts (not the conditioning of the inputs).
# Every intermediate is rounded to the low dtype (relative error <= eps/2 each; eps = 2^-7 for
# bf16, 2^-23 for float32). The entries chain <= ~8 such roundings on quantities bounded by
# ``scale`` = max(1, max |float64 output|, mean |input|); a cancellation in a final mean keeps
# the terms' absolute error on a smaller result, hence an absolute tolerance
# ``low_ulps * eps * scale`` with ``low_ulps = 4`` (8 roundings * eps/2). Observed: <= 1.3 eps*scale
# over all entries; a wrong formula or a float64-only code path is off by O(scale).
def check_low_precision(op: OpInfo, seed: int = 0) -> None:
    x = op.sample(seed)
    low = {k: v.to(op.low) if _is_float(v) else v for k, v in x.items()}
    rounded = {k: v.to(F64) if _is_float(v) else v for k, v in low.items()}
    want = op(rounded)
    got = op(low)
    eps = torch.finfo(op.low).eps
    mag = max([1.0, float(want.abs().max())] + [float(v.abs().mean()) for v in rounded.values() if _is_float(v)])
    _close(got, want, f"{op.name} in {op.low} vs float64", rtol=0.0, atol=op.low_ulps * eps * mag)


def check_shape_errors(op: OpInfo, seed: int = 0) -> None:
    """Cutting dim 0 of any one input raises a one-line ValueError at entry."""
    x = op.sample(seed)
    names = op.shape_inputs
    if names is None:
        names = tuple(k for k, v in x.items() if v.dim() >= 1)
        if len(names) < 2:
            pytest.skip("a single tensor input cannot mismatch")
    for n in names:
        bad = dict(x)
        bad[n] = x[n][1:]
        msg = _value_error(op, bad, f"a {tuple(bad[n].shape)} {n!r}")
        assert msg and "\n" not in msg, f"{op.name}: error for a bad {n!r} is not one line: {msg!r}"


def _value_error(op: OpInfo, inputs: Mapping[str, Tensor], what: str) -> str:
    """The message of the ValueError ``op(inputs)`` must raise (anything else is a failure)."""
    try:
        op(inputs)
    except ValueError as e:
        return str(e)
    except Exception as e:  # any other error type is the failure being reported
        raise AssertionError(f"{op.name}: {what} raised {type(e).__name__}, not ValueError: {e}") from None
    raise AssertionError(f"{op.name}: {what} was accepted")


def check_nan(op: OpInfo, seed: int = 0) -> None:
    """A NaN in a real (unpadded) position propagates to the output, or is rejected with a
    ValueError (the estimators' contract) — never silently masked."""
    x = op.sample(seed)
    n = op.nan_input or (op.grad[0] if op.grad else next(k for k, v in x.items() if _is_float(v)))
    bad = dict(x)
    t = x[n].clone()
    t.view(-1)[0] = math.nan  # row 0, column 0: a real position (every mask keeps column 0)
    bad[n] = t
    if op.nan == "raise":
        _value_error(op, bad, f"a NaN in {n!r}")
        return
    out = op(bad)
    assert bool(torch.isnan(out).any()), f"{op.name}: a NaN in real position 0 of {n!r} was silently dropped"


def check_generators_match(symbolic: Mapping[str, object], divergences: Mapping[str, object]) -> None:
    """The symbolic LAD generators (``tiltlab.theory.lad.F_DIVERGENCES``, sympy) and the torch
    ones (``tiltlab.objectives.lad.F_DIVERGENCES``) agree numerically on a grid of x in (0, 20]."""
    import numpy as np
    import sympy as sp

    assert set(symbolic) == set(divergences), f"generator names differ: {sorted(symbolic)} vs {sorted(divergences)}"
    u = sp.Symbol("u", positive=True)
    xs = np.concatenate([np.linspace(0.02, 3.0, 61), np.linspace(3.5, 20.0, 12)])
    for name, f_sym in symbolic.items():
        f_np = sp.lambdify(u, f_sym(u), modules="numpy")  # type: ignore[operator]
        want = torch.as_tensor(np.asarray(f_np(xs), dtype=np.float64))
        got = divergences[name](torch.as_tensor(xs))  # type: ignore[operator]
        _close(got, want, f"generator {name!r}: objectives vs theory")


CHECKS = {
    "value": check_value,
    "grad": check_grad,
    "gradcheck": check_gradcheck,
    "detach": check_detach,
    "padding": check_padding,
    "split": check_split,
    "low_precision": check_low_precision,
    "shape_errors": check_shape_errors,
    "nan": check_nan,
}


def applicable(op: OpInfo, check: str) -> bool:
    """Whether ``check`` applies to ``op`` (the checks also skip themselves when called directly)."""
    if check == "grad":
        return bool(op.grad)
    if check == "gradcheck":
        return bool(op.grad) and op.gradcheck
    if check == "padding":
        return op.mask is not None
    if check == "split":
        return op.split is not None
    if check == "shape_errors":
        return op.shape_inputs is not None or sum(v.dim() >= 1 for v in op.sample().values()) >= 2
    return True
