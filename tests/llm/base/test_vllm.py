"""vLLM on CPU (``pytest -m vllm``; skipped where vLLM is not importable).

One module-scoped :class:`~tiltlab.llm.base.rollout.VLLMEngine` on a tiny Qwen3 (``build_tiny(head_dim=32)``:
vLLM's CPU attention kernel has no head size 16, the tiny model's default) serves the engine, log-prob
and eval tests, so the engine starts once (~25 s eager). The TRL colocate runs start their own
in-process engine in a subprocess (``_vllm_colocate_worker.py``), built the way ``tiltlab llm train``
builds it on CPU (no test-only wrapper).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
try:  # a broken install (e.g. mismatched torchvision) fails at import: skip, do not error
    import vllm  # noqa: F401
except Exception as e:  # pragma: no cover - depends on the machine
    pytest.skip(f"vLLM is not importable: {e}", allow_module_level=True)

from tiltlab.llm.base.rollout import SamplingConfig, VLLMEngine, processed_logprobs, resolve_engine

pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parents[3]
PROMPTS = ["12 + 7 =", "Write a function that adds two numbers.", "3 * 4 ="]


@pytest.fixture(scope="module")
def vllm_tiny_dir(tmp_path_factory):
    from tiltlab.llm.base.models import build_tiny

    out = tmp_path_factory.mktemp("tiny_qwen3_hd32")
    build_tiny(out_dir=out, seed=0, head_dim=32)
    return out


@pytest.fixture(scope="module")
def engine(vllm_tiny_dir):
    eng = VLLMEngine(str(vllm_tiny_dir), dtype="float32", max_model_len=256, kv_cache_memory_bytes=32 << 20)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def hf_model(vllm_tiny_dir):
    from tiltlab.llm.base.models import load_model

    return load_model(vllm_tiny_dir, device="cpu")


def test_engine_cpu_defaults_and_generation(engine):
    # no CUDA: eager mode by default, KV cache sized in bytes (not a fraction of the node's memory)
    assert engine.device == "cpu" and engine.llm.llm_engine.model_config.enforce_eager is True
    s = SamplingConfig(temperature=1.0, max_new_tokens=12, seed=3)
    groups = engine.generate(PROMPTS, n=4, sampling=s)
    assert len(groups) == len(PROMPTS)
    eos = engine.tokenizer.eos_token_id
    for g, p in zip(groups, PROMPTS):
        assert g.prompt == p and g.prompt_ids == engine.tokenizer(p, add_special_tokens=False)["input_ids"]
        assert len(g) == 4 and len(g.texts) == 4 and len(g.finished) == 4
        for ids, lps, done in zip(g.completion_ids, g.token_logprobs, g.finished):
            assert 1 <= len(ids) <= 12 and len(lps) == len(ids)
            assert all(math.isfinite(x) and x <= 0.0 for x in lps)
            if done:  # a finished completion ends on its end-of-turn token, an unfinished one at the limit
                assert ids[-1] == eos and eos not in ids[:-1]
            else:
                assert len(ids) == 12 and eos not in ids
    # seeded: the same call reproduces every sample; another seed changes them; the n samples differ
    again = engine.generate(PROMPTS, n=4, sampling=s)
    assert [g.completion_ids for g in again] == [g.completion_ids for g in groups]
    other = engine.generate(PROMPTS, n=4, sampling=SamplingConfig(temperature=1.0, max_new_tokens=12, seed=4))
    assert [g.completion_ids for g in other] != [g.completion_ids for g in groups]
    assert len({tuple(c) for c in groups[0].completion_ids}) > 1


def _teacher_forced(model, prompt_ids, completion_ids, s: SamplingConfig) -> list[float]:
    """Processed log-probs (temperature / top-k / top-p) of the completion tokens under transformers."""
    ids = torch.tensor([prompt_ids + completion_ids[:-1]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 :]  # [T, V]
    logp = processed_logprobs(logits, s.temperature, s.top_k, s.top_p)
    return logp.gather(-1, torch.tensor(completion_ids)[:, None]).squeeze(-1).double().tolist()


@pytest.mark.parametrize("temperature,top_k", [(1.0, 0), (0.5, 20)])
def test_processed_logprobs_match_transformers(engine, hf_model, temperature, top_k):
    # Both sides run the same fp32 weights: the only differences are kernel summation orders
    # (oneDNN vs ATen GEMMs, vLLM's CPU attention), ~1e-5 in a log-prob; TOL = 1e-3 is 100x that and
    # far below the spread of the log-probs being compared (the first check) and below the gap
    # between the processed and the raw (T = 1, untruncated) distribution (the last check).
    TOL = 1e-3
    s = SamplingConfig(temperature=temperature, top_k=top_k, max_new_tokens=10, seed=11)
    groups = engine.generate(PROMPTS, n=3, sampling=s)
    got, ref, raw = [], [], []
    for g in groups:
        for ids, lps in zip(g.completion_ids, g.token_logprobs):
            got += lps
            ref += _teacher_forced(hf_model, g.prompt_ids, ids, s)
            raw += _teacher_forced(hf_model, g.prompt_ids, ids, SamplingConfig())
    got_t, ref_t, raw_t = map(lambda x: torch.tensor(x, dtype=torch.float64), (got, ref, raw))
    assert got_t.numel() >= 20 and (got_t.max() - got_t.min()) > 50 * TOL
    assert (got_t - ref_t).abs().max() < TOL
    if temperature != 1.0:
        assert (got_t - raw_t).abs().max() > 50 * TOL  # vLLM returned processed, not raw, log-probs


def test_auto_engine_picks_vllm_where_it_can(vllm_tiny_dir, tiny_dir):
    assert resolve_engine("auto", str(vllm_tiny_dir)) == "vllm"
    assert resolve_engine("auto", str(tiny_dir)) == "hf"  # head_dim 16: no CPU attention kernel
    assert resolve_engine("auto", "tiny") == "hf"  # built in memory, nothing for vLLM to load
    assert resolve_engine("hf", str(vllm_tiny_dir)) == "hf"
    with pytest.raises(ValueError, match="head_dim 16"):
        VLLMEngine(str(tiny_dir))


def test_eval_cli_engine_vllm(engine, vllm_tiny_dir, tmp_path, monkeypatch, capsys):
    # `tiltlab llm eval --engine vllm` builds a VLLMEngine for --model; the module's engine stands in
    # for the new one (same class and weights) so the CLI test does not start a second engine.
    from tiltlab import cli
    from tiltlab.llm.base import rollout

    built = []

    def fake_vllm_engine(model, **kw):
        built.append((model, kw))
        return engine

    monkeypatch.setattr(rollout, "VLLMEngine", fake_vllm_engine)
    out = tmp_path / "eval"
    argv = ["llm", "eval", "--model", str(vllm_tiny_dir), "--engine", "vllm", "--datasets", "synthetic:math:4"]
    argv += ["--k", "3", "--pass-ks", "1", "3", "--max-new-tokens", "8", "--limit", "4", "--out-dir", str(out)]
    argv += ["--dtype", "float32"]
    assert cli.main(argv) == 0
    assert built == [(str(vllm_tiny_dir), {"dtype": "float32"})]  # the engine gets the model and --dtype
    assert "engine vllm" in capsys.readouterr().err
    res = json.loads((out / "results.json").read_text())["results"]["synthetic:math:4"]
    assert res["n_prompts"] == 4 and res["k"] == 3
    assert 0 < res["mean_completion_tokens"] <= 8 and 0.0 <= res["finished_frac"] <= 1.0
    rows = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(len(r["completions"]) == 3 for r in rows)


def _colocate(objective: str, tiny: Path, tmp_path: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    out = tmp_path / objective
    cmd = [
        sys.executable,
        str(ROOT / "tests" / "llm" / "train" / "_vllm_colocate_worker.py"),
        str(tiny),
        str(out),
        objective,
    ]
    res = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    return json.loads((out / "report.json").read_text())


def _check_colocate(rep: dict, objective: str) -> None:
    # the trainer itself built TRL's engine with CPU settings (no wrapper in the worker), in the policy's
    # dtype, and put TRL's LLM constructor back afterwards
    assert rep["enforce_eager"] is True and rep["chunked_prefill"] is False and rep["dtype"] == "torch.float32"
    assert rep["kv_cache_memory_bytes"] == 32 << 20 and rep["llm_restored"]
    assert rep["steps"] == 2 and all(math.isfinite(x) for x in rep["losses"]) and len(rep["losses"]) == 2
    # the weights vLLM generated the second step with are the trained policy's, not the initial ones
    assert rep["vllm_matches_policy"] and rep["policy_changed"]
    # the sync resets vLLM's prefix cache: caching is on (a repeated long prompt reads its cached blocks),
    # yet after pushing new weights the same prompt is scored with them, no stale block read
    assert rep["prefix_caching"] and rep["long_prompt_tokens"] > rep["block_size"]
    assert rep["cached_tokens_repeat"] >= rep["block_size"]
    assert rep["long_before_sync_diff_initial"] < 1e-4 and rep["long_after_sync_diff_trained"] < 1e-4, rep
    assert rep["long_after_sync_diff_initial"] > 1e-1  # the two weight sets really score differently
    assert rep["cached_tokens_after_sync"] == 0
    if objective == "flowrl":
        assert rep["head_params"] > 0 and rep["head_in_checkpoint"] and rep["head_restored"]


def test_trl_colocate_flowrl_trains_and_keeps_head_out_of_vllm(vllm_tiny_dir, tmp_path):
    # before the fix: the first weight sync raised "There is no module or parameter named 'log_z_head'"
    _check_colocate(_colocate("flowrl", vllm_tiny_dir, tmp_path), "flowrl")


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["grpo", "disa"])
def test_trl_colocate_trains(objective, vllm_tiny_dir, tmp_path):
    _check_colocate(_colocate(objective, vllm_tiny_dir, tmp_path), objective)
