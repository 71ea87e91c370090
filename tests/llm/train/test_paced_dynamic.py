"""PACED's Z_phi on frozen pi_ref embeddings (paper Sec. 4.3) and DAPO dynamic sampling, on the
tiny model in one process."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("trl")

from tests.llm.train._tiny_trainer import online_args, parity_reward
from tiltlab.llm.train.online import TiltGRPOConfig, TiltGRPOTrainer, informative_groups


def _dataset(math_rows):
    from datasets import Dataset

    return Dataset.from_list(
        [{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]} for r in math_rows]
    )


def _trainer(tiny_dir, tmp_path, math_rows, objective, reward=parity_reward, **kw):
    from tiltlab.llm.base.models import load_model, load_tokenizer

    args = online_args(tmp_path / objective, objective, **{"max_steps": 1, **kw})
    return TiltGRPOTrainer(
        model=load_model(tiny_dir, device="cpu"),
        reward_funcs=reward,
        args=args,
        train_dataset=_dataset(math_rows),
        processing_class=load_tokenizer(tiny_dir),
    )


# ---------------------------------------------------------------------------------------------
# PACED: frozen pi_ref embeddings, MLP only


def test_paced_frozen_ref_embeddings_are_pi_ref_mean_pooled_and_only_the_mlp_learns_log_z(
    tiny_dir, tmp_path, math_rows
):
    from tiltlab.llm.base.models import load_model, masked_mean_pool
    from tiltlab.llm.base.scoring import hidden_states
    from tiltlab.llm.disa.logz_head import get_log_z_head

    tr = _trainer(tiny_dir, tmp_path, math_rows, "paced", paced_pool_factor=2)
    # no head on the policy: log Z never reaches the backbone (the paper's Z_phi is a separate MLP)
    assert get_log_z_head(tr.model, required=False) is None
    assert tr._paced_emb.shape == (len(math_rows), tr.model.config.hidden_size)
    # row 3 = masked mean of pi_ref's final hidden states over the (chat-templated) prompt tokens
    ref = load_model(tiny_dir, device="cpu")
    prompt = tr.train_dataset[3]["prompt"]
    ids, mask = tr._prompt_tensors([prompt])
    with torch.no_grad():
        want = masked_mean_pool(hidden_states(ref, ids, mask), mask)[0]
    torch.testing.assert_close(tr._paced_rows_emb([{"prompt": prompt}])[0], want, rtol=1e-5, atol=1e-6)
    head0 = {k: v.clone() for k, v in tr._paced_head.state_dict().items()}
    tr.train()
    head1 = tr._paced_head.state_dict()
    assert any(not torch.equal(head0[k], head1[k]) for k in head0)  # the MLP trained
    # the embeddings stay frozen (pi_ref), although the policy moved
    torch.testing.assert_close(tr._paced_rows_emb([{"prompt": prompt}])[0], want, rtol=1e-5, atol=1e-6)
    assert (tmp_path / "paced" / "paced_ref_embeddings.pt").is_file()


def test_paced_state_round_trip(tiny_dir, tmp_path, math_rows):
    tr = _trainer(
        tiny_dir, tmp_path, math_rows, "paced", paced_pool_factor=2, paced_replay_add=4, paced_replay_capacity=5
    )
    assert (tr._replay.capacity, tr._replay.n_add) == (5, 4)  # the buffer the config asks for (defaults 128 / 64)
    tr.train()
    assert 0 < len(tr._replay) <= 5
    st = tr.paced_state_dict()
    assert st["replay"] is not None and len(st["replay"]["items"]) > 0 and "head" in st and "head_opt" in st
    other = _trainer(tiny_dir, tmp_path, math_rows, "paced", paced_pool_factor=2, paced_replay_add=4)
    other.load_paced_state_dict(st)
    assert other._paced_rng.random() == tr._paced_rng.random()
    assert len(other._replay) == len(tr._replay)
    for k, v in tr._paced_head.state_dict().items():
        assert torch.equal(other._paced_head.state_dict()[k], v)
    live = _trainer(tiny_dir, tmp_path, math_rows, "paced", paced_embeddings="live", paced_pool_factor=2)
    from tiltlab.llm.disa.logz_head import get_log_z_head

    assert live._paced_head is None and get_log_z_head(live.model) is not None  # the old head on the policy
    live.train()  # the live path still trains in one process / DDP
    with pytest.raises(ValueError, match="frozen_ref MLP"):
        tr_state = live.paced_state_dict()
        other.load_paced_state_dict(tr_state)


def test_paced_embeddings_config():
    from tiltlab.llm.base.run_config import SECTION_KEYS

    assert SECTION_KEYS["paced"]["embeddings"] == "paced_embeddings"
    assert TiltGRPOConfig(output_dir="x", objective="paced", use_cpu=True).paced_embeddings == "frozen_ref"
    with pytest.raises(ValueError, match="paced_embeddings"):
        TiltGRPOConfig(output_dir="x", objective="paced", use_cpu=True, paced_embeddings="hidden")


# ---------------------------------------------------------------------------------------------
# DAPO dynamic sampling


def test_informative_groups():
    r = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5])
    assert informative_groups(r, 4).tolist() == [False, True, False]  # all-1, mixed, all-0.5
    assert informative_groups(r, 2).tolist() == [False, False, True, False, False, False]
    with pytest.raises(ValueError, match="multiple of g"):
        informative_groups(r[:7], 4)


class _FirstRoundConstant:
    """Reward 1 for every completion on the first call (every group uninformative, so a refill is
    certain); afterwards: 1 for prompts with an even answer (uninformative groups), parity otherwise."""

    __name__ = "first_round_constant"

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, prompts, completions, completion_ids, answer, **kw):
        self.calls += 1
        if self.calls == 1:
            return [1.0] * len(completion_ids)
        return [1.0 if int(a) % 2 == 0 else float(sum(ids) % 2 == 0) for a, ids in zip(answer, completion_ids)]


def test_dynamic_sampling_drops_equal_reward_groups_refills_and_steps(tiny_dir, tmp_path, math_rows):
    assert any(int(r["answer"]) % 2 == 0 for r in math_rows) and any(int(r["answer"]) % 2 for r in math_rows)
    seen: list[torch.Tensor] = []

    class Spy(TiltGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            seen.append(out["rewards"].detach().clone())
            return out

    from tiltlab.llm.base.models import load_model, load_tokenizer

    reward = _FirstRoundConstant()
    args = online_args(tmp_path / "ds", "grpo", dynamic_sampling=True, dynamic_sampling_max_refills=20, max_steps=1)
    tr = Spy(
        model=load_model(tiny_dir, device="cpu"),
        reward_funcs=reward,
        args=args,
        train_dataset=_dataset(math_rows),
        processing_class=load_tokenizer(tiny_dir),
    )
    before = {k: v.detach().clone() for k, v in tr.model.named_parameters()}
    tr.train()
    assert reward.calls >= 2 and tr.state.global_step == 1
    assert any(not torch.equal(before[k], v) for k, v in tr.model.named_parameters())
    assert seen and all(r.numel() == 8 for r in seen)
    for r in seen:  # every trained group is informative
        assert informative_groups(r.float(), 4).all(), r
    log = next(h for h in tr.state.log_history if "dynamic_sampling/informative_frac" in h)
    assert log["dynamic_sampling/informative_frac"] == 1.0 and log["dynamic_sampling/refills"] >= 1


def test_dynamic_sampling_is_off_by_default_and_validated():
    assert TiltGRPOConfig(output_dir="x", use_cpu=True).dynamic_sampling is False
    with pytest.raises(ValueError, match="dynamic_sampling_max_refills"):
        TiltGRPOConfig(output_dir="x", use_cpu=True, dynamic_sampling_max_refills=-1)


def test_merged_refill_rows_are_padded_per_key_and_picked_by_row():
    """Dynamic sampling's refill merge (``_merge_rows``) against a hand-built merge: prompts padded on the
    left and completions on the right with the pad id, masks with 0, the importance ratio with 1, row
    entries picked in the order asked, non-row entries from the first output."""
    from tiltlab.llm.train.online.trainer import _merge_rows

    pad = 7

    def out(p_len, c_len, base):
        n = 2
        ids = torch.arange(base, base + n * c_len).view(n, c_len)
        return {
            "prompt_ids": torch.arange(base, base + n * p_len).view(n, p_len) + 100,
            "prompt_mask": torch.ones(n, p_len, dtype=torch.long),
            "completion_ids": ids,
            "completion_mask": torch.ones(n, c_len, dtype=torch.long),
            "importance_sampling_ratio": torch.full((n, c_len), 0.5),
            "advantages": torch.tensor([float(base), float(base) + 1]),
            "num_items_in_batch": base,
        }

    a, b = out(2, 3, 10), out(4, 1, 20)
    rows = torch.tensor([3, 0, 2])
    got = _merge_rows([a, b], rows, pad)

    def left(t, width, value):
        return torch.cat([torch.full((t.shape[0], width - t.shape[1]), value, dtype=t.dtype), t], 1)

    def right(t, width, value):
        return torch.cat([t, torch.full((t.shape[0], width - t.shape[1]), value, dtype=t.dtype)], 1)

    want = {
        "prompt_ids": torch.cat([left(a["prompt_ids"], 4, pad), b["prompt_ids"]]),
        "prompt_mask": torch.cat([left(a["prompt_mask"], 4, 0), b["prompt_mask"]]),
        "completion_ids": torch.cat([a["completion_ids"], right(b["completion_ids"], 3, pad)]),
        "completion_mask": torch.cat([a["completion_mask"], right(b["completion_mask"], 3, 0)]),
        "importance_sampling_ratio": torch.cat(
            [a["importance_sampling_ratio"], right(b["importance_sampling_ratio"], 3, 1.0)]
        ),
        "advantages": torch.cat([a["advantages"], b["advantages"]]),
    }
    for key, full in want.items():
        assert torch.equal(got[key], full[rows]), key
    assert got["num_items_in_batch"] == 10


def test_paced_head_step_averages_each_parameters_gradient_over_processes():
    """The replicated Z_phi MLP's step over 2 processes: the flat all-reduce is split back into each
    parameter's own gradient (a loop over parameters with the averaged gradients, shapes differing), then
    one SGD step at log_z_lr scaled by the policy's schedule; 1 process skips the reduce."""
    import types

    from torch import nn

    from tiltlab.llm.train.paced import PacedMixin

    torch.manual_seed(0)
    head = nn.Sequential(nn.Linear(3, 4), nn.GELU(), nn.Linear(4, 1))
    own = [torch.randn_like(p) for p in head.parameters()]
    other = [torch.randn_like(p) for p in head.parameters()]  # the other process's gradients
    start = [p.detach().clone() for p in head.parameters()]

    class Acc:
        num_processes = 2

        def reduce(self, flat, reduction):
            assert reduction == "mean"
            return (flat + torch.cat([g.reshape(-1) for g in other])) / 2

    for p, g in zip(head.parameters(), own):
        p.grad = g.clone()
    stub = types.SimpleNamespace(
        accelerator=Acc(),
        _paced_head=head,
        _paced_opt=torch.optim.SGD(head.parameters(), lr=1.0),
        args=types.SimpleNamespace(log_z_lr=0.1, learning_rate=2.0),
        lr_scheduler=types.SimpleNamespace(get_last_lr=lambda: [0.5]),
    )
    PacedMixin._paced_head_step(stub)
    for p, p0, a, b in zip(head.parameters(), start, own, other):
        want = p0 - 0.1 * (0.5 / 2.0) * (a + b) / 2  # lr = log_z_lr * (scheduled lr / base lr)
        # float32 parameters, one step of size ~1e-2: the two orders of summation differ by ~1e-8, far below 1e-7
        torch.testing.assert_close(p.detach(), want, rtol=0, atol=1e-7)
