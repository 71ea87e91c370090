"""The training runs of the stage-3 comparisons on the enumerable task (:mod:`tiltlab.llm.experiments.task`),
which :mod:`tiltlab.llm.checks.enumerable` judges: the reference and its exact quantities for a seed
(:func:`setup`), the arms and their losses (each a function of ``tiltlab.objectives``), the budgets
(:data:`STEPS`, :data:`LR`) and the raw per-seed results of each comparison (``*_raw``, memoized so
the checks that judge one run share it)."""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch

from tiltlab.claims import stats
from tiltlab.llm.base.models import masked_mean_pool
from tiltlab.llm.disa.logz_head import attach_log_z_head, is_log_z_head_param, prompt_log_z
from tiltlab.llm.experiments import pool, training, warmup
from tiltlab.llm.experiments import task as shared_task  # ("task" is a common local name)
from tiltlab.objectives.estimators import log_importance_weights, log_partition_lse
from tiltlab.objectives.lad import F_DIVERGENCES, lad_loss
from tiltlab.objectives.metrics import tv_distance
from tiltlab.objectives.offline import fpa_loss, future_policy_logprobs
from tiltlab.objectives.pg import cispo_loss, group_advantages, grpo_loss, gspo_loss, sapo_loss
from tiltlab.objectives.regressor import fit_regressor
from tiltlab.objectives.tb import disa_loss, flowrl_loss, sequence_logprob, vargrad_loss

STEPS = 100
LR = 2e-3


def _seq(b: training.Batch) -> tuple[torch.Tensor, torch.Tensor]:
    return sequence_logprob(b.logp, b.mask), sequence_logprob(b.logp_ref, b.mask)


def disa_fn(log_z_all: torch.Tensor, beta: float):
    """Stage 3 (DISA eq. 10) with a frozen per-prompt ``log Z`` table ``[P_all]``."""

    def fn(b: training.Batch) -> torch.Tensor:
        lp, logp_ref = _seq(b)
        g = b.ans.shape[1]
        lz = log_z_all[b.prompt_idx].float().repeat_interleave(g)
        return disa_loss(lp, logp_ref, b.reward.reshape(-1), lz, beta=beta).loss

    return fn


class Setup(NamedTuple):
    """What a check of the tiny-model task starts from for one seed (:func:`setup`); unpacks in this order."""

    model: object
    """a fresh copy of the seed's warmed reference model (the run trains it)"""
    task: shared_task.EnumTask
    ref_tokens: torch.Tensor
    """``[P_all, K, T]`` token log-probs of every answer of every prompt under the reference"""
    ref: shared_task.Policy
    """the reference's exact answer distribution on every prompt"""
    train_idx: list[int]
    heldout_idx: list[int]
    log_z: torch.Tensor | None
    """exact ``log Z(x)`` of every prompt at ``beta`` (None without a ``beta``)"""


def setup(seed: int, beta: float | None = None) -> Setup:
    """The reference, the task, its splits and (with ``beta``) the exact ``log Z`` table, for ``seed``."""
    model, task = warmup.warm_reference(seed)
    ref_tok = shared_task.reference_tokens(model, task)
    ref = shared_task.Policy(
        torch.arange(task.n_prompts), ref_tok.sum(-1).double(), torch.log_softmax(ref_tok.sum(-1).double(), -1)
    )
    lz = shared_task.exact_log_z(ref.log_probs, task.reward, beta) if beta is not None else None
    return Setup(model, task, ref_tok, ref, task.split(False), task.split(True), lz)


def evaluate(model, task, idx, ref=None, beta=None) -> dict[str, float]:
    pol = shared_task.policy(model, task, idx)
    pr = shared_task.pass_rate(pol, task)
    out = {"acc": float(pr.mean()), "pass8": float((1 - (1 - pr) ** 8).mean()), "leak": float(pol.leak.mean())}
    # coverage: exp(entropy of pi restricted to the correct answers) / |C|, in [1/|C|, 1]
    r = task.reward[pol.idx].double()
    pc = pol.probs * r
    pc = pc / pc.sum(-1, keepdim=True).clamp_min(1e-300)
    ent = -(pc * pc.clamp_min(1e-300).log()).sum(-1)
    out["coverage"] = float((ent.exp() / r.sum(-1)).mean())
    if ref is not None:
        log_star, _ = shared_task.tilted(ref.log_probs[pol.idx], task.reward[pol.idx], beta)
        out["tv"] = float(tv_distance(pol.log_probs, log_star).mean())
    return out


# ------------------------------------------------------------------ 2. log Z variants
FLOWRL_HEAD = {"hidden": 256, "n_layers": 3, "dropout": 0.1}
"""FlowRL's log Z head (:class:`tiltlab.llm.disa.logz_head.LogZHead`) at the TRL trainer's defaults
(``log_z_hidden``, ``log_z_layers``, ``log_z_dropout``): 3 Linear layers, GELU, LayerNorm, dropout 0.1,
last layer zero-initialised (``log Z = 0`` at the start), on the masked mean of the prompt's last-layer
hidden states, input not detached (FlowRL's code)."""


@contextlib.contextmanager
def seeded_rng(seed: int):
    """The global torch RNG seeded with ``seed`` inside the block and restored after it: the head's
    initialisation and its dropout draw from it, so a seed's run does not depend on what ran before it
    in the same process (:func:`pool.map_seeds`)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def prompt_inputs(task: shared_task.EnumTask, idx) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids [P, L], prompt mask [P, L])``: the teacher-forcing row of answer 0 with only the prompt's
    tokens unmasked (left-padded prompt; the answer's positions masked out)."""
    idx = torch.as_tensor(idx)
    ids, attn = task.ids[idx, 0], task.attn[idx, 0]
    comp = torch.nn.functional.pad(task.comp_mask[idx, 0], (1, 0)).long()  # answer positions of answer 0
    return ids, attn * (1 - comp)


def attach_flowrl_head(model, seed: int):
    """FlowRL's head (:data:`FLOWRL_HEAD`) attached to ``model`` as ``model.log_z_head``
    (:func:`~tiltlab.llm.disa.logz_head.attach_log_z_head`), initialised from ``seed``; the model is
    left in eval mode (:func:`training.train_online` switches it, the head included, to train mode)."""

    with seeded_rng(seed):
        head = attach_log_z_head(model, **FLOWRL_HEAD)
    model.eval()
    return head


def head_log_z(model, task: shared_task.EnumTask, idx) -> torch.Tensor:
    """``[P]`` ``log Z_phi(x) = head(masked mean of the final hidden states over the prompt's tokens)``
    (:func:`~tiltlab.llm.disa.logz_head.prompt_log_z`); gradient reaches head and backbone when enabled."""

    return prompt_log_z(model, *prompt_inputs(task, idx))


@torch.no_grad()
def head_abs_err(model, task: shared_task.EnumTask, idx, log_z_exact: torch.Tensor) -> float:
    """``mean_x |log Z_phi(x) - log Z(x)|`` over prompts ``idx``, the head in eval mode (no dropout)."""
    was = model.training
    model.eval()
    try:
        got = head_log_z(model, task, idx).double()
    finally:
        model.train(was)
    return float((got - log_z_exact[torch.as_tensor(idx)].double()).abs().mean())


def flowrl_fn(log_z_of, beta: float):
    """FlowRL's loss with ``log Z = log_z_of(prompt_idx)`` (``[P]``, attached: FlowRL's head,
    :func:`head_log_z`), at DISA's settings: the same beta, the raw 0/1 reward (no group normalisation),
    sequence sums (no length normalisation), unclipped weight; the only difference from :func:`disa_fn`
    is where log Z comes from. The head is a submodule of the policy, so it takes the policy's optimiser
    steps at the policy's learning rate, as in FlowRL's code (``proj_z`` inside the actor module, one
    optimiser over all of it)."""

    def fn(b: training.Batch) -> torch.Tensor:
        g = b.ans.shape[1]
        return flowrl_loss(
            b.logp, b.logp_ref, b.logp_old, b.mask, b.reward, log_z_of(b.prompt_idx).repeat_interleave(g),
            beta=beta, length_normalize=False, group_normalize=False, weight_clip="ratio",
        ).loss  # fmt: skip

    return fn


def flowrl_head_fn(model, task: shared_task.EnumTask, beta: float):
    """:func:`flowrl_fn` with FlowRL's head on ``model`` (attach it first: :func:`attach_flowrl_head`)."""
    return flowrl_fn(lambda idx: head_log_z(model, task, idx), beta)


def _variants(lz_exact, lz_label, lz_noisy, beta, log_z_of):
    learned = flowrl_fn(log_z_of, beta)

    def vargrad(b: training.Batch) -> torch.Tensor:
        lp, logp_ref = _seq(b)
        g = b.ans.shape[1]
        return vargrad_loss(lp.view(-1, g), logp_ref.view(-1, g), b.reward.float(), beta=beta).loss

    return {
        "exact": disa_fn(lz_exact, beta),
        "is_label_m4": disa_fn(lz_label, beta),
        "exact_plus_noise": disa_fn(lz_noisy, beta),
        "learned_head": learned,
        "vargrad": vargrad,
    }


def stage1_labels(ref, task, idx, beta, m, gen, proposal=None) -> torch.Tensor:
    """``[len(idx)]`` DISA eq. (8) labels from ``m`` exact samples of the proposal (default ``pi_ref``)."""
    idx = torch.as_tensor(idx)
    q = ref.log_probs[idx] if proposal is None else proposal
    ans = training.sample_answers(q, m, gen)
    log_w = log_importance_weights(
        ref.log_probs[idx].gather(1, ans), q.gather(1, ans), beta * task.reward[idx].gather(1, ans)
    )
    return log_partition_lse(log_w, dim=-1)


def _grad_var(model, task, ref_tok, fn, prompts, seed, n=12) -> float:
    """Total variance of the policy's gradient over ``n`` batches at the model's current weights (the
    log Z head's parameters left out, so every arm's number is over the same parameters)."""

    gen = torch.Generator().manual_seed(seed)
    params = [p for name, p in model.named_parameters() if p.requires_grad and not is_log_z_head_param(name)]
    grads = []
    for _ in range(n):
        idx = torch.as_tensor(prompts)[torch.randperm(len(prompts), generator=gen)[:8]]
        all_lp, mask_all = shared_task.token_logps(model, task, idx)
        ans = training.sample_answers(torch.log_softmax(all_lp.detach().sum(-1).double(), -1), 8, gen)
        b = training.Batch(
            idx,
            ans,
            training.gather_tokens(all_lp, ans),
            training.gather_tokens(all_lp, ans).detach(),
            training.gather_tokens(ref_tok[idx], ans),
            training.gather_tokens(mask_all, ans),
            task.reward[idx].gather(1, ans),
            all_lp,
        )
        gs = torch.autograd.grad(fn(b), params, allow_unused=True)
        grads.append(torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(gs, params)]))
    g = torch.stack(grads)
    return float(((g - g.mean(0)) ** 2).sum(1).mean())


LOGZ_NAMES = ("exact", "is_label_m4", "exact_plus_noise", "learned_head", "vargrad")


def logz_variants_raw(
    seed: int, n_seeds: int = pool.N_SEEDS, steps: int = STEPS, beta: float = 2.0, grad_draws: int = 12
):
    """Per-seed ``(tv, gradvar, label_err, head_err_start, head_err, log)`` of the remark2 run (each arm of
    :data:`LOGZ_NAMES` trained from the same warm-up with the same seed; final TV(pi, pi*) on the train
    prompts); memoized per process (``disa.remark2.calibration`` and the VarGrad checks read it)."""
    return _memo(
        ("logz", seed, n_seeds, steps, beta, grad_draws, warmup.WARM_STEPS),
        lambda: _logz_variants_raw(seed, n_seeds, steps, beta, grad_draws),
    )


def _logz_variants_raw(seed: int, n_seeds: int, steps: int, beta: float, grad_draws: int):
    names = LOGZ_NAMES

    def one(s: int):
        tv: dict[str, list[float]] = {k: [] for k in names}
        gv: dict[str, list[float]] = {k: [] for k in names}
        lab_err: list[float] = []
        head_err: list[float] = []
        head_err0: list[float] = []
        log = training.RunLog()
        gen = torch.Generator().manual_seed(s)
        _, task, ref_tok, ref, tr, _, lz = setup(s, beta)
        lab = lz.clone()
        lab[tr] = stage1_labels(ref, task, tr, beta, 4, gen)
        noisy = lz + torch.randn(lz.shape, generator=gen, dtype=lz.dtype)
        lab_err.append(float((lab[tr] - lz[tr]).abs().mean()))
        acc0 = float(
            shared_task.pass_rate(
                shared_task.Policy(torch.tensor(tr), ref.seq_logp[tr], ref.log_probs[tr]), task
            ).mean()
        )
        for k in names:
            model, _ = warmup.warm_reference(s)
            if k == "learned_head":
                attach_flowrl_head(model, s)
                head_err0.append(head_abs_err(model, task, tr, lz))
            fn = _variants(lz, lab, noisy, beta, lambda idx, model=model: head_log_z(model, task, idx))[k]
            with seeded_rng(s):  # the head's dropout
                gv[k].append(_grad_var(model, task, ref_tok, fn, tr, s, n=grad_draws))
                trace = training.train_online(model, task, ref_tok, fn, prompts=tr, steps=steps, lr=LR, seed=s)
            ev = evaluate(model, task, tr, ref, beta)
            log.add(trace, acc0, ev["acc"])
            tv[k].append(ev["tv"])
            if k == "learned_head":
                head_err.append(head_abs_err(model, task, tr, lz))
        return tv, gv, lab_err, head_err0, head_err, log

    return pool.gather(pool.map_seeds(one, pool.seeds_for(seed, n_seeds), "logz_variants"))


# ------------------------------------------------------------------ 4. proposal strength
def proposal_logprobs(ref: shared_task.Policy, task: shared_task.EnumTask, idx, kind: str) -> torch.Tensor:
    """``[len(idx), K]`` log q(y|x) of a proposal: ``pi_ref`` on a re-worded prompt of the same ``t``
    (``level0``: level 0, ``level2``: level 2, ``hint``: the hinted prompt) — same tokenizer, full support."""
    rows = []
    for i in idx:
        t, d, _ = task.prompts[i]
        j = {"level0": task.index(t, 0), "level2": task.index(t, 2), "hint": task.index(t, d, True), "self": i}[kind]
        rows.append(ref.log_probs[j])
    return torch.stack(rows)


# ------------------------------------------------------------------ 5. Stage-2 amortized denoising
@torch.no_grad()
def prompt_features(model, task: shared_task.EnumTask, idx) -> torch.Tensor:

    idx = torch.as_tensor(idx)
    ids, attn, pos = task.ids[idx, 0], task.attn[idx, 0], task.pos[idx, 0]
    comp = torch.nn.functional.pad(task.comp_mask[idx, 0], (1, 0)).long()  # answer positions of answer 0
    pmask = attn * (1 - comp)  # the prompt's tokens only
    out = model(input_ids=ids, attention_mask=attn, position_ids=pos, output_hidden_states=True)
    return masked_mean_pool(out.hidden_states[-1].float(), pmask)


# ------------------------------------------------------------------ 6. DISA vs FlowRL vs GRPO vs GSPO
def method_fns(name: str, lz, beta: float, model=None, task: shared_task.EnumTask | None = None):
    """Arm ``name``'s loss: DISA with the frozen ``lz``, FlowRL with the head on ``model`` (attached by
    :func:`attach_flowrl_head`; ``task`` gives its prompts), or a policy-gradient baseline."""

    def grpo(b: training.Batch) -> torch.Tensor:
        return grpo_loss(b.logp, b.logp_old, group_advantages(b.reward).reshape(-1), b.mask).loss

    def gspo(b: training.Batch) -> torch.Tensor:
        return gspo_loss(b.logp, b.logp_old, group_advantages(b.reward).reshape(-1), b.mask).loss

    def cispo(b: training.Batch) -> torch.Tensor:
        return cispo_loss(b.logp, b.logp_old, group_advantages(b.reward).reshape(-1), b.mask).loss

    def sapo(b: training.Batch) -> torch.Tensor:
        return sapo_loss(b.logp, b.logp_old, group_advantages(b.reward).reshape(-1), b.mask).loss

    if name == "disa":
        return disa_fn(lz, beta)
    if name == "flowrl":
        if model is None or task is None:
            raise ValueError("the flowrl arm needs the model carrying its log Z head and the task")
        return flowrl_head_fn(model, task, beta)
    return {"grpo": grpo, "gspo": gspo, "cispo": cispo, "sapo": sapo}[name]


_MEMO: dict[tuple, object] = {}


def _memo(key: tuple, fn):
    """Per-process memo of a run's raw per-seed results: several claims read one run."""
    if key not in _MEMO:
        _MEMO[key] = fn()
    return _MEMO[key]


METHODS = ("disa", "flowrl", "grpo", "gspo")
CONTEXT_METHODS = ("cispo", "sapo")
"""Current reward maximizers beside GRPO/GSPO (issue 37), trained by :func:`context_raw` apart from the four
judged arms (each arm seeds itself: the four arms' numbers are those of the run without them) and reported as
context numbers, not judged items."""
CONTEXT_OLD_EVERY = 4
"""pi_old of the context arms is refreshed every this many steps (the LAD run's staleness): on an on-policy step
CISPO's and SAPO's gradient is GRPO's, so three of their four steps per pi_old see ratios off 1."""
LABELS = {"disa": "DISA", "flowrl": "FlowRL", "grpo": "GRPO", "gspo": "GSPO", "cispo": "CISPO", "sapo": "SAPO"}
STAGE1_M = 8


def disa_pipeline_labels(model, task, ref, tr, beta: float, gen, seed: int) -> torch.Tensor:
    """DISA Stages 1-2 on the train prompts: ``M = 8`` IS labels from ``pi_ref``, a regressor on the
    prompt features, and its predictions as the frozen log Z (``[P_all]``; other prompts 0, unused)."""

    lab = stage1_labels(ref, task, tr, beta, STAGE1_M, gen)
    feats = prompt_features(model, task, tr)
    fit = fit_regressor(feats, lab.float(), epochs=200, hidden=64, seed=seed)
    out = torch.zeros(task.n_prompts, dtype=torch.float64)
    with torch.no_grad():
        out[torch.as_tensor(tr)] = fit.model(feats).double()
    if not torch.isfinite(out).all():
        raise FloatingPointError("non-finite Stage-2 prediction")
    return out


def methods_raw(
    seed: int, n_seeds: int = pool.N_SEEDS, steps: int = STEPS, beta: float = 4.0
) -> dict[str, dict[str, list]]:
    """Per-seed Mean (train accuracy), held-out accuracy, pass@8 and coverage of DISA (Stage-1/2
    estimated frozen log Z), FlowRL (its log Z head, :data:`FLOWRL_HEAD`, trained with the policy; same beta,
    raw reward, sequence sums),
    GRPO and GSPO; memoized per process (the Table-1 and PACED Table-1 checks read it)."""
    return _memo(
        ("methods", seed, n_seeds, steps, beta, warmup.WARM_STEPS),
        lambda: _methods_raw(seed, n_seeds, steps, beta),
    )


def _methods_raw(seed: int, n_seeds: int, steps: int, beta: float) -> dict[str, dict[str, list]]:
    names = METHODS

    def one(s: int) -> dict[str, dict[str, list]]:
        res: dict[str, dict[str, list]] = {
            k: {"acc": [], "heldout_acc": [], "pass8": [], "coverage": [], "heldout_pass8": [], "heldout_coverage": []}
            for k in names
        }
        res["_ran"] = {"loss": [], "weights": [], "acc": []}
        res["_label_rmse"] = {"train": []}
        res["_flowrl_head"] = {"abs_err_start": [], "abs_err_end": []}
        gen = torch.Generator().manual_seed(s)
        warm, task, ref_tok, ref, tr, ho, lz = setup(s, beta)
        lab = disa_pipeline_labels(warm, task, ref, tr, beta, gen, s)
        res["_label_rmse"]["train"].append(float((lab[tr] - lz[tr]).pow(2).mean().sqrt()))
        acc0 = float(
            shared_task.pass_rate(
                shared_task.Policy(torch.tensor(ho), ref.seq_logp[ho], ref.log_probs[ho]), task
            ).mean()
        )
        for k in names:
            model, _ = warmup.warm_reference(s)
            if k == "flowrl":
                attach_flowrl_head(model, s)
                res["_flowrl_head"]["abs_err_start"].append(head_abs_err(model, task, tr, lz))
            with seeded_rng(s):  # the head's dropout
                trace = training.train_online(
                    model, task, ref_tok, method_fns(k, lab, beta, model, task), prompts=tr, steps=steps, lr=LR, seed=s
                )
            if k == "flowrl":
                res["_flowrl_head"]["abs_err_end"].append(head_abs_err(model, task, tr, lz))
            _record_arm(res, k, model, task, tr, ho, trace, acc0)
        return res

    return pool.gather(pool.map_seeds(one, pool.seeds_for(seed, n_seeds), "methods_compare"))


def context_raw(
    seed: int, n_seeds: int = pool.N_SEEDS, steps: int = STEPS, beta: float = 4.0
) -> dict[str, dict[str, list]]:
    """The 4-method run's context arms (:data:`CONTEXT_METHODS`: CISPO and SAPO at TRL's defaults, pi_old
    refreshed every :data:`CONTEXT_OLD_EVERY` steps) on its seeds, prompts, steps and learning rate, in the
    layout of :func:`methods_raw`; memoized apart from it, so that only the Table-1 check, not the PACED
    one that reads the 4-method run's FlowRL arm, trains them. ``beta`` only keys the run (no tilt here)."""
    return _memo(
        ("context", seed, n_seeds, steps, beta, warmup.WARM_STEPS),
        lambda: _context_raw(seed, n_seeds, steps, beta),
    )


def _context_raw(seed: int, n_seeds: int, steps: int, beta: float) -> dict[str, dict[str, list]]:

    def one(s: int) -> dict[str, dict[str, list]]:
        res: dict[str, dict[str, list]] = {
            k: {"acc": [], "heldout_acc": [], "pass8": [], "coverage": [], "heldout_pass8": [], "heldout_coverage": []}
            for k in CONTEXT_METHODS
        }
        res["_ran"] = {"loss": [], "weights": [], "acc": []}
        _, task, ref_tok, ref, tr, ho, _ = setup(s, beta)
        acc0 = float(
            shared_task.pass_rate(
                shared_task.Policy(torch.tensor(ho), ref.seq_logp[ho], ref.log_probs[ho]), task
            ).mean()
        )
        for k in CONTEXT_METHODS:
            model, _ = warmup.warm_reference(s)
            trace = training.train_online(
                model,
                task,
                ref_tok,
                method_fns(k, None, beta),
                prompts=tr,
                steps=steps,
                lr=LR,
                seed=s,
                old_every=CONTEXT_OLD_EVERY,
            )
            _record_arm(res, k, model, task, tr, ho, trace, acc0)
        return res

    return pool.gather(pool.map_seeds(one, pool.seeds_for(seed, n_seeds), "methods_compare context arms"))


def _record_arm(res: dict, k: str, model, task, tr, ho, trace, acc0: float) -> None:
    """Append arm ``k``'s train and held-out accuracy / pass@8 / coverage and "it ran" flags (loss
    moved, weights moved, held-out accuracy moved from the warm start ``acc0``) to the run's lists."""
    e, eh = evaluate(model, task, tr), evaluate(model, task, ho)
    for key in ("acc", "pass8", "coverage"):
        res[k][key].append(e[key])
    for key in ("acc", "pass8", "coverage"):
        res[k][f"heldout_{key}"].append(eh[key])
    res["_ran"]["loss"].append(trace.loss_moved)
    res["_ran"]["weights"].append(trace.param_change > 0)
    res["_ran"]["acc"].append(abs(eh["acc"] - acc0) > 1e-9)


# ------------------------------------------------------------------ 7. LAD divergences and GRPO + KL to pi_old
def lad_fn(div: str, eta: float):
    def fn(b: training.Batch) -> torch.Tensor:
        lp = sequence_logprob(b.logp, b.mask)
        lo = sequence_logprob(b.logp_old, b.mask)
        return lad_loss(lp, lo, group_advantages(b.reward).reshape(-1), eta=eta, divergence=div).loss

    return fn


def grpo_kl_fn(clip: bool):
    def fn(b: training.Batch) -> torch.Tensor:
        return grpo_loss(
            b.logp, b.logp_old, group_advantages(b.reward).reshape(-1), b.mask,
            clip_eps=0.2 if clip else 1e6, token_logp_ref=b.logp_old, kl_coef=1.0,
        ).loss  # fmt: skip

    return fn


LAD_NAMES = (*F_DIVERGENCES, "grpo_kl_clip", "grpo_kl_noclip")


def lad_raw(seed: int, n_seeds: int = pool.N_SEEDS, steps: int = STEPS, eta: float = 1.0, old_every: int = 4):
    """Per-seed final train and held-out accuracy of LAD with each divergence and of GRPO + KL to
    pi_old with / without the clip; memoized per process (``lad.strict_better`` and
    ``lad.table8.divergences`` read it)."""
    return _memo(
        ("lad", seed, n_seeds, steps, eta, old_every, warmup.WARM_STEPS),
        lambda: _lad_raw(seed, n_seeds, steps, eta, old_every),
    )


def _lad_raw(seed: int, n_seeds: int, steps: int, eta: float, old_every: int):
    divs = tuple(F_DIVERGENCES)

    def one(s: int):
        acc: dict[str, list[float]] = {k: [] for k in LAD_NAMES}
        hacc: dict[str, list[float]] = {k: [] for k in LAD_NAMES}
        log = training.RunLog()
        _, task, ref_tok, ref, tr, ho, _ = setup(s)
        acc0 = float(
            shared_task.pass_rate(
                shared_task.Policy(torch.tensor(tr), ref.seq_logp[tr], ref.log_probs[tr]), task
            ).mean()
        )
        for k in LAD_NAMES:
            model, _ = warmup.warm_reference(s)
            fn = lad_fn(k, eta) if k in divs else grpo_kl_fn(k.endswith("_clip"))
            trace = training.train_online(
                model, task, ref_tok, fn, prompts=tr, steps=steps, lr=LR, seed=s, old_every=old_every
            )
            acc[k].append(evaluate(model, task, tr)["acc"])
            hacc[k].append(evaluate(model, task, ho)["acc"])
            log.add(trace, acc0, acc[k][-1])
        return acc, hacc, log

    return pool.gather(pool.map_seeds(one, pool.seeds_for(seed, n_seeds), "lad_divergences"))


# ------------------------------------------------------------------ 8. FPA entanglement
FPA_APPLY_TO = ("all", "correct", "incorrect")


def fpa_targeted_loss(logp, logp_future, lengths, reward, apply_to: str = "all") -> torch.Tensor:
    """FPA applied to part of the data (FPA §3.3 Table 2's ablation; ``fpa_apply_to`` of the offline
    trainer), every row kept:

        w_i  = sg(pi_hat(y_i|x_i))^{1/|y_i|}   if row i is targeted (``all``; ``correct``: R_i > 0;
                                                ``incorrect``: R_i < 0)
             = sg(pi_theta(y_i|x_i))^{1/|y_i|} otherwise (Off-RL's weight)
        loss = -mean_i( R_i * w_i * logp_i / |y_i| )

    so a targeted row's gradient is FPA's and every other row's is Off-RL's (eq. 2). ``[B]`` tensors."""
    if apply_to not in FPA_APPLY_TO:
        raise ValueError(f"apply_to must be one of {FPA_APPLY_TO}, got {apply_to!r}")
    if apply_to != "all":
        use = reward > 0 if apply_to == "correct" else reward < 0
        logp_future = torch.where(use, logp_future.detach(), logp.detach())
    return fpa_loss(logp, logp_future, lengths, reward).loss


def fpa_train(
    model, ref_model, task, data_idx, data_ans, reward, lam: float, steps: int, lr: float, seed: int, apply_to="all"
):
    """Offline FPA at ``lam`` on the fixed data ``(data_idx, data_ans, reward)``: ``steps`` Adam steps on
    batches of 64 rows drawn from all of it, the extrapolated weight on the rows ``apply_to`` names
    (:func:`fpa_targeted_loss`)."""
    gen = torch.Generator().manual_seed(seed)
    n = len(data_idx)
    params = list(model.parameters())
    before = training._snapshot(params)
    losses: list[float] = []
    opt = torch.optim.Adam(params, lr=lr)
    model.train()
    for step in range(steps):
        j = torch.randperm(n, generator=gen)[:64]
        pi, ai = data_idx[j], data_ans[j]
        ids, attn, pos = task.ids[pi, ai], task.attn[pi, ai], task.pos[pi, ai]
        mask = task.comp_mask[pi, ai]
        lt = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, :-1].float()
        with torch.no_grad():
            lref = ref_model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, :-1].float()
        tgt = ids[:, 1:]
        tok = torch.log_softmax(lt, -1).gather(-1, tgt[..., None]).squeeze(-1)
        fut = future_policy_logprobs(lt.detach(), lref, tgt, lam=lam)
        lp, lf = sequence_logprob(tok, mask), sequence_logprob(fut, mask)
        loss = fpa_targeted_loss(lp, lf, mask.sum(-1), reward[j], apply_to)
        losses.append(training.step_loss(loss, step))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    return training.Trace(losses, training._change(params, before))


FPA_LAMS = (0.0, 1.0, 2.0, 5.0, 20.0)


def fpa_raw(seed: int, n_seeds: int = pool.N_SEEDS, steps: int = 150, lams=FPA_LAMS):
    """Per-seed results of the offline FPA lambda sweep (train and held-out accuracy, log-prob
    shifts of correct / incorrect answers, and at lambda = 1 FPA's weight on the correct rows only /
    the incorrect rows only, Off-RL's on the others, all data kept: :func:`fpa_targeted_loss`);
    memoized per process (the Figs. 2-4 and the Table-6 / lambda checks read it)."""
    return _memo(
        ("fpa", seed, n_seeds, steps, tuple(lams), warmup.WARM_STEPS), lambda: _fpa_raw(seed, n_seeds, steps, lams)
    )


def _fpa_raw(seed: int, n_seeds: int, steps: int, lams) -> dict:

    def one(s: int) -> dict:
        acc: dict[float, list[float]] = {lam: [] for lam in lams}
        hacc: dict[float, list[float]] = {lam: [] for lam in lams}
        dcorr: dict[float, list[float]] = {lam: [] for lam in lams}
        dinc: dict[float, list[float]] = {lam: [] for lam in lams}
        base: list[float] = []
        hbase: list[float] = []
        parts: dict[str, list[float]] = {"correct_only": [], "incorrect_only": []}
        log = training.RunLog()
        gen = torch.Generator().manual_seed(s)
        ref_model, task, _, ref, tr, ho, _ = setup(s)
        tr_t = torch.tensor(tr)
        ans = training.sample_answers(ref.log_probs[tr_t], 8, gen)  # offline data: 8 samples per prompt from pi_ref
        data_idx, data_ans = tr_t.repeat_interleave(8), ans.reshape(-1)
        reward = 2.0 * task.reward[data_idx, data_ans] - 1.0  # signed reward, as the simulator's FPA runs
        r_all = task.reward[tr_t].bool()
        base.append(
            float(shared_task.pass_rate(shared_task.Policy(tr_t, ref.seq_logp[tr_t], ref.log_probs[tr_t]), task).mean())
        )
        ho_t = torch.tensor(ho)
        hbase.append(
            float(shared_task.pass_rate(shared_task.Policy(ho_t, ref.seq_logp[ho_t], ref.log_probs[ho_t]), task).mean())
        )
        for lam in lams:
            model, _ = warmup.warm_reference(s)
            trace = fpa_train(model, ref_model, task, data_idx, data_ans, reward, lam, steps, LR, s)
            pol = shared_task.policy(model, task, tr)
            acc[lam].append(float(shared_task.pass_rate(pol, task).mean()))
            log.add(trace, base[-1], acc[lam][-1])
            hacc[lam].append(float(shared_task.pass_rate(shared_task.policy(model, task, ho), task).mean()))
            d = pol.seq_logp - ref.seq_logp[tr_t]  # log pi - log pi_ref, unnormalized sequence log-probs
            dcorr[lam].append(float(d[r_all].mean()))
            dinc[lam].append(float(d[~r_all].mean()))
        for part, apply_to in (("correct_only", "correct"), ("incorrect_only", "incorrect")):
            model, _ = warmup.warm_reference(s)
            trace = fpa_train(model, ref_model, task, data_idx, data_ans, reward, 1.0, steps, LR, s, apply_to=apply_to)
            parts[part].append(float(shared_task.pass_rate(shared_task.policy(model, task, tr), task).mean()))
            log.add(trace, base[-1], parts[part][-1])
        return {
            "acc": acc, "heldout_acc": hacc, "dcorr": dcorr, "dinc": dinc, "base": base, "heldout_base": hbase,
            "parts": parts, "log": log,
        }  # fmt: skip

    return pool.gather(pool.map_seeds(one, pool.seeds_for(seed, n_seeds), "fpa_entanglement"))


def _fpa_heldout(seed: int, n_seeds: int, steps: int):
    r = fpa_raw(seed, n_seeds, steps, FPA_LAMS)
    h = r["heldout_acc"]
    nums: dict[str, float] = stats.ci_numbers("heldout_acc_ref", r["heldout_base"])
    for lam in FPA_LAMS:
        nums.update(stats.ci_numbers(f"heldout_acc_lam{lam:g}", h[lam]))
    txt = (
        f"offline FPA sweep ({steps} steps, {n_seeds} seeds), held-out accuracy: ref {stats.fmt_ci(r['heldout_base'])}, "
        + ", ".join(f"lam={lam:g} {stats.fmt_ci(h[lam])}" for lam in FPA_LAMS)
    )
    return h, nums, txt
