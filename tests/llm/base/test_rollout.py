"""Rollout engines: processed log-probs, sampling distribution, stopping, reproducibility."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tiltlab.llm.base.rollout import HFEngine, SamplingConfig, VLLMEngine, processed_logprobs  # noqa: E402

pytestmark = pytest.mark.llm


def naive_processed(logits_row, temperature, top_k, top_p):
    """Independent reference: Python lists, float64, written from the sampler definitions."""
    z = [float(v) / temperature for v in logits_row]
    keep = set(range(len(z)))
    if top_k:
        kth = sorted(z, reverse=True)[top_k - 1]
        keep = {i for i in keep if z[i] >= kth}
    if top_p < 1.0:
        m = max(z[i] for i in keep)
        tot = sum(math.exp(z[i] - m) for i in keep)
        order = sorted(keep, key=lambda i: -z[i])
        kept, above = set(), 0.0
        for i in order:
            if above < top_p:  # keep while the mass of strictly more likely tokens is below top_p
                kept.add(i)
            above += math.exp(z[i] - m) / tot
        keep = kept
    m = max(z[i] for i in keep)
    lse = m + math.log(sum(math.exp(z[i] - m) for i in keep))
    return [z[i] - lse if i in keep else -math.inf for i in range(len(z))]


@pytest.mark.parametrize("t,k,p", [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.6), (0.9, 8, 0.8)])
def test_processed_logprobs_matches_naive(t, k, p):
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 37, generator=g, dtype=torch.float64) * 2
    got = processed_logprobs(logits, t, k, p)
    for b in range(4):
        ref = torch.tensor(naive_processed(logits[b].tolist(), t, k, p), dtype=torch.float64)
        assert torch.equal(torch.isinf(got[b]), torch.isinf(ref))
        fin = torch.isfinite(ref)
        # float64 throughout: differences are rounding only
        assert torch.allclose(got[b][fin], ref[fin], atol=1e-12, rtol=0)


def test_greedy_is_point_mass():
    logits = torch.tensor([[0.1, 2.0, -1.0]])
    lp = processed_logprobs(logits, 0.0)
    assert lp[0, 1] == 0 and torch.isinf(lp[0, [0, 2]]).all()


def test_sampling_config_validation():
    with pytest.raises(ValueError):
        SamplingConfig(top_p=0.0)
    with pytest.raises(ValueError):
        SamplingConfig(top_k=-1)
    with pytest.raises(ValueError):
        SamplingConfig(temperature=-1)
    assert SamplingConfig(top_k=5).truncates_support and SamplingConfig(top_p=0.9).truncates_support
    assert not SamplingConfig(temperature=0.5).truncates_support


def _teacher_forced_processed(model, prompt_ids, comp, s: SamplingConfig):
    """log q(y_t | x, y_<t) recomputed by a full forward (no KV cache) + the naive processor."""
    ids = torch.tensor([list(prompt_ids) + list(comp)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].double()  # [L, V]
    out = []
    for t, tok in enumerate(comp):
        row = logits[len(prompt_ids) + t - 1].tolist()
        out.append(naive_processed(row, s.temperature, s.top_k, s.top_p)[tok])
    return out


@pytest.mark.parametrize(
    "s",
    [
        SamplingConfig(temperature=0.7, top_k=20, max_new_tokens=12, seed=1),
        SamplingConfig(temperature=1.3, top_p=0.85, max_new_tokens=12, seed=2),
        SamplingConfig(temperature=1.0, max_new_tokens=12, seed=3),
    ],
)
def test_hf_engine_logprobs_are_processed(tiny_model, tiny_tokenizer, math_rows, s):
    eng = HFEngine(tiny_model, tiny_tokenizer, batch_size=5)  # 3 prompts x 3 samples: ragged batches
    groups = eng.generate([r["prompt"] for r in math_rows[:3]], 3, s)
    assert len(groups) == 3
    for g in groups:
        assert len(g.completion_ids) == len(g.token_logprobs) == len(g.texts) == 3
        for comp, lps in zip(g.completion_ids, g.token_logprobs):
            assert len(comp) == len(lps) >= 1
            ref = _teacher_forced_processed(tiny_model, g.prompt_ids, comp, s)
            assert all(math.isfinite(v) for v in ref), "sampled a token outside the processed support"
            # fp32 model, KV-cache vs full forward: agreement to ~1e-5 per token
            assert max(abs(a - b) for a, b in zip(lps, ref)) < 2e-4
        seq = g.seq_logprobs()
        assert torch.allclose(seq, torch.tensor([sum(x) for x in g.token_logprobs], dtype=torch.float64))


def test_hf_engine_one_token_frequencies(tiny_model, tiny_tokenizer):
    """Empirical one-token frequencies match the exact processed distribution (k*sigma/sqrt(n))."""
    s = SamplingConfig(temperature=1.5, top_k=40, max_new_tokens=1, seed=11)
    prompt = "Compute 7+5. Put the answer in \\boxed{}."
    n = 4000
    eng = HFEngine(tiny_model, tiny_tokenizer, batch_size=1000)
    g = eng.generate([prompt], n, s)[0]
    ids = torch.tensor([g.prompt_ids])
    with torch.no_grad():
        logits = tiny_model(input_ids=ids).logits[0, -1].double()
    exact = torch.tensor(naive_processed(logits.tolist(), s.temperature, s.top_k, s.top_p)).exp()
    counts = torch.bincount(torch.tensor([c[0] for c in g.completion_ids]), minlength=exact.numel()).double()
    assert counts[exact == 0].sum() == 0, "a token outside top-k was sampled"
    top = exact.argsort(descending=True)[:5]
    for v in top:
        p = float(exact[v])
        sd = math.sqrt(p * (1 - p) / n)
        assert abs(float(counts[v]) / n - p) < 4.5 * sd  # 4.5 sigma, 5 tokens, fixed seed
    # and the returned log-probs are exactly log q of the sampled token
    for c, lp in zip(g.completion_ids[:50], g.token_logprobs[:50]):
        assert abs(lp[0] - math.log(float(exact[c[0]]))) < 1e-4


def test_hf_engine_stopping_and_reproducibility(tiny_model, tiny_tokenizer):
    stops = list(range(0, len(tiny_tokenizer), 7))  # ~14% of the vocabulary ends a completion
    eng = HFEngine(tiny_model, tiny_tokenizer, batch_size=8, stop_token_ids=stops)
    s = SamplingConfig(temperature=1.0, max_new_tokens=10, seed=5)
    a = eng.generate(["1+1=", "2*3="], 6, s)
    n_finished = 0
    for g in a:
        for comp, fin in zip(g.completion_ids, g.finished):
            assert all(t not in stops for t in comp[:-1]), "a token after a stop token"
            if fin:
                n_finished += 1
                assert comp[-1] in stops
            else:
                assert len(comp) == s.max_new_tokens and comp[-1] not in stops
    assert n_finished > 0
    b = eng.generate(["1+1=", "2*3="], 6, s)
    assert [g.completion_ids for g in a] == [g.completion_ids for g in b]
    c = eng.generate(["1+1=", "2*3="], 6, SamplingConfig(temperature=1.0, max_new_tokens=10, seed=6))
    assert [g.completion_ids for g in a] != [g.completion_ids for g in c]


def test_engine_input_validation(tiny_model, tiny_tokenizer):
    eng = HFEngine(tiny_model, tiny_tokenizer)
    with pytest.raises(ValueError):
        eng.generate("a single string", 2, SamplingConfig())
    with pytest.raises(ValueError):
        eng.generate(["x"], 0, SamplingConfig())


def test_vllm_missing_gives_clear_error():
    try:
        import vllm  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="tiltlab\\[vllm\\]"):
            VLLMEngine("unused")
    else:
        pytest.skip("vllm is installed")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")  # before the fixtures are built
def test_vllm_engine_processed_logprobs(tiny_dir, tiny_model):
    """On a GPU with vLLM: sampled log-probs equal teacher-forced processed log-probs."""
    pytest.importorskip("vllm")
    eng = VLLMEngine(str(tiny_dir), dtype="float32", gpu_memory_utilization=0.3, enforce_eager=True)
    for s in (
        SamplingConfig(temperature=0.8, top_k=20, max_new_tokens=8, seed=1),
        SamplingConfig(temperature=1.2, top_p=0.9, max_new_tokens=8, seed=2),
    ):
        groups = eng.generate(["1+1=", "Compute 3*4."], 4, s)
        for g in groups:
            assert len(g) == 4 and len(set(map(tuple, g.completion_ids))) > 1
            for comp, lps in zip(g.completion_ids, g.token_logprobs):
                ref = _teacher_forced_processed(tiny_model.cpu(), g.prompt_ids, comp, s)
                assert max(abs(a - b) for a, b in zip(lps, ref)) < 1e-3  # fp32 GPU kernels vs CPU


@pytest.mark.parametrize(
    ("dtype", "on_gpu", "want"),
    [("auto", False, "float32"), ("auto", True, "auto"), ("bf16", False, "bfloat16"), ("fp32", True, "float32"),
     ("float16", False, "float16")],
)  # fmt: skip
def test_vllm_dtype_auto_is_float32_on_cpu(dtype, on_gpu, want):
    """``auto`` on CPU would take the checkpoint's bfloat16, 5-10x slower than float32 on AVX2 (the
    Stage-1 real-model check ran over 40 minutes for one batch it ran in minutes in float32)."""
    from tiltlab.llm.base.rollout import vllm_dtype

    assert vllm_dtype(dtype, on_gpu) == want
