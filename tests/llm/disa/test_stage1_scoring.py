"""How Stage 1 scores pi_ref (``Stage1Config.reference_scoring``), on the transformers engine.

* which path ``"auto"`` picks, and the refusal of ``"sampler"`` wherever the sampled log-probs are not
  pi_ref's (no model needed);
* the one-pass "sampler" path (proposal == reference, T = 1, untruncated) gives the labels of the
  two-pass "hf" path (teacher forcing) on the tiny model, and records which path ran.

The vLLM paths are tested in ``test_stage1_vllm.py`` (tiny models) and ``test_stage1_scoring_vllm.py``
(SmolLM2-135M).
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("pyarrow")

from tiltlab.llm.disa.stage1 import (  # noqa: E402
    MANIFEST,
    Stage1Config,
    load_stage1,
    resolve_reference_scoring,
    run_stage1,
    sampler_not_reference,
)

pytestmark = pytest.mark.llm


def first_token_reward(prompts, completions, completion_ids=None, **kwargs):
    """Reward 1 iff the first completion token id is even (about half the samples)."""
    return [1.0 if ids and ids[0] % 2 == 0 else 0.0 for ids in completion_ids]


def _cfg(model, out, **kw):
    base = dict(proposal=str(model), reference=str(model), dataset="inline", out_dir=str(out), device="cpu")
    return Stage1Config(**{**base, **kw})


def test_auto_picks_the_sampler_only_where_its_log_probs_are_pi_ref(tmp_path):
    m = str(tmp_path / "m")  # never loaded
    assert sampler_not_reference(_cfg(m, tmp_path)) is None
    assert resolve_reference_scoring(_cfg(m, tmp_path)) == "sampler"
    assert resolve_reference_scoring(_cfg(m, tmp_path, engine="vllm")) == "sampler"
    not_ref = {
        "different models": dict(reference=str(tmp_path / "other")),
        "temperature": dict(temperature=0.7),
        "temperature above 1": dict(temperature=1.3),
        "top_p": dict(top_p=0.9, allow_truncated=True),
        "top_k": dict(top_k=5, allow_truncated=True),
        "retokenize": dict(tokenizer="retokenize"),
        "quantized": dict(engine="vllm", quantization="fp8"),
    }
    for name, kw in not_ref.items():
        cfg = _cfg(m, tmp_path, **kw)
        assert sampler_not_reference(cfg) is not None, name
        assert resolve_reference_scoring(cfg) == "hf", name  # hf engine: transformers scores
        with pytest.raises(ValueError, match=r"^reference_scoring='sampler' needs") as e:
            _cfg(m, tmp_path, reference_scoring="sampler", **kw)
        assert "\n" not in str(e.value)
    # explicit choices are kept; "tiny" cannot run on vLLM, so auto falls back to transformers
    assert resolve_reference_scoring(_cfg(m, tmp_path, reference_scoring="hf")) == "hf"
    assert resolve_reference_scoring(_cfg(m, tmp_path, reference_scoring="vllm")) == "vllm"
    assert resolve_reference_scoring(_cfg("tiny", tmp_path, reference="tiny:1", engine="vllm")) == "hf"
    # a reference vLLM can serve here: a second engine only when the proposal runs on vLLM too
    from tiltlab.llm.base.rollout import vllm_available

    served = tmp_path / "served"
    served.mkdir()
    (served / "config.json").write_text(json.dumps({"head_dim": 64}))
    want = "vllm" if vllm_available() else "hf"
    assert resolve_reference_scoring(_cfg(m, tmp_path, reference=str(served), engine="vllm")) == want
    assert resolve_reference_scoring(_cfg(m, tmp_path, reference=str(served), engine="hf")) == "hf"
    assert resolve_reference_scoring(_cfg(str(served), tmp_path, engine="vllm", temperature=0.5)) == want
    with pytest.raises(ValueError, match=r"^reference_scoring must be one of"):
        _cfg(m, tmp_path, reference_scoring="engine")


def test_sampler_path_equals_teacher_forcing_on_tiny(tiny_dir, math_rows, tmp_path):
    """Proposal == reference at T = 1, untruncated: one pass ("sampler": logp_ref is the sampled
    log-prob) and two passes ("hf": transformers teacher forcing) on the same seeds give the same
    samples, and logp_ref, log_w and every label agree. Both are the same fp32 model; they differ only
    in how the logits are computed -- incremental decoding with a KV cache over a left-padded batch
    vs one teacher-forced forward over a right-padded batch -- i.e. float32 rounding of O(10)-sized
    logits (measured: at most 6.4e-7 per token, half the sequences bit-equal). 1e-5 per token bounds
    that with room and is far below any label effect (the beta r term moves log w by 2)."""
    rows = [{"id": r["id"], "prompt": r["prompt"]} for r in math_rows[:3]]
    runs = {}
    for mode in ("auto", "hf"):
        cfg = _cfg(
            tiny_dir, tmp_path / mode, M=4, max_new_tokens=6, seed=3, tilt_beta=2.0, prompts_per_shard=2,
            reference_scoring=mode,
        )  # fmt: skip
        run_stage1(cfg, rows=rows, reward_fn=first_token_reward, progress=False)
        runs[mode] = [t.to_pydict() for t in load_stage1(cfg.out_dir)]
        man = json.loads((tmp_path / mode / MANIFEST).read_text())
        want = "sampler" if mode == "auto" else "hf"
        assert man["reference_scoring"] == want
        assert [s["reference_scoring"]["path"] for s in man["shards"].values()] == [want, want]
    (s1, l1), (s2, l2) = runs["auto"], runs["hf"]
    assert s1["completion_ids"] == s2["completion_ids"] and s1["reward"] == s2["reward"]
    assert s1["logp_ref"] == s1["logp_proposal"]  # the one-pass path: exactly the sampled log-probs
    n_tok = torch.tensor(s1["n_tokens"], dtype=torch.float64)
    assert int(n_tok.sum()) >= 3 * 4 * 3  # multi-token completions
    tol = 1e-5 * n_tok
    for col in ("logp_ref", "log_w"):
        d = (torch.tensor(s1[col]) - torch.tensor(s2[col])).abs()
        assert bool((d <= tol).all()), (col, float(d.max()))
    assert 0 < sum(s1["reward_raw"]) < len(s1["reward_raw"])  # the labels carry reward, not only log-probs
    for col in ("log_z", "log_z_bias_corrected", "log_z_geomean", "ess", "max_weight"):
        d = (torch.tensor(l1[col]) - torch.tensor(l2[col])).abs()
        assert float(d.max()) < 1e-5 * 6 * 4, col  # at most the tolerance of one max-length log w, times M


def test_sampler_path_loads_no_reference_model(tiny_dir, math_rows, tmp_path, monkeypatch):
    """The one-pass path does no teacher forcing at all (with the hf engine the proposal's model is the
    only one loaded); the two-pass path does."""
    import tiltlab.llm.disa.stage1.pipeline as s1  # the module whose run looks the scorer up

    calls = []
    real = s1._hf_reference_logprobs
    monkeypatch.setattr(s1, "_hf_reference_logprobs", lambda *a: calls.append(1) or real(*a))
    rows = [{"id": r["id"], "prompt": r["prompt"]} for r in math_rows[:2]]
    run_stage1(_cfg(tiny_dir, tmp_path / "a", M=2, max_new_tokens=3), rows=rows, reward_fn=first_token_reward)
    assert calls == []
    run_stage1(
        _cfg(tiny_dir, tmp_path / "b", M=2, max_new_tokens=3, temperature=0.8), rows=rows, reward_fn=first_token_reward
    )
    assert calls == [1]


class _FakeLLM:
    """Stands in for ``vllm.LLM`` in :func:`_vllm_reference_logprobs`: the log-prob of token ``t`` at
    position ``j`` is ``-(t + j / 100)``; positions inside a cache hit hold garbage (+7, never a
    log-prob), as vLLM leaves them unset. ``hits[i]`` = cached tokens of request ``i`` when it reads the
    cache."""

    def __init__(self, hits):
        self.hits, self.calls = hits, []

    def generate(self, requests, params, use_tqdm=False):
        from types import SimpleNamespace as NS

        self.calls.append((len(requests), params.skip_reading_prefix_cache, {r["cache_salt"] for r in requests}))
        outs = []
        for r in requests:
            ids = r["prompt_token_ids"]
            i = self.index[tuple(ids)]
            cached = 0 if params.skip_reading_prefix_cache else self.hits[i]
            lps = [None] + [{t: NS(logprob=7.0 if j <= cached else -(t + j / 100))} for j, t in enumerate(ids) if j > 0]
            outs.append(NS(prompt_logprobs=lps, num_cached_tokens=cached))
        return outs


def test_prefix_cached_scoring_reads_only_computed_positions():
    """A request is kept when its cache hit ends at or before the prompt's last token (the completion's
    first token is predicted from there); one hit that reaches the prompt's end or beyond is scored
    again without the cache. A prompt's first request runs alone before its others; every request
    shares one salt; the tokens read from the cache are counted."""
    pytest.importorskip("vllm")
    from types import SimpleNamespace as NS

    from tiltlab.llm.disa.stage1 import SCORE_CACHE_SALT, _vllm_reference_logprobs

    p = [5, 6, 7, 8]  # 4 prompt tokens
    comps = [[1, 2], [3], [4, 4, 4], [2, 9]]
    hits = [0, 3, 4, 5]  # 3 = len(p) - 1: fine; 4 and 5 cover the position that predicts c[0]
    llm = _FakeLLM(hits)
    llm.index = {tuple(p + c): i for i, c in enumerate(comps)}
    seq, n_rescored, n_cached = _vllm_reference_logprobs(NS(llm=llm), [p] * 4, comps, torch)
    want = [sum(-(t + (len(p) + k) / 100) for k, t in enumerate(c)) for c in comps]
    assert seq.dtype == torch.float64 and torch.allclose(seq, torch.tensor(want, dtype=torch.float64), atol=1e-12)
    assert n_rescored == 2 and n_cached == 0 + 3
    # the prompt's first request, then the others (reading its blocks), then the two rescored
    assert llm.calls == [(1, False, {SCORE_CACHE_SALT}), (3, False, {SCORE_CACHE_SALT}), (2, True, {SCORE_CACHE_SALT})]
