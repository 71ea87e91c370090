"""Every check of sim/checks/estimators.py and sim/checks/fpa.py returns its recorded verdict, and the
quantities they judge can go the other way (a check that cannot fail is no check)."""

from __future__ import annotations

import math

import pytest
import torch

import tiltlab.sim.checks.estimators as est
import tiltlab.sim.checks.fpa as fpa
import tiltlab.sim.experiments.bias as bias
from tiltlab.claims.registry import checks
from tiltlab.paper_checks.catalog import discover

discover()
MINE = sorted(
    (c for c in checks() if c.layer == "sim" and c.fn.__module__ in (est.__name__, fpa.__name__)),
    key=lambda c: c.key,
)


def test_all_my_claims_are_registered():
    ids = {c.claim_id for c in MINE}
    for cid in (
        "disa.prop1.unbiased",
        "disa.prop1.log_jensen",
        "disa.prop2.geomean_bias",
        "disa.c5.counterexample",
        "disa.c5.offpolicy_breaks",
        "disa.prop4.envelope",
        "disa.beyond.local_threshold",
        "disa.beyond.global_threshold",
        "disa.d3.m_study",
        "disa.sens.beta_cliff",
        "disa.sens.proposal",
        "disa.open.truncated_proposal",
        "fpa.dpo_equiv",
        "fpa.dpo_token_level",
        "fpa.entanglement",
    ):
        assert cid in ids, cid


@pytest.mark.parametrize("chk", MINE, ids=lambda c: c.key)
def test_check_returns_expected_verdict(chk):
    res = chk.fn(0)
    assert res.verdict == chk.expected, res.summary
    assert any(ch.isdigit() for ch in res.summary) and res.numbers


# ----------------------------------------------------------------- the judged quantities can fail
def test_envelope_is_exceeded_without_unit_mean_weights():
    gap, bound, _, _ = bias.envelope_instances(2000, 5, 6, torch.Generator().manual_seed(0), unit_mean=False)
    assert float((gap / bound).max()) > 1.0


def test_positive_bias_keeps_pi_star_global_and_negative_bias_breaks_it():
    p = torch.linspace(0, 1, 2001, dtype=torch.float64)
    p_star = math.e / (math.e + 1)
    assert abs(float(p[bias.two_outcome_loss(p, 0.3).argmin()]) - p_star) < 1e-3
    assert abs(float(p[bias.two_outcome_loss(p, -0.5).argmin()]) - p_star) > 0.1


def test_simplex_search_finds_points_below_b_squared_under_the_threshold():
    g = torch.Generator().manual_seed(1)
    log_star = torch.log_softmax(torch.randn(4, 3, generator=g, dtype=torch.float64), -1)
    bc = 0.5 * torch.log1p(-log_star.exp().min(-1).values)
    b = torch.stack([bc - 0.05, bc + 0.05], 1)
    mins = bias.simplex_min(log_star, b, generator=g)
    assert bool((mins[:, 0] < b[:, 0] ** 2 - 1e-6).all())  # below the threshold: pi* beaten
    assert bool((mins[:, 1] > b[:, 1] ** 2 - 1e-9).all())  # above: pi* is the minimum (1e-9: float64 optimizer noise)


def test_token_level_dpo_deviation_shrinks_towards_the_reference():
    small = fpa.token_level_deviation("bigram", 0.01, 2.0, seed=0)["margin_rel_dev"]
    large = fpa.token_level_deviation("bigram", 1.0, 2.0, seed=0)["margin_rel_dev"]
    assert small < 0.01 and small < large / 10


def test_entanglement_summary_can_refute():
    import numpy as np

    from tiltlab.sim.experiments.fpa_entanglement import summarize

    def run(corr, acc):
        return {
            "corr": np.full((3, 2), corr),
            "inc": np.full((3, 2), -1.0),
            "acc": np.full((3, 2), acc),
            "ref_acc": np.array([0.1, 0.1]),
        }

    runs = {
        "offrl": run(0.5, 0.3),
        "fpa1": run(-2.0, 0.1),
        "fpa2": run(-3.0, 0.1),
        "cor_only": run(1.0, 0.4),
        "inc_only": run(0.0, 0.2),
    }
    parts = summarize(runs)["parts"]
    assert not any(parts.values())


def test_sens_proposal_refutes_a_label_that_is_not_exact_at_alpha_one(monkeypatch):
    """At alpha = 1 the proposal is the tilted target: every weight is Z and Var(log Z_8) is zero up to rounding.
    A variance above SENS_VAR_ALPHA1_TOL there refutes, even with the mean unbiased and the variances monotone."""
    from tiltlab.sim.experiments import proposal_strength

    real = proposal_strength.proposal_claim(0)["numbers"]
    assert abs(real["var_alpha1"]) < est.SENS_VAR_ALPHA1_TOL and est.sens_proposal(0).verdict.value == "verified"
    for var1, verdict in ((est.SENS_VAR_ALPHA1_TOL * 0.5, "verified"), (est.SENS_VAR_ALPHA1_TOL * 2, "refuted")):
        fake = {**real, "var_alpha1": var1}
        monkeypatch.setattr(proposal_strength, "proposal_claim", lambda seed, fake=fake: {"numbers": fake})
        assert est.sens_proposal(0).verdict.value == verdict, var1
