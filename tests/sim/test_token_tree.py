"""Token-tree environment and exact helpers: enumeration = Monte Carlo, recursions = enumeration."""

from __future__ import annotations

import math

import pytest
import torch

from tiltlab.objectives.estimators import log_importance_weights, log_partition_lse
from tiltlab.sim.exact import (
    compositions,
    label_samples_exact,
    log_partition,
    mc_log_weights,
    relative_weight_variance,
    target_logprobs,
)
from tiltlab.sim.token_tree import (
    TokenTree,
    bigram_env,
    calibrate_skill,
    make_reference,
    offline_dataset,
    shared_transition_fraction,
    tilted_table,
)

F64 = torch.float64


@pytest.mark.parametrize("context", ["bigram", "position"])
@pytest.mark.parametrize("reward_kind", ["last_token", "sum_mod"])
def test_enumeration_is_a_distribution_and_pass_rate_recursion_matches(context, reward_kind):
    env = TokenTree(3, 4, answer=1, context=context, reward_kind=reward_kind)
    p = env.init_params(1.3, 2, generator=torch.Generator().manual_seed(0))  # two prompts
    lp = env.exact_logprobs(p)  # [2, 81]
    assert lp.shape == (2, 81)
    torch.testing.assert_close(
        lp.exp().sum(-1), torch.ones(2, dtype=F64), rtol=0, atol=1e-12
    )  # float64 sum of 81 terms
    enum = (lp.exp() * env.exact_rewards()).sum(-1)
    torch.testing.assert_close(env.pass_rate(p), enum, rtol=0, atol=1e-12)


def test_index_of_inverts_all_sequences_and_token_logprobs_match_gathered_logits():
    env = TokenTree(4, 3)
    seqs = env.all_sequences()
    assert torch.equal(env.index_of(seqs), torch.arange(64))
    p = env.init_params(1.0, generator=torch.Generator().manual_seed(1))
    logits = env.gather_logits(env.table(p), seqs)  # [64, 3, 4]
    direct = torch.log_softmax(logits, -1).gather(-1, seqs.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(direct, env.token_logprobs(p, seqs), rtol=0, atol=1e-14)
    # leading dims on either side broadcast
    batched = env.token_logprobs(p, seqs.reshape(2, 32, 3))
    torch.testing.assert_close(batched.reshape(64, 3), direct, rtol=0, atol=1e-14)
    p2 = torch.stack([p, p])
    torch.testing.assert_close(env.token_logprobs(p2, seqs)[1], direct, rtol=0, atol=1e-14)


@pytest.mark.parametrize("context", ["bigram", "position"])
def test_exact_expectation_equals_monte_carlo_mean(context):
    """E_pi[f(y)] by enumeration vs the mean over n ancestral samples: |diff| < 4 sigma / sqrt(n) (fixed seed)."""
    env = TokenTree(4, 5, context=context)
    g = torch.Generator().manual_seed(3)
    p = make_reference(env, 0.3, generator=g)
    f_all = torch.randn(env.n_sequences, generator=g, dtype=F64) + 3 * env.exact_rewards()  # an arbitrary test function
    probs = env.exact_logprobs(p).exp()
    mean = float((probs * f_all).sum())
    sd = math.sqrt(float((probs * (f_all - mean) ** 2).sum()))
    n = 40000
    ids = env.sample(p, n, generator=g)
    est = float(f_all[env.index_of(ids)].mean())
    assert abs(est - mean) < 4 * sd / math.sqrt(n)
    # the sampled sequences' log-probs are the enumerated ones
    torch.testing.assert_close(env.sequence_logprobs(p, ids[:100]), env.exact_logprobs(p)[env.index_of(ids[:100])])


def test_calibrate_skill_hits_the_pass_rate_and_tilted_table_is_the_target():
    env = TokenTree(4, 4)
    g = torch.Generator().manual_seed(4)
    base = env.init_params(1.0, 3, generator=g)
    rates = torch.tensor([0.01, 0.2, 0.9], dtype=F64)
    p = calibrate_skill(env, base, rates)
    torch.testing.assert_close(env.pass_rate(p), rates, rtol=0, atol=1e-10)  # bisection to 2^-80 in the logit
    beta = torch.tensor([0.5, 2.0, 8.0], dtype=F64)
    star = bigram_env(env).exact_logprobs(tilted_table(env, p, beta))
    ref = target_logprobs(env.exact_logprobs(p), beta[:, None] * env.exact_rewards())
    torch.testing.assert_close(star, ref, rtol=0, atol=1e-12)


def test_offline_dataset_and_entanglement_measure():
    env = TokenTree(8, 5, context="position", reward_kind="sum_mod")
    g = torch.Generator().manual_seed(0)
    p = env.init_params(2.0, generator=g)
    d = offline_dataset(env, p, 64, generator=g)
    assert d.ids.shape == (64, 5) and d.token_logits_ref.shape == (64, 5, 8)
    assert set(d.signed.unique().tolist()) <= {-1.0, 1.0}
    torch.testing.assert_close(d.logp_ref, env.sequence_logprobs(p, d.ids))
    frac = shared_transition_fraction(env, d)
    assert 0.0 < frac <= 1.0  # correct and incorrect sequences share tokens


def test_bad_inputs_raise():
    with pytest.raises(ValueError):
        TokenTree(1, 3)
    with pytest.raises(ValueError):
        TokenTree(4, 3, context="trigram")
    with pytest.raises(ValueError):
        TokenTree(16, 8)  # 2^32 sequences
    with pytest.raises(ValueError):
        TokenTree(4, 3, answer=4)
    env = TokenTree(4, 3)
    with pytest.raises(ValueError):
        env.rewards(torch.tensor([[0, 1, 5]]))
    with pytest.raises(ValueError):
        env.table(torch.zeros(3, 4))
    with pytest.raises(ValueError):
        calibrate_skill(TokenTree(4, 3, reward_kind="sum_mod"), torch.zeros(3, 4, 4), 0.3)


# ------------------------------------------------------------------ exact helpers (test the test helpers)
def test_compositions_count_and_sum():
    c = compositions(6, 3)
    assert c.shape == (math.comb(8, 2), 3)
    assert bool((c.sum(-1) == 6).all()) and len({tuple(r) for r in c.tolist()}) == c.shape[0]


def test_label_samples_exact_against_brute_force_and_monte_carlo():
    g = torch.Generator().manual_seed(5)
    logq = torch.log_softmax(torch.randn(3, generator=g, dtype=F64), -1)
    log_w = torch.randn(3, generator=g, dtype=F64)
    m = 4
    samples, prob = label_samples_exact(logq, log_w, m)
    torch.testing.assert_close(prob.sum(), torch.tensor(1.0, dtype=F64), rtol=0, atol=1e-13)
    exact = float((prob * log_partition_lse(samples)).sum())
    # brute force over all 3^4 ordered tuples
    import itertools

    brute = 0.0
    for tup in itertools.product(range(3), repeat=m):
        pr = math.exp(sum(float(logq[i]) for i in tup))
        brute += pr * float(log_partition_lse(log_w[list(tup)]))
    assert abs(exact - brute) < 1e-12
    # Monte Carlo with the sampler used by the checks: within 4 sigma / sqrt(n)
    n = 20000
    lab = log_partition_lse(mc_log_weights(logq, log_w, m, n, generator=g))
    assert abs(float(lab.mean()) - exact) < 4 * float(lab.std()) / math.sqrt(n)


def test_relative_weight_variance_equals_single_sample_variance():
    """chi2(pi*||q) = Var_q(w)/Z^2, computed here from the exact M=1 distribution of Z_hat (independent path)."""
    g = torch.Generator().manual_seed(6)
    lp_ref = torch.log_softmax(torch.randn(4, generator=g, dtype=F64), -1)
    tilt = torch.rand(4, generator=g, dtype=F64) * 2
    lq = torch.log_softmax(torch.randn(4, generator=g, dtype=F64), -1)
    lw = log_importance_weights(lp_ref, lq, tilt)
    samples, prob = label_samples_exact(lq, lw, 1)
    z = math.exp(float(log_partition(lp_ref, tilt)))
    w = samples.squeeze(-1).exp()
    var = float((prob * (w - z) ** 2).sum()) / z**2
    assert abs(var - float(relative_weight_variance(target_logprobs(lp_ref, tilt), lq))) < 1e-12
    # a proposal missing part of pi*'s support has infinite chi2
    lq_trunc = lq.clone()
    lq_trunc[0] = -math.inf
    assert math.isinf(float(relative_weight_variance(target_logprobs(lp_ref, tilt), lq_trunc)))
