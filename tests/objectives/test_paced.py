"""tiltlab.objectives.paced: Prop. 4.1 numerics, selection, replay."""

import math

import pytest
import torch

from tiltlab.objectives import paced, tb


def test_prop41_optimal_log_z_gives_accuracy_exactly_by_enumeration():
    # pi_old, pi_theta over K outcomes, rewards in {a, b}; log Z* = argmin_logZ E_{pi_old}[delta^2]
    # with delta = logZ + log pi_theta - log pi_old - r / kl_coef (PACED eq. 6).
    g = torch.Generator().manual_seed(0)
    K, kl_coef, a, b = 6, 0.05, -1.0, 1.0
    p_old = torch.softmax(torch.randn(K, generator=g, dtype=torch.float64), 0)
    p_th = torch.softmax(torch.randn(K, generator=g, dtype=torch.float64), 0)
    correct = torch.tensor([1, 0, 0, 1, 1, 0], dtype=torch.float64)
    r = a + (b - a) * correct
    # weighted mean of -(log pi_theta - log pi_old - r / kl_coef) = the minimizer of the weighted square
    x = p_th.log() - p_old.log() - r / kl_coef
    log_z_star = -(p_old * x).sum()
    kl = float((p_old * (p_old.log() - p_th.log())).sum())
    acc = float((p_old * correct).sum())
    est = paced.accuracy_from_log_z(log_z_star, kl_coef=kl_coef, kl=kl, r_low=a, r_high=b, clip=False)
    assert est.item() == pytest.approx(acc, rel=1e-10)

    # and the optimum really is the TB minimizer (perturbations increase the weighted loss)
    def loss(lz):
        return float((p_old * tb.tb_residual(p_th.log(), p_old.log(), r, lz, beta=1 / kl_coef) ** 2).sum())

    assert loss(log_z_star + 1e-3) > loss(log_z_star) < loss(log_z_star - 1e-3)


def test_practical_estimator_clips():
    p = paced.accuracy_from_log_z(torch.tensor([-1.0, 5.0, 40.0]), kl_coef=0.05)
    torch.testing.assert_close(p, torch.tensor([0.0, 0.25, 1.0]))


def test_select_prompts_by_distance_to_tau():
    p = torch.tensor([0.1, 0.55, 0.9, 0.45, 0.5, 0.0])
    idx = paced.select_prompts(p, tau=0.5, m=3)
    assert idx.tolist() == [4, 1, 3]  # |.05| tie between 1 and 3 broken by index
    with pytest.raises(ValueError):
        paced.select_prompts(p, m=7)


def test_select_prompts_batched_is_each_row_alone():
    """``[B, N]``: row b is the selection of ``p_hat[b]`` (the simulator selects every seed's prompts in one call)."""
    g = torch.Generator().manual_seed(0)
    p = torch.rand(7, 12, generator=g, dtype=torch.float64)
    p[3, 5] = p[3, 2]  # a tie: broken by the lower index, as alone
    for tau, m in ((0.5, 3), (0.1, 1), (0.9, 12)):
        got = paced.select_prompts(p, tau=tau, m=m)
        assert got.shape == (7, m)
        assert torch.equal(got, torch.stack([paced.select_prompts(row, tau=tau, m=m) for row in p]))
    bad = p.clone()
    bad[4, 0] = float("nan")
    with pytest.raises(ValueError, match="p_hat contains NaN"):
        paced.select_prompts(bad, m=2)
    with pytest.raises(ValueError, match="p_hat must be"):
        paced.select_prompts(p[None], m=2)
    with pytest.raises(ValueError, match="m must be in"):
        paced.select_prompts(p, m=13)


def test_replay_priority_and_buffer():
    pr = paced.replay_priority(torch.tensor([3.0, 0.0, 8.0]), 8, torch.tensor([0.5, 0.5, 0.2]))
    torch.testing.assert_close(pr, torch.tensor([0.125, 0.5, 0.8]))
    buf = paced.ReplayBuffer(capacity=3, n_add=2)
    added = buf.add(["a", "b", "c", "d"], torch.tensor([0.1, 0.9, 0.5, 0.7]), torch.tensor([1, 0, 1, 1]))
    assert added == 2 and buf.contents() == ["d", "c"]  # correct only, highest priority first
    buf.add(["e", "f"], torch.tensor([0.2, 0.3]), torch.tensor([1, 1]))
    assert buf.contents() == ["c", "f", "e"]  # FIFO capacity 3: oldest ("d") left first
    assert buf.add(["x"], torch.tensor([1.0]), torch.tensor([0])) == 0


def test_paced_tilt_convention_is_r_over_kl_coef():
    # kl_coef -> TB beta = 1 / kl_coef: a DISA-convention beta of 20 equals PACED kl_coef 0.05.
    r = torch.tensor([1.0, 0.0])
    d1 = tb.tb_residual(torch.zeros(2), torch.zeros(2), r, 0.0, beta=1 / 0.05)
    d2 = tb.tb_residual(torch.zeros(2), torch.zeros(2), r, 0.0, beta=20.0)
    torch.testing.assert_close(d1, d2)
    assert math.isclose(1 / 0.05, 20.0)
