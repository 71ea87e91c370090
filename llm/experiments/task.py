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
warmed up by a short exact SFT (:func:`tiltlab.llm.experiments.warmup.warm_reference`), cached per seed in
memory and on disk; one training run on the task is :func:`tiltlab.llm.experiments.training.train_online`,
and a check's seeds run through :mod:`tiltlab.llm.experiments.pool`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

__all__ = [
    "HELD_OUT_T",
    "HINT_PASS",
    "LEVEL_PASS",
    "N_CORRECT",
    "N_T",
    "EnumTask",
    "K",
    "Policy",
    "build_task",
    "correct_set",
    "exact_log_z",
    "pass_rate",
    "policy",
    "reference_tokens",
    "tilted",
    "token_logps",
]

K = 16
N_CORRECT = 4
LEVEL_PASS = (0.01, 0.03, 0.1, 0.25, 0.5, 0.8)
"""Warm-up pass rate of a prompt at level ``d`` (index); hinted prompts are warmed to 0.9."""
HINT_PASS = 0.9
N_T = 8
HELD_OUT_T = (3, 6)
"""Values of ``t`` whose prompts are never seen in warm-up or training (the held-out split)."""


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


def pass_rate(pol: Policy, task: EnumTask) -> Tensor:
    return (pol.probs * task.reward[pol.idx].double()).sum(-1)


@torch.no_grad()
def reference_tokens(model, task: EnumTask) -> Tensor:
    """``[P_all, K, T]`` token log-probs of every answer of every prompt under ``model``."""
    rows = [
        token_logps(model, task, torch.arange(s, min(s + 64, task.n_prompts)))[0] for s in range(0, task.n_prompts, 64)
    ]
    return torch.cat(rows)
