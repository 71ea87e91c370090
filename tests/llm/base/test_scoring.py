"""Teacher-forced scoring through the fused path equals the naive ``model(...).logits`` path."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tiltlab.llm.base.scoring import build_batch, score_completions, score_future_completions, token_logprobs_padded  # noqa: E402

pytestmark = pytest.mark.llm


def _rows(tok, n=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts = ["1+2=", "Compute 13*7. Put the answer in \\boxed{}.", "x", "what is 4-9?", "17+25"][:n]
    pids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    v = len(tok)
    cids = [torch.randint(0, v, (int(L),), generator=g).tolist() for L in torch.randint(1, 9, (n,), generator=g)]
    return pids, cids


def naive_scores(model, pids, cids, future_of=None, lam=0.0):
    """One row at a time, full float64 logits: log_softmax + gather (and entropy)."""
    lps, ents = [], []
    for p, c in zip(pids, cids):
        ids = torch.tensor([list(p) + list(c)])
        with torch.no_grad():
            z = model(input_ids=ids).logits[0].double()
            if future_of is not None:
                z = (1 + lam) * z - lam * future_of(input_ids=ids).logits[0].double()
        lp = torch.log_softmax(z, -1)
        rows = range(len(p) - 1, len(p) + len(c) - 1)
        lps.append(torch.stack([lp[r, c[j]] for j, r in enumerate(rows)]))
        ents.append(torch.stack([-(lp[r].exp() * lp[r]).sum() for r in rows]))
    return lps, ents


@pytest.mark.parametrize("padding_side,batch_size", [("right", 2), ("left", 5), ("right", 1)])
def test_score_matches_naive(tiny_model, tiny_tokenizer, padding_side, batch_size):
    pids, cids = _rows(tiny_tokenizer)
    out = score_completions(
        tiny_model,
        pids,
        cids,
        pad_token_id=tiny_tokenizer.pad_token_id,
        batch_size=batch_size,
        padding_side=padding_side,
        entropy=True,
    )
    ref_lp, ref_ent = naive_scores(tiny_model, pids, cids)
    assert out.token_logprobs.shape == out.mask.shape == (len(cids), max(map(len, cids)))
    for b, c in enumerate(cids):
        n = len(c)
        assert out.mask[b, :n].eq(1).all() and out.mask[b, n:].eq(0).all()
        assert out.token_logprobs[b, n:].eq(0).all()
        # fp32 model under a float64 reference: ~1e-6 relative; padding changes fp32 rounding only
        assert torch.allclose(out.token_logprobs[b, :n].double(), ref_lp[b], atol=5e-5, rtol=1e-5)
        assert torch.allclose(out.entropy[b, :n].double(), ref_ent[b], atol=5e-5, rtol=1e-5)
        assert abs(float(out.seq_logprobs[b]) - float(ref_lp[b].sum())) < 5e-4


def test_left_and_right_padding_agree(tiny_model, tiny_tokenizer):
    pids, cids = _rows(tiny_tokenizer, seed=4)
    pad = tiny_tokenizer.pad_token_id
    a = score_completions(tiny_model, pids, cids, pad_token_id=pad, padding_side="left", batch_size=5)
    b = score_completions(tiny_model, pids, cids, pad_token_id=pad, padding_side="right", batch_size=5)
    assert torch.allclose(a.token_logprobs, b.token_logprobs, atol=2e-5)  # fp32 rounding of padded matmuls


def test_gradients_match_naive(tiny_model, tiny_tokenizer):
    m1 = copy.deepcopy(tiny_model).double()
    m2 = copy.deepcopy(tiny_model).double()
    pids, cids = _rows(tiny_tokenizer, n=3, seed=2)
    out = score_completions(m1, pids, cids, pad_token_id=tiny_tokenizer.pad_token_id, batch_size=2, grad=True)
    weights = torch.tensor([0.3, -1.0, 2.0], dtype=torch.float64)
    (out.seq_logprobs.double() * weights).sum().backward()
    loss = 0.0
    for w, p, c in zip(weights, pids, cids):
        ids = torch.tensor([list(p) + list(c)])
        lp = torch.log_softmax(m2(input_ids=ids).logits[0], -1)
        loss = loss + w * sum(lp[len(p) - 1 + j, t] for j, t in enumerate(c))
    loss.backward()
    for (n1, p1), (_, p2) in zip(m1.named_parameters(), m2.named_parameters()):
        assert p1.grad is not None, n1
        # float64 end to end: agreement to rounding
        assert torch.allclose(p1.grad, p2.grad, atol=1e-9, rtol=1e-7), n1


def test_future_logprobs_match_naive(tiny_model, tiny_tokenizer):
    from tiltlab.llm.base.models import build_tiny

    ref_model, _ = build_tiny(seed=1)
    pids, cids = _rows(tiny_tokenizer, n=4, seed=3)
    lam = 0.7
    out = score_future_completions(
        tiny_model, ref_model, pids, cids, lam, pad_token_id=tiny_tokenizer.pad_token_id, batch_size=3
    )
    ref_lp, _ = naive_scores(tiny_model, pids, cids, future_of=ref_model, lam=lam)
    for b, c in enumerate(cids):
        assert torch.allclose(out.token_logprobs[b, : len(c)].double(), ref_lp[b], atol=1e-4, rtol=1e-5)  # fp32
    plain = score_completions(tiny_model, pids, cids, pad_token_id=tiny_tokenizer.pad_token_id)
    zero = score_future_completions(tiny_model, ref_model, pids, cids, 0.0, pad_token_id=tiny_tokenizer.pad_token_id)
    assert torch.allclose(zero.token_logprobs, plain.token_logprobs, atol=1e-5)  # lam=0 is the plain policy


def test_bad_inputs(tiny_model, tiny_tokenizer):
    with pytest.raises(ValueError):
        build_batch([[]], [[1]], 0)
    with pytest.raises(ValueError):
        build_batch([[1]], [[1], [2]], 0)
    ids, attn, tgt, _ = build_batch([[5, 6]], [[7]], 0)
    tgt[0, 0] = 1.0
    with pytest.raises(ValueError):
        token_logprobs_padded(tiny_model, ids, attn, tgt)


def test_future_logprobs_in_float64_match_naive_to_rounding(tiny_model, tiny_tokenizer):
    """Away from the float32 default: float64 models give float64 future log-probs, equal to the naive
    float64 reference to rounding (a float32 buffer anywhere on the way would cost ~1e-7)."""
    from tiltlab.llm.base.models import build_tiny

    theta = copy.deepcopy(tiny_model).double()
    ref_model = build_tiny(seed=1)[0].double()
    pids, cids = _rows(tiny_tokenizer, n=4, seed=3)
    out = score_future_completions(
        theta, ref_model, pids, cids, 0.7, pad_token_id=tiny_tokenizer.pad_token_id, batch_size=3
    )
    ref_lp, _ = naive_scores(theta, pids, cids, future_of=ref_model, lam=0.7)
    assert out.token_logprobs.dtype == torch.float64
    for b, c in enumerate(cids):
        assert torch.allclose(out.token_logprobs[b, : len(c)], ref_lp[b], atol=1e-10, rtol=0)
