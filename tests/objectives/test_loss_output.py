"""``LossOutput``: the one return type of every ``*_loss`` of ``tiltlab.objectives``."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest
import torch

import tiltlab.objectives as O
from tests.objectives.opinfo import OPS, loss_of
from tiltlab.objectives.output import LossOutput


def _public_losses() -> dict[str, object]:
    out = {}
    for m in pkgutil.iter_modules(O.__path__):
        if m.name.startswith("_"):
            continue
        mod = importlib.import_module(f"tiltlab.objectives.{m.name}")
        for name in getattr(mod, "__all__", ()):
            fn = getattr(mod, name)
            if name.endswith("_loss") and inspect.isfunction(fn):
                out[f"{m.name}.{name}"] = fn
    return out


def test_loss_output_holds_a_tensor_and_read_only_metrics():
    x = torch.tensor(2.0, requires_grad=True)
    m = {"a": torch.tensor(1.0), "b": 0.5}
    out = LossOutput(3 * x, m)
    out.loss.backward()
    assert float(x.grad) == 3.0
    assert dict(out.metrics) == m
    m["c"] = 1.0  # the output copied the mapping
    assert "c" not in out.metrics
    with pytest.raises(TypeError):
        out.metrics["d"] = 1.0  # type: ignore[index]
    with pytest.raises(AttributeError):
        out.loss = x  # type: ignore[misc]  # frozen
    assert dict(LossOutput(x).metrics) == {}


def test_loss_output_refuses_what_is_not_a_loss():
    with pytest.raises(TypeError, match="torch.Tensor"):
        LossOutput(1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="keys"):
        LossOutput(torch.zeros(()), {1: torch.zeros(())})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="metrics"):
        LossOutput(torch.zeros(()), {"a": "x"})  # type: ignore[dict-item]


def test_loss_output_does_not_unpack_as_a_tuple():
    """One convention: code written for the old ``(loss, metrics)`` tuples fails loudly."""
    with pytest.raises(TypeError):
        _loss, _metrics = LossOutput(torch.zeros(()))


def test_every_public_loss_returns_a_loss_output():
    """Each public ``*_loss`` of every objectives module, called on its OpInfo sample, returns a
    LossOutput whose loss is the tensor the OpInfo checks (a loss returning a bare tensor or a tuple fails)."""
    losses = _public_losses()
    seen = set()
    for op in OPS:
        base = op.name.split("[")[0]
        if base not in losses or base.endswith(".clip_frac"):
            continue
        seen.add(base)
        out = losses[base](**op.sample(), **op.kwargs)
        assert isinstance(out, LossOutput), f"{base} returned {type(out).__name__}"
        assert isinstance(out.loss, torch.Tensor)
        torch.testing.assert_close(out.loss, op(op.sample()))
    assert seen == set(losses), f"public losses without an OpInfo sample: {sorted(set(losses) - seen)}"


def test_loss_of_refuses_another_return_type():
    """The OpInfo wrapper every generic check goes through fails on a loss that broke the convention."""
    with pytest.raises(TypeError, match="not LossOutput"):
        loss_of(lambda **kw: torch.zeros(()))()
    with pytest.raises(TypeError, match="not LossOutput"):
        loss_of(lambda **kw: (torch.zeros(()), {}))()


def test_metrics_of_the_policy_losses_are_kept():
    op = next(o for o in OPS if o.name == "pg.grpo_loss.clip_frac")
    out = O.pg.grpo_loss(**op.sample(), **op.kwargs)
    assert {"clip_frac", "kl"} <= set(out.metrics)
    assert 0.0 < float(out.metrics["clip_frac"]) < 1.0
