"""`validation:` in a run config: periodic evaluation on held-out prompts (TRL's eval generation,
transformers' eval/checkpoint machinery) and the best checkpoint recorded in best_checkpoint.json."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("trl")

from tiltlab.cli import main
from tiltlab.llm.base.run_config import RunConfig

REWARD = "def parity(prompts, completions, completion_ids, **kw):\n    return [float(sum(ids) % 2 == 0) for ids in completion_ids]\n"


@pytest.mark.parametrize("metric", ["accuracy", "reward"])
def test_best_checkpoint_is_the_argmax_of_the_logged_metric(metric, tiny_dir, tmp_path, monkeypatch):
    import yaml

    (tmp_path / "tilt_val_reward.py").write_text(REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    cfg = {
        "kind": "online",
        "objective": "grpo",
        "model": str(tiny_dir),
        "dataset": "synthetic:math:16:1",
        "reward": "tilt_val_reward:parity",
        "output_dir": str(out),
        "validation": {"holdout_fraction": 0.25, "every_steps": 1, "metric": metric, "k": 4},
        "trl": {
            "per_device_train_batch_size": 8,
            "num_generations": 4,
            "max_completion_length": 6,
            "max_steps": 4,
            "learning_rate": 1e-2,
            "use_cpu": True,
            "report_to": "none",
            "disable_tqdm": True,
            "seed": 0,
        },
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["llm", "train", "--config", str(tmp_path / "run.yaml")]) == 0
    rec = json.loads((out / "best_checkpoint.json").read_text())
    key = f"eval_{metric}"
    hist = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())["log_history"]
    evals = [(h["step"], h[key]) for h in hist if key in h]
    assert [s for s, _ in evals] == [1, 2, 3, 4]  # every_steps=1
    assert len({v for _, v in evals}) > 1  # the metric varies, so the choice is not vacuous
    best_step, best = max(evals, key=lambda sv: sv[1])  # first step with the highest value
    assert rec["metric"] == key and rec["best_metric"] == best
    assert rec["best_checkpoint"] == str(out / f"checkpoint-{best_step}")
    assert (out / f"checkpoint-{best_step}" / "model.safetensors").is_file()
    if metric == "accuracy":
        assert all(v in {i / 16 for i in range(17)} for _, v in evals)  # 4 held-out prompts x k=4 completions


def test_holdout_rows_are_disjoint_and_errors_are_clear():
    from tiltlab.llm.train.cli import _validation

    rows = [{"id": i, "prompt": f"p{i}"} for i in range(20)]
    cfg = RunConfig(model="m", validation={"holdout_fraction": 0.25, "every_steps": 5})
    kw: dict = {"seed": 0, "num_generations": 4}
    train, held = _validation(cfg, rows, kw)
    assert len(held) == 5 and len(train) == 15
    assert not {r["id"] for r in train} & {r["id"] for r in held}
    assert kw["metric_for_best_model"] == "eval_reward" and kw["eval_steps"] == kw["save_steps"] == 5
    for bad, msg in (
        ({"every_steps": 5}, "exactly one of `?dataset"),
        ({"holdout_fraction": 0.2, "every_steps": 0}, "every_steps must be a positive integer"),
        ({"holdout_fraction": 0.2, "every_steps": 1, "metric": "bleu"}, "validation.metric must be one of"),
        ({"holdout_fraction": 1.5, "every_steps": 1}, "holdout_fraction must lie in"),
    ):
        with pytest.raises(ValueError, match=msg):
            _validation(RunConfig(model="m", validation=bad), rows, {})
    with pytest.raises(ValueError, match="unknown keys"):
        RunConfig(model="m", validation={"every": 5})


def _offline_rows(n: int, offset: int = 0) -> list[dict]:
    rows = []
    for i in range(offset, offset + n):
        for c, r in ((f"\\boxed{{{2 * i + 1}}}", 1.0), (f"\\boxed{{{2 * i}}}", 0.0)):
            rows.append({"prompt": f"Compute {i} + {i + 1}.", "completion": c, "reward": r})
    return rows


def test_offline_validation_keeps_the_lowest_held_out_loss(tiny_dir, tmp_path):
    """Offline runs (FPA's early stopping): the objective's loss on held-out prompts every N steps; the
    recorded best checkpoint is the argmin of the logged eval_loss."""
    import yaml

    train, val = tmp_path / "train.jsonl", tmp_path / "train.val.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in _offline_rows(4)))
    val.write_text("".join(json.dumps(r) + "\n" for r in _offline_rows(2, offset=10)))
    out = tmp_path / "run"
    cfg = {
        "kind": "offline",
        "objective": "fpa",
        "model": str(tiny_dir),
        "dataset": str(train),
        "output_dir": str(out),
        "validation": {"dataset": str(val), "every_steps": 1, "metric": "loss"},
        "trl": {
            "per_device_train_batch_size": 2,
            "max_steps": 4,
            "learning_rate": 5e-2,
            "use_cpu": True,
            "report_to": "none",
            "disable_tqdm": True,
            "seed": 0,
        },
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["llm", "train", "--config", str(tmp_path / "run.yaml")]) == 0
    rec = json.loads((out / "best_checkpoint.json").read_text())
    hist = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())["log_history"]
    evals = [(h["step"], h["eval_loss"]) for h in hist if "eval_loss" in h]
    assert [s for s, _ in evals] == [1, 2, 3, 4]
    assert len({v for _, v in evals}) > 1  # the loss moves, so the choice is not vacuous
    best_step, best = min(evals, key=lambda sv: sv[1])
    assert rec["metric"] == "eval_loss" and rec["best_metric"] == best
    assert rec["best_checkpoint"] == str(out / f"checkpoint-{best_step}")


@pytest.mark.parametrize(
    "validation, message",
    [
        ({"holdout_fraction": 0.1, "every_steps": 1}, "needs validation.dataset"),
        ({"dataset": "x.jsonl", "every_steps": 1, "metric": "accuracy"}, "metric for offline runs is 'loss'"),
    ],
)
def test_offline_validation_errors(validation, message, tiny_dir, tmp_path):
    import yaml

    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in _offline_rows(2)))
    cfg = {"kind": "offline", "objective": "fpa", "model": str(tiny_dir), "dataset": str(train)}
    cfg.update(output_dir=str(tmp_path / "run"), validation=validation, trl={"use_cpu": True, "report_to": "none"})
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    from tiltlab.llm.train.cli import build_trainer
    from tiltlab.llm.train.config import load_run_config

    with pytest.raises(ValueError, match=message):
        build_trainer(load_run_config(str(tmp_path / "run.yaml"), []))
