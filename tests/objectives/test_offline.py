"""tiltlab.objectives.offline against loop references; FPA-paper identities (SimPER = Off-RL gradient,
DPO with the bandit-normalized future policy = DPO with (1 + lambda) beta)."""

import math

import pytest
import torch

from tests.objectives._ref import lse, ref_sigmoid
from tiltlab.objectives import offline as O


def _seq(seed=0, B=5):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(B, generator=g, dtype=torch.float64) * 8).requires_grad_(True)
    lengths = torch.randint(1, 9, (B,), generator=g).to(torch.float64)
    reward = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0][:B], dtype=torch.float64)
    return logp, lengths, reward


def test_offrl_value_and_gradient_eq2():
    logp, lengths, reward = _seq()
    loss = O.offrl_loss(logp, lengths, reward).loss
    B = logp.shape[0]
    ref = -sum(reward[i].item() * math.exp(logp[i].item() / lengths[i].item()) for i in range(B)) / B
    assert loss.item() == pytest.approx(ref, rel=1e-12)
    (g,) = torch.autograd.grad(loss, logp)
    for i in range(B):
        # FPA eq. (2): (1/|y|) R pi^{1/|y|} (score wrt logp is 1), negated, averaged
        expect = -(1 / lengths[i].item()) * reward[i].item() * math.exp(logp[i].item() / lengths[i].item()) / B
        assert g[i].item() == pytest.approx(expect, rel=1e-12)


def test_offrl_forward_kl_penalty():
    logp, lengths, reward = _seq(1)
    logp = logp.detach()
    logp_ref = logp.detach() - 0.3
    a = O.offrl_loss(logp, lengths, reward, logp_ref=logp_ref, kl_tau=0.04).loss
    b = O.offrl_loss(logp, lengths, reward).loss
    assert (a - b).item() == pytest.approx(0.04 * float((logp_ref - logp.detach()).mean()), rel=1e-12)


def test_fpa_gradient_eq3_and_lambda0_equals_offrl():
    logp, lengths, reward = _seq(2)
    fut = logp.detach() + torch.linspace(-1, 1, logp.shape[0], dtype=torch.float64)
    (g,) = torch.autograd.grad(O.fpa_loss(logp, fut, lengths, reward).loss, logp)
    B = logp.shape[0]
    for i in range(B):
        expect = -(1 / lengths[i].item()) * reward[i].item() * math.exp(fut[i].item() / lengths[i].item()) / B
        assert g[i].item() == pytest.approx(expect, rel=1e-12)
    (g0,) = torch.autograd.grad(O.fpa_loss(logp, logp.detach(), lengths, reward).loss, logp)
    (g1,) = torch.autograd.grad(O.offrl_loss(logp, lengths, reward).loss, logp)
    torch.testing.assert_close(g0, g1, rtol=1e-12, atol=1e-15)


def test_future_policy_logprobs_match_loop_and_eq5():
    g = torch.Generator().manual_seed(3)
    B, T, V, lam = 2, 3, 7, 1.5
    ht = torch.randn(B, T, V, generator=g, dtype=torch.float64)
    hr = torch.randn(B, T, V, generator=g, dtype=torch.float64)
    ids = torch.randint(0, V, (B, T), generator=g)
    out = O.future_policy_logprobs(ht, hr, ids, lam=lam)
    for b in range(B):
        for t in range(T):
            z = [(1 + lam) * ht[b, t, v].item() - lam * hr[b, t, v].item() for v in range(V)]
            assert out[b, t].item() == pytest.approx(z[ids[b, t]] - lse(z), rel=1e-12)
            # eq. (5): pi_hat ∝ pi_theta^{1+lam} pi_ref^{-lam}
            lpt = [x - lse(ht[b, t].tolist()) for x in ht[b, t].tolist()]
            lpr = [x - lse(hr[b, t].tolist()) for x in hr[b, t].tolist()]
            z5 = [(1 + lam) * a - lam * c for a, c in zip(lpt, lpr)]
            assert out[b, t].item() == pytest.approx(z5[ids[b, t]] - lse(z5), rel=1e-10)


@pytest.mark.parametrize("beta,alpha", [(0.1, 1.0), (0.7, 2.5)])  # the paper's values, and away from them
def test_dpo_rpo_match_loops(beta, alpha):
    g = torch.Generator().manual_seed(4)
    lw, ll, rw, rl = (torch.randn(4, generator=g, dtype=torch.float64) * 3 for _ in range(4))
    lenw = torch.tensor([3.0, 5.0, 1.0, 8.0], dtype=torch.float64)
    d = O.dpo_loss(lw, ll, rw, rl, beta=beta).loss
    ref = -sum(math.log(ref_sigmoid(beta * ((lw[i] - rw[i]) - (ll[i] - rl[i])).item())) for i in range(4)) / 4
    assert d.item() == pytest.approx(ref, rel=1e-12)
    r = O.rpo_loss(lw, ll, rw, rl, lenw, beta=beta, alpha=alpha).loss
    nll = sum(lw[i].item() / lenw[i].item() for i in range(4)) / 4
    assert r.item() == pytest.approx(ref - alpha * nll, rel=1e-12)
    if beta != 0.1:  # the options move the value: the defaults give other numbers
        assert abs(O.dpo_loss(lw, ll, rw, rl).loss.item() - ref) > 1e-3
        assert abs(O.rpo_loss(lw, ll, rw, rl, lenw, beta=beta).loss.item() - (ref - alpha * nll)) > 1e-3


def test_dpo_with_bandit_normalized_future_policy_equals_dpo_with_scaled_beta():
    # Sequence-level (bandit) normalization: log pi_hat = (1+lam) log pi - lam log pi_ref - log Z_lam(x),
    # with Z_lam shared by y_w and y_l of the same prompt -> it cancels in the margin.
    g = torch.Generator().manual_seed(5)
    K, lam, beta = 6, 2.0, 0.1
    logits = torch.randn(K, generator=g, dtype=torch.float64, requires_grad=True)
    log_ref = torch.log_softmax(torch.randn(K, generator=g, dtype=torch.float64), 0)
    w, l = 1, 4
    logp = torch.log_softmax(logits, 0)
    log_hat = torch.log_softmax((1 + lam) * logp - lam * log_ref, 0)
    a = O.dpo_loss(log_hat[w : w + 1], log_hat[l : l + 1], log_ref[w : w + 1], log_ref[l : l + 1], beta=beta).loss
    b = O.dpo_loss(logp[w : w + 1], logp[l : l + 1], log_ref[w : w + 1], log_ref[l : l + 1], beta=(1 + lam) * beta).loss
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15)
    (ga,) = torch.autograd.grad(a, logits, retain_graph=True)
    (gb,) = torch.autograd.grad(b, logits)
    torch.testing.assert_close(ga, gb, rtol=1e-10, atol=1e-14)


def test_simper_gradient_equals_offrl_gradient():
    # FPA Prop. A.1: pairs (y_w, R=+1), (y_l, R=-1); Off-RL averages over 2B sequences, SimPER
    # over B pairs, so grad SimPER = 2 * grad Off-RL with those reductions.
    logp, lengths, _ = _seq(6, B=4)
    lw, ll = logp[:2], logp[2:]
    nw, nl = lengths[:2], lengths[2:]
    (gs,) = torch.autograd.grad(O.simper_loss(lw, ll, nw, nl).loss, logp)
    reward = torch.tensor([1.0, 1.0, -1.0, -1.0], dtype=torch.float64)
    (go,) = torch.autograd.grad(O.offrl_loss(logp, lengths, reward).loss, logp)
    torch.testing.assert_close(gs, 2 * go, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize(
    "beta,lambda_w,lambda_l,z0",
    [(0.1, 1.0, 1.0, None), (0.8, 1.7, 0.4, None), (0.8, 1.7, 0.4, 0.3)],  # paper values; away; a given z0
)
def test_kto_matches_paper_definition(beta, lambda_w, lambda_l, z0):
    g = torch.Generator().manual_seed(8)
    logp, logp_ref = (torch.randn(5, generator=g, dtype=torch.float64) for _ in range(2))
    correct = torch.tensor([1, 0, 1, 1, 0])
    r = [(logp[i] - logp_ref[i]).item() for i in range(5)]
    zz = sum(r) / 5 if z0 is None else z0
    ref = 0.0
    for i in range(5):
        lam = lambda_w if correct[i] else lambda_l
        v = ref_sigmoid(beta * (r[i] - zz)) if correct[i] else ref_sigmoid(beta * (zz - r[i]))
        ref += lam - lam * v
    got = O.kto_loss(logp, logp_ref, correct, beta=beta, lambda_w=lambda_w, lambda_l=lambda_l, z0=z0).loss.item()
    assert got == pytest.approx(ref / 5, rel=1e-12)
    if (lambda_w, lambda_l) != (1.0, 1.0):
        assert (
            abs(
                O.kto_loss(logp, logp_ref, correct, beta=beta, lambda_w=lambda_l, lambda_l=lambda_w, z0=z0).loss.item()
                - got
            )
            > 1e-3
        )


def test_apo_value_is_stage1_lse_with_q_ref_and_loss():
    g = torch.Generator().manual_seed(9)
    r = (torch.rand(3, 8, generator=g) > 0.5).to(torch.float64)
    for beta1 in (0.5, 0.2):  # the paper's value, and away from it (V_hat depends on beta1)
        v = O.apo_value(r, beta1=beta1)
        for i in range(3):
            ref = beta1 * math.log(sum(math.exp(x / beta1) for x in r[i].tolist()) / 8)
            assert v[i].item() == pytest.approx(ref, rel=1e-12, abs=1e-14)
    assert (O.apo_value(r, beta1=0.2) - O.apo_value(r, beta1=0.5)).abs().max() > 1e-2
    logp, logp_ref, rew, vh = (torch.randn(4, generator=g, dtype=torch.float64) for _ in range(4))
    for beta2 in (1e-3, 0.3):
        ref = sum((beta2 * (logp[i] - logp_ref[i]).item() - (rew[i] - vh[i]).item()) ** 2 for i in range(4)) / 4
        assert O.apo_loss(logp, logp_ref, rew, vh, beta2=beta2).loss.item() == pytest.approx(ref, rel=1e-12)


def test_sft_loss_is_token_mean_nll():
    lp = -torch.rand(2, 4, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.float64)
    ref = -(lp[0, :2].sum() + lp[1].sum()).item() / 6
    assert O.sft_loss(lp, mask).loss.item() == pytest.approx(ref, rel=1e-12)


def test_bad_lengths():
    with pytest.raises(ValueError, match="lengths"):
        O.offrl_loss(torch.zeros(2), torch.tensor([1.0, 0.0]), torch.ones(2))
