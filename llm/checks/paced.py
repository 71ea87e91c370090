"""PACED-RL at small scale: the tau sweep on the held-out split, PACED vs GRPO / FlowRL, and the
difficulty of the selected prompts over training (:mod:`tiltlab.llm.checks.task`'s shared task).

PACED's math lives in ``tiltlab.objectives``: the TB residual anchored on the rollout policy
(``tb.tb_residual(logp, logp_old, r, log Z, beta)``, ``tb.tb_loss``), the accuracy estimate
``paced.accuracy_from_log_z`` (``p_hat = clip(log Z_phi / beta, 0, 1)``) and the selection
``paced.select_prompts`` (the ``m`` prompts with ``p_hat`` closest to ``tau``). ``log Z_phi`` is a
learned per-prompt table initialized, as the simulator's PACED runs, from a Stage-1 estimate
(``beta * pass_rate_from_log_z(label)``, ``M = 8`` samples of ``pi_ref``).

The pass rules are written in the claim statements (``paced.tau_sweep`` in ``core.toml``, the
others in ``paced_empirical.toml``) and in ``docs/llm-checks.md``, fixed before the runs.
"""

from __future__ import annotations

import torch

from tiltlab.objectives.estimators import pass_rate_from_log_z
from tiltlab.objectives.paced import accuracy_from_log_z, select_prompts
from tiltlab.objectives.pg import group_advantages, grpo_loss
from tiltlab.objectives.tb import sequence_logprob, tb_loss, tb_residual
from tiltlab.paper_checks.registry import CheckResult, Verdict

from . import stage3 as S
from . import task as T

V = Verdict
INCONCLUSIVE = Verdict.INCONCLUSIVE
TAUS = (0.1, 0.3, 0.5, 0.7, 0.9)
BETA = 4.0
"""PACED's tilt (1 / its KL coefficient): the TB target is ``pi_old e^{BETA r}``."""
LOGZ_LR = 0.05
EARLY = 25
"""Step after which the held-out accuracy is read for the "fast start" item."""


def paced_fn(table: torch.Tensor, beta: float):
    """PACED's TB (anchored on the rollout policy) with a learned per-prompt ``log Z_phi`` table."""

    def fn(b: T.Batch) -> torch.Tensor:
        lp, lo = sequence_logprob(b.logp, b.mask), sequence_logprob(b.logp_old, b.mask)
        lz = table[b.prompt_idx].repeat_interleave(b.ans.shape[1])
        return tb_loss(tb_residual(lp, lo, b.reward.reshape(-1).to(lp.dtype), lz, beta))

    return fn


def _grpo(b: T.Batch) -> torch.Tensor:
    loss, _ = grpo_loss(b.logp, b.logp_old, group_advantages(b.reward).reshape(-1), b.mask)
    return loss


ARMS = (*(f"tau{t:g}" for t in TAUS), "no_selection", "grpo")


def paced_raw(seed: int, n_seeds: int = T.N_SEEDS, steps: int = S.STEPS, taus=TAUS, beta: float = BETA):
    """Per seed and arm: final train / held-out accuracy, held-out accuracy at step ``EARLY``, mean
    reward of the trained batches, and the mean ``pi_ref`` pass rate of the prompts trained in the
    first and the last fifth of the run. Arms: PACED at each tau, the same objective on random
    prompts (``no_selection``), GRPO on random prompts. Memoized per process."""
    return S._memo(
        ("paced", seed, n_seeds, steps, tuple(taus), beta, T.WARM_STEPS),
        lambda: _paced_raw(seed, n_seeds, steps, taus, beta),
    )


def _paced_raw(seed: int, n_seeds: int, steps: int, taus, beta: float) -> dict[str, dict[str, list[float]]]:
    arms = (*(f"tau{t:g}" for t in taus), "no_selection", "grpo")
    keys = ("acc", "heldout_acc", "heldout_early", "batch_reward", "ref_pass_early", "ref_pass_late")
    res = {a: {k: [] for k in keys} for a in arms}
    fifth = max(1, steps // 5)
    for s in T.seeds_for(seed, n_seeds, "paced_tau_sweep"):
        gen = torch.Generator().manual_seed(s)
        _, task, ref_tok, ref, tr, ho, _ = S.setup(s)
        tr_t = torch.tensor(tr)
        ref_pass = T.pass_rate(T.Policy(torch.arange(task.n_prompts), ref.seq_logp, ref.log_probs), task)
        init = beta * pass_rate_from_log_z(S.stage1_labels(ref, task, tr, beta, 8, gen), beta)
        for arm, tau in zip(arms, (*taus, None, None)):
            model, _ = T.warm_reference(s)
            table = torch.nn.Parameter(torch.zeros(task.n_prompts))
            with torch.no_grad():
                table[tr_t] = init.float()
            trained: list[torch.Tensor] = []
            rewards: list[float] = []
            early: list[float] = []

            def select(step: int, tau=tau, table=table) -> torch.Tensor:
                p_hat = accuracy_from_log_z(table.detach()[tr_t], kl_coef=1.0 / beta)
                return tr_t[select_prompts(p_hat, tau, 8)]

            inner = _grpo if arm == "grpo" else paced_fn(table, beta)

            def fn(b: T.Batch, inner=inner, trained=trained, rewards=rewards) -> torch.Tensor:
                trained.append(b.prompt_idx.clone())
                rewards.append(float(b.reward.mean()))
                return inner(b)

            def on_step(step: int, model=model, early=early) -> None:
                if step + 1 == EARLY:
                    early.append(float(T.pass_rate(T.policy(model, task, ho), task).mean()))
                    model.train()

            T.train_online(
                model,
                task,
                ref_tok,
                fn,
                prompts=tr,
                steps=steps,
                lr=S.LR,
                seed=s,
                select=select if tau is not None else None,
                extra_params=(table,) if arm != "grpo" else (),
                extra_lr=LOGZ_LR,
                on_step=on_step,
            )
            r = res[arm]
            r["acc"].append(S.evaluate(model, task, tr)["acc"])
            r["heldout_acc"].append(S.evaluate(model, task, ho)["acc"])
            r["heldout_early"].append(early[0] if early else float("nan"))
            r["batch_reward"].append(sum(rewards) / len(rewards))
            r["ref_pass_early"].append(float(ref_pass[torch.cat(trained[:fifth])].mean()))
            r["ref_pass_late"].append(float(ref_pass[torch.cat(trained[-fifth:])].mean()))
    return res


def _paired(res, a: str, others: tuple[str, ...], key: str = "heldout_acc") -> list[float]:
    """Per seed: ``res[a][key]`` minus the mean of ``res[o][key]`` over ``others``."""
    n = len(res[a][key])
    return [res[a][key][i] - sum(res[o][key][i] for o in others) / len(others) for i in range(n)]


# Per-item outcomes of the last full run (seed 0, 5 seeds; docs/llm-checks.md).
TAU_SWEEP_ITEMS = {
    "best_0.5_minus_edges_above_0": False,
    "others_minus_0.1_above_0": False,
    "fast_start_0.9_above_0": False,
    "best_0.5_minus_edges_below_0": False,
    "others_minus_0.1_below_0": False,
    "fast_start_0.9_below_0": False,
}
FIG4_ITEMS = {
    "best_0.5_minus_edges_above_0": False,
    "others_minus_0.1_above_0": False,
    "fast_start_0.9_above_0": False,
    "train_acc_tracks_tau_above_0": True,
    "best_0.5_minus_edges_below_0": False,
    "others_minus_0.1_below_0": False,
    "fast_start_0.9_below_0": False,
    "train_acc_tracks_tau_below_0": False,
}
TABLE1_ITEMS = {
    "paced_minus_grpo_above_0": False,
    "paced_minus_flowrl_above_0": False,
    "paced_minus_grpo_below_0": False,
    "paced_minus_flowrl_below_0": False,
}


def _items_verdict(nums: dict[str, float], items: tuple[str, ...]) -> Verdict:
    """Every item's 95% CI above 0 -> verified; some above -> partly; none above and one below 0
    -> refuted; none excludes 0 -> inconclusive."""
    above = [nums[f"{k}_lo"] > 0 for k in items]
    below = [nums[f"{k}_hi"] < 0 for k in items]
    if all(above):
        return V.VERIFIED
    if any(above):
        return V.PARTLY
    return V.REFUTED if any(below) else INCONCLUSIVE


def _ci_items(nums: dict[str, float], keys: tuple[str, ...]) -> dict[str, bool]:
    """Per item: its 95% CI lies above 0 / below 0 (the inputs of :func:`_items_verdict`)."""
    out = {f"{k}_above_0": nums[f"{k}_lo"] > 0 for k in keys}
    out.update({f"{k}_below_0": nums[f"{k}_hi"] < 0 for k in keys})
    return out


def _sweep_numbers(res, steps: int, n_seeds: int):
    nums: dict[str, float] = {}
    for arm, r in res.items():
        for k, xs in r.items():
            nums.update(T.ci_numbers(f"{arm}_{k}", xs))
    mid_vs_edges = _paired(res, "tau0.5", ("tau0.1", "tau0.9"))
    worst = _paired(res, "tau0.1", ("tau0.3", "tau0.5", "tau0.7", "tau0.9"))
    fast = _paired(res, "tau0.9", ("tau0.1", "tau0.3", "tau0.5", "tau0.7"), key="heldout_early")
    tracks = [a - b for a, b in zip(res["tau0.9"]["batch_reward"], res["tau0.1"]["batch_reward"])]
    nums.update(T.ci_numbers("best_0.5_minus_edges", mid_vs_edges))
    nums.update(T.ci_numbers("others_minus_0.1", [-x for x in worst]))
    nums.update(T.ci_numbers("fast_start_0.9", fast))
    nums.update(T.ci_numbers("train_acc_tracks_tau", tracks))
    txt = (
        f"PACED (TB anchored on pi_old, beta={BETA:g}, learned log Z table, 8 of the train prompts per step), "
        f"{steps} steps, {n_seeds} seeds; held-out accuracy: "
        + ", ".join(f"{a} {T.fmt_ci(res[a]['heldout_acc'])}" for a in res)
        + f"; at step {EARLY}: "
        + ", ".join(f"{a} {T.fmt_ci(res[a]['heldout_early'])}" for a in res if a.startswith("tau"))
        + f"; items: tau=0.5 - mean(0.1, 0.9) {T.fmt_ci(mid_vs_edges)}, mean(others) - tau=0.1 "
        f"{T.fmt_ci([-x for x in worst])}, fast start tau=0.9 - others (step {EARLY}) {T.fmt_ci(fast)}, "
        f"batch reward tau=0.9 - tau=0.1 {T.fmt_ci(tracks)}"
    )
    return nums, txt


SWEEP_KEYS = ("best_0.5_minus_edges", "others_minus_0.1", "fast_start_0.9")


def _sweep_result(seed: int, n_seeds: int, steps: int, keys: tuple[str, ...], rule: str) -> CheckResult:
    nums, txt = _sweep_numbers(paced_raw(seed, n_seeds, steps), steps, n_seeds)
    return CheckResult(_items_verdict(nums, keys), f"{txt}; rule: {rule}", nums, items=_ci_items(nums, keys))


@S.tiny_check("paced.tau_sweep", INCONCLUSIVE, TAU_SWEEP_ITEMS)
def tau_sweep(seed: int, n_seeds: int = T.N_SEEDS, steps: int = S.STEPS) -> CheckResult:
    """PACED selection at tau in {0.1, 0.3, 0.5, 0.7, 0.9} plus a no-selection arm, held-out accuracy.

    Rule (fixed before the run, also in the claim statement), per-seed paired differences with
    95% t-CIs, three items: (a) tau = 0.5 minus the mean of tau = 0.1 and 0.9 ("0.5 best");
    (b) the mean of the other taus minus tau = 0.1 ("0.1 worst"); (c) tau = 0.9 minus the mean
    of the others at step 25 ("fast start"). Verified if every CI lies above 0; partly if some do;
    refuted if none does and one lies below 0; inconclusive if none excludes 0."""
    return _sweep_result(seed, n_seeds, steps, SWEEP_KEYS, "items (a) (b) (c) all CI > 0 verified, some partly")


@S.tiny_check("paced.fig4.tau_llm", V.PARTLY, FIG4_ITEMS)
def tau_sweep_fig4(seed: int, n_seeds: int = T.N_SEEDS, steps: int = S.STEPS) -> CheckResult:
    """Fig. 4's items: those of :func:`tau_sweep` plus (d) "train accuracy tracks tau": the mean
    reward of the trained batches at tau = 0.9 minus at tau = 0.1. Same rule over four items."""
    return _sweep_result(
        seed, n_seeds, steps, (*SWEEP_KEYS, "train_acc_tracks_tau"), "items (a)-(d) all CI > 0 verified"
    )


@S.tiny_check("paced.table1.math_qwen2.5_math_1.5b", INCONCLUSIVE, TABLE1_ITEMS)
def paced_vs_baselines(seed: int, n_seeds: int = T.N_SEEDS, steps: int = S.STEPS) -> CheckResult:
    """PACED (tau = 0.5) vs GRPO and vs FlowRL (as coded, the memoized 4-method run: same seeds,
    steps, learning rate and prompts), held-out accuracy. DS, LILO and MoPPS are not run.

    Rule (fixed before the run, also in the claim statements): per-seed differences PACED - GRPO
    and PACED - FlowRL; refuted if either 95% CI lies below 0; partly if both lie above 0 (the
    comparison with DS / LILO / MoPPS stays untested, so never verified); else inconclusive."""
    res = paced_raw(seed, n_seeds, steps)
    m = S.methods_raw(seed, n_seeds, steps)
    p = res["tau0.5"]["heldout_acc"]
    d_grpo = [a - b for a, b in zip(p, res["grpo"]["heldout_acc"])]
    d_flow = [a - b for a, b in zip(p, m["flowrl"]["heldout_acc"])]
    nums = {
        **T.ci_numbers("paced_heldout_acc", p),
        **T.ci_numbers("grpo_heldout_acc", res["grpo"]["heldout_acc"]),
        **T.ci_numbers("flowrl_heldout_acc", m["flowrl"]["heldout_acc"]),
        **T.ci_numbers("paced_minus_grpo", d_grpo),
        **T.ci_numbers("paced_minus_flowrl", d_flow),
    }
    below = nums["paced_minus_grpo_hi"] < 0 or nums["paced_minus_flowrl_hi"] < 0
    above = nums["paced_minus_grpo_lo"] > 0 and nums["paced_minus_flowrl_lo"] > 0
    verdict = V.REFUTED if below else (V.PARTLY if above else INCONCLUSIVE)
    return CheckResult(
        verdict,
        f"{steps} steps, {n_seeds} seeds, held-out accuracy: PACED tau=0.5 {T.fmt_ci(p)}, GRPO "
        f"{T.fmt_ci(res['grpo']['heldout_acc'])}, FlowRL as coded {T.fmt_ci(m['flowrl']['heldout_acc'])}; PACED - GRPO "
        f"{T.fmt_ci(d_grpo)}, PACED - FlowRL {T.fmt_ci(d_flow)}; DS/LILO/MoPPS not run; rule: refuted if a CI < 0, "
        "partly if both > 0, else inconclusive",
        nums,
        items=_ci_items(nums, ("paced_minus_grpo", "paced_minus_flowrl")),
    )


for _cid in ("paced.table1.math_qwen2.5_math_7b",):
    S.tiny_check(_cid, INCONCLUSIVE, TABLE1_ITEMS)(paced_vs_baselines)


@S.tiny_check("paced.fig5.difficulty_rises", INCONCLUSIVE)
def difficulty_rises(seed: int, n_seeds: int = T.N_SEEDS, steps: int = S.STEPS) -> CheckResult:
    """Difficulty (1 - pi_ref's pass rate) of the trained prompts, last fifth minus first fifth of
    the run, PACED at tau = 0.5 (the no-selection arm reported: constant by construction).

    Rule (fixed before the run, also in the claim statement): verified if the 95% CI of the rise
    lies above 0, refuted if below 0, else inconclusive."""
    res = paced_raw(seed, n_seeds, steps)
    rise = {
        a: [e - l for e, l in zip(res[a]["ref_pass_early"], res[a]["ref_pass_late"])]
        for a in ("tau0.5", "no_selection")
    }
    nums = {
        **T.ci_numbers("difficulty_rise_tau0.5", rise["tau0.5"]),
        **T.ci_numbers("difficulty_rise_none", rise["no_selection"]),
    }
    lo, hi = nums["difficulty_rise_tau0.5_lo"], nums["difficulty_rise_tau0.5_hi"]
    verdict = V.VERIFIED if lo > 0 else (V.REFUTED if hi < 0 else INCONCLUSIVE)
    return CheckResult(
        verdict,
        f"{steps} steps, {n_seeds} seeds: rise of the trained prompts' difficulty (1 - pi_ref pass rate), last fifth "
        f"minus first fifth: PACED tau=0.5 {T.fmt_ci(rise['tau0.5'])}, no selection {T.fmt_ci(rise['no_selection'])}; "
        "rule: verified if the PACED CI > 0, refuted if < 0, else inconclusive",
        nums,
    )
