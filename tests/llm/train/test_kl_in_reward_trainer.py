"""The online trainer's ``kl_in_reward``: TRL's ``beta`` as the sequence-level k1 penalty in the
reward, before the advantages, and no KL term in the loss (``docs/math.md`` §6, "Where the KL goes").

The advantages are read off the batch ``TiltGRPOTrainer._generate_and_score`` returns (TRL's
generation replaced by a fixed batch) and compared with the formula written as a loop:
``(r' - mean_G r') / (std_G r' + 1e-4)`` (TRL's rule and eps), ``r' = r - beta * (sum_t old_t -
sum_t ref_t)`` over the completion tokens; each ``scale_rewards``, one process of several (a group
spanning processes), behaviour log-probs TRL skipped. A run of the tiny model checks the same on
the real generation batch, and that the loss carries no KL term.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("trl")

from tests.llm.train._tiny_trainer import online_args, parity_reward
from tiltlab.llm.train.online import TiltGRPOConfig, TiltGRPOTrainer

N, G, T = 8, 4, 3
BETA = 0.3
REWARDS = [[1.0, 0.5], [0.0, 0.0], [1.0, 1.0], [1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [1.0, 0.5], [1.0, 0.0]]
WEIGHTS = [1.0, 0.5]  # two reward functions, TRL's reward_weights
LENGTHS = [3, 1, 2, 3, 2, 3, 1, 3]
TOL = dict(rel=1e-5, abs=1e-6)  # float32 inside the trainer (TRL's reward and advantage dtype)


def _logps(seed: int, shift: float = 0.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(N, T, generator=g) * 2 - shift
    mask = torch.arange(T)[None, :] < torch.tensor(LENGTHS)[:, None]
    return torch.where(mask, lp, torch.full_like(lp, -50.0))  # garbage beyond the completion


OLD, REF = _logps(1), _logps(2, shift=0.3)


def _naive(scale: str = "group", beta: float = BETA, old=OLD, ref=REF) -> list[float]:
    """TRL's advantages of the penalised rewards, as loops over Python floats."""
    r = [sum(w * v for w, v in zip(WEIGHTS, row)) for row in REWARDS]
    seq_old = [sum(float(old[i, t]) for t in range(n)) for i, n in enumerate(LENGTHS)]
    seq_ref = [sum(float(ref[i, t]) for t in range(n)) for i, n in enumerate(LENGTHS)]
    rp = [r[i] - beta * (seq_old[i] - seq_ref[i]) for i in range(N)]
    mu_all = sum(rp) / N
    sd_all = math.sqrt(sum((x - mu_all) ** 2 for x in rp) / (N - 1))
    out = []
    for s in range(0, N, G):
        grp = rp[s : s + G]
        mu = sum(grp) / G
        sd = math.sqrt(sum((x - mu) ** 2 for x in grp) / (G - 1))
        div = {"group": sd + 1e-4, "batch": sd_all + 1e-4, "none": 1.0}[scale]
        out += [(x - mu) / div for x in grp]
    return out


def _out(rows: slice = slice(None), with_old: bool = True) -> dict:
    n = len(range(N)[rows])
    mask = (torch.arange(T)[None, :] < torch.tensor(LENGTHS)[:, None]).long()[rows]
    out = {
        "prompt_ids": torch.zeros(n, 1, dtype=torch.long),
        "prompt_mask": torch.ones(n, 1, dtype=torch.long),
        "completion_ids": torch.zeros(n, T, dtype=torch.long),
        "completion_mask": mask,
        "advantages": torch.full((n,), 7.0),  # TRL's, from the raw rewards: replaced
        "ref_per_token_logps": REF[rows].clone(),
    }
    if with_old:
        out["old_per_token_logps"] = OLD[rows].clone()
    return out


def _trainer(tmp_path, monkeypatch, out, process_index=0, gather=lambda x: x, **kw):
    """The generation step's state only (no model), TRL's generation replaced by ``out``."""
    from trl import GRPOTrainer

    args = TiltGRPOConfig(
        output_dir=str(tmp_path),
        objective="grpo",
        per_device_train_batch_size=N,
        num_generations=G,
        max_completion_length=T,
        use_cpu=True,
        report_to="none",
        beta=BETA,
        kl_in_reward=True,
        **kw,
    )
    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", lambda self, inputs: dict(out))
    tr = TiltGRPOTrainer.__new__(TiltGRPOTrainer)
    tr.args, tr.model, tr.num_generations = args, SimpleNamespace(training=True), G
    tr._last_rewards_per_func = torch.tensor(REWARDS)
    tr.reward_weights = torch.tensor(WEIGHTS)
    tr.accelerator = SimpleNamespace(process_index=process_index, gather=gather)
    tr._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    tr._logs = {"advantages": deque([7.0] * N, maxlen=N)}
    tr._signal_rewards = lambda r: None
    tr._paced_head, tr._replay = None, None
    return tr


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_advantages_are_trls_rule_on_the_penalised_rewards(tmp_path, monkeypatch, scale):
    tr = _trainer(tmp_path, monkeypatch, _out(), scale_rewards=scale)
    got = tr._generate_and_score([{"prompt": "p"}] * N)
    want = _naive(scale)
    assert got["advantages"].tolist() == pytest.approx(want, **TOL)
    assert list(tr._logs["advantages"]) == pytest.approx(want, **TOL)  # the completions table too
    # the penalty binds on this batch, and the scale rule is the configured one
    assert max(abs(a - b) for a, b in zip(want, _naive(scale, beta=0.0))) > 0.05
    for other in {"group", "batch", "none"} - {scale}:
        assert max(abs(a - b) for a, b in zip(want, _naive(other))) > 0.05
    seq_kl = [sum(float(OLD[i, t] - REF[i, t]) for t in range(n)) for i, n in enumerate(LENGTHS)]
    assert tr._metrics["train"]["kl_in_reward/kl"] == pytest.approx([sum(seq_kl) / N], **TOL)
    assert tr._metrics["train"]["kl_in_reward/penalty"] == pytest.approx([BETA * sum(seq_kl) / N], **TOL)


def test_a_group_spanning_processes_gets_the_global_advantages(tmp_path, monkeypatch):
    """Four processes of two completions each: a group of 4 spans two processes. Process 1 holds
    rows 2-3 (the second half of group 0); the gather stub returns every process's rows in order."""
    n_local = 2
    per_process = [
        {
            "old": OLD[p * n_local : (p + 1) * n_local],
            "ref": REF[p * n_local : (p + 1) * n_local],
            "mask": _out()["completion_mask"][p * n_local : (p + 1) * n_local].float(),
        }
        for p in range(4)
    ]

    def seq(kind):  # the [n_local] sequence sums each process contributes
        return [(d[kind] * d["mask"]).sum(1) for d in per_process]

    sums = {"old": seq("old"), "ref": seq("ref")}
    calls = []

    def gather(x):
        kind = "old" if len(calls) % 2 == 0 else "ref"  # the trainer gathers old, then ref
        calls.append(kind)
        assert torch.allclose(x, sums[kind][1])  # this process's own rows
        return torch.cat(sums[kind])

    tr = _trainer(tmp_path, monkeypatch, _out(slice(2, 4)), process_index=1, gather=gather)
    got = tr._generate_and_score([{"prompt": "p"}] * n_local)
    assert got["advantages"].tolist() == pytest.approx(_naive()[2:4], **TOL)
    assert calls == ["old", "ref"]


def test_behaviour_logprobs_trl_skipped_are_computed_for_the_penalty(tmp_path, monkeypatch):
    """On-policy TRL returns no ``old_per_token_logps``: the trainer computes them for the penalty and
    leaves the batch without them (the loss keeps TRL's ``pi_old = pi_theta.detach()``)."""
    tr = _trainer(tmp_path, monkeypatch, _out(with_old=False))
    seen = []

    def logps(model, input_ids, attention_mask, logits_to_keep, **kw):
        seen.append(logits_to_keep)
        return OLD.clone(), None, None

    tr._get_per_token_logps_and_entropies = logps
    got = tr._generate_and_score([{"prompt": "p"}] * N)
    assert seen == [T] and "old_per_token_logps" not in got
    assert got["advantages"].tolist() == pytest.approx(_naive(), **TOL)


def test_the_tool_mask_leaves_tool_tokens_out_of_the_sequence_log_probs(tmp_path, monkeypatch):
    out = _out()
    tool = torch.ones(N, T, dtype=torch.long)
    tool[:, 1] = 0  # the second token of every completion came from a tool
    out["tool_mask"] = tool
    tr = _trainer(tmp_path, monkeypatch, out)
    got = tr._generate_and_score([{"prompt": "p"}] * N)
    keep = tool.bool()
    want = _naive(old=torch.where(keep, OLD, torch.zeros_like(OLD)), ref=torch.where(keep, REF, torch.zeros_like(REF)))
    assert got["advantages"].tolist() == pytest.approx(want, **TOL)
    assert max(abs(a - b) for a, b in zip(want, _naive())) > 0.05


def test_an_unscored_completion_is_refused(tmp_path, monkeypatch):
    tr = _trainer(tmp_path, monkeypatch, _out())
    rpf = torch.tensor(REWARDS)
    rpf[3] = math.nan  # every reward function returned None for row 3
    tr._last_rewards_per_func = rpf
    with pytest.raises(ValueError, match="no reward function scored"):
        tr._generate_and_score([{"prompt": "p"}] * N)


@pytest.mark.parametrize(
    "kw, says",
    [
        ({"objective": "gspo"}, "kl_in_reward is implemented by objective in ('grpo',) only, got objective='gspo'"),
        ({"objective": "flowrl"}, "only, got objective='flowrl'"),
        ({"beta": 0.0}, "set beta > 0, got 0.0"),
        ({"kl_estimator": "k2"}, "leave kl_estimator at 'k3', got 'k2'"),
        (
            {"multi_objective_aggregation": "normalize_then_sum"},
            "needs multi_objective_aggregation='sum_then_normalize'",
        ),
    ],
)
def test_config_refuses_what_kl_in_reward_cannot_honour(tmp_path, kw, says):
    base = dict(objective="grpo", beta=BETA, kl_in_reward=True)
    with pytest.raises(ValueError) as e:
        online_args(tmp_path, **{**base, **kw})
    assert says in str(e.value) and "\n" not in str(e.value)
    online_args(tmp_path, **base)  # the base itself is accepted


# ------------------------------------------------------------------------------------------------
# the tiny model, one real step


def test_tiny_run_trains_on_the_penalised_advantages_and_no_kl_loss_term(tiny_dir, tmp_path, math_rows):
    """A real step of the tiny Qwen3 (TRL's generation, rewards, reference model): the advantages of
    the generation batch are TRL's rule on ``r - beta (sum old - sum ref)`` computed naively from that
    batch, and the loss of the first micro-batch (``pi = pi_old``: every ratio 1) is
    ``-sum_i A_i |y_i| / tokens`` (``dapo``), with no ``beta * k3`` term. The reference model is
    perturbed so that it differs from the policy (both start as the same weights)."""
    from datasets import Dataset

    from tiltlab.llm.base.models import load_model, load_tokenizer

    rows = [{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]} for r in math_rows]
    # steps_per_generation 2 with one accumulation step: TRL computes old_per_token_logps itself
    args = online_args(
        tmp_path, "grpo", beta=BETA, kl_in_reward=True, max_steps=1, per_device_train_batch_size=4,
        steps_per_generation=2,
    )  # fmt: skip
    tr = TiltGRPOTrainer(
        model=load_model(tiny_dir, device="cpu"),
        reward_funcs=parity_reward,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=load_tokenizer(tiny_dir),
    )
    assert tr.kl_coef == 0.0 and tr.beta == BETA and tr.ref_model is not None
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        for p in tr.ref_model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    generated, losses = [], []
    gen, loss_fn = tr._generate_and_score_completions, tr._compute_loss

    def capture_gen(inputs):
        out = gen(inputs)
        generated.append({k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in out.items()})
        return out

    def capture_loss(model, inputs):
        loss = loss_fn(model, inputs)
        losses.append((dict(inputs), float(loss)))
        return loss

    tr._generate_and_score_completions, tr._compute_loss = capture_gen, capture_loss
    tr.train()

    (out,) = generated
    mask = out["completion_mask"].double()
    old, ref = out["old_per_token_logps"].double(), out["ref_per_token_logps"].double()
    r = out["rewards"].double().tolist()
    seq_kl = [float(((old[i] - ref[i]) * mask[i]).sum()) for i in range(len(r))]
    rp = [r[i] - BETA * seq_kl[i] for i in range(len(r))]
    want = []
    for s in range(0, len(rp), 4):
        grp = rp[s : s + 4]
        mu = sum(grp) / 4
        sd = math.sqrt(sum((x - mu) ** 2 for x in grp) / 3)
        want += [(x - mu) / (sd + 1e-4) for x in grp]
    assert out["advantages"].tolist() == pytest.approx(want, rel=1e-4, abs=1e-5)  # float32 sums
    assert max(abs(k) for k in seq_kl) > 0.1  # the perturbed reference: the penalty is not 0
    assert any("kl_in_reward/penalty" in h for h in tr.state.log_history)

    inputs, loss = losses[0]  # the first micro-batch: the policy has not moved, every ratio is 1
    m = inputs["completion_mask"].double()
    a = inputs["advantages"].double()
    tokens = float(inputs["num_items_in_batch"]) / 2  # dapo: the window's tokens (half the generation)
    no_kl = float(-(a[:, None] * m).sum()) / tokens
    assert loss == pytest.approx(no_kl, rel=1e-4, abs=1e-5)
    logp_ref = inputs["ref_per_token_logps"].double()
    d = logp_ref - inputs["old_per_token_logps"].double()
    k3 = float(((d.exp() - d - 1) * m).sum()) / tokens
    assert BETA * k3 > 1e-3  # what TRL's KL term would add: well above the tolerance
