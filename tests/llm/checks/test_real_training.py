"""The shared parts of training a real model (``llm/checks/real_training.py``) against naive
computations, with the no-op and NaN runs that must not pass."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from tiltlab.claims import stats as claim_stats
from tiltlab.llm.checks import real_training as R

P = 12


def _hist(losses, grads, extra=None):
    return [{"loss": x, "grad_norm": g, "step": i + 1, **(extra or {})} for i, (x, g) in enumerate(zip(losses, grads))]


def test_t_quantile_is_exact_for_every_df():
    for df, want in ((1, 12.706), (9, 2.262), (10, 2.228), (47, 2.012), (200, 1.972)):
        assert claim_stats.t_quantile(0.975, df) == pytest.approx(want, abs=5e-4)
    x = [0.3, -0.1, 0.5, 0.2, 0.0, 0.4, 0.1, 0.6, -0.2, 0.3, 0.25, 0.15]  # df = 11: the old table fell back to 1.96
    m, lo, hi = claim_stats.mean_ci(x)
    h = stats.t.ppf(0.975, len(x) - 1) * stats.tstd(x) / math.sqrt(len(x))
    assert (m, lo, hi) == pytest.approx((sum(x) / len(x), sum(x) / len(x) - h, sum(x) / len(x) + h), rel=1e-12)
    with pytest.raises(ValueError):
        claim_stats.t_quantile(0.975, 0)


def test_trained_items_fail_on_noop_nan_and_frozen_runs():
    ok, n = R.trained_items(_hist([0.9, 1.6, 0.7], [120.0, 240.0, 160.0]), moved=3e-4)
    assert ok and n["steps"] == 3 and n["max_abs_loss"] == 1.6 and n["max_grad_norm"] == 240.0
    # a run without signal: loss and gradient exactly 0 at every step, weights unchanged
    assert not R.trained_items(_hist([0.0, 0.0], [0.0, 0.0]), moved=0.0)[0]
    assert not R.trained_items(_hist([0.0, 0.0], [0.0, 0.0]), moved=1e-3)[0]  # moved, but no loss ever
    assert not R.trained_items(_hist([0.5, float("nan")], [1.0, 1.0]), moved=1e-3)[0]  # NaN loss
    assert not R.trained_items(_hist([0.5, 0.4], [1.0, float("inf")]), moved=1e-3)[0]  # inf gradient
    assert not R.trained_items(_hist([0.5, 0.4], [1.0, 2.0]), moved=0.0)[0]  # weights frozen
    assert not R.trained_items(_hist([0.5, 0.4], [0.0, 0.0]), moved=1e-3)[0]  # no gradient
    assert not R.trained_items([{"train_runtime": 3.0}], moved=1e-3)[0]  # no step logged
    # one step with a zero gradient (a batch whose groups all had equal rewards) does not undo the others
    assert R.trained_items(_hist([0.0, 0.4], [0.0, 2.0]), moved=1e-3)[0]


def test_step_times_are_means_over_logged_steps():
    h = [
        {"loss": 1.0, "step_time": 20.0, "time/vLLM.generate": 6.0, "time/sync_weights": 0.5},
        {"loss": 1.0, "step_time": 30.0, "time/vLLM.generate": 8.0},
        {"train_runtime": 99.0},
    ]
    assert R.step_times(h) == {"step_time": 25.0, "time/vLLM.generate": 7.0, "time/sync_weights": 0.25}


ALL = {"disa": True, "flowrl": True, "grpo": True}


def test_train_configs_differ_only_where_the_objectives_do(tmp_path):
    task = {"train": "t.jsonl", "stage1_dir": "s1"}
    c = {m: R.train_config(m, task, tmp_path / m, seed=7, steps=5) for m in ("disa", "flowrl", "grpo")}
    assert c["disa"]["tilt_beta"] == c["flowrl"]["tilt_beta"] == R.BETA and "tilt_beta" not in c["grpo"]
    for m in ("disa", "flowrl"):  # same reward transform and residual: only the log Z source differs
        assert c[m]["trl"]["reward_transform"] == "affine" and c[m]["trl"]["logprob_scale"] == "sum"
    assert c["disa"]["trl"]["disa_label"] == "column" and c["disa"]["disa"] == {"stage1_dir": "s1"}
    shared = ("learning_rate", "num_generations", "max_completion_length", "max_steps", "seed", "temperature")
    for k in shared:
        assert c["disa"]["trl"][k] == c["flowrl"]["trl"][k] == c["grpo"]["trl"][k]
    assert c["grpo"]["trl"]["max_steps"] == 5 and c["grpo"]["trl"]["seed"] == 7
    assert c["grpo"]["trl"]["per_device_train_batch_size"] == R.PROMPTS_PER_STEP * R.G
    assert all(c[m]["trl"]["use_vllm"] and c[m]["trl"]["vllm_mode"] == "colocate" for m in ("disa", "flowrl", "grpo"))
