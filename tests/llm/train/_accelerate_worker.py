"""Run by tests/llm/train/test_accelerate.py and test_multinode_and_stop.py, alone or under `accelerate launch`
(CPU, gloo).

``python _accelerate_worker.py TINY_DIR OUT_DIR TRAINER MODE [STEPS]``: ``TRAINER`` is an online
objective (flowrl, disa, paced, grpo, ...) or ``offline``; ``MODE`` is ``ddp``, ``fsdp`` (FSDP2, full
shard, one unit per decoder layer) or ``zero2`` / ``zero3`` (launched with
``configs/accelerate/zero{2,3}.yaml`` and ``DS_ACCELERATOR=cpu``: DeepSpeed on its CPU accelerator).
Plain SGD (the update is ``-lr * grad``, so parameter deltas compare gradients); a global batch of
8 rows (online: 2 prompts x 4 completions) whatever the number of processes. Each rank saves the
full (gathered) parameters before and after, and the logged losses, to ``OUT_DIR/rank{i}.pt``.
``TILTLAB_TEST_GREEDY=1``: online runs decode greedily (the same completions in 1 and 2 processes).
"""

import os
import sys
from pathlib import Path

import torch
from _tiny_trainer import BASE, disa_kwargs
from _tiny_trainer import parity_reward as reward
from datasets import Dataset

from tiltlab.llm.base.models import load_model, load_tokenizer
from tiltlab.llm.base.tasks import arithmetic_tasks


def _common(out_dir: str, mode: str, steps: int, lr: float) -> dict:
    kw = dict(
        output_dir=out_dir,
        max_steps=steps,
        learning_rate=lr,
        optim="sgd",
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=0.0,
        **BASE,
        bf16=False,  # fp32 throughout: FSDP2's bf16 param policy and DDP's bf16 autocast round differently
    )
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return kw
    kw["ddp_backend"] = "gloo"
    if mode == "fsdp":  # FSDP2: one unit per decoder layer and one per Linear (lm_head included, as a
        # size-based policy does for a large vocabulary): the head's weight is a sharded DTensor
        # outside its own forward
        kw["fsdp"] = "full_shard"
        wrap = os.environ.get("TILTLAB_TEST_FSDP_WRAP", "Qwen3DecoderLayer,Linear").split(",")
        kw["fsdp_config"] = {"version": 2, "transformer_layer_cls_to_wrap": wrap}
    if mode.startswith("zero"):  # DeepSpeed ZeRO from the launcher's config (configs/accelerate/zero{2,3}.yaml:
        # ACCELERATE_USE_DEEPSPEED and the plugin settings in the environment) on DeepSpeed's CPU accelerator
        kw["use_cpu"] = False  # with use_cpu transformers never enters its DeepSpeed path
        kw["accelerator_config"] = {"use_configured_state": True}  # the gloo state made in _deepspeed_on_cpu
    return kw


def _deepspeed_on_cpu(mode: str) -> None:
    """accelerate picks no backend for DeepSpeed without an accelerator (``backend=None`` -> one
    process); build the shared state first with gloo and the DeepSpeed flag the launcher sets for a
    ``distributed_type: DEEPSPEED`` config, and let ``TrainingArguments`` use it."""
    if not mode.startswith("zero") or int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return
    from accelerate.state import PartialState

    if os.environ.get("ACCELERATE_USE_DEEPSPEED") != "true":
        raise SystemExit(f"mode {mode}: launch with --config_file configs/accelerate/{mode}.yaml")
    PartialState(backend="gloo")


def _fsdp_on_cpu(args) -> None:
    """accelerate enables FSDP only for accelerator device types (on CPU the state is MULTI_CPU);
    mark the shared process state MULTI_GPU before the Trainer builds its Accelerator so that
    FSDP2 (``fully_shard`` on a gloo CPU mesh) wraps the model."""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    if args.fsdp:
        PartialState._shared_state["distributed_type"] = DistributedType.MULTI_GPU


def _full_params(model) -> dict[str, torch.Tensor]:
    """Full parameters on every rank (DTensor shards all-gathered; same order on every rank)."""
    params = list(model.named_parameters())
    if any(hasattr(v, "ds_id") for _, v in params):  # ZeRO-3: each rank holds a partition; gather them
        import deepspeed

        with deepspeed.zero.GatheredParameters([v for _, v in params]):
            return {k.replace("module.", "", 1): v.detach().cpu().clone() for k, v in params}
    out = {}
    for k, v in params:
        t = v.full_tensor() if hasattr(v, "full_tensor") else v
        out[k.replace("_fsdp_wrapped_module.", "").replace("module.", "", 1)] = t.detach().cpu().clone()
    return out


def online(tiny_dir: str, out_dir: str, objective: str, mode: str, steps: int):
    from tiltlab.llm.train.online import TiltGRPOConfig, TiltGRPOTrainer

    rows = arithmetic_tasks(16, difficulty=1, seed=0)
    ds = [{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]} for r in rows]
    if objective == "disa":  # DISA's frozen label column: a nonzero target, so even a greedy group has a loss
        ds = [{**r, "log_z": 0.1 * (i % 5)} for i, r in enumerate(ds)]
    ds = Dataset.from_list(ds)
    extra = disa_kwargs() if objective == "disa" else {}
    if objective.startswith("paced"):  # paced | paced_live (Z_phi on the live policy's hidden states)
        extra = {"paced_pool_factor": 2, "paced_replay_add": 2}
        if objective == "paced_live":
            objective, extra["paced_embeddings"] = "paced", "live"
    args = TiltGRPOConfig(
        objective=objective,
        per_device_train_batch_size=8 // int(os.environ.get("WORLD_SIZE", "1")),  # a global batch of 2 x 4
        num_generations=4,
        max_completion_length=6,
        log_z_dropout=0.0,
        # TILTLAB_TEST_GREEDY=1: greedy decoding, so that 1 process and 2 processes (each with its own
        # sampling RNG) generate the same completions for the same global batch
        generation_kwargs={"do_sample": False} if os.environ.get("TILTLAB_TEST_GREEDY") == "1" else None,
        **extra,
        **_common(out_dir, mode, steps, 1e-2),
    )
    _fsdp_on_cpu(args)
    return TiltGRPOTrainer(
        model=load_model(tiny_dir, device="cpu"),
        reward_funcs=reward,
        args=args,
        train_dataset=ds,
        processing_class=load_tokenizer(tiny_dir),
    )


def offline(tiny_dir: str, out_dir: str, mode: str, steps: int, world: int):
    from tiltlab.llm.train.offline import OfflineCollator, OfflineConfig, OfflineTrainer, prepare_offline_rows

    tok = load_tokenizer(tiny_dir)
    rows = [
        {
            "prompt": f"What is {i} + {i + 1}?",
            "completion": f"The answer is {2 * i + 1 + (i % 3 == 0)}.",
            "reward": float(i % 3 != 0),
        }
        for i in range(8)
    ]
    ds = Dataset.from_list(prepare_offline_rows(rows, "fpa"))
    args = OfflineConfig(
        objective="fpa",
        per_device_train_batch_size=8 // world,
        **_common(out_dir, mode, steps, 1.0),  # the FPA gradient of 8 rows is small: lr 1 gives deltas ~1e-4
    )
    args.dataloader_drop_last = True
    _fsdp_on_cpu(args)
    tr = OfflineTrainer(
        model=load_model(tiny_dir, device="cpu"),
        args=args,
        ref_model=load_model(tiny_dir, device="cpu"),
        train_dataset=ds,
        data_collator=OfflineCollator(tok, max_length=64),
    )
    return tr


def main(tiny_dir: str, out_dir: str, trainer: str, mode: str, steps: str = "1") -> None:
    n = int(steps)
    _deepspeed_on_cpu(mode)
    if trainer == "offline":
        tr = offline(tiny_dir, out_dir, mode, n, int(os.environ.get("WORLD_SIZE", "1")))
    else:
        tr = online(tiny_dir, out_dir, trainer, mode, n)
    init = _full_params(tr.model)  # ZeRO-3 partitions the parameters when the model is loaded
    mlp = getattr(tr, "_paced_head", None)
    mlp_init = None if mlp is None else {k: v.detach().cpu().clone() for k, v in mlp.state_dict().items()}
    tr.train()
    rank = tr.accelerator.process_index
    final = _full_params(tr.model)
    torch.save(
        {
            "init": init,
            "state": final,
            "world": tr.accelerator.num_processes,
            "model_type": type(tr.model_wrapped).__name__,
            "zero_stage": tr.model_wrapped.zero_optimization_stage()
            if hasattr(tr.model_wrapped, "zero_optimization_stage")
            else None,
            "paced_mlp_init": mlp_init,
            "paced_mlp": None if mlp is None else {k: v.detach().cpu().clone() for k, v in mlp.state_dict().items()},
            "losses": [h["loss"] for h in tr.state.log_history if "loss" in h and "train_loss" not in h],
        },
        Path(out_dir) / f"rank{rank}.pt",
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
