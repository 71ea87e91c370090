"""Tiny Qwen3 factory, tokenizer and loaders."""

import pytest

pytest.importorskip("transformers")

import torch

from tiltlab.llm.base.models import build_tiny, build_tiny_tokenizer, load_model, load_tokenizer, resolve_dtype


def _same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_tiny_is_real_qwen3(tiny_model, tiny_tokenizer):
    cfg = tiny_model.config
    assert type(tiny_model).__name__ == "Qwen3ForCausalLM"
    assert cfg.model_type == "qwen3"
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (2, 64, 4, 2)
    assert cfg.tie_word_embeddings
    assert tiny_model.lm_head.weight.data_ptr() == tiny_model.model.embed_tokens.weight.data_ptr()
    assert cfg.vocab_size == len(tiny_tokenizer)
    assert tiny_model.dtype == torch.float32


def test_deterministic_given_seed():
    m1, t1 = build_tiny(seed=0)
    m2, t2 = build_tiny(seed=0)
    m3, _t3 = build_tiny(seed=1)
    assert _same_state(m1, m2)
    assert t1.get_vocab() == t2.get_vocab()
    assert not torch.equal(m1.model.embed_tokens.weight, m3.model.embed_tokens.weight)


def test_build_does_not_touch_global_rng():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny(seed=5)
    assert torch.equal(torch.rand(3), expected)


def test_save_reload_roundtrip(tiny_dir, tiny_model, tiny_tokenizer):
    fresh, tok = build_tiny(seed=0)
    assert _same_state(fresh, tiny_model)
    assert tok.get_vocab() == tiny_tokenizer.get_vocab()
    assert tiny_tokenizer.chat_template == tok.chat_template
    ids = torch.tensor([tiny_tokenizer("Compute 12 + 7.").input_ids])
    with torch.no_grad():
        torch.testing.assert_close(fresh(ids).logits, tiny_model(ids).logits, rtol=0, atol=0)


def test_tokenizer_specials_digits_and_chat(tiny_tokenizer):
    tok = tiny_tokenizer
    assert tok.pad_token == "<|endoftext|>" and tok.eos_token == "<|im_end|>" and tok.bos_token == "<|bos|>"
    assert len({tok.pad_token_id, tok.eos_token_id, tok.bos_token_id}) == 3
    # every digit is its own token
    pieces = tok.tokenize("Compute 12345 - 678")
    digit_pieces = [p for p in pieces if any(c.isdigit() for c in p)]
    assert digit_pieces == list("12345678")
    # round trip of arbitrary text (byte-level BPE)
    text = "f(x) = 3 * x + 2 \\boxed{-17} ünïcode ✓"
    assert tok.decode(tok(text).input_ids) == text
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    # specials are single tokens and the BOS is not auto-prepended (as in Qwen)
    ids = tok("<|im_start|>user").input_ids
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")


def test_generate_stops_at_eos_and_pads(tiny_model, tiny_tokenizer):
    tok = tiny_tokenizer
    enc = tok(["Compute 1 + 2.", "Write a Python function f(x)"], return_tensors="pt", padding=True)
    assert tok.padding_side == "left"
    torch.manual_seed(0)
    out = tiny_model.generate(**enc, max_new_tokens=6, do_sample=True)
    assert out.shape[0] == 2 and out.shape[1] <= enc.input_ids.shape[1] + 6


def test_tiny_name_and_dtype_resolution():
    assert resolve_dtype("auto", "cpu") == torch.float32
    assert resolve_dtype("bf16", "cpu") == torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype"):
        resolve_dtype("fp7", "cpu")
    m = load_model("tiny:0", device="cpu")
    t = load_tokenizer("tiny")
    assert m.config.vocab_size == len(t)
    with pytest.raises(ValueError, match="trust_remote_code"):
        load_model("tiny", trust_remote_code=True)
    with pytest.raises(FileNotFoundError):
        load_model("./no/such/model/dir")
    with pytest.raises(ValueError, match="vocab_size"):
        build_tiny_tokenizer(vocab_size=100)


def test_bpe_deterministic_across_processes():
    # tokenizers' trainer uses Rust hash maps; a fresh process must still learn the same merges
    import subprocess
    import sys

    from tiltlab.llm.base.models import train_bpe

    code = "from tiltlab.llm.base.models import train_bpe; import sys; sys.stdout.write(train_bpe(seed=0).to_str())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout == train_bpe(seed=0).to_str()


def test_load_model_and_tokenizer_passes_dtype_and_device_through(tiny_dir, monkeypatch):
    """A saved model's ``(model, tokenizer)`` loads on the device and in the dtype asked for: both reach
    load_model (a device other than the default, so that dropping it would show), the tokenizer from the
    same path."""
    import tiltlab.llm.base.models as M

    calls = []
    monkeypatch.setattr(
        M, "load_model", lambda name, dtype="auto", device=None: calls.append((name, dtype, device)) or "MODEL"
    )
    monkeypatch.setattr(M, "load_tokenizer", lambda name: calls.append(("tok", name)) or "TOK")
    assert M.default_device() != "meta"
    assert M.load_model_and_tokenizer(tiny_dir, dtype="bf16", device="meta") == ("MODEL", "TOK")
    assert calls == [(tiny_dir, "bf16", "meta"), ("tok", tiny_dir)]


def test_train_bpe_defaults_are_the_tiny_tokenizers():
    """``train_bpe()`` is the raw tokenizer of ``build_tiny_tokenizer()`` (its docstring): the same default
    vocabulary size and corpus seed, and a different seed gives another vocabulary (the seed is used)."""
    from tiltlab.llm.base.models import train_bpe

    raw = train_bpe().get_vocab()
    assert raw == build_tiny_tokenizer().backend_tokenizer.get_vocab()
    assert raw != train_bpe(seed=1).get_vocab()
