"""Per-prompt values laid over a prompt's G completions in the online (TRL) trainer: the VarGrad log Z,
the group-normalized TB reward, DAPO's informative-group filter, the logged log Z / accuracy
correlation and PACED's replay priority, against explicit loops over (prompt, completion) on >= 3
prompts that differ (see ``test_group_layout.py`` for the class of bug)."""

from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("trl")

P, G = 3, 4  # prompts (all different) and completions per prompt, P != G
B = P * G
BETA = 1.7
TOL = dict(rtol=1e-5, atol=1e-6)


def _rows():
    """``(b, p, j)`` for every row of the group-major batch."""
    return [(p * G + j, p, j) for p in range(P) for j in range(G)]


def _seq(x: torch.Tensor, mask: torch.Tensor, b: int) -> float:
    return sum(float(x[b, t]) * float(mask[b, t]) for t in range(x.shape[1]))


# ------------------------------------------------------------------ llm/train (TRL trainer)
def _trainer_stub(**args):
    return SimpleNamespace(
        args=SimpleNamespace(**args),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        _paced_head=None,
        _tokenizer=SimpleNamespace(pad_token_id=0),
        accelerator=SimpleNamespace(gather=lambda x: x, unwrap_model=lambda m: m, process_index=0, num_processes=1),
        model=SimpleNamespace(training=True),
    )


def test_informative_groups_reads_consecutive_rows():
    from tiltlab.llm.train.online import informative_groups

    r = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5])  # P = 3, G = 4
    want = [len({float(r[p * G + j]) for j in range(G)}) > 1 for p in range(P)]
    assert want == [False, True, False]
    assert informative_groups(r, G).tolist() == want


def test_log_z_accuracy_correlation_pairs_each_groups_log_z_with_its_accuracy():
    """The logged correlation reads one log Z per group (its first row) and that group's accuracy."""
    from scipy import stats

    from tiltlab.llm.train.online import TiltGRPOTrainer

    n_p = 5
    lz_p = [0.4, -1.0, 2.2, 0.1, 1.3]
    correct = [[1, 1, 0, 1], [0, 0, 0, 1], [1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 1, 0]]  # no ties
    out = {
        "log_z": torch.tensor([lz_p[p] for p in range(n_p) for _ in range(G)]),
        "rewards": torch.tensor([float(c) for row in correct for c in row]),
    }
    st = _trainer_stub()
    TiltGRPOTrainer._log_log_z_accuracy(st, out, G)
    acc = [sum(c) / G for c in correct]
    m = st._metrics["train"]
    assert m["log_z/accuracy_pearson"][0] == pytest.approx(stats.pearsonr(lz_p, acc)[0], rel=1e-5)
    assert m["log_z/accuracy_spearman"][0] == pytest.approx(stats.spearmanr(lz_p, acc)[0], rel=1e-5)


def test_paced_replay_priority_counts_each_groups_own_correct_answers():
    """PACED replay's priority ``|N_correct / G - p_hat|`` per row, on 3 groups with 3, 0 and 2
    correct answers and their own ``p_hat``."""
    import trl.trainer.utils  # noqa: F401  # what _paced_replay imports on first use

    from tiltlab.llm.train.paced import PacedMixin
    from tiltlab.objectives.estimators import pass_rate_from_log_z

    beta = 3.0
    rewards = [1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    lz_p = [0.5, 2.0, 1.2]
    seen = {}

    class Buffer:
        def contents(self):
            return []

        def add(self, rows, prio, correct):
            seen.update(rows=rows, prio=prio.clone(), correct=correct.clone())
            return 0

    st = _trainer_stub(
        steps_per_generation=1, paced_replay_max=None, paced_select_from="disa", tilt_beta=beta, paced_kl_coef=1.0
    )
    st._replay = Buffer()
    out = {
        "prompt_ids": torch.tensor([[10 + p] for p in range(P) for _ in range(G)]),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.arange(1, B + 1)[:, None],
        "completion_mask": torch.ones(B, 1, dtype=torch.long),
        "rewards": torch.tensor(rewards, dtype=torch.float64),
        "tb_reward": torch.tensor(rewards, dtype=torch.float64),
        "log_z": torch.tensor([lz_p[p] for p in range(P) for _ in range(G)], dtype=torch.float64),
    }
    assert PacedMixin._paced_replay(st, out, None, None, G) is out
    want = []
    for _, p, _ in _rows():
        n_corr = sum(1 for j in range(G) if rewards[p * G + j] > 0.5)
        p_hat = min(max(float(pass_rate_from_log_z(torch.tensor(lz_p[p]), beta=beta)), 0.0), 1.0)
        want.append(abs(n_corr / G - p_hat))
    torch.testing.assert_close(seen["prio"].double(), torch.tensor(want, dtype=torch.float64), **TOL)
    assert st._metrics["train"]["paced/accuracy_error"][0] == pytest.approx(sum(want) / B, rel=1e-5)


def _varied_reward(prompts, completions, completion_ids, **kw) -> list[float]:
    """A reward with many values (no two groups alike, none constant)."""
    return [((sum(ids) * 7 + len(ids)) % 11) / 10 for ids in completion_ids]


@pytest.mark.parametrize("reward_transform", ["affine", "group_norm"])
def test_trainer_vargrad_log_z_and_tb_reward_are_laid_over_each_prompts_group(
    reward_transform, tiny_dir, tmp_path, math_rows
):
    """The TRL trainer's VarGrad log Z (``vargrad_log_z(...)`` per group, then laid over its rows)
    and its TB reward (affine per row, or group-normalized per group), on one real generation step of
    the tiny model with 3 prompts x 4 completions, against a loop over the batch's rows."""
    from datasets import Dataset

    from tests.llm.train._tiny_trainer import online_args
    from tiltlab.llm.base.models import load_model, load_tokenizer
    from tiltlab.llm.train.online import TiltGRPOTrainer

    seen = []

    class Spy(TiltGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            seen.append(({k: v.detach().clone() for k, v in out.items() if isinstance(v, torch.Tensor)}, inputs))
            return out

    extra = {"reward_scale": 2.0, "reward_shift": -0.5} if reward_transform == "affine" else {}
    args = online_args(
        tmp_path / "o", "vargrad", per_device_train_batch_size=P * G, num_generations=G, max_completion_length=4,
        max_steps=1, tilt_beta=BETA, logprob_scale="sum", reward_transform=reward_transform, **extra,
    )  # fmt: skip
    rows = [{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]} for r in math_rows]
    tr = Spy(
        model=load_model(tiny_dir, device="cpu"),
        reward_funcs=_varied_reward,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=load_tokenizer(tiny_dir),
    )
    tr.train()
    out, inputs = seen[0]
    prompts = [repr(r["prompt"]) for r in inputs]
    assert all(prompts[p * G + j] == prompts[p * G] for p in range(P) for j in range(G))
    assert len({prompts[p * G] for p in range(P)}) == P  # 3 different prompts
    r = out["rewards"].double().tolist()
    tb = []
    for _, p, j in _rows():
        grp = r[p * G : (p + 1) * G]
        if reward_transform == "affine":
            tb.append(2.0 * r[p * G + j] - 0.5)
        else:
            mean = sum(grp) / G
            std = math.sqrt(sum((x - mean) ** 2 for x in grp) / (G - 1))
            tb.append((r[p * G + j] - mean) / (std + 1e-6))
    torch.testing.assert_close(out["tb_reward"].double(), torch.tensor(tb, dtype=torch.float64), **TOL)
    mask = out["completion_mask"].float()

    def lp(key, row):
        return _seq(out[key].float(), mask, row)

    log_z = [
        sum(BETA * tb[p * G + j] - lp("old_per_token_logps", p * G + j) + lp("ref_per_token_logps", p * G + j)
            for j in range(G)) / G
        for p in range(P)
    ]  # fmt: skip
    if reward_transform == "affine":  # (group_norm: the TB rewards of a group sum to 0, pi_old = pi_ref
        assert len({round(v, 4) for v in log_z}) == P  # at step 0, so each log Z is 0) the groups differ
    want = torch.tensor([log_z[p] for _, p, _ in _rows()])
    torch.testing.assert_close(out["log_z"].float(), want, rtol=1e-4, atol=1e-4)
