"""TRL weight-sync adapter (llm/train/vllm_sync.py) without vLLM: the walk TRL pushes to vLLM drops
the learned log Z head (and only it), the head still lands in the checkpoint and restores, and a tied
output layer is re-tied and repacked after a reload. The end-to-end runs are in test_vllm.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("trl")

from tiltlab.llm.disa.logz_head import attach_log_z_head, get_log_z_head, is_log_z_head_param
from tiltlab.llm.train.vllm_sync import keep_log_z_head_out, reload_on_cpu, retie_lm_head


def test_walk_skips_exactly_the_head(tiny_dir):
    from tiltlab.llm.base.models import load_model

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


def _fake_colocated_gen(pairs, events, tied=True):
    """TRL's ``VLLMGeneration`` in colocate mode over a fake in-process ``vllm.LLM`` whose engine calls
    (the in-place reload, the tied head's repack, the prefix-cache reset) are recorded in ``events``."""
    embed = torch.nn.Embedding(8, 4)
    lm_head = torch.nn.Module()
    lm_head.weight = torch.nn.Parameter(torch.zeros(8, 4))
    lm_head.quant_method = SimpleNamespace(process_weights_after_loading=lambda layer: events.append(("repack", layer)))
    model = torch.nn.Module()
    model.model = SimpleNamespace(embed_tokens=embed)
    model.lm_head = lm_head
    model.config = SimpleNamespace(tie_word_embeddings=tied)

    class Runner:
        def reload_weights(self, weights_iterator=None, is_checkpoint_format=None, **kw):
            events.append(("reload", list(weights_iterator), is_checkpoint_format, kw))

        def get_model(self):
            events.append(("get_model",))
            return model

        def load_weights(self, *a, **kw):  # TRL's per-parameter path, which must not run on CPU
            events.append(("load_weights",))

    runner = Runner()
    runner.model = SimpleNamespace(load_weights=runner.load_weights)
    llm = SimpleNamespace(
        llm_engine=SimpleNamespace(model_executor=SimpleNamespace(driver_worker=SimpleNamespace(model_runner=runner))),
        reset_prefix_cache=lambda: events.append(("reset_prefix_cache",)),
    )
    gen = SimpleNamespace(mode="colocate", llm=llm, _iter_named_params=lambda: iter(pairs))
    return gen, model


def test_cpu_sync_reloads_in_place_then_reties_then_resets_the_prefix_cache(monkeypatch):
    # the engine contract of the CPU colocate sync: one in-place reload of every (name, tensor) pair in
    # checkpoint format, then the tied head re-pointed at the reloaded embedding and repacked, and only
    # then the prefix cache reset (blocks computed with the old weights must not serve the next prompts)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    pairs = [("model.embed_tokens.weight", torch.ones(8, 4)), ("model.norm.weight", torch.ones(4))]
    events = []
    gen, model = _fake_colocated_gen(pairs, events)
    reload_on_cpu(gen)
    assert events == []  # installing the sync calls nothing
    gen.sync_weights()
    assert [e[0] for e in events] == ["reload", "get_model", "repack", "reset_prefix_cache"]
    _, sent, checkpoint_format, extra = events[0]
    assert [n for n, _ in sent] == [n for n, _ in pairs] and all(a is b for (_, a), (_, b) in zip(sent, pairs))
    assert checkpoint_format is True and extra == {}
    assert events[2][1] is model.lm_head and model.lm_head.weight is model.model.embed_tokens.weight
    gen.sync_weights()  # every sync does all of it again, with a fresh walk
    assert [e[0] for e in events[4:]] == ["reload", "get_model", "repack", "reset_prefix_cache"]
    assert [n for n, _ in events[4][1]] == [n for n, _ in pairs]
    # untied output layer: nothing to repack, the cache is still reset after the reload
    events.clear()
    gen, _ = _fake_colocated_gen(pairs, events, tied=False)
    reload_on_cpu(gen)
    gen.sync_weights()
    assert [e[0] for e in events] == ["reload", "get_model", "reset_prefix_cache"]


def test_cpu_sync_reloads_the_walk_without_the_head(monkeypatch):
    # in the trainer the head filter is installed first, so the in-place reload never sees the head
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    pairs = [("model.norm.weight", torch.ones(4)), ("log_z_head.net.0.weight", torch.ones(2, 4))]
    events = []
    gen, _ = _fake_colocated_gen(pairs, events)
    keep_log_z_head_out(gen)
    reload_on_cpu(gen)
    gen.sync_weights()
    assert [n for n, _ in events[0][1]] == ["model.norm.weight"]


def test_gpu_colocate_keeps_trls_own_sync(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    events = []
    gen, _ = _fake_colocated_gen([("model.norm.weight", torch.ones(4))], events)
    trl_sync = gen.sync_weights = object()
    reload_on_cpu(gen)
    assert gen.sync_weights is trl_sync and events == []


def test_head_saved_and_restored_with_the_checkpoint(tiny_dir, tmp_path, math_rows):
    from datasets import Dataset
    from safetensors.torch import load_file

    from tiltlab.llm.base.models import load_model, load_tokenizer
    from tiltlab.llm.train.online import TiltGRPOTrainer

    rows = [{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]} for r in math_rows]
    from tests.llm.train._tiny_trainer import online_args

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

    from tiltlab.llm.train.vllm_sync import cpu_colocate_llm

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

    from tiltlab.llm.train.online import TiltGRPOConfig
    from tiltlab.llm.train.vllm_sync import cpu_trainer_bf16

    def bf16(**kw):
        return TiltGRPOConfig(output_dir=str(tmp_path), report_to="none", **kw).bf16

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bf16(use_vllm=True, use_cpu=True) is False
    assert bf16(use_vllm=True) is False  # no CUDA device: a CPU run without use_cpu
    assert bf16(use_vllm=False, use_cpu=True) is True  # no sampler to agree with: TRL's default stays
    assert bf16(use_vllm=True, use_cpu=True, bf16=False) is False
    with caplog.at_level(logging.WARNING, logger="tiltlab.llm.train.vllm_sync"):
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

    from tiltlab.llm.base.models import load_model
    from tiltlab.llm.disa.logz_head import attach_log_z_head, policy_only_dir

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


@pytest.mark.parametrize(
    "dtype, name", [(torch.float32, "float32"), (torch.bfloat16, "bfloat16"), (torch.float16, "float16"), (None, None)]
)
def test_cpu_llm_kwargs_name_the_policys_dtype_as_vllm_spells_it(dtype, name):
    """vLLM gets the policy's dtype as its own string for each of the three float types (a torch dtype
    object is not one of vLLM's names), none without a policy dtype; the GPU memory fraction is dropped for a
    KV-cache size, and the rest of TRL's arguments pass through."""
    from tiltlab.llm.train.vllm_sync import cpu_llm_kwargs

    out = cpu_llm_kwargs(
        {"model": "m", "gpu_memory_utilization": 0.3, "seed": 4}, dtype=dtype, kv_cache_memory_bytes=2**20
    )
    assert out.get("dtype") == name and ("dtype" in out) is (dtype is not None)
    assert "gpu_memory_utilization" not in out and out["kv_cache_memory_bytes"] == 2**20
    assert (out["model"], out["seed"], out["enforce_eager"]) == ("m", 4, True)
