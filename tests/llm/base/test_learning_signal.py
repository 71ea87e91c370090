"""The vacuous-run conditions of ``llm.base.learning_signal``: each holds where it should and not one
step away from it (one differing reward, one prompt with a spread of weights, ...)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from tiltlab.llm.base import learning_signal as ls
from tiltlab.objectives import estimators as est


def test_equal_rewards_holds_for_a_constant_batch_and_not_for_one_differing_reward():
    f = ls.equal_rewards([0.0] * 12, stage="stage1", scope="dataset (3 prompts x 4 samples)")
    assert (
        f is not None
        and f.kind == "equal_rewards"
        and f.observed
        == {
            "n": 12,
            "value": 0.0,
            "scope": "dataset (3 prompts x 4 samples)",
        }
    )
    assert "all 12 rewards" in f.message and "tiltlab llm prepare select" in f.message and "\n" not in f.message
    # a constant other than 0 (all correct) is just as empty
    assert ls.equal_rewards([1.0, 1.0, 1.0], stage="train", scope="batch").observed["value"] == 1.0
    # one differing reward anywhere is signal
    for i in range(5):
        r = [0.0] * 5
        r[i] = 1.0
        assert ls.equal_rewards(r, stage="stage1", scope="dataset") is None
    assert ls.equal_rewards([0.5, 0.5 + 1e-12], stage="train", scope="batch") is None
    assert ls.equal_rewards([], stage="train", scope="batch") is None
    # tensors are accepted (the trainer passes its gathered rewards)
    assert ls.equal_rewards(torch.zeros(6), stage="train", scope="batch") is not None


def _ess(log_w: torch.Tensor) -> list[float]:
    return est.effective_sample_size(log_w.double()).tolist()


def test_ess_uniform_from_equal_log_weights_and_not_when_one_prompt_has_a_spread():
    M = 8
    log_w = torch.full((5, M), -0.7)  # all weights equal on every prompt: ESS = M
    f = ls.degenerate_ess(_ess(log_w), M)
    assert f is not None and f.kind == "ess_uniform" and f.observed["n_prompts"] == 5
    assert f.observed["min_ess"] == pytest.approx(M, rel=1e-12)  # rounding of 1 / sum(u^2) only
    # one prompt with two different rewards (beta = 1, q = pi_ref): its ESS drops below M
    log_w[3, 0] += 1.0
    assert ls.degenerate_ess(_ess(log_w), M) is None
    # the threshold: a log-weight spread far below 1e-3 still counts as uniform, one well above does not
    tiny = torch.full((2, M), 0.0)
    tiny[:, 0] = 1e-5  # 1 - ESS/M ~ Var(log w) ~ 1e-11
    assert ls.degenerate_ess(_ess(tiny), M).kind == "ess_uniform"
    tiny[:, 0] = 1e-2  # 1 - ESS/M ~ 1e-5 > 1e-6
    assert ls.degenerate_ess(_ess(tiny), M) is None
    at = (1 - ls.ESS_UNIFORM_RTOL) * M  # the boundary itself counts as uniform
    assert ls.degenerate_ess([at, at], M).kind == "ess_uniform"


def test_ess_collapsed_only_when_every_prompt_is_one_sample():
    M = 8
    log_w = torch.zeros(4, M)
    log_w[:, 0] = 30.0  # one sample dominates each prompt: ESS = 1 + ~7e-13
    f = ls.degenerate_ess(_ess(log_w), M)
    assert f is not None and f.kind == "ess_collapsed" and f.observed["max_ess"] < 1.0 + 1e-9
    assert "M = 8" in f.message
    log_w[2, 0] = 2.0  # one prompt keeps several samples in play
    assert ls.degenerate_ess(_ess(log_w), M) is None
    # just above / below the threshold, set directly
    assert ls.degenerate_ess([1.0, ls.ESS_COLLAPSED_MAX], M).kind == "ess_collapsed"
    assert ls.degenerate_ess([1.0, ls.ESS_COLLAPSED_MAX + 1e-9], M) is None
    assert ls.degenerate_ess([1.0, 1.2], M) is None  # the largest weight ~0.9: not one sample alone


def test_ess_is_not_tested_for_one_sample_or_without_finite_values():
    assert ls.degenerate_ess([1.0, 1.0], 1) is None  # M = 1: ESS = 1 = M by construction
    assert ls.degenerate_ess([float("nan"), math.inf], 4) is None
    # non-finite prompts are left out; the rest decide
    assert ls.degenerate_ess([4.0, float("nan"), 4.0], 4).observed["n_prompts"] == 2
    with pytest.raises(ValueError, match="M must be >= 1"):
        ls.degenerate_ess([1.0], 0)


def test_constant_targets():
    f = ls.constant_targets([0.0, 0.0, 0.0, 0.0], what="log_z labels")
    assert f is not None and f.kind == "constant_targets" and "R^2 is undefined" in f.message
    assert "all 4 log_z labels lie in [0, 0]" in f.message and f.observed["min"] == f.observed["max"] == 0.0
    # float32 rounding of log pi_ref - log q (~1e-6) is no signal; a spread just above the tolerance is
    assert ls.constant_targets([8.3e-7, -1.2e-7, 1.7e-13]).kind == "constant_targets"
    assert ls.constant_targets([2.0, 2.0 + 0.99 * ls.CONSTANT_TARGET_ATOL]) is not None
    assert ls.constant_targets([2.0, 2.0 + 1.01 * ls.CONSTANT_TARGET_ATOL]) is None
    assert ls.constant_targets([0.0, ls.CONSTANT_TARGET_ATOL]) is not None  # the boundary counts as constant
    assert ls.constant_targets([0.0, 2e-3]) is None  # a label spread of 2e-3 nats is signal, not rounding
    assert ls.constant_targets([0.0, 0.0, float("nan")]) is None  # a non-finite target: not judged
    assert ls.constant_targets([float("nan"), 0.0, 0.0]) is None
    assert ls.constant_targets([3.0]) is None  # one value: no variance to speak of, R^2 needs >= 2


def test_grads_all_zero_and_zero_update():
    a, b = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))
    assert ls.grads_all_zero([a, b]) is None  # no gradient yet: undecided
    a.grad = torch.zeros(3)
    assert ls.grads_all_zero([a, b]) is True  # b has none: not looked at
    b.grad = torch.tensor([0.0, -1e-30])
    assert ls.grads_all_zero([a, b]) is False
    b.grad = torch.tensor([0.0, -0.0])
    assert ls.grads_all_zero([a, b]) is True

    f = ls.zero_update([0.0, -0.0], True, step=3)
    assert f is not None and f.kind == "zero_update" and f.observed == {"step": 3, "n_micro_batches": 2}
    assert "step 3: loss and gradient are exactly 0" in f.message
    assert ls.zero_update([0.0, 1e-12], True, step=3) is None  # one micro-batch with a loss
    assert ls.zero_update([0.0], False, step=3) is None  # a zero loss with a gradient (e.g. -A * ratio at A = 0 ...)
    assert ls.zero_update([0.0], None, step=3) is None  # gradients not visible (ZeRO): not decided
    assert ls.zero_update([], True, step=3) is None


def test_report_warns_one_line_per_finding_and_returns_records():
    found = [ls.equal_rewards([0.0, 0.0], stage="stage1", scope="dataset"), None, ls.constant_targets([1.0, 1.0])]
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        rec = ls.report(found)
    assert [r["kind"] for r in rec] == ["equal_rewards", "constant_targets"]
    assert len(w) == 2 and all(issubclass(x.category, ls.VacuousRunWarning) for x in w)
    assert all("\n" not in str(x.message) for x in w)
    assert [str(x.message) for x in w] == [r["message"] for r in rec]
    assert all(x.filename == __file__ for x in w)  # the warning points at report's caller
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert ls.report([None, None]) == []
    assert w == []


def test_over_run_counts_the_steps_with_a_condition():
    f = ls.over_run("zero_update", [2, 1, 2], 2, "optimizer steps")
    assert f.observed == {"n": 2, "n_total": 2, "steps": [1, 2]}
    assert f.message.startswith("train: all 2 optimizer steps had loss and gradient exactly 0")
    assert "first at step 1" in f.message
    g = ls.over_run("equal_rewards", [3], 4, "generation batches")
    assert g.observed["steps"] == [3] and "1 of the 4 generation batches had all rewards" in g.message
    assert "first at step 3" in g.message
    assert ls.over_run("zero_update", [], 5, "optimizer steps") is None
    with pytest.raises(ValueError, match="kind must be one of"):
        ls.over_run("ess_uniform", [1], 1, "steps")
