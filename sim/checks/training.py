"""Numeric checks through the simulator's trainers (layer ``sim``).

Each check measures something with :mod:`sim.train` (exact-gradient mode where the claim is about
expectations, sampled mode where it is about training) and derives its verdict from the numbers.
All loss math is ``objectives``'; the checks only choose environments, configs and thresholds.
"""

from __future__ import annotations

import math

import torch

from tiltlab.claims import stats
from tiltlab.claims.pinned import residual, stochastic
from tiltlab.claims.registry import CheckResult, Verdict, register_check
from tiltlab.objectives import paced as paced_obj
from tiltlab.objectives import tb as tb_obj
from tiltlab.sim import envs
from tiltlab.sim.config import SimConfig
from tiltlab.sim.experiments import lad, logz_training, paced
from tiltlab.sim.train import kl_divergence, train

V = Verdict


@register_check("disa.prop3i.exact_fixed_point", layer="sim", expected=V.VERIFIED, name="trainer_converges")
def exact_fixed_point(seed: int) -> CheckResult:
    """Exact-gradient TB with exact log Z from random inits, on-policy and with a fixed full-support
    behaviour policy (the random initial policy, never refreshed): every run must reach pi*."""
    env = logz_training.multiprompt_env(seed=seed)
    common = dict(
        env="multiprompt",
        method="tb",
        log_z="exact",
        tilt_beta=2.0,
        exact=True,
        steps=300,
        lr=0.1,
        init_scale=1.5,
        seeds=3,
        seed=seed,
        log_every=300,
    )
    on = train(SimConfig(**common, refresh_every=1), env)
    off = train(SimConfig(**common, refresh_every=10_000), env)  # pi_b = initial policy, theta-independent
    tv_on, tv_off = on.final("tv"), off.final("tv")
    # Converged runs sit at float64 round-off; 1e-3 is 20x below the 0.02 the tests ask of sampled-free training.
    ok = tv_on < 1e-3 and tv_off < 1e-3
    return CheckResult(
        V.VERIFIED if ok else V.REFUTED,
        f"exact-gradient TB, exact log Z, 3 random inits x 8 prompts: final TV(pi, pi*) on-policy {tv_on:.2e}, "
        f"fixed behaviour pi_b {tv_off:.2e}",
        numbers={"tv_on_policy": tv_on, "tv_fixed_behaviour": tv_off},
    )


#: |grad| of TB at pi* (``logz_training._grad_norm_at_target``) that counts as zero: float64 round-off of a sum of
#: ~K terms of size O(1) (observed ~1e-16); ``disa.prop3ii.biased_stationary`` and ``disa.c5.offpolicy_breaks`` (b = 0).
GRAD_AT_TARGET_TOL = 1e-10


@register_check(
    "disa.prop3ii.biased_stationary",
    layer="sim",
    expected=V.VERIFIED,
    name="trainer_gradient_at_target",
    pins={"grad_norm_b*": residual(GRAD_AT_TARGET_TOL)},
)
def biased_stationary(seed: int) -> CheckResult:
    """On-policy exact semi-gradient of TB at pi* with log Z = log Z* + b, for several prompt-only b."""
    n = logz_training.biased_stationary(seed)
    worst = max(n.values())
    ok = worst < GRAD_AT_TARGET_TOL
    return CheckResult(
        V.VERIFIED if ok else V.REFUTED,
        f"|grad| at pi* on-policy with prompt-only bias b in {{-2,-0.5,0.5,1}}: max {worst:.1e} (zero up to round-off)",
        numbers=n,
        figure="fig07_where_logz_matters",
    )


#: ``disa.c5.offpolicy_breaks``: the trained TV(pi, pi*) at b = 0 counts as zero below this floor (the b = 0.5 run
#: must settle more than 10x farther than max(TV at b = 0, floor)).
OFFPOLICY_TV_FLOOR = 1e-4


@register_check(
    "disa.c5.offpolicy_breaks",
    layer="sim",
    expected=V.VERIFIED,
    name="trainer_offpolicy_drift",
    pins={"grad_b0": residual(GRAD_AT_TARGET_TOL), "tv_b0": residual(OFFPOLICY_TV_FLOOR)},
)
def offpolicy_breaks(seed: int) -> CheckResult:
    """Fixed behaviour pi_b != pi*: the gradient at pi* is nonzero for b != 0 and training settles elsewhere."""
    n = logz_training.offpolicy_drift(seed)
    g0, g5, tv0, tv5 = n["grad_b0"], n["grad_b05"], n["tv_b0"], n["tv_b05"]
    ok = g0 < GRAD_AT_TARGET_TOL and g5 > 1e-3 and tv5 > 10 * max(tv0, OFFPOLICY_TV_FLOOR)
    return CheckResult(
        V.VERIFIED if ok else V.REFUTED,
        f"fixed pi_b: |grad| at pi* b=0 {g0:.1e}, b=0.5 {g5:.3f}; trained TV(pi, pi*) b=0 {tv0:.1e}, b=0.5 {tv5:.3f}",
        numbers=n,
        figure="fig07_where_logz_matters",
    )


#: ``disa.beyond.semigradient_invariance``: expected semi-gradients across log Z count as identical below this
#: relative difference (float64 round-off; observed ~1e-15).
INVARIANCE_RTOL = 1e-10


@register_check(
    "disa.beyond.semigradient_invariance",
    layer="sim",
    expected=V.VERIFIED,
    name="trainer_invariance_and_variance",
    pins={"max_rel_diff": residual(INVARIANCE_RTOL)},
)
def semigradient_invariance(seed: int) -> CheckResult:
    """Expected on-policy semi-gradient at random theta for several prompt-only log Z (identical), and
    the sampled-gradient variance for each (different): log Z acts as a baseline."""
    n = logz_training.semigradient_invariance(seed)
    biases = logz_training.INVARIANCE_BIASES
    diff = n["max_rel_diff"]
    var = {b: n[f"grad_var_b{b:+g}"] for b in biases}
    ok = diff < INVARIANCE_RTOL
    return CheckResult(
        V.VERIFIED if ok else V.REFUTED,
        f"relative difference of expected semi-gradients across log Z = log Z*+b (b in {biases}) and log Z = 0: "
        f"{diff:.1e}; sampled-gradient variance (G=8) by b: " + ", ".join(f"{b:+g}: {v:.2e}" for b, v in var.items()),
        numbers=n,
        figure="fig07_where_logz_matters",
    )


#: ``paced.prop41``: largest |p_old - Prop. 4.1(log Z*)| accepted, limited by the scalar minimizer's tolerance
#: (1e-12 on log Z, squared-loss flatness; observed ~5e-9, moving with the CPU's kernel path).
PROP41_MAX_ERR = 1e-6


@register_check(
    "paced.prop41",
    layer="sim",
    expected=V.VERIFIED,
    name="exact_optimal_log_z",
    pins={"max_err": residual(PROP41_MAX_ERR)},
)
def paced_prop41(seed: int) -> CheckResult:
    """Minimize the exact E_{pi_old}[delta^2] (PACED eq. 6, objectives.tb) over log Z numerically; compare
    objectives.paced.accuracy_from_log_z(log Z*, kl=KL(pi_old||pi)) with the exact p_old; also {a,b} rewards."""
    from scipy.optimize import minimize_scalar

    g = torch.Generator().manual_seed(seed)
    K, kl_coef = 12, 0.5
    errs, gaps = [], []
    for a, b in ((0.0, 1.0), (-1.0, 1.0), (0.2, 3.0)):
        for _ in range(5):
            logp_old = torch.log_softmax(torch.randn(K, generator=g, dtype=torch.float64), -1)
            logp = torch.log_softmax(logp_old + 0.5 * torch.randn(K, generator=g, dtype=torch.float64), -1)
            r = torch.where(torch.rand(K, generator=g) < 0.4, b, a).to(torch.float64)
            w = K * logp_old.exp()

            def loss(lz: float) -> float:
                return float(
                    tb_obj.tb_loss(tb_obj.tb_residual(logp, logp_old, r, lz, beta=1.0 / kl_coef), is_weight=w).loss
                )

            lz_star = minimize_scalar(loss, bracket=(-5.0, 5.0), tol=1e-12).x
            kl = float(kl_divergence(logp_old, logp))
            p_rec = float(paced_obj.accuracy_from_log_z(lz_star, kl_coef=kl_coef, kl=kl, r_low=a, r_high=b, clip=False))
            p_true = float(((r == b).to(torch.float64) * logp_old.exp()).sum())
            errs.append(abs(p_rec - p_true))
            p_drop = float(
                paced_obj.accuracy_from_log_z(lz_star, kl_coef=kl_coef, kl=0.0, r_low=a, r_high=b, clip=False)
            )
            gaps.append(abs(p_drop - p_true))
    err = max(errs)
    ok = err < PROP41_MAX_ERR
    return CheckResult(
        V.VERIFIED if ok else V.REFUTED,
        f"15 random (pi_old, pi_theta, {{a,b}}) cases: max |p_old - Prop. 4.1(log Z*)| = {err:.1e}; dropping the KL "
        f"term (eq. 8) errs by up to {max(gaps):.3f} at these policy gaps",
        numbers={"max_err": err, "gap_without_kl": max(gaps)},
    )


#: ``paced.vargrad``: |dL/dlog Z| at the VarGrad estimate that counts as zero (float64 round-off; observed ~1e-16).
VARGRAD_GRAD_TOL = 1e-12


@register_check(
    "paced.vargrad",
    layer="sim",
    expected=V.VERIFIED,
    name="batch_minimizer",
    pins={"max_dL_dlogz": residual(VARGRAD_GRAD_TOL)},
)
def paced_vargrad(seed: int) -> CheckResult:
    """On sampled batches [P, G]: dL/dlogZ at vargrad_log_z is 0 and no other shared log Z does better."""
    env = logz_training.multiprompt_env(seed=seed)
    g = torch.Generator().manual_seed(seed)
    logits = env.logp_ref + torch.randn(env.P, env.K, generator=g, dtype=torch.float64)
    logp_all = torch.log_softmax(logits, -1)
    idx = env.sample(logp_all, 8, g)
    lp, lr, r = envs.gather(logp_all, idx), env.ref_logp_of(idx), env.rewards_of(idx)
    lz = tb_obj.vargrad_log_z(lp, lr, r, beta=2.0).detach().requires_grad_(True)
    loss = tb_obj.tb_loss(tb_obj.tb_residual(lp, lr, r, lz[:, None], beta=2.0)).loss
    (dz,) = torch.autograd.grad(loss, [lz])
    base = float(loss.detach())
    worse = min(
        float(tb_obj.tb_loss(tb_obj.tb_residual(lp, lr, r, (lz + e)[:, None].detach(), beta=2.0)).loss) - base
        for e in (-1e-3, 1e-3)
    )
    ok = float(dz.abs().max()) < VARGRAD_GRAD_TOL and worse > 0
    return CheckResult(
        V.VERIFIED if ok else V.REFUTED,
        f"8 prompts x 8 samples: max |dL/dlogZ| at the VarGrad estimate {float(dz.abs().max()):.1e}; "
        f"shifting log Z by ±1e-3 raises the loss by >= {worse:.2e}",
        numbers={"max_dL_dlogz": float(dz.abs().max()), "min_increase": worse},
    )


#: ``lad.practical``: converged = TV(pi, pi_old e^{A/eta}) below this after 400 exact-gradient Adam steps
#: (the strictly convex f reach ~1e-10; TV stops near 1.7e-2).
LAD_CONVERGED_TV = 1e-3
#: A run that stops at a point whose exact practical loss equals the target's within this is at a second minimizer.
LAD_SAME_LOSS = 1e-3


LAD_STRICT = ("kl", "rkl", "jeffreys", "hellinger", "js")  # strictly convex f: Lemma 3.2 gives a unique minimizer


def lad_practical_items(n: dict) -> dict[str, bool]:
    """Per-divergence outcomes of :func:`lad_practical` from its numbers."""
    items = {f"{d}_converges": n[f"tv_{d}"] < LAD_CONVERGED_TV for d in (*LAD_STRICT, "tv")}
    items["tv_second_minimizer"] = (not items["tv_converges"]) and n.get("loss_gap_tv", 1.0) < LAD_SAME_LOSS
    return items


LAD_PRACTICAL_ITEMS = {
    **{f"{d}_converges": True for d in LAD_STRICT},
    "tv_converges": False,
    "tv_second_minimizer": True,
}


def lad_practical_verdict(items: dict[str, bool]) -> V:
    """Every strictly convex f converges and TV stops at a second minimizer -> partly (the optimum is
    unique for five of the six f); all six converge -> verified; any strictly convex f fails -> refuted."""
    if not all(items[f"{d}_converges"] for d in LAD_STRICT):
        return V.REFUTED
    if items["tv_converges"]:
        return V.VERIFIED
    return V.PARTLY if items["tv_second_minimizer"] else V.REFUTED


@register_check(
    "lad.practical",
    layer="sim",
    expected=V.PARTLY,
    name="trainer_converges_all_divergences",
    expected_items=LAD_PRACTICAL_ITEMS,
    # tv_tv (TV stops near 1.7e-2) is a measured effect, pinned by value
    pins={"loss_gap_tv": residual(LAD_SAME_LOSS), **{f"tv_{d}": residual(LAD_CONVERGED_TV) for d in LAD_STRICT}},
)
def lad_practical(seed: int) -> CheckResult:
    """Exact-gradient LAD (eq. 8, expectation under pi_old) from pi_old: does pi reach pi_old e^{A/eta} for all six f?

    Where a run stops elsewhere, compare the exact practical loss there with its value at the target:
    equal losses mean the minimizer is not unique (Lemma 3.2 needs f strictly convex; TV's |x - 1| is not).
    Every strictly convex f must converge and only TV may stop (:func:`lad_practical_verdict`).
    """
    n = lad.practical(seed)
    res = {k[3:]: v for k, v in n.items() if k.startswith("tv_")}
    nonunique = {k[len("loss_gap_") :]: v for k, v in n.items() if k.startswith("loss_gap_")}
    items = lad_practical_items(n)
    extra = "".join(
        f"; {d}: stops at TV {res[d]:.3f} with practical loss equal to the target's within {g:.1e} "
        f"({'a second minimizer: f not strictly convex' if g < LAD_SAME_LOSS else 'not a minimizer'})"
        for d, g in nonunique.items()
    )
    return CheckResult(
        lad_practical_verdict(items),
        "exact-gradient LAD, K=10, 400 Adam steps: TV(pi, pi_old e^{A/eta}) "
        + ", ".join(f"{k} {v:.1e}" for k, v in res.items())
        + extra
        + f" (converged: TV < {LAD_CONVERGED_TV:g})",
        numbers=n,
        figure="fig10_lad_divergences",
        items=items,
    )


FIG1_COLLAPSE_MAX_PI = 0.4  # "collapsed to one arm": the largest arm holds more than 0.4 of the mass


@register_check(
    "lad.fig1.bandit",
    layer="sim",
    expected=V.PARTLY,
    name="bandit_paper_settings",
    slow=True,
    expected_items={"grpo_collapses": False, "lad_recovers_modes": True, "flowrl_only_partly": True},
)
def lad_fig1(seed: int) -> CheckResult:
    """LAD Fig. 1 settings (50 arms, 4000 steps, 32 samples at T=1.5, lr 5e-3, eta=1, 2 refreshes), 2 seeds:
    GRPO+KL(pi_old) collapse (max pi > 0.4)? LAD-JS recovers the three modes (P_pi's mass in each mode's
    +-2 sigma window within 30% of P_A's)? FlowRL (as coded) only partly (TV above LAD's)?

    The collapse criterion cannot be met at these settings (``lad.FIG1_GRPO_MAX_PI_BOUND``): the GRPO
    part is reported as not reproduced *because of the clip*, not as evidence against the paper."""
    n = lad.fig1_bandit(seed)
    tv_g, max_g, tv_l, max_l = n["grpo_tv"], n["grpo_max_pi"], n["lad_js_tv"], n["lad_js_max_pi"]
    tv_f, max_f = n["flowrl_tv"], n["flowrl_max_pi"]
    modes_l = [n[f"lad_mode{i}_ratio"] for i in range(len(lad.MODE_WINDOWS))]
    grpo_collapses = max_g > FIG1_COLLAPSE_MAX_PI
    lad_matches = all(0.7 <= m <= 1.3 for m in modes_l) and max_l < FIG1_COLLAPSE_MAX_PI
    flowrl_partial = tv_f > tv_l
    n_ok = sum((grpo_collapses, lad_matches, flowrl_partial))
    verdict = V.VERIFIED if n_ok == 3 else (V.PARTLY if n_ok else V.REFUTED)
    return CheckResult(
        verdict,
        f"GRPO+KL(pi_old): max pi {max_g:.3f}, TV(P_pi,P_A) {tv_g:.3f} ({'collapsed' if grpo_collapses else 'no collapse'}; "
        f"the 0.2 clip over 3 pi_old phases caps max pi at (1/50)1.2^3 = {n['grpo_max_pi_bound']:.4f} < "
        f"{FIG1_COLLAPSE_MAX_PI}, so collapse cannot show at these settings); "
        f"LAD-JS TV {tv_l:.3f}, mode-mass ratios {', '.join(f'{m:.2f}' for m in modes_l)} ({'three modes recovered' if lad_matches else 'modes not recovered'}); FlowRL as coded TV {tv_f:.3f}, max pi {max_f:.3f}",
        numbers=n,
        figure="fig01_lad_bandit",
        items={
            "grpo_collapses": grpo_collapses,
            "lad_recovers_modes": lad_matches,
            "flowrl_only_partly": flowrl_partial,
        },
    )


#: Smallest effect of interest of the sim toy proxies of LLM-scale claims, in their own units (a pass rate for
#: ``paced.tau_sweep``, a TV distance for ``lad.strict_better``): one percentage point / 0.01.
PROXY_MARGIN = 0.01
#: Family-wise error rate of a proxy's items (Holm over its stochastic items).
PROXY_ALPHA = 0.05
#: Pin tolerance of ``paced.tau_sweep``'s numbers: half its margin. As for ``paced.replay``
#: (:data:`tiltlab.sim.checks.paced_sched.REPLAY_PIN_ATOL`), PACED's selection makes the run bit-reproducible
#: per CPU kernel path only; across the same three paths the numbers moved by at most 0.0018.
TAU_PIN_ATOL = PROXY_MARGIN / 2
TAU_PIN_WHY = (
    "PACED's selection by |p_hat - tau| is bit-reproducible per CPU kernel path only; spread measured across "
    "DEFAULT and AVX2 (AMD EPYC) and the earlier pinning machine: at most 0.0018 (docs/pins.md)"
)


def proxy_items(decision: stats.Decision) -> dict[str, bool]:
    """Per-item outcomes of a proxy decision as booleans: ``<item>_supports`` and ``<item>_against``."""
    out = {}
    for name, it in decision.items.items():
        out[f"{name}_supports"] = it.outcome == stats.SUPPORTS
        out[f"{name}_against"] = it.outcome == stats.AGAINST
    return out


def describe(decision: stats.Decision, digits: int = 3) -> str:
    return "; ".join(
        f"{name} {it.mean:+.{digits}f} [{it.lo:+.{digits}f}, {it.hi:+.{digits}f}] p={it.p:.2g} -> {it.outcome}"
        for name, it in decision.items.items()
    )


def strict_better_verdict(diffs: list[float], exact_gap: float) -> tuple[V, stats.Decision, str]:
    """The ``lad.strict_better`` proxy rule at :data:`PROXY_MARGIN`: the sampled per-seed gaps by
    :func:`stats.decide` (the only stochastic item: no multiplicity to correct), the deterministic exact gap
    by its value (above +margin supports, below -margin against, else undecided), then
    :func:`stats.aggregate` over the two. Returns the verdict, the sampled decision and the exact outcome."""
    if not math.isfinite(exact_gap):
        raise ValueError(f"exact_gap must be finite, got {exact_gap}")
    dec = stats.decide({"sampled": diffs}, PROXY_MARGIN, "greater", PROXY_ALPHA, exact={"exact": exact_gap})
    return V(dec.verdict), dec, dec.items["exact"].outcome


@register_check(
    "lad.strict_better",
    layer="sim",
    expected=V.REFUTED,
    name="bandit_final_distance",
    slow=True,
    expected_items={
        "sampled_supports": False,
        "sampled_against": True,
        "exact_supports": False,
        "exact_against": True,
        "divergences_differ": True,
    },
)
def lad_strict_better(seed: int) -> CheckResult:
    """Toy proxy of LAD §4.3: final TV(P_pi, P_A) per divergence on the LAD bandit, exact-gradient (one
    deterministic run) and sampled (Fig. 1 settings, paired seeds), judged by :func:`strict_better_verdict`
    whichever way it points. LAD's claim is about held-out accuracy of 7B models; a bandit's distance to
    its own target measures optimization, not generalization: a toy verdict."""
    r = lad.strict_better(seed)
    n = r["numbers"]
    verdict, dec, exact = strict_better_verdict(r["diffs"], n["exact_gap"])
    it = dec.items["sampled"]
    per = ", ".join(f"{d} {n[f'sampled_tv_{d}']:.3f}" for d in lad.F_DIVERGENCES if f"sampled_tv_{d}" in n)
    return CheckResult(
        verdict,
        "TOY PROXY (bandit distance to the target, not accuracy): gap = mean final TV(P_pi, P_A) of non-strict "
        f"(KL,rKL,JF) minus strict (TV,HD,JS), + = strict closer; sampled ({n['sampled_pairs']} paired seeds) "
        f"{it.mean:+.3f} [{it.lo:+.3f}, {it.hi:+.3f}] -> {it.outcome}; exact-gradient {n['exact_gap']:+.4f} -> {exact} "
        f"(margin {PROXY_MARGIN}); sampled per divergence: {per}",
        numbers=n,
        figure="fig10_lad_divergences",
        items={
            "sampled_supports": it.outcome == stats.SUPPORTS,
            "sampled_against": it.outcome == stats.AGAINST,
            "exact_supports": exact == stats.SUPPORTS,
            "exact_against": exact == stats.AGAINST,
            "divergences_differ": all(n[f"sampled_tv_{d}"] != n[f"sampled_tv_{lad.DIVS[0]}"] for d in lad.DIVS[1:]),
        },
        evidence=dec.judgement.evidence(),
    )


@register_check("lad.thmB1", layer="sim", expected=V.VERIFIED, name="gap_order")
def lad_thm_b1(seed: int) -> CheckResult:
    """Exact |L_theorem - L_LAD| against gamma + delta; fitted log-log order per divergence (>= 1 means O(gamma + delta))."""
    n = lad.thm_b1(seed)["numbers"]
    order = {k[len("order_") :]: v for k, v in n.items()}
    ok = all(v > 0.95 for v in order.values())  # an O(eps) bound allows order >= 1; 0.05 slack for the fit
    return CheckResult(
        V.VERIFIED if ok else V.REFUTED,
        "gap order in gamma+delta: "
        + ", ".join(f"{k} {v:.2f}" for k, v in order.items())
        + " (order 2 where f'(1)=0: Jeffreys, Hellinger, JS)",
        numbers=n,
        figure="fig10_lad_divergences",
    )


def tau_sweep_verdict(diffs: dict[str, list[float]]) -> tuple[V, stats.Decision]:
    """The ``paced.tau_sweep`` proxy rule: :func:`stats.decide` over the three items at :data:`PROXY_MARGIN`
    (Holm, paper's direction positive) with the default aggregation, whichever way they point."""
    d = stats.decide(diffs, PROXY_MARGIN, "greater", PROXY_ALPHA)
    return V(d.verdict), d


TAU_ITEMS = ("tau05_best", "tau01_worst", "tau09_fast_start")


def tau_ran_items(sweep: dict) -> dict[str, bool]:
    """ "It ran" items: every tau's policy moved (final pass rate differs from the start on every seed) and
    tau changed the outcome (some two taus end apart on some seed)."""
    finals = [sweep[str(t)]["acc_per_seed"][-1] for t in paced.TAUS]
    starts = [sweep[str(t)]["acc_per_seed"][0] for t in paced.TAUS]
    return {
        "every_tau_trained": all(f != s for fs, ss in zip(finals, starts) for f, s in zip(fs, ss)),
        "taus_differ": any(fs != finals[0] for fs in finals[1:]),
    }


@register_check(
    "paced.tau_sweep",
    layer="sim",
    expected=V.REFUTED,
    name="toy_proxy",
    expected_items={
        "tau05_best_supports": False,
        "tau05_best_against": False,
        "tau01_worst_supports": False,
        "tau01_worst_against": True,
        "tau09_fast_start_supports": False,
        "tau09_fast_start_against": True,
        "every_tau_trained": True,
        "taus_differ": True,
    },
    pins={"*": stochastic(TAU_PIN_ATOL, TAU_PIN_WHY)},
)
def paced_tau_sweep(seed: int) -> CheckResult:
    """Toy proxy of PACED Fig. 4: PACED (DISA-initialised log Z) on 64 tabular prompts, tau in {0.1..0.9},
    judged by :func:`tau_sweep_verdict` whichever way it points: the paper's metric is held-out accuracy,
    tabular prompts do not generalize, so this is a toy verdict (the llm layer decides at scale)."""
    claim = paced.tau_claim(seed)
    nums, sweep = claim["numbers"], claim["sweep"]
    final = {t: nums[f"acc_tau{t}"] for t in paced.TAUS}
    verdict, dec = tau_sweep_verdict(claim["diffs"])
    return CheckResult(
        verdict,
        f"TOY PROXY (training pass rate of tabular prompts, no held-out split): {paced.TAU_CLAIM['steps']} steps, "
        f"{nums['pairs']} paired seeds, final mean pass rate "
        + ", ".join(f"tau={t} {v:.3f}" for t, v in final.items())
        + f"; paired items (margin {PROXY_MARGIN}, Holm): "
        + describe(dec),
        numbers=nums,
        figure="fig08_paced",
        items=proxy_items(dec) | tau_ran_items(sweep),
        evidence=dec.judgement.evidence(),
    )
