"""Tests for objectives.fused against independent full-vocabulary float64 references.

The references below are written from the definitions (materialize all logits in float64,
``log_softmax``, gather / ``-sum p log p``), never from the streamed code.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from tiltlab.objectives.fused import (
    fused_linear_entropy,
    fused_linear_future_logprobs,
    fused_linear_logprobs,
    fused_linear_logprobs_and_entropy,
)

# ----------------------------------------------------------------------------------------------
# naive references (float64, full vocabulary)


def naive_logits(hidden, weight, bias=None, temperature=1.0):
    """z = (h W^T + b) / T in float64, [N, V]."""
    z = hidden.double() @ weight.double().T
    if bias is not None:
        z = z + bias.double()
    return z / temperature


def naive_logprobs(hidden, weight, ids, bias=None, temperature=1.0):
    z = naive_logits(hidden, weight, bias, temperature)
    return torch.log_softmax(z, dim=-1).gather(-1, ids[..., None]).squeeze(-1)


def naive_entropy(hidden, weight, bias=None, temperature=1.0):
    logp = torch.log_softmax(naive_logits(hidden, weight, bias, temperature), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def naive_future_logprobs(h_theta, w_theta, h_ref, w_ref, ids, lam, temperature=1.0, b_theta=None, b_ref=None):
    """FPA eq. (4): log softmax((1+lam) z_theta - lam z_ref)[ids], float64; z = (h W^T + b) / T."""
    z = (1 + lam) * naive_logits(h_theta, w_theta, b_theta, temperature) - lam * naive_logits(
        h_ref, w_ref, b_ref, temperature
    )
    return torch.log_softmax(z, dim=-1).gather(-1, ids[..., None]).squeeze(-1)


# ----------------------------------------------------------------------------------------------
# tolerances, per dtype, for values (log-probs / entropies are O(log V) ~ 5) and gradients
#   float64: everything is float64 on both sides; differences are summation-order roundoff
#            (~1e-15 * a few hundred terms) -> 1e-10.
#   float32: fp32 matmul of H = 16 terms and fp32 online LSE over V <= 101 entries; observed
#            errors ~1e-6 -> 2e-5 (eps_32 = 1.2e-7 times O(100)).
#   bfloat16: inputs are bf16 but exactly representable, and the reference uses the SAME
#            rounded inputs in float64; accumulation is fp32, so values agree to fp32 level
#            (2e-5). Gradients are returned in bf16, i.e. rounded to 8 significant bits:
#            relative error <= 2^-9 per element, plus fp32 accumulation -> rtol 2^-8, atol
#            2^-8 * max|grad|.
VALUE_TOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.bfloat16: 2e-5}
GRAD_RTOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.bfloat16: 2.0**-8}


def assert_close_grad(got, ref, dtype, what):
    assert got is not None, f"{what}: no gradient"
    ref = ref.double()
    scale = ref.abs().max().item()
    atol = GRAD_RTOL[dtype] * max(scale, 1.0)
    torch.testing.assert_close(got.double(), ref, rtol=GRAD_RTOL[dtype], atol=atol, msg=lambda m: f"{what}: {m}")


def make(n, h, v, dtype, seed=0, bias=True, scale=1.0):
    """Random inputs, rounded to ``dtype`` (the float64 reference reads the rounded values)."""
    g = torch.Generator().manual_seed(seed)
    hid = (torch.randn(n, h, generator=g, dtype=torch.float64) * scale).to(dtype).requires_grad_()
    w = (torch.randn(v, h, generator=g, dtype=torch.float64) / math.sqrt(h) * 2).to(dtype).requires_grad_()
    b = torch.randn(v, generator=g, dtype=torch.float64).to(dtype).requires_grad_() if bias else None
    ids = torch.randint(0, v, (n,), generator=g)
    upstream = torch.randn(n, generator=g, dtype=torch.float64)  # non-uniform dL/dlogp
    return hid, w, b, ids, upstream


def leaf64(*xs):
    return [None if x is None else x.detach().double().requires_grad_() for x in xs]


def grads(out, upstream, inputs):
    loss = (out.double() * upstream).sum()
    want = [x for x in inputs if x is not None]
    got = torch.autograd.grad(loss, want, allow_unused=True)
    it = iter(got)
    return [None if x is None else next(it) for x in inputs]


# ----------------------------------------------------------------------------------------------
# the references themselves (test the test helpers)


def test_naive_references_are_distributions():
    hid, w, b, _ids, _ = make(5, 4, 9, torch.float64)
    all_ids = torch.arange(9).expand(5, 9)
    lp = torch.stack([naive_logprobs(hid, w, all_ids[:, j], b) for j in range(9)], dim=1)
    torch.testing.assert_close(lp.exp().sum(1), torch.ones(5, dtype=torch.float64), rtol=0, atol=1e-12)
    # uniform logits -> entropy log V; reference entropy = -sum p log p of the same rows
    assert torch.allclose(
        naive_entropy(hid, torch.zeros(9, 4, dtype=torch.float64)), torch.full((5,), math.log(9), dtype=torch.float64)
    )
    torch.testing.assert_close(naive_entropy(hid, w, b), -(lp.exp() * lp).sum(1))


# ----------------------------------------------------------------------------------------------
# values and gradients vs the references

CHUNKS = [(8, 19), (1, 1), (64, 128), (5, 100)]  # N = 37, V = 101: none divides except the big tile


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tc,vc", CHUNKS)
def test_logprobs_values_and_grads(dtype, tc, vc):
    n, h, v, temp = 37, 16, 101, 0.7
    hid, w, b, ids, up = make(n, h, v, dtype, seed=tc * 1000 + vc)
    out = fused_linear_logprobs(hid, w, ids, bias=b, temperature=temp, token_chunk=tc, vocab_chunk=vc)
    assert out.shape == (n,) and out.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    h64, w64, b64 = leaf64(hid, w, b)
    ref = naive_logprobs(h64, w64, ids, b64, temp)
    torch.testing.assert_close(out.double(), ref.detach(), rtol=0, atol=VALUE_TOL[dtype])
    got = grads(out, up, [hid, w, b])
    want = grads(ref, up, [h64, w64, b64])
    for name, gg, ww in zip(["hidden", "weight", "bias"], got, want):
        assert gg.dtype == dtype
        assert_close_grad(gg, ww, dtype, name)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tc,vc", [(8, 19), (64, 128)])
def test_entropy_values_and_grads(dtype, tc, vc):
    n, h, v, temp = 37, 16, 101, 1.3
    hid, w, b, _, up = make(n, h, v, dtype, seed=7)
    out = fused_linear_entropy(hid, w, bias=b, temperature=temp, token_chunk=tc, vocab_chunk=vc)
    h64, w64, b64 = leaf64(hid, w, b)
    ref = naive_entropy(h64, w64, b64, temp)
    torch.testing.assert_close(out.double(), ref.detach(), rtol=0, atol=VALUE_TOL[dtype])
    for name, gg, ww in zip(["hidden", "weight", "bias"], grads(out, up, [hid, w, b]), grads(ref, up, [h64, w64, b64])):
        assert_close_grad(gg, ww, dtype, name)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lam", [0.5, 2.0])
def test_future_logprobs_values_and_grads(dtype, lam):
    n, h, h_ref_dim, v, temp = 29, 12, 8, 67, 0.9
    hid, w, _, ids, up = make(n, h, v, dtype, seed=3, bias=False)
    href, wref, _, _, _ = make(n, h_ref_dim, v, dtype, seed=4, bias=False)  # a different hidden size
    out = fused_linear_future_logprobs(hid, w, href, wref, ids, lam, temperature=temp, token_chunk=6, vocab_chunk=10)
    h64, w64, hr64, wr64 = leaf64(hid, w, href, wref)
    ref = naive_future_logprobs(h64, w64, hr64, wr64, ids, lam, temp)
    torch.testing.assert_close(out.double(), ref.detach(), rtol=0, atol=VALUE_TOL[dtype] * (1 + 2 * lam))
    g_h, g_w, g_hr, g_wr = grads(out, up, [hid, w, href, wref])
    r_h, r_w = grads(ref, up, [h64, w64])
    assert_close_grad(g_h, r_h, dtype, "h_theta")
    assert_close_grad(g_w, r_w, dtype, "w_theta")
    assert g_hr is None and g_wr is None, "the reference is frozen: no gradient may reach it"


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lam", [0.0, 0.5, 2.0])
def test_future_logprobs_with_output_biases(dtype, lam):
    """Both read-outs carry an output bias (models with a biased lm_head): z = (h W^T + b) / T on each
    side, so pi_hat's logits carry (1 + lam) b_theta - lam b_ref; the gradient reaches b_theta, never b_ref."""
    n, h, h_ref_dim, v, temp = 23, 10, 7, 53, 0.8
    hid, w, b, ids, up = make(n, h, v, dtype, seed=13)
    href, wref, bref, _, _ = make(n, h_ref_dim, v, dtype, seed=14)
    out = fused_linear_future_logprobs(
        hid, w, href, wref, ids, lam, bias_theta=b, bias_ref=bref, temperature=temp, token_chunk=5, vocab_chunk=11
    )
    h64, w64, b64, hr64, wr64, br64 = leaf64(hid, w, b, href, wref, bref)
    ref = naive_future_logprobs(h64, w64, hr64, wr64, ids, lam, temp, b_theta=b64, b_ref=br64)
    torch.testing.assert_close(out.double(), ref.detach(), rtol=0, atol=VALUE_TOL[dtype] * (1 + 2 * lam))
    # the biases move the answer by far more than the tolerance (a read-out that drops either is caught)
    for nb_t, nb_r in ((None, br64), (b64, None)):
        if lam == 0 and nb_t is not None:
            continue  # at lam = 0 the reference side (and its bias) has weight 0
        without = naive_future_logprobs(h64, w64, hr64, wr64, ids, lam, temp, b_theta=nb_t, b_ref=nb_r).detach()
        assert (without - ref.detach()).abs().max() > 1e-2
    g_h, g_w, g_b, g_hr, g_wr, g_br = grads(out, up, [hid, w, b, href, wref, bref])
    r_h, r_w, r_b = grads(ref, up, [h64, w64, b64])
    assert_close_grad(g_h, r_h, dtype, "h_theta")
    assert_close_grad(g_w, r_w, dtype, "w_theta")
    assert_close_grad(g_b, r_b, dtype, "bias_theta")
    assert g_hr is None and g_wr is None and g_br is None, "the reference is frozen: no gradient may reach it"


def test_future_eq5_product_of_powers():
    """FPA eq. (5): pi_hat ∝ pi_theta^(1+lam) pi_ref^(-lam), built from two plain log-prob calls."""
    n, h, v, lam = 6, 5, 23, 1.5
    hid, w, _, _, _ = make(n, h, v, torch.float64, seed=11, bias=False)
    href, wref, _, _, _ = make(n, h, v, torch.float64, seed=12, bias=False)
    all_ids = [torch.full((n,), j) for j in range(v)]
    lt = torch.stack([fused_linear_logprobs(hid, w, i, vocab_chunk=7) for i in all_ids], 1)  # [N, V]
    lr = torch.stack([fused_linear_logprobs(href, wref, i, vocab_chunk=7) for i in all_ids], 1)
    unnorm = (1 + lam) * lt - lam * lr
    expect = unnorm - torch.logsumexp(unnorm, 1, keepdim=True)
    got = torch.stack([fused_linear_future_logprobs(hid, w, href, wref, i, lam, vocab_chunk=7) for i in all_ids], 1)
    torch.testing.assert_close(got.detach(), expect.detach(), rtol=0, atol=1e-12)  # float64 roundoff


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_future_lambda_zero_is_plain_logprobs(dtype):
    hid, w, _, ids, up = make(13, 8, 31, dtype, seed=5, bias=False)
    href, wref, _, _, _ = make(13, 8, 31, dtype, seed=6, bias=False)
    fut = fused_linear_future_logprobs(hid, w, href, wref, ids, 0.0, token_chunk=4, vocab_chunk=9)
    plain = fused_linear_logprobs(hid, w, ids, token_chunk=4, vocab_chunk=9)
    assert torch.equal(fut, plain)  # lam = 0 runs the identical single-pair computation
    for a, b in zip(grads(fut, up, [hid, w]), grads(plain, up, [hid, w])):
        assert torch.equal(a, b)


def test_logprobs_and_entropy_one_pass_matches_both():
    n, h, v = 21, 8, 50
    hid, w, b, ids, up = make(n, h, v, torch.float64, seed=9)
    lp, ent = fused_linear_logprobs_and_entropy(hid, w, ids, bias=b, temperature=0.8, token_chunk=4, vocab_chunk=13)
    h64, w64, b64 = leaf64(hid, w, b)
    ref_lp, ref_ent = naive_logprobs(h64, w64, ids, b64, 0.8), naive_entropy(h64, w64, b64, 0.8)
    torch.testing.assert_close(lp, ref_lp.detach(), rtol=0, atol=1e-10)
    torch.testing.assert_close(ent, ref_ent.detach(), rtol=0, atol=1e-10)
    up2 = torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    loss, ref_loss = (lp * up).sum() + (ent * up2).sum(), (ref_lp * up).sum() + (ref_ent * up2).sum()
    got = torch.autograd.grad(loss, [hid, w, b])
    want = torch.autograd.grad(ref_loss, [h64, w64, b64])
    for gg, ww in zip(got, want):
        torch.testing.assert_close(gg, ww, rtol=1e-10, atol=1e-10)


# ----------------------------------------------------------------------------------------------
# gradcheck (float64, tiny)


def test_gradcheck_logprobs():
    hid, w, b, ids, _ = make(5, 3, 11, torch.float64, seed=21)
    f = lambda h_, w_, b_: fused_linear_logprobs(h_, w_, ids, bias=b_, temperature=0.6, token_chunk=2, vocab_chunk=4)
    assert torch.autograd.gradcheck(f, (hid, w, b), eps=1e-6, atol=1e-7)


def test_gradcheck_entropy_and_joint():
    hid, w, b, ids, _ = make(4, 3, 9, torch.float64, seed=22)
    f = lambda h_, w_, b_: fused_linear_entropy(h_, w_, bias=b_, temperature=1.7, token_chunk=3, vocab_chunk=2)
    assert torch.autograd.gradcheck(f, (hid, w, b), eps=1e-6, atol=1e-7)
    g = lambda h_, w_, b_: fused_linear_logprobs_and_entropy(h_, w_, ids, bias=b_, token_chunk=3, vocab_chunk=4)
    assert torch.autograd.gradcheck(g, (hid, w, b), eps=1e-6, atol=1e-7)


def test_gradcheck_future():
    hid, w, _, ids, _ = make(4, 3, 10, torch.float64, seed=23, bias=False)
    href, wref, bref, _, _ = make(4, 2, 10, torch.float64, seed=24)
    f = lambda h_, w_: fused_linear_future_logprobs(
        h_, w_, href, wref, ids, 1.0, bias_ref=bref, token_chunk=3, vocab_chunk=3
    )
    assert torch.autograd.gradcheck(f, (hid, w), eps=1e-6, atol=1e-7)


# ----------------------------------------------------------------------------------------------
# shapes, masking, edge cases, invariances


def test_single_token_and_single_chunk_extremes():
    hid, w, b, ids, _up = make(1, 4, 17, torch.float64, seed=31)
    for tc, vc in [(1, 1), (1, 17), (3, 1000)]:
        out = fused_linear_logprobs(hid, w, ids, bias=b, token_chunk=tc, vocab_chunk=vc)
        assert out.shape == (1,)
        torch.testing.assert_close(out, naive_logprobs(hid, w, ids, b).detach(), rtol=0, atol=1e-12)
    # V = 1: the only token has probability 1, entropy 0
    one = torch.zeros(3, 4, dtype=torch.float64)
    assert torch.allclose(
        fused_linear_logprobs(one, torch.randn(1, 4, dtype=torch.float64), torch.zeros(3, dtype=torch.long)),
        torch.zeros(3, dtype=torch.float64),
    )


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_batched_mask_and_ignore_index(dtype):
    B, T, h, v = 3, 7, 6, 40
    g = torch.Generator().manual_seed(41)
    hid = torch.randn(B, T, h, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    w = torch.randn(v, h, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    ids = torch.randint(0, v, (B, T), generator=g)
    mask = (torch.rand(B, T, generator=g) > 0.3).float()
    mask[0] = 0.0  # a fully padded row
    ids[1, 2] = -100  # ignore_index inside a kept row
    ids[2, -1] = 10**6  # out of range but masked away -> must not raise
    mask[2, -1] = 0.0
    keep = (mask > 0) & (ids != -100)
    out = fused_linear_logprobs(hid, w, ids, mask=mask, token_chunk=4, vocab_chunk=9)
    assert out.shape == (B, T)
    assert torch.all(out[~keep] == 0)
    h64, w64 = leaf64(hid, w)
    ref = naive_logprobs(h64[keep], w64, ids[keep])
    torch.testing.assert_close(out[keep].double(), ref.detach(), rtol=0, atol=VALUE_TOL[dtype])
    # gradient of the masked sequence log-prob (sum over kept tokens)
    (gh, gw) = torch.autograd.grad(out.double().sum(), [hid, w])
    (rh, rw) = torch.autograd.grad(ref.sum(), [h64, w64])
    assert torch.all(gh[~keep] == 0), "skipped positions must get exactly zero gradient"
    assert_close_grad(gh[keep], rh[keep], dtype, "hidden")
    assert_close_grad(gw, rw, dtype, "weight")
    ent = fused_linear_entropy(hid, w, mask=mask, token_chunk=4, vocab_chunk=9)
    m = mask > 0
    assert torch.all(ent[~m] == 0)
    torch.testing.assert_close(ent[m].double(), naive_entropy(h64[m], w64).detach(), rtol=0, atol=VALUE_TOL[dtype])


def test_everything_masked_gives_zeros_and_zero_grads():
    hid, w, _, ids, _ = make(4, 3, 7, torch.float32, seed=51, bias=False)
    out = fused_linear_logprobs(hid, w, ids, mask=torch.zeros(4))
    assert torch.all(out == 0)
    out.sum().backward()
    assert torch.all(hid.grad == 0) and torch.all(w.grad == 0)


def test_padding_and_microbatch_invariance():
    """Appending masked padding, or scoring in two micro-batches, changes nothing (bit-for-bit
    up to float32 summation order of different tilings: 1e-6)."""
    hid, w, _, ids, _ = make(20, 8, 64, torch.float32, seed=61, bias=False)
    full = fused_linear_logprobs(hid, w, ids, token_chunk=6, vocab_chunk=16)
    halves = torch.cat(
        [
            fused_linear_logprobs(hid[:11], w, ids[:11], token_chunk=6, vocab_chunk=16),
            fused_linear_logprobs(hid[11:], w, ids[11:], token_chunk=6, vocab_chunk=16),
        ]
    )
    torch.testing.assert_close(full, halves, rtol=0, atol=1e-6)
    pad_h = torch.cat([hid, torch.randn(5, 8)])
    pad_ids = torch.cat([ids, torch.full((5,), -100)])
    padded = fused_linear_logprobs(pad_h, w, pad_ids, token_chunk=6, vocab_chunk=16)
    torch.testing.assert_close(padded[:20], full, rtol=0, atol=1e-6)
    assert torch.all(padded[20:] == 0)


def test_large_logits_are_stable():
    """Logits of magnitude ~1e4 (exp overflows float32 at 88): finite, and equal to the float64
    reference up to float32 resolution at 1e4 (ulp ~1e-3, times a few ops -> 2e-2)."""
    hid, w, b, ids, _ = make(9, 8, 30, torch.float32, seed=71, scale=3000.0)
    z = naive_logits(hid, w, b)
    assert (z.amax(1) - z.amin(1)).min() > 1000  # the test really has huge logit gaps
    for fn, ref in [
        (lambda: fused_linear_logprobs(hid, w, ids, bias=b, vocab_chunk=7), naive_logprobs(hid, w, ids, b)),
        (lambda: fused_linear_entropy(hid, w, bias=b, vocab_chunk=7), naive_entropy(hid, w, b)),
    ]:
        out = fn()
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out.double(), ref.detach(), rtol=0, atol=2e-2)
    # entropy of near-deterministic rows is >= 0 and tiny; a constant bias shift leaves it unchanged
    e = fused_linear_entropy(hid, w, bias=b, vocab_chunk=7)
    assert (e >= -1e-6).all()
    e64 = fused_linear_entropy(*leaf64(hid, w), bias=b.detach().double() + 1e4, vocab_chunk=7)
    torch.testing.assert_close(e64, naive_entropy(hid, w, b).detach(), rtol=0, atol=1e-9)


class _MaxNumel(TorchDispatchMode):
    """Records the largest tensor produced by any aten op."""

    def __init__(self):
        super().__init__()
        self.max_numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.max_numel = max(self.max_numel, t.numel())
        return out


def test_never_materializes_full_logits():
    """Forward + backward allocate nothing bigger than max(tile, weight) -- never [N, V]."""
    n, h, v, tc, vc = 256, 4, 2048, 32, 128
    hid, w, _, ids, _ = make(n, h, v, torch.float32, seed=81, bias=False)
    with _MaxNumel() as probe:
        lp, ent = fused_linear_logprobs_and_entropy(hid, w, ids, token_chunk=tc, vocab_chunk=vc)
        (lp.sum() + ent.sum()).backward()
    assert probe.max_numel <= max(tc * vc, v * h), probe.max_numel
    assert probe.max_numel < n * v // 10
    # and the probe does see a naive materialization
    with _MaxNumel() as probe2:
        naive_logprobs(hid, w, ids).sum().backward()
    assert probe2.max_numel >= n * v


def test_matches_offline_future_policy_logprobs():
    from tiltlab.objectives import offline

    B, T, h, v, lam = 2, 5, 6, 19, 1.0
    g = torch.Generator().manual_seed(91)
    ht, hr = (
        torch.randn(B, T, h, generator=g, dtype=torch.float64),
        torch.randn(B, T, h, generator=g, dtype=torch.float64),
    )
    wt, wr = torch.randn(v, h, generator=g, dtype=torch.float64), torch.randn(v, h, generator=g, dtype=torch.float64)
    ids = torch.randint(0, v, (B, T), generator=g)
    want = offline.future_policy_logprobs(ht @ wt.T, hr @ wr.T, ids, lam=lam)
    got = fused_linear_future_logprobs(ht, wt, hr, wr, ids, lam, vocab_chunk=4)
    # offline.future_policy_logprobs runs its log_softmax in float32 (z.float()), so agreement is
    # at float32 level on log-probs of size O(10): 2e-5
    torch.testing.assert_close(got, want.to(got.dtype), rtol=0, atol=2e-5)


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 12),
    v=st.integers(1, 40),
    tc=st.integers(1, 16),
    vc=st.integers(1, 48),
    temp=st.floats(0.25, 4.0),
    seed=st.integers(0, 10_000),
)
def test_property_any_tiling_matches_reference(n, v, tc, vc, temp, seed):
    hid, w, b, ids, up = make(n, 3, v, torch.float64, seed=seed)
    lp, ent = fused_linear_logprobs_and_entropy(hid, w, ids, bias=b, temperature=temp, token_chunk=tc, vocab_chunk=vc)
    h64, w64, b64 = leaf64(hid, w, b)
    torch.testing.assert_close(lp, naive_logprobs(h64, w64, ids, b64, temp).detach(), rtol=0, atol=1e-10)
    torch.testing.assert_close(ent, naive_entropy(h64, w64, b64, temp).detach(), rtol=0, atol=1e-10)
    got = grads(lp, up, [hid, w, b])
    want = grads(naive_logprobs(h64, w64, ids, b64, temp), up, [h64, w64, b64])
    for gg, ww in zip(got, want):
        torch.testing.assert_close(gg, ww, rtol=1e-9, atol=1e-10)


# ----------------------------------------------------------------------------------------------
# input validation


def test_bad_inputs_raise_value_error():
    hid, w, b, ids, _ = make(4, 3, 7, torch.float32, seed=1)
    bad = [
        lambda: fused_linear_logprobs(hid, w[:, :2], ids),  # hidden size mismatch
        lambda: fused_linear_logprobs(hid, w, ids[:3]),  # ids shape
        lambda: fused_linear_logprobs(hid, w, ids.float()),  # ids dtype
        lambda: fused_linear_logprobs(hid, w, torch.tensor([0, 1, 2, 7])),  # out of vocabulary
        lambda: fused_linear_logprobs(hid, w, torch.tensor([0, 1, 2, -5])),  # negative, not ignore_index
        lambda: fused_linear_logprobs(hid, w, ids, temperature=0.0),
        lambda: fused_linear_logprobs(hid, w, ids, temperature=float("nan")),
        lambda: fused_linear_logprobs(hid, w, ids, token_chunk=0),
        lambda: fused_linear_logprobs(hid, w, ids, vocab_chunk=2.5),
        lambda: fused_linear_logprobs(hid, w, ids, mask=torch.tensor([1.0, 0.5, 1.0, 1.0])),
        lambda: fused_linear_logprobs(hid, w, ids, mask=torch.ones(5)),
        lambda: fused_linear_logprobs(hid, w, ids, bias=b[:3]),
        lambda: fused_linear_logprobs(hid, w.double(), ids),  # dtype mismatch
        lambda: fused_linear_logprobs(hid[0], w, ids),  # rank 1 hidden
        lambda: fused_linear_future_logprobs(hid, w, hid, w, ids, -0.5),
        lambda: fused_linear_future_logprobs(hid, w, hid, w[:5], ids, 1.0),  # vocab mismatch
        lambda: fused_linear_future_logprobs(hid, w, hid[:2], w, ids, 1.0),  # token count mismatch
        lambda: fused_linear_entropy(hid, w.T),
    ]
    for i, f in enumerate(bad):
        with pytest.raises(ValueError):
            f()
            pytest.fail(f"case {i} did not raise")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_matches_reference(dtype):
    n, h, v = 300, 64, 5000
    hid, w, b, ids, up = make(n, h, v, dtype, seed=101)
    hid, w, b = [x.detach().cuda().requires_grad_() for x in (hid, w, b)]
    lp, ent = fused_linear_logprobs_and_entropy(hid, w, ids.cuda(), bias=b, token_chunk=128, vocab_chunk=1024)
    h64, w64, b64 = [x.detach().cpu().double().requires_grad_() for x in (hid, w, b)]
    ref = naive_logprobs(h64, w64, ids, b64)
    # CUDA matmuls may use TF32/bf16 tensor cores: ~1e-3 relative on logits of size O(5)
    torch.testing.assert_close(lp.cpu().double(), ref.detach(), rtol=0, atol=5e-3)
    torch.testing.assert_close(ent.cpu().double(), naive_entropy(h64, w64, b64).detach(), rtol=0, atol=5e-3)
    got = grads(lp, up.cuda(), [hid, w, b])
    want = grads(ref, up, [h64, w64, b64])
    for gg, ww in zip(got, want):
        scale = ww.abs().max().item()
        torch.testing.assert_close(gg.cpu().double(), ww, rtol=1e-2, atol=1e-2 * scale)


def test_default_tiles_match_reference():
    """The default (CPU) tile sizes, with V and N larger than one tile and not multiples of it."""
    from tiltlab.objectives.fused import DEFAULT_TOKEN_CHUNK, DEFAULT_VOCAB_CHUNK

    n, v = DEFAULT_TOKEN_CHUNK + 44, DEFAULT_VOCAB_CHUNK + 904
    hid, w, b, ids, up = make(n, 4, v, torch.float64, seed=111)
    lp = fused_linear_logprobs(hid, w, ids, bias=b)
    h64, w64, b64 = leaf64(hid, w, b)
    ref = naive_logprobs(h64, w64, ids, b64)
    torch.testing.assert_close(lp, ref.detach(), rtol=0, atol=1e-10)
    for gg, ww in zip(grads(lp, up, [hid, w, b]), grads(ref, up, [h64, w64, b64])):
        torch.testing.assert_close(gg, ww, rtol=1e-9, atol=1e-10)


def test_benchmark_script_smoke(tmp_path):
    """benchmarks/bench_fused_logprob.py runs end to end on a tiny problem and its two variants agree."""
    import json

    bench = _load_bench()
    out = tmp_path / "bench.json"
    rc = bench.main(
        [
            "--n",
            "64",
            "--vocab",
            "1000",
            "--hidden",
            "16",
            "--token-chunk",
            "16",
            "--vocab-chunk",
            "128",
            "--threads",
            "1",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    rep = json.loads(out.read_text())
    assert {r["variant"] for r in rep["results"]} == {"naive", "chunked"}
    assert rep["summary"]["max_rel_checksum_diff"] < 1e-5  # float32 sums over 64 x 16 / 1000 x 16 entries
    assert all(r["peak_bytes"] >= 0 and r["time_s"] > 0 for r in rep["results"])
    # the summary, recomputed naively from the two variants' raw results
    nv, ch = (next(r for r in rep["results"] if r["variant"] == v) for v in ("naive", "chunked"))
    s = rep["summary"]
    for key, field in (("memory_ratio", "peak_bytes"), ("time_ratio", "time_s"), ("cpu_time_ratio", "cpu_time_s")):
        assert s[key] == (ch[field] / nv[field] if nv[field] > 0 else None), key
    rel = [abs(ch["checksum"][k] - v) / abs(v) for k, v in nv["checksum"].items()]
    assert s["max_rel_checksum_diff"] == pytest.approx(max(rel), rel=1e-9, abs=1e-300)
    assert s["memory_ok"] == (None if s["memory_ratio"] is None else s["memory_ratio"] <= 0.25)
    assert s["time_ok"] == (None if s["time_ratio"] is None else s["time_ratio"] <= 1.5)
    assert out.with_suffix(".md").read_text().startswith("N = 64 tokens")


def test_benchmark_summary_has_no_ratio_where_the_naive_run_measured_zero():
    """A problem below the memory probe's resolution (the naive run's RSS grew by 0 bytes) gets no
    memory ratio and no verdict on its bound, not a ZeroDivisionError or an infinite ratio."""
    bench = _load_bench()
    assert bench._ratio(3.0, 12.0) == 0.25 and bench._ratio(3.0, 0) is None and bench._ratio(0.0, 2.0) == 0.0
    assert bench._ratio(0.5, 0.25) == 2.0  # a denominator under 1 (seconds) is a measurement, not a zero
    assert bench._fmt_bound(None, None, None) == "n/a (the naive run measured 0)"
    assert bench._fmt_bound(None, None, "<= 0.25") == "n/a (the naive run measured 0; bound <= 0.25 not judged)"
    assert bench._fmt_bound(0.3, False, "<= 0.25") == "0.300 (bound <= 0.25: NOT met)"
    assert bench._fmt_bound(0.25, True, "<= 0.25") == "0.250 (bound <= 0.25: met)"
    assert bench._fmt_bound(1.7, None, None) == "1.700"


def _variant(peak, time_s, cpu_s, logp_sum=2.0):
    return {"peak_bytes": peak, "time_s": time_s, "cpu_time_s": cpu_s, "checksum": {"logp_sum": logp_sum, "g": -4.0}}


@pytest.mark.parametrize(
    ("chunked", "want"),
    [
        (_variant(25, 1.5, 3.0), dict(memory_ratio=0.25, memory_ok=True, time_ratio=1.5, time_ok=True, cpu=1.5)),
        (_variant(26, 1.51, 1.0), dict(memory_ratio=0.26, memory_ok=False, time_ratio=1.51, time_ok=False, cpu=0.5)),
    ],
)
def test_benchmark_summary_bounds_at_their_edges(chunked, want):
    """The memory bound 0.25 and the wall-time bound 1.5 are inclusive; the checksum difference is the
    largest relative one over the checksum fields (pinned against a naive computation)."""
    bench = _load_bench()
    naive = _variant(100, 1.0, 2.0, logp_sum=2.5)
    s = bench._summary(naive, chunked)
    assert s["memory_ratio"] == pytest.approx(want["memory_ratio"]) and s["memory_ok"] is want["memory_ok"]
    assert s["time_ratio"] == pytest.approx(want["time_ratio"]) and s["time_ok"] is want["time_ok"]
    assert s["cpu_time_ratio"] == pytest.approx(want["cpu"])
    assert s["max_rel_checksum_diff"] == pytest.approx(max(abs(2.0 - 2.5) / 2.5, 0.0))
    z = bench._summary(_variant(0, 0.0, 0.0), chunked)  # a naive run that measured nothing: no ratios
    assert (z["memory_ratio"], z["memory_ok"], z["time_ratio"], z["time_ok"], z["cpu_time_ratio"]) == (None,) * 5
    md = bench._markdown({"config": dict(n=1, vocab=2, hidden=3, dtype="float32", device="cpu", threads=1,
                                         token_chunk=4, vocab_chunk=5, loadavg_start=None),
                          "results": [dict(naive, variant="naive"), dict(chunked, variant="chunked")], "summary": s})  # fmt: skip
    assert f"(bound <= 0.25: {'met' if want['memory_ok'] else 'NOT met'})" in md
    assert f"(bound <= 1.5: {'met' if want['time_ok'] else 'NOT met'})" in md


def _load_bench():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_fused_logprob.py"
    spec = importlib.util.spec_from_file_location("bench_fused_logprob", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench
