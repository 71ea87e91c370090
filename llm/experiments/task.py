"""The enumerable task every ``llm`` check shares, with its exact quantities.

A prompt ``"t=<t> L=<d>:"`` asks for an answer ``n in 0..K-1`` written as its digits and the end
of turn (``K = 16``: one- and two-digit answers, so completions have ragged lengths; the
``\\boxed{}`` wrapper is left out so the tiny model's warm-up learns the prompt dependence in a
few hundred steps); ``n`` is correct when
``n % 4 == t % 4`` (4 correct answers of 16). The level ``d`` sets the warm-up pass rate
(:data:`LEVEL_PASS`), so pass rates and ``log Z`` vary across prompts. A hinted prompt
``"t=<t> L=<d> hint:"`` is warmed up to pass rate 0.9: ``pi_ref(y | x, hint)`` is a strong proposal
with the same tokenizer and full support.

Because the answer set is enumerable, every quantity is exact by teacher forcing all K answer
sequences: ``pi(y|x)`` restricted to the K answers and renormalized (the mass a model puts
outside the answer set is reported as ``leak``), ``pi*(y|x) ∝ pi_ref(y|x) e^{beta r}``,
``log Z(x) = log sum_y pi_ref(y|x) e^{beta r}``, ``TV(pi, pi*)``. Rollouts are drawn exactly from
the renormalized teacher-forced distribution (no generate loop); the losses are the objectives'
functions applied to per-token log-probs of the sampled sequences.

The model is :func:`tiltlab.llm.base.models.build_tiny` (random-init 2-layer Qwen3 + BPE tokenizer),
warmed up by a short exact SFT (:func:`warm_reference`), cached per seed in memory and on disk.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import torch
from torch import Tensor

from tiltlab.claims import stats
from tiltlab.files import atomic_path
from tiltlab.objectives.offline import sft_loss

__all__ = [
    "LEVEL_PASS",
    "EnumTask",
    "K",
    "Policy",
    "Trace",
    "build_task",
    "exact_log_z",
    "gather",
    "map_seeds",
    "mean_ci",
    "seed_jobs",
    "set_jobs",
    "tilted",
    "tv_distance",
    "warm_reference",
]

K = 16
N_CORRECT = 4
LEVEL_PASS = (0.01, 0.03, 0.1, 0.25, 0.5, 0.8)
"""Warm-up pass rate of a prompt at level ``d`` (index); hinted prompts are warmed to 0.9."""
HINT_PASS = 0.9
N_T = 8
HELD_OUT_T = (3, 6)
"""Values of ``t`` whose prompts are never seen in warm-up or training (the held-out split)."""
WARM_STEPS = 500
N_SEEDS = 20
"""Model seeds per check (the claim statements' rules name the same count)."""
CACHE_VERSION = "v1"


def correct_set(t: int) -> list[int]:
    return [n for n in range(K) if n % N_CORRECT == t % N_CORRECT]


@dataclass
class EnumTask:
    """Prompts ``(t, d, hint)`` and the fixed teacher-forcing layout of all ``K`` answers.

    Attributes:
        prompts: ``(t, level, hinted)`` per prompt.
        ids: ``[P, K, L]`` token ids (prompt left-padded, answer right-padded).
        attn: ``[P, K, L]`` attention mask. pos: ``[P, K, L]`` position ids.
        comp_mask: ``[P, K, L-1]`` float mask over the predicted answer tokens (shifted by one).
        reward: ``[P, K]`` float 0/1.
    """

    tokenizer: object
    prompts: list[tuple[int, int, bool]]
    ids: Tensor
    attn: Tensor
    pos: Tensor
    comp_mask: Tensor
    reward: Tensor
    _index: dict[tuple[int, int, bool], int] = field(default_factory=dict)

    @property
    def n_prompts(self) -> int:
        return len(self.prompts)

    def index(self, t: int, d: int, hint: bool = False) -> int:
        return self._index[(t, d, hint)]

    def split(self, held_out: bool, hint: bool = False) -> list[int]:
        """Indices of the plain (or hinted) prompts of the train (``held_out=False``) or held-out split."""
        return [i for i, (t, _, h) in enumerate(self.prompts) if h == hint and ((t in HELD_OUT_T) == held_out)]

    def lengths(self) -> Tensor:
        """``[P, K]`` answer lengths in tokens (ragged)."""
        return self.comp_mask.sum(-1)


def build_task(tokenizer) -> EnumTask:
    """All ``(t, d)`` prompts, plain and hinted, with the teacher-forcing layout of the K answers."""
    prompts = [(t, d, h) for h in (False, True) for t in range(N_T) for d in range(len(LEVEL_PASS))]
    ptexts = [f"t={t} L={d}{' hint' if h else ''}:" for t, d, h in prompts]
    atexts = [f"{n}" for n in range(K)]
    p_tok = [tokenizer(s, add_special_tokens=False)["input_ids"] for s in ptexts]
    a_tok = [tokenizer(s, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for s in atexts]
    lp, la = max(map(len, p_tok)), max(map(len, a_tok))
    pad = tokenizer.pad_token_id
    n_p, length = len(prompts), lp + la
    ids = torch.full((n_p, K, length), pad, dtype=torch.long)
    attn = torch.zeros((n_p, K, length), dtype=torch.long)
    comp = torch.zeros((n_p, K, length), dtype=torch.float32)
    for i, pt in enumerate(p_tok):
        for k, at in enumerate(a_tok):
            s = lp - len(pt)
            ids[i, k, s:lp] = torch.tensor(pt)
            ids[i, k, lp : lp + len(at)] = torch.tensor(at)
            attn[i, k, s : lp + len(at)] = 1
            comp[i, k, lp : lp + len(at)] = 1.0
    pos = (attn.cumsum(-1) - 1).clamp_min(0)
    reward = torch.zeros(n_p, K)
    for i, (t, _, _) in enumerate(prompts):
        reward[i, correct_set(t)] = 1.0
    index = {p: i for i, p in enumerate(prompts)}
    return EnumTask(tokenizer, prompts, ids, attn, pos, comp[..., 1:], reward, index)


def token_logps(model, task: EnumTask, prompt_idx: Tensor) -> tuple[Tensor, Tensor]:
    """Teacher-forced per-token log-probs of all K answers of the given prompts.

    Returns ``(logp [Pb, K, T], mask [Pb, K, T])``; gradient flows when enabled."""
    ids, attn, pos = task.ids[prompt_idx], task.attn[prompt_idx], task.pos[prompt_idx]
    pb, k, length = ids.shape
    out = model(input_ids=ids.view(-1, length), attention_mask=attn.view(-1, length), position_ids=pos.view(-1, length))
    logits = out.logits[:, :-1].float()
    tgt = ids.view(-1, length)[:, 1:]
    lp = torch.log_softmax(logits, -1).gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
    mask = task.comp_mask[prompt_idx].reshape(-1, length - 1)
    lp = lp * mask
    return lp.view(pb, k, -1), mask.view(pb, k, -1)


@dataclass
class Policy:
    """Exact teacher-forced answer distribution of a model on prompts ``idx``."""

    idx: Tensor
    seq_logp: Tensor  # [P, K] unnormalized log pi(y|x) (token sums)
    log_probs: Tensor  # [P, K] renormalized over the K answers

    @property
    def probs(self) -> Tensor:
        return self.log_probs.exp()

    @property
    def leak(self) -> Tensor:
        """``[P]`` mass outside the answer set."""
        return (1.0 - self.seq_logp.exp().sum(-1)).clamp_min(0.0)


@torch.no_grad()
def policy(model, task: EnumTask, idx: Sequence[int] | Tensor, chunk: int = 64) -> Policy:
    idx = torch.as_tensor(idx, dtype=torch.long)
    rows = []
    for s in range(0, len(idx), chunk):
        lp, _ = token_logps(model, task, idx[s : s + chunk])
        rows.append(lp.sum(-1).double())
    seq = torch.cat(rows)
    return Policy(idx, seq, torch.log_softmax(seq, -1))


def tilted(log_ref: Tensor, reward: Tensor, beta: float) -> tuple[Tensor, Tensor]:
    """``(log pi*, log Z)``: ``pi* ∝ pi_ref e^{beta r}`` over the last dim of renormalized ``log_ref``."""
    s = log_ref + beta * reward.to(log_ref.dtype)
    log_z = torch.logsumexp(s, -1)
    return s - log_z[..., None], log_z


def exact_log_z(log_ref: Tensor, reward: Tensor, beta: float) -> Tensor:
    return tilted(log_ref, reward, beta)[1]


def tv_distance(log_p: Tensor, log_q: Tensor) -> Tensor:
    """``[...]`` total variation ``1/2 sum |p - q|`` over the last dim."""
    return 0.5 * (log_p.exp() - log_q.exp()).abs().sum(-1)


def pass_rate(pol: Policy, task: EnumTask) -> Tensor:
    return (pol.probs * task.reward[pol.idx].double()).sum(-1)


# ---------------------------------------------------------------- warm-up (exact SFT), cached per seed
def _warm_targets(task: EnumTask) -> Tensor:
    """``[P, K]`` SFT target distribution: pass rate by level (0.9 hinted), uniform within each set."""
    q = torch.zeros(task.n_prompts, K)
    for i, (_, d, h) in enumerate(task.prompts):
        p = HINT_PASS if h else LEVEL_PASS[d]
        r = task.reward[i]
        q[i] = r * p / r.sum() + (1 - r) * (1 - p) / (K - r.sum())
    return q


def _cache_dir() -> Path:
    root = os.environ.get("TILTLAB_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "tiltlab")
    return Path(root) / "llm_checks"


#: Torch threads used by every training loop of the llm checks: a float reduction's order depends on
#: the thread count, so the same seed gives the same numbers only at a fixed count.
CHECK_THREADS = 1


def fixed_threads(fn):
    """Run ``fn`` with ``torch.set_num_threads(CHECK_THREADS)``, restoring the caller's count."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        before = torch.get_num_threads()
        torch.set_num_threads(CHECK_THREADS)
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(before)

    return wrapper


@fixed_threads
def _sft(model, task: EnumTask, steps: int, seed: int, progress: bool) -> None:
    idx_all = torch.tensor([i for i, (t, _, h) in enumerate(task.prompts) if h or t not in HELD_OUT_T])
    q = _warm_targets(task)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    it = range(steps)
    if progress:
        from tqdm.auto import tqdm  # type: ignore[import-untyped]

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
    import hashlib

    spec = repr(
        (
            CACHE_VERSION,
            K,
            N_CORRECT,
            LEVEL_PASS,
            HINT_PASS,
            N_T,
            HELD_OUT_T,
            "digits+eos",
            1e-2,
            24,
            "threads",
            CHECK_THREADS,
        )
    )
    return hashlib.sha256(spec.encode()).hexdigest()[:12]


@lru_cache(maxsize=8)
def _warm_cached(seed: int, steps: int) -> tuple[object, object, EnumTask]:
    from tiltlab.llm.base.models import build_tiny

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


# ---------------------------------------------------------------- rollouts and training
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
        """Record one run: ``trace`` from :func:`tiltlab.llm.experiments.task.train_online` (or the offline
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


@torch.no_grad()
def reference_tokens(model, task: EnumTask) -> Tensor:
    """``[P_all, K, T]`` token log-probs of every answer of every prompt under ``model``."""
    rows = [
        token_logps(model, task, torch.arange(s, min(s + 64, task.n_prompts)))[0] for s in range(0, task.n_prompts, 64)
    ]
    return torch.cat(rows)


# ---------------------------------------------------------------- statistics
def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (two-sided 95%), exact for every df."""
    if df < 1:
        raise ValueError(f"a t interval needs df >= 1, got {df}")
    return stats.t_quantile(0.975, df)


def mean_ci(xs: Sequence[float]) -> tuple[float, float, float]:
    """``(mean, lo, hi)``: two-sided 95% Student-t interval over seeds (``lo = hi = mean`` for one value)."""
    from tiltlab.claims.stats import paired_t_ci

    x = [float(v) for v in xs]
    if len(x) < 2:
        return x[0], x[0], x[0]
    return paired_t_ci(x, 0.95)  # the one home of the t interval (exact quantile for every df)


def fmt_ci(xs: Sequence[float], digits: int = 3) -> str:
    m, lo, hi = mean_ci(xs)
    return f"{m:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def ci_numbers(prefix: str, xs: Sequence[float]) -> dict[str, float]:
    m, lo, hi = mean_ci(xs)
    return {prefix: m, f"{prefix}_lo": lo, f"{prefix}_hi": hi}


def seeds_for(seed: int, n: int, desc: str | None = None):
    """The ``n`` model seeds a check run at ``--seed seed`` uses (with a progress bar when ``desc``)."""
    seeds = [seed * 100 + i for i in range(n)]
    if desc is None:
        return seeds
    from tqdm.auto import tqdm  # type: ignore[import-untyped]

    return tqdm(seeds, desc=f"llm check {desc}", unit="seed", leave=False)


# ---------------------------------------------------------------- seed-sharded runs
_JOBS = 1
"""Processes :func:`map_seeds` runs the seeds of one check in (set by :func:`set_jobs`; 1 = in this process)."""
_SEED_FN: Callable | None = None
"""The per-seed function of the running :func:`map_seeds`, inherited by its forked workers (never pickled)."""


def _check_jobs(jobs: int) -> int:
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be an integer >= 1 (1 = in this process), got {jobs!r}")
    return jobs


def set_jobs(jobs: int) -> int:
    """Run the seeds of every later :func:`map_seeds` in ``jobs`` forked processes; returns the previous count."""
    global _JOBS
    before, _JOBS = _JOBS, _check_jobs(jobs)
    return before


@contextlib.contextmanager
def seed_jobs(jobs: int) -> Iterator[None]:
    """:func:`set_jobs` ``(jobs)`` for the ``with`` block, the previous count restored after it."""
    before = set_jobs(jobs)
    try:
        yield
    finally:
        set_jobs(before)


def _worker_init() -> None:
    """A seed worker: one torch thread, and its own seeds run in it (no pool inside a pool)."""
    global _JOBS
    torch.set_num_threads(1)
    _JOBS = 1


def _run_seed(s: int):
    """Worker side of :func:`map_seeds`: ``fn(s)``, its error re-raised with the seed named (:func:`_seed_error`)."""
    assert _SEED_FN is not None  # set before the pool forked its workers
    try:
        return _SEED_FN(s)
    except Exception as exc:
        raise _seed_error(exc, s) from exc


def _seed_error(exc: BaseException, s: int) -> BaseException:
    """``exc`` of seed ``s`` as the same exception type with ``"seed <s>: "`` before its message, or a
    ``RuntimeError`` naming the type where that one cannot be built from one message or sent back
    from the worker (pickled)."""
    import pickle

    msg = f"seed {s}: {exc}"
    try:
        out = type(exc)(msg)
        if str(out) == msg and str(pickle.loads(pickle.dumps(out))) == msg:
            return out
    except Exception:
        pass
    return RuntimeError(f"seed {s}: {type(exc).__name__}: {exc}")


def map_seeds(fn: Callable[[int], object], seeds: Sequence[int], desc: str | None = None, jobs: int | None = None):
    """``[fn(s) for s in seeds]``, in seed order, with a progress bar per finished seed when ``desc``.

    ``jobs`` (default: the count of :func:`set_jobs`) > 1 runs the seeds in a pool of that many forked
    processes, each with one torch thread; ``fn`` reaches them through the fork (it may be a closure),
    its results through pickling. ``fn(s)`` must depend on ``s`` only (its own generators seeded by
    ``s``), so a seed's result does not depend on the process that runs it. An error of a worker is
    raised here with its seed named; ``jobs = 1`` runs ``fn`` in this process, errors unchanged."""
    global _SEED_FN
    jobs = _JOBS if jobs is None else _check_jobs(jobs)
    seeds = list(seeds)
    bar = None
    if desc is not None:
        from tqdm.auto import tqdm  # type: ignore[import-untyped]

        bar = tqdm(total=len(seeds), desc=f"llm check {desc}", unit="seed", leave=False)
    try:
        if jobs == 1 or not seeds:
            out = []
            for s in seeds:
                out.append(fn(s))
                if bar is not None:
                    bar.update(1)
            return out
        import multiprocessing as mp
        from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait

        before, _SEED_FN = _SEED_FN, fn
        ex = ProcessPoolExecutor(
            max_workers=min(jobs, len(seeds)), mp_context=mp.get_context("fork"), initializer=_worker_init
        )
        try:
            futs = {ex.submit(_run_seed, s): i for i, s in enumerate(seeds)}
            results: list = [None] * len(seeds)
            todo = set(futs)
            while todo:
                done, todo = wait(todo, return_when=FIRST_EXCEPTION)
                failed = [futs[f] for f in done if f.exception() is not None]
                if failed:
                    # as jobs = 1 would: the first failing seed in seed order, whichever worker failed first
                    earlier = [f for f in futs if futs[f] < min(failed)]
                    wait(earlier)
                    first = min(futs[f] for f in (*done, *earlier) if f.exception() is not None)
                    raise next(f for f in futs if futs[f] == first).exception()  # its seed named by _run_seed
                for fut in sorted(done, key=futs.__getitem__):
                    results[futs[fut]] = fut.result()
                    if bar is not None:
                        bar.update(1)
            return results
        finally:
            ex.shutdown(wait=True, cancel_futures=True)
            _SEED_FN = before
    finally:
        if bar is not None:
            bar.close()


def gather(parts: Sequence):
    """One run's result from its per-seed results (:func:`map_seeds`), each shaped as the run's result with
    that seed's values: every list is the concatenation of the seeds' lists in seed order (a dict key by
    key, a tuple or a dataclass field by field), so it equals the lists a loop over the seeds appends to."""
    if not parts:
        raise ValueError("gather needs the results of at least one seed, got none")
    first = parts[0]
    if isinstance(first, list):
        return [x for p in parts for x in p]
    if isinstance(first, dict):
        if any(list(p) != list(first) for p in parts):
            raise ValueError(f"seeds returned different keys: {[list(p) for p in parts]}")
        return {k: gather([p[k] for p in parts]) for k in first}
    if isinstance(first, tuple):
        return tuple(gather([p[i] for p in parts]) for i in range(len(first)))
    if dataclasses.is_dataclass(first) and not isinstance(first, type):
        return type(first)(**{f.name: gather([getattr(p, f.name) for p in parts]) for f in dataclasses.fields(first)})
    raise TypeError(f"gather combines lists, dicts, tuples and dataclasses of lists, got {type(first).__name__}")
