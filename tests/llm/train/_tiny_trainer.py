"""Settings shared by the CPU trainer tests and their subprocess workers: one short run of the tiny
Qwen3 on CPU, nothing saved, no reporting. The tests import it as ``tests.llm.train._tiny_trainer``
(pytest's ``pythonpath`` is the checkout's root); the workers, run as scripts from this folder, import
it as ``_tiny_trainer`` (a script's folder is the first entry of its ``sys.path``)."""

from __future__ import annotations

BASE = dict(
    report_to="none",
    use_cpu=True,
    logging_steps=1,
    save_strategy="no",
    remove_unused_columns=False,
    seed=0,
    disable_tqdm=True,
)
"""``TrainingArguments`` every test run shares (online and offline trainers)."""
ONLINE = dict(per_device_train_batch_size=8, num_generations=4, max_completion_length=6, learning_rate=1e-2, **BASE)
"""Two prompts x four completions of at most six tokens per step."""
DISA_MANIFEST = {"tilt_beta": 2.0, "reward_transform": "identity", "logprob_scale": "sum"}
"""A Stage-1 manifest excerpt that matches ``tilt_beta=2`` (what DISA's trainer checks)."""


def disa_kwargs() -> dict:
    """``TiltGRPOConfig`` fields DISA needs beside the defaults: beta 2 and a matching manifest."""
    return {"tilt_beta": 2.0, "disa_stage1_manifest": dict(DISA_MANIFEST)}


def online_args(output_dir, objective: str, **overrides):
    """``TiltGRPOConfig`` of a test run: :data:`ONLINE` with ``overrides`` applied."""
    from tiltlab.llm.train.online import TiltGRPOConfig

    return TiltGRPOConfig(output_dir=str(output_dir), objective=objective, **{**ONLINE, **overrides})


def parity_reward(prompts, completions, completion_ids, **kw) -> list[float]:
    """1 when the completion's token ids sum to an even number: a reward with both outcomes."""
    return [float(sum(ids) % 2 == 0) for ids in completion_ids]
