"""Environments and proposals: exact expectations against Monte Carlo, identities, errors."""

from __future__ import annotations

import math

import pytest
import torch

from tiltlab.objectives.estimators import log_z_from_pass_rate
from tiltlab.sim import envs, proposals

K_SIGMA = (
    5.0  # Monte-Carlo tolerance k*sigma/sqrt(n) with k = 5: a fixed-seed false alarm has probability < 1e-6 per test
)


def test_gather_matches_loop():
    g = torch.Generator().manual_seed(0)
    vals = torch.randn(2, 3, 5, generator=g, dtype=torch.float64)
    idx = torch.randint(5, (2, 3, 4), generator=g)
    out = envs.gather(vals, idx)
    for s in range(2):
        for p in range(3):
            for j in range(4):
                assert out[s, p, j] == vals[s, p, idx[s, p, j]]
    # broadcast of a [P, K] table over seeds
    assert torch.equal(envs.gather(vals[0], idx), torch.stack([envs.gather(vals[0], idx[s]) for s in range(2)]))


def test_multiprompt_pass_rates_and_log_z_identity():
    env = envs.make_multiprompt(P=32, K=16, seed=3, p_min=0.01, p_max=0.9)
    p = env.pass_rate()
    # the env is built to hit its target pass rates exactly (float64 round-off)
    assert torch.allclose(p, torch.tensor(env.info["p_ref_target"], dtype=torch.float64), atol=1e-12)
    assert abs(float(p.min()) - 0.01) < 1e-12 and abs(float(p.max()) - 0.9) < 1e-12
    for beta in (0.5, 2.0, 5.0):
        # binary rewards: Z = 1 + p (e^beta - 1), an exact identity (float64)
        assert torch.allclose(env.log_z(beta), log_z_from_pass_rate(p, beta=beta), atol=1e-12)
        tgt = env.target_logp(beta)
        assert torch.allclose(tgt.exp().sum(-1), torch.ones(env.P, dtype=torch.float64), atol=1e-12)
        assert torch.allclose(tgt, env.logp_ref + beta * env.reward - env.log_z(beta)[:, None], atol=1e-12)
    assert env.features.shape == (32, 8)


def test_exact_expectation_equals_monte_carlo():
    env = envs.make_multiprompt(P=6, K=10, seed=1)
    n, beta = 20000, 2.0
    idx = env.sample(env.logp_ref, n, torch.Generator().manual_seed(0))  # [P, n]
    r = env.rewards_of(idx)
    p = env.pass_rate()
    sd = torch.sqrt(p * (1 - p))
    assert ((r.mean(-1) - p).abs() <= K_SIGMA * sd / math.sqrt(n)).all()
    w = torch.exp(beta * r)  # Z = E_ref[e^{beta r}]
    z = env.log_z(beta).exp()
    sd_w = torch.sqrt((p * math.exp(2 * beta) + (1 - p)) - z**2)
    assert ((w.mean(-1) - z).abs() <= K_SIGMA * sd_w / math.sqrt(n)).all()


def test_lad_bandit_advantage_distribution_is_three_mode_mixture():
    env = envs.make_lad_bandit(50, eta=1.0)
    p_a = torch.softmax(env.reward[0], -1)
    assert torch.allclose(p_a, torch.tensor(env.info["P_A"], dtype=torch.float64), atol=1e-12)
    peaks = [k for k in range(1, 49) if p_a[k] > p_a[k - 1] and p_a[k] >= p_a[k + 1]]
    assert len(peaks) == 3
    assert abs(float(env.reward.mean())) < 1e-12  # advantages are centred under the uniform pi_old
    assert torch.allclose(env.logp_ref.exp(), torch.full((1, 50), 1 / 50, dtype=torch.float64))


def test_proposals_support_and_limits():
    g = torch.Generator().manual_seed(0)
    lp = torch.log_softmax(torch.randn(4, 12, generator=g, dtype=torch.float64), -1)
    tgt = torch.log_softmax(torch.randn(4, 12, generator=g, dtype=torch.float64), -1)
    assert torch.allclose(proposals.tilted_proposal(lp, tgt, 0.0), lp, atol=1e-12)
    assert torch.allclose(proposals.tilted_proposal(lp, tgt, 1.0), tgt, atol=1e-12)
    half = proposals.tilted_proposal(lp, tgt, 0.5)
    assert torch.allclose(half, torch.log_softmax(0.5 * lp + 0.5 * tgt, -1), atol=1e-12)
    tk = proposals.top_k_proposal(lp, 3)
    assert (torch.isfinite(tk).sum(-1) == 3).all()
    kept = torch.topk(lp, 3, -1).indices
    assert torch.isfinite(tk.gather(-1, kept)).all()
    for top_p in (0.3, 0.7, 0.95):
        tp = proposals.top_p_proposal(lp, top_p)
        keep = torch.isfinite(tp)
        mass = (lp.exp() * keep).sum(-1)
        assert (mass >= top_p - 1e-12).all()
        # minimal: dropping the smallest kept outcome falls below top_p
        smallest = torch.where(keep, lp.exp(), torch.full_like(lp, 2.0)).min(-1).values
        assert (mass - smallest < top_p).all()
        assert torch.allclose(proposals.support_mass(tp, lp), mass, atol=1e-12)
    assert torch.allclose(proposals.top_p_proposal(lp, 1.0), lp, atol=1e-12)
    assert torch.allclose(proposals.temperature_proposal(lp, 1.0), lp, atol=1e-12)


def test_sampler_frequencies_match_probabilities():
    lp = torch.log_softmax(torch.tensor([[0.0, 1.0, -1.0, 2.0, -3.0]], dtype=torch.float64), -1)
    q = proposals.top_k_proposal(lp, 3)
    n = 40000
    idx = proposals.sample(q, n, torch.Generator().manual_seed(1))
    freq = torch.bincount(idx.flatten(), minlength=5).to(torch.float64) / n
    p = q.exp()[0]
    assert ((freq - p).abs() <= K_SIGMA * torch.sqrt(p * (1 - p) / n) + 1e-15).all()
    assert freq[~torch.isfinite(q[0])].sum() == 0  # never samples outside the support


@pytest.mark.parametrize(
    "call",
    [
        lambda lp: proposals.tilted_proposal(lp, lp, 1.5),
        lambda lp: proposals.top_k_proposal(lp, 0),
        lambda lp: proposals.top_p_proposal(lp, 0.0),
        lambda lp: proposals.temperature_proposal(lp, 0.0),
        lambda lp: proposals.sample(lp, 0),
        lambda lp: envs.make_multiprompt(P=4, p_min=0.5, p_max=0.1),
        lambda lp: envs.BanditEnv(lp, lp[:, :2], torch.zeros(1, 1)),
    ],
)
def test_bad_inputs_raise(call):
    lp = torch.log_softmax(torch.zeros(1, 4, dtype=torch.float64), -1)
    with pytest.raises(ValueError):
        call(lp)
