"""tiltlab.objectives.tb against loop references; TB identities (VarGrad, optimum = pi*, padding)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.objectives._ref import ref_group_adv, ref_tb_residual
from tiltlab.objectives import tb
from tiltlab.objectives.pg import group_advantages

G64 = torch.Generator().manual_seed(0)


def rnd(*shape, g=G64, grad=False):
    t = torch.randn(*shape, generator=g, dtype=torch.float64)
    return t.requires_grad_(grad)


def test_sequence_logprob_sum_and_mean_match_loops():
    lp = rnd(3, 6)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0]], dtype=torch.float64)
    s = tb.sequence_logprob(lp, mask, normalize="sum")
    m = tb.sequence_logprob(lp, mask, normalize="mean")
    for b in range(3):
        toks = [lp[b, t].item() for t in range(6) if mask[b, t] > 0]
        assert s[b].item() == pytest.approx(sum(toks), rel=1e-12)
        assert m[b].item() == pytest.approx(sum(toks) / len(toks), rel=1e-12)


def test_sequence_logprob_ignores_nonfinite_padding():
    lp = torch.tensor([[-1.0, -2.0, -math.inf, float("nan")]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    assert tb.sequence_logprob(lp, mask).item() == -3.0


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.floats(0.1, 20), st.integers(0, 10_000))
def test_tb_residual_and_loss_match_reference(b, beta, seed):
    g = torch.Generator().manual_seed(seed)
    logp, logp_ref, r, lz, w = (torch.randn(b, generator=g, dtype=torch.float64) for _ in range(5))
    w = w.abs()
    d = tb.tb_residual(logp, logp_ref, r, lz, beta=beta)
    ref = ref_tb_residual(logp.tolist(), logp_ref.tolist(), r.tolist(), lz.tolist(), beta)
    for i in range(b):
        assert d[i].item() == pytest.approx(ref[i], rel=1e-12, abs=1e-12)
    assert tb.tb_loss(d, is_weight=w).loss.item() == pytest.approx(
        sum(w[i].item() * ref[i] ** 2 for i in range(b)) / b, rel=1e-12
    )


def test_tb_gradients_match_analytic():
    logp = rnd(5, grad=True)
    lz = rnd(5, grad=True)
    logp_ref, r, w = rnd(5), rnd(5), rnd(5).abs()
    beta = 2.5
    tb.tb_loss(tb.tb_residual(logp, logp_ref, r, lz, beta=beta), is_weight=w).loss.backward()
    d = (lz + logp - logp_ref - beta * r).detach()
    torch.testing.assert_close(logp.grad, 2 * w * d / 5, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(lz.grad, 2 * w * d / 5, rtol=1e-12, atol=1e-14)


def test_disa_loss_blocks_log_z_gradient_and_flowrl_style_learns_it():
    logp = rnd(4, grad=True)
    lz = rnd(4, grad=True)
    tb.disa_loss(logp, rnd(4), rnd(4), lz, beta=1.0).loss.backward()
    assert lz.grad is None and logp.grad is not None


def test_shape_errors_are_clear():
    with pytest.raises(ValueError, match="shape"):
        tb.tb_residual(torch.zeros(3), torch.zeros(4), torch.zeros(3), 0.0, beta=1.0)
    with pytest.raises(ValueError, match="broadcast"):
        tb.tb_residual(torch.zeros(3), torch.zeros(3), torch.zeros(3), torch.zeros(2), beta=1.0)
    with pytest.raises(ValueError, match="empty"):
        tb.tb_loss(torch.zeros(0))


def test_vargrad_log_z_matches_loop_and_is_batch_argmin():
    p, g, beta = 3, 5, 1.7
    logp, logp_ref, r = rnd(p, g), rnd(p, g), rnd(p, g)
    est = tb.vargrad_log_z(logp, logp_ref, r, beta=beta)
    for i in range(p):
        ref = sum(beta * r[i, j].item() - logp[i, j].item() + logp_ref[i, j].item() for j in range(g)) / g
        assert est[i].item() == pytest.approx(ref, rel=1e-12)
        # argmin: perturbing log Z either way raises the batch TB loss
        for eps in (1e-3, -1e-3):
            l0 = tb.tb_loss(tb.tb_residual(logp[i], logp_ref[i], r[i], est[i], beta=beta)).loss
            l1 = tb.tb_loss(tb.tb_residual(logp[i], logp_ref[i], r[i], est[i] + eps, beta=beta)).loss
            assert l1 > l0


def test_vargrad_equals_tb_at_batch_optimal_log_z_values_and_gradients():
    p, g, beta = 4, 6, 3.0
    logp = rnd(p, g, grad=True)
    logp_ref, r = rnd(p, g), rnd(p, g)
    lv = tb.vargrad_loss(logp, logp_ref, r, beta=beta).loss
    (gv,) = torch.autograd.grad(lv, logp)
    # TB with the batch-optimal log Z plugged in as a constant
    lz = torch.stack([(beta * r[i] - logp[i] + logp_ref[i]).mean() for i in range(p)]).detach()
    lt = tb.tb_loss(tb.tb_residual(logp, logp_ref, r, lz[:, None], beta=beta)).loss
    (gt,) = torch.autograd.grad(lt, logp)
    torch.testing.assert_close(lv, lt, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(gv, gt, rtol=1e-10, atol=1e-13)
    # and the value is the population variance of logp - logp_ref - beta r within each group
    x = (logp - logp_ref - beta * r).detach()
    assert lv.item() == pytest.approx(x.var(dim=1, unbiased=False).mean().item(), rel=1e-12)


def test_tb_optimum_with_exact_log_z_is_pi_star_on_simplex():
    # Minimize E_{y ~ pi_b}[delta^2] over softmax logits with the exact log Z; the minimizer is
    # pi* = pi_ref e^{beta r} / Z (DISA Prop. 3(i)), for a full-support behaviour pi_b.
    K, beta = 5, 1.5
    g = torch.Generator().manual_seed(3)
    pi_ref = torch.softmax(torch.randn(K, generator=g, dtype=torch.float64), 0)
    r = torch.rand(K, generator=g, dtype=torch.float64)
    pi_b = torch.softmax(torch.randn(K, generator=g, dtype=torch.float64), 0)
    log_z = torch.logsumexp(pi_ref.log() + beta * r, 0)
    pi_star = torch.exp(pi_ref.log() + beta * r - log_z)
    theta = torch.zeros(K, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([theta], max_iter=200, tolerance_grad=1e-14, tolerance_change=1e-16)

    def closure():
        opt.zero_grad()
        logp = torch.log_softmax(theta, 0)
        loss = tb.tb_loss(tb.tb_residual(logp, pi_ref.log(), r, log_z, beta=beta), is_weight=pi_b * K).loss
        loss.backward()
        return loss

    for _ in range(5):
        opt.step(closure)
    pi = torch.softmax(theta.detach(), 0)
    # float64 LBFGS to 1e-14 gradient tolerance: the argmin is reached to ~1e-7
    assert 0.5 * (pi - pi_star).abs().sum().item() < 1e-6
    assert closure().item() < 1e-12


def test_group_normalized_reward_matches_loop_and_shift_invariance():
    r = rnd(3, 4)
    a = tb.group_normalized_reward(r)
    for i in range(3):
        ref = ref_group_adv(r[i].tolist())
        for j in range(4):
            assert a[i, j].item() == pytest.approx(ref[j], rel=1e-10)
    shift = rnd(3, 1) * 10
    torch.testing.assert_close(group_advantages(r + shift), group_advantages(r), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(group_advantages(r + shift, scale="none"), group_advantages(r, scale="none"))


def test_all_zero_reward_group_has_zero_advantage_and_g1_errors():
    r = torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 1.0]])
    a = group_advantages(r)
    assert torch.equal(a[0], torch.zeros(3))
    with pytest.raises(ValueError, match="G >= 2"):
        group_advantages(torch.zeros(2, 1))


def test_importance_weight_options():
    lp = rnd(3, 4)
    lpo = rnd(3, 4)
    mask = torch.ones(3, 4, dtype=torch.float64)
    mask[0, 2:] = 0
    raw = [math.exp(sum((lp[b, t] - lpo[b, t]).item() for t in range(4) if mask[b, t] > 0)) for b in range(3)]
    w_none = tb.tb_importance_weight(lp, lpo, mask, weight_clip="ratio")
    w_max = tb.tb_importance_weight(lp, lpo, mask, weight_clip="max", max_weight=2.0)
    w_eps = tb.tb_importance_weight(lp, lpo, mask, weight_clip="eps", eps=0.2)
    for b in range(3):
        assert w_none[b].item() == pytest.approx(raw[b], rel=1e-10)
        assert w_max[b].item() == pytest.approx(min(raw[b], 2.0), rel=1e-10)
        assert w_eps[b].item() == pytest.approx(min(max(raw[b], 0.8), 1.2), rel=1e-10)
    assert not w_none.requires_grad


def test_flowrl_loss_matches_hand_computation_and_log_z_gets_gradient():
    P, G, T = 2, 3, 4
    lp = rnd(P * G, T, grad=True)
    lref, lold = rnd(P * G, T), rnd(P * G, T)
    mask = torch.ones(P * G, T, dtype=torch.float64)
    mask[1, 3] = 0
    rewards = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    lz = torch.tensor([0.3, -0.2], dtype=torch.float64, requires_grad=True)
    _out = tb.flowrl_loss(lp, lref, lold, mask, rewards, lz, beta=15.0)
    loss, metrics = _out.loss, _out.metrics
    # loop reference of docs/math.md §2
    tot = 0.0
    for b in range(P * G):
        p, j = divmod(b, G)
        toks = [t for t in range(T) if mask[b, t] > 0]
        lpm = sum(lp[b, t].item() for t in toks) / len(toks)
        lrm = sum(lref[b, t].item() for t in toks) / len(toks)
        adv = ref_group_adv(rewards[p].tolist())[j]
        w = min(math.exp(sum(lp[b, t].item() - lold[b, t].item() for t in toks)), 10.0)
        tot += w * (lz[p].item() + lpm - 15.0 * adv - lrm) ** 2
    assert loss.item() == pytest.approx(tot / (P * G), rel=1e-10)
    loss.backward()
    assert lz.grad is not None and torch.all(lz.grad != 0)
    assert set(metrics) >= {"log_z_mean", "residual_abs_mean", "weight_clip_frac"}


def test_token_losses_padding_invariance():
    # Appending padded positions (with garbage log-probs) must not change sequence log-probs or
    # the FlowRL loss.
    P, G, T = 1, 3, 3
    lp, lref, lold = rnd(P * G, T), rnd(P * G, T), rnd(P * G, T)
    mask = torch.ones(P * G, T, dtype=torch.float64)
    rewards = torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64)
    lz = torch.zeros(P, dtype=torch.float64)
    pad = lambda x, v: torch.cat([x, torch.full((P * G, 2), v, dtype=torch.float64)], 1)
    l0 = tb.flowrl_loss(lp, lref, lold, mask, rewards, lz).loss
    l1 = tb.flowrl_loss(pad(lp, -50.0), pad(lref, 3.0), pad(lold, 7.0), pad(mask, 0.0), rewards, lz).loss
    torch.testing.assert_close(l0, l1, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("clip", ["max", "eps"])
def test_flowrl_logs_the_clip_fraction_of_its_own_clip(clip):
    """The logged ``weight_clip_frac`` counts the weights at the bounds of the clip in use (it was
    0 under ``"eps"``), and is taken before a sampler IS weight multiplies the TB weight."""
    P, G, T = 2, 4, 3
    mask = torch.ones(P * G, T, dtype=torch.float64)
    lp = torch.zeros(P * G, T, dtype=torch.float64)
    shift = torch.tensor([3.0, -3.0, 0.01, 0.0, 3.0, 0.0, 0.0, 0.0], dtype=torch.float64)  # log-ratio per sequence / T
    lold = lp - shift[:, None] / T
    rewards = torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
    _out = tb.flowrl_loss(
        lp,
        lp,
        lold,
        mask,
        rewards,
        torch.zeros(P, dtype=torch.float64),
        weight_clip=clip,
        is_weight=torch.full((P * G,), 100.0, dtype=torch.float64),
    )
    _, metrics = _out.loss, _out.metrics
    # ratios e^3 (x2), e^-3, e^0.01, 1 (x4): "max" (at 10) clips the two e^3; "eps" (outside
    # [0.8, 1.2]) clips e^3 twice and e^-3 once
    expected = {"max": 2 / 8, "eps": 3 / 8}[clip]
    assert metrics["weight_clip_frac"].item() == pytest.approx(expected)
