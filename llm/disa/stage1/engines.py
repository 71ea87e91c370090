"""Stage 1's models and engines: the vLLM proposal and reference engines, the transformers models, and the
reference's log-probs of the sampled completions (pi_ref's scoring pass)."""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from tiltlab.llm.base.models import context_length, default_device, load_model, load_tokenizer
from tiltlab.llm.base.prompts import format_prompt
from tiltlab.llm.base.rollout import HFEngine, VLLMEngine, vllm_unsupported_reason
from tiltlab.llm.disa.stage1.config import Stage1Config, sampler_not_reference


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
    """The proposal's :class:`~tiltlab.llm.base.rollout.VLLMEngine` for ``cfg`` (processed log-probs).

    On CPU the engine's own CPU defaults apply (eager, KV cache in bytes, no chunked prefill for
    seeded requests; :class:`~tiltlab.llm.base.rollout.VLLMEngine`) unless ``gpu_memory_utilization``
    says otherwise (vLLM's 0.9 default fails there). When the engine also scores pi_ref on CPU, its
    KV blocks are :data:`CPU_SCORING_BLOCK_SIZE` tokens, so that the M scoring requests of a prompt
    share the prompt's cached KV.
    """

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
    """A second :class:`~tiltlab.llm.base.rollout.VLLMEngine`, of the reference, that only scores (prompt
    log-probs are raw temperature-1 log-probs whatever the engine's ``logprobs_mode``). Full precision
    (no quantization), one device, ``cfg.dtype``; on a GPU 0.25 of its memory (the proposal's default
    0.6 leaves room for it); on CPU the engine's KV cache in bytes and :data:`CPU_SCORING_BLOCK_SIZE`."""

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
        f"Stage 1 sampler truncates support ({', '.join(cfg.truncating())}): absolute continuity "
        "(DISA App. C.1) fails and the labels log Z_hat are biased LOW by the tilted mass outside the "
        "truncated support. Proceeding because allow_truncated=True; the manifest records it."
    )
    bar = "!" * 100
    sys.stderr.write(f"\n{bar}\nWARNING: {msg}\n{bar}\n\n")
    warnings.warn(msg, RuntimeWarning, stacklevel=3)


def _hf_reference_logprobs(models: _Models, flat_p, flat_c, batch_size: int, torch):
    """``[N]`` log pi_ref(c | p) by transformers teacher forcing (temperature 1)."""
    from tiltlab.llm.base.scoring import score_completions

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
