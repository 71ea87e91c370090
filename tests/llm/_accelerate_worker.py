"""Run by tests/llm/test_accelerate.py under `accelerate launch --num_processes 2` (CPU, gloo):
two optimizer steps of the online trainer, then each rank saves its parameters."""

import sys
from pathlib import Path

import torch
from datasets import Dataset

from tiltlab.llm.models import load_model, load_tokenizer
from tiltlab.llm.tasks import arithmetic_tasks
from tiltlab.llm.trainers.online import TiltGRPOConfig, TiltGRPOTrainer


def reward(prompts, completions, completion_ids, **kw):
    return [float(sum(ids) % 2 == 0) for ids in completion_ids]


def main(tiny_dir: str, out_dir: str, objective: str) -> None:
    rows = arithmetic_tasks(16, difficulty=1, seed=0)
    ds = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]} for r in rows]
    )
    args = TiltGRPOConfig(
        output_dir=out_dir,
        objective=objective,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=6,
        max_steps=2,
        learning_rate=1e-2,
        report_to="none",
        use_cpu=True,
        logging_steps=1,
        save_strategy="no",
        remove_unused_columns=False,
        seed=0,
        disable_tqdm=True,
        ddp_backend="gloo",
    )
    tr = TiltGRPOTrainer(
        model=load_model(tiny_dir, device="cpu"),
        reward_funcs=reward,
        args=args,
        train_dataset=ds,
        processing_class=load_tokenizer(tiny_dir),
    )
    init = {k: v.detach().clone() for k, v in tr.model.named_parameters()}
    tr.train()
    rank = tr.accelerator.process_index
    model = tr.accelerator.unwrap_model(tr.model)
    state = {k: v.detach().cpu() for k, v in model.named_parameters()}
    changed = sum(not torch.equal(state[k], init[k]) for k in state)
    torch.save(
        {
            "state": state,
            "changed": changed,
            "world": tr.accelerator.num_processes,
            "losses": [h["loss"] for h in tr.state.log_history if "loss" in h and "train_loss" not in h],
        },
        Path(out_dir) / f"rank{rank}.pt",
    )


if __name__ == "__main__":
    main(*sys.argv[1:4])
