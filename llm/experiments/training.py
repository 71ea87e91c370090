"""One training run on the enumerable task: online RL with exact rollouts (:func:`train_online`), its batch
(:class:`Batch`), what it did (:class:`Trace`) and the "it ran" log of a check's runs (:class:`RunLog`)."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from tiltlab.llm.experiments.pool import fixed_threads
from tiltlab.llm.experiments.task import EnumTask, token_logps

__all__ = [
    "Batch",
    "LossFn",
    "RunLog",
    "Trace",
    "gather_tokens",
    "sample_answers",
    "step_loss",
    "train_online",
]


def sample_answers(log_probs: Tensor, g: int, gen: torch.Generator) -> Tensor:
    """``[P, g]`` answer indices drawn exactly from ``softmax(log_probs)`` (``[P, K]``); non-finite
    probabilities (a diverged model) raise ``FloatingPointError``."""
    if torch.isnan(log_probs).any() or torch.isposinf(log_probs).any():
        raise FloatingPointError("non-finite policy log-probabilities: the model diverged")
    return torch.multinomial(log_probs.exp().float(), g, replacement=True, generator=gen)


def gather_tokens(x: Tensor, ans: Tensor) -> Tensor:
    """``x [P, K, T]``, ``ans [P, G]`` -> ``[P*G, T]`` (group-major)."""
    return x.gather(1, ans[..., None].expand(-1, -1, x.shape[-1])).reshape(-1, x.shape[-1])


@dataclass
class Batch:
    """One step's rollouts: ``P`` prompts x ``G`` answers, group-major ``B = P*G`` rows."""

    prompt_idx: Tensor  # [P]
    ans: Tensor  # [P, G]
    logp: Tensor  # [B, T] current policy (grad)
    logp_old: Tensor  # [B, T] behaviour (detached)
    logp_ref: Tensor  # [B, T] reference
    mask: Tensor  # [B, T]
    reward: Tensor  # [P, G]
    all_logp: Tensor  # [P, K, T] current policy, all answers (grad)


LossFn = Callable[[Batch], Tensor]


@dataclass
class Trace:
    """What one training run did: its per-step losses and how far its weights moved (L2 norm of
    the change of every trained parameter, the extra ones included)."""

    losses: list[float]
    param_change: float

    @property
    def loss_moved(self) -> bool:
        """The loss took more than one value over the run (a run with no signal keeps it fixed)."""
        return len(self.losses) > 1 and max(self.losses) > min(self.losses)


@dataclass
class RunLog:
    """The "it ran" evidence of a check: for every training run, whether its loss moved, its weights
    moved and its accuracy left the warm-up value (exact accuracies: any real update moves them)."""

    loss_moved: list[bool] = field(default_factory=list)
    params_moved: list[bool] = field(default_factory=list)
    acc_moved: list[bool] = field(default_factory=list)

    def add(self, trace, acc_before: float | None = None, acc_after: float | None = None) -> None:
        """Record one run: ``trace`` from :func:`train_online` (or the offline
        trainer); the accuracies before and after (None: the run has no accuracy to move)."""
        self.loss_moved.append(trace.loss_moved)
        self.params_moved.append(trace.param_change > 0.0)
        if acc_before is not None and acc_after is not None:
            if not (math.isfinite(acc_before) and math.isfinite(acc_after)):
                raise ValueError(f"non-finite accuracy {acc_before} -> {acc_after}: a NaN run has no verdict")
            self.acc_moved.append(abs(acc_after - acc_before) > 1e-9)

    def items(self) -> dict[str, bool]:
        if not self.loss_moved:
            raise ValueError("no training run was recorded")
        out = {"ran_loss_moved": all(self.loss_moved), "ran_weights_moved": all(self.params_moved)}
        if self.acc_moved:
            out["ran_accuracy_moved"] = all(self.acc_moved)
        return out

    def numbers(self) -> dict[str, float]:
        return {
            "runs": len(self.loss_moved),
            "runs_loss_moved": sum(self.loss_moved),
            "runs_weights_moved": sum(self.params_moved),
            "runs_accuracy_moved": sum(self.acc_moved),
        }


def _snapshot(params: Sequence[torch.nn.Parameter]) -> list[Tensor]:
    return [p.detach().clone() for p in params]


def _change(params: Sequence[torch.nn.Parameter], before: Sequence[Tensor]) -> float:
    return float(sum(float((p.detach() - b).double().pow(2).sum()) for p, b in zip(params, before)) ** 0.5)


def step_loss(loss: Tensor, step: int) -> float:
    """The loss as a float; a non-finite loss stops the run with ``FloatingPointError`` (a NaN run is
    an error, never a verdict)."""
    v = float(loss.detach())
    if not math.isfinite(v):
        raise FloatingPointError(f"non-finite training loss {v} at step {step}")
    return v


@fixed_threads
def train_online(
    model,
    task: EnumTask,
    ref_tok: Tensor,
    loss_fn: LossFn,
    *,
    prompts: Sequence[int],
    steps: int,
    lr: float = 1e-3,
    batch_prompts: int = 8,
    g: int = 8,
    seed: int = 0,
    old_every: int = 1,
    select: Callable[[int], Sequence[int]] | None = None,
    extra_params: Sequence[torch.nn.Parameter] = (),
    extra_lr: float | None = None,
    on_step: Callable[[int], None] | None = None,
) -> Trace:
    """Online RL with exact rollouts. ``ref_tok``: ``[P_all, K, T]`` reference token log-probs.

    Each step draws ``batch_prompts`` prompts (or ``select(step)``, which must return that many), samples ``g`` answers per
    prompt from the behaviour policy ``pi_old`` (refreshed every ``old_every`` steps; 1 = on-policy),
    and takes one Adam step on ``loss_fn(batch)``; ``extra_params`` (e.g. a learned log Z table)
    use ``extra_lr`` (default ``lr``). Returns the run's :class:`Trace`; a non-finite loss raises
    ``FloatingPointError``."""
    gen = torch.Generator().manual_seed(10_000 + seed)
    prompts_t = torch.as_tensor(list(prompts), dtype=torch.long)
    trained = [*model.parameters(), *extra_params]
    before = _snapshot(trained)
    losses: list[float] = []
    groups = [{"params": list(model.parameters())}]
    if extra_params:
        groups.append({"params": list(extra_params), "lr": lr if extra_lr is None else extra_lr})
    opt = torch.optim.Adam(groups, lr=lr)
    old_model = None
    model.train()
    for step in range(steps):
        if select is not None:
            idx = torch.as_tensor(list(select(step)), dtype=torch.long)
            if len(idx) != batch_prompts:  # arms are compared at the same number of prompts per step
                raise ValueError(f"select returned {len(idx)} prompts at step {step}, batch_prompts={batch_prompts}")
        else:
            idx = prompts_t[torch.randperm(len(prompts_t), generator=gen)[:batch_prompts]]
        all_lp, mask_all = token_logps(model, task, idx)
        if old_every > 1:
            if step % old_every == 0:
                old_model = copy.deepcopy(model).eval()
            with torch.no_grad():
                old_lp, _ = token_logps(old_model, task, idx)
        else:
            old_lp = all_lp.detach()
        old_seq = torch.log_softmax(old_lp.sum(-1).double(), -1)
        ans = sample_answers(old_seq, g, gen)
        batch = Batch(
            idx,
            ans,
            gather_tokens(all_lp, ans),
            gather_tokens(old_lp, ans).detach(),
            gather_tokens(ref_tok[idx], ans),
            gather_tokens(mask_all, ans),
            task.reward[idx].gather(1, ans),
            all_lp,
        )
        loss = loss_fn(batch)
        losses.append(step_loss(loss, step))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if on_step is not None:
            on_step(step)
    model.eval()
    return Trace(losses, _change(trained, before))
