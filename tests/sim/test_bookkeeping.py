"""The simulator's PACED bookkeeping and its options away from their defaults, against plain loops.

* replay: which (prompt, output) pairs enter the buffer, in which order, with per-prompt priorities
  ``|N_correct / G - p_hat|`` over groups of *different* correct counts, and the FIFO that drops the
  oldest; replayed pairs enter the TB loss at their own prompt's log Z, reward and anchor;
* ``p_hat`` of the ``logz`` scheduler at ``beta != 1`` (PACED's ``kl_coef = 1 / beta``);
* the sampling temperature ``T != 1``: the batch is drawn from ``pi_old^(1/T)`` (normalized), exact mode
  weights each output by ``K q_T(y)``, and the loss still uses the untempered ``pi_old``.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from tiltlab.sim import envs, proposals
from tiltlab.sim.api import SimConfig
from tiltlab.sim.train import _Batch, _Trainer, gradient_at

P, K, G, S = 4, 6, 5, 2  # G != P: a sum or a size taken over the wrong axis changes the result


@pytest.fixture(scope="module")
def env():
    return envs.make_multiprompt(P=P, K=K, seed=3, p_min=0.2, p_max=0.8)


def _paced_cfg(**kw) -> SimConfig:
    base = dict(
        env="multiprompt",
        P=P,
        K=K,
        method="tb",
        anchor="old",
        log_z="learned",
        tilt_beta=2.0,
        G=G,
        seeds=S,
        paced_replay=True,
        paced_replay_capacity=7,
        paced_replay_add=3,
    )
    return SimConfig(**{**base, **kw})


def _idx_with_correct_counts(env, counts) -> torch.Tensor:
    """``[S, P, G]`` outputs whose group (s, p) holds exactly ``counts[s][p]`` correct ones: the
    first correct / incorrect output of each prompt, repeated (a different correct output in slot 1)."""
    idx = torch.zeros(S, P, G, dtype=torch.long)
    for p in range(P):
        good = torch.nonzero(env.reward[p] > 0.5).flatten().tolist()
        bad = torch.nonzero(env.reward[p] <= 0.5).flatten().tolist()
        assert good and bad
        for s in range(S):
            c = counts[s][p]
            row = [good[min(j, len(good) - 1)] for j in range(c)] + [bad[0]] * (G - c)
            idx[s, p] = torch.tensor(row)
    return idx


def _naive_push(buf, idx, reward, sel, p_hat, n_add, cap):
    """The replay update by hand: candidates are correct samples of selected prompts; each carries its
    prompt's priority ``|n_correct / G - p_hat|``; the ``n_add`` highest (ties: lower flat index first)
    are put in front of the buffer, unused slots marked invalid, and the buffer keeps its first ``cap``."""
    out = []
    for s in range(S):
        cand = []
        for p in range(P):
            n_corr = sum(1 for g in range(G) if float(reward[p, int(idx[s, p, g])]) > 0.5)
            pri = abs(n_corr / G - float(p_hat[s, p]))
            for g in range(G):
                if float(reward[p, int(idx[s, p, g])]) > 0.5 and float(sel[s, p]) > 0:
                    cand.append((-pri, p * G + g, p, int(idx[s, p, g])))
        cand.sort()
        new = [(p, y, True) for _, _, p, y in cand[:n_add]]
        new += [(None, None, False)] * (min(n_add, P * G) - len(new))
        out.append((new + buf[s])[:cap])
    return out


def _as_lists(buf):
    bp, by, bv = buf
    return [
        [(int(bp[s, c]), int(by[s, c]), True) if bool(bv[s, c]) else (None, None, False) for c in range(bp.shape[1])]
        for s in range(S)
    ]


def test_push_replay_matches_a_loop_over_groups_of_different_correct_counts(env):
    # one output of prompt 0 rewarded 0.5 (the filler of its groups): "correct" means reward > 0.5
    env = dataclasses.replace(env, reward=env.reward.clone())
    half = int(torch.nonzero(env.reward[0] <= 0.5).flatten()[0])
    env.reward[0, half] = 0.5
    tr = _Trainer(_paced_cfg(), env)
    # correct counts 0..5 per group (G = 5): priorities differ within a seed
    counts = [[3, 1, 5, 0], [2, 2, 1, 4]]
    idx = _idx_with_correct_counts(env, counts)
    sel = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 1.0, 1.0]], dtype=torch.float64)  # prompt 1 not selected
    p_hat = torch.tensor([[0.1, 0.9, 0.6, 0.5], [0.5, 0.0, 0.7, 0.2]], dtype=torch.float64)
    want = [[(None, None, False)] * 7 for _ in range(S)]
    for step in range(3):  # three pushes: the FIFO drops the oldest entries once 7 slots are used
        b = _Batch(idx, torch.ones(S, P, G, dtype=torch.float64), tr.logp_old, tr.anchor())
        tr.push_replay(b, sel, p_hat)
        want = _naive_push(want, idx, env.reward, sel, p_hat, 3, 7)
        got = _as_lists(tr.buf)
        assert [[e for e in row if e[2]] for row in got] == [[e for e in row if e[2]] for row in want], step
        assert [[e[2] for e in row] for row in got] == [[e[2] for e in row] for row in want], step
        # a slot holds an output of its own prompt that is correct for that prompt
        for row in got:
            for p, y, ok in row:
                assert not ok or float(env.reward[p, y]) > 0.5
        if step == 0:  # the first push, spelled out: seed 0 prompt 1 (|1/5 - 0.9| = 0.7) then prompt 0 (0.5);
            # seed 1 prompt 3 (|4/5 - 0.2| = 0.6), its correct outputs before any other prompt's
            assert [e[0] for e in got[0][:3]] == [1, 0, 0] and [e[0] for e in got[1][:3]] == [3, 3, 3]
        counts = [c[1:] + c[:1] for c in counts]  # other correct counts per prompt next step
        idx = _idx_with_correct_counts(env, counts)


def test_push_replay_p_hat_from_the_learned_log_z_uses_kl_coef_one_over_beta(env):
    # without a scheduler estimate, the priority's p_hat is clip(log Z / beta, 0, 1): at beta = 2 a
    # log Z of 1.2 means p_hat 0.6 (kl_coef 1/beta), not 1 (the value kl_coef = 1 or beta would give)
    tr = _Trainer(_paced_cfg(paced_replay_add=1, paced_replay_capacity=1, tilt_beta=2.0), env)
    with torch.no_grad():
        tr.logz_param.copy_(torch.tensor([[1.2, 0.2, 1.9, 0.9]] * S, dtype=torch.float64))
    counts = [[2, 2, 2, 2]] * S  # n_correct / G = 0.4 everywhere: priority |0.4 - p_hat|
    idx = _idx_with_correct_counts(env, counts)
    b = _Batch(idx, torch.ones(S, P, G, dtype=torch.float64), tr.logp_old, tr.anchor())
    tr.push_replay(b, torch.ones(S, P, dtype=torch.float64), None)
    p_hat = (tr.logz_param.detach() / 2.0).clamp(0, 1)  # 0.6, 0.1, 0.95, 0.45
    assert int(torch.argmax((0.4 - p_hat[0]).abs())) == 2  # |0.4 - 0.95|; with kl_coef 1 or beta: prompt 0
    assert [int(tr.buf[0][s, 0]) for s in range(S)] == [2, 2]


def test_scheduler_logz_p_hat_is_log_z_over_beta(env):
    for beta in (0.5, 2.0, 4.0):
        tr = _Trainer(_paced_cfg(tilt_beta=beta, select_m=2, scheduler="logz", paced_replay=False), env)
        lz = torch.tensor([[0.3, 1.1, -0.2, 2.5], [0.05, 0.9, 3.0, 0.4]], dtype=torch.float64)
        with torch.no_grad():
            tr.logz_param.copy_(lz)
        naive = [[min(max(float(lz[s, p]) / beta, 0.0), 1.0) for p in range(P)] for s in range(S)]
        torch.testing.assert_close(tr.p_hat(), torch.tensor(naive, dtype=torch.float64), rtol=0, atol=1e-15)


def test_replayed_pairs_enter_the_tb_loss_at_their_own_prompt(env):
    """Loss and gradient of the TB objective with a replay buffer against a loop over rows: batch rows,
    then each buffer slot (prompt p, output y) with pi_theta(y|p), its anchor, r(p, y) and log Z(p),
    weighted by its validity; the mean runs over all rows (invalid slots count with weight 0)."""
    tr = _Trainer(_paced_cfg(init_scale=0.5, seed=1), env)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        tr.logz_param.copy_(torch.randn(S, P, generator=g, dtype=torch.float64))
    tr.logp_old = torch.log_softmax(tr.theta.detach() + 0.3 * torch.randn(S, P, K, generator=g), -1)
    idx = proposals.sample(tr.logp_old, G, g)
    bp = torch.tensor([[2, 0, 3, 1, 2], [1, 1, 3, 0, 0]])
    by = torch.tensor([[5, 1, 0, 4, 3], [2, 5, 1, 0, 3]])
    bv = torch.tensor([[True, True, False, True, True], [True, False, True, True, False]])
    b = _Batch(idx, torch.ones(S, P, G, dtype=torch.float64), tr.logp_old, tr.anchor(), (bp, by, bv))
    loss = tr.loss(b)
    grad, grad_lz = torch.autograd.grad(loss, [tr.theta, tr.logz_param])

    theta = tr.theta.detach().clone().requires_grad_(True)
    logp = torch.log_softmax(theta, -1)
    anchor, lz, beta = tr.logp_old, tr.logz_param.detach().clone().requires_grad_(True), 2.0
    total = 0.0
    for s in range(S):
        rows = [(p, int(idx[s, p, j]), 1.0) for p in range(P) for j in range(G)]
        rows += [(int(bp[s, c]), int(by[s, c]), float(bv[s, c])) for c in range(bp.shape[1])]
        seed_loss = 0.0
        for p, y, w in rows:
            delta = lz[s, p] + logp[s, p, y] - anchor[s, p, y] - beta * env.reward[p, y]
            seed_loss = seed_loss + w * delta**2
        total = total + seed_loss / len(rows)
    want_grad, want_lz = torch.autograd.grad(total, [theta, lz])
    torch.testing.assert_close(loss.detach(), total.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, want_grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad_lz, want_lz, rtol=1e-10, atol=1e-12)  # PACED's log Z learns from both
    assert float(want_lz.abs().min()) > 1e-3
    # the replay rows matter: the same batch without them is another loss
    b0 = _Batch(idx, b.w, tr.logp_old, tr.anchor())
    assert abs(float(tr.loss(b0)) - float(loss)) > 1e-3


@pytest.mark.parametrize("weight_clip", ["max", "ratio", "eps"])
def test_tb_rollout_weight_options_against_a_loop(env, weight_clip):
    """``weight_clip`` away from its default (``one`` for tb): each batch row is weighted by
    ``w = exp(log pi_theta(y) - log pi_old(y))``, capped at 10 (``max``), clipped to [0.8, 1.2] (``eps``)
    or not at all (``ratio``), detached; the loss is mean_rows w * delta^2 (exact log Z, anchor pi_ref)."""
    cfg = SimConfig(
        env="multiprompt", P=P, K=K, method="tb", log_z="exact", tilt_beta=2.0, G=G, seeds=S, weight_clip=weight_clip
    )
    tr = _Trainer(cfg, env)
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        # per-prompt spread of pi_theta around pi_old: ratios near 1 on prompt 0, far from it on prompt 3
        scale = torch.tensor([0.05, 0.5, 2.0, 4.0], dtype=torch.float64)[None, :, None]
        tr.theta.add_(scale * torch.randn(S, P, K, generator=g, dtype=torch.float64))
    idx = proposals.sample(tr.logp_old, G, g)
    b = _Batch(idx, torch.ones(S, P, G, dtype=torch.float64), tr.logp_old, tr.anchor())
    loss = tr.loss(b)
    (grad,) = torch.autograd.grad(loss, [tr.theta])
    theta = tr.theta.detach().clone().requires_grad_(True)
    logp = torch.log_softmax(theta, -1)
    lz = torch.logsumexp(env.logp_ref + 2.0 * env.reward, -1)
    total, ratios = 0.0, []
    for s in range(S):
        seed_loss = 0.0
        for p in range(P):
            for j in range(G):
                y = int(idx[s, p, j])
                ratio = math.exp(float(logp[s, p, y]) - float(tr.logp_old[s, p, y]))
                ratios.append(ratio)
                w = {"max": min(ratio, 10.0), "ratio": ratio, "eps": min(max(ratio, 0.8), 1.2)}[weight_clip]
                delta = lz[p] + logp[s, p, y] - env.logp_ref[p, y] - 2.0 * env.reward[p, y]
                seed_loss = seed_loss + w * delta**2
        total = total + seed_loss / (P * G)
    (want,) = torch.autograd.grad(total, [theta])
    torch.testing.assert_close(loss.detach(), total.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, want, rtol=1e-10, atol=1e-12)
    # the ratios straddle both clips, so each option gives its own loss
    assert max(ratios) > 10 and min(ratios) < 0.8 and any(0.8 < r < 1.2 for r in ratios)


def test_selection_mask_is_zero_one_and_replay_needs_a_valid_slot(env):
    tr = _Trainer(_paced_cfg(select_m=2, scheduler="oracle"), env)
    sel, _ = tr.select()
    assert sorted(set(sel.flatten().tolist())) == [0.0, 1.0] and sel.sum(1).tolist() == [2.0] * S
    # slots that hold outputs but no valid entry are not replayed; one valid slot is
    tr.buf = (torch.ones(S, 7, dtype=torch.long), torch.full((S, 7), 3), torch.zeros(S, 7, dtype=torch.bool))
    assert tr.make_batch(sel).replay is None
    tr.buf[2][1, 4] = True
    assert tr.make_batch(sel).replay is not None


def test_temperature_proposal_is_normalized_p_to_the_one_over_t():
    logp = torch.log_softmax(torch.tensor([[0.3, -1.0, 2.0, 0.0]], dtype=torch.float64), -1)
    for t in (0.5, 1.7):
        q = [math.exp(float(v) / t) for v in logp[0]]
        want = torch.tensor([[math.log(x / sum(q)) for x in q]], dtype=torch.float64)
        torch.testing.assert_close(proposals.temperature_proposal(logp, t), want, rtol=0, atol=1e-14)


@pytest.mark.parametrize("method", ["tb", "lad"])
def test_exact_mode_at_temperature_weights_outputs_by_k_q_t(env, method):
    t = 2.0
    kw = dict(env="multiprompt", P=P, K=K, method=method, tilt_beta=2.0, seeds=1, exact=True, init_scale=0.7)
    tr = _Trainer(SimConfig(**kw, temperature=t), env)
    tr.logp_old = torch.log_softmax(tr.theta.detach(), -1)
    b = tr.make_batch(torch.ones(1, P, dtype=torch.float64))
    q_t = torch.softmax(tr.logp_old / t, -1)
    torch.testing.assert_close(b.w, K * q_t, rtol=1e-12, atol=0)
    assert (b.w - K * tr.logp_old.exp()).abs().max() > 0.05  # T = 1 would be another weighting
    # the gradient is E_{q_T}[grad l(y)] with l built on the untempered pi_old: the same loss at T = 1
    # with pi_old's exact weights replaced by q_T's gives the same gradient
    logits = tr.theta.detach().clone()
    g_t = gradient_at(SimConfig(**kw, temperature=t), env, logits)
    tr1 = _Trainer(SimConfig(**kw, temperature=1.0), env)
    with torch.no_grad():
        tr1.theta.copy_(logits)
    tr1.logp_old = torch.log_softmax(logits, -1)
    b1 = tr1.make_batch(torch.ones(1, P, dtype=torch.float64))
    b1.w = K * q_t
    (g_manual,) = torch.autograd.grad(tr1.loss(b1), [tr1.theta])
    torch.testing.assert_close(g_t, g_manual, rtol=1e-12, atol=1e-14)
    assert (g_t - gradient_at(SimConfig(**kw, temperature=1.0), env, logits)).abs().max() > 1e-3


def test_sampled_batch_at_temperature_follows_q_t(env):
    t, n = 0.6, 6000  # T < 1 sharpens (the exact-mode test above flattens with T = 2)
    tr = _Trainer(SimConfig(env="multiprompt", P=P, K=K, seeds=1, G=n, temperature=t, init_scale=0.7), env)
    tr.logp_old = torch.log_softmax(tr.theta.detach(), -1)
    b = tr.make_batch(torch.ones(1, P, dtype=torch.float64))
    freq = torch.nn.functional.one_hot(b.idx[0], K).double().mean(1)  # [P, K]
    q_t = torch.softmax(tr.logp_old[0] / t, -1)
    sd = (q_t * (1 - q_t) / n).sqrt()
    assert ((freq - q_t).abs() <= 5 * sd).all()  # 5 sigma of a binomial frequency, fixed seed
    assert ((freq - tr.logp_old[0].exp()).abs() > 5 * sd).any()  # and not pi_old itself
    torch.testing.assert_close(b.w, torch.ones_like(b.w))  # sampled rows carry weight 1
