"""Aggregations over seeds, runs and steps in the llm checks, on inputs where "any", "all" and "the
last one" give different answers.

The class of bug: an item meant to hold for every seed that the last seed alone satisfies (the
real-model check's "trained" item once passed with only its last seed frozen in the test), an "any"
written as "all", a mean over seeds that reads one seed. Each aggregation is fed 3 seeds (or runs, or
steps) with the odd one out first, in the middle and last, so "every", "some" and "the last" differ
in at least one case; the expected value is stated from the rule, not recomputed the code's way."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from tiltlab.claims.registry import Verdict
from tiltlab.llm.checks import real_training as R
from tiltlab.llm.checks import rules

N = 3  # seeds / runs / steps
POSITIONS = [0, 1, 2]  # where the odd one out sits: first, middle, last
P = 12  # held-out prompts


def _odd(position: int | None, odd, usual) -> list:
    return [odd if i == position else usual for i in range(N)]


# ------------------------------------------------------------------ real-model runs (real_training.py)
def _hist(losses, grads):
    return [{"loss": x, "grad_norm": g, "step": i + 1} for i, (x, g) in enumerate(zip(losses, grads))]


@pytest.mark.parametrize("position", POSITIONS, ids=["first", "middle", "last"])
def test_real_check_trained_items_aggregate_over_every_logged_step(position):
    """Finite at every step (all), a loss that is not 0 at some step (any), a positive gradient at some
    step (max): the odd step decides wherever it sits."""
    nan = float("nan")
    assert not R.trained_items(_hist(_odd(position, nan, 0.5), [1.0] * N), moved=1e-3)[0]
    assert not R.trained_items(_hist([0.5] * N, _odd(position, math.inf, 1.0)), moved=1e-3)[0]
    assert R.trained_items(_hist(_odd(position, 0.5, 0.0), [1.0] * N), moved=1e-3)[0]
    assert R.trained_items(_hist([0.5] * N, _odd(position, 2.0, 0.0)), moved=1e-3)[0]
    ok, nums = R.trained_items(_hist(_odd(position, -1.5, 0.5), _odd(position, 7.0, 1.0)), moved=1e-3)
    assert ok and nums["max_abs_loss"] == 1.5 and nums["max_grad_norm"] == 7.0 and nums["steps"] == N


def test_real_check_step_times_are_means_over_every_step():
    h = [{"loss": 1.0, "step_time": t, "time/vLLM.generate": g} for t, g in ((20.0, 6.0), (40.0, 9.0), (30.0, 3.0))]
    assert R.step_times(h) == {"step_time": 30.0, "time/vLLM.generate": 6.0}


# ------------------------------------------------------------------ tiny-model checks (rules.py, enumerable.py)
RUN_KEYS = {  # what did not move -> (its "ran" item, its count)
    "loss": ("ran_loss_moved", "runs_loss_moved"),
    "weights": ("ran_weights_moved", "runs_weights_moved"),
    "accuracy": ("ran_accuracy_moved", "runs_accuracy_moved"),
}


@pytest.mark.parametrize("position", POSITIONS, ids=["first", "middle", "last"])
@pytest.mark.parametrize("what", sorted(RUN_KEYS))
def test_runlog_ran_items_need_every_run(what, position):
    log = rules.RunLog()
    for i in range(N):
        odd = i == position
        trace = SimpleNamespace(
            loss_moved=not (odd and what == "loss"), param_change=0.0 if odd and what == "weights" else 0.2
        )
        log.add(trace, 0.3, 0.3 if odd and what == "accuracy" else 0.35)
    item, count = RUN_KEYS[what]
    items = log.items()
    assert items[item] is False and all(v for k, v in items.items() if k != item)
    assert log.numbers()[count] == N - 1


@pytest.mark.parametrize("position", POSITIONS, ids=["first", "middle", "last"])
def test_judge_is_inconclusive_when_any_ran_item_fails(position):
    up = rules.Item("a", (0.10, 0.12, 0.09, 0.11, 0.10), margin=0.02)
    names = ("ran_loss_moved", "ran_weights_moved", "ran_accuracy_moved")
    ran = dict(zip(names, _odd(position, False, True)))
    assert rules.judge([up], dict.fromkeys(names, True))[0] is Verdict.VERIFIED
    assert rules.judge([up], ran)[0] is Verdict.INCONCLUSIVE


@pytest.mark.parametrize("position", POSITIONS, ids=["first", "middle", "last"])
def test_multi_arm_ran_items_need_every_run(position):
    from tiltlab.llm.checks import enumerable

    for key in ("loss", "weights", "acc"):
        r = {k: [True] * (2 * N) for k in ("loss", "weights", "acc")}
        r[key] = _odd(position, False, True) + [True] * N  # 2N runs: the odd one among the first N
        items = enumerable.ran_items({"_ran": r})
        assert (
            items[{"loss": "ran_loss_moved", "weights": "ran_weights_moved", "acc": "ran_accuracy_moved"}[key]] is False
        )
        assert sum(items.values()) == 2
    assert all(enumerable.ran_items({"_ran": {k: [True] * N for k in ("loss", "weights", "acc")}}).values())


# ------------------------------------------------------------------ vacuous-run guard (learning_signal.py)
@pytest.mark.parametrize("position", POSITIONS, ids=["first", "middle", "last"])
def test_vacuous_run_guards_aggregate_over_every_value(position):
    from tiltlab.llm.base.learning_signal import equal_rewards, grads_all_zero, zero_update

    assert equal_rewards(_odd(position, 1.0, 0.0), stage="t", scope="s") is None  # one differs: signal
    assert equal_rewards([0.0] * N, stage="t", scope="s") is not None
    assert zero_update(_odd(position, 1e-3, 0.0), True, step=1) is None  # one micro-batch had a loss
    assert zero_update([0.0] * N, True, step=1) is not None
    params = [SimpleNamespace(grad=torch.full((2,), v)) for v in _odd(position, 1e-6, 0.0)]
    assert grads_all_zero(params) is False
    assert grads_all_zero([SimpleNamespace(grad=torch.zeros(2)) for _ in range(N)]) is True
    assert grads_all_zero([SimpleNamespace(grad=None) for _ in range(N)]) is None
