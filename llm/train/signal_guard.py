"""The vacuous-run guard of the trainers: optimizer steps whose loss and gradient are exactly 0, and
generation batches (or an offline dataset) whose rewards are all equal.

:class:`SignalGuardMixin` is mixed into :class:`~tiltlab.llm.train.online.TiltGRPOTrainer` and
:class:`~tiltlab.llm.train.offline.OfflineTrainer`. The conditions are those of
:mod:`tiltlab.llm.base.learning_signal`; this module only observes them:

* ``training_step`` records each micro-batch's loss; on the micro-batch that completes an optimizer
  step (``accelerator.sync_gradients``: the gradients are accumulated and, under DDP, averaged over
  processes) it tests the step (``zero_update``);
* the online trainer passes each training generation batch's rewards (gathered over processes) to
  :meth:`SignalGuardMixin._signal_rewards`; the offline trainer passes its dataset's rewards to
  :meth:`SignalGuardMixin._signal_dataset_rewards` once;
* the first occurrence of each condition is warned about in one line
  (:class:`~tiltlab.llm.base.learning_signal.VacuousRunWarning`), and when ``train()`` returns (or
  fails) the main process writes ``<output_dir>/signal.json``: the steps each condition was seen
  at, how many steps and batches were observed, and one run-level finding per condition (also
  warned about in one line). A resumed run reads the record back and re-observes the steps after
  its checkpoint.
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any

from tiltlab.files import write_json
from tiltlab.llm.base import learning_signal as ls

__all__ = ["SIGNAL_FILE", "SignalGuardMixin", "read_signal_record"]

SIGNAL_FILE = "signal.json"
FORMAT = "tiltlab.signal/1"


def read_signal_record(output_dir: str) -> dict[str, Any] | None:
    """The ``signal.json`` of a training run (None when it has none)."""
    path = os.path.join(output_dir, SIGNAL_FILE)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


class SignalGuardMixin:
    """Observe the vacuous-run conditions during ``train()`` (see the module docstring)."""

    def _signal(self) -> dict[str, Any]:
        st = self.__dict__.get("_signal_state")
        if st is None:
            st = {"losses": [], "steps": {}, "reward_steps": {}, "dataset": [], "warned": set()}
            self._signal_state = st
        return st

    def _signal_warn_once(self, found: ls.SignalFinding) -> None:
        st = self._signal()
        if found.kind in st["warned"] or not self.is_world_process_zero():
            return
        st["warned"].add(found.kind)
        where = os.path.join(self.args.output_dir, SIGNAL_FILE)
        warnings.warn(f"{found.message} (later ones are counted in {where})", ls.VacuousRunWarning, stacklevel=3)

    # ---- observation
    def training_step(self, *args, **kwargs):
        loss = super().training_step(*args, **kwargs)
        st = self._signal()
        st["losses"].append(float(loss.detach()))
        if self.accelerator.sync_gradients:  # the last micro-batch of an optimizer step
            step = int(self.state.global_step) + 1
            model = args[0] if args else kwargs.get("model", self.model)
            found = ls.zero_update(st["losses"], ls.grads_all_zero(model.parameters()), step=step)
            st["losses"] = []
            st["steps"][step] = found is not None
            if found is not None:
                self._signal_warn_once(found)
        return loss

    def _signal_rewards(self, rewards) -> None:
        """One training generation batch's rewards (all processes' rows)."""
        step = int(self.state.global_step) + 1
        found = ls.equal_rewards(rewards.tolist(), stage="train", scope=f"generation batch of step {step}")
        self._signal()["reward_steps"][step] = found is not None
        if found is not None:
            self._signal_warn_once(found)

    def _signal_dataset_rewards(self, rewards, name: str = "training dataset") -> None:
        """An offline dataset's rewards: all equal -> warned about now and recorded."""
        found = ls.equal_rewards(list(rewards), stage="train", scope=name)
        if found is not None and self.is_world_process_zero():
            self._signal()["dataset"].extend(ls.report([found], stacklevel=3))

    # ---- the record
    def train(self, *args, **kwargs):
        resume = kwargs.get("resume_from_checkpoint", args[0] if args else None)
        prev = read_signal_record(self.args.output_dir) if resume else None
        if prev is not None and prev.get("format") == FORMAT:
            st = self._signal()
            st["steps"].update({int(k): v for k, v in prev.get("step_zero_update", {}).items()})
            st["reward_steps"].update({int(k): v for k, v in prev.get("step_equal_rewards", {}).items()})
        try:
            return super().train(*args, **kwargs)
        finally:
            self._signal_write()

    def _signal_write(self) -> None:
        if not self.is_world_process_zero():
            return
        st = self._signal()
        last = int(self.state.global_step)
        # steps past the final one belong to an abandoned run continued from an earlier checkpoint
        steps = {k: v for k, v in sorted(st["steps"].items()) if k <= last}
        rsteps = {k: v for k, v in sorted(st["reward_steps"].items()) if k <= last}
        zero = [k for k, v in steps.items() if v]
        equal = [k for k, v in rsteps.items() if v]
        findings = st["dataset"] + ls.report(
            [
                ls.over_run("zero_update", zero, len(steps), "optimizer steps"),
                ls.over_run("equal_rewards", equal, len(rsteps), "generation batches"),
            ],
            stacklevel=3,
        )
        record = {
            "format": FORMAT,
            "optimizer_steps_observed": len(steps),
            "zero_update_steps": zero,
            "generation_batches_observed": len(rsteps),
            "equal_reward_steps": equal,
            "findings": findings,
            "step_zero_update": {str(k): v for k, v in steps.items()},
            "step_equal_rewards": {str(k): v for k, v in rsteps.items()},
        }
        write_json(os.path.join(self.args.output_dir, SIGNAL_FILE), record, indent=1, newline=False)
