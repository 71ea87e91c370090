"""``objectives.metrics.tv_distance`` (the one total variation of the simulator and the llm checks) against a
naive computation, and its three call sites against the expressions they replaced, bit for bit."""

from __future__ import annotations

import math

import numpy as np
import torch

from tiltlab.objectives.metrics import total_variation, tv_distance


def _naive_tv(log_p: list[float], log_q: list[float]) -> float:
    return 0.5 * sum(abs(math.exp(a) - math.exp(b)) for a, b in zip(log_p, log_q))


def _log_dists(*shape: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(*shape, generator=g, dtype=torch.float64) * 3
    b = torch.randn(*shape, generator=g, dtype=torch.float64) * 3
    return torch.log_softmax(a, -1), torch.log_softmax(b, -1)


def test_tv_distance_matches_a_naive_sum_over_the_last_axis():
    lp, lq = _log_dists(3, 4, 7)
    tv = tv_distance(lp, lq)
    assert tv.shape == (3, 4)
    for i in range(3):
        for j in range(4):
            want = _naive_tv(lp[i, j].tolist(), lq[i, j].tolist())
            assert math.isclose(float(tv[i, j]), want, rel_tol=1e-12, abs_tol=0.0)
    assert float(tv.min()) > 0.05 and float(tv.max()) < 1.0  # random pairs: neither equal nor disjoint


def test_tv_distance_is_zero_on_equal_and_one_on_disjoint_distributions():
    lp, _ = _log_dists(5, seed=1)
    assert float(tv_distance(lp, lp)) == 0.0
    inf = float("inf")
    p = torch.tensor([0.0, -inf, -inf, -inf])  # all mass on answer 0
    q = torch.tensor([-inf, math.log(0.5), math.log(0.5), -inf])
    assert float(tv_distance(p, q)) == 1.0
    assert float(tv_distance(p, q)) == float(tv_distance(q, p))  # symmetric


def test_the_three_call_sites_give_the_numbers_of_the_expressions_they_replaced():
    """sim/train.py and llm/experiments/task.py had ``0.5 * (p.exp() - q.exp()).abs().sum(-1)`` on log-probs,
    sim/checks/mechanisms.py ``(0.5 * np.abs(softmax(a) - softmax(b)).sum(-1)).mean()`` on logits."""
    from tiltlab.sim.checks import mechanisms
    from tiltlab.sim.train import tv_distance as sim_tv

    assert sim_tv is tv_distance  # sim/train.py (and the sim modules importing it) use this one
    for dtype in (torch.float32, torch.float64):
        lp, lq = (x.to(dtype) for x in _log_dists(6, 16, seed=2))
        old = 0.5 * (lp.exp() - lq.exp()).abs().sum(-1)
        assert torch.equal(tv_distance(lp, lq), old)
    rng = np.random.default_rng(3)
    for _ in range(20):
        a, b = rng.normal(size=(4, 9)) * 4, rng.normal(size=(4, 9)) * 4
        old = float((0.5 * np.abs(mechanisms._softmax(a) - mechanisms._softmax(b)).sum(-1)).mean())
        assert mechanisms._tv(a, b) == old
        assert np.array_equal(
            total_variation(mechanisms._softmax(a), mechanisms._softmax(b)),
            0.5 * np.abs(mechanisms._softmax(a) - mechanisms._softmax(b)).sum(-1),
        )
