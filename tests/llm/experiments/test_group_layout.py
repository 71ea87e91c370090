"""Per-prompt values laid over a prompt's G completions: every place in llm/ and objectives/ that
broadcasts a per-prompt (or per-group) value onto the group-major rows ``b = p * G + j``, against an
explicit loop over (prompt, completion).

The class of bug: ``repeat`` where ``repeat_interleave`` is meant (``[z0, z1, z2, z0, ...]`` instead of
``[z0, z0, ..., z1, ...]``), ``view(g, -1)`` for ``view(-1, g)``, a transposed reshape. A test that
rebuilds the column the way the code does agrees with it; here every expected number comes from a
loop that indexes ``(p, j)`` by hand, on >= 3 prompts that differ (a distinct log Z per prompt, taken
out of a larger table in a scrambled order), G >= 2 and P != G, so any other layout gives another
number. The TRL trainer's places are in ``test_group_layout_trainer.py``."""

from __future__ import annotations

import math

import pytest
import torch

from tiltlab.llm.checks import paced as checks_paced
from tiltlab.llm.experiments import tiny as tiny_runs
from tiltlab.llm.experiments import training, warmup

IDX = torch.tensor([5, 0, 3])  # the batch's prompts in the log Z table: distinct, not in order
P, G, L = 3, 4, 5  # prompts, completions per prompt (P != G), tokens
B = P * G
TABLE = torch.tensor([0.3, -1.2, 2.5, 0.9, -0.4, 1.7, 3.1], dtype=torch.float32)  # one log Z per prompt
# each group its own pattern, so a row read from another group has another reward
REWARD = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 1.0, 1.0], [0.0, 0.0, 1.0, 0.0]])
BETA = 1.7
TOL = dict(rtol=1e-5, atol=1e-6)


def _batch(seed: int = 0) -> training.Batch:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, L + 1, (B,), generator=gen)
    mask = (torch.arange(L)[None, :] < lengths[:, None]).float()
    logp = (-2 * torch.rand(B, L, generator=gen)) * mask
    old = (logp + 0.3 * torch.randn(B, L, generator=gen)) * mask
    ref = (logp - 0.5 + 0.4 * torch.randn(B, L, generator=gen)) * mask
    logp = logp.clone().requires_grad_(True)
    ans = torch.zeros(P, G, dtype=torch.long)
    return training.Batch(IDX.clone(), ans, logp, old, ref, mask, REWARD.clone(), logp)


def _seq(x: torch.Tensor, mask: torch.Tensor, b: int) -> float:
    return sum(float(x[b, t]) * float(mask[b, t]) for t in range(x.shape[1]))


def _rows():
    """``(b, p, j)`` for every row of the group-major batch."""
    return [(p * G + j, p, j) for p in range(P) for j in range(G)]


def _tb_loss_and_grad(b: training.Batch, log_z_of_prompt, anchor, weight=None):
    """``mean_b w_b (log Z_p + lp_b - anchor_b - beta r_pj)^2`` by a loop, and its gradient with
    respect to the token log-probs (``2 w_b delta_b / B`` on each unmasked token of row ``b``)."""
    total, grad = 0.0, torch.zeros(B, L)
    for row, p, j in _rows():
        lp = _seq(b.logp.detach(), b.mask, row)
        delta = log_z_of_prompt(p) + lp - _seq(anchor, b.mask, row) - BETA * float(REWARD[p, j])
        w = 1.0 if weight is None else weight(row)
        total += w * delta**2
        grad[row] = 2 * w * delta / B * b.mask[row]
    return total / B, grad


def _loss_and_logp_grad(fn, b: training.Batch, *extra):
    loss = fn(b)
    grads = torch.autograd.grad(loss, [b.logp, *extra], allow_unused=True)
    return loss.detach(), grads


# ------------------------------------------------------------------ llm/checks/enumerable.py and paced.py
def test_disa_arm_reads_each_prompts_frozen_log_z_on_its_own_completions():
    b = _batch()
    loss, (g_logp,) = _loss_and_logp_grad(tiny_runs.disa_fn(TABLE.double(), BETA), b)
    want, w_grad = _tb_loss_and_grad(b, lambda p: float(TABLE[IDX[p]]), b.logp_ref)
    torch.testing.assert_close(loss, torch.tensor(want, dtype=loss.dtype), **TOL)
    torch.testing.assert_close(g_logp, w_grad, **TOL)


def test_learned_table_arm_reads_and_trains_each_prompts_own_entry():
    """FlowRL's loss (``flowrl_fn``, the arm's loss with the head's ``[P]`` log Z swapped for a table
    read): the loss, and the log Z gradient entry by entry (only the batch's prompts get one, each from
    its own completions)."""
    b = _batch(1)
    table = torch.nn.Parameter(TABLE.clone())
    loss, (g_logp, g_table) = _loss_and_logp_grad(tiny_runs.flowrl_fn(lambda idx: table[idx], BETA), b, table)

    def w(row):  # the arm's weight: exp(sum_t mask (logp - logp_old)), unclipped
        return math.exp(_seq(b.logp.detach() - b.logp_old, b.mask, row))

    want, w_grad = _tb_loss_and_grad(b, lambda p: float(TABLE[IDX[p]]), b.logp_ref, w)
    torch.testing.assert_close(loss, torch.tensor(want, dtype=loss.dtype), **TOL)
    torch.testing.assert_close(g_logp, w_grad, **TOL)
    w_table = torch.zeros_like(TABLE)
    for row, p, j in _rows():
        delta = float(TABLE[IDX[p]]) + _seq(b.logp.detach() - b.logp_ref, b.mask, row) - BETA * float(REWARD[p, j])
        w_table[IDX[p]] += 2 * w(row) * delta / B
    torch.testing.assert_close(g_table, w_table, **TOL)
    assert (g_table[[1, 2, 4, 6]] == 0).all() and (g_table[IDX] != 0).all()


def test_vargrad_arm_estimates_log_z_from_each_prompts_own_group():
    b = _batch(2)
    fn = tiny_runs._variants(TABLE.double(), TABLE.double(), TABLE.double(), BETA, lambda idx: TABLE[idx])["vargrad"]
    loss, (g_logp,) = _loss_and_logp_grad(fn, b)

    def log_z_hat(p):  # the group's minimizer: mean_j (beta r - lp + lp_ref)
        return (
            sum(BETA * float(REWARD[p, j]) - _seq(b.logp.detach() - b.logp_ref, b.mask, p * G + j) for j in range(G))
            / G
        )

    want, w_grad = _tb_loss_and_grad(b, log_z_hat, b.logp_ref)
    torch.testing.assert_close(loss, torch.tensor(want, dtype=loss.dtype), **TOL)
    # at the group's minimizer the log Z term's own gradient vanishes, so the per-row gradient is the
    # frozen-log-Z one: a log Z taken from another group's rows is another number
    torch.testing.assert_close(g_logp, w_grad, **TOL)


def test_paced_arm_reads_each_prompts_table_entry_anchored_on_pi_old():
    b = _batch(3)
    table = torch.nn.Parameter(TABLE.clone())
    loss, (g_logp, g_table) = _loss_and_logp_grad(checks_paced.paced_fn(table, BETA), b, table)
    want, w_grad = _tb_loss_and_grad(b, lambda p: float(TABLE[IDX[p]]), b.logp_old)
    torch.testing.assert_close(loss, torch.tensor(want, dtype=loss.dtype), **TOL)
    torch.testing.assert_close(g_logp, w_grad, **TOL)
    w_table = torch.zeros_like(TABLE)
    for row, p, j in _rows():
        delta = float(TABLE[IDX[p]]) + _seq(b.logp.detach() - b.logp_old, b.mask, row) - BETA * float(REWARD[p, j])
        w_table[IDX[p]] += 2 * delta / B
    torch.testing.assert_close(g_table, w_table, **TOL)


def _group_adv(p: int, j: int) -> float:
    r = [float(x) for x in REWARD[p]]
    mean = sum(r) / G
    std = math.sqrt(sum((x - mean) ** 2 for x in r) / (G - 1))
    return (r[j] - mean) / (std + 1e-6)


@pytest.mark.parametrize(
    "arm",
    [
        pytest.param(lambda: tiny_runs.method_fns("grpo", None, BETA), id="stage3-grpo"),
        pytest.param(lambda: tiny_runs.method_fns("gspo", None, BETA), id="stage3-gspo"),
        pytest.param(lambda: checks_paced._grpo, id="paced-grpo"),
    ],
)
def test_policy_gradient_arms_give_each_row_its_own_groups_advantage(arm):
    """On-policy (``logp_old = logp``) the GRPO / GSPO gradient on a row's tokens is ``-A_b`` times a
    positive factor: its sign is the sign of the row's own group advantage, 0 where that is 0."""
    b = _batch(4)
    b = training.Batch(b.prompt_idx, b.ans, b.logp, b.logp.detach().clone(), b.logp_ref, b.mask, b.reward, b.logp)
    (g,) = torch.autograd.grad(arm()(b), [b.logp])
    for row, p, j in _rows():
        a = _group_adv(p, j)
        on = b.mask[row].bool()
        assert a != 0
        assert (torch.sign(g[row][on]) == -math.copysign(1.0, a)).all(), (row, a, g[row])


def test_gather_tokens_is_group_major():
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(P, 9, L, generator=gen)
    ans = torch.randint(0, 9, (P, G), generator=gen)
    out = training.gather_tokens(x, ans)
    for row, p, j in _rows():
        assert torch.equal(out[row], x[p, ans[p, j]])


def test_offline_fpa_data_pairs_each_answer_with_its_own_prompt(tmp_path, monkeypatch):
    """The FPA sweep's offline data (``tr_t.repeat_interleave(8)`` beside ``ans.reshape(-1)``): row
    ``p * 8 + j`` is the ``j``-th answer sampled for train prompt ``p``, with that pair's reward."""
    monkeypatch.setenv("TILTLAB_CACHE", str(tmp_path))
    monkeypatch.setattr(warmup, "WARM_STEPS", 1)
    sampled = []
    real_sample = training.sample_answers

    def spy(log_probs, g, gen):
        ans = real_sample(log_probs, g, gen)
        sampled.append(ans.clone())
        return ans

    class Seen(Exception):
        pass

    def stop(model, ref_model, task, data_idx, data_ans, reward, *a, **k):
        raise Seen(task, data_idx.clone(), data_ans.clone(), reward.clone())

    monkeypatch.setattr(training, "sample_answers", spy)
    monkeypatch.setattr(tiny_runs, "fpa_train", stop)
    tiny_runs._MEMO.clear()
    with pytest.raises(Seen) as e:
        tiny_runs._fpa_raw(0, 1, 1, (1.0,))
    task, data_idx, data_ans, reward = e.value.args
    (ans,) = sampled
    tr = task.split(False)
    assert ans.shape[1] == 8 and len(tr) >= 3 and len(set(tr)) == len(tr)
    for p, prompt in enumerate(tr):
        for j in range(8):
            row = p * 8 + j
            assert (int(data_idx[row]), int(data_ans[row])) == (prompt, int(ans[p, j]))
            assert float(reward[row]) == 2.0 * float(task.reward[prompt, ans[p, j]]) - 1.0


# ------------------------------------------------------------------ objectives/tb.py
def test_flowrl_loss_lays_a_per_prompt_log_z_and_flat_rewards_over_groups():
    """``flowrl_loss`` with ``log_z`` ``[P]`` and ``rewards`` ``[B]`` + ``group_size``: per row the
    group-normalized reward of its own group and its own prompt's log Z."""
    from tiltlab.objectives.tb import flowrl_loss

    b = _batch(6)
    log_z = TABLE[IDX].clone()
    r_flat = (REWARD + 0.1 * torch.arange(B).view(P, G)).reshape(-1)  # no two rows alike
    loss = flowrl_loss(
        b.logp, b.logp_ref, b.logp_old, b.mask, r_flat, log_z, beta=BETA, length_normalize=False,
        group_normalize=True, weight_clip="ratio", group_size=G,
    ).loss  # fmt: skip
    want = 0.0
    for row, p, _ in _rows():
        grp = [float(r_flat[p * G + k]) for k in range(G)]
        mean = sum(grp) / G
        std = math.sqrt(sum((x - mean) ** 2 for x in grp) / (G - 1))
        adv = (float(r_flat[row]) - mean) / (std + 1e-6)
        w = math.exp(_seq(b.logp.detach() - b.logp_old, b.mask, row))
        delta = float(log_z[p]) + _seq(b.logp.detach() - b.logp_ref, b.mask, row) - BETA * adv
        want += w * delta**2 / B
    torch.testing.assert_close(loss.detach(), torch.tensor(want), **TOL)
