"""tiltlab.objectives.estimators against loop references, plus the Stage-1 statistical properties."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.objectives._ref import ref_delta_bias, ref_ess, ref_geomean, ref_log_partition_lse
from tiltlab.objectives import estimators as E

# float64 vs a float64 loop reference: only summation order differs -> 1e-10 relative.
TOL64 = dict(rel=1e-10, abs=1e-12)

logw_lists = st.lists(st.floats(-30, 30, allow_nan=False), min_size=2, max_size=12)


@settings(max_examples=60, deadline=None)
@given(logw_lists)
def test_lse_geomean_ess_bias_match_loop_reference(lw):
    t = torch.tensor(lw, dtype=torch.float64)
    assert E.log_partition_lse(t).item() == pytest.approx(ref_log_partition_lse(lw), **TOL64)
    assert E.log_partition_geomean(t).item() == pytest.approx(ref_geomean(lw), **TOL64)
    # ESS and the bias go through exp(lw - max); the reference exponentiates directly, so keep
    # the range where exp() is exact in float64 and compare at 1e-9.
    assert E.effective_sample_size(t).item() == pytest.approx(ref_ess(lw), rel=1e-9)
    assert E.delta_method_bias(t).item() == pytest.approx(ref_delta_bias(lw), rel=1e-9, abs=1e-12)
    assert E.bias_corrected_log_partition(t).item() == pytest.approx(
        ref_log_partition_lse(lw) - ref_delta_bias(lw), rel=1e-9
    )
    u = [math.exp(x - max(lw)) for x in lw]
    assert E.max_normalized_weight(t).item() == pytest.approx(max(u) / sum(u), rel=1e-9)


def test_log_importance_weights_formula_and_batching():
    g = torch.Generator().manual_seed(0)
    lt, lq, tilt = (torch.randn(4, 5, generator=g, dtype=torch.float64) for _ in range(3))
    lw = E.log_importance_weights(lt, lq, tilt)
    for i in range(4):
        for j in range(5):
            assert lw[i, j].item() == pytest.approx(lt[i, j].item() + tilt[i, j].item() - lq[i, j].item(), **TOL64)
    # dim handling: labels over dim 0 equal labels of the transpose over dim -1
    torch.testing.assert_close(E.log_partition_lse(lw, dim=0), E.log_partition_lse(lw.T, dim=-1))


def test_gradients_of_lse_label_match_softmax_weights():
    # d/dlog w_i of (LSE - log M) is the self-normalized weight u_i.
    lw = torch.randn(7, dtype=torch.float64, requires_grad=True)
    E.log_partition_lse(lw).backward()
    torch.testing.assert_close(lw.grad, E.normalized_weights(lw.detach()), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dtype,rtol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_low_precision_close_to_float64(dtype, rtol):
    # float32: ~1e-7 per op over a length-16 reduction -> 1e-5; bf16 has 8 mantissa bits (~4e-3)
    # and the label is O(1), so 2e-2 relative.
    lw = torch.randn(3, 16, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 3
    ref = E.log_partition_lse(lw)
    out = E.log_partition_lse(lw.to(dtype)).double()
    torch.testing.assert_close(out, ref, rtol=rtol, atol=rtol)


def test_neg_inf_weights_are_handled_and_nan_rejected():
    lw = torch.tensor([[0.0, -math.inf, 1.0], [-math.inf, -math.inf, -math.inf]], dtype=torch.float64)
    lab = E.log_partition_lse(lw)
    assert lab[0].item() == pytest.approx(math.log((1 + math.e) / 3))
    assert lab[1].item() == -math.inf
    ess = E.effective_sample_size(lw)
    assert ess[1].item() == 0.0 and 1.0 < ess[0].item() < 2.0
    assert E.delta_method_bias(lw)[1].item() == 0.0
    with pytest.raises(ValueError, match="NaN"):
        E.log_partition_lse(torch.tensor([0.0, float("nan")]))
    with pytest.raises(ValueError, match=r"\+inf"):
        E.log_partition_lse(torch.tensor([0.0, math.inf]))
    with pytest.raises(ValueError, match="empty"):
        E.log_partition_lse(torch.zeros(3, 0))
    with pytest.raises(ValueError, match="finite"):
        E.log_importance_weights(torch.zeros(2), torch.tensor([0.0, -math.inf]), 0.0)


def test_delta_method_bias_m1_is_nan_and_constant_weights_zero():
    assert math.isnan(E.delta_method_bias(torch.tensor([0.3])).item())
    assert E.delta_method_bias(torch.full((5,), 2.0)).item() == pytest.approx(0.0, abs=1e-15)
    assert E.effective_sample_size(torch.full((5,), 2.0)).item() == pytest.approx(5.0)


@pytest.mark.parametrize("beta", [0.5, 2.0, 15.0, 200.0])
def test_pass_rate_identity_roundtrip_and_exact(beta):
    p = torch.tensor([0.0, 0.01, 0.3, 0.9, 1.0], dtype=torch.float64)
    lz = E.log_z_from_pass_rate(p, beta=beta)
    for pi, li in zip(p.tolist(), lz.tolist()):
        # Z = 1 + p (e^beta - 1) evaluated directly where it does not overflow
        if beta < 100:
            assert li == pytest.approx(math.log(1 + pi * (math.exp(beta) - 1)), rel=1e-12, abs=1e-12)
    torch.testing.assert_close(E.pass_rate_from_log_z(lz, beta=beta), p, rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError):
        E.log_z_from_pass_rate(torch.tensor([1.2]), beta=beta)
    with pytest.raises(ValueError):
        E.log_z_from_pass_rate(0.5, beta=-1.0)


def test_pass_rate_identity_matches_enumerated_partition_function():
    # A 6-outcome pi_ref with binary rewards: Z = sum_y pi_ref e^{beta r} vs 1 + p (e^beta - 1).
    pi = torch.tensor([0.1, 0.25, 0.05, 0.3, 0.2, 0.1], dtype=torch.float64)
    r = torch.tensor([1, 0, 1, 0, 0, 1], dtype=torch.float64)
    beta = 3.0
    z = float((pi * torch.exp(beta * r)).sum())
    assert E.log_z_from_pass_rate(float((pi * r).sum()), beta=beta).item() == pytest.approx(math.log(z), rel=1e-12)


def _enumerated_problem():
    # K = 5 outcomes; proposal q differs from pi_ref; binary-ish rewards; exact Z by enumeration.
    pi_ref = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05], dtype=torch.float64)
    q = torch.tensor([0.2, 0.2, 0.2, 0.2, 0.2], dtype=torch.float64)
    r = torch.tensor([0.0, 0.0, 1.0, 1.0, 0.5], dtype=torch.float64)
    beta = 2.0
    z = float((pi_ref * torch.exp(beta * r)).sum())
    logw_all = E.log_importance_weights(pi_ref.log(), q.log(), beta * r)
    return q, logw_all, z


def test_lse_is_unbiased_on_linear_scale_and_biased_low_in_log_space():
    q, logw_all, z = _enumerated_problem()
    g = torch.Generator().manual_seed(1234)
    n_rep, m = 200_000, 4
    idx = torch.multinomial(q, n_rep * m, replacement=True, generator=g).view(n_rep, m)
    labels = E.log_partition_lse(logw_all[idx])  # [n_rep]
    zhat = labels.exp()
    # linear scale: unbiased; 5 sigma of the Monte-Carlo mean (fixed seed)
    se = zhat.std().item() / math.sqrt(n_rep)
    assert abs(zhat.mean().item() - z) < 5 * se
    # log scale: biased low, and the bias exceeds 5 standard errors
    se_log = labels.std().item() / math.sqrt(n_rep)
    bias = labels.mean().item() - math.log(z)
    assert bias < -5 * se_log
    # the delta-method prediction -Var_q(w)/(2 M Z^2) (exact Var from enumeration) within 35 %:
    # second order only; at M = 4 the third-order term is a sizable fraction here.
    w = logw_all.exp()
    var_w = float((q * (w - z) ** 2).sum())
    pred = -var_w / (2 * m * z * z)
    assert bias == pytest.approx(pred, rel=0.35)


def test_geomean_bias_does_not_shrink_with_m_while_lse_does():
    q, logw_all, z = _enumerated_problem()
    g = torch.Generator().manual_seed(7)
    exact_geo_bias = float((q * logw_all).sum()) - math.log(z)  # E_q[log w] - log Z, exact
    assert exact_geo_bias < 0
    biases = {}
    for m in (2, 32):
        n_rep = 20_000
        idx = torch.multinomial(q, n_rep * m, replacement=True, generator=g).view(n_rep, m)
        geo = E.log_partition_geomean(logw_all[idx])
        lse = E.log_partition_lse(logw_all[idx])
        se = geo.std().item() / math.sqrt(n_rep)
        # geometric mean: its mean is E_q[log w] for every M (5 sigma)
        assert abs(geo.mean().item() - math.log(z) - exact_geo_bias) < 5 * se
        biases[m] = lse.mean().item() - math.log(z)
    # LSE bias shrinks roughly like 1/M: from M = 2 to 32 by at least a factor 8 (ideal 16)
    assert abs(biases[32]) < abs(biases[2]) / 8
    assert abs(biases[32]) < abs(exact_geo_bias) / 10
