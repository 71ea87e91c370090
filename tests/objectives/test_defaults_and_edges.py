"""Defaults and edge cases of the objectives that no other test reaches (mutation survivors).

Each test pins a documented default value or an edge where two code paths would otherwise
coincide: the token mean of an all-padding row, the detached VarGrad estimate, FlowRL's default
weight cap and the float32 guard of the unclipped weight, PACED's default target tau and batch size,
an empty replay add, and R^2 of a constant target."""

from __future__ import annotations

import math

import pytest
import torch

from tiltlab.objectives import paced, tb
from tiltlab.objectives.regressor import r2_score


def test_token_mean_of_an_all_padding_row_is_zero_not_nan():
    logp = torch.tensor([[-1.0, -2.0], [-3.0, -4.0]])
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    got = tb.sequence_logprob(logp, mask, normalize="mean")
    assert got.tolist() == [-1.5, 0.0]  # the empty row divides by max(0, 1) = 1


def test_vargrad_estimate_is_detached_only_when_asked():
    logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0, -1.0]])
    r = torch.tensor([[1.0, 0.0, 1.0]])
    est = tb.vargrad_log_z(logp, ref, r, beta=2.0, detach=True)
    assert not est.requires_grad and est.grad_fn is None
    live = tb.vargrad_log_z(logp, ref, r, beta=2.0, detach=False)
    (g,) = torch.autograd.grad(live.sum(), logp)
    assert torch.allclose(g, torch.full_like(g, -1.0 / 3))  # d/dlogp of mean(beta r - logp + logp_ref)
    assert est.item() == live.item() == pytest.approx((2 * 2.0 - (-3.5) + (-3.5)) / 3, rel=1e-6)  # float32


def test_importance_weight_default_cap_is_flowrl_s_ten():
    mask = torch.ones(3, 1)
    lp = torch.tensor([[math.log(5.0)], [math.log(30.0)], [0.0]])
    w = tb.tb_importance_weight(lp, torch.zeros(3, 1), mask)  # clip="max", max_weight default
    assert torch.allclose(w, torch.tensor([5.0, 10.0, 1.0]))


def test_unclipped_weight_caps_the_log_ratio_at_80_so_float32_stays_finite():
    mask = torch.ones(2, 1)
    lp = torch.tensor([[200.0], [79.0]], dtype=torch.float32)
    w = tb.tb_importance_weight(lp, torch.zeros(2, 1), mask, weight_clip="ratio")
    assert torch.isfinite(w).all()  # exp(160) would overflow float32 (max ~3.4e38); exp(80) ~ 5.5e34 does not
    assert w[0].item() == torch.exp(torch.tensor(80.0)).item() and w[1].item() == torch.exp(torch.tensor(79.0)).item()


def test_select_prompts_defaults_are_tau_one_half_and_one_prompt():
    p_hat = torch.tensor([0.9, 0.45, 0.1, 0.7])
    assert paced.select_prompts(p_hat).tolist() == [1]  # |0.45 - 0.5| is the smallest
    assert paced.select_prompts(p_hat, m=2).tolist() == [1, 3]


def test_replay_add_with_no_correct_sample_adds_nothing():
    buf = paced.ReplayBuffer(capacity=4, n_add=2)
    assert buf.add(["a", "b"], torch.tensor([0.3, 0.9]), torch.tensor([0, 0])) == 0
    assert len(buf) == 0
    assert buf.add(["x"], torch.tensor([0.1]), torch.tensor([1])) == 1  # a single correct sample is added
    assert buf.add(["a", "b", "c"], torch.tensor([0.3, 0.9, 0.5]), torch.tensor([1, 0, 1])) == 2
    assert list(buf) == ["x", "c", "a"]  # by descending priority, oldest first


def test_r2_of_a_constant_target_is_nan():
    assert math.isnan(r2_score(torch.tensor([1.0, 2.0]), torch.tensor([3.0, 3.0])))
    assert r2_score(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0])) == 1.0


def test_ties_are_broken_by_lower_index_in_large_batches():
    """Documented tie-break (lower index first). torch's unstable CPU sort already reorders ties at a
    few dozen elements, so the pin needs a batch of that size."""
    p_hat = torch.tensor([0.5] * 20 + [0.1] * 20 + [0.5] * 20, dtype=torch.float64)
    assert paced.select_prompts(p_hat, tau=0.5, m=30).tolist() == list(range(20)) + list(range(40, 50))
    pri = torch.tensor([0.5] * 20 + [0.1] * 20 + [0.5] * 20)
    assert paced.top_priority(pri, k=30).tolist() == list(range(20)) + list(range(40, 50))
