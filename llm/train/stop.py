"""A stop that keeps the work: SIGTERM / SIGINT end training at the next optimizer-step boundary
with a checkpoint, on every process of a distributed run.

:class:`GracefulStop` is a ``transformers.TrainerCallback`` (``tiltlab llm train`` adds it to every
trainer; add it yourself to a trainer you build in code). While training runs it replaces the
handlers of the signals it watches with one that only records the signal. At the end of each
optimizer step (``on_step_end``, before transformers decides whether to save) the record is
combined over all processes (an all-reduce of one flag, so that every rank stops at the same step
even when the signal reached only some of them, or reached them in different steps) and, when any
rank was signalled, the callback sets ``control.should_save`` and ``control.should_training_stop``:
transformers writes ``checkpoint-<step>`` the usual way (model, optimizer, scheduler, RNG, data
position; tiltlab's objective state with it) and leaves the loop. ``--resume latest`` continues
from there as from any other checkpoint.

A repeat of the signal within :data:`REPEAT_WINDOW_S` seconds of the first is ignored (a launcher
forwards the signal it received, and a terminal's Ctrl-C reaches the launcher and the ranks: one
stop request arrives several times); a later repeat restores the previous handler and delivers
the signal to it, so pressing Ctrl-C again aborts a stop that does not come.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import torch
import torch.distributed as dist
from accelerate.state import PartialState
from transformers import TrainerCallback

__all__ = ["REPEAT_WINDOW_S", "GracefulStop"]

REPEAT_WINDOW_S = 2.0
"""Seconds after the first signal during which repeats count as the same stop request."""


class GracefulStop(TrainerCallback):
    """Stop at the next optimizer step with a checkpoint when one of ``signals`` arrives.

    After training, :attr:`stopped_by` is the name of the signal that stopped it (``None`` when
    training ran to its end) and :attr:`stopped_at` the step of the checkpoint written."""

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)):
        self.signals = tuple(signals)
        self.stopped_by: str | None = None
        self.stopped_at: int | None = None
        self._received: int | None = None
        self._received_at = 0.0
        self._previous: dict[int, object] = {}

    # ---- signal handling (main thread only: Python delivers signals there)

    def _handle(self, signum, frame) -> None:
        now = time.monotonic()
        if self._received is None:
            self._received, self._received_at = signum, now
            # os.write, not print: a handler that prints while the main thread is inside a print to the
            # same stream raises "reentrant call"
            msg = f"[train] {signal.Signals(signum).name} received: stopping at the end of this optimizer step\n"
            os.write(2, msg.encode())
            return
        if now - self._received_at < REPEAT_WINDOW_S:
            return  # the same request, forwarded by a launcher or sent to the whole process group
        self._restore()  # asked again: give up on the graceful stop
        signal.raise_signal(signum)

    def _install(self) -> None:

        if self._previous or threading.current_thread() is not threading.main_thread():
            return
        for s in self.signals:
            self._previous[s] = signal.getsignal(s)
            signal.signal(s, self._handle)

    def _restore(self) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous = {}

    # ---- the step boundary

    def _any_rank_signalled(self) -> bool:
        """The local flag OR-ed over all processes (one all-reduce per optimizer step)."""

        local = self._received is not None
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return local

        flag = torch.tensor([1.0 if local else 0.0], device=PartialState().device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item() > 0)

    def on_train_begin(self, args, state, control, **kwargs):
        self.stopped_by = self.stopped_at = None
        self._received = None
        self._install()

    def on_step_end(self, args, state, control, **kwargs):
        if self._any_rank_signalled():
            # a rank that saw no signal itself stops because another one did
            self.stopped_by = (
                signal.Signals(self._received).name if self._received is not None else "a signal on another rank"
            )
            self.stopped_at = state.global_step
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_train_end(self, args, state, control, **kwargs):
        self._restore()
