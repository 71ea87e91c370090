"""Training a real pretrained model with ``tiltlab llm train`` (TRL + colocated vLLM), as users run it:
the parts the real-model checks share.

:func:`train_config` is one run's config (DISA and FlowRL share beta, the untransformed 0/1 reward and
the unnormalized trajectory residual; they differ only in where ``log Z`` comes from), :func:`trained_items`
says whether a run trained ("it ran"), :func:`weights_moved` how far its weights moved and
:func:`step_times` where a step's time went. The check that used them until 2026-11-28
(``smollm2_135m_colocate``: 12 steps, 2 seeds averaged into held-out-prompt units, a bespoke mapping
in which one losing baseline refuted the claim, GRPO without a KL term) was withdrawn; its redesign,
with training runs as units and a same-optimum GRPO, is the long check of
:mod:`tiltlab.llm.checks.real_comparison`.
"""

from __future__ import annotations

import math
from pathlib import Path

ALIAS = "smollm2-135m"
BETA = 2.0
NEW_TOKENS = 16
PROMPTS_PER_STEP = 4
G = 4
LR = 5e-5
KV_CACHE_BYTES = 64 << 20
"""The colocated engine's KV cache in each training process (16 sequences of < 100 tokens)."""
MAX_MODEL_LEN = 512


def train_config(objective: str, task: dict, out: Path, seed: int, steps: int) -> dict:
    """The ``tiltlab llm train`` config of one run (DISA and FlowRL share beta, reward and residual)."""
    trl = {
        "learning_rate": LR,
        "per_device_train_batch_size": PROMPTS_PER_STEP * G,
        "num_generations": G,
        "max_completion_length": NEW_TOKENS,
        "max_steps": steps,
        "temperature": 1.0,
        "beta": 0.0,
        "use_cpu": True,
        "report_to": "none",
        "save_strategy": "no",
        "logging_steps": 1,
        "disable_tqdm": True,
        "seed": seed,
        "use_vllm": True,
        "vllm_mode": "colocate",
        "vllm_kv_cache_memory_bytes": KV_CACHE_BYTES,
        "vllm_max_model_length": MAX_MODEL_LEN,
    }
    cfg: dict = {
        "kind": "online",
        "objective": objective,
        "model": ALIAS,
        "dataset": task["train"],
        "reward": "math",
        "output_dir": str(out),
        "trl": trl,
    }
    if objective in ("disa", "flowrl"):
        cfg["tilt_beta"] = BETA
        trl.update(reward_transform="affine", logprob_scale="sum")
    if objective == "disa":
        trl["disa_label"] = "column"
        cfg["disa"] = {"stage1_dir": task["stage1_dir"]}
    return cfg


def weights_moved(start: dict, model_dir: str) -> float:
    """Largest absolute change of any weight between ``start`` and the model saved in ``model_dir``."""
    from safetensors.torch import load_file

    end = load_file(str(Path(model_dir) / "model.safetensors"))
    common = [k for k in start if k in end]
    if not common:
        raise RuntimeError(f"{model_dir}: no weight name in common with the base model")
    return max(float((end[k].float() - start[k].float()).abs().max()) for k in common)


def trained_items(history: list[dict], moved: float) -> tuple[bool, dict[str, float]]:
    """ "It trained": every step logged a finite loss, the losses are not all exactly 0 (a run with
    no signal has loss and gradient 0), the gradient norm was positive at some step, and the weights
    moved. Returns ``(holds, numbers)``."""
    steps = [h for h in history if "loss" in h]
    losses = [float(h["loss"]) for h in steps]
    grads = [float(h.get("grad_norm", math.nan)) for h in steps]
    ok = (
        bool(steps)
        and all(math.isfinite(v) for v in losses + grads)
        and any(v != 0.0 for v in losses)
        and max(grads) > 0.0
        and moved > 0.0
    )
    nums = {
        "steps": float(len(steps)),
        "max_abs_loss": max((abs(v) for v in losses), default=math.nan),
        "max_grad_norm": max(grads, default=math.nan),
        "max_weight_change": moved,
        "mean_train_reward": sum(float(h.get("reward", math.nan)) for h in steps) / max(len(steps), 1),
    }
    return ok, nums


def step_times(history: list[dict]) -> dict[str, float]:
    """Mean seconds per optimizer step and its parts from the log history (the trainer records TRL's
    profiled blocks as ``time/<name>``; ``step_time`` is TRL's whole training step, rollout included)."""
    steps = [h for h in history if "loss" in h]
    keys = sorted({k for h in steps for k in h if k.startswith("time/") or k == "step_time"})
    return {k: sum(float(h.get(k, 0.0)) for h in steps) / len(steps) for k in keys} if steps else {}
