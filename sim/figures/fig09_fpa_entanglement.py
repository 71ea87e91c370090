"""Figure 9 — FPA gradient entanglement on the token tree (FPA §3.2-3.3, Figs. 2, 4, 5, Tables 2/5/6);
the experiment is :mod:`tiltlab.sim.experiments.fpa_entanglement`.

Setup: a token tree with ``V = 8`` tokens, ``L = 5`` positions, per-position logits (every parameter
is shared by every sequence that uses the token) and the verifier ``r = 1[sum_t y_t mod V == answer]``
(the answer depends on every token, so no single parameter separates correct from incorrect
sequences). A fixed offline dataset of ``N`` sequences is drawn from pi_ref; the policy starts at
pi_ref and is trained full-batch on ``objectives.offline.offrl_loss`` (Off-RL, eq. 1) or
``objectives.offline.fpa_loss`` with ``future_policy_logprobs`` (FPA, eqs. 3-5), with FPA applied
to all / only correct / only incorrect sequences (Table 2's "w/ Cor. Only", "w/ Incor. Only").
Tracked: mean ``log pi_theta(y) - log pi_ref(y)`` over correct and incorrect data sequences, the
exact accuracy ``E_{pi_theta}[r]`` (all V^L sequences), and the gradient weights
``pi^{1/|y|}`` / ``pi_hat^{1/|y|}``. Vectorized over seeds (independent datasets).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np

from tiltlab.claims import stats
from tiltlab.sim.experiments import fpa_entanglement as fe
from tiltlab.sim.experiments.fpa_entanglement import LAMBDAS, run_all, summarize, train
from tiltlab.sim.figures import FigureRecord

FIG_ID = "fig09_fpa_entanglement"


def seed_band(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The mean over seeds (axis 1) of a ``[time, seed]`` series -+ one standard error (sd / sqrt(seeds), the sd of
    :func:`tiltlab.claims.stats.mean_sd`): the bands of (a-c), around the curves they go with. (An interquartile
    band misleads in (c): a few seeds with an easy pi_ref put the mean accuracy above the middle half.)"""
    ms = [stats.mean_sd(row) for row in np.asarray(v, dtype=float)]
    m = np.array([a for a, _ in ms])
    se = np.array([b for _, b in ms]) / math.sqrt(np.asarray(v).shape[1])
    return m - se, m + se


def make(out_dir: Path, quick: bool = False, seed: int = 0) -> FigureRecord:
    from tiltlab.sim.figures._figure_io import plt, save

    # the SGD runs are the claim's experiment (same settings in quick and full mode); the Adam runs and the
    # separable contrast are illustrations at the same size
    claim = fe.entanglement_claim(seed)
    numbers = {"fpa.entanglement": claim["numbers"]}
    cfg = fe.CLAIM_CONFIG
    cfg_adam = replace(cfg, optimizer="adam", lr=0.05)
    runs = run_all(cfg, seed)
    runs_adam = {
        k: train(cfg_adam, "offrl" if k == "offrl" else "fpa", lam, seed=seed)
        for k, lam in [("offrl", 0.0)] + [(f"fpa{l:g}", l) for l in LAMBDAS]
    }
    summ, summ_adam = summarize(runs), {k: float(v["acc"][-1].mean()) for k, v in runs_adam.items()}
    # contrast: a tree where one transition decides correctness (bigram logits, answer = last token)
    cfg_sep = replace(cfg, context="bigram", reward_kind="last_token")
    sep = {"offrl": train(cfg_sep, "offrl", seed=seed), "fpa2": train(cfg_sep, "fpa", 2.0, seed=seed)}
    sep_fin = {k: {m: float(v[m][-1].mean()) for m in ("corr", "inc", "acc")} for k, v in sep.items()}

    colors = {
        "offrl": "k",
        "fpa0.5": "#9ecae1",
        "fpa1": "#4292c6",
        "fpa2": "#08519c",
        "fpa5": "#fd8d3c",
        "fpa10": "#d94801",
        "cor_only": "#e7298a",
        "inc_only": "#66a61e",
    }
    label = lambda k: {
        "offrl": r"Off-RL ($\lambda$ = 0)",
        "cor_only": r"FPA $\lambda$ = 2, correct only",
        "inc_only": r"FPA $\lambda$ = 2, incorrect only",
    }.get(k, rf"FPA $\lambda$ = {k[3:]}")
    fig, ax = plt.subplots(2, 3, figsize=(16, 9.2))
    main = ["offrl"] + [f"fpa{l:g}" for l in LAMBDAS]
    for k in main:
        r = runs[k]
        for a, key in ((ax[0, 0], "corr"), (ax[0, 1], "inc"), (ax[0, 2], "acc")):
            v = np.asarray(r[key])
            a.plot(r["step"], v.mean(1), color=colors[k], label=label(k), lw=1.8)
            # band: +-1 standard error over seeds, for Off-RL and lambda = 2 only (six overlapping bands hide the
            # lines); a min-max band over 20 seeds that differ in their pi_ref accuracy swamps the means
            if k in ("offrl", "fpa2"):
                lo, hi = seed_band(v)
                a.fill_between(r["step"], lo, hi, color=colors[k], alpha=0.2, lw=0)
    ax[0, 2].axhline(summ["ref_acc"], color="gray", ls=":", label=r"$\pi_{\mathrm{ref}}$ accuracy")
    ax[0, 0].set_title(r"(a) correct data sequences: $\log \pi - \log \pi_{\mathrm{ref}}$")
    ax[0, 1].set_title(r"(b) incorrect data sequences: $\log \pi - \log \pi_{\mathrm{ref}}$")
    ax[0, 2].set_title(r"(c) exact accuracy $E_\pi[r]$ (all $V^L$ sequences)")
    for k in ("offrl", "fpa2", "cor_only", "inc_only"):
        r = runs[k]
        ax[1, 0].plot(r["step"], r["corr"].mean(1), color=colors[k], label=label(k) + " (correct)")
        ax[1, 0].plot(r["step"], r["inc"].mean(1), color=colors[k], ls="--", label=label(k) + " (incorrect)")
    ax[1, 0].set_title("(d) targeted FPA (Table 2 / Fig. 4): solid correct, dashed incorrect")
    # four series, each with its own look: colour and marker shape = method, line = correct (solid, filled
    # marker) or incorrect (dashed, open marker), as in (d)
    for k, mk in (("offrl", "o"), ("fpa2", "s")):
        r = runs[k]
        for key, ls, face, what in (("w_corr", "-", colors[k], "correct"), ("w_inc", "--", "white", "incorrect")):
            ax[1, 1].plot(
                r["step"],
                r[key].mean(1),
                color=colors[k],
                ls=ls,
                marker=mk,
                ms=6,
                mfc=face,
                mew=1.5,
                lw=1.8,
                label=f"{label(k)}: {what}",
            )
    ax[1, 1].set_yscale("log")
    ax[1, 1].set_title(r"(e) gradient weight $\pi^{1/|y|}$ (Off-RL) vs $\hat\pi^{1/|y|}$ (FPA)")
    lam_axis = [0.0, *list(LAMBDAS)]
    acc_sgd = [summ["final"]["offrl"]["acc"]] + [summ["final"][f"fpa{l:g}"]["acc"] for l in LAMBDAS]
    acc_adam = [summ_adam["offrl"]] + [summ_adam[f"fpa{l:g}"] for l in LAMBDAS]
    xs = np.arange(len(lam_axis))
    ax[1, 2].plot(xs, acc_sgd, "o-", color="#08519c", label=f"SGD lr={cfg.lr}")
    ax[1, 2].plot(xs, acc_adam, "s-", color="#d94801", label=f"Adam lr={cfg_adam.lr}")
    ax[1, 2].axhline(summ["ref_acc"], color="gray", ls=":", label=r"$\pi_{\mathrm{ref}}$ accuracy")
    ax[1, 2].set_xticks(xs, [f"{l:g}" for l in lam_axis])
    ax[1, 2].set_xlabel(r"$\lambda$ (0 = Off-RL)")
    ax[1, 2].set_title(r"(f) final accuracy vs $\lambda$ (Fig. 5 / Tables 5-6 analogue)")
    for a in ax.flat:
        if a is not ax[1, 2]:
            a.set_xlabel("optimizer step")
        a.grid(alpha=0.3)
    ax[0, 0].set_ylabel("mean log-prob change (nats)")
    ax[1, 0].set_ylabel("mean log-prob change (nats)")
    ax[0, 2].set_ylabel("accuracy")
    ax[1, 2].set_ylabel("accuracy")
    ax[1, 1].set_ylabel("mean weight")
    for a in (ax[0, 0], ax[1, 0], ax[1, 1], ax[1, 2]):
        a.legend(fontsize=8.5, loc="best")
    fig.suptitle(
        f"FPA gradient entanglement on a token tree (V={cfg.vocab}, L={cfg.length}, per-position logits, "
        f"r = [Σy mod V = 0], N={cfg.n_data} offline samples, {cfg.seeds} seeds (bands: mean $\\pm$ 1 s.e. over seeds for Off-RL and $\\lambda$ = 2), full-batch SGD)",
        fontsize=11,
    )
    fig.tight_layout()

    fin, parts = summ["final"], claim["summary"]["parts"]
    findings = [
        "claim (λ ∈ {1, 2, 10}): parts "
        + ", ".join(f"{k} {v}" for k, v in parts.items())
        + f"; best λ by accuracy {claim['best_lambda']:g} (paper: 1-2)",
        f"Off-RL: correct data log-probs {fin['offrl']['corr']:+.2f} nats, incorrect {fin['offrl']['inc']:+.2f}; accuracy "
        f"{summ['ref_acc']:.3f} -> {fin['offrl']['acc']:.3f} (entanglement drags correct sequences down: "
        f"{'yes' if parts['offrl_lowers_correct'] else 'no'})",
        "FPA final correct log-prob change / accuracy: "
        + ", ".join(f"λ={l:g}: {fin[f'fpa{l:g}']['corr']:+.2f}/{fin[f'fpa{l:g}']['acc']:.3f}" for l in LAMBDAS),
        f"targeted (λ=2): correct-only {fin['cor_only']['corr']:+.2f}/{fin['cor_only']['acc']:.3f} vs Off-RL "
        f"{fin['offrl']['corr']:+.2f}/{fin['offrl']['acc']:.3f} (faster collapse: {parts['cor_only_faster']}); "
        f"incorrect-only {fin['inc_only']['corr']:+.2f}/{fin['inc_only']['acc']:.3f}",
        f"no λ below λ=0 in final accuracy (SGD, all λ above): {summ['parts']['no_lambda_below_0']}; with Adam accuracies "
        + ", ".join(f"λ={l:g}: {a:.3f}" for l, a in zip(lam_axis, acc_adam)),
        f"contrast, separable tree (bigram logits, answer = last token): Off-RL correct log-prob {sep_fin['offrl']['corr']:+.2f}, "
        f"accuracy {float(sep['offrl']['ref_acc'].mean()):.3f} -> {sep_fin['offrl']['acc']:.3f}; FPA λ=2 "
        f"{sep_fin['fpa2']['corr']:+.2f} / {sep_fin['fpa2']['acc']:.3f} (when one transition separates correct from incorrect, "
        "Off-RL gains accuracy quickly; the degradation above needs parameters shared by both)",
    ]
    caption = (
        "Reproduces FPA §3.2-3.3, Figs. 2, 4, 5 and Tables 2/5/6 in an exact token-tree "
        "toy: log-prob of correct / incorrect offline sequences over training for Off-RL and FPA λ∈{0,0.5,1,2,5,10}, "
        "correct-only and incorrect-only FPA ablations, the gradient weights π^{1/|y|} vs π̂^{1/|y|}, and final exact "
        "accuracy vs λ (SGD and Adam). Settings: "
        f"V = {cfg.vocab}, L = {cfg.length}, per-position logits, r = [sum of tokens mod V = 0], N = {cfg.n_data} "
        f"offline samples, full-batch SGD lr {cfg.lr} (Adam lr {cfg_adam.lr} in (f)), {cfg.seeds} seeds: curves are "
        "means; bands in (a-c) are ± 1 standard error of the mean over seeds (Off-RL and λ = 2; the seeds differ in "
        "their π_ref accuracy too, so a min-max band would hide the means). Supports fpa.entanglement (numbers in the findings)."
    )
    data = {
        "config": cfg.__dict__,
        "config_adam": cfg_adam.__dict__,
        "summary": summ,
        "final_acc_adam": summ_adam,
        "separable_contrast": sep_fin,
        "runs": {
            k: {m: v[m].mean(1) if v[m].ndim == 2 else v[m] for m in ("step", "corr", "inc", "acc", "w_corr", "w_inc")}
            for k, v in runs.items()
        },
        "runs_adam": {
            k: {m: v[m].mean(1) if v[m].ndim == 2 else v[m] for m in ("step", "corr", "inc", "acc")}
            for k, v in runs_adam.items()
        },
    }
    png, js = save(fig, out_dir, FIG_ID, data, caption, numbers)
    return FigureRecord(
        FIG_ID,
        "FPA gradient entanglement (token tree)",
        caption,
        png,
        js,
        claims=["fpa.entanglement"],
        findings=findings,
        numbers=numbers,
    )
