"""The llm layer's shared task (exact quantities against brute force) and each check's machinery
at a tiny budget (the full checks are slow and run with ``tiltlab check --layer llm --slow``)."""

from __future__ import annotations

import math

import pytest
import torch

from tiltlab.claims import registry, stats
from tiltlab.claims.registry import CheckResult, Verdict
from tiltlab.llm.checks import computed, enumerable, paced
from tiltlab.llm.experiments import task as T
from tiltlab.llm.experiments import tiny as tiny_runs
from tiltlab.llm.experiments import training, warmup
from tiltlab.objectives.metrics import tv_distance
from tiltlab.paper_checks import catalog


def test_tilted_log_z_tv_match_brute_force():
    gen = torch.Generator().manual_seed(1)
    log_ref = torch.log_softmax(torch.randn(5, 7, generator=gen, dtype=torch.float64), -1)
    r = (torch.rand(5, 7, generator=gen) < 0.4).double()
    beta = 1.7
    log_star, log_z = T.tilted(log_ref, r, beta)
    for i in range(5):
        z = sum(math.exp(log_ref[i, k].item()) * math.exp(beta * r[i, k].item()) for k in range(7))
        assert log_z[i].item() == pytest.approx(math.log(z), rel=1e-12)
        for k in range(7):
            want = math.exp(log_ref[i, k].item()) * math.exp(beta * r[i, k].item()) / z
            assert log_star[i, k].exp().item() == pytest.approx(want, rel=1e-10)
    q = torch.log_softmax(torch.randn(5, 7, generator=gen, dtype=torch.float64), -1)
    tv = tv_distance(log_star, q)
    brute = [0.5 * sum(abs(log_star[i, k].exp().item() - q[i, k].exp().item()) for k in range(7)) for i in range(5)]
    assert tv.tolist() == pytest.approx(brute, rel=1e-12)
    # binary reward: the tilted pass rate is p e^b / (p e^b + 1 - p)
    p = (log_ref.exp() * r).sum(-1)
    p_star = (log_star.exp() * r).sum(-1)
    assert p_star.tolist() == pytest.approx((p * math.e**beta / (p * math.e**beta + 1 - p)).tolist(), rel=1e-10)


def test_task_layout_rewards_and_ragged_lengths(tiny):
    _, task = tiny
    assert task.ids.shape[:2] == (task.n_prompts, T.K)
    assert (task.reward.sum(-1) == T.N_CORRECT).all()
    for i, (t, _, _) in enumerate(task.prompts):
        assert task.reward[i].nonzero().flatten().tolist() == [n for n in range(T.K) if n % 4 == t % 4]
    lengths = task.lengths()
    assert lengths[0, 3].item() == 2 and lengths[0, 12].item() == 3  # digit(s) + end of turn
    assert set(task.split(False)).isdisjoint(task.split(True))


def test_teacher_forced_logprob_equals_unpadded_forward(tiny):
    """The padded, batched teacher forcing gives each answer's log-prob as an unpadded forward does."""
    model, task = tiny
    tok = task.tokenizer
    i = task.index(5, 2)
    pol = T.policy(model, task, [i])
    for n in (0, 7, 13):
        ids = tok("t=5 L=2:", add_special_tokens=False)["input_ids"]
        ans = tok(f"{n}", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        x = torch.tensor([ids + ans])
        with torch.no_grad():
            lp = torch.log_softmax(model(input_ids=x).logits[0, :-1].double(), -1)
        want = sum(lp[len(ids) - 1 + j, a].item() for j, a in enumerate(ans))
        assert pol.seq_logp[0, n].item() == pytest.approx(want, abs=1e-4)
    assert pol.probs.sum().item() == pytest.approx(1.0, abs=1e-12)
    assert 0.0 <= pol.leak.item() < 1.0


def _unpadded_answer_logp(model, task, p: int, k: int) -> float:
    """Answer ``k``'s log-prob on prompt ``p`` from one forward of the unpadded sequence alone: the
    real tokens of the teacher-forcing row (padding of both sides cut off), each answer token scored
    by the position before it."""
    real = task.attn[p, k].bool()
    x = task.ids[p, k][real]
    is_answer = torch.nn.functional.pad(task.comp_mask[p, k], (1, 0))[real].bool()  # aligned with x
    with torch.no_grad():
        lp = torch.log_softmax(model(input_ids=x[None]).logits[0].double(), -1)
    return sum(float(lp[j - 1, x[j]]) for j in range(1, len(x)) if is_answer[j])


def test_reference_token_logps_are_zero_at_padded_slots_and_sum_to_each_unpadded_forward(tiny):
    """``reference_tokens`` (what every arm's ``logp_ref`` and the exact pi_ref are read from) on
    answers of different lengths (one and two digits) after prompts of different lengths (plain and
    hinted: another left padding): 0 at every slot outside the answer (the prompt's own tokens and
    the right padding would carry real, non-zero log-probs there), and each answer's row sums,
    unmasked, to a per-sequence forward."""
    model, task = tiny
    ref_tok = T.reference_tokens(model, task)
    assert ref_tok.shape == task.comp_mask.shape
    outside = task.comp_mask == 0
    assert outside.any(-1).all() and (ref_tok[outside] == 0).all()
    lengths = task.comp_mask.sum(-1)
    prompts = [task.index(5, 2), task.index(0, 0, True), task.index(7, 5, True), task.index(3, 1)]
    assert len({int(task.attn[p, 0].sum()) for p in prompts}) > 1  # prompts of different lengths
    for p in prompts:
        assert len({int(n) for n in lengths[p]}) > 1  # ragged answers
        for k in range(T.K):
            want = _unpadded_answer_logp(model, task, p, k)
            assert float(ref_tok[p, k].sum()) == pytest.approx(want, abs=1e-4), (p, k)


def test_train_online_batch_reference_rows_are_each_sampled_answers_own(tiny):
    """The batch an arm's loss sees: row ``p * G + j`` of ``logp_ref`` is 0 outside answer
    ``ans[p, j]`` of prompt ``prompt_idx[p]`` and sums, unmasked, to its per-sequence forward under
    the reference (here the model itself, with ``lr = 0``)."""
    model, task = tiny
    ref_tok = T.reference_tokens(model, task)
    seen = []

    def spy(b):
        seen.append(b)
        return b.logp.sum() * 0.0

    training.train_online(model, task, ref_tok, spy, prompts=task.split(False), steps=1, lr=0.0, batch_prompts=3, g=4)
    (b,) = seen
    assert b.logp_ref.shape == b.mask.shape and (b.logp_ref[b.mask == 0] == 0).all()
    n_g = b.ans.shape[1]
    for p, prompt in enumerate(b.prompt_idx.tolist()):
        for j in range(n_g):
            row, k = p * n_g + j, int(b.ans[p, j])
            assert torch.equal(b.mask[row], task.comp_mask[prompt, k])
            want = _unpadded_answer_logp(model, task, prompt, k)
            assert float(b.logp_ref[row].sum()) == pytest.approx(want, abs=1e-4), (row, prompt, k)


def test_sample_answers_follow_the_distribution():
    log_p = torch.log(torch.tensor([[0.7, 0.2, 0.1, 0.0], [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64))
    ans = training.sample_answers(log_p, 20_000, torch.Generator().manual_seed(0))
    freq = torch.stack([(ans == k).double().mean(1) for k in range(4)], 1)
    sd = (log_p.exp() * (1 - log_p.exp()) / 20_000).sqrt()
    assert ((freq - log_p.exp()).abs() <= 5 * sd + 1e-12).all()
    assert (ans[0] != 3).all()


def test_stage1_labels_with_a_proposal_other_than_pi_ref():
    """DISA eq. (8) with q != pi_ref: log w = log pi_ref - log q + beta r. At q = pi_ref the log q term
    cancels, so only a proposal that differs from pi_ref tests it (the weak/strong-proposal checks)."""
    from types import SimpleNamespace

    g = torch.Generator().manual_seed(2)
    p, k, beta = 3, 6, 1.5
    log_ref = torch.log_softmax(torch.randn(p, k, generator=g, dtype=torch.float64), -1)
    log_q = torch.log_softmax(2 * torch.randn(p, k, generator=g, dtype=torch.float64), -1)
    reward = (torch.rand(p, k, generator=g) < 0.5).double()
    reward[:, 0], reward[:, 1] = 1.0, 0.0  # both outcomes in every row
    ref, task = SimpleNamespace(log_probs=log_ref), SimpleNamespace(reward=reward)
    idx = [0, 1, 2]
    # the same M draws from q as the function takes (the generator seeded alike): a loop over them
    m = 5
    got = tiny_runs.stage1_labels(ref, task, idx, beta, m, torch.Generator().manual_seed(7), proposal=log_q)
    ans = torch.multinomial(log_q.exp().float(), m, replacement=True, generator=torch.Generator().manual_seed(7))
    for i in range(p):
        w = [math.exp(log_ref[i, a] - log_q[i, a] + beta * reward[i, a]) for a in ans[i].tolist()]
        assert got[i].item() == pytest.approx(math.log(sum(w) / m), rel=1e-12)
    # unbiased for Z = sum_k pi_ref e^(beta r) whatever q is: with M = 40000 draws the label is within 5
    # standard errors of log Z (delta method, the exact variance of w under q), far from log E_q[pi_ref e^(beta r)]
    m = 40_000
    got = tiny_runs.stage1_labels(ref, task, idx, beta, m, torch.Generator().manual_seed(8), proposal=log_q)
    f = log_ref.exp() * torch.exp(beta * reward)  # pi_ref e^(beta r), [P, K]
    z = f.sum(-1)
    se = ((f**2 / log_q.exp()).sum(-1) - z**2).sqrt() / math.sqrt(m) / z
    wrong = torch.log((log_q.exp() * f).sum(-1))  # what the label would be without the log q term
    assert ((got - z.log()).abs() < 5 * se).all(), (got, z.log(), se)
    assert ((wrong - z.log()).abs() > 50 * se).all()


def test_mean_ci():
    m, lo, hi = stats.mean_ci([1.0, 2.0, 3.0])
    assert m - lo == pytest.approx(hi - m)
    assert m == 2.0 and hi - m == pytest.approx(4.302652729749464 / math.sqrt(3), rel=1e-9)  # t(0.975, df=2)
    assert stats.mean_ci([0.5]) == (0.5, 0.5, 0.5)


CASES = [
    (enumerable.target_tracking, dict(n_seeds=2, steps=2)),
    (enumerable.logz_variants, dict(n_seeds=2, steps=2, grad_draws=2)),
    (enumerable.m_study, dict(n_seeds=2, steps=2, ms=(1, 2, 8, 32))),
    (enumerable.proposal_strength, dict(n_seeds=2, steps=2)),
    (enumerable.stage2_denoising, dict(n_seeds=2)),
    (enumerable.methods_compare, dict(n_seeds=2, steps=2)),
    (enumerable.lad_divergences, dict(n_seeds=2, steps=2)),
    (enumerable.fpa_entanglement, dict(n_seeds=2, steps=2)),
    (enumerable.lad_table8, dict(n_seeds=2, steps=2)),
    (enumerable.fpa_lambda_best, dict(n_seeds=2, steps=2)),
    (paced.tau_sweep, dict(n_seeds=2, steps=3)),
    (paced.tau_sweep_fig4, dict(n_seeds=2, steps=3)),
    (paced.paced_vs_baselines, dict(n_seeds=2, steps=3)),
    (paced.difficulty_rises, dict(n_seeds=2, steps=3)),
    (computed.diversity_coverage, dict(n_seeds=2, steps=2)),
    (computed.code_pass_at_k, dict(n_seeds=2, steps=2)),
    (computed.vargrad_vs_learned, dict(n_seeds=2, steps=2, grad_draws=2)),
]
IDS = [c[0].__name__ for c in CASES]


def _registered(fn):
    """The registered checks whose function is ``fn`` (a check may decide several claims)."""
    catalog.discover()
    return [c for c in registry.checks() if c.layer == "llm" and c.fn is fn]


def test_every_tiny_check_is_in_the_cases():
    from tiltlab.claims import registry

    catalog.discover()
    tiny = {c.fn for c in registry.checks() if c.layer == "llm" and c.name == "tiny_qwen3_enum"}
    assert tiny == {fn for fn, _ in CASES}


@pytest.fixture
def fresh_memo(monkeypatch):
    """Each variant trains anew (the memoized multi-claim runs would otherwise be shared)."""
    monkeypatch.setattr(tiny_runs, "_MEMO", {})


@pytest.mark.parametrize("fn,kw", CASES, ids=IDS)
def test_check_machinery_tiny_budget(tiny, fn, kw, fresh_memo):
    res = fn(0, **kw)
    assert isinstance(res, CheckResult)
    assert res.verdict in set(Verdict)
    assert res.numbers and all(not isinstance(v, float) or math.isfinite(v) for v in res.numbers.values())
    ran = {k: v for k, v in res.items.items() if k.startswith("ran_")}
    assert ran and all(ran.values()), ran  # a real (if tiny) run trains: every "it ran" item holds
    for chk in _registered(fn):  # every expected item is reported, and the "it ran" ones expect True
        assert set(dict(chk.expected_items)) == set(res.items), chk.key
        assert all(v for k, v in chk.expected_items if k.startswith("ran_")), chk.key
        assert res.numbers["seeds"] == 2
        registry.check_evidence(chk, res)  # items as the registry declares them; verdict re-derives
        assert [len(i["values"]) for i in res.evidence["items"]] == [2] * len(res.evidence["items"])


def _optimizer_classes():
    out, todo = [], [torch.optim.Optimizer]
    while todo:
        c = todo.pop()
        out.append(c)
        todo.extend(c.__subclasses__())
    return out


@pytest.fixture
def patch_step():
    """Replace ``step`` of Adam and every subclass (AdamW), restoring every optimizer class's own
    ``step`` afterwards: torch's profiling hook writes a wrapped ``step`` onto the class of the
    first optimizer it builds, so a plain ``setattr`` undo would leave AdamW patched for later tests."""
    saved = {c: c.__dict__.get("step") for c in _optimizer_classes()}

    def patch(fn):
        for c in _optimizer_classes():
            if issubclass(c, torch.optim.Adam):
                c.step = fn

    yield patch
    for c in _optimizer_classes():
        own = saved.get(c)
        if own is None:
            if "step" in c.__dict__:
                delattr(c, "step")
        else:
            c.step = own


def _noop_step(self, closure=None):  # an optimizer that never moves a weight: a run with no learning
    return None


@pytest.mark.parametrize("fn,kw", CASES, ids=IDS)
def test_a_run_that_does_not_train_fails_its_check(tiny, fn, kw, fresh_memo, patch_step):
    from tiltlab.claims.registry import Outcome

    patch_step(_noop_step)
    res = fn(0, **kw)
    ran = {k: v for k, v in res.items.items() if k.startswith("ran_")}
    assert ran and not all(ran.values()), ran
    assert res.verdict is Verdict.INCONCLUSIVE
    for chk in _registered(fn):
        out = Outcome(chk, res, 0.0)
        assert not out.ok and any(k.startswith("ran_") for k in out.item_changes), chk.key


def _nan_step(self, closure=None):  # a step that leaves NaN weights behind (a diverged run)
    for group in self.param_groups:
        for p in group["params"]:
            p.data.fill_(float("nan"))


@pytest.mark.parametrize("fn,kw", CASES, ids=IDS)
def test_a_nan_run_is_an_error_not_a_verdict(tiny, fn, kw, fresh_memo, patch_step):
    patch_step(_nan_step)
    with pytest.raises((FloatingPointError, ValueError), match="non-finite|NaN|nan"):
        fn(0, **kw)


def test_paced_table_fixed_point_is_beta_times_pass_rate():
    """PACED's TB anchored on the rollout policy: on-policy, the log Z table's gradient vanishes at
    beta * (the group's mean reward), so p_hat = log Z / beta reads the pass rate (Prop. 4.1)."""
    gen = torch.Generator().manual_seed(3)
    p, g, t, beta = 3, 5, 4, 4.0
    reward = (torch.rand(p, g, generator=gen) < 0.4).float()
    lp = torch.randn(p * g, t, generator=gen)
    mask = torch.ones(p * g, t)
    table = torch.zeros(6, requires_grad=True)
    idx = torch.tensor([4, 0, 2])
    with torch.no_grad():
        table[idx] = beta * reward.mean(1)
    b = training.Batch(idx, torch.zeros(p, g, dtype=torch.long), lp.clone(), lp.clone(), lp - 1.0, mask, reward, lp)
    (grad,) = torch.autograd.grad(paced.paced_fn(table, beta)(b), table)
    assert grad.abs().max().item() < 1e-6
    with torch.no_grad():
        table[idx] += 0.5  # above the fixed point: gradient descent lowers it
    (grad,) = torch.autograd.grad(paced.paced_fn(table, beta)(b), table)
    assert (grad[idx] > 0).all() and (grad[[1, 3, 5]] == 0).all()


def test_train_online_reports_what_the_run_did(tiny, monkeypatch):
    model, task = tiny
    ref_tok = T.reference_tokens(model, task)
    lz = torch.zeros(task.n_prompts, dtype=torch.float64)
    m = __import__("copy").deepcopy(model)
    before = [q.detach().clone() for q in m.parameters()]
    trace = training.train_online(
        m, task, ref_tok, tiny_runs.disa_fn(lz, 2.0), prompts=task.split(False), steps=3, lr=1e-3
    )
    naive = sum(float((q.detach() - b).double().pow(2).sum()) for q, b in zip(m.parameters(), before)) ** 0.5
    assert len(trace.losses) == 3 and trace.loss_moved
    assert trace.param_change == pytest.approx(naive, rel=1e-9) and naive > 0
    assert not training.Trace([1.0, 1.0], 0.0).loss_moved and not training.Trace([1.0], 0.0).loss_moved
    with pytest.raises(FloatingPointError, match="step 4"):
        training.step_loss(torch.tensor(float("inf")), 4)


_UP = math.nextafter(0.5, 1.0)  # the next float above 0.5: the smallest change a loss can make


@pytest.mark.parametrize(
    "losses",
    [
        [],
        [0.5],
        [0.5, 0.5],
        [0.5] * 5,  # exactly unchanged over a run: did NOT move
        [0.0, -0.0],  # equal floats
        [0.5, _UP],  # the smallest change, up or down, first step or last: moved
        [_UP, 0.5],
        [0.5, 0.5, 0.5, _UP],
        [1.0, 0.0, 1.0],
    ],
    ids=lambda x: repr(x),
)
def test_loss_moved_is_any_two_losses_differing_at_the_boundary_both_ways(losses):
    """``Trace.loss_moved`` and the run log's item against a loop: the loss moved iff two of its
    recorded values differ. A run whose loss is exactly unchanged did not move (a ``>=`` reports that
    it did); a change of one ulp did (a tolerance would miss it)."""
    naive = any(a != b for i, a in enumerate(losses) for b in losses[i + 1 :])
    assert training.Trace(list(losses), 1.0).loss_moved is naive
    log = training.RunLog()
    log.add(training.Trace([0.5, 0.25], 1.0))  # a run that moved, beside it
    log.add(training.Trace(list(losses), 1.0))
    assert log.items()["ran_loss_moved"] is naive
    assert log.numbers()["runs_loss_moved"] == 1 + naive


@pytest.mark.parametrize(
    ("change", "moved"),
    [(0.0, False), (5e-324, True), (1e-3, True)],  # 5e-324: the smallest positive float
)
def test_weights_moved_is_a_positive_change_at_the_boundary_both_ways(change, moved):
    log = training.RunLog()
    log.add(training.Trace([1.0, 0.5], change))
    assert log.items()["ran_weights_moved"] is moved and log.numbers()["runs_weights_moved"] == moved


def test_train_online_extra_lr_applies_to_extra_params_only(tiny):
    """A learned log Z table gets its own learning rate: with lr = 0 the model stays put and the
    table's trained entries take one Adam step of size extra_lr."""
    model, task = tiny
    model = __import__("copy").deepcopy(model)
    before = [q.detach().clone() for q in model.parameters()]
    ref_tok = T.reference_tokens(model, task)
    table = torch.nn.Parameter(torch.zeros(task.n_prompts))
    prompts = task.split(False)[:8]
    training.train_online(
        model, task, ref_tok, paced.paced_fn(table, 4.0), prompts=prompts, steps=1, lr=0.0, seed=0,
        extra_params=(table,), extra_lr=0.05,
    )  # fmt: skip
    assert all(torch.equal(a, q.detach()) for a, q in zip(before, model.parameters()))
    # each trained entry moves by extra_lr, or stays at 0 where its group drew no correct answer
    # (the residual's table gradient is then exactly 0)
    moved = table.detach()[prompts].abs().tolist()
    assert any(m > 0 for m in moved)
    assert all(m == 0.0 or m == pytest.approx(0.05, rel=1e-3) for m in moved)
    others = [i for i in range(task.n_prompts) if i not in prompts]
    assert (table.detach()[others] == 0).all()


def test_train_online_select_must_return_batch_prompts_prompts(tiny):
    """A selecting arm (PACED) trains exactly as many prompts per step as the random arms it is compared
    with: a select that returns another count is refused at the first step, before any update."""
    model, task = tiny
    model = __import__("copy").deepcopy(model)
    before = [q.detach().clone() for q in model.parameters()]
    ref_tok = T.reference_tokens(model, task)
    lz = torch.zeros(task.n_prompts, dtype=torch.float64)
    tr = task.split(False)
    for n in (4, 16):
        with pytest.raises(ValueError, match=f"select returned {n} prompts at step 0, batch_prompts=8"):
            training.train_online(
                model, task, ref_tok, tiny_runs.disa_fn(lz, 2.0), prompts=tr, steps=2, lr=1e-3,
                select=lambda step, n=n: tr[:n],
            )  # fmt: skip
    assert all(torch.equal(a, q.detach()) for a, q in zip(before, model.parameters()))
    trace = training.train_online(
        model, task, ref_tok, tiny_runs.disa_fn(lz, 2.0), prompts=tr, steps=1, lr=1e-3, batch_prompts=4,
        select=lambda step: tr[:4],
    )  # fmt: skip
    assert len(trace.losses) == 1
    assert paced.BATCH_PROMPTS == 8  # the PACED check's arms: 8 prompts a step (the paper's toy batch)


def test_patched_steps_are_restored_for_later_tests(tiny):
    """After the no-op and NaN variants, Adam and AdamW step again (the variants must not leak)."""
    for cls in (torch.optim.Adam, torch.optim.AdamW):
        w = torch.nn.Parameter(torch.ones(3))
        opt = cls([w], lr=0.1)
        w.sum().backward()
        opt.step()
        assert torch.isfinite(w).all() and (w < 1).all(), cls


def test_table6_items_are_the_mean_of_lambda_1_and_2_minus_each_other_lambda(monkeypatch):
    """fpa.table6's three paired items, per seed: (acc(lam=1) + acc(lam=2)) / 2 - acc(lam), for lam in
    0, 5, 20, against a loop over seeds on held-out accuracies where every arm differs."""
    h = {lam: [0.1 * i + 0.01 * lam for i in range(1, 4)] for lam in tiny_runs.FPA_LAMS}
    h[2.0] = [0.9, 0.05, 0.4]  # lam=2 differs from lam=1 in both directions: (a - b) or a alone would show

    class Log:
        def numbers(self):
            return {}

        def items(self):
            return {}

    got: dict = {}
    monkeypatch.setattr(tiny_runs, "fpa_raw", lambda seed, n_seeds, steps, lams: {"log": Log()})
    monkeypatch.setattr(tiny_runs, "_fpa_heldout", lambda seed, n_seeds, steps: (h, {}, "txt"))
    monkeypatch.setattr(enumerable, "result", lambda items, ran, summary, nums, **kw: got.setdefault("items", items))
    enumerable.fpa_lambda_best(0, n_seeds=3, steps=1)
    items = {it.name: it for it in got["items"]}
    assert set(items) == {"lam12_minus_lam0", "lam12_minus_lam5", "lam12_minus_lam20"}
    for lam in enumerable.TABLE6_OTHERS:
        want = []
        for s in range(3):
            want.append((h[1.0][s] + h[2.0][s]) / 2 - h[lam][s])
        it = items[f"lam12_minus_lam{lam:g}"]
        assert it.values == pytest.approx(want, rel=0, abs=1e-15) and it.margin == enumerable.ACC_MARGIN


def test_warm_cache_is_written_through_a_temp_file_in_its_own_folder(tmp_path, monkeypatch):
    """The warmed-model cache is saved to a temp file in the cache folder and renamed over the target: a
    rename within one folder is atomic (a temp file elsewhere, e.g. /tmp on another filesystem, is not)."""
    import os
    from pathlib import Path

    cache = tmp_path / "cache"
    monkeypatch.setattr(warmup, "_cache_dir", lambda: cache)
    monkeypatch.setattr(warmup, "_sft", lambda *a, **k: None)
    seen = []
    real = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (seen.append((Path(src), Path(dst))), real(src, dst))[1])
    warmup._warm_cached.__wrapped__(0, 3)  # past the process's lru_cache, which earlier tests may have filled
    ((src, dst),) = seen
    assert src.parent == dst.parent == cache and src != dst and dst.exists()
    assert src.name.startswith(f".{dst.stem}.tmp-") and src.suffix == dst.suffix  # tiltlab.files' temporary name
    assert [p.name for p in cache.iterdir()] == [dst.name]


def test_four_method_run_context_arms_are_cispo_and_sapo_off_policy(monkeypatch, fresh_memo):
    """The 4-method run's context arms (``context_raw``, apart from the judged arms' ``methods_raw``: their
    numbers are those of the run without them) train CISPO and SAPO through ``pg.cispo_loss`` / ``pg.sapo_loss``
    with pi_old refreshed every ``CONTEXT_OLD_EVERY`` (> 1: on an on-policy step their gradient is GRPO's)."""
    from types import SimpleNamespace

    from tiltlab.objectives import pg

    ref = SimpleNamespace(seq_logp=torch.zeros(4, 3), log_probs=torch.zeros(4, 3))
    task = SimpleNamespace(n_prompts=4)
    monkeypatch.setattr(tiny_runs, "setup", lambda s, beta: (None, task, None, ref, [0, 1], [2, 3], torch.zeros(4)))
    monkeypatch.setattr(tiny_runs, "evaluate", lambda m, t, p: {"acc": 0.5, "pass8": 0.5, "coverage": 0.5})
    monkeypatch.setattr(T, "pass_rate", lambda pol, t: torch.zeros(1))
    monkeypatch.setattr(warmup, "warm_reference", lambda s: (None, None))
    calls = []
    monkeypatch.setattr(
        training,
        "train_online",
        lambda m, t, r, fn, **kw: calls.append((fn, kw["old_every"])) or training.Trace([1.0, 0.0], 1.0),
    )
    res = tiny_runs.context_raw(0, 2, 2, 4.0)
    assert tiny_runs.CONTEXT_METHODS == ("cispo", "sapo") and tiny_runs.CONTEXT_OLD_EVERY > 1
    assert [k for k in res if not k.startswith("_")] == ["cispo", "sapo"] and len(res["cispo"]["heldout_acc"]) == 2
    assert [e for _, e in calls] == [tiny_runs.CONTEXT_OLD_EVERY] * 4
    # each arm's loss is the objectives function's value on the batch (group advantages, TRL's defaults)
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(8, 2, generator=g, dtype=torch.float64)
    b = training.Batch(None, None, lp, lp - 0.3 * torch.rand(8, 2, generator=g, dtype=torch.float64), None,
                torch.ones(8, 2, dtype=torch.float64), (torch.rand(2, 4, generator=g) < 0.5).double(), None)  # fmt: skip
    adv = pg.group_advantages(b.reward).reshape(-1)
    assert calls[0][0](b) == pg.cispo_loss(b.logp, b.logp_old, adv, b.mask).loss
    assert calls[1][0](b) == pg.sapo_loss(b.logp, b.logp_old, adv, b.mask).loss


def test_record_arm_appends_each_number_and_each_ran_flag_on_its_own(monkeypatch):
    """The bookkeeping shared by the judged and the context arms: train numbers from the train prompts,
    held-out accuracy, pass@8 and coverage from the held-out ones, and the three "it ran" flags each from
    its own source (a run whose loss moved but whose weights did not must say so)."""
    from types import SimpleNamespace

    # evaluate(model, task, prompts) stubbed: its numbers name the prompt set they were computed on
    monkeypatch.setattr(
        tiny_runs, "evaluate", lambda model, task, idx: {"acc": idx, "pass8": idx + 1, "coverage": idx + 2}
    )
    res = {
        "disa": {
            "acc": [],
            "heldout_acc": [],
            "pass8": [],
            "coverage": [],
            "heldout_pass8": [],
            "heldout_coverage": [],
        },
        "_ran": {"loss": [], "weights": [], "acc": []},
    }
    tiny_runs._record_arm(res, "disa", None, None, 0.25, 0.5, SimpleNamespace(loss_moved=True, param_change=0.0), 0.5)
    tiny_runs._record_arm(
        res, "disa", None, None, 0.25, 0.75, SimpleNamespace(loss_moved=False, param_change=1e-3), 0.5
    )
    assert res["disa"] == {
        "acc": [0.25, 0.25],
        "heldout_acc": [0.5, 0.75],
        "pass8": [1.25, 1.25],
        "coverage": [2.25, 2.25],
        "heldout_pass8": [1.5, 1.75],
        "heldout_coverage": [2.5, 2.75],
    }
    assert res["_ran"] == {"loss": [True, False], "weights": [False, True], "acc": [False, True]}


# the computed checks' items: which arm minus which, of which number, per seed (written out, not derived
# from the module's pair tables)
COMPUTED_ITEMS = {
    computed.diversity_coverage: ("heldout_coverage", {
        "coverage_disa_minus_grpo": ("disa", "grpo"), "coverage_disa_minus_gspo": ("disa", "gspo"),
        "coverage_flowrl_minus_grpo": ("flowrl", "grpo"), "coverage_flowrl_minus_gspo": ("flowrl", "gspo"),
        "coverage_disa_minus_flowrl": ("disa", "flowrl"),
    }),
    computed.code_pass_at_k: ("heldout_pass8", {
        "pass8_disa_minus_grpo": ("disa", "grpo"), "pass8_disa_minus_gspo": ("disa", "gspo"),
    }),
    computed.vargrad_vs_learned: ("tv", {"vargrad_beats_learned_logz": ("learned_head", "vargrad")}),
}  # fmt: skip


def test_computed_items_are_the_named_arms_difference_per_seed(monkeypatch):
    """Each computed check's items against a loop over seeds on a stubbed memoized run where every arm,
    number and seed differs (a swapped pair, another number or a train-split number would show), with
    its margin (ACC_MARGIN for coverage and pass@8, TV_MARGIN for TV) and at most partly."""
    import random

    rnd = random.Random(0)
    n = 3
    keys = ("acc", "heldout_acc", "pass8", "coverage", "heldout_pass8", "heldout_coverage")
    res = {k: {key: [rnd.random() for _ in range(n)] for key in keys} for k in tiny_runs.METHODS}
    res["_ran"] = {"loss": [True] * 4 * n, "weights": [True] * 4 * n, "acc": [True] * 4 * n}
    tv = {k: [rnd.random() for _ in range(n)] for k in tiny_runs.LOGZ_NAMES}

    class Log:
        def numbers(self):
            return {}

        def items(self):
            return {"ran_loss_moved": True}

    got: dict = {}
    monkeypatch.setattr(tiny_runs, "methods_raw", lambda seed, n_seeds, steps, beta: res)
    monkeypatch.setattr(tiny_runs, "logz_variants_raw", lambda *a: (tv, None, None, None, None, Log()))
    monkeypatch.setattr(enumerable, "result", lambda items, ran, summary, nums, **kw: got.update(items=items, kw=kw))
    for fn, (key, want) in COMPUTED_ITEMS.items():
        fn(0, n_seeds=n, steps=1)
        items = {it.name: it for it in got["items"]}
        assert list(items) == list(want), fn.__name__
        src = tv if key == "tv" else {k: res[k][key] for k in tiny_runs.METHODS}
        for name, (a, b) in want.items():
            loop = []
            for s in range(n):
                loop.append(src[a][s] - src[b][s])
            it = items[name]
            assert it.values == pytest.approx(loop, rel=0, abs=1e-15), name
            assert it.kind == "effect" and it.margin == (enumerable.TV_MARGIN if key == "tv" else enumerable.ACC_MARGIN)
        assert got["kw"] == {"cap": Verdict.PARTLY}, fn.__name__


def test_computed_checks_judge_the_memoized_runs_values(tiny, fresh_memo):
    """On real (tiny) runs: each computed check's recorded values are its arms' differences in the memoized
    run it reads (the run is trained once: the check and the raw function share it)."""
    for fn, (key, want) in COMPUTED_ITEMS.items():
        kw = dict(n_seeds=2, steps=2, grad_draws=2) if key == "tv" else dict(n_seeds=2, steps=2)
        res = fn(0, **kw)
        if key == "tv":
            src = tiny_runs.logz_variants_raw(0, 2, 2, 2.0, 2)[0]
        else:
            raw = tiny_runs.methods_raw(0, 2, 2, 4.0)
            src = {k: raw[k][key] for k in tiny_runs.METHODS}
        values = {i["name"]: i["values"] for i in res.evidence["items"]}
        assert set(values) == set(want)
        for name, (a, b) in want.items():
            assert values[name] == pytest.approx([src[a][s] - src[b][s] for s in range(2)], rel=0, abs=1e-12), name
    assert len(tiny_runs._MEMO) == 2  # the 4-method run and the remark2 run, each trained once
