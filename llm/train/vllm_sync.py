"""How :class:`~tiltlab.llm.train.online.TiltGRPOTrainer` adapts TRL's vLLM weight sync
(``trl.generation.vllm_generation.VLLMGeneration``, TRL 1.x).

TRL pushes the policy's weights into vLLM before each new generation step: ``sync_weights`` walks
``_iter_named_params()`` (``model.named_parameters()`` with PEFT/FSDP names fixed up) and, in colocate
mode, calls ``model_runner.model.load_weights([(name, tensor)])`` once per parameter; in server mode it
streams the same pairs to ``trl vllm-serve``. Four things break that, or the agreement between trainer
and sampler it exists for, on this project's runs:

1. **The learned log Z head** (FlowRL, PACED: ``model.log_z_head``) is a policy submodule vLLM's model
   does not have; ``load_weights`` raises "There is no module or parameter named 'log_z_head'" at the
   first sync. :func:`keep_log_z_head_out` filters the walk (both modes), so the head stays in the
   policy's optimizer, state dict and checkpoints and never reaches vLLM.
2. **vLLM on CPU** repacks every linear layer's weight for its CPU GEMM kernels after loading
   (``dispatch_cpu_unquantized_gemm(layer, remove_weight=True)`` in ``vllm/model_executor/layers/
   linear.py``): the layer's ``weight`` becomes an empty Parameter without a ``weight_loader``, so TRL's
   per-parameter ``load_weights`` fails with "'Parameter' object has no attribute 'weight_loader'" (and
   would leave the packed copy stale anyway). :func:`reload_on_cpu` makes the colocate sync call vLLM's
   in-place reload (``model_runner.reload_weights(weights_iterator=..., is_checkpoint_format=True)``),
   which restores the layers to checkpoint format, loads the pairs and repacks them.
3. **Tied embeddings on CPU**: the output layer ``lm_head`` shares ``embed_tokens.weight`` and packs its
   own GEMM copy of it. The walk sends the shared tensor once, under the embedding's name, so the
   reload sees no weight for ``lm_head`` and puts its old kernel tensors back: vLLM would sample from
   the initial output layer forever. :func:`retie_lm_head` re-ties it and repacks its GEMM copy.

4. **The trainer's precision on CPU**: TRL's configs default ``bf16`` to True (unless ``fp16``), so on CPU
   accelerate runs the trainer's forward under ``torch.autocast("cpu", dtype=torch.bfloat16)``: the
   log-probs TRL compares with vLLM's (``old_per_token_logps``, the importance-sampling ratio) and the
   loss's log-probs come from bf16 matmuls of the fp32 policy, while the colocated vLLM samples from the
   same fp32 weights in fp32. On SmolLM2-135M that alone made the two log-probs of the same token differ by
   0.016 on average and up to 0.1-0.6 (sequence IS ratios 0.33-2.7 in three steps); in fp32 on both
   sides they agree to 1e-5 (``docs/colocate.md``). :func:`cpu_trainer_bf16` keeps an unset ``bf16`` off
   on a CPU run with vLLM, and says so when ``bf16=True`` is set explicitly.

TRL's colocate mode also builds its ``vllm.LLM`` with GPU settings only (``gpu_memory_utilization``,
CUDA graphs, chunked prefill, the checkpoint's dtype). :func:`cpu_colocate_llm` adapts that construction
when there is no CUDA device (see :func:`cpu_llm_kwargs`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch

from tiltlab.llm.base.rollout import CPU_KV_CACHE_BYTES, cpu_prefill_kwargs
from tiltlab.llm.disa.logz_head import without_log_z_head

__all__ = [
    "cpu_colocate_llm",
    "cpu_llm_kwargs",
    "cpu_trainer_bf16",
    "keep_log_z_head_out",
    "reload_on_cpu",
    "retie_lm_head",
]

logger = logging.getLogger(__name__)

_DTYPE_NAMES = {"torch.float32": "float32", "torch.bfloat16": "bfloat16", "torch.float16": "float16"}


def cpu_trainer_bf16(bf16: bool | None, fp16: bool, use_vllm: bool, on_cpu: bool) -> bool | None:
    """The ``bf16`` a TRL config should carry so that the trainer scores tokens at vLLM's precision.

    TRL resolves an unset ``bf16`` (None) to ``not fp16``; on a CPU run with vLLM that turns on bf16
    autocast in the trainer while vLLM runs the fp32 policy (module docstring, item 4). There an unset
    ``bf16`` becomes False; an explicit ``bf16=True`` is kept with a warning (the importance-sampling
    ratio then carries the bf16 rounding). Everything else (GPUs, no vLLM, a set value) is returned as is.
    """
    if not (use_vllm and on_cpu) or fp16:
        return bf16
    if bf16 is None:
        return False
    if bf16:
        logger.warning(
            "bf16=True on CPU with vLLM: the trainer autocasts to bf16 while vLLM samples the fp32 policy in fp32, "
            "so their log-probs of a token differ by ~2e-2 (up to ~0.5) and the importance-sampling ratio absorbs "
            "it; leave bf16 unset for fp32 on both sides (docs/colocate.md)"
        )
    return bf16


def cpu_llm_kwargs(kwargs: dict[str, Any], dtype: Any = None, kv_cache_memory_bytes: int | None = None) -> dict:
    """TRL's colocate ``LLM(**kwargs)`` arguments adapted to vLLM's CPU backend:

    * ``enforce_eager=True``: no ``torch.compile`` (the engine starts in ~25 s instead of ~90 s);
    * ``kv_cache_memory_bytes`` (default :data:`~tiltlab.llm.base.rollout.CPU_KV_CACHE_BYTES`) instead of
      ``gpu_memory_utilization``, a fraction of the NUMA node's memory that fails on a shared machine;
    * ``enable_chunked_prefill=False`` with a step budget covering the context: vLLM 0.32's CPU worker
      crashes on a seeded request whose prefill is split across steps ("CPU Generator does not use
      offset"; see :class:`~tiltlab.llm.base.rollout.VLLMEngine`);
    * ``dtype``: the policy's, so vLLM samples from the weights being trained, not a cast of them.
    """

    out = dict(kwargs)
    out.pop("gpu_memory_utilization", None)
    out["enforce_eager"] = True
    out["kv_cache_memory_bytes"] = int(kv_cache_memory_bytes or CPU_KV_CACHE_BYTES)
    budget = int(out.get("max_num_batched_tokens") or 0)
    out.update(cpu_prefill_kwargs(str(out.get("model", "")), out.get("max_model_len")))
    out["max_num_batched_tokens"] = max(out["max_num_batched_tokens"], budget)
    if dtype is not None:
        out["dtype"] = _DTYPE_NAMES.get(str(dtype), dtype)
    return out


@contextlib.contextmanager
def cpu_colocate_llm(policy_dtype: Callable[[], Any], kv_cache_memory_bytes: int | None = None) -> Iterator[None]:
    """While active and without CUDA, the ``LLM`` that TRL's colocate mode constructs
    (``trl.generation.vllm_generation.LLM``) gets :func:`cpu_llm_kwargs`; restored on exit (also on
    error). ``policy_dtype()`` is asked at construction time (the policy is loaded by then). A no-op on
    GPUs or where TRL's vLLM backend is unavailable."""

    if torch.cuda.is_available():
        yield
        return
    try:
        import trl.generation.vllm_generation as vg
    except ImportError:  # pragma: no cover - TRL layout changed; VLLMGeneration will say so
        yield
        return
    real = getattr(vg, "LLM", None)
    if real is None:  # vLLM not installed: TRL raises its own error when use_vllm is set
        yield
        return

    def llm_on_cpu(*args: Any, **kwargs: Any) -> Any:
        kw = cpu_llm_kwargs(kwargs, policy_dtype(), kv_cache_memory_bytes)
        logger.warning(
            "vLLM colocate on CPU: enforce_eager, KV cache %d MiB (vllm_kv_cache_memory_bytes) instead of "
            "gpu_memory_utilization, chunked prefill off, dtype %s",
            kw["kv_cache_memory_bytes"] >> 20,
            kw.get("dtype", "auto"),
        )
        return real(*args, **kw)

    vg.LLM = llm_on_cpu
    try:
        yield
    finally:
        vg.LLM = real


def _require(gen: Any, attr: str) -> None:
    if not callable(getattr(gen, attr, None)):
        raise RuntimeError(
            f"this TRL version's VLLMGeneration has no {attr}(): tiltlab's vLLM weight-sync adapter "
            "(llm/train/vllm_sync.py) targets TRL 1.x; use that or use_vllm=False"
        )


def keep_log_z_head_out(gen: Any) -> None:
    """Make ``gen``'s weight walk skip the log Z head's parameters (every parameter is still
    gathered, so ZeRO-3 / FSDP collectives stay matched across processes)."""
    _require(gen, "_iter_named_params")
    iter_all = gen._iter_named_params
    gen._iter_named_params = lambda: without_log_z_head(iter_all())


def reload_on_cpu(gen: Any) -> None:
    """On a colocated CPU vLLM, sync through vLLM's in-place reload instead of per-parameter
    ``load_weights`` (see the module docstring); no-op in server mode or on GPUs."""

    if getattr(gen, "mode", None) != "colocate" or torch.cuda.is_available():
        return
    _require(gen, "_iter_named_params")

    def sync_weights() -> None:
        runner = gen.llm.llm_engine.model_executor.driver_worker.model_runner
        runner.reload_weights(weights_iterator=gen._iter_named_params(), is_checkpoint_format=True)
        retie_lm_head(runner.get_model())
        gen.llm.reset_prefix_cache()

    gen.sync_weights = sync_weights


def retie_lm_head(model: Any) -> bool:
    """After an in-place reload on CPU, point a tied ``lm_head`` at the reloaded embedding again and
    rebuild its CPU GEMM copy (``quant_method.process_weights_after_loading``). Returns whether it did."""
    cfg = getattr(model, "config", None)
    text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    lm_head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)  # vLLM's decoder-only layout
    if not getattr(text_cfg, "tie_word_embeddings", False) or lm_head is None or embed is None:
        return False
    if not hasattr(embed, "weight") or not hasattr(lm_head, "quant_method"):
        raise RuntimeError("tied lm_head without a weight / quant_method: cannot refresh it after the reload")
    lm_head.weight = embed.weight
    lm_head.quant_method.process_weights_after_loading(lm_head)
    return True
