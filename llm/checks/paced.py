"""PACED-RL at small scale: the tau sweep on the held-out split, PACED vs GRPO / FlowRL, and the
difficulty of the selected prompts over training (:mod:`tiltlab.llm.experiments.task`'s shared task).

PACED's math lives in ``tiltlab.objectives``: the TB residual anchored on the rollout policy
(``tb.tb_residual(logp, logp_old, r, log Z, beta)``, ``tb.tb_loss``), the accuracy estimate
``paced.accuracy_from_log_z`` (``p_hat = clip(log Z_phi / beta, 0, 1)``) and the selection
``paced.select_prompts`` (the ``m`` prompts with ``p_hat`` closest to ``tau``). ``log Z_phi`` here is a
per-prompt table, not PACED's network (PACED §4.3: an MLP on frozen ``pi_ref`` prompt embeddings;
``llm.train`` runs that): one free entry per train prompt, its own Adam learning rate
:data:`LOGZ_LR`, initialized, as the simulator's PACED runs, from a Stage-1 estimate
(``beta * pass_rate_from_log_z(label)``, ``M = 8`` samples of ``pi_ref``). Its target is not DISA's
``log Z``: anchored on ``pi_old``, on-policy, the minimizer of the TB loss is ``beta * p_old(x)``
(Prop. 4.1), so each run reports ``mean |table - beta * p_theta(x)|`` over the train prompts at the
start and at the end (:func:`table_abs_err`, ``p_theta`` the exact pass rate of the policy then).

The pass rules are written in the claim statements (``paced.tau_sweep`` in ``core.toml``, the
others in ``paced_empirical.toml``) and in ``docs/llm-checks.md``, fixed before the runs.
"""

from __future__ import annotations

import torch

from tiltlab.claims import stats
from tiltlab.claims.registry import CheckResult, Verdict
from tiltlab.llm.experiments import pool, tiny, training, warmup
from tiltlab.llm.experiments import task as shared_task  # ("task" is a common local name)
from tiltlab.objectives.estimators import pass_rate_from_log_z
from tiltlab.objectives.paced import accuracy_from_log_z, select_prompts
from tiltlab.objectives.pg import group_advantages, grpo_loss
from tiltlab.objectives.tb import sequence_logprob, tb_loss, tb_residual

from . import enumerable, rules

INCONCLUSIVE = Verdict.INCONCLUSIVE
TAUS = (0.1, 0.3, 0.5, 0.7, 0.9)
BETA = 4.0
"""PACED's tilt (1 / its KL coefficient): the TB target is ``pi_old e^{BETA r}``."""
LOGZ_LR = 0.05
"""Adam learning rate of the per-prompt ``log Z_phi`` table (the policy's is ``tiny.LR``)."""
BATCH_PROMPTS = 8
"""Prompts per step of every arm: PACED selects this many, the random arms draw this many."""
EARLY = 25
"""Step after which the held-out accuracy is read for the "fast start" item."""


def paced_fn(table: torch.Tensor, beta: float):
    """PACED's TB (anchored on the rollout policy) with a per-prompt ``log Z_phi`` table ``[P_all]``."""

    def fn(b: training.Batch) -> torch.Tensor:
        lp, lo = sequence_logprob(b.logp, b.mask), sequence_logprob(b.logp_old, b.mask)
        lz = table[b.prompt_idx].repeat_interleave(b.ans.shape[1])
        return tb_loss(tb_residual(lp, lo, b.reward.reshape(-1).to(lp.dtype), lz, beta=beta)).loss

    return fn


@torch.no_grad()
def table_abs_err(model, task: shared_task.EnumTask, idx: torch.Tensor, table: torch.Tensor, beta: float) -> float:
    """``mean_x |log Z_phi(x) - beta * p_theta(x)|`` over prompts ``idx``: the table against its on-policy
    fixed point (Prop. 4.1), ``p_theta`` the model's exact pass rate."""
    p = shared_task.pass_rate(shared_task.policy(model, task, idx), task)
    return float((table.detach()[idx].double() - beta * p).abs().mean())


def _grpo(b: training.Batch) -> torch.Tensor:
    return grpo_loss(b.logp, b.logp_old, group_advantages(b.reward).reshape(-1), b.mask).loss


ARMS = (*(f"tau{t:g}" for t in TAUS), "no_selection", "grpo")


def paced_raw(seed: int, n_seeds: int = pool.N_SEEDS, steps: int = tiny.STEPS, taus=TAUS, beta: float = BETA):
    """Per seed and arm: final train / held-out accuracy, held-out accuracy at step ``EARLY``, mean
    reward of the trained batches, and the mean ``pi_ref`` pass rate of the prompts trained in the
    first and the last fifth of the run. Arms: PACED at each tau, the same objective on random
    prompts (``no_selection``), GRPO on random prompts. Memoized per process."""
    return tiny._memo(
        ("paced", seed, n_seeds, steps, tuple(taus), beta, warmup.WARM_STEPS),
        lambda: _paced_raw(seed, n_seeds, steps, taus, beta),
    )


def _paced_raw(seed: int, n_seeds: int, steps: int, taus, beta: float) -> dict[str, dict[str, list[float]]]:
    arms = (*(f"tau{t:g}" for t in taus), "no_selection", "grpo")
    keys = ("acc", "heldout_acc", "heldout_early", "batch_reward", "ref_pass_early", "ref_pass_late")
    fifth = max(1, steps // 5)
    early_step = min(EARLY, steps)

    def one(s: int) -> dict:
        res: dict = {a: {k: [] for k in keys} for a in arms}
        res["_logz"] = {a: {"abs_err_start": [], "abs_err_end": []} for a in arms if a != "grpo"}
        log = rules.RunLog()
        gen = torch.Generator().manual_seed(s)
        _, task, ref_tok, ref, tr, ho, _ = tiny.setup(s)
        tr_t = torch.tensor(tr)
        ref_pass = shared_task.pass_rate(
            shared_task.Policy(torch.arange(task.n_prompts), ref.seq_logp, ref.log_probs), task
        )
        init = beta * pass_rate_from_log_z(tiny.stage1_labels(ref, task, tr, beta, 8, gen), beta=beta)
        for arm, tau in zip(arms, (*taus, None, None)):
            model, _ = warmup.warm_reference(s)
            table = torch.nn.Parameter(torch.zeros(task.n_prompts))
            with torch.no_grad():
                table[tr_t] = init.float()
            if arm != "grpo":
                res["_logz"][arm]["abs_err_start"].append(table_abs_err(model, task, tr_t, table, beta))
            trained: list[torch.Tensor] = []
            rewards: list[float] = []
            early: list[float] = []

            def select(step: int, tau=tau, table=table) -> torch.Tensor:
                p_hat = accuracy_from_log_z(table.detach()[tr_t], kl_coef=1.0 / beta)
                return tr_t[select_prompts(p_hat, tau=tau, m=BATCH_PROMPTS)]

            inner = _grpo if arm == "grpo" else paced_fn(table, beta)

            def fn(b: training.Batch, inner=inner, trained=trained, rewards=rewards) -> torch.Tensor:
                trained.append(b.prompt_idx.clone())
                rewards.append(float(b.reward.mean()))
                return inner(b)

            def on_step(step: int, model=model, early=early) -> None:
                if step + 1 == early_step:
                    early.append(float(shared_task.pass_rate(shared_task.policy(model, task, ho), task).mean()))
                    model.train()

            trace = training.train_online(
                model,
                task,
                ref_tok,
                fn,
                prompts=tr,
                steps=steps,
                lr=tiny.LR,
                seed=s,
                select=select if tau is not None else None,
                extra_params=(table,) if arm != "grpo" else (),
                extra_lr=LOGZ_LR,
                batch_prompts=BATCH_PROMPTS,
                on_step=on_step,
            )
            if arm != "grpo":
                res["_logz"][arm]["abs_err_end"].append(table_abs_err(model, task, tr_t, table, beta))
            r = res[arm]
            r["acc"].append(tiny.evaluate(model, task, tr)["acc"])
            r["heldout_acc"].append(tiny.evaluate(model, task, ho)["acc"])
            r["heldout_early"].append(early[0])
            log.add(trace, float(ref_pass[ho].mean()), r["heldout_acc"][-1])
            r["batch_reward"].append(sum(rewards) / len(rewards))
            r["ref_pass_early"].append(float(ref_pass[torch.cat(trained[:fifth])].mean()))
            r["ref_pass_late"].append(float(ref_pass[torch.cat(trained[-fifth:])].mean()))
        res["_log"] = log
        return res

    return pool.gather(pool.map_seeds(one, pool.seeds_for(seed, n_seeds), "paced_tau_sweep"))


def _paired(res, a: str, others: tuple[str, ...], key: str = "heldout_acc") -> list[float]:
    """Per seed: ``res[a][key]`` minus the mean of ``res[o][key]`` over ``others``."""
    n = len(res[a][key])
    return [res[a][key][i] - sum(res[o][key][i] for o in others) / len(others) for i in range(n)]


SWEEP_KEYS = ("best_0.5_minus_edges", "others_minus_0.1", "fast_start_0.9")
TAU_SWEEP_ITEMS = {**enumerable._items(SWEEP_KEYS), **enumerable.RAN}
FIG4_ITEMS = dict(TAU_SWEEP_ITEMS)
TABLE1_ITEMS = {**enumerable._items(("paced_minus_grpo", "paced_minus_flowrl")), **enumerable.RAN}


def _arms(res) -> dict:
    return {a: r for a, r in res.items() if not a.startswith("_")}


def _sweep_items(res) -> list[rules.Item]:
    mid_vs_edges = _paired(res, "tau0.5", ("tau0.1", "tau0.9"))
    worst = _paired(res, "tau0.1", ("tau0.3", "tau0.5", "tau0.7", "tau0.9"))
    fast = _paired(res, "tau0.9", ("tau0.1", "tau0.3", "tau0.5", "tau0.7"), key="heldout_early")
    return [
        rules.Item("best_0.5_minus_edges", tuple(mid_vs_edges), margin=enumerable.ACC_MARGIN),
        rules.Item("others_minus_0.1", tuple(-x for x in worst), margin=enumerable.ACC_MARGIN),
        rules.Item("fast_start_0.9", tuple(fast), margin=enumerable.ACC_MARGIN),
    ]


def _sweep_numbers(res, steps: int, n_seeds: int):
    arms = _arms(res)
    nums: dict[str, float] = {**res["_log"].numbers()}
    for arm, r in arms.items():
        for k, xs in r.items():
            nums.update(stats.ci_numbers(f"{arm}_{k}", xs))
    for arm, errs in res["_logz"].items():
        for k, xs in errs.items():
            nums.update(stats.ci_numbers(f"{arm}_logz_table_{k}", xs))
    tracks = [a - b for a, b in zip(res["tau0.9"]["batch_reward"], res["tau0.1"]["batch_reward"])]
    nums.update(stats.ci_numbers("context_train_reward_tracks_tau", tracks))
    err = res["_logz"]["tau0.5"]
    txt = (
        f"PACED (TB anchored on pi_old, beta={BETA:g}, log Z_phi a per-prompt table (not PACED's MLP on pi_ref "
        f"embeddings), Adam lr {LOGZ_LR:g}, started at beta x the Stage-1 M=8 pass-rate estimate; tau=0.5's mean "
        f"|table - beta p_theta| start {stats.fmt_ci(err['abs_err_start'])}, end {stats.fmt_ci(err['abs_err_end'])}; "
        f"8 of the train prompts per step), "
        f"{steps} steps, {n_seeds} seeds; held-out accuracy: "
        + ", ".join(f"{a} {stats.fmt_ci(arms[a]['heldout_acc'])}" for a in arms)
        + f"; at step {min(EARLY, steps)}: "
        + ", ".join(f"{a} {stats.fmt_ci(arms[a]['heldout_early'])}" for a in arms if a.startswith("tau"))
        + "; items: held-out tau=0.5 - mean(0.1, 0.9), mean(others) - tau=0.1, tau=0.9 - mean(others) at the early "
        f"step; context (holds by selection, not judged): batch reward tau=0.9 - tau=0.1 {stats.fmt_ci(tracks)}"
    )
    return nums, txt


def _sweep_result(seed: int, n_seeds: int, steps: int, shared: str) -> CheckResult:
    res = paced_raw(seed, n_seeds, steps)
    nums, txt = _sweep_numbers(res, steps, n_seeds)
    return enumerable.result(_sweep_items(res), res["_log"].items(), f"{txt}; {shared}", nums)


@enumerable.tiny_check("paced.tau_sweep", INCONCLUSIVE, TAU_SWEEP_ITEMS)
def tau_sweep(seed: int, n_seeds: int = pool.N_SEEDS, steps: int = tiny.STEPS) -> CheckResult:
    """PACED selection at tau in {0.1, 0.3, 0.5, 0.7, 0.9} plus a no-selection arm, held-out accuracy;
    three paired items (:func:`_sweep_items`) under :func:`rules.judge`."""
    return _sweep_result(seed, n_seeds, steps, "shared run with paced.fig4.tau_llm, paced.fig5, paced.table1.*")


@enumerable.tiny_check("paced.fig4.tau_llm", INCONCLUSIVE, FIG4_ITEMS)
def tau_sweep_fig4(seed: int, n_seeds: int = pool.N_SEEDS, steps: int = tiny.STEPS) -> CheckResult:
    """Fig. 4: the items of :func:`tau_sweep` (one experiment for both claims). "Train accuracy
    tracks tau" (batch reward at tau = 0.9 above tau = 0.1) holds from the selection itself and is
    reported as context, not judged."""
    return _sweep_result(seed, n_seeds, steps, "the paced.tau_sweep run (one experiment, not independent evidence)")


@enumerable.tiny_check("paced.table1.math_qwen2.5_math_1.5b", INCONCLUSIVE, TABLE1_ITEMS)
def paced_vs_baselines(seed: int, n_seeds: int = pool.N_SEEDS, steps: int = tiny.STEPS) -> CheckResult:
    """PACED (tau = 0.5) vs GRPO and vs FlowRL (the memoized 4-method run: same seeds, steps, learning
    rate, prompts and beta), held-out accuracy, two paired items; at most partly (DS, LILO and
    MoPPS are not run). One run for both backbones' claims."""
    res = paced_raw(seed, n_seeds, steps)
    m = tiny.methods_raw(seed, n_seeds, steps)
    p = res["tau0.5"]["heldout_acc"]
    nums = {
        **stats.ci_numbers("paced_heldout_acc", p),
        **stats.ci_numbers("grpo_heldout_acc", res["grpo"]["heldout_acc"]),
        **stats.ci_numbers("flowrl_heldout_acc", m["flowrl"]["heldout_acc"]),
    }
    items = [
        rules.Item(
            "paced_minus_grpo",
            tuple(a - b for a, b in zip(p, res["grpo"]["heldout_acc"])),
            margin=enumerable.ACC_MARGIN,
        ),
        rules.Item(
            "paced_minus_flowrl",
            tuple(a - b for a, b in zip(p, m["flowrl"]["heldout_acc"])),
            margin=enumerable.ACC_MARGIN,
        ),
    ]
    ran = res["_log"].items()
    ran = {k: v and enumerable.ran_items(m)[k] for k, v in ran.items()}
    return enumerable.result(
        items,
        ran,
        f"{steps} steps, {n_seeds} seeds, held-out accuracy: PACED tau=0.5 {stats.fmt_ci(p)}, GRPO "
        f"{stats.fmt_ci(res['grpo']['heldout_acc'])}, FlowRL (its log Z head trained with the policy, beta={BETA:g}, raw "
        "reward) "
        f"{stats.fmt_ci(m['flowrl']['heldout_acc'])}; DS/LILO/MoPPS not run; shared run: decides both paced.table1 claims",
        nums,
        cap=Verdict.PARTLY,
    )


for _cid in ("paced.table1.math_qwen2.5_math_7b",):
    enumerable.tiny_check(_cid, INCONCLUSIVE, TABLE1_ITEMS)(paced_vs_baselines)


FIG5_ITEMS = {**enumerable._items(("difficulty_rise",)), **enumerable.RAN}


@enumerable.tiny_check("paced.fig5.difficulty_rises", INCONCLUSIVE, FIG5_ITEMS)
def difficulty_rises(seed: int, n_seeds: int = pool.N_SEEDS, steps: int = tiny.STEPS) -> CheckResult:
    """Difficulty (1 - pi_ref's pass rate) of the trained prompts, last fifth minus first fifth of
    the run, PACED at tau = 0.5 (the no-selection arm reported: constant by construction)."""
    res = paced_raw(seed, n_seeds, steps)
    rise = {
        a: [e - l for e, l in zip(res[a]["ref_pass_early"], res[a]["ref_pass_late"])]
        for a in ("tau0.5", "no_selection")
    }
    nums = {**stats.ci_numbers("context_difficulty_rise_none", rise["no_selection"]), **res["_log"].numbers()}
    return enumerable.result(
        [rules.Item("difficulty_rise", tuple(rise["tau0.5"]), margin=enumerable.ACC_MARGIN)],
        res["_log"].items(),
        f"{steps} steps, {n_seeds} seeds: rise of the trained prompts' difficulty (1 - pi_ref pass rate), last fifth "
        f"minus first fifth: PACED tau=0.5 {stats.fmt_ci(rise['tau0.5'])}, no selection (context) "
        f"{stats.fmt_ci(rise['no_selection'])}; the paced.tau_sweep run",
        nums,
    )
