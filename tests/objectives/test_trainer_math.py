"""The math the online trainer composes around an objective (``objectives.correction``,
``objectives.diagnostics``) against naive loop references, by value and by gradient."""

from __future__ import annotations

import math

import pytest
import torch

from tiltlab.objectives.correction import kl_penalty, sequence_is_weight
from tiltlab.objectives.diagnostics import pearson, sequence_kl_old, spearman, weight_clip_fraction
from tiltlab.objectives.transforms import affine_reward

# float64 inputs; the references loop in Python floats (float64), so agreement is to rounding:
# 1e-10 relative leaves ~6 orders of magnitude above float64 accumulated error on these sizes.
TOL = dict(rtol=1e-10, atol=1e-12)


def _batch(seed: int = 0, b: int = 4, t: int = 6):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3
    ref = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3
    lengths = [t, t - 2, 1, t - 3][:b]
    mask = torch.tensor([[1.0 if j < n else 0.0 for j in range(t)] for n in lengths], dtype=torch.float64)
    return logp, ref, mask


# ---- naive references -------------------------------------------------------------------------


def ref_kl_penalty(logp, ref, mask):
    num = den = 0.0
    for i in range(len(logp)):
        for j in range(len(logp[0])):
            if mask[i][j]:
                d = ref[i][j] - logp[i][j]
                num += math.exp(d) - d - 1.0
                den += 1.0
    return num / max(den, 1.0)


def ref_kl_penalty_grad(logp, ref, mask):
    """d/dlogp of the masked mean of e^{ref-logp} - (ref-logp) - 1: (1 - e^{ref-logp}) / n."""
    n = sum(1 for row in mask for m in row if m)
    return [
        [(1.0 - math.exp(ref[i][j] - logp[i][j])) / n if mask[i][j] else 0.0 for j in range(len(logp[0]))]
        for i in range(len(logp))
    ]


def ref_sequence_is_weight(ratio, mask, cap):
    out = []
    for i in range(len(ratio)):
        s = sum(math.log(max(ratio[i][j], 1e-30)) for j in range(len(ratio[0])) if mask[i][j])
        w = math.exp(min(s, 80.0))
        out.append(min(w, cap) if cap is not None else w)
    return out


def ref_pearson(a, b):
    n = len(a)
    ma, mb = sum(a) / n, sum(b) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b))
    return cov / math.sqrt(sum((x - ma) ** 2 for x in a) * sum((y - mb) ** 2 for y in b))


def ref_ranks(x):
    order = sorted(range(len(x)), key=lambda i: (x[i], i))
    r = [0] * len(x)
    for pos, i in enumerate(order):
        r[i] = pos
    return r


# ---- kl_penalty -------------------------------------------------------------------------------


def test_kl_penalty_value_and_gradient():
    logp, ref, mask = _batch()
    logp.requires_grad_(True)
    out = kl_penalty(logp, ref, mask)
    assert out.item() == pytest.approx(ref_kl_penalty(logp.tolist(), ref.tolist(), mask.tolist()), rel=1e-10)
    out.backward()
    want = torch.tensor(ref_kl_penalty_grad(logp.tolist(), ref.tolist(), mask.tolist()), dtype=torch.float64)
    torch.testing.assert_close(logp.grad, want, **TOL)
    assert torch.autograd.gradcheck(lambda x: kl_penalty(x, ref, mask), (logp.detach().requires_grad_(True),))


def test_kl_penalty_ignores_padding_and_is_zero_at_ref():
    logp, ref, mask = _batch()
    padded = logp.masked_fill(mask == 0, 123.0)  # garbage in padded positions
    assert kl_penalty(padded, ref, mask).item() == pytest.approx(kl_penalty(logp, ref, mask).item(), rel=1e-12)
    assert kl_penalty(ref, ref, mask).item() == 0.0
    assert kl_penalty(logp, ref, torch.zeros_like(mask)).item() == 0.0


def test_kl_penalty_shape_errors():
    logp, ref, mask = _batch()
    with pytest.raises(ValueError, match="token_logp_ref"):
        kl_penalty(logp, ref[:, :-1], mask)
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        kl_penalty(logp[0], ref[0], mask[0])


# ---- sequence_is_weight -----------------------------------------------------------------------


@pytest.mark.parametrize("cap", [None, 2.0])
def test_sequence_is_weight_token_level(cap):
    g = torch.Generator().manual_seed(1)
    _, _, mask = _batch()
    ratio = torch.exp(torch.randn(mask.shape, generator=g, dtype=torch.float64) * 0.5)
    ratio[0, 0] = 0.0  # floored at 1e-30 before the log
    got = sequence_is_weight(ratio, mask, cap=cap)
    want = torch.tensor(ref_sequence_is_weight(ratio.tolist(), mask.tolist(), cap), dtype=torch.float64)
    torch.testing.assert_close(got, want, **TOL)
    if cap is not None:
        assert (got <= cap).all()


def test_sequence_is_weight_gradient_below_the_cap():
    """Below the cap the weight is prod_t r_t over unmasked tokens: d w / d r_t = w / r_t."""
    _, _, mask = _batch()
    ratio = torch.full(mask.shape, 1.05, dtype=torch.float64, requires_grad=True)
    w = sequence_is_weight(ratio, mask, cap=None)
    w.sum().backward()
    want = (w.detach()[:, None] / ratio.detach()) * mask
    torch.testing.assert_close(ratio.grad, want, **TOL)
    assert torch.autograd.gradcheck(
        lambda r: sequence_is_weight(r, mask, cap=10.0), (ratio.detach().requires_grad_(True),)
    )


def test_sequence_is_weight_sequence_level_passes_through():
    _, _, mask = _batch()
    ratio = torch.tensor([[0.5], [3.0], [1.0], [7.0]], dtype=torch.float64)
    torch.testing.assert_close(sequence_is_weight(ratio, mask, cap=2.0), ratio[:, 0], rtol=0, atol=0)


def test_sequence_is_weight_errors():
    _, _, mask = _batch()
    with pytest.raises(ValueError, match="rows"):
        sequence_is_weight(torch.ones(3, 1), mask)
    with pytest.raises(ValueError, match="mask"):
        sequence_is_weight(torch.ones(4, 5), mask)
    with pytest.raises(ValueError, match="cap"):
        sequence_is_weight(torch.ones_like(mask), mask, cap=0.0)


# ---- diagnostics ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_weight_clip_fraction(dtype):
    """The weight arrives clipped (``tb_importance_weight``): the fraction counts the raw weights
    the clip changed, in either float precision."""
    raw = torch.tensor([0.5, 0.79, 0.81, 1.0, 1.19, 1.21, 3.0, 10.5, 12.0, 9.9], dtype=dtype)
    n = raw.numel()
    outside_max = sum(1 for v in raw.tolist() if v >= 10.0)
    assert weight_clip_fraction(raw.clamp(max=10.0), weight_clip="max", max_weight=10.0).item() == pytest.approx(
        outside_max / n
    )
    outside_eps = sum(1 for v in raw.tolist() if not 0.8 < v < 1.2)
    clipped = raw.clamp(1 - 0.2, 1 + 0.2)
    assert weight_clip_fraction(clipped, weight_clip="eps", eps=0.2).item() == pytest.approx(outside_eps / n)
    assert weight_clip_fraction(clipped, weight_clip="ratio").item() == 0.0
    # away from the defaults: a cap of 3, and an asymmetric [1 - 0.2, 1 + 0.19] (1.19 is at the upper bound)
    at_cap = sum(1 for v in raw.tolist() if v >= 3.0)
    assert weight_clip_fraction(raw.clamp(max=3.0), weight_clip="max", max_weight=3.0).item() == pytest.approx(
        at_cap / n
    )
    assert at_cap != outside_max
    asym = raw.clamp(1 - 0.2, 1 + 0.19)
    outside_asym = sum(1 for v in raw.tolist() if not 0.8 < v < 1.19)
    assert weight_clip_fraction(asym, weight_clip="eps", eps=0.2, eps_high=0.19).item() == pytest.approx(
        outside_asym / n
    )
    assert outside_asym != outside_eps
    low = raw.clamp(1 - 0.3, 1 + 0.2)  # eps 0.3: 0.79 is inside [0.7, 1.2]
    outside_low = sum(1 for v in raw.tolist() if not 0.7 < v < 1.2)
    assert weight_clip_fraction(low, weight_clip="eps", eps=0.3, eps_high=0.2).item() == pytest.approx(outside_low / n)
    assert outside_low != outside_eps
    with pytest.raises(ValueError, match="clip must be"):
        weight_clip_fraction(raw, weight_clip="low")
    with pytest.raises(ValueError, match=r"\[B\]"):
        weight_clip_fraction(raw[None], weight_clip="max")


def test_sequence_kl_old_value_and_no_gradient():
    logp, old, mask = _batch(2)
    logp.requires_grad_(True)
    got = sequence_kl_old(old, logp, mask)
    rows = [
        sum(old[i, j].item() - logp[i, j].item() for j in range(mask.shape[1]) if mask[i, j])
        for i in range(mask.shape[0])
    ]
    assert got.item() == pytest.approx(sum(rows) / len(rows), rel=1e-10)
    assert not got.requires_grad  # a logged diagnostic: no gradient into the policy


def test_pearson_and_spearman_against_loops():
    g = torch.Generator().manual_seed(3)
    a = torch.randn(9, generator=g, dtype=torch.float64)
    b = a**3 + 0.3 * torch.randn(9, generator=g, dtype=torch.float64)
    assert pearson(a, b).item() == pytest.approx(ref_pearson(a.tolist(), b.tolist()), rel=1e-10)
    ra, rb = ref_ranks(a.tolist()), ref_ranks(b.tolist())
    assert spearman(a, b).item() == pytest.approx(ref_pearson(ra, rb), rel=1e-10)
    # Spearman is invariant under a strictly increasing map, Pearson is not
    assert spearman(a, torch.exp(3 * b)).item() == pytest.approx(spearman(a, b).item(), rel=1e-12)
    assert abs(pearson(a, torch.exp(3 * b)).item() - pearson(a, b).item()) > 1e-3
    # ties: broken by position (ordinal ranks)
    t = torch.tensor([1.0, 1.0, 2.0], dtype=torch.float64)
    assert spearman(t, torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64)).item() == pytest.approx(1.0)


def test_pearson_gradient():
    g = torch.Generator().manual_seed(4)
    a = torch.randn(6, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(6, generator=g, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda x: pearson(x, b), (a,))


def test_correlation_errors():
    with pytest.raises(ValueError, match="at least 2"):
        pearson(torch.ones(1), torch.ones(1))
    with pytest.raises(ValueError, match="shape"):
        spearman(torch.ones(3), torch.ones(4))


# ---- reward transform -------------------------------------------------------------------------


def test_affine_reward_value_gradient_and_error():
    r = torch.tensor([0.0, 1.0, 0.5, -2.0], dtype=torch.float64, requires_grad=True)
    out = affine_reward(r, 2.5, -1.0)
    assert out.tolist() == [2.5 * v - 1.0 for v in r.tolist()]
    out.sum().backward()
    assert r.grad.tolist() == [2.5] * 4
    with pytest.raises(ValueError, match="must be > 0"):
        affine_reward(r, 0.0)
