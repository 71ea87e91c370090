"""Pass rules that pin what they measure: each changed rule fails on the broken math it used to let
through (the old rule's verdict on the same broken run is shown next to the new one), and the
checks of the claims registered from the papers' text return their recorded verdicts and items."""

from __future__ import annotations

import pytest
import torch

import tiltlab.sim.checks.estimators as est_checks
import tiltlab.sim.checks.fpa as fpa_checks
import tiltlab.sim.checks.text_claims as text_checks
import tiltlab.sim.checks.training as training_checks
from tiltlab.claims.registry import Verdict, checks, run_one
from tiltlab.objectives.offline import dpo_loss, fpa_loss
from tiltlab.objectives.output import LossOutput
from tiltlab.paper_checks.catalog import discover
from tiltlab.sim.experiments import fpa_entanglement, lad
from tiltlab.sim.token_tree import ragged_mask

V = Verdict
discover()


# ----------------------------------------------------------------------------- lad.practical
def _lad_numbers(converged: set[str], tv_gap: float = 1e-17) -> dict:
    n = {f"tv_{d}": (1e-10 if d in converged else 0.02) for d in (*training_checks.LAD_STRICT, "tv")}
    if "tv" not in converged:
        n["loss_gap_tv"] = tv_gap
    return n


def _old_lad_rule(n: dict) -> V:
    """The rule before: verified if all six converge, partly if any one does."""
    ok = sum(v < 1e-3 for k, v in n.items() if k.startswith("tv_"))
    return V.VERIFIED if ok == 6 else (V.PARTLY if ok else V.REFUTED)


def test_lad_practical_rule_refutes_when_strictly_convex_f_stop():
    # the measured pattern: the five strictly convex f converge, TV stops at a second minimizer
    good = _lad_numbers(set(training_checks.LAD_STRICT))
    items = training_checks.lad_practical_items(good)
    assert items == training_checks.LAD_PRACTICAL_ITEMS
    assert training_checks.lad_practical_verdict(items) == V.PARTLY
    # broken math: 5 of 6 divergences stop converging (only KL converges) -- the old rule said "partly"
    broken = _lad_numbers({"kl"})
    assert _old_lad_rule(broken) == V.PARTLY
    assert training_checks.lad_practical_verdict(training_checks.lad_practical_items(broken)) == V.REFUTED
    # TV stopping somewhere that is not a minimizer (loss above the target's) is refuted too
    not_min = _lad_numbers(set(training_checks.LAD_STRICT), tv_gap=0.1)
    assert training_checks.lad_practical_verdict(training_checks.lad_practical_items(not_min)) == V.REFUTED


def test_lad_practical_check_fails_when_one_divergence_breaks(monkeypatch):
    """The registered check on a run where Hellinger stops short: not ok (old rule: partly, ok)."""
    (chk,) = [c for c in checks() if c.claim_id == "lad.practical" and c.layer == "sim"]
    broken = _lad_numbers(set(training_checks.LAD_STRICT) - {"hellinger"})
    monkeypatch.setattr(training_checks.lad, "practical", lambda seed: dict(broken))
    out = run_one(chk)
    assert _old_lad_rule(broken) == V.PARTLY == chk.expected  # would have passed
    assert out.verdict == "refuted" and not out.ok


# ----------------------------------------------------------------------------- fpa.entanglement
def test_entanglement_refutes_an_fpa_that_stopped_learning(monkeypatch):
    """Broken math: FPA's loss has no gradient (it 'keeps' every log-prob by standing still). The old
    rule counted 3 of 4 parts and said partly (= expected, green); the new rule refutes."""
    monkeypatch.setattr(fpa_entanglement, "fpa_loss", lambda *a: LossOutput(0.0 * fpa_loss(*a).loss))
    fpa_entanglement.train.cache_clear()
    fpa_entanglement.entanglement_claim.cache_clear()
    try:
        claim = fpa_entanglement.entanglement_claim(0)
        n = claim["numbers"]
        parts = claim["summary"]["parts"]
        old = sum(parts.values())
        assert old >= 2  # the old rule: partly whenever >= 2 of the 4 parts hold
        assert not n["fpa_moves"] and not n["fpa_raises_acc"]
        res = fpa_checks.entanglement(0)
        assert res.verdict == V.REFUTED
    finally:
        fpa_entanglement.train.cache_clear()
        fpa_entanglement.entanglement_claim.cache_clear()


def test_entanglement_verdict_rule():
    strong = [1.0 + 0.01 * i for i in range(10)]  # every item far beyond its margin
    diffs = dict.fromkeys(fpa_checks.ENTANGLEMENT_MARGINS, strong)
    dec = fpa_checks.entanglement_decision(diffs)
    assert fpa_checks.entanglement_verdict(dec, True) == V.VERIFIED
    assert fpa_checks.entanglement_verdict(dec, False) == V.REFUTED  # FPA did not learn
    # a non-inferiority item: 0.005 worse than lambda = 0 is within its 0.01 margin (supports), 0.05 worse is against
    for shift, want in ((-0.005, "supports"), (-0.05, "against")):
        d = dict(diffs) | {"fpa10_not_below_0": [shift + 0.001 * (i - 4.5) for i in range(10)]}
        assert fpa_checks.entanglement_decision(d).items["fpa10_not_below_0"].outcome == want


# ----------------------------------------------------------------------------- DPO
def _flipped_dpo(logp_w, logp_l, ref_w, ref_l, *, beta=0.1):
    return dpo_loss(logp_l, logp_w, ref_l, ref_w, beta=beta)  # y_w and y_l swapped


def test_flipped_dpo_passes_the_equivalence_but_fails_the_training_check(monkeypatch):
    monkeypatch.setattr(fpa_checks, "dpo_loss", _flipped_dpo)
    # the old check compares DPO only with itself: the flipped margin passes it
    assert fpa_checks.dpo_equiv(0).verdict == V.VERIFIED
    res = fpa_checks.dpo_raises_ratio(0)
    assert res.verdict == V.REFUTED
    assert res.numbers["dpo_frac_raised"] == 0.0 and res.numbers["dpo_ratio_change"] < 0


# ----------------------------------------------------------------------------- delta-method plug-in
@pytest.mark.parametrize("factor", [2.0, 0.5], ids=["missing-half", "extra-half"])
def test_delta_method_plugin_is_judged(monkeypatch, factor):
    (chk,) = [c for c in checks() if c.claim_id == "disa.prop1.log_jensen" and c.layer == "sim"]
    assert run_one(chk).ok
    real = est_checks.delta_method_bias
    monkeypatch.setattr(est_checks, "delta_method_bias", lambda lw, *a: factor * real(lw, *a))
    out = run_one(chk)
    assert out.verdict == "refuted" and out.result.items["plugin_matches_bias"] is False
    assert out.result.items["bias_negative"] and out.result.items["ratio_tends_to_1"]  # only the plug-in broke


# ----------------------------------------------------------------------------- ragged lengths
def _padded_length_mean(token_logp, mask, normalize="sum"):
    """A length-normalization bug: the masked sum divided by the padded length T, not by |y|."""
    total = torch.where(mask > 0, token_logp, torch.zeros_like(token_logp)).sum(1)
    return total if normalize == "sum" else total / mask.shape[1]


def _unmasked_sum(token_logp, mask, normalize="sum"):
    """A masking bug: padding tokens counted in log pi(y)."""
    total = token_logp.sum(1)
    return total if normalize == "sum" else total / mask.sum(1)


def test_ragged_mask_gives_ragged_lengths():
    ids = torch.tensor([[1, 0, 1, 2], [0, 0, 0, 0], [2, 3, 0, 1]])
    assert ragged_mask(ids, eos=1).tolist() == [[1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1]]
    assert ragged_mask(ids, eos=0).sum(-1).tolist() == [2, 1, 3]


@pytest.mark.parametrize("bug", [_padded_length_mean, _unmasked_sum], ids=["padded-length", "unmasked-sum"])
def test_length_normalization_bugs_are_caught_only_with_ragged_lengths(monkeypatch, bug):
    (chk,) = [c for c in checks() if c.claim_id == "fpa.simper" and c.name == "ragged_token_tree"]
    assert run_one(chk).ok
    monkeypatch.setattr(fpa_checks.tb_obj, "sequence_logprob", bug)
    out = run_one(chk)
    assert out.verdict == "refuted" and not out.ok
    # with every |y| = L (no eos: what the simulator had before) the same bug is invisible
    n = fpa_checks.ragged_simper(0, eos=-1)
    assert n["n_lengths"] == 1
    assert n["mean_logprob_err"] < 1e-10 and n["simper_vs_eq2"] < 1e-10


# ----------------------------------------------------------------------------- lad.fig1 bound
def test_fig1_grpo_cannot_collapse_under_the_clip():
    assert pytest.approx(0.02 * 1.2**3) == lad.FIG1_GRPO_MAX_PI_BOUND
    assert lad.FIG1_GRPO_MAX_PI_BOUND < training_checks.FIG1_COLLAPSE_MAX_PI / 10


# ----------------------------------------------------------------------------- text claims
TEXT = sorted((c for c in checks() if c.fn.__module__ == text_checks.__name__), key=lambda c: c.key)


def test_text_claims_are_registered():
    assert {c.claim_id for c in TEXT} >= {
        "disa.remark2.calibration",
        "disa.stage2.denoising",
        "paced.eq5.tb_kl_gradient",
        "paced.s53.retains_near_tau",
        "fpa.s22.future_favours_correct",
        "fpa.fig3.offrl_collapse",
        "lad.c1.exact_matching",
        "lad.fig2.practical_theory_align",
        "lad.b3.proof_constant",
    }


@pytest.mark.parametrize("chk", TEXT, ids=lambda c: c.key)
def test_text_claim_checks_return_expected_verdict_and_items(chk):
    out = run_one(chk, seed=0)
    assert out.error is None, out.error
    assert out.ok, (out.verdict, out.item_changes, out.result.summary)
    assert out.result.items  # every one records its per-item outcomes


def test_tb_kl_semi_gradient_breaks_off_policy_and_with_full_gradient():
    n = text_checks.tb_kl_gradients(1, b=0.0)
    # b = 0 (exact log Z): the semi-gradient still equals 2 grad KL; the full gradient adds E[delta^2 grad log pi]
    assert n["rel_diff_semi"] < 1e-12 and n["rel_diff_full"] > 1e-3 and n["rel_diff_off"] > 1e-3


def test_stage2_regressor_can_lose():
    """A regressor that ignores the prompt (degree 0: one constant) cannot denoise: its held-out error is
    the spread of log Z across prompts, above the labels' own error, so the criterion can fail."""
    n = text_checks.stage2_denoising(0, degree=0)
    assert n["mse_regressor"] > n["mse_labels"]
