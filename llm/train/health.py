"""Training that says when it goes wrong: the per-step diagnostics of a TB-family run and one-line
warnings when they leave their bounds.

:func:`~tiltlab.objectives.diagnostics.residual_stats` turns a step's per-sequence TB residuals
``delta = log Z + log pi - log pi_ref - beta r~`` (the objective's ``residuals`` metric) into the logged
quantiles; :func:`~tiltlab.objectives.diagnostics.flip_stats` compares them with the residuals of the same
batch after the optimizer step (an update that changes the sign of most residuals, or leaves them larger
than before, overshot its own target). :class:`HealthMonitor` reads every logged step and evaluation and warns once per kind, in one line, when

* ``residual``: the mean ``|delta|`` exceeds ``residual_factor`` x its value at the first step (the
  policy is then ``residual_factor`` times further from the target on its own samples than the starting
  model was) for ``patience`` consecutive steps;
* ``grad_norm``: the gradient norm before clipping exceeds ``grad_norm_factor`` x the first step's for
  ``patience`` consecutive steps;
* ``overshoot``: more than ``flip_frac`` of the batch's residuals change sign in the update, or the
  residuals are larger after it than before (``residual/after_over_before > 1``), for ``patience``
  consecutive steps;
* ``kl``: the sequence-level KL(pi || pi_ref) on the batch exceeds ``kl_bound`` for ``patience`` consecutive
  steps. For the TB objectives with an affine reward transform the default bound is ``tilt_beta x
  reward_scale``: with rewards in [0, 1], no tilted target ``pi_ref e^{beta r~} / Z`` is further than that
  from pi_ref (``KL(pi* || pi_ref) = beta E_pi*[r~] - log Z <= beta (max r~ - min r~)``), so a policy beyond it
  has left every target the loss can fit;
* ``validation``: the validation metric falls below its value at the start (``eval_on_start``) at
  ``patience`` consecutive evaluations (two at least are needed to see a fall).

The bounds are relative to the run's own first step, so they travel across models, rewards and tilts
(docs/llm-runs.md, "Stable settings for TB-family losses on real models", gives the runs they come from).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from transformers import TrainerCallback

from .health_bounds import KL_BOUNDED, HealthBounds, bounds_of, default_kl_bound

__all__ = ["KL_BOUNDED", "HealthBounds", "HealthMonitor", "bounds_of", "default_kl_bound"]


@dataclass
class HealthMonitor(TrainerCallback):
    """Reads the trainer's logs (``on_log``) and evaluations (``on_evaluate``); ``warnings`` keeps every
    warning given (``{"step", "kind", "message"}``), each kind at most once, printed in one line to stderr
    on the main process. ``metric``: the validation metric (``eval_`` prefixed as transformers logs it)."""

    bounds: HealthBounds = field(default_factory=HealthBounds)
    metric: str = "eval_reward"
    greater_is_better: bool = True
    warnings: list[dict[str, Any]] = field(default_factory=list)
    _first: dict[str, float] = field(default_factory=dict)
    _over: dict[str, int] = field(default_factory=dict)
    _eval_start: float | None = None
    _quiet: bool = False

    def observe(self, step: int, logs: Mapping[str, Any]) -> None:
        """One logged training step (``loss`` present)."""
        bd = self.bounds
        self._track(step, "residual", logs.get("residual"), bd.residual_factor, "mean |TB residual|")
        self._track(step, "grad_norm", logs.get("grad_norm"), bd.grad_norm_factor, "gradient norm (before clipping)")
        kl = logs.get("kl_ref_seq")
        if kl is not None and bd.kl_bound is not None:
            v = float(kl)
            self._count(
                step,
                "kl",
                not v <= bd.kl_bound,  # a NaN counts as over the bound
                f"sequence KL(pi || pi_ref) {v:.4g} > {bd.kl_bound:g}, the largest any tilted target has",
            )
        flips, ratio = logs.get("residual/flip_frac"), logs.get("residual/after_over_before")
        if flips is not None or ratio is not None:
            # "not <=": a NaN share or ratio counts as over the bound
            bad = (flips is not None and not float(flips) <= bd.flip_frac) or (
                ratio is not None and not float(ratio) <= 1.0
            )
            self._count(
                step,
                "overshoot",
                bad,
                f"the updates overshoot: {float(flips or 0.0):.0%} of the residuals changed sign and |residual| "
                f"went x{float(ratio or 0.0):.2f} on the step's own batch",
            )

    def observe_eval(self, step: int, metrics: Mapping[str, Any]) -> None:
        """One evaluation: the one at step 0 (``eval_on_start``) is the start, and later ones below it count
        toward the warning; a run that did not evaluate at step 0 has no start to fall below (never warns)."""
        value = metrics.get(self.metric)
        if value is None:
            return
        v = float(value)
        if self._eval_start is None:
            if step == 0 and math.isfinite(v):  # the starting model's (eval_on_start); without it, no baseline
                self._eval_start = v
            return
        if not math.isfinite(v):
            self._count(step, "validation", True, f"validation {self.metric} is {v}")
            return
        worse = v < self._eval_start if self.greater_is_better else v > self._eval_start
        self._count(
            step,
            "validation",
            worse,
            f"validation {self.metric} = {v:.4g} is worse than the starting model's {self._eval_start:.4g}",
        )

    def _track(self, step: int, kind: str, value: Any, factor: float, what: str) -> None:
        """A step's value against ``factor`` x the first finite one; a non-finite value counts as over the bound."""
        if value is None:
            return
        v = float(value)
        if not math.isfinite(v):
            self._count(step, kind, True, f"{what} is {v}")
            return
        if kind not in self._first:
            self._first[kind] = v
            return
        first = self._first[kind]
        self._count(step, kind, v > factor * first, f"{what} {v:.4g} > {factor:g} x its first step's {first:.4g}")

    def _count(self, step: int, kind: str, bad: bool, message: str) -> None:
        self._over[kind] = self._over.get(kind, 0) + 1 if bad else 0
        if self._over[kind] == self.bounds.patience and not any(w["kind"] == kind for w in self.warnings):
            text = (
                f"{message} for {self.bounds.patience} consecutive {'evaluations' if kind == 'validation' else 'steps'}"
            )
            self.warnings.append({"step": step, "kind": kind, "message": text})
            if not self._quiet:
                print(f"[train] warning (step {step}): {text}", file=sys.stderr, flush=True)

    # transformers callbacks
    def on_train_begin(self, args, state, control, **kwargs):
        self._quiet = not state.is_world_process_zero

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.observe(int(state.global_step), logs)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if metrics:
            self.observe_eval(int(state.global_step), metrics)
