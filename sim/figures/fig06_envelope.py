"""Figure 6 — DISA Prop. 4's Cauchy-Schwarz envelope (DISA App. C.4).

Random instances (prompts x outcomes, random pi_ref, graded rewards, beta, behaviour policy, unit-mean
rollout weights, policy and prompt-only log-Z error Delta(x)); residuals from ``objectives.tb.tb_residual``
(:func:`tiltlab.sim.experiments.bias.envelope`, the instances the check judges). Plots ``|J_Zpsi - J_Z|`` against ``E_x[Delta^2]``
with the bound ``E[Delta^2] + 2 sqrt(E[Delta^2] J_Z)``, the tight case pi = pi*, and the ratio to the bound.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tiltlab.sim.experiments import bias
from tiltlab.sim.figures import FigureRecord

FIG_ID = "fig06_envelope"


def make(out_dir: Path, quick: bool = False, seed: int = 0) -> FigureRecord:
    from tiltlab.sim.figures._figure_io import plt, save

    # the claim's instances (same in quick and full mode): the check of disa.prop4.envelope reads these numbers
    env = bias.envelope(seed)
    numbers = {"disa.prop4.envelope": env["numbers"]}
    n = len(env["unit"][0])
    gap, bound, ed2, jz = (t.numpy() for t in env["unit"])
    gap_t, bound_t, ed2_t, _ = (t.numpy() for t in env["target"])
    gap_n, bound_n, _ed2_n, _jz_n = (t.numpy() for t in env["nonunit"])
    gap_m, bound_m, ed2_m, jz_m = (t.numpy() for t in env["toward"])
    ratio, ratio_n, ratio_m = gap / bound, gap_n / bound_n, gap_m / bound_m

    fig, ax = plt.subplots(1, 3, figsize=(17, 5.6))
    # 1500 of the instances as points (evenly spaced, same for every series): all 4000 hide one another;
    # the histograms, the binned medians and the findings use all of them
    pick = np.arange(0, n, max(1, n // 1500))
    sc = ax[0].scatter(
        ed2[pick],
        gap[pick],
        c=np.log10(jz[pick]),
        s=6,
        cmap="viridis",
        alpha=0.6,
        label=r"random $\pi$ (unit-mean $w$), 1500 of " + str(n),
    )
    ax[0].scatter(ed2_t, gap_t, s=22, color="red", marker="x", label=r"$\pi = \pi^*$ ($J_Z = 0$): gap $= E[\Delta^2]$")
    xs = np.logspace(np.log10(ed2.min()), np.log10(ed2.max()), 100)
    for j, ls in ((0.0, "-"), (0.1, "--"), (1.0, "-."), (10.0, ":")):
        ax[0].plot(xs, xs + 2 * np.sqrt(xs * j), color="k", ls=ls, lw=1, label=f"bound at $J_Z$ = {j:g}")
    ax[0].set_xscale("log")
    ax[0].set_yscale("log")
    ax[0].set_xlabel(r"$E_x[\Delta^2]$   ($\Delta = \log Z_\psi - \log Z$)")
    ax[0].set_ylabel(r"$|J_{Z_\psi} - J_Z|$")
    ax[0].set_title("(a) loss perturbation vs partition-function MSE")
    fig.colorbar(sc, ax=ax[0], label=r"$\log_{10} J_Z$")
    # the legend gets a band of its own below every point: two decades under the lowest gap, lower right
    ax[0].set_ylim(bottom=float(min(gap.min(), gap_t.min())) / 100)
    ax[0].legend(fontsize=8, loc="lower right")
    bins = np.linspace(0, max(1.05, float(np.quantile(ratio_n, 0.995))), 60)
    ax[1].hist(ratio, bins=bins, histtype="stepfilled", alpha=0.25, color="#08519c")
    ax[1].hist(
        ratio, bins=bins, histtype="step", lw=2, color="#08519c", label=f"unit-mean weights (max {ratio.max():.3f})"
    )
    ax[1].hist(
        ratio_n,
        bins=bins,
        histtype="step",
        lw=2,
        ls="--",
        color="#d94801",
        label=f"weights not unit-mean (max {ratio_n.max():.2f})",
    )
    ax[1].axvline(1.0, color="k", ls=":", lw=1.5, label="bound (ratio 1)")
    ax[1].set_yscale("log")
    ax[1].set_xlabel(r"$|J_{Z_\psi} - J_Z| \;/\; (E[\Delta^2] + 2\sqrt{E[\Delta^2]\, J_Z})$")
    ax[1].set_ylabel(f"instances (of {n})")
    ax[1].set_title("(b) ratio to the envelope")
    ax[1].legend(fontsize=9)
    for x, r, col, mk, lab in (
        (jz / ed2, ratio, "#08519c", "o", r"random $\pi$"),
        (jz_m / ed2_m, ratio_m, "#d94801", "^", r"$\pi$ = mix of random $\pi$ and $\pi^*$"),
    ):
        ax[2].scatter(x[pick], r[pick], s=6, alpha=0.25, color=col, marker=mk, lw=0)
        # binned median over all instances, so neither series hides the other
        edges = np.logspace(-6, np.log10(x.max()) + 1e-9, 25)
        idx = np.digitize(x, edges)
        mid = [
            (np.sqrt(edges[i - 1] * edges[i]), np.median(r[idx == i]))
            for i in range(1, len(edges))
            if (idx == i).sum() >= 10
        ]
        if mid:
            mx, my = zip(*mid)
            ax[2].plot(mx, my, "-", marker=mk, ms=5, lw=2.2, color=col, label=f"{lab}: median per bin (points: 1500)")
    ax[2].legend(fontsize=9, loc="upper right")
    ax[2].set_xscale("log")
    ax[2].axhline(1.0, color="k", ls=":", lw=1.5)
    ax[2].set_xlim(left=1e-6)
    ax[2].set_ylim(-0.02, 1.3)  # headroom for the legend above the bound
    ax[2].set_xlabel(r"$J_Z \,/\, E[\Delta^2]$")
    ax[2].set_ylabel("ratio to bound")
    ax[2].set_title(r"(c) the bound is tight as $J_Z \to 0$ ($\pi \to \pi^*$)")
    for a in ax:
        a.grid(alpha=0.3)
    fig.suptitle(f"DISA Prop. 4 envelope on {n} random instances (5 prompts × 6 outcomes each)", fontsize=12)
    fig.tight_layout()
    findings = [
        f"unit-mean weights: max |J_Zpsi - J_Z| / bound = {ratio.max():.4f} over {n} random instances and "
        f"{ratio_m.max():.4f} over {n} with pi drawn toward pi* "
        f"(bound {'holds' if max(ratio.max(), ratio_m.max()) <= 1 + 1e-9 else 'VIOLATED'})",
        f"at pi = pi*: ratio {float((gap_t / bound_t).min()):.6f}-{float((gap_t / bound_t).max()):.6f} (tight)",
        f"weights not unit-mean: max ratio {ratio_n.max():.2f}, {100 * float((ratio_n > 1).mean()):.1f}% of instances exceed "
        "the unit-mean bound (the paper: only constants change)",
        f"median ratio for J_Z/E[D^2] > 10: {float(np.median(ratio[jz / ed2 > 10])):.3f} (the bound is loose away from pi*)",
    ]
    caption = (
        "DISA App. C.4, Prop. 4: |J_Zpsi - J_Z| <= E[D^2] + 2 sqrt(E[D^2]) sqrt(J_Z) "
        "for unit-mean rollout weights, tight at pi = pi*; non-unit-mean weights shown for contrast. Supports "
        f"disa.prop4.envelope (same instances as its check, quick and full mode alike): {n} random instances of 5 "
        f"prompts x 6 outcomes per series, seed {seed}. (a) and (c) draw 1500 evenly spaced instances as points; "
        "(b) and the medians in (c) use all."
    )
    sub = slice(None, None, max(1, n // 1500))
    data = {
        "ed2": ed2[sub],
        "gap": gap[sub],
        "jz": jz[sub],
        "ratio_max": float(max(ratio.max(), ratio_m.max())),
        "ratio_nonunit_max": float(ratio_n.max()),
        "tight_ratio": (gap_t / bound_t),
    }
    png, js = save(fig, out_dir, FIG_ID, data, caption, numbers)
    return FigureRecord(
        FIG_ID,
        "Cauchy-Schwarz envelope",
        caption,
        png,
        js,
        claims=["disa.prop4.envelope"],
        findings=findings,
        numbers=numbers,
    )
