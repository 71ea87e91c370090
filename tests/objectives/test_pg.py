"""tiltlab.objectives.pg (GRPO, GSPO, PPO+KL) against loop references; padding invariance."""

import math

import pytest
import torch

from tiltlab.objectives import pg


def _batch(seed=0, B=4, T=5):
    g = torch.Generator().manual_seed(seed)
    lp = (torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3).requires_grad_(True)
    lpo = lp.detach() + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3
    lpr = lp.detach() + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    mask = torch.ones(B, T, dtype=torch.float64)
    mask[0, 3:] = 0
    mask[2, 1:] = 0
    return lp, lpo, lpr, adv, mask


def _ref_grpo_terms(lp, lpo, lpr, adv, mask, eps, kl_coef):
    terms = []
    for b in range(lp.shape[0]):
        row = []
        for t in range(lp.shape[1]):
            if mask[b, t] == 0:
                row.append(None)
                continue
            ratio = math.exp(lp[b, t].item() - lpo[b, t].item())
            clipped = min(max(ratio, 1 - eps), 1 + eps)
            v = -min(ratio * adv[b].item(), clipped * adv[b].item())
            d = lpr[b, t].item() - lp[b, t].item()
            v += kl_coef * (math.exp(d) - d - 1)
            row.append(v)
        terms.append(row)
    return terms


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
@pytest.mark.parametrize("kl_coef", [0.0, 0.5])
def test_grpo_loss_matches_loop(agg, kl_coef):
    lp, lpo, lpr, adv, mask = _batch()
    kw = {"max_len": lp.shape[1]} if agg == "seq_mean_token_sum_norm" else {}
    _out = pg.grpo_loss(lp, lpo, adv, mask, clip_eps=0.2, loss_agg=agg, token_logp_ref=lpr, kl_coef=kl_coef, **kw)
    loss, m = _out.loss, _out.metrics
    terms = _ref_grpo_terms(lp, lpo, lpr, adv, mask, 0.2, kl_coef)
    flat = [v for row in terms for v in row if v is not None]
    if agg == "token_mean":
        ref = sum(flat) / len(flat)
    elif agg == "seq_mean_token_mean":
        ref = sum(sum(v for v in row if v is not None) / sum(v is not None for v in row) for row in terms) / len(terms)
    else:
        ref = sum(sum(v for v in row if v is not None) / lp.shape[1] for row in terms) / len(terms)
    assert loss.item() == pytest.approx(ref, rel=1e-12)
    assert 0.0 <= m["clip_frac"].item() <= 1.0


def test_grpo_gradient_matches_finite_differences():
    lp, lpo, lpr, adv, mask = _batch(seed=3)
    loss = pg.grpo_loss(lp, lpo, adv, mask, token_logp_ref=lpr, kl_coef=0.1).loss
    (g,) = torch.autograd.grad(loss, lp)
    h = 1e-6
    for b, t in [(0, 0), (1, 4), (3, 2)]:
        e = torch.zeros_like(lp)
        e[b, t] = h
        lpl = lp.detach() + e
        lmi = lp.detach() - e
        fp = pg.grpo_loss(lpl, lpo, adv, mask, token_logp_ref=lpr, kl_coef=0.1).loss.item()
        fm = pg.grpo_loss(lmi, lpo, adv, mask, token_logp_ref=lpr, kl_coef=0.1).loss.item()
        # central differences in float64, h = 1e-6: truncation ~1e-12, rounding ~1e-10
        assert g[b, t].item() == pytest.approx((fp - fm) / (2 * h), rel=1e-5, abs=1e-9)
    # masked positions get no gradient
    assert g[0, 4].item() == 0.0 and g[2, 3].item() == 0.0


def test_grpo_on_policy_gradient_is_reinforce():
    # At logp = logp_old the clipped surrogate's gradient is -A * mask / n_tokens per token.
    lp, _, _, adv, mask = _batch(seed=4)
    loss = pg.grpo_loss(lp, lp.detach(), adv, mask).loss
    (g,) = torch.autograd.grad(loss, lp)
    torch.testing.assert_close(g, -adv[:, None] * mask / mask.sum(), rtol=1e-12, atol=1e-15)


def test_gspo_matches_loop():
    lp, lpo, _, adv, mask = _batch(seed=5)
    loss = pg.gspo_loss(lp, lpo, adv, mask, clip_eps=0.05, clip_eps_high=0.08).loss
    ref = 0.0
    for b in range(lp.shape[0]):
        toks = [t for t in range(lp.shape[1]) if mask[b, t] > 0]
        s = math.exp(sum(lp[b, t].item() - lpo[b, t].item() for t in toks) / len(toks))
        sc = min(max(s, 0.95), 1.08)
        ref += -min(s * adv[b].item(), sc * adv[b].item())
    assert loss.item() == pytest.approx(ref / lp.shape[0], rel=1e-12)


def test_ppo_kl_is_grpo_with_kl_to_old():
    lp, lpo, _, adv, mask = _batch(seed=6)
    a = pg.ppo_kl_loss(lp, lpo, adv, mask, kl_coef=1.0).loss
    b = pg.grpo_loss(lp, lpo, adv, mask, token_logp_ref=lpo, kl_coef=1.0).loss
    torch.testing.assert_close(a, b)


def test_kl_k3_nonnegative_and_unbiased_for_kl():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(6, generator=g, dtype=torch.float64), 0)
    q = torch.softmax(torch.randn(6, generator=g, dtype=torch.float64), 0)
    k3 = pg.kl_k3(p.log(), q.log())
    assert (k3 >= 0).all()
    # E_p[k3] = KL(p||q) exactly (enumeration)
    assert float((p * k3).sum()) == pytest.approx(float((p * (p.log() - q.log())).sum()), rel=1e-12)


@pytest.mark.parametrize("fn", ["grpo", "gspo"])
def test_padding_invariance(fn):
    lp, lpo, _lpr, adv, mask = _batch(seed=7)
    pad = lambda x, v: torch.cat([x, torch.full((x.shape[0], 3), v, dtype=x.dtype)], 1)
    f = pg.grpo_loss if fn == "grpo" else pg.gspo_loss
    l0 = f(lp, lpo, adv, mask).loss
    l1 = f(pad(lp, -9.0), pad(lpo, 4.0), adv, pad(mask, 0.0)).loss
    torch.testing.assert_close(l0, l1, rtol=1e-12, atol=1e-15)


def test_shape_errors():
    with pytest.raises(ValueError, match="advantages"):
        pg.grpo_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3), torch.ones(2, 3))
    with pytest.raises(ValueError, match="token_logp_ref"):
        pg.grpo_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), torch.ones(2, 3), kl_coef=1.0)


# ---- the three semantics shared with TRL 1.16 and veRL 0.9.1 (issue: KL not IS-weighted, empty
# completion, Dr. GRPO's fixed normalizer); each value below is what TRL's `_compute_loss` gives.
def test_is_weight_does_not_scale_the_kl_term():
    # zero advantage, kl_coef = 1, IS weight 0.5: the loss is the plain k3 mean (TRL adds the KL
    # after multiplying by the vLLM IS ratio; veRL weights only the policy-gradient term)
    lp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64)
    ref = torch.tensor([[-1.5, -1.0]], dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.float64)
    adv = torch.zeros(1, dtype=torch.float64)
    loss = pg.grpo_loss(lp, lp, adv, mask, token_logp_ref=ref, kl_coef=1.0, is_weight=torch.tensor([0.5]).double()).loss
    torch.testing.assert_close(loss, pg.kl_k3(lp, ref).mean(), rtol=1e-14, atol=0)


def test_gspo_empty_completion_contributes_zero():
    lp = torch.zeros(2, 2, dtype=torch.float64)
    mask = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    adv = torch.tensor([1.0, 0.0], dtype=torch.float64)
    loss = pg.gspo_loss(lp, lp, adv, mask).loss
    assert loss.item() == 0.0  # the empty row's ratio is 1, its A = 1: it must not give -A / B = -0.5
    # the same with a non-zero second row: the empty row still adds 0 and counts in B (TRL)
    loss = pg.gspo_loss(lp, lp, torch.tensor([1.0, 2.0], dtype=torch.float64), mask).loss
    assert loss.item() == pytest.approx(-2.0 / 2, rel=1e-15)


def test_dr_grpo_normalizer_is_fixed_not_padded_width():
    lp = torch.zeros(1, 2, dtype=torch.float64)
    adv = torch.ones(1, dtype=torch.float64)
    kw = {"loss_agg": "seq_mean_token_sum_norm", "max_len": 8}
    padded = lambda x, t: torch.cat([x, torch.zeros(1, t - 2, dtype=x.dtype)], 1)
    values = [
        pg.grpo_loss(padded(lp, t), padded(lp, t), adv, padded(torch.ones(1, 2).double(), t), **kw).loss.item()
        for t in (4, 8)
    ]
    assert values == [-2.0 / 8, -2.0 / 8]  # TRL: sum of the 2 tokens' -A over max_completion_length
    with pytest.raises(ValueError, match="max_len"):
        pg.grpo_loss(lp, lp, adv, torch.ones(1, 2).double(), loss_agg="seq_mean_token_sum_norm")


@pytest.mark.parametrize(
    "opt",
    [
        {"clip_eps": 0.1},
        {"dual_clip": 1.5},
        {"log_ratio_clip": 0.5},
        {"kl_estimator": "k1"},
        {"kl_estimator": "k2"},
        {"kl_ratio_weighted": True},
    ],
)
def test_options_bind_on_their_opinfo_sample(opt):
    # the generic checks of these options test something only if the option changes the value there;
    # k2 and k3 agree to second order in logp - ref, so their gap is small (~1e-6) but still 1e4 times
    # the generic value tolerance (1e-10, tests/objectives/_generic.py)
    from tests.objectives.opinfo import CLIP, mk_grpo_far

    x = mk_grpo_far(torch.Generator().manual_seed(0))
    base = pg.grpo_loss(**x, **CLIP, kl_coef=0.1).loss
    assert abs(float(pg.grpo_loss(**x, **{**CLIP, **opt}, kl_coef=0.1).loss - base)) > 1e-7


def test_dual_clip_bounds_negative_advantage_loss():
    lp = torch.zeros(1, 1, dtype=torch.float64)
    loss = pg.grpo_loss(lp, lp - 5.0, torch.tensor([-1.0], dtype=torch.float64), torch.ones(1, 1), dual_clip=3.0).loss
    assert loss.item() == pytest.approx(3.0, rel=1e-15)  # rho = e^5 ~ 148, bounded at c |A| = 3
    with pytest.raises(ValueError, match="dual_clip"):
        pg.grpo_loss(lp, lp, torch.ones(1, dtype=torch.float64), torch.ones(1, 1), dual_clip=1.0)


def test_batch_scaled_advantages():
    r = torch.tensor([[1.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    adv = pg.group_advantages(r, scale="batch", eps=0.0)
    # group 2 has zero within-group spread: advantage 0; group 1 is divided by the batch std (0.5)
    torch.testing.assert_close(adv, torch.tensor([[0.5, -0.5], [0.0, 0.0]], dtype=torch.float64) / 0.5)
