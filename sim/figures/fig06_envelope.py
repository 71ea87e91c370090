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
    from tiltlab.sim.figures._common_a import plt, save

    # the claim's instances (same in quick and full mode): the check of disa.prop4.envelope reads these numbers
    env = bias.envelope(seed)
    numbers = {"disa.prop4.envelope": env["numbers"]}
    n = len(env["unit"][0])
    gap, bound, ed2, jz = (t.numpy() for t in env["unit"])
    gap_t, bound_t, ed2_t, _ = (t.numpy() for t in env["target"])
    gap_n, bound_n, _ed2_n, _jz_n = (t.numpy() for t in env["nonunit"])
    gap_m, bound_m, ed2_m, jz_m = (t.numpy() for t in env["toward"])
    ratio, ratio_n, ratio_m = gap / bound, gap_n / bound_n, gap_m / bound_m

    fig, ax = plt.subplots(1, 3, figsize=(17, 5.4))
    sc = ax[0].scatter(ed2, gap, c=np.log10(jz), s=5, cmap="viridis", alpha=0.7, label="random π (unit-mean w)")
    ax[0].scatter(ed2_t, gap_t, s=14, color="red", marker="x", label="π = π* (J_Z = 0): gap = E[Δ²]")
    xs = np.logspace(np.log10(ed2.min()), np.log10(ed2.max()), 100)
    for j, ls in ((0.0, "-"), (0.1, "--"), (1.0, "-."), (10.0, ":")):
        ax[0].plot(xs, xs + 2 * np.sqrt(xs * j), color="k", ls=ls, lw=1, label=f"bound at J_Z = {j:g}")
    ax[0].set_xscale("log")
    ax[0].set_yscale("log")
    ax[0].set_xlabel("E_x[Δ²]  (Δ = log Z_ψ − log Z)")
    ax[0].set_ylabel("|J_Zψ − J_Z|")
    ax[0].set_title("(a) loss perturbation vs partition-function MSE")
    fig.colorbar(sc, ax=ax[0], label="log10 J_Z")
    ax[0].legend(fontsize=8, loc="upper left")
    bins = np.linspace(0, max(1.05, float(np.quantile(ratio_n, 0.995))), 60)
    ax[1].hist(ratio, bins=bins, alpha=0.7, color="#08519c", label=f"unit-mean weights (max {ratio.max():.3f})")
    ax[1].hist(ratio_n, bins=bins, alpha=0.5, color="#d94801", label=f"weights not unit-mean (max {ratio_n.max():.2f})")
    ax[1].axvline(1.0, color="k", ls="--", label="bound")
    ax[1].set_yscale("log")
    ax[1].set_xlabel("|J_Zψ − J_Z| / (E[Δ²] + 2√(E[Δ²] J_Z))")
    ax[1].set_ylabel("instances")
    ax[1].set_title("(b) ratio to the envelope")
    ax[1].legend(fontsize=8)
    ax[2].scatter(jz / ed2, ratio, s=5, alpha=0.5, color="#08519c", label="random π")
    ax[2].scatter(jz_m / ed2_m, ratio_m, s=5, alpha=0.5, color="#d94801", label="π = mix of random π and π*")
    ax[2].legend(fontsize=8)
    ax[2].set_xscale("log")
    ax[2].axhline(1.0, color="k", ls="--")
    ax[2].set_xlim(left=1e-6)
    ax[2].set_xlabel("J_Z / E[Δ²]")
    ax[2].set_ylabel("ratio to bound")
    ax[2].set_title("(c) the bound is tight as J_Z → 0 (π → π*)")
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
        "for unit-mean rollout weights, tight at pi = pi*; non-unit-mean weights shown for contrast."
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
