"""tiltlab.objectives.regressor (Stage 2) and objectives.metrics."""

import math
from itertools import combinations

import pytest
import torch

from tiltlab.objectives.metrics import distinct_n, mean_at_k, pass_at_k
from tiltlab.objectives.regressor import PartitionRegressor, fit_regressor, r2_score


def test_fit_recovers_a_smooth_function_and_reports_split_metrics():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(400, 6, generator=g)
    y = torch.tanh(x[:, 0]) * 3 + 0.5 * x[:, 1] + 0.05 * torch.randn(400, generator=g)
    res = fit_regressor(x, y, epochs=150, seed=0)
    assert res.val_r2 > 0.9  # noise variance 0.0025 vs target variance ~3: R² ceiling ~0.999
    assert res.val_mse < 0.1 * res.baseline_val_mse
    assert len(res.history["val_mse"]) == 150
    assert set(res.train_idx.tolist()).isdisjoint(res.val_idx.tolist())
    assert len(res.val_idx) == 80


def test_fit_on_noise_has_no_skill():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(300, 4, generator=g)
    y = torch.randn(300, generator=g)
    res = fit_regressor(x, y, epochs=60, seed=0)
    # labels independent of features: validation R² cannot be meaningfully positive
    assert res.val_r2 < 0.15


def test_regressor_is_deterministic_and_predicts_in_label_units():
    x = torch.randn(50, 3, generator=torch.Generator().manual_seed(2))
    y = 100 + 10 * x[:, 0]
    a = fit_regressor(x, y, epochs=30, seed=5)
    b = fit_regressor(x, y, epochs=30, seed=5)
    torch.testing.assert_close(a.model(x), b.model(x))
    assert abs(float(a.model(x).detach().mean()) - 100) < 5


def test_regressor_errors():
    with pytest.raises(ValueError, match="finite"):
        fit_regressor(torch.zeros(5, 2), torch.tensor([0.0, 1, 2, float("-inf"), 3]))
    with pytest.raises(ValueError, match="at least 3"):
        fit_regressor(torch.zeros(2, 2), torch.zeros(2))
    with pytest.raises(ValueError, match=r"\[N, 3\]"):
        PartitionRegressor(3)(torch.zeros(4, 2))


def test_r2_score():
    t = torch.tensor([1.0, 2.0, 3.0])
    assert r2_score(t, t) == 1.0
    assert r2_score(torch.full((3,), 2.0), t) == 0.0


@pytest.mark.parametrize("n,c,k", [(5, 0, 1), (5, 2, 1), (5, 2, 3), (10, 3, 4), (8, 8, 2), (6, 1, 6)])
def test_pass_at_k_equals_enumeration_over_subsets(n, c, k):
    # pass@k = P(a uniformly random k-subset of the n samples contains a correct one)
    samples = [1] * c + [0] * (n - c)
    subs = list(combinations(range(n), k))
    ref = sum(any(samples[i] for i in s) for s in subs) / len(subs)
    assert pass_at_k(n, c, k) == pytest.approx(ref, rel=1e-12, abs=1e-15)
    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)


def test_metrics_edge_cases():
    assert pass_at_k(4, 2, 1) == 0.5
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)
    assert mean_at_k([1, 0, 1, 1]) == 0.75
    assert distinct_n(["a b a b", "a b c"], 2) == pytest.approx(3 / 5)  # {ab, ba, bc} of 5 bigrams
    assert distinct_n(["a"], 2) == 0.0


def test_fit_regressor_options_away_from_defaults(monkeypatch):
    """val_fraction / seed pick the split, hidden / n_layers the architecture, epochs the history; lr and
    weight_decay against one full-batch AdamW step written out; batch_size the number of loss calls."""
    import tiltlab.objectives.regressor as reg

    g = torch.Generator().manual_seed(2)
    n, d = 20, 3
    x = torch.randn(n, d, generator=g)
    y = x[:, 0] - 0.5 * x[:, 2] + 0.1 * torch.randn(n, generator=g)
    lr, wd, seed = 0.05, 0.5, 4
    res = fit_regressor(x, y, val_fraction=0.3, epochs=1, lr=lr, weight_decay=wd, hidden=7, n_layers=3, seed=seed)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    assert res.val_idx.tolist() == perm[:6].tolist() and res.train_idx.tolist() == perm[6:].tolist()
    lin = [m for m in res.model.net if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in lin] == [(3, 7), (7, 7), (7, 7), (7, 1)]
    assert len(res.history["train_mse"]) == 1
    # AdamW's first step from the same initial weights: p <- p (1 - lr wd) - lr g / (|g| + 1e-8)
    torch.manual_seed(seed)
    m0 = PartitionRegressor(d, 7, 3)
    xt, yt = x[perm[6:]], y[perm[6:]]
    m0.set_normalization(xt, yt)
    loss = ((m0(xt) - yt) ** 2).mean()
    grads = torch.autograd.grad(loss, list(m0.parameters()))
    for (name, p1), p0, gr in zip(res.model.named_parameters(), m0.parameters(), grads):
        want = p0.detach() * (1 - lr * wd) - lr * gr / (gr.abs() + 1e-8)
        torch.testing.assert_close(p1.detach(), want, rtol=1e-5, atol=1e-6, msg=name)
    other = fit_regressor(x, y, val_fraction=0.3, epochs=1, hidden=7, n_layers=3, seed=seed)  # default lr, wd
    assert any((a - b).abs().max() > 1e-3 for a, b in zip(res.model.parameters(), other.model.parameters()))
    # batch_size: ceil(14 / 4) = 4 optimizer steps per epoch instead of 1
    calls = []
    real = reg.regressor_loss
    monkeypatch.setattr(reg, "regressor_loss", lambda p, t: calls.append(len(t)) or real(p, t))
    fit_regressor(x, y, val_fraction=0.3, epochs=2, batch_size=4, hidden=7, seed=seed)
    assert calls == [4, 4, 4, 2] * 2
    calls.clear()
    fit_regressor(x, y, val_fraction=0.3, epochs=2, hidden=7, seed=seed)
    assert calls == [14, 14]


def test_distinct_n_for_other_n():
    texts = ["a b a b a", "a b c"]
    # unigrams: {a, b, c} of 8; trigrams: {aba, bab, abc} of 4
    assert distinct_n(texts, 1) == pytest.approx(3 / 8)
    assert distinct_n(texts, 3) == pytest.approx(3 / 4)
    assert distinct_n(texts, 2) == pytest.approx(3 / 6)  # ab, ba, ab, ba, ab, bc
