"""Figure 8 — PACED-RL in the tabular toy (PACED-RL §4, Figs. 4 and 6, Table 2); experiments in
:mod:`tiltlab.sim.experiments.paced`.

Multi-prompt binary environment (64 prompts, 16 outputs, reference pass rates 0.01 .. 0.9); TB anchored
on pi_old (PACED eq. 6) with a learned per-prompt log Z, kl_coef = 1/beta = 0.5, pi_old refreshed every
step; 16 of 64 prompts trained per step, 8 samples each. The accuracy estimate is PACED's
``p_hat = clip(kl_coef log Z_phi)`` (eq. 8); the schedulers compared: PACED (log Z initialised at 0),
PACED with log Z initialised from DISA's Stage-1 label, DISA's frozen Z alone (static reference pass
rate), the exact p_old (oracle), random prompts, and all 64 prompts per step.

This is a toy proxy: tabular policies do not generalize across prompts, so "accuracy" is the exact mean
pass rate over the 64 training prompts, not a held-out test accuracy.
"""

from __future__ import annotations

import math
from pathlib import Path

from tiltlab.sim.api import SimConfig, make_env
from tiltlab.sim.experiments import paced
from tiltlab.sim.experiments.paced import SCHEDULERS, TAUS, base_config, steps_to
from tiltlab.sim.figures import FigureRecord
from tiltlab.sim.figures._common_a import plt, save
from tiltlab.sim.train import train

FIG_ID = "fig08_paced"


def make(out_dir: Path, quick: bool = False, seed: int = 0) -> FigureRecord:
    base = base_config(quick, seed)
    env = make_env(SimConfig(**base))
    target = paced.TARGET
    tau = paced.tau_claim(seed)  # the claim's sweep: same settings in quick and full mode
    numbers = {
        "paced.tau_sweep": tau["numbers"],
        "paced.selection": paced.selection(seed),
        "paced.replay": paced.replay(seed),
    }
    sched = {}
    for label, kw in SCHEDULERS.items():
        res = train(SimConfig(**{**base, **kw}), env)
        h = res.history
        sched[label] = {
            "config": kw,
            "step": h["step"],
            "acc": h["reward"],
            "p_hat_err": h.get("p_hat_err", []),
            "sel_p": h.get("sel_p", []),
            "final_acc": h["reward"][-1],
            "steps_to_target": steps_to(h["step"], h["reward"], target),
        }
    taus = tau["sweep"]

    fig, axes = plt.subplots(1, 4, figsize=(20, 4.6))
    ax = axes[0]
    for label, d in sched.items():
        ax.plot(d["step"], d["acc"], label=label, lw=2 if label.startswith("PACED") else 1.2)
    ax.axhline(target, color="k", ls=":", lw=0.8)
    ax.set_xlabel("training step")
    ax.set_ylabel("mean pass rate over 64 prompts (exact)")
    ax.set_title("Schedulers (τ = 0.5, 16 of 64 prompts/step)")
    ax.legend(fontsize=7)
    ax = axes[1]
    for tau, d in taus.items():
        ax.plot(d["step"], d["acc"], label=f"τ = {tau}")
    ax.axhline(target, color="k", ls=":", lw=0.8)
    ax.set_xlabel("training step")
    ax.set_ylabel("mean pass rate")
    ax.set_title(f"τ sweep (PACED, DISA-initialised log Z; {paced.TAU_CLAIM['seeds']} seeds)")
    ax.legend(fontsize=8)
    ax = axes[2]
    stt = [taus[str(t)]["steps_to_target"] for t in TAUS]
    cap = paced.TAU_CLAIM["steps"] * 1.05
    ax.bar(
        [str(t) for t in TAUS],
        [s if math.isfinite(s) else cap for s in stt],
        color=["tab:blue" if math.isfinite(s) else "tab:gray" for s in stt],
    )
    for i, s in enumerate(stt):
        ax.text(
            i,
            (s if math.isfinite(s) else cap) + 1,
            f"{s:.0f}" if math.isfinite(s) else "never",
            ha="center",
            fontsize=8,
        )
    ax.set_xlabel("target accuracy τ")
    ax.set_ylabel(f"steps to mean pass rate {target}")
    ax.set_title("Steps to target (gray: not reached)")
    ax = axes[3]
    for label, d in sched.items():
        if d["p_hat_err"] and "oracle" not in label and "random" not in label:
            ax.plot(d["step"], d["p_hat_err"], label=label)
    ax.set_xlabel("training step")
    ax.set_ylabel("mean |p̂ − p_old| over prompts")
    ax.set_title("Accuracy estimate error (PACED eq. 8)")
    ax.legend(fontsize=7)
    fig.suptitle(
        f"PACED-RL toy proxy: TB anchored on π_old, learned log Z, kl_coef 0.5{' (quick)' if quick else ''}",
        fontsize=11,
    )
    fig.tight_layout()

    nt, nsel, nrep = numbers["paced.tau_sweep"], numbers["paced.selection"], numbers["paced.replay"]
    caption = (
        "PACED-RL §4.3-4.4, Fig. 4 (τ sweep), Table 2 (replay ablation) in a tabular toy "
        "proxy: exact mean pass rate over 64 prompts against steps for several schedulers, the τ sweep with steps to "
        f"mean pass rate {target}, and the error of PACED's estimate p̂ = clip(kl_coef·log Z_φ) against the exact p_old."
    )
    findings = [
        f"Schedulers (64 prompts, 16 per step, {base['steps']} steps, {base['seeds']} seeds; illustration) final mean "
        "pass rate: " + "; ".join(f"{k} {v['final_acc']:.3f}" for k, v in sched.items()) + ".",
        f"τ sweep ({paced.TAU_CLAIM['steps']} steps, {paced.TAU_CLAIM['seeds']} seeds) final pass rate: "
        + ", ".join(f"τ={t} {nt[f'acc_tau{t}']:.3f}" for t in TAUS)
        + f"; best τ = {nt['best_tau']}, worst {nt['worst_tau']} (paper: 0.5 best, 0.9 fast start then plateau, 0.1 worst).",
        f"Replay (32 prompts, 8 per step, 60 steps, {nrep['pairs']} paired seeds): final pass rate {nrep['with_replay']:.3f} "
        f"with vs {nrep['without_replay']:.3f} without (z = {nrep['z']:.1f}).",
        f"Selection from DISA's frozen labels (M=8): overlap with the oracle top-16 of 64 is {nsel['overlap']:.2f} "
        f"(chance {nsel['chance']:.2f}).",
        f"p̂ error at the end: PACED from 0 {sched['PACED (log Z from 0)']['p_hat_err'][-1]:.3f}, DISA-initialised "
        f"{sched['PACED (log Z init. from DISA)']['p_hat_err'][-1]:.3f}.",
    ]
    png, js = save(
        fig,
        out_dir,
        FIG_ID,
        {"schedulers": sched, "tau_sweep": taus, "target": target, "base": base, "findings": findings},
        caption,
        numbers,
    )
    return FigureRecord(
        id=FIG_ID,
        title="PACED-RL scheduler, τ sweep and replay (toy)",
        caption=caption,
        png=png,
        data=js,
        claims=["paced.tau_sweep", "paced.selection", "paced.replay", "paced.estimator"],
        findings=findings,
        numbers=numbers,
    )
