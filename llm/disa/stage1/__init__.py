"""DISA Stage 1: importance-sampled partition-function labels ``log Z_hat_M(x)``.

DISA §3.1 eqs. (7)-(8) (``docs/math.md`` §1). For each prompt ``x``:

1. draw ``y_1..y_M ~ q(.|x)`` from the proposal through a rollout engine (``llm.base.rollout``),
   keeping ``log q(y_i|x)`` of the distribution actually sampled (processed log-probs);
2. score ``log pi_ref(y_i|x)`` at temperature 1 (``reference_scoring``): no pass at all when the
   proposal is pi_ref sampled at T = 1 untruncated (the sampled log-probs are pi_ref's); else the
   prompt log-probs of ``x + y_i`` from a vLLM engine (the proposal's when it is pi_ref, reading the
   prompt's KV from the prefix cache; or a second engine of pi_ref, overlapped with the next shard's
   sampling); else transformers teacher forcing (``llm.base.scoring``);
3. reward ``r(x, y_i)`` (``llm.base.rewards``) and transform it, ``r~ = a r + c`` (a fixed affine map,
   recorded with ``beta`` in the manifest);
4. ``log w_i = log pi_ref + beta r~ - log q`` and the per-prompt label ``log Z_hat_M`` (LSE) with
   its diagnostics -- all from ``objectives.estimators`` (no formula lives here).

Absolute continuity (App. C.1) needs ``q > 0`` wherever ``pi_ref exp(beta r~) > 0``: a truncating
sampler (top-k > 0, top-p < 1, greedy) violates it and biases the labels low by the tilted mass it
cannot reach. Such settings are refused unless ``allow_truncated`` (then warned about loudly and
recorded as ``truncated_support`` in the manifest).

Output directory (resumable, every file written atomically: temporary file + ``os.replace``)::

    manifest.json                 config, reward transform, beta, prompt list hash, finished shards,
                                  signal (vacuous-run findings, tiltlab.llm.base.learning_signal)
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

The package, one module per concern: :mod:`.config` (:class:`Stage1Config`), :mod:`.manifest` (the output
folder and its manifest), :mod:`.engines` (models, engines, pi_ref's scoring pass), :mod:`.pipeline`
(:func:`run_stage1`) and :mod:`.cli` (``tiltlab llm stage1``). This module re-exports what the rest of the
project uses.
"""

from __future__ import annotations

from tiltlab.llm.disa.stage1.cli import add_cli
from tiltlab.llm.disa.stage1.config import (
    CRASH_ENV,
    MANIFEST,
    SCORING_MODES,
    TOKENIZER_MODES,
    Stage1Config,
    config_fields,
    sampler_not_reference,
)
from tiltlab.llm.disa.stage1.engines import (
    SCORE_CACHE_SALT,
    _Models,
    _vllm_reference_logprobs,
    resolve_reference_scoring,
    vllm_proposal_engine,
    vllm_reference_engine,
)
from tiltlab.llm.disa.stage1.manifest import atomic_write_json, load_stage1, read_manifest
from tiltlab.llm.disa.stage1.pipeline import _load_rows, _PhaseTimer, run_stage1

__all__ = [
    "CRASH_ENV",
    "MANIFEST",
    "SCORE_CACHE_SALT",
    "SCORING_MODES",
    "TOKENIZER_MODES",
    "Stage1Config",
    "_Models",
    "_PhaseTimer",
    "_load_rows",
    "_vllm_reference_logprobs",
    "add_cli",
    "atomic_write_json",
    "config_fields",
    "load_stage1",
    "read_manifest",
    "resolve_reference_scoring",
    "run_stage1",
    "sampler_not_reference",
    "vllm_proposal_engine",
    "vllm_reference_engine",
]
