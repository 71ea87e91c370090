"""Theory checks of the tilt-entropy slope (DISA), the second-order KL expansion (PACED), and FPA's linear
extrapolation and optimistic mirror descent: the recorded verdict, a no-op candidate that must be rejected
(the verdict moves) and a non-finite one (rejected or ``ValueError``)."""

from __future__ import annotations

import pytest
import sympy as sp

from tiltlab.claims.registry import Verdict
from tiltlab.theory import disa_beyond, fpa, paced

V, R, P = Verdict.VERIFIED, Verdict.REFUTED, Verdict.PARTLY


def test_tilt_entropy_partly_with_pinned_fractions():
    r = disa_beyond.check_tilt_entropy()
    assert r.verdict is P and r.items == {"closed_form": True, "some_reference_gains_entropy": True}
    # grid step 1/20, K = 3: 171 references per reward pattern; the 1-correct and 2-correct fractions are
    # mirror images (relabel correct/wrong: the slope flips sign), so they sum to 1 up to the slope-zero points
    assert r.numbers["n_references"] == 342
    assert r.numbers["frac_1_correct"] == pytest.approx(68 / 171)
    assert r.numbers["frac_2_correct"] == pytest.approx(103 / 171)
    assert r.numbers["frac_entropy_falls"] == pytest.approx(171 / 342)
    assert "pi_ref = (0.05, 0.05, 0.9) with 1 correct: dH/dbeta = +0.130" in r.summary  # the first counterexample


def test_tilt_verdict_boundaries():
    assert disa_beyond.tilt_verdict(0.95) is V and disa_beyond.tilt_verdict(0.9499) is P
    assert disa_beyond.tilt_verdict(0.05) is R and disa_beyond.tilt_verdict(0.0501) is P
    with pytest.raises(ValueError, match="finite"):
        disa_beyond.tilt_verdict(float("nan"))


def test_tilt_entropy_slope_against_finite_difference():
    slope, _closed, free, beta = disa_beyond.tilt_entropy_slope(1)
    p1, p2 = 0.05, 0.05  # the hard prompt: one rare correct answer, one dominant wrong one
    f = sp.lambdify([*free, beta], slope)
    import math

    def H(b):
        w = [p1 * math.exp(b), p2, 1 - p1 - p2]
        z = sum(w)
        return -sum(x / z * math.log(x / z) for x in w)

    h = 1e-6
    assert f(p1, p2, 0.0) == pytest.approx((H(h) - H(-h)) / (2 * h), rel=1e-6)  # central difference, O(h^2)
    assert f(p1, p2, 0.0) > 0  # entropy rises: the counterexample the summary names


def test_tilt_entropy_noop_and_nan():
    assert (
        disa_beyond.check_tilt_entropy(slope_sign=0).verdict is R
    )  # a slope that never moves: no reference loses entropy
    with pytest.raises(ValueError, match="not finite"):
        disa_beyond.check_tilt_entropy(slope_sign=float("nan"))


def test_kl_second_order():
    assert paced.check_kl_second_order().verdict is V
    assert paced.check_kl_second_order(lambda pi, d: 0).verdict is R  # no-op: "KL has no quadratic term"
    # E[d^2]/2 without the mean subtracted (not the Fisher form), and a doubled coefficient
    assert paced.check_kl_second_order(lambda pi, d: sum(p * x**2 for p, x in zip(pi, d)) / 2).verdict is R
    two = lambda pi, d: sum(p * x**2 for p, x in zip(pi, d)) - sum(p * x for p, x in zip(pi, d)) ** 2
    assert paced.check_kl_second_order(two).verdict is R
    assert paced.check_kl_second_order(lambda pi, d: sp.nan).verdict is not V


def test_linear_extrapolation():
    assert fpa.check_linear_extrapolation().verdict is V
    assert fpa.check_linear_extrapolation(lambda l_, t, w: 0).verdict is R  # no-op: "extrapolation is always exact"
    assert fpa.check_linear_extrapolation(lambda l_, t, w: -l_ * t**2 * w).verdict is R
    assert fpa.check_linear_extrapolation(lambda l_, t, w: l_ * (1 + l_) * t**2 * w).verdict is R  # sign
    assert fpa.check_linear_extrapolation(lambda l_, t, w: sp.nan).verdict is not V


def test_optimistic_md():
    r = fpa.check_optimistic_md()
    assert r.verdict is P
    assert r.items == {"cumulative_gradient": True, "omd_if_constant_gradient": True, "omd_in_general": False}
    assert fpa.check_optimistic_md(lam_of_T=lambda n: 0).verdict is R  # no-op: no extrapolation
    assert fpa.check_optimistic_md(lam_of_T=lambda n: 1).verdict is R  # FPA's lambda = 1 is not the OMD step
    assert fpa.check_optimistic_md(T=1).verdict is V  # one step: the last gradient is the cumulative one
    assert fpa.check_optimistic_md(K=2, lam_of_T=lambda n: 0).verdict is R  # two outcomes: one log-ratio to compare
    assert fpa.check_optimistic_md(lam_of_T=lambda n: sp.nan).verdict is not V
