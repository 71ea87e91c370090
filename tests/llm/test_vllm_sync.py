"""TRL weight-sync adapter (llm/trainers/vllm_sync.py) without vLLM: the walk TRL pushes to vLLM drops
the learned log Z head (and only it), the head still lands in the checkpoint and restores, and a tied
output layer is re-tied and repacked after a reload. The end-to-end runs are in test_vllm.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("trl")

from tiltlab.llm.trainers.logz_head import attach_log_z_head, get_log_z_head, is_log_z_head_param
from tiltlab.llm.trainers.vllm_sync import keep_log_z_head_out, reload_on_cpu, retie_lm_head


def test_walk_skips_exactly_the_head(tiny_dir):
    from tiltlab.llm.models import load_model

    model = load_model(tiny_dir, device="cpu")
    attach_log_z_head(model)
    names = [n for n, _ in model.named_parameters()]
    head = [n for n in names if n.startswith("log_z_head.")]
    assert len(head) == 10  # 3 Linear (w, b) + 2 LayerNorm (w, b)
    gen = SimpleNamespace(_iter_named_params=lambda: ((n, p.data) for n, p in model.named_parameters()))
    keep_log_z_head_out(gen)
    sent = [n for n, _ in gen._iter_named_params()]
    assert sent == [n for n in names if n not in head] and len(sent) == len(names) - 10
    # wrapper prefixes (PEFT modules_to_save, DDP) are recognised; look-alike names are not
    assert is_log_z_head_param("base_model.model.log_z_head.modules_to_save.default.net.0.weight")
    assert not is_log_z_head_param("model.layers.0.log_z_head_proj.weight")


def test_adapter_refuses_an_unknown_trl_layout():
    with pytest.raises(RuntimeError, match="TRL 1.x"):
        keep_log_z_head_out(SimpleNamespace())
    gen = SimpleNamespace(mode="server", sync_weights="untouched")
    reload_on_cpu(gen)  # server mode: TRL's own sync stays
    assert gen.sync_weights == "untouched"


def test_head_saved_and_restored_with_the_checkpoint(tiny_dir, tmp_path, math_rows):
    from datasets import Dataset
    from safetensors.torch import load_file

    from tiltlab.llm.models import load_model, load_tokenizer
    from tiltlab.llm.trainers.online import TiltGRPOTrainer

    rows = [{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]} for r in math_rows]
    from _tiny_trainer import online_args

    args = online_args(tmp_path / "run", "flowrl", max_completion_length=4, max_steps=1)
    tr = TiltGRPOTrainer(
        model=load_model(tiny_dir, device="cpu"),
        reward_funcs=lambda prompts, completions, completion_ids, **kw: [float(len(c) % 2) for c in completion_ids],
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=load_tokenizer(tiny_dir),
    )
    tr.train()
    tr.save_model(str(tmp_path / "final"))
    state = load_file(str(tmp_path / "final" / "model.safetensors"))
    trained = get_log_z_head(tr.model).state_dict()
    assert sorted(k for k in state if is_log_z_head_param(k)) == sorted(f"log_z_head.{k}" for k in trained)
    fresh = load_model(tiny_dir, device="cpu")
    attach_log_z_head(fresh, args.log_z_hidden, args.log_z_layers, args.log_z_dropout)
    before = {k: v.clone() for k, v in get_log_z_head(fresh).state_dict().items()}
    fresh.load_state_dict(state, strict=False)
    restored = get_log_z_head(fresh).state_dict()
    assert all(torch.equal(restored[k], trained[k]) for k in trained)
    assert any(not torch.equal(before[k], trained[k]) for k in trained)  # the load did something


def test_retie_lm_head_points_at_the_reloaded_embedding():
    calls = []
    embed = torch.nn.Embedding(8, 4)
    lm_head = torch.nn.Module()
    lm_head.weight = torch.nn.Parameter(torch.zeros(8, 4))
    lm_head.quant_method = SimpleNamespace(process_weights_after_loading=lambda layer: calls.append(layer))
    model = torch.nn.Module()
    model.model = SimpleNamespace(embed_tokens=embed)
    model.lm_head = lm_head
    model.config = SimpleNamespace(tie_word_embeddings=True)
    assert retie_lm_head(model) and lm_head.weight is embed.weight and calls == [lm_head]
    model.config = SimpleNamespace(tie_word_embeddings=False)
    assert not retie_lm_head(model) and calls == [lm_head]


def test_cpu_colocate_llm_adapts_trl_engine_and_restores_it(tiny_dir, monkeypatch):
    # TRL's colocate mode calls trl.generation.vllm_generation.LLM(...) with GPU settings; without CUDA
    # the trainer's scope hands vLLM CPU ones, and puts TRL's constructor back afterwards (also on error)
    import json

    import trl.generation.vllm_generation as vg

    from tiltlab.llm.trainers.vllm_sync import cpu_colocate_llm

    built = []

    def fake_llm(**kw):
        built.append(kw)
        return "engine"

    monkeypatch.setattr(vg, "LLM", fake_llm, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    trl_kwargs = dict(model=str(tiny_dir), gpu_memory_utilization=0.3, max_model_len=None, max_num_batched_tokens=4096)
    with cpu_colocate_llm(lambda: torch.float32, kv_cache_memory_bytes=32 << 20):
        assert vg.LLM is not fake_llm and vg.LLM(**trl_kwargs) == "engine"
    assert vg.LLM is fake_llm
    kw = built[-1]
    positions = json.loads((tiny_dir / "config.json").read_text())["max_position_embeddings"]
    assert "gpu_memory_utilization" not in kw and kw["kv_cache_memory_bytes"] == 32 << 20
    assert kw["enforce_eager"] is True and kw["enable_chunked_prefill"] is False and kw["dtype"] == "float32"
    assert kw["max_num_batched_tokens"] >= max(positions, 4096)  # no chunked prefill: the step covers the context
    with pytest.raises(KeyError), cpu_colocate_llm(lambda: torch.bfloat16):
        raise KeyError("trainer construction failed")
    assert vg.LLM is fake_llm
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # GPUs: TRL's settings stay
    with cpu_colocate_llm(lambda: torch.float32):
        assert vg.LLM is fake_llm


def test_cpu_vllm_runs_keep_the_trainer_at_the_samplers_precision(tmp_path, monkeypatch, caplog):
    # TRL resolves an unset bf16 to True; on CPU that autocasts the trainer's forward to bf16 while the
    # colocated vLLM runs the fp32 policy in fp32 (docs/colocate.md): with vLLM on CPU an unset bf16 is off
    import logging

    from tiltlab.llm.trainers.online import TiltGRPOConfig
    from tiltlab.llm.trainers.vllm_sync import cpu_trainer_bf16

    def bf16(**kw):
        return TiltGRPOConfig(output_dir=str(tmp_path), report_to="none", **kw).bf16

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bf16(use_vllm=True, use_cpu=True) is False
    assert bf16(use_vllm=True) is False  # no CUDA device: a CPU run without use_cpu
    assert bf16(use_vllm=False, use_cpu=True) is True  # no sampler to agree with: TRL's default stays
    assert bf16(use_vllm=True, use_cpu=True, bf16=False) is False
    with caplog.at_level(logging.WARNING, logger="tiltlab.llm.trainers.vllm_sync"):
        assert bf16(use_vllm=True, use_cpu=False) is False
        assert not caplog.records
        assert bf16(use_vllm=True, use_cpu=True, bf16=True) is True  # explicit: kept, with one warning
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["bf16=True on CPU with vLLM"]
    # on a GPU, with fp16, or with a value given, the value is TRL's to resolve
    assert cpu_trainer_bf16(None, fp16=False, use_vllm=True, on_cpu=False) is None
    assert cpu_trainer_bf16(None, fp16=True, use_vllm=True, on_cpu=True) is None
    assert cpu_trainer_bf16(True, fp16=False, use_vllm=True, on_cpu=False) is True
    assert cpu_trainer_bf16(None, fp16=False, use_vllm=False, on_cpu=True) is None


def test_policy_only_dir_leaves_out_exactly_the_head(tiny_dir, tmp_path):
    """A saved FlowRL policy (head attached) -> a directory without the head's tensors that loads as
    the plain model; a model without a head is returned unchanged; the copy is reused until the model
    is saved again."""
    import os

    from safetensors.torch import load_file

    from tiltlab.llm.models import load_model
    from tiltlab.llm.trainers.logz_head import attach_log_z_head, policy_only_dir

    assert policy_only_dir(tiny_dir) == tiny_dir  # no head: nothing written
    model = load_model(tiny_dir, device="cpu")
    attach_log_z_head(model)
    saved = tmp_path / "flowrl"
    model.save_pretrained(saved)
    (saved / "checkpoint-1").mkdir()  # a run directory holds checkpoints and hidden files: not copied
    (saved / ".lock").write_text("x")
    full = load_file(str(saved / "model.safetensors"))
    head = {k for k in full if k.startswith("log_z_head.")}
    assert head
    out = policy_only_dir(saved)
    assert out == saved / "policy"
    kept = load_file(str(out / "model.safetensors"))
    assert set(kept) == set(full) - head and all(torch.equal(kept[k], full[k]) for k in kept)
    assert (out / "config.json").read_text() == (saved / "config.json").read_text()
    assert not (out / "checkpoint-1").exists() and not (out / ".lock").exists()
    plain = load_model(out, device="cpu")  # loads as the architecture, no unexpected keys
    assert not hasattr(plain, "log_z_head")
    mtime = os.path.getmtime(out / "model.safetensors")
    assert policy_only_dir(saved) == out and os.path.getmtime(out / "model.safetensors") == mtime
    nested = policy_only_dir(saved, tmp_path / "exports" / "flowrl" / "policy")  # parents are created
    assert set(load_file(str(nested / "model.safetensors"))) == set(kept)
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        policy_only_dir(tmp_path)
