"""Toy mechanisms of claims the papers state in their text and figures (layer ``sim``).

``disa.remark1.mode_collapse``        DISA §2.1 Remark 1: reward maximization (GRPO, CISPO, SAPO) collapses onto a mode, the tilt keeps pi_ref's mix.
``disa.d5.judge_comparability``       DISA App. D.5: judge scores with a rubric written for 16 rollouts stay comparable.
``disa.d6.label_variance_attribution`` DISA §3.3 / App. D.6: low Val MSE + weaker proposal -> the gap is label variance.
``fpa.s23.linear_logits``             FPA §2.3: logits move about linearly, so extrapolation predicts the future policy.
``fpa.fig2.correct_weight_recovers``  FPA Fig. 2 (centre): pi_hat of correct trajectories dips, then recovers.
``fpa.fig3.weight_count_early``       FPA Fig. 3 (right): weights below 0.2 appear earlier under FPA than Off-RL.
``fpa.fig8.incorrect_gradnorm_larger`` FPA Fig. 8 (right): incorrect trajectories' gradient norms dominate.

Each check's rule, margin and setup are in its claim's statement (``paper_checks/claims/text.toml``); the
functions below compute the measured quantities (``*_measure``) and a pure verdict function applies the rule,
so a test can feed a no-op or a non-finite measurement and see the verdict move or a ``ValueError``.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import torch

from tiltlab.claims.pinned import residual
from tiltlab.claims.registry import CheckResult, Verdict, register_check
from tiltlab.objectives import estimators as est
from tiltlab.objectives.metrics import total_variation
from tiltlab.sim.api import run
from tiltlab.sim.config import SimConfig
from tiltlab.sim.envs import BanditEnv
from tiltlab.sim.exact import log_partition
from tiltlab.sim.experiments import cached, fpa_entanglement

V = Verdict
F64 = torch.float64


def _finite(name: str, numbers: dict) -> None:
    bad = [k for k, v in numbers.items() if isinstance(v, float) and not math.isfinite(v)]
    if bad:
        raise ValueError(f"{name}: non-finite measurement(s) {bad}")


# ----------------------------------------------------------------------------- DISA Remark 1
REMARK1_PREF = (0.25, 0.10, 0.05, 0.30, 0.20, 0.10)
REMARK1_CORRECT = (1.0, 1.0, 1.0, 0.0, 0.0, 0.0)
REMARK1_COLLAPSE = 0.5  # share of the way from pi_ref's effective number of correct modes to 1
REMARK1_KEEP_TV = 0.01
#: Optimizer steps per rollout batch of the CISPO and SAPO arms (issue 37): on one on-policy step their gradient
#: is GRPO's, so they take 4 Adam steps on each batch (ratios off 1 from the second); GRPO keeps 1 (its recorded run).
REMARK1_OFF_POLICY_INNER = 4
#: The reward-maximising arms, each judged by the same collapse rule (REMARK1_COLLAPSE), and their configs.
REMARK1_REWARD_MAX = {
    "grpo": {"method": "grpo", "advantage": "group"},
    "cispo": {"method": "cispo", "advantage": "group", "inner_steps": REMARK1_OFF_POLICY_INNER},
    "sapo": {"method": "sapo", "advantage": "group", "inner_steps": REMARK1_OFF_POLICY_INNER},
}


def _correct_restricted(logp: torch.Tensor, reward: torch.Tensor) -> torch.Tensor:
    p = logp.exp() * reward
    return p / p.sum(-1, keepdim=True)


def _effective_modes(c: torch.Tensor) -> torch.Tensor:
    return torch.exp(-(c * torch.log(c.clamp_min(1e-300))).sum(-1))


@cached
def remark1_measure(seed: int) -> dict:
    """GRPO (no KL), CISPO and SAPO (TRL's defaults, no KL, 4 optimizer steps per batch) and TB with the exact
    log Z on the 6-answer bandit of the claim; the effective number of correct modes and the TV of the
    correct-restricted policy to pi_ref's (means over 4 seeds). Each arm seeds its own run."""
    r = torch.tensor([REMARK1_CORRECT], dtype=F64)
    env = BanditEnv(torch.tensor([REMARK1_PREF], dtype=F64).log(), r, torch.zeros(1, 1, dtype=F64), "remark1", True)
    c_ref = _correct_restricted(env.logp_ref, r)
    out = {"ref_modes": float(_effective_modes(c_ref).mean())}
    arms = {
        "grpo": REMARK1_REWARD_MAX["grpo"],
        "tb": {"method": "tb", "log_z": "exact", "tilt_beta": 2.0},
        "cispo": REMARK1_REWARD_MAX["cispo"],
        "sapo": REMARK1_REWARD_MAX["sapo"],
    }
    for name, kw in arms.items():
        res = run(SimConfig(env="bandit", seeds=4, steps=300, G=8, lr=0.05, seed=seed, **kw), env)
        c = _correct_restricted(res.logp, r)
        out[f"{name}_modes"] = float(_effective_modes(c).mean())
        out[f"{name}_tv_to_ref"] = float((0.5 * (c - c_ref).abs().sum(-1)).mean())
        out[f"{name}_reward"] = res.final("reward")
    return out


def remark1_collapse_share(n: dict, arm: str) -> float:
    """How far ``arm``'s effective number of correct modes fell from pi_ref's toward 1 (0: none, 1: one mode)."""
    return (n["ref_modes"] - n[f"{arm}_modes"]) / (n["ref_modes"] - 1.0)


def remark1_verdict(n: dict) -> tuple[Verdict, dict[str, bool]]:
    _finite("disa.remark1.mode_collapse", n)
    items = {
        "reward_max_collapses": remark1_collapse_share(n, "grpo") > REMARK1_COLLAPSE,
        "tilt_keeps_mix": n["tb_tv_to_ref"] < REMARK1_KEEP_TV,
        "cispo_collapses": remark1_collapse_share(n, "cispo") > REMARK1_COLLAPSE,
        "sapo_collapses": remark1_collapse_share(n, "sapo") > REMARK1_COLLAPSE,
    }
    verdict = V.of_items(items.values())
    return verdict, items


@register_check(
    "disa.remark1.mode_collapse",
    layer="sim",
    expected=V.VERIFIED,
    name="grpo_vs_tilt_bandit",
    expected_items={
        "reward_max_collapses": True,
        "tilt_keeps_mix": True,
        "cispo_collapses": True,
        "sapo_collapses": True,
    },
    pins={"tb_tv_to_ref": residual(REMARK1_KEEP_TV)},
)
def remark1_mode_collapse(seed: int) -> CheckResult:
    n = remark1_measure(seed)
    verdict, items = remark1_verdict(n)
    return CheckResult(
        verdict,
        f"effective number of correct modes: pi_ref {n['ref_modes']:.2f}, GRPO {n['grpo_modes']:.2f} (reward "
        f"{n['grpo_reward']:.3f}), TB/exact log Z {n['tb_modes']:.2f} (reward {n['tb_reward']:.3f}); TV of the "
        f"correct-restricted policy to pi_ref's: GRPO {n['grpo_tv_to_ref']:.3f}, TB {n['tb_tv_to_ref']:.1e}; "
        f"CISPO and SAPO (TRL's defaults, {REMARK1_OFF_POLICY_INNER} optimizer steps per rollout batch so their "
        f"ratios leave 1): modes {n['cispo_modes']:.2f} / {n['sapo_modes']:.2f}, reward {n['cispo_reward']:.3f} / "
        f"{n['sapo_reward']:.3f}, TV {n['cispo_tv_to_ref']:.3f} / {n['sapo_tv_to_ref']:.3f}",
        numbers=n,
        items=items,
    )


# ----------------------------------------------------------------------------- DISA App. D.5
#: FlowRL's rubric (llm.eval.judge.JUDGE_USER_TEMPLATE), written for 16 rollouts: count of the most common
#: approach -> score: >= 14 -> 1, 11-13 -> 2, 7-10 -> 3, 4-6 -> 4, <= 3 -> 5.
RUBRIC_LOWER_BOUNDS = ((14, 1), (11, 2), (7, 3), (4, 4))
RUBRIC_N = 16
JUDGE_OTHER_N = (8, 32)
JUDGE_TOP_SHARES = (0.95, 0.8, 0.6, 0.4, 0.25)
JUDGE_STRATEGIES = 4
JUDGE_MARGIN = 0.16  # half the smallest gap Table 3 interprets (DISA - FlowRL = 0.32)


def rubric_score(max_count: torch.Tensor) -> torch.Tensor:
    """The rubric's score from the count of the most common approach, applied literally."""
    score = torch.full_like(max_count, 5)
    for bound, s in reversed(RUBRIC_LOWER_BOUNDS):
        score = torch.where(max_count >= bound, torch.full_like(max_count, s), score)
    return score


def _counts(n: int, k: int) -> torch.Tensor:
    """All count vectors of n rollouts over k strategies ``[C(n+k-1, k-1), k]`` (stars and bars: the k - 1
    bar positions among n + k - 1 slots), float64; the same set as ``sim.exact.compositions``."""
    if k == 1:
        return torch.tensor([[float(n)]], dtype=F64)
    bars = torch.combinations(torch.arange(n + k - 1), k - 1).reshape(-1, k - 1)
    edges = torch.cat([torch.full((len(bars), 1), -1), bars, torch.full((len(bars), 1), n + k - 1)], 1)
    return (edges.diff(dim=1) - 1).to(F64)


def expected_score(n: int, probs: torch.Tensor) -> float:
    """Exact E[score] for n i.i.d. rollouts whose strategies follow ``probs`` (multinomial enumeration)."""
    c = _counts(n, probs.numel())
    logp = torch.lgamma(torch.tensor(n + 1.0, dtype=F64)) - torch.lgamma(c + 1).sum(-1) + (c * probs.log()).sum(-1)
    return float((logp.exp() * rubric_score(c.max(-1).values.long()).to(F64)).sum())


@cached
def judge_measure(seed: int) -> dict:
    """E[score_n] - E[score_16] for every top share and n of the claim (deterministic: ``seed`` unused)."""
    out = {}
    for s in JUDGE_TOP_SHARES:
        rest = (1.0 - s) / (JUDGE_STRATEGIES - 1)
        probs = torch.tensor([s] + [rest] * (JUDGE_STRATEGIES - 1), dtype=F64)
        base = expected_score(RUBRIC_N, probs)
        out[f"s{s:g}_n16"] = base
        for n in JUDGE_OTHER_N:
            out[f"s{s:g}_n{n}"] = expected_score(n, probs)
    return out


def judge_verdict(n: dict) -> tuple[Verdict, dict[str, bool], dict[int, float]]:
    _finite("disa.d5.judge_comparability", n)
    shifts = {m: max(abs(n[f"s{s:g}_n{m}"] - n[f"s{s:g}_n16"]) for s in JUDGE_TOP_SHARES) for m in JUDGE_OTHER_N}
    items = {f"comparable_n{m}": v < JUDGE_MARGIN for m, v in shifts.items()}
    verdict = V.of_items(items.values())
    return verdict, items, shifts


@register_check(
    "disa.d5.judge_comparability",
    layer="sim",
    expected=V.REFUTED,
    name="literal_rubric_judge",
    expected_items={"comparable_n8": False, "comparable_n32": False},
)
def judge_comparability(seed: int) -> CheckResult:
    n = judge_measure(seed)
    verdict, items, shifts = judge_verdict(n)
    s0 = JUDGE_TOP_SHARES[1]
    return CheckResult(
        verdict,
        "rubric for 16 rollouts applied to n rollouts of the same policy: max over top shares of |E score_n - "
        + ", ".join(f"E score_16| = {v:.2f} at n = {m}" for m, v in shifts.items())
        + f" (margin {JUDGE_MARGIN}); e.g. top share {s0:g}: "
        + ", ".join(f"n={m} {n[f's{s0:g}_n{m}']:.2f}" for m in (8, 16, 32)),
        numbers={**n, **{f"max_shift_n{m}": v for m, v in shifts.items()}},
        items=items,
    )


# ----------------------------------------------------------------------------- DISA §3.3 / App. D.6
D6_PROMPTS, D6_M, D6_BETA, D6_DEGREE, D6_DRAWS, D6_STRONG_ALPHA = 256, 8, 2.0, 5, 5, 0.9
D6_RATIO = 1.5


@cached
def d6_measure(seed: int) -> dict:
    """Per proposal: label error (mean squared label - exact log Z on held-out prompts) and the held-out
    Val MSE of the degree-5 regressor against the held-out labels (means over 5 label draws)."""
    g = torch.Generator().manual_seed(seed)
    out = {f"{k}_{q}": 0.0 for k in ("label_err", "val_mse") for q in ("strong", "weak")}
    for _ in range(D6_DRAWS):
        d = 6 * torch.rand(2 * D6_PROMPTS, generator=g, dtype=F64) - 3
        p = torch.sigmoid(d)
        logp_ref = torch.stack([torch.log1p(-p), torch.log(p)], -1)  # outcomes (wrong, right)
        tilt = torch.tensor([0.0, D6_BETA], dtype=F64)
        exact = log_partition(logp_ref, tilt)
        logp_star = logp_ref + tilt - exact[:, None]
        X = torch.stack([d**k for k in range(D6_DEGREE + 1)], -1)
        tr, te = slice(0, D6_PROMPTS), slice(D6_PROMPTS, None)
        for name, alpha in (("strong", D6_STRONG_ALPHA), ("weak", 0.0)):
            logq = torch.log_softmax((1 - alpha) * logp_ref + alpha * logp_star, -1)
            right = torch.rand(2 * D6_PROMPTS, D6_M, generator=g, dtype=F64) < logq[:, 1:].exp()
            y = right.long()
            log_w = est.log_importance_weights(logp_ref.gather(1, y), logq.gather(1, y), tilt[y])
            labels = est.log_partition_lse(log_w)
            coef = torch.linalg.lstsq(X[tr], labels[tr, None]).solution
            pred = (X[te] @ coef).squeeze(-1)
            out[f"label_err_{name}"] += float(((labels[te] - exact[te]) ** 2).mean()) / D6_DRAWS
            out[f"val_mse_{name}"] += float(((pred - labels[te]) ** 2).mean()) / D6_DRAWS
    out["label_err_ratio"] = out["label_err_weak"] / out["label_err_strong"]
    out["val_mse_ratio"] = out["val_mse_weak"] / out["val_mse_strong"]
    return out


def d6_verdict(n: dict) -> tuple[Verdict, dict[str, bool]]:
    _finite("disa.d6.label_variance_attribution", n)
    items = {
        "weak_inflates_label_error": n["label_err_ratio"] > D6_RATIO,
        "val_mse_tracks": n["val_mse_ratio"] > D6_RATIO,
    }
    if not items["weak_inflates_label_error"]:
        return V.INCONCLUSIVE, items
    return (V.REFUTED if items["val_mse_tracks"] else V.VERIFIED), items


@register_check(
    "disa.d6.label_variance_attribution",
    layer="sim",
    expected=V.REFUTED,
    name="val_mse_vs_label_variance",
    expected_items={"weak_inflates_label_error": True, "val_mse_tracks": True},
)
def d6_attribution(seed: int) -> CheckResult:
    n = d6_measure(seed)
    verdict, items = d6_verdict(n)
    return CheckResult(
        verdict,
        f"weak proposal (q = pi_ref) vs strong (alpha {D6_STRONG_ALPHA}): label squared error {n['label_err_weak']:.4f} vs "
        f"{n['label_err_strong']:.4f} (x{n['label_err_ratio']:.1f}); held-out Val MSE {n['val_mse_weak']:.4f} vs "
        f"{n['val_mse_strong']:.4f} (x{n['val_mse_ratio']:.1f}): the Val MSE contains the held-out labels' noise, so a "
        "comparably low Val MSE would rule out the inflated label variance the attribution needs",
        numbers=n,
        items=items,
    )


# ----------------------------------------------------------------------------- FPA: prolonged token-tree runs
#: The runs of the FPA figure claims: fpa.entanglement's setup (CLAIM_CONFIG) trained 4x longer, recorded
#: every 20 steps; Off-RL and FPA lambda = 2.
FIG_CONFIG = replace(fpa_entanglement.CLAIM_CONFIG, steps=480, eval_every=20)
FIG_LAMBDA = 2.0


def fig_runs(seed: int) -> tuple[dict, dict]:
    """The Off-RL and FPA runs; a run whose correct or incorrect data log-probs moved by less than
    ``fpa_entanglement.FPA_MOVES_NATS`` (nothing trained), or whose records are not finite, is an error."""
    runs = (
        fpa_entanglement.train(FIG_CONFIG, "offrl", seed=seed),
        fpa_entanglement.train(FIG_CONFIG, "fpa", FIG_LAMBDA, seed=seed),
    )
    for name, r in zip(("offrl", "fpa"), runs):
        for key in ("corr", "inc", "acc", "w_corr", "w_inc", "below_inc", "gn_corr", "gn_inc", "params"):
            if not np.isfinite(np.asarray(r[key])).all():
                raise ValueError(f"{name} run: non-finite {key!r} records")
        moved = min(float(np.abs(np.asarray(r[k])[-1]).mean()) for k in ("corr", "inc"))
        if moved < fpa_entanglement.FPA_MOVES_NATS:
            raise ValueError(f"{name} run did not train: data log-probs moved by {moved:.2e} nats")
    return runs


# --- FPA §2.3: linear logit movement
LINEAR_TIMES = (120, 240)
LINEAR_COSINE = 0.9


def _centered(h: np.ndarray) -> np.ndarray:
    return h - h.mean(-1, keepdims=True)  # softmax gauge: logits are defined up to a constant per position


def _softmax(h: np.ndarray) -> np.ndarray:
    e = np.exp(h - h.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _tv(a: np.ndarray, b: np.ndarray) -> float:
    return float(total_variation(_softmax(a), _softmax(b)).mean())


def linear_measure(runs: dict[str, dict]) -> dict:
    """Per run and time t: cosine of the centred displacements h_t - h_ref and h_2t - h_t (mean over seeds),
    and TV(pi_hat_{lambda=1}(t), pi_2t) / TV(pi_t, pi_2t)."""
    out = {}
    for name, r in runs.items():
        steps = list(r["step"])
        h = np.asarray(r["params"])  # [n_eval, S, L, V]
        h0 = h[0]
        for t in LINEAR_TIMES:
            ht, h2t = h[steps.index(t)], h[steps.index(2 * t)]
            a, b = _centered(ht - h0).reshape(len(ht), -1), _centered(h2t - ht).reshape(len(ht), -1)
            cos = (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-300)
            out[f"{name}_cos_t{t}"] = float(cos.mean())
            out[f"{name}_extrap_ratio_t{t}"] = _tv(ht + (ht - h0), h2t) / max(_tv(ht, h2t), 1e-300)
    return out


def linear_verdict(n: dict) -> tuple[Verdict, dict[str, bool]]:
    _finite("fpa.s23.linear_logits", n)
    items = {}
    for name in ("offrl", "fpa"):
        items[f"{name}_linear"] = all(n[f"{name}_cos_t{t}"] > LINEAR_COSINE for t in LINEAR_TIMES)
        items[f"{name}_extrapolation_helps"] = all(n[f"{name}_extrap_ratio_t{t}"] < 1.0 for t in LINEAR_TIMES)
    verdict = V.of_items(items.values())
    return verdict, items


# --- FPA Fig. 2 centre
DIP = 0.9
RECOVER = 0.25
NO_RECOVER = 0.1


def _recovery(w: np.ndarray) -> tuple[float, float, float, float]:
    """(start, minimum, final, recovered share of the dip) of a mean-weight trajectory."""
    start, low, final = float(w[0]), float(w.min()), float(w[-1])
    return start, low, final, (final - low) / max(start - low, 1e-300)


def recover_measure(off: dict, fpa: dict) -> dict:
    out = {}
    for name, r in (("offrl", off), ("fpa", fpa)):
        w = np.asarray(r["w_corr"]).mean(1)
        out[f"{name}_start"], out[f"{name}_min"], out[f"{name}_final"], out[f"{name}_recovered"] = _recovery(w)
        out[f"{name}_mean_weight"] = float(w.mean())
    return out


def recover_verdict(n: dict) -> tuple[Verdict, dict[str, bool]]:
    _finite("fpa.fig2.correct_weight_recovers", n)
    items = {
        "fpa_dips": n["fpa_min"] < DIP * n["fpa_start"],
        "fpa_recovers": n["fpa_recovered"] >= RECOVER,
        "offrl_no_recovery": n["offrl_recovered"] < NO_RECOVER,
        "fpa_higher_mean_weight": n["fpa_mean_weight"] > n["offrl_mean_weight"],
    }
    if not items["fpa_recovers"]:
        verdict = V.REFUTED
    elif items["fpa_dips"] and items["offrl_no_recovery"]:
        verdict = V.VERIFIED
    else:
        verdict = V.PARTLY
    return verdict, items


# --- FPA Fig. 3 right
HALF = 0.5


def _first_step(steps: np.ndarray, mask: np.ndarray) -> float:
    """First step where ``mask`` holds; +inf when it never does (recorded as the horizon + 1)."""
    idx = np.flatnonzero(mask)
    return float(steps[idx[0]]) if len(idx) else float(steps[-1] + 1)


def count_measure(off: dict, fpa: dict) -> dict:
    steps = np.asarray(off["step"])
    out = {}
    for name, r in (("offrl", off), ("fpa", fpa)):
        frac = np.asarray(r["below_inc"]).mean(1)
        out[f"{name}_t_half"] = _first_step(steps, frac >= HALF)
        out[f"{name}_max_rise"] = float(np.diff(frac).max())
    acc = np.asarray(off["acc"]).mean(1)
    out["offrl_collapse_step"] = _first_step(steps, acc < acc[0])
    return out


def count_verdict(n: dict) -> tuple[Verdict, dict[str, bool]]:
    _finite("fpa.fig3.weight_count_early", n)
    items = {
        "fpa_earlier": n["fpa_t_half"] < n["offrl_t_half"],
        "offrl_after_collapse": n["offrl_t_half"] >= n["offrl_collapse_step"],
        "offrl_more_abrupt": n["offrl_max_rise"] > n["fpa_max_rise"],
    }
    if not items["fpa_earlier"]:
        return V.REFUTED, items
    return (V.VERIFIED if all(items.values()) else V.PARTLY), items


# --- FPA Fig. 8 right
def gradnorm_measure(off: dict) -> dict:
    gc, gi = np.asarray(off["gn_corr"]).mean(1), np.asarray(off["gn_inc"]).mean(1)
    share = float(np.asarray(off["data_pass"]).mean())  # fraction of correct data sequences
    return {
        "min_contribution_ratio": float((gi / gc).min()),
        "min_per_sequence_ratio": float(((gi / (1 - share)) / (gc / share)).min()),
        "correct_share": share,
        "n_records": float(len(gc)),
    }


def gradnorm_verdict(n: dict) -> tuple[Verdict, dict[str, bool]]:
    _finite("fpa.fig8.incorrect_gradnorm_larger", n)
    items = {
        "incorrect_contribution_larger": n["min_contribution_ratio"] > 1.0,
        "incorrect_per_sequence_larger": n["min_per_sequence_ratio"] > 1.0,
    }
    verdict = V.of_items(items.values())
    return verdict, items


@register_check(
    "fpa.s23.linear_logits",
    layer="sim",
    expected=V.PARTLY,
    name="token_tree_logit_path",
    expected_items={
        "offrl_linear": False,
        "offrl_extrapolation_helps": True,
        "fpa_linear": False,
        "fpa_extrapolation_helps": False,
    },
)
def linear_logits(seed: int) -> CheckResult:
    off, fpa = fig_runs(seed)
    n = linear_measure({"offrl": off, "fpa": fpa})
    verdict, items = linear_verdict(n)
    return CheckResult(
        verdict,
        "token tree, logit path from pi_ref: cosine(h_t - h_ref, h_2t - h_t) "
        + ", ".join(f"{m} t={t}: {n[f'{m}_cos_t{t}']:.2f}" for m in ("offrl", "fpa") for t in LINEAR_TIMES)
        + "; TV(extrapolated pi_t, pi_2t) / TV(pi_t, pi_2t) "
        + ", ".join(f"{m} t={t}: {n[f'{m}_extrap_ratio_t{t}']:.2f}" for m in ("offrl", "fpa") for t in LINEAR_TIMES),
        numbers=n,
        items=items,
    )


@register_check(
    "fpa.fig2.correct_weight_recovers",
    layer="sim",
    expected=V.REFUTED,
    name="token_tree_weights",
    expected_items={
        "fpa_dips": True,
        "fpa_recovers": False,
        "offrl_no_recovery": True,
        "fpa_higher_mean_weight": False,
    },
)
def correct_weight_recovers(seed: int) -> CheckResult:
    n = recover_measure(*fig_runs(seed))
    verdict, items = recover_verdict(n)
    return CheckResult(
        verdict,
        f"mean weight on correct data sequences, start -> min -> final (recovered share of the dip): FPA pi_hat "
        f"{n['fpa_start']:.3f} -> {n['fpa_min']:.3f} -> {n['fpa_final']:.3f} ({n['fpa_recovered']:.2f}); Off-RL pi "
        f"{n['offrl_start']:.3f} -> {n['offrl_min']:.3f} -> {n['offrl_final']:.3f} ({n['offrl_recovered']:.2f}); mean "
        f"over training FPA {n['fpa_mean_weight']:.3f} vs Off-RL {n['offrl_mean_weight']:.3f}",
        numbers=n,
        items=items,
    )


@register_check(
    "fpa.fig3.weight_count_early",
    layer="sim",
    expected=V.PARTLY,
    name="token_tree_below_threshold",
    expected_items={"fpa_earlier": True, "offrl_after_collapse": False, "offrl_more_abrupt": False},
)
def weight_count_early(seed: int) -> CheckResult:
    n = count_measure(*fig_runs(seed))
    verdict, items = count_verdict(n)
    return CheckResult(
        verdict,
        f"half the incorrect data sequences below weight {fpa_entanglement.WEIGHT_THRESHOLD:g}: FPA at step "
        f"{n['fpa_t_half']:g}, Off-RL at step {n['offrl_t_half']:g}; Off-RL's accuracy below its start from step "
        f"{n['offrl_collapse_step']:g}; largest rise per record Off-RL {n['offrl_max_rise']:.2f} vs FPA {n['fpa_max_rise']:.2f}",
        numbers=n,
        items=items,
    )


@register_check(
    "fpa.fig8.incorrect_gradnorm_larger",
    layer="sim",
    expected=V.PARTLY,
    name="token_tree_offrl_gradnorms",
    expected_items={"incorrect_contribution_larger": True, "incorrect_per_sequence_larger": False},
)
def incorrect_gradnorm_larger(seed: int) -> CheckResult:
    off, _ = fig_runs(seed)
    n = gradnorm_measure(off)
    verdict, items = gradnorm_verdict(n)
    return CheckResult(
        verdict,
        f"Off-RL, {n['n_records']:g} records: smallest ratio incorrect / correct gradient-norm contribution "
        f"{n['min_contribution_ratio']:.2f}; per sequence (each part over its data share, correct share "
        f"{n['correct_share']:.2f}) {n['min_per_sequence_ratio']:.2f}",
        numbers=n,
        items=items,
    )
