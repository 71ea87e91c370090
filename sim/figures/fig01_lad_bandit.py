"""Figure 1 — LAD's 50-arm three-mode bandit (LAD Fig. 1, §4.1); experiment in :mod:`tiltlab.sim.experiments.lad`.

Paper settings: 50 arms, uniform initial policy (= pi_old = pi_ref), advantage A a three-mode
mixture (here: ``A = eta log m`` so that ``P_A = e^{A/eta}/Z_A`` is the mixture m exactly),
4000 steps, 32 samples per step from pi_old at temperature 1.5, Adam lr 5e-3, eta = 1, pi_old
refreshed twice (every 1334 steps); GRPO with a KL penalty to pi_old of weight 1.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tiltlab.sim.experiments import lad
from tiltlab.sim.figures import FigureRecord
from tiltlab.sim.figures._figure_io import mathtext, plt, save

FIG_ID = "fig01_lad_bandit"

#: Bottom of the shared log y-axis (uniform is 0.02; the trained policies' smallest arms are near 1e-3).
Y_FLOOR = 1e-4


def seed_maxima(m: dict) -> str:
    """``max π per seed 0.96 (arm 12), 0.95 (arm 37)``: a mean of the seeds' maxima hides that they may sit on
    different arms."""
    parts = [f"{v:.2f} (arm {a})" for v, a in zip(m["max_pi_seeds"], m["argmax_seeds"])]  # on its own title line
    if len(parts) > 3:
        arms = len(set(m["argmax_seeds"]))
        lo, hi = min(m["max_pi_seeds"]), max(m["max_pi_seeds"])
        return f"max $\\pi$ per seed {lo:.2f}-{hi:.2f} on {arms} arm(s)"
    return "max $\\pi$ per seed " + ", ".join(parts)


def make(out_dir: Path, quick: bool = False, seed: int = 0) -> FigureRecord:
    data = lad.run_all(quick, seed)
    # full mode runs the paper's settings, the (slow) claim's; quick mode is a reduced illustration
    numbers = {} if quick else {"lad.fig1.bandit": lad.fig1_bandit(seed)}
    p_a = np.asarray(data["P_A"])
    methods = data["methods"]
    n = len(methods)
    seeds = data["base"]["seeds"]
    # one shared log y-scale: a collapsed panel (max pi ~ 1) and a spread one (~0.05) read on the same axis
    fig, axes = plt.subplots(2, (n + 1) // 2, figsize=(16, 8.6), sharey=True)
    x = np.arange(len(p_a))
    y_lo = Y_FLOOR
    for ax, (label, m) in zip(axes.ravel(), methods.items()):
        title = mathtext(label)
        pol, p_pi = np.asarray(m["policy"]), np.asarray(m["P_pi"])
        per_seed = np.asarray(m["policy_seeds"])
        ax.bar(
            x,
            pol - y_lo,
            bottom=y_lo,
            color="tab:blue",
            alpha=0.45,
            label=rf"final policy $\pi_\theta$ (mean of {seeds} seeds)",
        )
        for i, ps in enumerate(per_seed):
            ax.step(
                x,
                ps,
                where="mid",
                color="0.2",
                lw=0.9,
                alpha=0.7,
                ls=":",
                label=r"$\pi_\theta$ of each seed" if i == 0 else None,
            )
        ax.plot(
            m["argmax_seeds"],
            m["max_pi_seeds"],
            "v",
            color="crimson",
            ms=7,
            mec="k",
            mew=0.6,
            ls="none",
            label=r"each seed's largest arm ($\max \pi$)",
        )
        ax.step(x, p_pi, where="mid", color="navy", lw=1.3, label=r"$P_\pi \propto \pi_\theta/\pi_{\mathrm{old}}$")
        ax.plot(x, p_a, color="tab:orange", lw=2.0, label=r"target $P_A = e^{A/\eta}/Z_A$")
        sd = m.get("tv_Ppi_PA_std")
        tv = f"{m['tv_Ppi_PA']:.3f}" + (f" ± {sd:.3f}" if sd is not None else "")
        ax.set_title(f"{title}\n$\\mathrm{{TV}}(P_\\pi, P_A)$ = {tv}\n{seed_maxima(m)}", fontsize=9.5)
        ax.set_xlabel("arm")
        ax.tick_params(labelsize=9)
    axes[0, 0].set_yscale("log")
    axes[0, 0].set_ylim(y_lo, 1.5)
    for ax in axes[:, 0]:
        ax.set_ylabel("probability")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=5, fontsize=10, frameon=False)
    for ax in axes.ravel()[n:]:
        ax.axis("off")
    steps = data["base"]["steps"]
    fig.suptitle(
        f"LAD Fig. 1 bandit: 50 arms, {steps} steps, 32 samples/step drawn from $\\pi_{{\\mathrm{{old}}}}$ at sampling "
        f"temperature T = 1.5, Adam lr 5e-3, $\\eta$ = 1, $\\pi_{{\\mathrm{{old}}}}$ refreshed twice; mean of {seeds} seeds "
        f"(± = sd of TV over seeds){' (quick)' if quick else ''}",
        fontsize=11,
    )
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    g_clip = methods[lad.FIG1_GRPO]
    g_on = methods["GRPO on-policy (π_old every step)"]
    lad_js = methods[lad.FIG1_LAD]
    fl_code = methods[lad.FIG1_FLOWRL]
    fl_m = methods["FlowRL matched (A/η, ref=π_old)"]
    caption = (
        "Reproduces LAD Fig. 1 / §4.1 (claim lad.fig1.bandit): final policy (bars), the ratio-induced P_π "
        f"(navy) and the advantage distribution P_A (orange), mean over {seeds} seeds; dotted lines are each seed's "
        "final policy and red triangles each seed's largest arm, so seeds that collapse onto different arms show as "
        "two peaks, not one mean of about half. Titles give TV(P_π, P_A) ± its sd over seeds and each seed's largest "
        "arm probability; every panel shares one log y-scale. Settings: 50 arms, "
        f"{steps} steps, 32 samples per step from π_old at sampling temperature T = 1.5 (the paper's rollout "
        "temperature), Adam lr 5e-3, η = 1, π_old refreshed twice; our mixture parameters; GRPO uses the raw "
        "advantage so that its KL(π_old)-regularized optimum equals LAD's."
        + (" Quick mode: a reduced illustration; the claim is judged at the paper's 4000 steps." if quick else "")
    )

    def per_seed(m: dict) -> str:  # the finding's words for what the triangles show
        return "per seed " + ", ".join(f"{v:.2f} on arm {a}" for v, a in zip(m["max_pi_seeds"], m["argmax_seeds"]))

    def collapsed(m: dict) -> bool:  # most mass on <= 2 arms (P_A's largest two arms hold < 0.13)
        return m["max_pi"] > 0.4

    findings = [
        f"LAD (JS) TV(P_π,P_A)={lad_js['tv_Ppi_PA']:.3f} at the end ({lad_js['tv_phase1']:.3f} just before the first "
        f"π_old refresh); LAD (KL) {methods['LAD (KL)']['tv_Ppi_PA']:.3f} ({methods['LAD (KL)']['tv_phase1']:.3f}); "
        f"{'no collapse (max π ' + format(lad_js['max_pi'], '.3f') + ')' if not collapsed(lad_js) else 'LAD collapsed'}; "
        f"after a π_old refresh the target P_A is re-imposed on a sharper π_old: LAD's TV jumps to "
        f"{max(lad_js['history_tv_ratio'][1:] or [float('nan')]):.3f} and re-converges more slowly.",
        f"GRPO+KL(π_old), clip 0.2: max π={g_clip['max_pi']:.3f} (uniform 0.02), TV={g_clip['tv_Ppi_PA']:.3f} — "
        f"{'collapsed' if collapsed(g_clip) else 'no collapse with only 2 π_old refreshes (the clip bounds π/π_old per phase); it under-fits'}.",
        f"GRPO on-policy (π_old refreshed every step): max π={g_on['max_pi']:.3f} ({per_seed(g_on)}), entropy {g_on['entropy_pi']:.2f} nats "
        f"vs {data['entropy_PA']:.2f} for P_A — {'collapsed to one mode' if collapsed(g_on) else 'not collapsed'}.",
        f"FlowRL as coded (β=15 on group-normalized A, ref=π_0) TV={fl_code['tv_Ppi_PA']:.3f} "
        f"({'collapsed' if collapsed(fl_code) else 'not collapsed'}); FlowRL with the matched target (A/η, ref=π_old) "
        f"TV={fl_m['tv_Ppi_PA']:.3f}; DISA TV={methods['DISA (TB, frozen IS log Z, M=8)']['tv_Ppi_PA']:.3f}.",
    ]
    if numbers:
        n = numbers["lad.fig1.bandit"]
        findings.insert(
            0,
            f"claim (paper settings, {data['base']['seeds']} seeds): LAD-JS mode-mass ratios "
            + ", ".join(f"{n[f'lad_mode{i}_ratio']:.2f}" for i in range(len(lad.MODE_WINDOWS)))
            + f"; TV(P_π,P_A) GRPO+KL {n['grpo_tv']:.3f}, LAD-JS {n['lad_js_tv']:.3f}, FlowRL as coded {n['flowrl_tv']:.3f}",
        )
    else:
        findings.insert(0, "quick illustration (450 steps); lad.fig1.bandit is judged at the paper's 4000 steps")
    png, js = save(fig, out_dir, FIG_ID, {"findings": findings, **data}, caption, numbers)
    return FigureRecord(
        id=FIG_ID,
        title="LAD 50-arm three-mode bandit",
        caption=caption,
        png=png,
        data=js,
        claims=["lad.fig1.bandit"],
        findings=findings,
        numbers=numbers,
    )
