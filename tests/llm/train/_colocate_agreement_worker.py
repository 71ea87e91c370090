"""Run by tests/llm/train/test_colocate_agreement.py in a subprocess (TRL's colocated engine sets the process's
distributed environment): two steps of ``TiltGRPOTrainer`` (GRPO) on ``smollm2-135m`` with TRL's colocated
vLLM on CPU, built as ``tiltlab llm train`` builds it. Every generation batch is recorded as TRL hands it
to the loss: the tokens vLLM sampled, vLLM's log-probs of them (``sampling_per_token_logps``, processed:
the distribution sampled) and the trainer's own log-probs of the same tokens (``old_per_token_logps``,
TRL's forward under the trainer's precision, what the importance-sampling ratio and the losses use),
plus the initial model's log-probs of those tokens (plain fp32 forward of a separate copy).

The first batch is generated right after TRL's first weight sync, the second right after one optimizer
step and the sync that follows it. ``<out>/report.json`` holds per batch the step, token count and the
max / mean absolute differences ``vllm - trainer`` and ``vllm - initial``.

argv: out_dir [precision]; precision ``unset`` (default: as a user's config, no bf16 key) or ``bf16``
(``bf16=True`` set explicitly: the trainer autocasts to bf16).
"""

import json
import sys
from pathlib import Path

import torch
from _tiny_trainer import online_args
from _tiny_trainer import parity_reward as reward

MODEL = "smollm2-135m"


def initial_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask) -> torch.Tensor:
    """``[B, T]`` log-probs (temperature 1) of the completion tokens under ``model``, one unpadded row at a
    time; 0 on padding."""
    out = torch.zeros(completion_ids.shape, dtype=torch.float64)
    for i in range(completion_ids.shape[0]):
        p = prompt_ids[i][prompt_mask[i].bool()].tolist()
        c = completion_ids[i][completion_mask[i].bool()].tolist()
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([p + c[:-1]])).logits[0, len(p) - 1 :].double()
        out[i, : len(c)] = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c)[:, None]).squeeze(-1)
    return out


def main(out_dir: str, precision: str = "unset") -> None:
    from datasets import Dataset

    from tiltlab.llm.base.models import load_model, load_tokenizer
    from tiltlab.llm.base.tasks import arithmetic_tasks
    from tiltlab.llm.train.online import TiltGRPOTrainer

    if precision not in ("unset", "bf16"):
        raise ValueError(f"precision must be unset | bf16, got {precision!r}")
    rows = [{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]} for r in arithmetic_tasks(2)]
    args = online_args(
        out_dir,
        "grpo",
        per_device_train_batch_size=4,  # one prompt x four completions per step
        num_generations=4,
        max_completion_length=16,
        learning_rate=1e-5,
        max_steps=2,
        beta=0.0,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_kv_cache_memory_bytes=64 << 20,
        vllm_max_model_length=512,
        **({"bf16": True} if precision == "bf16" else {}),
    )
    tr = TiltGRPOTrainer(
        model=MODEL,
        reward_funcs=reward,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=load_tokenizer(MODEL),
    )
    initial = load_model(MODEL, dtype="float32", device="cpu").eval()
    batches = []
    generate_and_score = tr._generate_and_score_completions

    def recording(inputs):
        out = generate_and_score(inputs)
        mask = out["completion_mask"].bool()
        vllm = out["sampling_per_token_logps"].double()
        trainer = out["old_per_token_logps"].double()
        init = initial_logprobs(initial, out["prompt_ids"], out["prompt_mask"], out["completion_ids"], mask)
        d_trainer, d_initial = (vllm - trainer).abs()[mask], (vllm - init).abs()[mask]
        batches.append(
            {
                "step": tr.state.global_step,
                "tokens": int(mask.sum()),
                "max_vllm_trainer": float(d_trainer.max()),
                "mean_vllm_trainer": float(d_trainer.mean()),
                "max_vllm_initial": float(d_initial.max()),
                "mean_vllm_initial": float(d_initial.mean()),
            }
        )
        return out

    tr._generate_and_score_completions = recording
    tr.train()
    rep = {
        "bf16": bool(tr.args.bf16),
        "mixed_precision": str(tr.accelerator.mixed_precision),
        "policy_dtype": str(next(tr.model.parameters()).dtype),
        "vllm_dtype": str(tr.vllm_generation.llm.llm_engine.model_config.dtype),
        "advantages_nonzero": [h.get("frac_reward_zero_std", 1.0) < 1.0 for h in tr.state.log_history if "loss" in h],
        "batches": batches,
    }
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    (Path(out_dir) / "report.json").write_text(json.dumps(rep))
    print(json.dumps(rep))


if __name__ == "__main__":
    main(*sys.argv[1:3])
