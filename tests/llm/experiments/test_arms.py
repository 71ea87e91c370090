"""The arms of the llm layer's tiny-model checks are what they are labelled (issue 34 item 6): FlowRL's
arms train FlowRL's log Z head with the policy, PACED's table is measured against its own fixed point,
the LAD claims are judged per divergence, and FPA's targeted arms weight rows instead of dropping them.
Each against a naive computation (loops, unpadded forwards, the claim files' own numbers)."""

from __future__ import annotations

import copy
import math
import tomllib
from pathlib import Path

import pytest
import torch

from tiltlab.llm.checks import enumerable, paced
from tiltlab.llm.disa.logz_head import get_log_z_head
from tiltlab.llm.experiments import task as T
from tiltlab.llm.experiments import tiny as tiny_runs
from tiltlab.llm.experiments import training
from tiltlab.objectives.offline import offrl_loss

ROOT = Path(__file__).resolve().parents[3]


def _claim(path: str, cid: str) -> dict:
    claims = tomllib.loads((ROOT / "paper_checks" / "claims" / path).read_text(encoding="utf-8"))["claim"]
    (c,) = [c for c in claims if c["id"] == cid]
    return c


# ------------------------------------------------------------------ FlowRL: the log Z head
def _naive_head_log_z(model, task, i: int) -> torch.Tensor:
    """The head on the mean of the final hidden states of prompt ``i``'s own tokens, from an unpadded
    forward of the prompt text alone."""
    t, d, h = task.prompts[i]
    ids = task.tokenizer(f"t={t} L={d}{' hint' if h else ''}:", add_special_tokens=False)["input_ids"]
    hs = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0]  # [L_i, H]
    return model.log_z_head(hs.mean(0, keepdim=True))[0]


def test_flowrl_head_reads_each_prompts_own_tokens(tiny):
    model, task = tiny
    model = copy.deepcopy(model)
    head = tiny_runs.attach_flowrl_head(model, 3)
    assert not model.training and not head.training
    assert [m.p for m in head.net if isinstance(m, torch.nn.Dropout)] == [0.1, 0.1]
    assert (head.net[0].in_features, head.net[0].out_features) == (model.config.hidden_size, 256)
    with torch.no_grad():
        head.net[-1].weight.normal_(generator=torch.Generator().manual_seed(0))  # past the zero init
    idx = torch.tensor([5, 0, 17, 60])  # plain and hinted prompts of different lengths
    got = tiny_runs.head_log_z(model, task, idx)
    want = torch.stack([_naive_head_log_z(model, task, int(i)) for i in idx])
    torch.testing.assert_close(got, want.float(), rtol=1e-4, atol=1e-5)
    assert got.std() > 0  # a per-prompt value
    # the mean |log Z_phi - log Z| the checks report, against a loop
    lz = torch.linspace(-1.0, 2.0, task.n_prompts, dtype=torch.float64)
    naive = sum(abs(float(want.detach()[j]) - float(lz[i])) for j, i in enumerate(idx)) / len(idx)
    assert tiny_runs.head_abs_err(model, task, idx, lz) == pytest.approx(naive, rel=1e-5)


def test_flowrl_head_is_seeded_and_starts_at_zero(tiny):
    model, task = tiny
    a, b, c = (copy.deepcopy(model) for _ in range(3))
    tiny_runs.attach_flowrl_head(a, 1)
    torch.manual_seed(123)  # the global RNG's state before does not matter
    tiny_runs.attach_flowrl_head(b, 1)
    tiny_runs.attach_flowrl_head(c, 2)
    sa, sb, sc = (m.log_z_head.state_dict() for m in (a, b, c))
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["net.0.weight"], sc["net.0.weight"])
    assert (tiny_runs.head_log_z(a, task, torch.arange(5)) == 0).all()  # zero-initialised last layer: log Z = 0


def test_flowrl_arm_trains_the_head_with_the_policys_optimizer(tiny):
    """The head is a submodule of the policy: ``train_online`` steps it with the policy's parameters at
    the policy's learning rate (FlowRL's code: ``proj_z`` inside the actor, one optimizer); its
    parameters receive gradients and move, and the log Z loss reaches the backbone (input not detached)."""
    model, task = tiny
    model = copy.deepcopy(model)
    head = tiny_runs.attach_flowrl_head(model, 0)
    ids = {id(p) for p in model.parameters()}
    assert all(id(p) in ids for p in head.parameters())
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ref_tok = T.reference_tokens(model, task)
    prompts = task.split(False)
    with tiny_runs.seeded_rng(0):
        trace = training.train_online(
            model, task, ref_tok, tiny_runs.flowrl_head_fn(model, task, 2.0), prompts=prompts, steps=3, lr=1e-3, seed=0
        )
    moved = {n for n, p in model.named_parameters() if not torch.equal(before[n], p.detach())}
    head_names = {n for n in before if n.startswith("log_z_head.")}
    assert head_names and head_names <= moved  # every head parameter moved (the inner layers from step 2 on)
    assert moved - head_names  # and the policy moved
    assert trace.loss_moved and trace.param_change > 0
    # each parameter's first Adam step is lr in size (sign of the gradient): the head's lr is the policy's
    m2 = copy.deepcopy(tiny[0])
    h2 = tiny_runs.attach_flowrl_head(m2, 0)
    b0 = h2.net[-1].bias.detach().clone()
    with tiny_runs.seeded_rng(0):
        training.train_online(
            m2, task, ref_tok, tiny_runs.flowrl_head_fn(m2, task, 2.0), prompts=prompts, steps=1, lr=1e-3
        )
    assert float((h2.net[-1].bias.detach() - b0).abs()) == pytest.approx(1e-3, rel=1e-3)
    # the loss's gradient reaches the backbone through log Z (FlowRL's code leaves the input attached)
    with torch.no_grad():
        head.net[-1].weight.fill_(0.1)
    lz = tiny_runs.head_log_z(model, task, torch.tensor(prompts[:3])).sum()
    g = torch.autograd.grad(lz, model.model.norm.weight)[0]
    assert g.abs().sum() > 0


def test_flowrl_arms_use_the_head_not_a_table(monkeypatch, tiny):
    """``logz_variants``' learned_head arm and the 4-method run's flowrl arm attach FlowRL's head to the
    model they train and pass no extra parameters to ``train_online``."""
    seen = []
    real = training.train_online

    def spy(model, task, ref_tok, fn, **kw):
        seen.append((get_log_z_head(model, required=False) is not None, kw.get("extra_params", ())))
        return real(model, task, ref_tok, fn, **kw)

    monkeypatch.setattr(training, "train_online", spy)
    monkeypatch.setattr(tiny_runs, "_MEMO", {})
    res = enumerable.logz_variants(0, n_seeds=2, steps=2, grad_draws=2)
    names = ("exact", "is_label_m4", "exact_plus_noise", "learned_head", "vargrad")
    assert [h for h, _ in seen] == [k == "learned_head" for k in names] * 2 and all(e == () for _, e in seen)
    for key in ("learned_head_abs_err_start", "learned_head_abs_err_end"):
        assert math.isfinite(res.numbers[key]) and res.numbers[key] > 0
    assert "FlowRL's head" in res.summary and "at the end" in res.summary
    seen.clear()
    raw = tiny_runs.methods_raw(0, 2, 2)
    assert [h for h, _ in seen] == [k == "flowrl" for k in tiny_runs.METHODS] * 2 and all(e == () for _, e in seen)
    assert len(raw["_flowrl_head"]["abs_err_end"]) == 2


# ------------------------------------------------------------------ PACED: the table and its fixed point
def test_paced_table_error_is_against_beta_times_the_policys_pass_rate(tiny):
    model, task = tiny
    idx = torch.tensor([3, 8, 20])
    table = torch.tensor([0.1 * i for i in range(task.n_prompts)])
    pol = T.policy(model, task, idx)
    naive = 0.0
    for j, i in enumerate(idx):
        p = sum(float(pol.probs[j, k]) for k in range(T.K) if float(task.reward[i, k]) == 1.0)
        naive += abs(float(table[i]) - 4.0 * p) / len(idx)
    assert paced.table_abs_err(model, task, idx, table, 4.0) == pytest.approx(naive, rel=1e-9)


# ------------------------------------------------------------------ LAD: per divergence
def _capture(monkeypatch):
    got: dict = {}
    monkeypatch.setattr(enumerable, "result", lambda items, ran, summary, nums, **kw: got.setdefault("items", items))
    return got


class _Log:
    def numbers(self):
        return {}

    def items(self):
        return {}


def _lad_accs(n: int = 3) -> dict[str, list[float]]:
    # every arm differs per seed, so a swapped pair or a seed-misaligned difference gives another number
    return {k: [0.1 * j + 0.013 * i * (j + 1) for i in range(n)] for j, k in enumerate(tiny_runs.LAD_NAMES)}


def test_lad_strict_better_items_are_each_strict_minus_each_nonstrict(monkeypatch):
    acc = _lad_accs()
    monkeypatch.setattr(tiny_runs, "lad_raw", lambda *a, **k: (acc, None, _Log()))
    got = _capture(monkeypatch)
    enumerable.lad_divergences(0, n_seeds=3, steps=1)
    items = {it.name: it for it in got["items"]}
    assert len(items) == 9
    for a in ("tv", "hellinger", "js"):
        for b in ("kl", "rkl", "jeffreys"):
            it = items[f"{a}_minus_{b}"]
            assert it.values == pytest.approx([acc[a][s] - acc[b][s] for s in range(3)], abs=1e-15)
            assert it.margin == 0.02 and it.kind == "effect"
    # the strict / non-strict split is the paper's (Table 8's strict and non_strict columns)
    c = _claim("lad_empirical.toml", "lad.table8.divergences")["paper_numbers"]
    short = {"tv": "TV", "hellinger": "HD", "js": "JS", "kl": "KL", "jeffreys": "JF", "rkl": "rKL"}
    assert {short[d] for d in enumerable.STRICT} == set(c["strict"])
    assert {short[d] for d in enumerable.NON_STRICT} == set(c["non_strict"])


def test_lad_table8_items_are_adjacent_pairs_in_the_papers_order(monkeypatch):
    c = _claim("lad_empirical.toml", "lad.table8.divergences")["paper_numbers"]
    short = {"tv": "TV", "hellinger": "HD", "js": "JS", "kl": "KL", "jeffreys": "JF", "rkl": "rKL"}
    avg = {d: c["avg32"][short[d]][-1] for d in short}  # the Average column
    assert list(enumerable.TABLE8_ORDER) == sorted(avg, key=avg.get, reverse=True)
    # held-out accuracies in the paper's order: every item positive; reversed: every item negative
    rank = {d: r for r, d in enumerate(enumerable.TABLE8_ORDER)}
    hacc = {k: [1.0 - 0.1 * rank.get(k, 0) + 0.001 * s for s in range(3)] for k in tiny_runs.LAD_NAMES}
    monkeypatch.setattr(tiny_runs, "lad_raw", lambda *a, **k: (None, hacc, _Log()))
    got = _capture(monkeypatch)
    enumerable.lad_table8(0, n_seeds=3, steps=1)
    names = [it.name for it in got["items"]]
    assert names == [
        "heldout_js_minus_hellinger",
        "heldout_hellinger_minus_tv",
        "heldout_tv_minus_kl",
        "heldout_kl_minus_jeffreys",
        "heldout_jeffreys_minus_rkl",
    ]
    assert all(d == pytest.approx(0.1) for it in got["items"] for d in it.values)
    assert all(it.margin == 0.02 for it in got["items"])


def test_lad_items_are_declared_in_the_claim_files():
    for path, cid, names in (
        ("core.toml", "lad.strict_better", [f"{a}_minus_{b}" for a, b in enumerable.STRICT_PAIRS]),
        (
            "lad_empirical.toml",
            "lad.table8.divergences",
            [f"heldout_{a}_minus_{b}" for a, b in enumerable.TABLE8_PAIRS],
        ),
    ):
        rows = [r for r in _claim(path, cid)["item"] if r["layer"] == "llm"]
        assert [r["name"] for r in rows] == names
        assert all(r["kind"] == "effect" and r["margin"] == 0.02 and r["why"] for r in rows)


# ------------------------------------------------------------------ FPA: targeted weighting, all data kept
def _fpa_batch(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    n = 7
    lengths = torch.randint(1, 6, (n,), generator=gen).double()
    logp = (-3 * torch.rand(n, generator=gen, dtype=torch.float64)).requires_grad_(True)
    future = logp.detach() + 0.5 * torch.randn(n, generator=gen, dtype=torch.float64)
    reward = torch.tensor([1.0, -1.0, -1.0, 1.0, 1.0, -1.0, 1.0], dtype=torch.float64)
    return logp, future, lengths, reward


@pytest.mark.parametrize("apply_to", ["all", "correct", "incorrect"])
def test_fpa_targeted_loss_equals_a_per_row_loop(apply_to):
    """Value and gradient: a targeted row's weight is sg(pi_hat)^{1/|y|}, every other row's
    sg(pi)^{1/|y|} (Off-RL's), and every row counts in the mean."""
    logp, future, lengths, reward = _fpa_batch()
    loss = tiny_runs.fpa_targeted_loss(logp, future, lengths, reward, apply_to)
    (grad,) = torch.autograd.grad(loss, logp)
    n = len(logp)
    want, want_grad = 0.0, []
    for i in range(n):
        r, ln, lp = float(reward[i]), float(lengths[i]), float(logp.detach()[i])
        targeted = apply_to == "all" or (apply_to == "correct") == (r > 0)
        w = math.exp((float(future[i]) if targeted else lp) / ln)
        want += -r * w * lp / ln / n
        want_grad.append(-r * w / ln / n)
    assert float(loss.detach()) == pytest.approx(want, rel=1e-12)
    torch.testing.assert_close(grad, torch.tensor(want_grad, dtype=grad.dtype), rtol=1e-12, atol=0)
    if apply_to != "all":  # an untargeted row's gradient is Off-RL's
        (g_off,) = torch.autograd.grad(offrl_loss(logp, lengths, reward).loss, logp)
        off = (reward > 0) if apply_to == "incorrect" else (reward < 0)
        torch.testing.assert_close(grad[off], g_off[off], rtol=1e-12, atol=0)
        assert not torch.allclose(grad[~off], g_off[~off])


def test_fpa_targeted_loss_refuses_an_unknown_part():
    logp, future, lengths, reward = _fpa_batch()
    with pytest.raises(ValueError, match="apply_to must be one of"):
        tiny_runs.fpa_targeted_loss(logp, future, lengths, reward, "correct_only")


@pytest.mark.parametrize("apply_to", ["all", "correct", "incorrect"])
def test_fpa_train_keeps_every_row_of_each_batch(tiny, monkeypatch, apply_to):
    model, task = tiny
    calls = []
    real = tiny_runs.fpa_targeted_loss

    def spy(logp, logp_future, lengths, reward, part="all"):
        calls.append((len(reward), part, int((reward > 0).sum()), int((reward < 0).sum())))
        return real(logp, logp_future, lengths, reward, part)

    monkeypatch.setattr(tiny_runs, "fpa_targeted_loss", spy)
    gen = torch.Generator().manual_seed(0)
    data_idx = torch.tensor(task.split(False)).repeat_interleave(4)
    data_ans = torch.randint(0, T.K, (len(data_idx),), generator=gen)
    reward = 2.0 * task.reward[data_idx, data_ans] - 1.0
    m = copy.deepcopy(model)
    trace = tiny_runs.fpa_train(m, model, task, data_idx, data_ans, reward, 1.0, 3, 1e-3, 0, apply_to=apply_to)
    assert len(trace.losses) == 3 and [c[:2] for c in calls] == [(64, apply_to)] * 3
    assert all(pos > 0 and neg > 0 for _, _, pos, neg in calls)  # both parts in every batch


def test_setup_names_what_each_check_starts_from(tiny):
    """``tiny_runs.setup`` returns a :class:`tiny_runs.Setup`: the reference's tokens and exact policy, the
    two disjoint splits and, with a beta, the exact log Z of every prompt (None without one)."""
    st = tiny_runs.setup(0, beta=2.0)
    assert isinstance(st, tiny_runs.Setup) and len(st) == 7
    assert st.ref_tokens.shape[:2] == st.task.reward.shape
    torch.testing.assert_close(st.ref.log_probs, torch.log_softmax(st.ref_tokens.sum(-1).double(), -1))
    assert st.train_idx == st.task.split(False) and st.heldout_idx == st.task.split(True)
    assert st.train_idx and st.heldout_idx and not set(st.train_idx) & set(st.heldout_idx)
    want = torch.logsumexp(st.ref.log_probs + 2.0 * st.task.reward.double(), -1)  # log sum_y pi_ref e^{beta r}
    torch.testing.assert_close(st.log_z, want)
    assert tiny_runs.setup(0).log_z is None
