"""DISA Stage 1: importance-sampled partition-function labels ``log Z_hat_M(x)``.

DISA §3.1 eqs. (7)-(8) (``docs/math.md`` §1). For each prompt ``x``:

1. draw ``y_1..y_M ~ q(.|x)`` from the proposal through a rollout engine (``llm.rollout``),
   keeping ``log q(y_i|x)`` of the distribution actually sampled (processed log-probs);
2. score ``log pi_ref(y_i|x)`` at temperature 1 (``reference_scoring``): no pass at all when the
   proposal is pi_ref sampled at T = 1 untruncated (the sampled log-probs are pi_ref's); else the
   prompt log-probs of ``x + y_i`` from a vLLM engine (the proposal's when it is pi_ref, reading the
   prompt's KV from the prefix cache; or a second engine of pi_ref, overlapped with the next shard's
   sampling); else transformers teacher forcing (``llm.scoring``);
3. reward ``r(x, y_i)`` (``llm.rewards``) and transform it, ``r~ = a r + c`` (a fixed affine map,
   recorded with ``beta`` in the manifest);
4. ``log w_i = log pi_ref + beta r~ - log q`` and the per-prompt label ``log Z_hat_M`` (LSE) with
   its diagnostics -- all from ``objectives.estimators`` (no formula lives here).

Absolute continuity (App. C.1) needs ``q > 0`` wherever ``pi_ref exp(beta r~) > 0``: a truncating
sampler (top-k > 0, top-p < 1, greedy) violates it and biases the labels low by the tilted mass it
cannot reach. Such settings are refused unless ``allow_truncated`` (then warned about loudly and
recorded as ``truncated_support`` in the manifest).

Output directory (resumable, every file written atomically: temporary file + ``os.replace``)::

    manifest.json                 config, reward transform, beta, prompt list hash, finished shards,
                                  signal (vacuous-run findings, tiltlab.llm.learning_signal)
    samples-00000.parquet ...     one row per (prompt_id, sample_idx)
    labels-00000.parquet  ...     one row per prompt_id

Tokenizers (``tokenizer``). Completions are scored under pi_ref by token ids, so by default
(``"reference"``) the reference tokenizer (and its chat template) formats the prompts and both
models read the same ids; the proposal's tokenizer must then be token-for-token compatible (the
same token -> id map), else the run is refused before anything is written. ``"proposal"`` uses the
proposal's tokenizer and chat template with the same requirement. ``"retokenize"`` lets each model
use its own tokenizer and chat template (e.g. a Qwen3 proposal for a Qwen2.5 reference): the
proposal samples from its own formatting of the prompt, the decoded completion text (special tokens
dropped) is re-tokenized by the reference tokenizer, and the reference's eos is appended when the
proposal stopped on its own. ``log q`` is then the log-prob of q's own tokenization of the text (the
mass of other tokenizations of the same string is ignored, as usual for text-level weights), and
``completion_ids`` hold the reference's tokens (the ones scored; ``proposal_completion_ids`` keeps
q's).

Context. A prompt whose tokens plus ``max_new_tokens`` exceed a model's context (``max_model_len``
if given, else the model config's ``max_position_embeddings``) is refused before sampling.
``quantization`` (vLLM, e.g. ``"fp8"``) applies to the proposal only: its log-probs are those of the
quantized model that actually sampled, so the importance weights stay exact.

Prompts are split into fixed shards of ``prompts_per_shard`` in dataset order, and shard ``k``
samples with a seed derived from ``(seed, k)``: a run that is killed resumes at the first shard
not recorded in the manifest, and produces exactly the rows an uninterrupted run would. A resumed
run must agree on every setting that changes the samples (sampling, seeds, models, tokenizer
choice, chat-template arguments, dtype/device, the hf engine's ``gen_batch_size``, the vLLM
engine's quantization and tensor-parallel degree): a change is refused. The manifest keeps the
first run's ``config``; a resume appends the other settings it changed to ``resumes``. The manifest
is written only after the models, tokenizers and prompt lengths are checked, and a manifest with no
finished shard never blocks a new configuration (it is replaced).

This module is import-light (torch etc. are imported inside functions) so that the CLI parser
can be built without loading the LLM stack.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from tiltlab.files import write_json, write_parquet
from tiltlab.llm.prompts import check_chat_template_kwargs, format_prompt
from tiltlab.llm.rewards import resolve_reward

__all__ = [
    "CRASH_ENV",
    "MANIFEST",
    "SCORING_MODES",
    "TOKENIZER_MODES",
    "Stage1Config",
    "atomic_write_json",
    "load_stage1",
    "run_stage1",
    "sampler_not_reference",
    "vllm_proposal_engine",
    "vllm_reference_engine",
]

MANIFEST = "manifest.json"
CRASH_ENV = "TILTLAB_STAGE1_CRASH_AFTER"
"""Test hook: ``"k"`` hard-exits (``os._exit``) right after shard ``k`` is recorded in the
manifest; ``"k:before_manifest"`` right after its Parquet files are written but before the
manifest records it (the shard is then redone on resume, overwriting its files)."""

# Fields that change the produced samples or labels: a resumed run must agree on all of them.
_IDENTITY_FIELDS = (
    "proposal",
    "reference",
    "dataset",
    "M",
    "beta",
    "reward",
    "reward_scale",
    "reward_shift",
    "temperature",
    "top_p",
    "top_k",
    "max_new_tokens",
    "seed",
    "prompts_per_shard",
    "max_prompts",
    "chat_template",
    "chat_template_kwargs",
    "tokenizer",
    "engine",
    "dtype",
)
# engine-specific fields of the identity (None for the other engine)
_HF_IDENTITY = ("gen_batch_size",)
_VLLM_IDENTITY = ("quantization", "tensor_parallel_size")
TOKENIZER_MODES = ("reference", "proposal", "retokenize")
SCORING_MODES = ("auto", "sampler", "vllm", "hf")


def sampler_not_reference(cfg) -> str | None:
    """Why the proposal's sampled log-probs are not log pi_ref (None when they are).

    They are when the proposal is the reference (same model, same dtype, not quantized, same token
    ids) sampled at temperature 1 with no truncation: the processed distribution is then the model's
    own ``softmax(logits)``, so ``log q(y|x) = log pi_ref(y|x)`` token by token.
    """
    if cfg.proposal != cfg.reference:
        return "the proposal and the reference are different models"
    if cfg.quantization:
        return f"the proposal engine is quantized ({cfg.quantization})"
    if cfg.tokenizer == "retokenize":
        return "tokenizer='retokenize' scores re-tokenized completions"
    if cfg.temperature != 1.0:
        return f"temperature={cfg.temperature} (pi_ref is the temperature-1 distribution)"
    if cfg.top_k > 0 or cfg.top_p < 1.0:
        return f"top_k={cfg.top_k} / top_p={cfg.top_p} truncate the sampler"
    return None


@dataclass
class Stage1Config:
    """Configuration of ``tiltlab llm stage1`` (one field = one CLI flag, its docstring = the help)."""

    proposal: str
    """Proposal model q: HF id, local path or "tiny[:seed]" (the paper uses a strong instruct model)."""
    reference: str
    """Reference policy pi_ref (the model Stage 3 trains from): HF id, local path or "tiny[:seed]"."""
    dataset: str
    """Prompt dataset: JSONL / Parquet / datasets-on-disk path, a synthetic spec or humaneval[:N] (see llm.data)."""
    out_dir: str
    """Output directory (created; an existing run there is resumed)."""
    M: int = 8
    """Samples per prompt (DISA uses M = 8)."""
    beta: float = 1.0
    """Inverse temperature; it MULTIPLIES the transformed reward: tilt = beta * r~."""
    reward: str = "auto"
    """Reward: "auto" (math if the row has an answer, code if it has tests), "math", "code", or "pkg.module:function"."""
    reward_scale: float = 1.0
    """a in the fixed affine reward transform r~ = a * r + c (a > 0)."""
    reward_shift: float = 0.0
    """c in the fixed affine reward transform r~ = a * r + c."""
    temperature: float = 1.0
    """Proposal sampling temperature (> 0; any value keeps full support)."""
    top_p: float = 1.0
    """Nucleus mass; < 1 truncates the support (refused unless allow_truncated)."""
    top_k: int = 0
    """Top-k truncation; > 0 truncates the support (refused unless allow_truncated)."""
    max_new_tokens: int = 512
    """Maximum completion length in tokens."""
    seed: int = 0
    """Base seed; shard k samples with a seed derived from (seed, k)."""
    engine: str = "hf"
    """Rollout engine for the proposal: "hf" (transformers, CPU/GPU) or "vllm" (GPU)."""
    prompts_per_shard: int = 64
    """Prompts per Parquet shard (the unit of resumption)."""
    gen_batch_size: int = 64
    """Rows (prompt copies) per generation batch for the hf engine."""
    score_batch_size: int = 16
    """Sequences per teacher-forcing batch when scoring under pi_ref."""
    max_prompts: int | None = None
    """Use only the first N prompts of the dataset."""
    chat_template: bool = True
    """Wrap each prompt as a user turn with the reference tokenizer's chat template."""
    allow_truncated: bool = False
    """Allow top-k > 0 / top-p < 1 (breaks absolute continuity; labels biased low)."""
    dtype: str = "auto"
    """Model dtype: "auto" (bf16 on GPU, fp32 on CPU), "bf16", "fp32", ..."""
    device: str | None = None
    """Device for the hf models (default: cuda if available, else cpu)."""
    gpu_memory_utilization: float | None = None
    """vLLM only: fraction of (GPU or, on CPU, host) memory for the proposal engine; default 0.6 on GPU (the reference model shares it); on CPU the KV cache is sized in bytes instead (VLLMEngine)."""
    tensor_parallel_size: int = 1
    """vLLM only: tensor-parallel degree of the proposal engine (e.g. 8 for a 235B proposal on 8 GPUs)."""
    max_model_len: int | None = None
    """Context length (prompt + completion) of both models; default: each model config's max_position_embeddings. Longer prompts are refused."""
    tokenizer: str = "reference"
    """Which tokenizer formats prompts and completions: "reference", "proposal" (both need token-for-token compatible tokenizers) or "retokenize" (each model its own; completion text re-tokenized for pi_ref)."""
    quantization: str | None = None
    """vLLM only: quantization of the proposal engine (e.g. "fp8": 235B bf16 weights, 470 GB, do not fit 0.6 x 8 x 80 GB)."""
    chat_template_kwargs: dict | None = None
    """Extra chat-template arguments, e.g. {"enable_thinking": false} for Qwen3 (CLI: a JSON object)."""
    reference_scoring: str = "auto"
    """How log pi_ref is computed: "sampler" (no scoring pass: proposal == reference, unquantized, T = 1, untruncated, so the sampled tokens' log-probs are pi_ref's), "vllm" (prompt log-probs of a vLLM engine: the proposal's when it is pi_ref, else a second engine overlapped with the next shard's sampling), "hf" (transformers teacher forcing) or "auto" (the first that applies, in that order; vllm only with the vllm engine)."""

    def __post_init__(self) -> None:
        if self.M < 1:
            raise ValueError(f"M must be >= 1, got {self.M}")
        if not self.beta > 0:
            raise ValueError(f"beta must be > 0, got {self.beta}")
        if not self.reward_scale > 0:
            raise ValueError(f"reward_scale (a in r~ = a r + c) must be > 0, got {self.reward_scale}")
        if self.temperature <= 0:
            raise ValueError("temperature must be > 0 (greedy decoding has no density to weight by)")
        if self.prompts_per_shard < 1 or self.gen_batch_size < 1 or self.score_batch_size < 1:
            raise ValueError("prompts_per_shard, gen_batch_size and score_batch_size must be >= 1")
        if self.engine not in ("hf", "vllm"):
            raise ValueError(f"engine must be 'hf' or 'vllm', got {self.engine!r}")
        if self.max_prompts is not None and self.max_prompts < 1:
            raise ValueError("max_prompts must be >= 1")
        if self.tokenizer not in TOKENIZER_MODES:
            raise ValueError(f"tokenizer must be one of {TOKENIZER_MODES}, got {self.tokenizer!r}")
        if self.max_model_len is not None and self.max_model_len <= self.max_new_tokens:
            raise ValueError(
                f"max_model_len ({self.max_model_len}) must exceed max_new_tokens ({self.max_new_tokens}): "
                "the prompt needs room too"
            )
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if self.engine == "hf" and (self.quantization or self.tensor_parallel_size != 1):
            raise ValueError(
                "quantization / tensor_parallel_size apply to the vLLM proposal engine; use engine='vllm' "
                "(the hf engine loads full-precision weights on one device)"
            )
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must lie in (0, 1], got {self.gpu_memory_utilization}")
        if self.reference_scoring not in SCORING_MODES:
            raise ValueError(f"reference_scoring must be one of {SCORING_MODES}, got {self.reference_scoring!r}")
        if self.reference_scoring == "sampler" and (why := sampler_not_reference(self)) is not None:
            raise ValueError(
                f"reference_scoring='sampler' needs the sampler's log-probs to be pi_ref's, but {why}; "
                "use reference_scoring='auto'"
            )
        check_chat_template_kwargs(self.chat_template_kwargs, self.chat_template)

    def sampling(self, shard: int):
        from tiltlab.llm.rollout import SamplingConfig, derive_seed

        return SamplingConfig(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_new_tokens=self.max_new_tokens,
            seed=derive_seed("stage1", self.seed, shard),
        )

    @property
    def truncated_support(self) -> bool:
        return self.top_k > 0 or self.top_p < 1.0

    def reward_transform(self) -> dict[str, Any]:
        return {
            "name": "affine",
            "formula": "r~ = a * r + c",
            "a": self.reward_scale,
            "c": self.reward_shift,
            "reward": self.reward,
        }


# ---------------------------------------------------------------------------------------------
# atomic files
# ---------------------------------------------------------------------------------------------


def atomic_write_json(path: str | Path, obj: Any) -> None:
    """Stage 1's JSON files (manifest, config): sorted keys, indent 2, written atomically and fsynced
    (:func:`tiltlab.files.write_json`)."""
    write_json(path, obj, indent=2, sort_keys=True, fsync=True)


# ---------------------------------------------------------------------------------------------
# data, prompts, rewards
# ---------------------------------------------------------------------------------------------


def _load_rows(dataset: str) -> list[dict]:
    from tiltlab.llm.data import load_prompts

    return list(load_prompts(dataset))


def _prompts_hash(ids: Sequence[str], prompts: Sequence[str]) -> str:
    h = hashlib.sha256()
    for i, p in zip(ids, prompts):
        h.update(str(i).encode() + b"\x1f" + p.encode() + b"\x1e")
    return h.hexdigest()


def _check_same_tokenizer(tok_q, tok_ref) -> None:
    """Refuse unless the two tokenizers map every token string to the same id (token-for-token)."""
    if len(tok_q) != len(tok_ref) or tok_q.get_vocab() != tok_ref.get_vocab():
        vq, vr = tok_q.get_vocab(), tok_ref.get_vocab()
        only_q = sorted(set(vq) - set(vr))[:3]
        only_r = sorted(set(vr) - set(vq))[:3]
        raise ValueError(
            f"proposal and reference tokenizers differ ({len(tok_q)} vs {len(tok_ref)} tokens; only in the "
            f"proposal: {only_q}, only in the reference: {only_r}): completions are scored under pi_ref by "
            "their token ids, so tokenizer='reference'/'proposal' needs one shared vocabulary. Use "
            "tokenizer='retokenize' (stage1.tokenizer: retokenize) to re-tokenize the completion text for pi_ref"
        )


def _crash_hook(shard_done: int, phase: str) -> None:
    spec = os.environ.get(CRASH_ENV)
    if not spec:
        return
    k, _, when = spec.partition(":")
    if int(k) == shard_done and (when or "after_manifest") == phase:
        sys.stderr.write(f"[{CRASH_ENV}] simulated crash after shard {shard_done} ({phase})\n")
        sys.stderr.flush()
        os._exit(86)


# ---------------------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------------------


def _context(cfg: Stage1Config, name: str, positions: int | None) -> int | None:
    if positions is not None and cfg.max_model_len is not None and cfg.max_model_len > positions:
        raise ValueError(
            f"max_model_len={cfg.max_model_len} exceeds {name}'s max_position_embeddings={positions}; "
            "lower max_model_len"
        )
    return cfg.max_model_len if cfg.max_model_len is not None else positions


def _check_prompt_lengths(cfg: Stage1Config, ids: Sequence[str], prompt_ids, name: str, ctx: int | None) -> None:
    """Refuse prompts with more than ``ctx - max_new_tokens`` tokens (before anything is sampled)."""
    if ctx is None:
        return
    room = ctx - cfg.max_new_tokens
    bad = [(i, len(p)) for i, p in zip(ids, prompt_ids) if len(p) > room]
    if bad:
        shown = ", ".join(f"{i!r} ({n} tokens)" for i, n in bad[:3])
        raise ValueError(
            f"{len(bad)} prompt(s) do not fit {name}'s context: {shown} > {ctx} (context) - "
            f"{cfg.max_new_tokens} (max_new_tokens) = {room}; filter or shorten them, lower max_new_tokens, "
            "or raise max_model_len"
        )


def resolve_reference_scoring(cfg: Stage1Config) -> str:
    """The scoring path ``cfg.reference_scoring`` stands for: ``"sampler"``, ``"vllm"`` or ``"hf"``
    (``"auto"``: the sampler's log-probs when they are pi_ref's, else vLLM when the proposal runs
    on vLLM and vLLM can serve the reference here, else transformers)."""
    if cfg.reference_scoring != "auto":
        return cfg.reference_scoring
    if sampler_not_reference(cfg) is None:
        return "sampler"
    from tiltlab.llm.rollout import vllm_unsupported_reason

    if cfg.engine == "vllm" and vllm_unsupported_reason(cfg.reference) is None:
        return "vllm"
    return "hf"


def _proposal_engine_scores(cfg: Stage1Config) -> bool:
    """True when pi_ref is scored by the proposal's own vLLM engine (it *is* pi_ref: same model, not quantized)."""
    return (
        resolve_reference_scoring(cfg) == "vllm"
        and cfg.engine == "vllm"
        and cfg.proposal == cfg.reference
        and not cfg.quantization
    )


CPU_SCORING_BLOCK_SIZE = 32
"""KV-cache block size of a vLLM engine that scores pi_ref on CPU. Prefix-cache hits are whole blocks,
and vLLM's CPU default (128 tokens) is longer than a typical chat prompt, so with it no prompt's KV would
be shared by the M scoring requests of that prompt."""

SCORE_CACHE_SALT = "tiltlab-stage1-score"
"""``cache_salt`` of every scoring request: they share cached prompt blocks with each other, never with
the sampling requests (whose cached blocks run into the completions, whose log-probs must be computed)."""


def vllm_proposal_engine(cfg: Stage1Config):
    """The proposal's :class:`~tiltlab.llm.rollout.VLLMEngine` for ``cfg`` (processed log-probs).

    On CPU the engine's own CPU defaults apply (eager, KV cache in bytes, no chunked prefill for
    seeded requests; :class:`~tiltlab.llm.rollout.VLLMEngine`) unless ``gpu_memory_utilization``
    says otherwise (vLLM's 0.9 default fails there). When the engine also scores pi_ref on CPU, its
    KV blocks are :data:`CPU_SCORING_BLOCK_SIZE` tokens, so that the M scoring requests of a prompt
    share the prompt's cached KV.
    """
    from tiltlab.llm.models import default_device
    from tiltlab.llm.rollout import VLLMEngine

    on_cpu = str(cfg.device or default_device()).startswith("cpu")
    extra: dict[str, Any] = {}
    if cfg.quantization:
        extra["quantization"] = cfg.quantization
    if on_cpu and _proposal_engine_scores(cfg):
        extra["block_size"] = CPU_SCORING_BLOCK_SIZE
    gmu = cfg.gpu_memory_utilization
    return VLLMEngine(
        cfg.proposal,
        dtype=cfg.dtype,
        seed=cfg.seed,
        # on CPU: VLLMEngine's KV cache in bytes (a share of host memory is too much on a shared machine)
        gpu_memory_utilization=gmu if gmu is not None else (None if on_cpu else 0.6),
        tensor_parallel_size=cfg.tensor_parallel_size,
        max_model_len=cfg.max_model_len,
        **extra,
    )


def vllm_reference_engine(cfg: Stage1Config):
    """A second :class:`~tiltlab.llm.rollout.VLLMEngine`, of the reference, that only scores (prompt
    log-probs are raw temperature-1 log-probs whatever the engine's ``logprobs_mode``). Full precision
    (no quantization), one device, ``cfg.dtype``; on a GPU 0.25 of its memory (the proposal's default
    0.6 leaves room for it); on CPU the engine's KV cache in bytes and :data:`CPU_SCORING_BLOCK_SIZE`."""
    from tiltlab.llm.models import default_device
    from tiltlab.llm.rollout import VLLMEngine

    on_cpu = str(cfg.device or default_device()).startswith("cpu")
    return VLLMEngine(
        cfg.reference,
        dtype=cfg.dtype,
        seed=cfg.seed,
        gpu_memory_utilization=None if on_cpu else 0.25,
        max_model_len=cfg.max_model_len,
        **({"block_size": CPU_SCORING_BLOCK_SIZE} if on_cpu else {}),
    )


class _Models:
    """Tokenizers, the formatted prompts, the proposal engine and the reference scorer.

    Built (only when some shard remains) before the manifest is written: every check that can
    refuse the run -- tokenizer compatibility, prompt lengths -- happens here, and cheap checks
    (tokenizers, config context lengths) before any model is loaded.
    """

    def __init__(
        self, cfg: Stage1Config, rows: list[dict], engine=None, show_progress: bool = False, reference_engine=None
    ):
        from tiltlab.llm.models import default_device, load_model, load_tokenizer

        self.retokenize = cfg.tokenizer == "retokenize"
        ids = [str(r["id"]) for r in rows]
        self.ref_tok = load_tokenizer(cfg.reference)
        if engine is not None:
            q_tok = engine.tokenizer
        elif cfg.proposal == cfg.reference:
            q_tok = self.ref_tok
        else:
            q_tok = load_tokenizer(cfg.proposal)
        if not self.retokenize:
            _check_same_tokenizer(q_tok, self.ref_tok)
        fmt_tok = q_tok if cfg.tokenizer == "proposal" else self.ref_tok

        def encode(tok):
            texts = [format_prompt(tok, r["prompt"], cfg.chat_template, **kw) for r in rows]
            return texts, [list(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]

        kw = dict(chat_template_kwargs=cfg.chat_template_kwargs)
        self.prompt_texts, self.ref_prompt_ids = encode(fmt_tok)  # pi_ref's conditioning strings
        self.q_prompt_ids = encode(q_tok)[1] if self.retokenize else self.ref_prompt_ids
        # cheap context check from the configs, before loading any weights
        from tiltlab.llm.models import context_length

        ctx_ref = _context(cfg, "the reference", context_length(cfg.reference))
        _check_prompt_lengths(cfg, ids, self.ref_prompt_ids, "the reference", ctx_ref)
        ctx_q = _context(cfg, "the proposal", context_length(cfg.proposal))
        _check_prompt_lengths(cfg, ids, self.q_prompt_ids, "the proposal", ctx_q)

        self.device = cfg.device or default_device()
        # "sampler": no scoring; "vllm": the proposal's engine when it is pi_ref, else a second engine
        # (self.ref_engine, scoring overlapped with sampling); "hf": a transformers copy of pi_ref
        self.scoring = resolve_reference_scoring(cfg)
        self.ref, self.ref_engine, self.ref_context = None, None, ctx_ref
        hf_proposal_is_ref = cfg.engine == "hf" and cfg.proposal == cfg.reference
        if self.scoring == "hf" or (hf_proposal_is_ref and engine is None):
            self.ref = load_model(cfg.reference, dtype=cfg.dtype, device=self.device)
            self.ref_context = _context(cfg, "the reference", getattr(self.ref.config, "max_position_embeddings", None))
            _check_prompt_lengths(cfg, ids, self.ref_prompt_ids, "the reference", self.ref_context)
        self._own_ref_engine = False
        if self.scoring == "vllm" and not _proposal_engine_scores(cfg):
            self._own_ref_engine = reference_engine is None
            self.ref_engine = vllm_reference_engine(cfg) if reference_engine is None else reference_engine
        elif reference_engine is not None:
            raise ValueError(
                f"reference_engine is used only by reference_scoring='vllm' with a reference other than the "
                f"proposal's engine; this run scores pi_ref by {self.scoring!r}"
            )
        if engine is not None:
            self.engine = engine
        elif cfg.engine == "vllm":
            self.engine = vllm_proposal_engine(cfg)
        else:
            from tiltlab.llm.rollout import HFEngine

            q_model = self.ref if hf_proposal_is_ref else load_model(cfg.proposal, dtype=cfg.dtype, device=self.device)
            ctx = _context(cfg, "the proposal", getattr(q_model.config, "max_position_embeddings", None))
            _check_prompt_lengths(cfg, ids, self.q_prompt_ids, "the proposal", ctx)
            self.engine = HFEngine(q_model, q_tok, batch_size=cfg.gen_batch_size, show_progress=show_progress)
        self.q_tok = q_tok
        eos = self.ref_tok.eos_token_id
        self.ref_eos = int(eos) if eos is not None else None

    @property
    def scoring_record(self) -> str:
        """The scoring path as recorded in the manifest."""
        if self.scoring == "vllm":
            return "vllm:reference-engine" if self.ref_engine is not None else "vllm:proposal-engine"
        return self.scoring

    def close(self) -> None:
        """Stop the reference engine if it was started here (a caller's engines stay up)."""
        if self.ref_engine is not None and self._own_ref_engine:
            self.ref_engine.close()
            self.ref_engine = None

    def reference_completion(self, text: str, finished: bool) -> list[int]:
        """``"retokenize"``: the reference's tokens of a proposal completion's text (+ its eos if it stopped)."""
        ids = list(self.ref_tok(text, add_special_tokens=False)["input_ids"])
        if finished and self.ref_eos is not None:
            ids.append(self.ref_eos)
        return ids


def _loud_truncation_warning(cfg: Stage1Config) -> None:
    msg = (
        f"Stage 1 sampler truncates support (top_k={cfg.top_k}, top_p={cfg.top_p}): absolute continuity "
        "(DISA App. C.1) fails and the labels log Z_hat are biased LOW by the tilted mass outside the "
        "truncated support. Proceeding because allow_truncated=True; the manifest records it."
    )
    bar = "!" * 100
    sys.stderr.write(f"\n{bar}\nWARNING: {msg}\n{bar}\n\n")
    warnings.warn(msg, RuntimeWarning, stacklevel=3)


def _identity(cfg: Stage1Config, reward_name: str, ids, rows, device: str) -> dict[str, Any]:
    identity = {k: getattr(cfg, k) for k in _IDENTITY_FIELDS}
    identity["reward"] = reward_name
    identity["prompts_sha256"] = _prompts_hash(ids, [r["prompt"] for r in rows])
    identity["device"] = device.split(":")[0]  # samplers draw different streams on cpu and cuda
    for k in _HF_IDENTITY:
        identity[k] = getattr(cfg, k) if cfg.engine == "hf" else None
    for k in _VLLM_IDENTITY:
        identity[k] = getattr(cfg, k) if cfg.engine == "vllm" else None
    return identity


def run_stage1(
    cfg: Stage1Config,
    *,
    rows: list[dict] | None = None,
    reward_fn: Callable | None = None,
    progress: bool = True,
    engine=None,
    reference_engine=None,
) -> dict:
    """Run (or resume) Stage 1 and return a summary dict (also stored in the manifest).

    Args:
        cfg: the configuration.
        rows: programmatic prompt rows (``id``, ``prompt`` and reward fields) instead of
            ``cfg.dataset`` (which is then only recorded).
        reward_fn: programmatic reward with TRL's signature
            ``f(prompts, completions, completion_ids, **columns) -> list[float]`` (columns = the
            rows' other fields, one entry per completion) instead of ``cfg.reward``; its
            ``__qualname__`` is recorded.
        engine: a ready proposal :class:`~tiltlab.llm.rollout.RolloutEngine` of ``cfg.proposal``
            (e.g. one vLLM engine shared by several runs) instead of building one from ``cfg``.
        reference_engine: a ready :class:`~tiltlab.llm.rollout.VLLMEngine` of ``cfg.reference`` that
            scores pi_ref when ``reference_scoring`` resolves to a second engine (instead of starting one).
    """
    import torch

    from tiltlab.llm.models import default_device
    from tiltlab.objectives import estimators as est
    from tiltlab.progress import progress as progress_bar

    if cfg.truncated_support:
        if not cfg.allow_truncated:
            raise ValueError(
                f"top_k={cfg.top_k} / top_p={cfg.top_p} truncate the proposal's support, which breaks DISA's "
                "absolute-continuity condition (App. C.1) and biases log Z_hat low. Use top_k=0, top_p=1, "
                "or pass allow_truncated=True (--allow-truncated) to proceed anyway."
            )
        _loud_truncation_warning(cfg)

    # the inputs are checked before anything is written to out_dir
    rows = list(rows) if rows is not None else _load_rows(cfg.dataset)
    if cfg.max_prompts is not None:
        rows = rows[: cfg.max_prompts]
    if not rows:
        raise ValueError(f"no prompts to process: the dataset {cfg.dataset!r} has no rows")
    ids = [str(r["id"]) for r in rows]
    if len(set(ids)) != len(ids):
        raise ValueError("prompt ids must be unique within the dataset")
    reward = resolve_reward(reward_fn if reward_fn is not None else cfg.reward)
    out = Path(cfg.out_dir)
    reward_name = getattr(reward_fn, "__qualname__", repr(reward_fn)) if reward_fn is not None else cfg.reward

    n_shards = (len(rows) + cfg.prompts_per_shard - 1) // cfg.prompts_per_shard
    identity = _identity(cfg, reward_name, ids, rows, cfg.device or default_device())
    man_path = out / MANIFEST
    manifest = json.loads(man_path.read_text()) if man_path.exists() else None
    if manifest is not None:
        old = manifest.get("identity", {})
        diff = {k: (old.get(k), v) for k, v in identity.items() if old.get(k) != v}
        if diff and manifest.get("shards"):
            raise ValueError(
                f"{out} holds a Stage 1 run with a different configuration {diff} (recorded, requested); "
                "use another out_dir or the same settings to resume"
            )
        if diff:  # nothing was produced under the old settings: start afresh
            warnings.warn(f"{out}: replacing a Stage 1 manifest with no finished shard", RuntimeWarning, stacklevel=2)
            manifest = None
    if manifest is None:
        manifest = {
            "format": "tiltlab.stage1/1",
            "identity": identity,
            "shards": {},
            "complete": False,
            "config": asdict(cfg),
            "resumes": [],
        }
    else:  # a resume keeps the first run's config and records what else it changed
        changed = {k: v for k, v in asdict(cfg).items() if manifest.get("config", {}).get(k) != v}
        manifest.setdefault("resumes", []).append(changed)
    manifest.update(
        {
            "n_prompts": len(rows),
            "n_shards": n_shards,
            "beta": cfg.beta,
            "reward_transform": {**cfg.reward_transform(), "reward": reward_name},
            "truncated_support": cfg.truncated_support,
            # log w uses masked-SUM sequence log-probs (trajectory level); Stage 3 must use the same scale
            "logprob_scale": "sum",
            "label": "log_z = LSE_i(log w_i) - log M (DISA eq. 8); log_z_bias_corrected = log_z - delta_method_bias",
        }
    )

    todo = [k for k in range(n_shards) if str(k) not in manifest["shards"]]
    # every refusal (tokenizers, context lengths) happens here, before the first write
    clock = _PhaseTimer()
    with clock("setup"):
        models = (
            _Models(cfg, rows, engine=engine, show_progress=progress, reference_engine=reference_engine)
            if todo
            else None
        )
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob(".*.tmp-*"):  # temporaries of a run killed mid-write
        stale.unlink()
    if models is not None:
        manifest["reference_scoring"] = models.scoring_record  # this invocation's; each shard records its own
    atomic_write_json(man_path, manifest)
    pp = cfg.prompts_per_shard
    # the bar counts this invocation's prompts, so a resumed run's rate and ETA are its own
    resumed = f" (resumed: {n_shards - len(todo)}/{n_shards} shards done)" if len(todo) < n_shards else ""
    bar = progress_bar(
        sum(len(rows[k * pp : (k + 1) * pp]) for k in todo),
        desc=f"stage1{resumed}",
        unit="prompt",
        mode=None if progress else "off",
    )

    def finish(k: int, shard: dict, scored) -> None:
        """Weights, labels and the atomic writes of shard ``k`` (in shard order, in this thread)."""
        sl = slice(k * pp, (k + 1) * pp)
        if isinstance(scored, Future):  # scored by the reference engine while later shards were sampled
            with clock("score_wait"):
                scored, seconds = scored.result()
            clock.seconds["score"] = clock.seconds.get("score", 0.0) + seconds
        samples, labels = _run_shard(cfg, models, rows[sl], sl, k, reward, est, torch, clock, shard, scored)
        s_name, l_name = f"samples-{k:05d}.parquet", f"labels-{k:05d}.parquet"
        with clock("io"):
            write_parquet(out / s_name, samples, fsync=True)
            write_parquet(out / l_name, labels, fsync=True)
        _crash_hook(k + 1, "before_manifest")
        manifest["shards"][str(k)] = {
            "samples": s_name,
            "labels": l_name,
            "n_prompts": len(rows[sl]),
            "n_samples": samples.num_rows,
            "prompt_ids": ids[sl],
            "reference_scoring": {"path": models.scoring_record, **scored[1]},
        }
        atomic_write_json(man_path, manifest)
        bar.update(len(rows[sl]), postfix=f"shard {k + 1}/{n_shards} written")
        _crash_hook(k + 1, "after_manifest")

    # a second (reference) engine scores shard k in a worker thread while the proposal samples
    # shard k + 1; shards are still finished and written one by one, in order
    pool = ThreadPoolExecutor(1, thread_name_prefix="stage1-score") if models and models.ref_engine else None
    try:
        pending = None
        for k in todo:
            sl = slice(k * pp, (k + 1) * pp)
            clock.on_phase = lambda phase, k=k: bar.update(0, postfix=f"shard {k + 1}/{n_shards}: {phase}")
            shard = _sample_shard(cfg, models, rows[sl], sl, k, clock)
            if pool is None:
                with clock("score"):
                    scored = _score_reference(models, shard, cfg, torch)
                finish(k, shard, scored)
                continue
            future = pool.submit(_timed, _score_reference, models, shard, cfg, torch)
            if pending is not None:
                finish(*pending)
            pending = (k, shard, future)
        if pending is not None:
            finish(*pending)
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        if models is not None:
            models.close()
    bar.close()

    samples, lab = load_stage1(out)
    summary = _summary(lab, cfg)
    # vacuous-run guard: one warning line per condition, recorded in the manifest ([] = checked, none held)
    manifest["signal"] = _signal_record(samples, lab, cfg)
    summary["signal_warnings"] = [f["kind"] for f in manifest["signal"]]
    manifest["complete"] = True
    manifest["summary"] = summary
    manifest["seconds"] = clock.seconds  # this invocation's wall time per phase (see _PhaseTimer)
    atomic_write_json(man_path, manifest)
    return summary


def _hf_reference_logprobs(models: _Models, flat_p, flat_c, batch_size: int, torch):
    """``[N]`` log pi_ref(c | p) by transformers teacher forcing (temperature 1)."""
    from tiltlab.llm.scoring import score_completions

    # longest first: batches of similar lengths waste little compute on padding
    order = sorted(range(len(flat_c)), key=lambda i: -(len(flat_p[i]) + len(flat_c[i])))
    sc = score_completions(
        models.ref,
        [flat_p[i] for i in order],
        [flat_c[i] for i in order],
        pad_token_id=models.ref_tok.pad_token_id,
        batch_size=batch_size,
    )
    seq = torch.empty_like(sc.seq_logprobs)
    seq[torch.tensor(order, device=seq.device)] = sc.seq_logprobs
    return seq


def _vllm_reference_logprobs(engine, flat_p, flat_c, torch):
    """``([N] log pi_ref(c | p), n_rescored, n_cached)`` from a vLLM engine of pi_ref: ``prompt_logprobs=0`` on
    ``p + c`` returns each prompt token's raw (temperature-1) log-prob -- vLLM applies no sampling
    processor to prompt tokens, whatever ``logprobs_mode`` -- and the completion's are summed (float64).

    The prompt's KV is computed once and shared: the requests read the prefix cache (vLLM turns that
    off for prompt log-prob requests by default) under :data:`SCORE_CACHE_SALT`; each prompt's first
    request runs first, and its other M - 1 requests, in a second batch, reuse its cached blocks and
    prefill only the completion (plus the prompt's last partial block). Log-probs exist only for tokens after the cached prefix; the completion's first token is
    predicted from the prompt's last position, so a request whose cache hit reaches past
    ``len(p) - 1`` (a prompt of whole blocks, or completions sharing a block-long start) is scored again
    without reading the cache; ``n_rescored`` counts them, ``n_cached`` counts the tokens read from the
    cache by the requests that kept their first answer."""
    from vllm import SamplingParams

    def params(read_cache: bool):
        return SamplingParams(
            max_tokens=1,
            prompt_logprobs=0,
            detokenize=False,
            temperature=1.0,
            seed=0,
            skip_reading_prefix_cache=not read_cache,
        )

    def request(p, c):
        return {"prompt_token_ids": list(p) + list(c), "cache_salt": SCORE_CACHE_SALT}

    def seq_logprob(p, c, o) -> float:
        lps = o.prompt_logprobs  # [None, {tok: Logprob}, ...] one per prompt token
        if lps is None or len(lps) != len(p) + len(c):
            raise RuntimeError("vLLM returned no prompt log-probs for a reference-scoring request")
        return math.fsum(float(lps[len(p) + t][tok].logprob) for t, tok in enumerate(c))

    # a prompt's first request fills the cache with its blocks, then its other requests read them
    # (requests of one scheduler step cannot read each other's blocks)
    first: list[int] = []
    seen: set[tuple[int, ...]] = set()
    for i, p in enumerate(flat_p):
        if tuple(p) not in seen:
            seen.add(tuple(p))
            first.append(i)
    rest = sorted(set(range(len(flat_c))) - set(first))
    outs: list[Any] = [None] * len(flat_c)
    for part in (first, rest):
        got = engine.llm.generate([request(flat_p[i], flat_c[i]) for i in part], params(True), use_tqdm=False)
        for i, o in zip(part, got):
            outs[i] = o
    seq: list[float] = [0.0] * len(flat_c)
    redo, n_cached = [], 0
    for i, (p, c, o) in enumerate(zip(flat_p, flat_c, outs)):
        cached = o.num_cached_tokens
        if cached is None or cached > len(p) - 1:
            redo.append(i)
        else:
            seq[i] = seq_logprob(p, c, o)
            n_cached += cached
    if redo:
        outs = engine.llm.generate([request(flat_p[i], flat_c[i]) for i in redo], params(False), use_tqdm=False)
        for i, o in zip(redo, outs):
            if o.num_cached_tokens:
                raise RuntimeError("vLLM read the prefix cache for a request that asked it not to")
            seq[i] = seq_logprob(flat_p[i], flat_c[i], o)
    return torch.tensor(seq, dtype=torch.float64), len(redo), n_cached


class _PhaseTimer:
    """Wall seconds per phase of one invocation: setup (tokenizers, models, engines), sample (the
    proposal engine), score (pi_ref's scoring pass; with a reference engine it runs in a worker thread
    beside the next shard's sampling, and score_wait is the time the main thread waited for it),
    reward, weights (flat layout, log w, labels, tables), io."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.on_phase: Callable[[str], None] | None = None
        """Called with the phase's name as each phase starts (the progress reporter's postfix)."""

    @contextlib.contextmanager
    def __call__(self, phase: str):
        if self.on_phase is not None:
            self.on_phase(phase)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t0

    def total(self, *phases: str) -> float:
        return sum(self.seconds.get(p, 0.0) for p in phases)


def _sample_shard(
    cfg: Stage1Config, models: _Models, shard_rows: list[dict], sl: slice, k: int, clock: _PhaseTimer
) -> dict:
    """Sample shard ``k`` and lay its completions out flat (prompt-major): ``groups``, ``flat_p`` (pi_ref's
    prompt ids), ``flat_c`` (the completion ids pi_ref scores), ``flat_q`` (the proposal's), ``flat_fin``, ``texts``."""
    with clock("sample"):
        groups = models.engine.generate(models.q_prompt_ids[sl], cfg.M, cfg.sampling(k))
    with clock("weights"):
        M = cfg.M
        flat_p = [p for p in models.ref_prompt_ids[sl] for _ in range(M)]
        flat_q = [c for g in groups for c in g.completion_ids]
        flat_fin = [f for g in groups for f in (g.finished or [False] * M)]
        texts = [t for g in groups for t in g.texts]
        if models.retokenize:
            flat_c = [models.reference_completion(t, f) for t, f in zip(texts, flat_fin)]
            if models.ref_context is not None:
                for j, (p, c) in enumerate(zip(flat_p, flat_c)):
                    if len(p) + len(c) > models.ref_context:
                        raise ValueError(
                            f"prompt {shard_rows[j // M]['id']!r}: the re-tokenized completion ({len(c)} tokens) "
                            f"does not fit the reference's context {models.ref_context}; lower max_new_tokens"
                        )
        else:
            flat_c = flat_q
        if any(len(c) == 0 for c in flat_c):
            raise RuntimeError("the engine returned an empty completion (no sampled token to weight)")
    return {
        "groups": groups,
        "flat_p": flat_p,
        "flat_c": flat_c,
        "flat_q": flat_q,
        "flat_fin": flat_fin,
        "texts": texts,
    }


def _score_reference(models: _Models, shard: dict, cfg: Stage1Config, torch):
    """``(log pi_ref [N] float64 or None, facts for the manifest)`` of a sampled shard; None on the
    "sampler" path, where the sampled log-probs are pi_ref's."""
    if models.scoring == "sampler":
        return None, {}
    if models.scoring == "vllm":
        eng = models.ref_engine if models.ref_engine is not None else models.engine
        seq, n_rescored, n_cached = _vllm_reference_logprobs(eng, shard["flat_p"], shard["flat_c"], torch)
        return seq, {"rescored_without_prefix_cache": n_rescored, "tokens_read_from_prefix_cache": n_cached}
    return _hf_reference_logprobs(models, shard["flat_p"], shard["flat_c"], cfg.score_batch_size, torch), {}


def _timed(fn, *args):
    """``(fn(*args), wall seconds)``: the work of the scoring thread, timed there."""
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


def _run_shard(
    cfg: Stage1Config,
    models: _Models,
    shard_rows: list[dict],
    sl: slice,
    k: int,
    reward,
    est,
    torch,
    clock: _PhaseTimer,
    shard: dict,
    scored: tuple,
):
    import pyarrow as pa

    t_rest, inner0 = time.perf_counter(), clock.total("reward")
    groups, flat_c, flat_q, flat_fin, texts = (shard[n] for n in ("groups", "flat_c", "flat_q", "flat_fin", "texts"))
    P, M = len(groups), cfg.M
    ref_pids = models.ref_prompt_ids[sl]
    logp_q = torch.stack([g.seq_logprobs() for g in groups]).double()  # [P, M]
    seq = scored[0]
    # "sampler" path: proposal == reference at temperature 1, untruncated, so log q IS log pi_ref
    logp_ref = logp_q.clone() if seq is None else seq.detach().double().cpu().view(P, M)  # [P, M]
    cols = sorted({c for r in shard_rows for c in r} - {"prompt"})
    kwargs = {c: [r.get(c) for r in shard_rows for _ in range(M)] for c in cols}
    with clock("reward"):
        r_list = reward([r["prompt"] for r in shard_rows for _ in range(M)], texts, flat_c, **kwargs)
    if len(r_list) != P * M or any(v is None for v in r_list):
        raise ValueError("the reward function must return one number per completion (got None or a wrong count)")
    r_raw = torch.tensor(r_list, dtype=torch.float64).view(P, M)  # [P, M]
    if not torch.isfinite(r_raw).all():
        raise ValueError("the reward function returned a non-finite value")
    from tiltlab.objectives.transforms import affine_reward

    r_tilde = affine_reward(r_raw, cfg.reward_scale, cfg.reward_shift)  # the recorded fixed transform
    log_w = est.log_importance_weights(logp_ref, logp_q, cfg.beta * r_tilde)  # [P, M]

    lab = {
        "log_z": est.log_partition_lse(log_w),
        "log_z_bias_corrected": est.bias_corrected_log_partition(log_w) if M > 1 else torch.full((P,), float("nan")),
        "log_z_geomean": est.log_partition_geomean(log_w),
        "delta_bias": est.delta_method_bias(log_w),
        "ess": est.effective_sample_size(log_w),
        "max_weight": est.max_normalized_weight(log_w),
    }
    labels = pa.table(
        {
            "prompt_id": [str(r["id"]) for r in shard_rows],
            "prompt": [r["prompt"] for r in shard_rows],
            # the exact conditioning string of pi_ref the label belongs to (chat template applied)
            "prompt_text": models.prompt_texts[sl],
            "prompt_n_tokens": pa.array([len(p) for p in ref_pids], pa.int32()),
            "M": pa.array([M] * P, pa.int32()),
            **{name: pa.array(v.tolist(), pa.float64()) for name, v in lab.items()},
            "n_reward_bearing": pa.array((r_raw > 0).sum(-1).tolist(), pa.int32()),
            "mean_reward": pa.array(r_raw.mean(-1).tolist(), pa.float64()),
        }
    )
    scols = {
        "prompt_id": [str(r["id"]) for r in shard_rows for _ in range(M)],
        "sample_idx": pa.array([j for _ in range(P) for j in range(M)], pa.int32()),
        "completion": texts,
        "completion_ids": pa.array(flat_c, pa.list_(pa.int32())),
        "n_tokens": pa.array([len(c) for c in flat_c], pa.int32()),
        "finished": flat_fin,
        "logp_proposal": pa.array(logp_q.flatten().tolist(), pa.float64()),
        "logp_ref": pa.array(logp_ref.flatten().tolist(), pa.float64()),
        "reward_raw": pa.array(r_raw.flatten().tolist(), pa.float64()),
        "reward": pa.array(r_tilde.flatten().tolist(), pa.float64()),
        "log_w": pa.array(log_w.flatten().tolist(), pa.float64()),
    }
    if models.retokenize:
        scols["proposal_completion_ids"] = pa.array(flat_q, pa.list_(pa.int32()))
    out = pa.table(scols), labels
    rest = time.perf_counter() - t_rest - (clock.total("reward") - inner0)
    clock.seconds["weights"] = clock.seconds.get("weights", 0.0) + rest
    return out


def load_stage1(out_dir: str | Path):
    """``(samples, labels)`` pyarrow Tables of the shards recorded in the manifest (files of an
    unrecorded, interrupted shard are ignored). Raises on duplicate (prompt_id, sample_idx)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out_dir)
    man_path = out / MANIFEST
    if not man_path.exists():
        raise FileNotFoundError(f"no Stage 1 manifest at {man_path}")
    manifest = json.loads(man_path.read_text())
    shards = [manifest["shards"][k] for k in sorted(manifest["shards"], key=int)]
    if not shards:
        raise ValueError(f"{out} has no finished shard")
    samples = pa.concat_tables([pq.read_table(out / s["samples"]) for s in shards])
    labels = pa.concat_tables([pq.read_table(out / s["labels"]) for s in shards])
    keys = list(zip(samples.column("prompt_id").to_pylist(), samples.column("sample_idx").to_pylist()))
    if len(set(keys)) != len(keys):
        raise ValueError(f"{out}: duplicate (prompt_id, sample_idx) rows")
    pids = labels.column("prompt_id").to_pylist()
    if len(set(pids)) != len(pids):
        raise ValueError(f"{out}: duplicate prompt_id labels")
    return samples, labels


def read_manifest(out_dir: str | Path) -> dict:
    return json.loads((Path(out_dir) / MANIFEST).read_text())


def _summary(labels, cfg: Stage1Config) -> dict:
    import math

    def mean(col):
        v = [x for x in labels.column(col).to_pylist() if x is not None and math.isfinite(x)]
        return sum(v) / len(v) if v else float("nan")

    lz = labels.column("log_z").to_pylist()
    return {
        "n_prompts": labels.num_rows,
        "M": cfg.M,
        "beta": cfg.beta,
        "mean_log_z": mean("log_z"),
        "mean_log_z_bias_corrected": mean("log_z_bias_corrected"),
        "mean_delta_bias": mean("delta_bias"),
        "mean_ess": mean("ess"),
        "mean_max_weight": mean("max_weight"),
        "frac_prompts_with_reward": sum(1 for n in labels.column("n_reward_bearing").to_pylist() if n > 0)
        / max(1, labels.num_rows),
        "n_nonfinite_labels": sum(1 for x in lz if not math.isfinite(x)),
    }


def _signal_record(samples, labels, cfg: Stage1Config) -> list[dict]:
    """The vacuous-run conditions of :mod:`tiltlab.llm.learning_signal` on all recorded shards: all
    rewards of the dataset equal, and a degenerate ESS (equal weights or one sample on every prompt)."""
    from tiltlab.llm import learning_signal as ls

    rewards = samples.column("reward_raw").to_pylist()
    scope = f"dataset ({labels.num_rows} prompts x {cfg.M} samples)"
    return ls.report(
        [
            ls.equal_rewards(rewards, stage="stage1", scope=scope),
            ls.degenerate_ess(labels.column("ess").to_pylist(), cfg.M, stage="stage1"),
        ],
        stacklevel=3,
    )


def config_fields() -> list[str]:
    return [f.name for f in fields(Stage1Config)]


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------


def add_cli(subparsers) -> None:
    """``tiltlab llm stage1``: flags = :class:`Stage1Config` fields."""
    from tiltlab.dataclass_cli import add_dataclass_args

    p = subparsers.add_parser(
        "stage1",
        help="DISA Stage 1: importance-sampled log Z labels (resumable sharded Parquet)",
        description=__doc__.split("\n\n")[0] + " Refuses top-k/top-p truncation unless --allow-truncated.",
    )
    add_dataclass_args(p, Stage1Config, config_section="stage1")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_cli_main)


def _cli_main(args) -> int:
    from tiltlab.llm.config_args import config_from_args

    cfg = config_from_args(Stage1Config, args, section="stage1")  # errors: one line, exit 2 (tiltlab.cli)
    summary = run_stage1(cfg, progress=not args.quiet)
    print(json.dumps(summary, indent=2))
    print(f"labels and samples written to {cfg.out_dir}")
    return 0
