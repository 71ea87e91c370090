"""The real-model Stage-1 check (``disa.llm.stage1_real_model``): its per-prompt arithmetic against
naive loops, and the whole check at a tiny budget on SmolLM2-135M-Instruct and vLLM (the full check
is slow: ``tiltlab check --layer llm --slow``)."""

from __future__ import annotations

import importlib.metadata as md
import math

import pytest
import torch

from tiltlab.claims import stats
from tiltlab.claims.registry import Verdict
from tiltlab.llm.checks import stage1_real as S
from tiltlab.paper_checks import catalog


def _lse_label(ws: list[float]) -> float:
    return math.log(sum(math.exp(w) for w in ws) / len(ws))


def test_unit_numbers_match_naive_loops():
    gen = torch.Generator().manual_seed(3)
    log_w = torch.randn(3, 8, generator=gen, dtype=torch.float64) * 2
    log_w_tr = torch.randn(3, 8, generator=gen, dtype=torch.float64)
    ref = torch.tensor([0.1, -0.4, 1.2], dtype=torch.float64)
    u = S.unit_numbers(log_w, log_w_tr, ref, m_small=2)
    for i in range(3):
        ws = log_w[i].tolist()
        full = _lse_label(ws)
        small = [_lse_label(ws[j : j + 2]) for j in range(0, 8, 2)]
        w = [math.exp(x) for x in ws]
        ess = sum(w) ** 2 / sum(x * x for x in w)
        mean = sum(ws) / 8
        sd = math.sqrt(sum((x - mean) ** 2 for x in ws) / 7)
        assert u["sd_log_w"][i] == pytest.approx(sd, rel=1e-12)
        assert u["ess_fraction"][i] == pytest.approx(ess / 8, rel=1e-12)
        assert u["sq_err_m"][i] == pytest.approx((full - ref[i].item()) ** 2, rel=1e-12)
        sq_small = sum((x - ref[i].item()) ** 2 for x in small) / 4
        assert u["sq_err_small"][i] == pytest.approx(sq_small, rel=1e-12)
        assert u["mse_gain"][i] == pytest.approx(sq_small - (full - ref[i].item()) ** 2, rel=1e-10, abs=1e-12)
        assert u["trunc_minus_full"][i] == pytest.approx(_lse_label(log_w_tr[i].tolist()) - full, rel=1e-12)
    # equal weights: no spread, ESS = M, the label is the weight
    flat = torch.full((2, 4), 0.3, dtype=torch.float64)
    v = S.unit_numbers(flat, flat, torch.tensor([0.3, 0.3], dtype=torch.float64), m_small=2)
    assert v["sd_log_w"] == [0.0, 0.0] and v["ess_fraction"] == pytest.approx([1.0, 1.0])
    assert v["sq_err_m"] == pytest.approx([0.0, 0.0], abs=1e-24)
    with pytest.raises(ValueError, match="multiple"):
        S.unit_numbers(flat, flat, flat[:, 0], m_small=3)


def test_unboxed_reward_accepts_a_plain_answer():
    r = S.unboxed_math_reward(["q"] * 3, ["2 + 3 = 5", "The answer is 6.", "\\boxed{5}"], answer=["5", "5", "5"])
    assert r == [1.0, 0.0, 1.0]


@pytest.mark.vllm
def test_check_runs_end_to_end_at_a_tiny_budget():
    pytest.importorskip("vllm")
    from tiltlab.llm.base.models import MODEL_ALIASES

    try:
        md.distribution(MODEL_ALIASES[S.ALIAS].distribution)
    except md.PackageNotFoundError:
        pytest.skip(f"needs `{MODEL_ALIASES[S.ALIAS].install}`")
    res = S.stage1_real_model(0, n_seeds=1, n_prompts=2, m=4, m_small=2, n_ref=4, max_new_tokens=12)
    n = res.numbers
    assert n["n_prompts"] == 2
    assert all(math.isfinite(v) for v in n.values() if isinstance(v, float))
    assert 1 / 4 <= n["ess_fraction"] <= 1.0 + 1e-12
    for k in ("ref", "q", "q_trunc"):
        assert 0.0 <= n[f"pass_rate_{k}"] <= 1.0
    names = ("log_w_spread", "ess_below_half")  # m16_beats_m4 and top_p_biases_low are context: not judged
    assert set(res.items) == {f"{k}_{s}" for k in names for s in ("supports", "against")} | {
        "ran_weights_vary",
        "ran_labels_differ",
    }
    sup = [res.items[f"{k}_supports"] for k in names]
    ag = [res.items[f"{k}_against"] for k in names]
    ran = res.items["ran_weights_vary"] and res.items["ran_labels_differ"]
    want = (
        Verdict.INCONCLUSIVE
        if not ran
        else Verdict.VERIFIED
        if all(sup)
        else Verdict.PARTLY
        if any(sup)
        else Verdict.REFUTED
        if any(ag)
        else Verdict.INCONCLUSIVE
    )
    assert res.verdict == want
    assert [i["kind"] for i in res.evidence["items"]] == ["effect", "effect", "context", "context"]


def _units(n_p, n_s, gen, spread=1.0):
    log_w = torch.randn(n_p * n_s, 8, generator=gen, dtype=torch.float64) * spread
    tr = log_w - 0.3 * torch.rand(n_p * n_s, 8, generator=gen, dtype=torch.float64)
    ref = torch.randn(n_p * n_s, generator=gen, dtype=torch.float64)
    return S.unit_numbers(log_w, tr, ref, m_small=2)


def test_cluster_by_prompt_averages_each_prompts_seeds():
    units = {"x": [1.0, 2.0, 3.0, 10.0, 20.0, 30.0]}  # seed 0: prompts 0..2, seed 1: prompts 0..2
    assert S.cluster_by_prompt(units, 3, 2) == {"x": [5.5, 11.0, 16.5]}
    with pytest.raises(ValueError, match="prompts x"):
        S.cluster_by_prompt(units, 4, 2)


def test_decide_uses_prompt_clustered_intervals():
    gen = torch.Generator().manual_seed(0)
    n_p, n_s = 6, 3
    units = _units(n_p, n_s, gen)
    passes = {"ref": [0.5] * n_p * n_s, "q": [0.4] * n_p * n_s, "q_trunc": [0.3] * n_p * n_s}
    verdict, nums, flags, clustered, j = S.decide(units, passes, n_p, n_s)
    items = j.items
    naive = [sum(units["ess_fraction"][s * n_p + i] for s in range(n_s)) / n_s for i in range(n_p)]
    assert clustered["ess_fraction"] == pytest.approx(naive)
    m, lo, hi = stats.mean_ci(naive)
    assert (nums["ess_fraction"], nums["ess_fraction_lo"], nums["ess_fraction_hi"]) == pytest.approx((m, lo, hi))
    assert nums["seeds"] == n_p  # the paired units are prompts, df = n_p - 1
    assert items[1].values == pytest.approx(tuple(S.ESS_FRACTION - x for x in naive))
    assert j.unit == "prompt" and j.family == ["log_w_spread", "ess_below_half"]
    assert flags["ran_weights_vary"] and verdict in set(Verdict)


def test_decide_no_op_run_is_inconclusive_and_fails_its_items():
    """A proposal equal to pi_ref with no spread (every log-weight 0): nothing was measured."""
    from tiltlab.claims import registry
    from tiltlab.claims.registry import CheckResult, Outcome

    n_p, n_s = 4, 2
    zeros = torch.zeros(n_p * n_s, 8, dtype=torch.float64)
    units = S.unit_numbers(zeros, zeros, torch.zeros(n_p * n_s, dtype=torch.float64), m_small=2)
    passes = {"ref": [0.5] * 8, "q": [0.5] * 8, "q_trunc": [0.5] * 8}
    verdict, nums, flags, *_ = S.decide(units, passes, n_p, n_s)
    assert verdict is Verdict.INCONCLUSIVE and not flags["ran_weights_vary"] and not flags["ran_labels_differ"]
    catalog.discover()
    (chk,) = [c for c in registry.checks() if c.claim_id == "disa.llm.stage1_real_model"]
    out = Outcome(chk, CheckResult(verdict, "no-op", nums, items=flags), 0.0)
    assert not out.ok and "ran_weights_vary" in out.item_changes


def test_decide_nan_run_is_an_error():
    gen = torch.Generator().manual_seed(1)
    units = _units(3, 2, gen)
    units["mse_gain"][4] = math.nan
    passes = {"ref": [0.5] * 6, "q": [0.5] * 6, "q_trunc": [0.5] * 6}
    with pytest.raises(ValueError, match="non-finite"):
        S.decide(units, passes, 3, 2)
