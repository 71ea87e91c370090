"""The warmed reference of the enumerable task: a short exact SFT of the tiny model toward the task's
warm-up pass rates (:data:`tiltlab.llm.experiments.task.LEVEL_PASS`), cached per seed in memory and on disk
(``$TILTLAB_CACHE/llm_checks``, keyed by everything the weights depend on: :func:`_task_key`)."""

from __future__ import annotations

import copy
import hashlib
import os
from functools import lru_cache
from pathlib import Path

import torch
from torch import Tensor
from tqdm.auto import tqdm

from tiltlab.files import atomic_path
from tiltlab.llm.base.models import build_tiny
from tiltlab.llm.experiments import pool
from tiltlab.llm.experiments import task as enum_task  # read at call time ("task" is a local name)
from tiltlab.llm.experiments.pool import fixed_threads
from tiltlab.llm.experiments.task import EnumTask, build_task, token_logps
from tiltlab.objectives.offline import sft_loss

__all__ = ["CACHE_VERSION", "WARM_STEPS", "warm_reference"]

WARM_STEPS = 500
CACHE_VERSION = "v1"


def _warm_targets(task: EnumTask) -> Tensor:
    """``[P, K]`` SFT target distribution: pass rate by level (0.9 hinted), uniform within each set."""
    q = torch.zeros(task.n_prompts, enum_task.K)
    for i, (_, d, h) in enumerate(task.prompts):
        p = enum_task.HINT_PASS if h else enum_task.LEVEL_PASS[d]
        r = task.reward[i]
        q[i] = r * p / r.sum() + (1 - r) * (1 - p) / (enum_task.K - r.sum())
    return q


def _cache_dir() -> Path:
    root = os.environ.get("TILTLAB_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "tiltlab")
    return Path(root) / "llm_checks"


@fixed_threads
def _sft(model, task: EnumTask, steps: int, seed: int, progress: bool) -> None:
    idx_all = torch.tensor([i for i, (t, _, h) in enumerate(task.prompts) if h or t not in enum_task.HELD_OUT_T])
    q = _warm_targets(task)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    it = range(steps)
    if progress:
        it = tqdm(it, desc=f"llm checks: warm-up seed {seed}", unit="step", leave=False)
    for _ in it:
        b = idx_all[torch.randperm(len(idx_all), generator=gen)[:24]]
        lp, mask = token_logps(model, task, b)
        # exact expected SFT loss under the target q: the token NLL of every answer weighted by q(y|x)
        t = lp.shape[-1]
        loss = sft_loss(lp.reshape(-1, t), mask.reshape(-1, t) * q[b].reshape(-1, 1)).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


def _task_key() -> str:
    """Short hash of everything the warmed weights depend on (a changed task never loads old weights)."""

    spec = repr(
        (
            CACHE_VERSION,
            enum_task.K,
            enum_task.N_CORRECT,
            enum_task.LEVEL_PASS,
            enum_task.HINT_PASS,
            enum_task.N_T,
            enum_task.HELD_OUT_T,
            "digits+eos",
            1e-2,
            24,
            "threads",
            pool.CHECK_THREADS,
        )
    )
    return hashlib.sha256(spec.encode()).hexdigest()[:12]


@lru_cache(maxsize=8)
def _warm_cached(seed: int, steps: int) -> tuple[object, object, EnumTask]:

    model, tok = build_tiny(seed=seed)
    task = build_task(tok)
    path = _cache_dir() / f"warm_{_task_key()}_s{seed}_n{steps}.pt"
    if path.exists():
        model.load_state_dict(torch.load(path, map_location="cpu"))
        model.eval()
        return model, tok, task
    torch.manual_seed(seed)
    _sft(model, task, steps, seed, progress=True)
    with atomic_path(path) as tmp:  # a half-written cache is never read
        torch.save(model.state_dict(), tmp)
    return model, tok, task


def warm_reference(seed: int, steps: int | None = None) -> tuple[object, EnumTask]:
    """``(pi_ref, task)``: a fresh copy of the warmed tiny model of ``seed`` (callers may train it).
    ``steps`` defaults to :data:`WARM_STEPS` (read at call time)."""
    model, _, task = _warm_cached(seed, WARM_STEPS if steps is None else steps)
    return copy.deepcopy(model), task
