"""Sim checks whose verdicts rest on statistics over seeds (``tiltlab.claims.stats``): each rule at its
margin's boundaries, and a no-op and a NaN variant of each check failing."""

from __future__ import annotations

import math

import pytest
import torch

import tiltlab.sim.checks.estimators as est_checks
import tiltlab.sim.checks.paced_sched as paced_checks
import tiltlab.sim.checks.text_claims as text_checks
import tiltlab.sim.checks.training as training_checks
from tiltlab.claims import stats
from tiltlab.claims.registry import Verdict, checks, run_one
from tiltlab.paper_checks.catalog import discover
from tiltlab.sim import envs
from tiltlab.sim import train as train_mod
from tiltlab.sim.config import SimConfig
from tiltlab.sim.experiments import fpa_entanglement, lad, paced
from tiltlab.sim.token_tree import TokenTree
from tiltlab.sim.train import train

V = Verdict
discover()

#: per-seed differences with spread; shifted so that an interval end sits where a test wants it
BASE = [0.012, -0.004, 0.021, 0.007, 0.015, -0.009, 0.011, 0.018, 0.002, 0.009, 0.013, -0.001]


def with_lo_at(target: float, base=BASE) -> list[float]:
    """``base`` shifted so that its 95% t interval's lower end is ``target``."""
    _, lo, _ = stats.paired_t_ci(base)
    return [v + target - lo for v in base]


def the_check(claim: str):
    (chk,) = [c for c in checks() if c.claim_id == claim and c.layer == "sim"]
    return chk


@pytest.fixture
def fresh_cache():
    """The experiments are cached per process: clear before and after a test that patches what they call."""
    paced.replay.cache_clear()
    yield
    paced.replay.cache_clear()


# ----------------------------------------------------------------------------- replace-mode bookkeeping
def _trainer(**kw) -> train_mod._Trainer:
    cfg = dict(env="multiprompt", P=5, K=4, method="tb", anchor="old", log_z="learned", G=3, seeds=2, select_m=3)
    cfg.update(kw)
    c = SimConfig(**cfg)
    c.validate()
    return train_mod._Trainer(c, envs.make_multiprompt(P=5, K=4, seed=0))


def naive_kept(sel: torch.Tensor, n_drop: list[int], G: int) -> torch.Tensor:
    S, P = sel.shape
    keep = torch.zeros(S, P, G, dtype=torch.float64)
    for s in range(S):
        slots = [(p, g) for g in reversed(range(G)) for p in range(P) if sel[s, p] > 0]  # drop order
        for p, g in slots[n_drop[s] :]:
            keep[s, p, g] = 1.0
    return keep


@pytest.mark.parametrize("n_drop", [[0, 0], [1, 4], [3, 9], [5, 2]])
def test_fresh_kept_matches_naive_drop_order(n_drop):
    tr = _trainer()
    sel = torch.tensor([[1, 0, 1, 1, 0], [0, 1, 1, 0, 1]], dtype=torch.float64)
    got = tr.fresh_kept(sel, torch.tensor(n_drop))
    assert torch.equal(got, naive_kept(sel, n_drop, 3))
    assert torch.equal(got.sum((1, 2)), torch.tensor([9.0 - n_drop[0], 9.0 - n_drop[1]]))  # 3 selected x G = 3


def _replay_run(mode: str, capacity: int = 8) -> train_mod.RunResult:
    cfg = paced.replay_config(seed=3, seeds=3) | dict(
        steps=12, paced_replay=True, paced_replay_mode=mode, paced_replay_capacity=capacity
    )
    return train(SimConfig(**cfg), envs.make_multiprompt(P=32, K=16, seed=0))


def test_replace_mode_keeps_the_sample_terms_of_an_update_equal():
    none = train(SimConfig(**paced.replay_config(seed=3, seeds=3) | dict(steps=12)), envs.make_multiprompt(P=32, K=16))
    rep, add = _replay_run("replace"), _replay_run("add")
    budget = 8 * 8  # select_m * G
    assert torch.equal(none.extra["update_terms"], torch.full((12, 3), budget))
    assert torch.equal(rep.extra["update_terms"], none.extra["update_terms"])
    # buffer entries were used (empty at step 1, then full: capacity 8 <= 16 pushed per step)
    assert rep.extra["replay_terms"][0].sum() == 0 and bool((rep.extra["replay_terms"][1:] == 8).all())
    # adding them instead makes every later update larger by the replayed count
    assert torch.equal(add.extra["update_terms"] - add.extra["replay_terms"], none.extra["update_terms"])
    assert bool((add.extra["update_terms"][1:] > budget).all())


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(paced_replay_mode="swap"), "replay_mode"),
        (dict(paced_replay=True, paced_replay_mode="replace", paced_replay_capacity=65), "replay_capacity <= select_m"),
        (dict(paced_replay=True, paced_replay_mode="replace", exact=True, G=1), "sampled batches"),
    ],
)
def test_replay_mode_validation(kw, match):
    cfg = paced.replay_config(seed=0, seeds=1) | kw
    with pytest.raises(ValueError, match=match):
        SimConfig(**cfg).validate()


# ----------------------------------------------------------------------------- paced.replay rule
def _replay_numbers(equal: bool = True) -> dict:
    return {"equal_terms_replace": equal, "replayed_per_step_replace": 30.0, "seeds_differing_replace": 20}


@pytest.mark.parametrize(
    "lo, want",
    [
        (paced_checks.REPLAY_MARGIN + 1e-6, V.VERIFIED),  # just outside the margin, paper's direction
        (paced_checks.REPLAY_MARGIN - 1e-6, V.INCONCLUSIVE),  # just inside
        (0.0, V.INCONCLUSIVE),
    ],
)
def test_replay_rule_at_the_margin(lo, want):
    verdict, d = paced_checks.replay_verdict(_replay_numbers(), with_lo_at(lo))
    assert verdict == want
    assert d.items["final_pass_rate"].lo == pytest.approx(lo, abs=1e-12)


@pytest.mark.parametrize("hi_offset, want", [(1e-6, V.REFUTED), (-1e-6, V.INCONCLUSIVE)])
def test_replay_rule_refutes_only_beyond_the_margin(hi_offset, want):
    """Upper end just below -margin: refuted; just above it (still entirely < 0): inconclusive."""
    diffs = [-v for v in with_lo_at(paced_checks.REPLAY_MARGIN + hi_offset)]
    assert stats.paired_t_ci(diffs)[2] < 0
    assert paced_checks.replay_verdict(_replay_numbers(), diffs)[0] == want


def test_replay_rule_is_inconclusive_at_unequal_update_counts():
    big = with_lo_at(0.5)
    assert paced_checks.replay_verdict(_replay_numbers(), big)[0] == V.VERIFIED
    assert paced_checks.replay_verdict(_replay_numbers(equal=False), big)[0] == V.INCONCLUSIVE


def test_replay_check_with_replay_added_is_not_ok(monkeypatch, fresh_cache):
    """The old comparison (replay added on top of the batch) is caught: unequal terms per step."""
    monkeypatch.setitem(paced.REPLAY_ARMS, "replace", dict(paced_replay=True, paced_replay_mode="add"))
    out = run_one(the_check("paced.replay"))
    assert out.result is not None and out.result.verdict == V.INCONCLUSIVE
    assert out.item_changes == {"equal_update_terms": (True, False)} and not out.ok


def test_replay_check_noop_variant_fails(monkeypatch, fresh_cache):
    """A replay that never fills its buffer: identical arms, the same (inconclusive) verdict, but not ok."""
    monkeypatch.setattr(train_mod._Trainer, "push_replay", lambda self, b, sel, p_hat: None)
    out = run_one(the_check("paced.replay"))
    assert out.result is not None and out.result.verdict == the_check("paced.replay").expected
    assert out.result.numbers["diff_replace"] == 0.0
    assert out.item_changes == {"replay_used": (True, False), "arms_differ": (True, False)}
    assert not out.ok


def test_replay_check_nan_variant_fails(monkeypatch, fresh_cache):
    """Final pass rates that come out NaN: the check errors (stats refuses non-finite differences)."""
    real = envs.BanditEnv.pass_rate
    monkeypatch.setattr(envs.BanditEnv, "pass_rate", lambda self, logp=None: real(self, logp) * math.nan)
    out = run_one(the_check("paced.replay"))
    assert out.result is None and "finite" in out.error and not out.ok


def test_replay_numbers_are_finite_and_pin_the_pairing():
    r = paced.replay(0)
    n = r["numbers"]
    assert all(math.isfinite(float(v)) for v in n.values())
    assert len(r["diffs"]) == n["pairs"] == paced.REPLAY_SEEDS
    assert n["diff_replace"] == pytest.approx(n["final_replace"] - n["final_none"], abs=1e-12)
    m, lo, hi = stats.paired_t_ci(r["diffs"])
    assert (n["diff_replace"], n["diff_replace_lo"], n["diff_replace_hi"]) == (m, lo, hi)


# ----------------------------------------------------------------------------- proxies: one rule either way
def strong(sign: float = 1.0) -> list[float]:
    return [sign * (0.3 + v) for v in BASE]


@pytest.mark.parametrize("offset, want", [(1e-6, V.VERIFIED), (-1e-6, V.PARTLY)])
def test_tau_rule_holm_boundary(offset, want):
    """Two items with p ~ 0: Holm lets the third face alpha itself, i.e. its own 95% interval against the margin."""
    diffs = {
        "tau05_best": strong(),
        "tau01_worst": strong(),
        "tau09_fast_start": with_lo_at(training_checks.PROXY_MARGIN + offset),
    }
    verdict, dec = training_checks.tau_sweep_verdict(diffs)
    assert verdict == want
    assert dec.items["tau09_fast_start"].outcome == (stats.SUPPORTS if offset > 0 else stats.UNDECIDED)


def test_tau_rule_holm_is_stricter_than_per_item_intervals():
    """Three items each just beyond the margin on their own 95% interval: none survives Holm."""
    just = with_lo_at(training_checks.PROXY_MARGIN + 1e-4)
    assert stats.decide({"a": just}, training_checks.PROXY_MARGIN).verdict == "verified"
    verdict, _ = training_checks.tau_sweep_verdict(dict.fromkeys(training_checks.TAU_ITEMS, just))
    assert verdict == V.INCONCLUSIVE


@pytest.mark.parametrize(
    "items, want",
    [
        ((1, 1, 1), V.VERIFIED),
        ((-1, -1, -1), V.REFUTED),
        ((0, -1, -1), V.REFUTED),  # the measured pattern
        ((1, 0, -1), V.PARTLY),
        ((0, 0, 0), V.INCONCLUSIVE),
    ],
)
def test_tau_rule_treats_both_directions_alike(items, want):
    within = [v * 0.1 for v in BASE]  # mean 0.0007, 95% interval inside (-0.01, 0.01): undecided
    pick = {1: strong(), -1: strong(-1.0), 0: within}
    diffs = dict(zip(training_checks.TAU_ITEMS, (pick[i] for i in items)))
    assert training_checks.tau_sweep_verdict(diffs)[0] == want


def test_tau_rule_against_needs_the_margin():
    """Clearly below 0 but not below -margin: undecided, not against."""
    d = [-(0.005 + 0.0002 * i) for i in range(20)]
    assert stats.paired_t_ci(d)[2] < 0
    verdict, dec = training_checks.tau_sweep_verdict(dict.fromkeys(training_checks.TAU_ITEMS, d))
    assert verdict == V.INCONCLUSIVE and {it.outcome for it in dec.items.values()} == {stats.UNDECIDED}


@pytest.fixture
def fresh_tau_cache():
    paced.tau_sweep.cache_clear()
    paced.tau_claim.cache_clear()
    yield
    paced.tau_sweep.cache_clear()
    paced.tau_claim.cache_clear()


def test_tau_check_returns_its_expected_verdict(fresh_tau_cache):
    out = run_one(the_check("paced.tau_sweep"))
    assert out.ok, (out.verdict, out.item_changes, out.error)
    n = out.result.numbers
    assert all(math.isfinite(float(v)) for v in n.values())
    r = paced.tau_claim(0)
    for name, d in r["diffs"].items():
        assert len(d) == n["pairs"] == paced.TAU_CLAIM["seeds"]
        assert (n[name], n[f"{name}_lo"], n[f"{name}_hi"]) == stats.paired_t_ci(d)
    # the per-seed history averages to the recorded mean curve
    sw = r["sweep"]["0.5"]
    per_seed = torch.tensor(sw["acc_per_seed"])
    assert torch.allclose(per_seed.mean(1), torch.tensor(sw["acc"], dtype=per_seed.dtype), atol=1e-12)


def test_tau_items_pinned_against_naive():
    sweep = {
        str(t): {"step": [0, 35, 150], "acc_per_seed": [[0.1, 0.1], [0.2 + t, 0.3 + t], [t, 2 * t]]} for t in paced.TAUS
    }
    it = paced.tau_items(sweep)
    f = {t: (t, 2 * t) for t in paced.TAUS}
    e = {t: (0.2 + t, 0.3 + t) for t in paced.TAUS}
    for s in range(2):
        assert it["tau05_best"][s] == pytest.approx(f[0.5][s] - (f[0.1][s] + f[0.9][s]) / 2)
        assert it["tau01_worst"][s] == pytest.approx(sum(f[t][s] for t in (0.3, 0.5, 0.7, 0.9)) / 4 - f[0.1][s])
        assert it["tau09_fast_start"][s] == pytest.approx(e[0.9][s] - sum(e[t][s] for t in (0.1, 0.3, 0.5, 0.7)) / 4)
    with pytest.raises(ValueError, match="early_step"):
        paced.tau_items(sweep, early_step=36)


def test_tau_check_noop_variant_fails(monkeypatch, fresh_tau_cache):
    """Selection that ignores tau: every tau trains alike; the verdict moves and the it-ran item fails."""
    real = train_mod.paced_obj.select_prompts
    monkeypatch.setattr(train_mod.paced_obj, "select_prompts", lambda p, *, tau, m: real(p, tau=0.5, m=m))
    out = run_one(the_check("paced.tau_sweep"))
    assert out.result is not None and out.result.items["taus_differ"] is False
    assert out.verdict == "inconclusive" and not out.ok


def test_tau_check_nan_variant_fails(monkeypatch, fresh_tau_cache):
    real = envs.BanditEnv.expectation
    monkeypatch.setattr(envs.BanditEnv, "expectation", lambda self, logp, values: real(self, logp, values) * math.nan)
    out = run_one(the_check("paced.tau_sweep"))
    assert out.result is None and "finite" in out.error and not out.ok


# ----------------------------------------------------------------------------- lad.strict_better
@pytest.mark.parametrize(
    "lo, exact, want",
    [
        (training_checks.PROXY_MARGIN + 1e-6, training_checks.PROXY_MARGIN + 1e-6, V.VERIFIED),
        (training_checks.PROXY_MARGIN - 1e-6, training_checks.PROXY_MARGIN + 1e-6, V.PARTLY),
        (training_checks.PROXY_MARGIN + 1e-6, training_checks.PROXY_MARGIN, V.PARTLY),  # exact at the margin
        (training_checks.PROXY_MARGIN - 1e-6, -training_checks.PROXY_MARGIN - 1e-6, V.REFUTED),
        (training_checks.PROXY_MARGIN - 1e-6, -training_checks.PROXY_MARGIN, V.INCONCLUSIVE),
    ],
)
def test_strict_better_rule_boundaries(lo, exact, want):
    assert training_checks.strict_better_verdict(with_lo_at(lo), exact)[0] == want


def test_strict_better_rule_sampled_against():
    diffs = [-v for v in with_lo_at(training_checks.PROXY_MARGIN + 1e-6)]  # upper end just below -margin
    verdict, dec, exact = training_checks.strict_better_verdict(diffs, 0.0)
    assert (verdict, dec.items["sampled"].outcome, exact) == (V.REFUTED, stats.AGAINST, stats.UNDECIDED)
    diffs = [-v for v in with_lo_at(training_checks.PROXY_MARGIN - 1e-6)]
    assert training_checks.strict_better_verdict(diffs, 0.0)[0] == V.INCONCLUSIVE


def _fake_strict(tv_per_div: dict, exact_gap: float, diffs: list[float]) -> dict:
    n = {f"sampled_tv_{d}": v for d, v in tv_per_div.items()}
    m, lo, hi = stats.paired_t_ci(diffs) if all(math.isfinite(v) for v in diffs) else (math.nan,) * 3
    n |= {"sampled_pairs": len(diffs), "exact_gap": exact_gap, "sampled_gap": m, "sampled_gap_lo": lo}
    n |= {"sampled_gap_hi": hi}
    return {"numbers": n, "diffs": diffs}


def test_strict_better_check_noop_and_nan_variants_fail(monkeypatch):
    chk = the_check("lad.strict_better")
    # a sweep whose divergence setting does nothing: every divergence ends at the same TV, gaps exactly 0
    same = dict.fromkeys(lad.DIVS, 0.2)
    monkeypatch.setattr(training_checks.lad, "strict_better", lambda seed: _fake_strict(same, 0.0, [0.0] * 20))
    out = run_one(chk)
    assert out.result is not None and out.result.items["divergences_differ"] is False and not out.ok
    # NaN gaps (sampled or exact): the check errors
    moved = {d: 0.1 + 0.01 * i for i, d in enumerate(lad.DIVS)}
    monkeypatch.setattr(training_checks.lad, "strict_better", lambda seed: _fake_strict(moved, 0.0, [math.nan] * 20))
    out = run_one(chk)
    assert out.result is None and "finite" in out.error and not out.ok
    monkeypatch.setattr(training_checks.lad, "strict_better", lambda seed: _fake_strict(moved, math.nan, BASE))
    out = run_one(chk)
    assert out.result is None and "finite" in out.error and not out.ok


# ----------------------------------------------------------------------------- disa.d3.m_study: no partly from the decrease
def _m_numbers(v_ratio: float, b_ratio: float, monotone: bool = True) -> dict:
    return {
        "var_slope_before": -0.8,
        "var_slope_after": -0.8 * v_ratio,
        "bias_slope_before": -0.75,
        "bias_slope_after": -0.75 * b_ratio,
        "var_monotone": monotone,
        "bias_monotone": monotone,
    }


def test_knee_outcome_exactly_at_the_margin_is_undecided():
    assert est_checks.knee_outcome(-1.0, -0.4) == stats.UNDECIDED  # 0.5 - 0.1 == 0.4 in float64
    assert est_checks.knee_outcome(-1.0, -0.6) == stats.UNDECIDED


def test_m_study_needs_both_curves_to_decrease():
    for k in ("var_monotone", "bias_monotone"):
        assert est_checks.m_study_verdict(_m_numbers(0.2, 0.2) | {k: False})[0] == V.REFUTED


@pytest.mark.parametrize(
    "ratio, want",
    [
        (0.4 - 1e-9, stats.SUPPORTS),
        (0.4 + 1e-9, stats.UNDECIDED),
        (0.6 - 1e-9, stats.UNDECIDED),
        (0.6 + 1e-9, stats.AGAINST),
    ],
)
def test_knee_outcome_at_the_margin(ratio, want):
    assert est_checks.knee_outcome(-1.0, -ratio) == want
    assert est_checks.knee_outcome(2.0, 2.0 * ratio) == want  # sign-free: |slope| ratios


@pytest.mark.parametrize(
    "v, b, monotone, want",
    [
        (0.2, 0.2, True, V.VERIFIED),
        (0.2, 1.2, True, V.PARTLY),
        (1.2, 1.8, True, V.REFUTED),  # the measured pattern (ratios 1.22 and 1.78)
        (0.5, 0.5, True, V.INCONCLUSIVE),
        (0.5, 1.2, True, V.REFUTED),
        (0.2, 0.2, False, V.REFUTED),  # a curve that does not decrease
    ],
)
def test_m_study_verdict(v, b, monotone, want):
    """The decrease (true by construction) alone never gives partly: the old rule said partly for (1.2, 1.8)."""
    assert est_checks.m_study_verdict(_m_numbers(v, b, monotone))[0] == want


def test_m_study_check_noop_and_nan_variants_fail(monkeypatch):
    chk = the_check("disa.d3.m_study")
    real = est_checks.labels.m_study_claim(0)
    # labels that ignore M: flat curves, zero slopes -> not a decrease, and no ratio to form
    flat = dict(real["numbers"]) | _m_numbers(0.0, 0.0, monotone=False) | {"var_slope_before": 0.0}
    monkeypatch.setattr(est_checks.labels, "m_study_claim", lambda seed: {"numbers": flat})
    out = run_one(chk)
    assert out.result is None and "slope_before != 0" in out.error and not out.ok
    nan = dict(real["numbers"]) | {"bias_slope_after": math.nan}
    monkeypatch.setattr(est_checks.labels, "m_study_claim", lambda seed: {"numbers": nan})
    out = run_one(chk)
    assert out.result is None and "finite" in out.error and not out.ok


# ----------------------------------------------------------------------------- lad.b3.proof_constant: formula not counted
def _b3(ratio: float, base: float = 0.14) -> dict:
    return {"N4_measured_constant": base, "N1024_measured_constant": base * ratio}


@pytest.mark.parametrize(
    "ratio, want",
    [(0.9 - 1e-9, V.VERIFIED), (0.9 + 1e-9, V.INCONCLUSIVE), (1.1 - 1e-9, V.INCONCLUSIVE), (1.1 + 1e-9, V.PARTLY)],
)
def test_b3_rule_at_the_margin(ratio, want):
    assert text_checks.b3_verdict(_b3(ratio)) == want


def test_b3_rule_exactly_at_the_margin_is_inconclusive():
    assert text_checks.b3_verdict(_b3(0.9, base=1.0)) == V.INCONCLUSIVE  # 1 - 0.1 == 0.9 in float64
    assert text_checks.b3_verdict(_b3(1.1, base=1.0)) == V.INCONCLUSIVE


def test_b3_check_noop_and_nan_variants_fail(monkeypatch):
    chk = the_check("lad.b3.proof_constant")
    real = text_checks.proof_constant(0)
    # a gap that is identically zero (the surrogate equals the theorem's loss): no constant to compare
    zero = real | {f"N{N}_measured_constant": 0.0 for N in text_checks.B3_SIZES}
    monkeypatch.setattr(text_checks, "proof_constant", lambda seed: dict(zero))
    out = run_one(chk)
    assert out.result is None and "C_meas(4) > 0" in out.error and not out.ok
    nan = real | {"N1024_measured_constant": math.nan}
    monkeypatch.setattr(text_checks, "proof_constant", lambda seed: dict(nan))
    out = run_one(chk)
    assert out.result is None and "finite" in out.error and not out.ok
    # the old rule's partly came from the formula item alone: a measured constant that stays put is not partly
    flat = real | {"N1024_measured_constant": real["N4_measured_constant"]}
    monkeypatch.setattr(text_checks, "proof_constant", lambda seed: dict(flat))
    out = run_one(chk)
    assert out.result.items["proof_constant_grows"] and out.verdict == "inconclusive" and not out.ok


# ----------------------------------------------------------------------------- fpa.entanglement / fpa.fig3
def _fake_runs(S: int = 3) -> dict:
    import numpy as np

    rng = np.random.default_rng(0)
    mk = lambda: {"corr": rng.normal(size=(3, S)), "acc": rng.uniform(size=(3, S)), "ref_acc": np.full(S, 0.3)}
    runs = {k: mk() for k in ("offrl", "fpa1", "fpa2", "fpa10", "cor_only", "inc_only")}  # 3 evaluations
    for k in runs:
        runs[k]["ref_acc"] = runs["offrl"]["ref_acc"]
    return runs


def test_entanglement_paired_items_pinned_against_naive():
    runs = _fake_runs()
    it = fpa_entanglement.paired_items(runs)
    c = {k: runs[k]["corr"][-1] for k in runs}
    a = {k: runs[k]["acc"][-1] for k in runs}
    for s in range(3):
        assert it["offrl_lowers_correct"][s] == -c["offrl"][s]
        assert it["fpa2_keeps_correct"][s] == pytest.approx(c["fpa2"][s] - 0.5 * c["offrl"][s])
        assert it["cor_only_faster"][s] == pytest.approx(c["offrl"][s] - c["cor_only"][s])
        assert it["fpa10_not_below_0"][s] == pytest.approx(a["fpa10"][s] - a["offrl"][s])
        assert it["offrl_below_start"][s] == pytest.approx(0.3 - a["offrl"][s])
        assert it["cor_only_below_start"][s] == pytest.approx(0.3 - a["cor_only"][s])
        assert it["fpa1_keeps_correct"][s] == pytest.approx(c["fpa1"][s] - 0.5 * c["offrl"][s])
        assert it["lam12_minus_10"][s] == pytest.approx((a["fpa1"][s] + a["fpa2"][s]) / 2 - a["fpa10"][s])
    assert "fpa10_not_below_0" in it and "inc_only_not_below_0" not in it


@pytest.mark.parametrize("offset, want", [(1e-6, V.VERIFIED), (-1e-6, V.INCONCLUSIVE)])
def test_collapse_rule_at_the_margin(offset, want):
    assert text_checks.collapse_verdict(with_lo_at(text_checks.COLLAPSE_MARGIN + offset))[0] == want
    mirrored = [-v for v in with_lo_at(text_checks.COLLAPSE_MARGIN + offset)]
    assert text_checks.collapse_verdict(mirrored)[0] == (V.REFUTED if offset > 0 else V.INCONCLUSIVE)


@pytest.fixture
def fresh_fpa_cache():
    fpa_entanglement.train.cache_clear()
    fpa_entanglement.entanglement_claim.cache_clear()
    yield
    fpa_entanglement.train.cache_clear()
    fpa_entanglement.entanglement_claim.cache_clear()


def test_entanglement_and_collapse_noop_variant_fails(monkeypatch, fresh_fpa_cache):
    """No training at all (lr 0): nothing moves; both checks leave their expected state."""
    import dataclasses

    monkeypatch.setattr(fpa_entanglement, "CLAIM_CONFIG", dataclasses.replace(fpa_entanglement.CLAIM_CONFIG, lr=0.0))
    ent = run_one(the_check("fpa.entanglement"))
    assert ent.verdict == "refuted" and not ent.result.items["fpa_moves"] and not ent.ok
    col = run_one(the_check("fpa.fig3.offrl_collapse"))
    assert col.result.numbers["d_offrl_below_start"] == 0.0 and col.verdict == "inconclusive"
    assert col.item_changes == {"offrl_trained": (True, False)} and not col.ok


def test_entanglement_and_collapse_nan_variant_fails(monkeypatch, fresh_fpa_cache):
    real = TokenTree.pass_rate
    monkeypatch.setattr(TokenTree, "pass_rate", lambda self, *a, **k: real(self, *a, **k) * math.nan)
    for claim in ("fpa.entanglement", "fpa.fig3.offrl_collapse"):
        out = run_one(the_check(claim))
        assert out.result is None and "finite" in out.error and not out.ok, claim
