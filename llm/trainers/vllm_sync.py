"""How :class:`~tiltlab.llm.trainers.online.TiltGRPOTrainer` adapts TRL's vLLM weight sync
(``trl.generation.vllm_generation.VLLMGeneration``, TRL 1.x).

TRL pushes the policy's weights into vLLM before each new generation step: ``sync_weights`` walks
``_iter_named_params()`` (``model.named_parameters()`` with PEFT/FSDP names fixed up) and, in colocate
mode, calls ``model_runner.model.load_weights([(name, tensor)])`` once per parameter; in server mode it
streams the same pairs to ``trl vllm-serve``. Two things break that on this project's runs:

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
"""

from __future__ import annotations

from typing import Any

from .logz_head import without_log_z_head

__all__ = ["keep_log_z_head_out", "reload_on_cpu", "retie_lm_head"]


def _require(gen: Any, attr: str) -> None:
    if not callable(getattr(gen, attr, None)):
        raise RuntimeError(
            f"this TRL version's VLLMGeneration has no {attr}(): tiltlab's vLLM weight-sync adapter "
            "(llm/trainers/vllm_sync.py) targets TRL 1.x; use that or use_vllm=False"
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
    import torch

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
