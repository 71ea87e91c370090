"""Offline (FPA-setting) trainer: every objective trains, and FPA's weight uses the chunked
future-policy path correctly (at theta = ref, pi_hat = pi, so FPA's gradient equals Off-RL's)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

pytest.importorskip("transformers")

from tiltlab.llm.train.offline import (
    OfflineCollator,
    OfflineConfig,
    OfflineTrainer,
    prepare_offline_rows,
)
from tiltlab.objectives.catalog import names


@pytest.fixture(scope="module")
def offline_rows(math_rows):
    rows = []
    for r in math_rows[:6]:
        for j in range(4):
            ans = r["answer"] if j % 2 == 0 else str(int(r["answer"]) + 1)
            rows.append({"prompt": r["prompt"], "completion": f"\\boxed{{{ans}}}", "reward": float(j % 2 == 0)})
    return rows


def _trainer(tiny_dir, tmp_path, rows, objective, **kw):
    from datasets import Dataset

    from tiltlab.llm.base.models import load_model, load_tokenizer

    args = OfflineConfig(
        output_dir=str(tmp_path / objective),
        objective=objective,
        per_device_train_batch_size=4,
        max_steps=2,
        learning_rate=1e-2,
        report_to="none",
        use_cpu=True,
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        **kw,
    )
    model, ref = load_model(tiny_dir, device="cpu"), load_model(tiny_dir, device="cpu")
    ds = Dataset.from_list(prepare_offline_rows(rows, objective))
    tok = load_tokenizer(tiny_dir, padding_side="right")
    return OfflineTrainer(model=model, args=args, ref_model=ref, train_dataset=ds, data_collator=OfflineCollator(tok))


@pytest.mark.parametrize("objective", names("offline"))
def test_offline_objective_trains(objective, tiny_dir, tmp_path, offline_rows):
    tr = _trainer(tiny_dir, tmp_path, offline_rows, objective, log_logprob_dynamics=True)
    before = {k: v.detach().clone() for k, v in tr.model.named_parameters()}
    tr.train()
    changed = [k for k, v in tr.model.named_parameters() if not torch.equal(v, before[k])]
    assert len(changed) == len(before)
    logs = [h for h in tr.state.log_history if "loss" in h]
    assert len(logs) == 2 and all(torch.isfinite(torch.tensor(h["loss"])) for h in logs)
    # the reference stays frozen
    assert all(not p.requires_grad for p in tr.ref_model.parameters())


def _grads(tr):
    batch = next(iter(tr.get_train_dataloader()))
    tr.model.zero_grad()
    tr.compute_loss(tr.model, batch).backward()
    return torch.cat([p.grad.flatten() for p in tr.model.parameters() if p.grad is not None])


@pytest.mark.parametrize("lam", [1.0, 5.0])
def test_fpa_equals_offrl_at_reference(lam, tiny_dir, tmp_path, offline_rows):
    # theta = ref => (1+lam) z - lam z = z => pi_hat = pi: FPA eq. (3)'s weight = Off-RL's (eq. 2).
    g_off = _grads(_trainer(tiny_dir, tmp_path, offline_rows, "offrl", seed=0, data_seed=0))
    g_fpa = _grads(_trainer(tiny_dir, tmp_path, offline_rows, "fpa", fpa_lam=lam, seed=0, data_seed=0))
    # float32 fused log-softmax on both paths (two reads of the same logits, (1+lam) z - lam z):
    # observed relative gradient-norm difference ~2e-7; 1e-5 allows float32 rounding at lam = 5.
    assert (g_fpa - g_off).norm() / g_off.norm() < 1e-5


def test_fpa_differs_from_offrl_away_from_reference(tiny_dir, tmp_path, offline_rows):
    tr_off = _trainer(tiny_dir, tmp_path, offline_rows, "offrl", seed=0, data_seed=0)
    tr_fpa = _trainer(tiny_dir, tmp_path, offline_rows, "fpa", fpa_lam=2.0, seed=0, data_seed=0)
    with torch.no_grad():  # move both policies away from pi_ref identically
        gen = torch.Generator().manual_seed(0)
        for p_off, p_fpa in zip(tr_off.model.parameters(), tr_fpa.model.parameters()):
            d = 0.05 * torch.randn(p_off.shape, generator=gen)
            p_off.add_(d)
            p_fpa.add_(d)
    g_off, g_fpa = _grads(tr_off), _grads(tr_fpa)
    rel = (g_fpa - g_off).norm() / g_off.norm()
    assert rel > 1e-3  # the extrapolated weight pi_hat^{1/|y|} now differs from pi^{1/|y|}


def test_prepare_rows():
    rows = [{"prompt": "p", "completion": c, "reward": r} for c, r in (("a", 1.0), ("b", 0.0), ("c", 0.0))]
    pairs = prepare_offline_rows(rows, "dpo")
    assert pairs == [{"prompt": "p", "completion": "a", "rejected": "b"}]
    assert [r["completion"] for r in prepare_offline_rows(rows, "sft")] == ["a"]
    apo = prepare_offline_rows(rows, "apo", apo_beta1=0.5)
    # V_hat = beta1 log mean exp(r / beta1) = 0.5 log((e^2 + 2)/3)
    assert abs(apo[0]["v_hat"] - 0.5 * torch.log(torch.tensor((torch.e**2 + 2) / 3)).item()) < 1e-6
    with pytest.raises(ValueError, match="completion"):
        prepare_offline_rows([{"prompt": "p", "reward": 1.0}], "fpa")
    with pytest.raises(ValueError, match="ref_model"):
        OfflineTrainer(
            model=torch.nn.Linear(1, 1),
            args=OfflineConfig(output_dir="x", objective="dpo", use_cpu=True, report_to="none"),
        )


def _naive_fpa_loss(model, ref, batch, lam, apply_to):
    """FPA eq. (3)'s loss by loops over rows and completion tokens, from the models' plain
    ``model(...).logits`` (the head's bias included): ``pi_hat`` per token is
    ``softmax((1 + lam) z_theta - lam z_ref)`` (eq. 4); rows ``apply_to`` leaves out weigh by ``pi``."""
    ids, attn, tgt, r01 = batch["input_ids"], batch["attention_mask"], batch["target_mask"], batch["reward"]
    with torch.no_grad():
        z_t = model(input_ids=ids, attention_mask=attn).logits.double()
        z_r = ref(input_ids=ids, attention_mask=attn).logits.double()
    terms = []
    for b in range(ids.shape[0]):
        lp = fut = 0.0
        n = 0
        for t in range(1, ids.shape[1]):
            if tgt[b, t] > 0:
                tok = int(ids[b, t])
                lp += float(torch.log_softmax(z_t[b, t - 1], -1)[tok])
                fut += float(torch.log_softmax((1 + lam) * z_t[b, t - 1] - lam * z_r[b, t - 1], -1)[tok])
                n += 1
        correct = float(r01[b]) > 0
        use = apply_to == "all" or (apply_to == "correct") == correct
        weight = math.exp((fut if use else lp) / n)
        terms.append((1.0 if correct else -1.0) * weight * lp / n)
    return -sum(terms) / len(terms)


def test_fpa_apply_to_weighs_exactly_the_chosen_rows_by_the_future_policy(tiny_dir, tmp_path, offline_rows):
    # 0/1 rewards: "incorrect" rows are r = 0 (R = -1); a rule testing r < 0 would never apply pi_hat.
    # The policy is moved off pi_ref, and both heads carry a (different) output bias, so pi_hat != pi
    # on every row and the fused read-outs must add the biases to reproduce model(...).logits.
    lam = 2.0
    rows = offline_rows[:4]
    assert [r["reward"] for r in rows] == [1.0, 0.0, 1.0, 0.0]
    losses = {}
    for apply_to in ("all", "correct", "incorrect"):
        tr = _trainer(tiny_dir, tmp_path, rows, "fpa", fpa_lam=lam, fpa_apply_to=apply_to, seed=0)
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in tr.model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
            for m in (tr.model, tr.ref_model):
                head = m.get_output_embeddings()
                head.bias = torch.nn.Parameter(0.5 * torch.randn(head.out_features, generator=gen))
        batch = tr.data_collator(rows)
        want = _naive_fpa_loss(tr.model, tr.ref_model, batch, lam, apply_to)
        got = float(tr.compute_loss(tr.model, batch).detach())
        # float32 fused read-out vs a float64 loop over the same float32 logits: ~1e-7 relative
        assert abs(got - want) <= 1e-5 * abs(want), (apply_to, got, want)
        losses[apply_to] = got
    # the three options give three different losses (each differs from the others by >> the tolerance)
    vals = sorted(losses.values())
    assert min(b - a for a, b in itertools.pairwise(vals)) > 1e-3 * max(abs(v) for v in vals), losses


def test_collator_truncates_an_over_long_prompt_from_its_start(tiny_dir):
    # max_length caps prompt + completion: the prompt loses its FIRST tokens (the end of the prompt,
    # next to the completion, is kept) and the completion is kept whole while it fits
    from tiltlab.llm.base.models import load_tokenizer

    tok = load_tokenizer(tiny_dir, padding_side="right")
    prompt = " ".join(str(i) for i in range(40))
    completion = "7 + 8"
    col = OfflineCollator(tok, chat_template=False, max_length=16)
    p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    c_ids = [*tok(completion, add_special_tokens=False)["input_ids"], tok.eos_token_id]
    assert len(p_ids) > 16 > len(c_ids) + 1 and p_ids[:3] != p_ids[-3:]
    out = col([{"prompt": prompt, "completion": completion, "reward": 1.0}])
    keep = 16 - len(c_ids)
    assert out["input_ids"][0].tolist() == p_ids[len(p_ids) - keep :] + c_ids
    assert out["target_mask"][0].tolist() == [0] * keep + [1] * len(c_ids)
    # a completion longer than max_length keeps one prompt token and the completion's first tokens
    long_c = " ".join(str(i % 10) for i in range(30))
    lc_ids = [*tok(long_c, add_special_tokens=False)["input_ids"], tok.eos_token_id]
    out = col([{"prompt": prompt, "completion": long_c, "reward": 1.0}])
    assert out["input_ids"][0].tolist() == [p_ids[-1], *lc_ids[:15]]
    # rows within the limit are untouched
    short = OfflineCollator(tok, chat_template=False, max_length=2048)([{"prompt": prompt, "completion": completion}])
    assert short["input_ids"][0].tolist() == p_ids + c_ids


def _naive_seq(model, ids, attn, tgt):
    """Per row: (sum of the completion tokens' log-probs, their count, [token log-probs]) by a loop over
    the model's plain ``model(...).logits``."""
    with torch.no_grad():
        z = model(input_ids=ids, attention_mask=attn).logits.double()
    out = []
    for b in range(ids.shape[0]):
        toks = [float(torch.log_softmax(z[b, t - 1], -1)[ids[b, t]]) for t in range(1, ids.shape[1]) if tgt[b, t] > 0]
        out.append((sum(toks), len(toks), toks))
    return out


def _sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def _naive_offline_loss(objective, model, ref, batch, kw):
    """The offline objectives' losses (FPA App. B.2, docs/math.md §5) by loops over rows."""
    pol = _naive_seq(model, batch["input_ids"], batch["attention_mask"], batch["target_mask"])
    rf = _naive_seq(ref, batch["input_ids"], batch["attention_mask"], batch["target_mask"])
    n = len(pol)
    if objective in ("dpo", "rpo", "simper"):
        pol_l = _naive_seq(model, batch["input_ids_l"], batch["attention_mask_l"], batch["target_mask_l"])
        rf_l = _naive_seq(ref, batch["input_ids_l"], batch["attention_mask_l"], batch["target_mask_l"])
        total = 0.0
        for (lw, nw, _), (ll, nl, _), (rw, _, _), (rl, _, _) in zip(pol, pol_l, rf, rf_l):
            if objective == "simper":
                total += -(math.exp(lw / nw) - math.exp(ll / nl))
                continue
            beta = kw.get("dpo_beta", 0.1)
            total += -math.log(_sigmoid(beta * ((lw - rw) - (ll - rl))))
            if objective == "rpo":
                total += -kw.get("rpo_alpha", 1.0) * lw / nw
        return total / n
    r01 = [float(x) for x in batch["reward"]]
    if objective == "sft":
        toks = [t for (_, _, ts) in pol for t in ts]
        return -sum(toks) / len(toks)
    if objective == "offrl":
        tau = kw.get("offrl_kl_tau", 0.0)
        return (
            sum(-(2 * r - 1) * math.exp(lp / k) + tau * (rl - lp) for (lp, k, _), (rl, _, _), r in zip(pol, rf, r01))
            / n
        )
    if objective == "kto":
        beta, lw, ll = kw.get("kto_beta", 0.1), kw.get("kto_lambda_w", 1.0), kw.get("kto_lambda_l", 1.0)
        rs = [lp - rl for (lp, _, _), (rl, _, _) in zip(pol, rf)]
        z0 = sum(rs) / n
        return (
            sum(
                lw - lw * _sigmoid(beta * (x - z0)) if r > 0 else ll - ll * _sigmoid(beta * (z0 - x))
                for x, r in zip(rs, r01)
            )
            / n
        )
    if objective == "apo":
        b1, b2 = kw.get("apo_beta1", 0.5), kw.get("apo_beta2", 1e-3)
        v = [float(x) for x in batch["v_hat"]]
        # v_hat of each row's prompt: beta1 log mean exp(r / beta1) over the prompt's rows (all in the batch)
        return sum((b2 * (lp - rl) - (r - vh)) ** 2 for (lp, _, _), (rl, _, _), r, vh in zip(pol, rf, r01, v)) / n, b1
    raise AssertionError(objective)


OFFLINE_AWAY = [
    ("offrl", {"offrl_kl_tau": 0.7}),
    ("dpo", {"dpo_beta": 0.9}),
    ("rpo", {"dpo_beta": 0.9, "rpo_alpha": 2.5}),
    ("kto", {"kto_beta": 0.8, "kto_lambda_w": 1.7, "kto_lambda_l": 0.4}),
    ("apo", {"apo_beta1": 0.2, "apo_beta2": 0.3}),
    ("simper", {}),
    ("sft", {}),
]


@pytest.mark.parametrize("objective,kw", OFFLINE_AWAY, ids=[o for o, _ in OFFLINE_AWAY])
def test_offline_objective_options_away_from_defaults_match_loops(objective, kw, tiny_dir, tmp_path, offline_rows):
    # every hyperparameter away from its default (the paper's values would hide one the trainer ignored),
    # the policy moved off pi_ref: the trainer's loss on a fixed batch equals the formula by loops
    rows = [dict(r) for r in offline_rows[:4]]
    rows[2]["reward"] = 0.25  # a fractional reward: A*-PO's V_hat and Off-RL's R = 2r - 1 see it
    rows[1]["completion"] = "so the answer is " + rows[1]["completion"]  # a loser longer than its winner
    if objective == "kto":  # 3 correct rows and 1 incorrect: lambda_w and lambda_l are not interchangeable
        rows[3]["reward"] = 1.0
    prepared = prepare_offline_rows(rows, objective, apo_beta1=kw.get("apo_beta1", 0.5))
    tr = _trainer(tiny_dir, tmp_path, rows, objective, seed=0, **kw)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in tr.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    batch = tr.data_collator(prepared)
    got = float(tr.compute_loss(tr.model, batch).detach())
    want = _naive_offline_loss(objective, tr.model, tr.ref_model, batch, kw)
    if objective == "apo":
        want, b1 = want
        # V_hat from the rows' rewards by its formula, at the configured beta1
        rs = [float(r["reward"]) for r in rows]
        v = b1 * math.log(sum(math.exp(r / b1) for r in rs) / len(rs))
        assert [float(x) for x in batch["v_hat"]] == pytest.approx([v] * 4, rel=1e-6)
    # float32 log-prob sums (~1e-6 each) against float64 loops; Off-RL's loss is a small difference of terms
    assert got == pytest.approx(want, rel=2e-5, abs=5e-6), (objective, got, want)
    if kw:  # the options change the number: at the defaults the formula gives another one
        base = _naive_offline_loss(objective, tr.model, tr.ref_model, batch, {})
        base = base[0] if objective == "apo" else base
        assert abs(base - want) > 1e-3 * abs(want), (objective, base, want)


def test_log_logprob_dynamics_logs_the_length_normalized_means(tiny_dir, tmp_path, offline_rows):
    # FPA Figs. 2-5: mean over correct (r > 0) and over incorrect rows of log pi(y|x) / |y|
    rows = offline_rows[:4]
    tr = _trainer(tiny_dir, tmp_path, rows, "offrl", log_logprob_dynamics=True, seed=0)
    batch = tr.data_collator(rows)
    tr.compute_loss(tr.model, batch)
    seq = _naive_seq(tr.model, batch["input_ids"], batch["attention_mask"], batch["target_mask"])
    norm = [lp / n for lp, n, _ in seq]
    correct = [float(r) > 0 for r in batch["reward"]]
    want_c = sum(v for v, c in zip(norm, correct) if c) / sum(correct)
    want_i = sum(v for v, c in zip(norm, correct) if not c) / (len(norm) - sum(correct))
    assert tr._dyn["logprob/correct_mean"] == [pytest.approx(want_c, rel=1e-5)]
    assert tr._dyn["logprob/incorrect_mean"] == [pytest.approx(want_i, rel=1e-5)]
    assert abs(want_c - want_i) > 1e-3  # the two groups' completions differ
    off = _trainer(tiny_dir, tmp_path, rows, "offrl", seed=0)
    off.compute_loss(off.model, batch)
    assert not off._dyn  # off by default: nothing logged
