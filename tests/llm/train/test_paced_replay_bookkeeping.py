"""PACED replay in the online trainer (``PacedMixin._paced_replay``) against a loop over rows.

Two groups with different correct counts (3 of 4 and 1 of 4) and different ``p_hat``: the buffer must
take the correct rows of highest ``|N_correct / G - p_hat|`` (per prompt, so per group), each stored
row must hold its *own* prompt and completion (unpadded) and reward, and on the next step the buffer's
rows are appended to the batch with their prompt, completion, reward and TB reward, zero advantage,
zero DISA log Z, recomputed behaviour log-probs, and the token count grows by their lengths."""

from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("trl")

import trl.trainer.utils  # noqa: F401  # what _paced_replay imports on first use: loaded at collection

from tiltlab.llm.train.paced import PacedMixin
from tiltlab.objectives.paced import ReplayBuffer

G, BETA, PAD = 4, 3.0, 0


class _Stub:
    def __init__(self, n_add=3, capacity=5, replay_max=None, spg=1, select_from="disa", kl_coef=1.0):
        self.args = SimpleNamespace(
            steps_per_generation=spg,
            paced_replay_max=replay_max,
            paced_select_from=select_from,
            tilt_beta=BETA,
            paced_kl_coef=kl_coef,
            per_device_train_batch_size=4,
        )
        self._replay = ReplayBuffer(capacity=capacity, n_add=n_add)
        self._metrics = {"train": defaultdict(list)}
        self._paced_head = None
        self._tokenizer = SimpleNamespace(pad_token_id=PAD)
        self.accelerator = SimpleNamespace(
            gather=lambda x: x.reshape(1) if x.dim() == 0 else x, unwrap_model=lambda m: m
        )
        self.model = None
        self.scored = []

    def _get_per_token_logps_and_entropies(self, model, pc, am, logits_to_keep, batch_size=None):
        self.scored.append((pc.clone(), am.clone(), logits_to_keep))
        # a deterministic function of the completion tokens: row b, token t -> -(id + 1) / 10
        comp = pc[:, -logits_to_keep:]
        return -(comp.double() + 1) / 10, None, None


def _log_z_for(p: float) -> float:
    """The log Z whose binary-reward pass rate at BETA is ``p``: ``log(1 + p (e^beta - 1))``."""
    return math.log(1 + p * (math.exp(BETA) - 1))


def _out(prompts, completions, rewards, p_hats, tb_shift=0.5):
    """A generation batch: left-padded prompts, right-padded completions, per-row reward and log Z."""
    n = len(prompts)
    tp, tc = max(map(len, prompts)), max(map(len, completions))
    pid = torch.full((n, tp), PAD)
    pm = torch.zeros(n, tp, dtype=torch.long)
    cid = torch.full((n, tc), PAD)
    cm = torch.zeros(n, tc, dtype=torch.long)
    for b, (p, c) in enumerate(zip(prompts, completions)):
        pid[b, tp - len(p) :] = torch.tensor(p)
        pm[b, tp - len(p) :] = 1
        cid[b, : len(c)] = torch.tensor(c)
        cm[b, : len(c)] = 1
    r = torch.tensor(rewards, dtype=torch.float64)
    return {
        "prompt_ids": pid,
        "prompt_mask": pm,
        "completion_ids": cid,
        "completion_mask": cm,
        "rewards": r,
        "tb_reward": r + tb_shift,
        "advantages": torch.linspace(-1, 1, n, dtype=torch.float64),
        "log_z": torch.tensor([_log_z_for(p) for p in p_hats for _ in range(G)], dtype=torch.float64),
        "old_per_token_logps": torch.zeros(n, tc, dtype=torch.float64),
        "num_items_in_batch": cm.sum(),
    }


def _naive_added(prompts, completions, rewards, p_hats, n_add):
    """Rows the buffer must receive: correct rows by descending priority of their group
    ``|c_group / G - p_hat_group|`` (ties: lower row first), at most ``n_add``."""
    cand = []
    for b, r in enumerate(rewards):
        grp = b // G
        c = sum(1 for x in rewards[grp * G : (grp + 1) * G] if x > 0.5)
        if r > 0.5:
            cand.append((-abs(c / G - p_hats[grp]), b))
    return [b for _, b in sorted(cand)[:n_add]]


STEP1 = dict(
    prompts=[[11, 12]] * G + [[21, 22, 23, 24]] * G,  # group 0 and group 1 prompts (different lengths)
    completions=[[1], [2, 3], [4, 5, 6], [7, 8], [9, 9, 9, 9], [10], [13, 14], [15, 16, 17]],
    # group 0: 3 correct of 4, group 1: 1 of 4 (a reward of 0.5 is not correct: correct means > 0.5)
    rewards=[1.0, 1.0, 0.0, 1.0, 0.5, 1.0, 0.0, 0.0],
    p_hats=[0.2, 0.9],  # priorities |0.75 - 0.2| = 0.55 and |0.25 - 0.9| = 0.65
)
STEP2 = dict(
    prompts=[[31]] * G + [[41, 42]] * G,
    completions=[[5, 5], [6], [7, 7, 7], [8], [1, 2], [3], [4], [6, 6]],
    rewards=[0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0],
    p_hats=[0.5, 0.5],
)


def test_replay_buffer_takes_the_right_rows_with_their_own_prompts():
    st = _Stub(n_add=3, capacity=5)
    out = _out(**STEP1)
    res = PacedMixin._paced_replay(st, out, None, None, G)
    assert res is out  # an empty buffer replays nothing
    want = _naive_added(STEP1["prompts"], STEP1["completions"], STEP1["rewards"], STEP1["p_hats"], 3)
    assert want == [5, 0, 1]  # the lone correct row of group 1 first (its priority 0.65 > 0.55)
    got = st._replay.contents()
    assert [it["prompt_ids"].tolist() for it in got] == [STEP1["prompts"][b] for b in want]
    assert [it["completion_ids"].tolist() for it in got] == [STEP1["completions"][b] for b in want]
    assert [it["reward"] for it in got] == [STEP1["rewards"][b] for b in want]
    assert [it["tb_reward"] for it in got] == [STEP1["rewards"][b] + 0.5 for b in want]
    m = st._metrics["train"]
    assert m["paced/replay_added"] == [3.0] and m["paced/replay_used"] == [0.0]
    # the accuracy error is the mean over rows of |c_group / G - p_hat|: (4 * 0.55 + 4 * 0.65) / 8
    assert m["paced/accuracy_error"][0] == pytest.approx(0.6, abs=1e-6)  # p_hat is computed in float32


def test_replayed_rows_are_appended_to_the_next_batch():
    st = _Stub(n_add=3, capacity=5)
    PacedMixin._paced_replay(st, _out(**STEP1), None, None, G)
    items = st._replay.contents()
    out2 = _out(**STEP2, tb_shift=-0.25)
    out2["importance_sampling_ratio"] = torch.full((8, 1), 0.7, dtype=torch.float64)
    new = PacedMixin._paced_replay(st, out2, None, None, G)
    n, extra = 8, len(items)
    assert extra == 3 and new["prompt_ids"].shape[0] == n + extra
    rows_p = STEP2["prompts"] + [it["prompt_ids"].tolist() for it in items]
    rows_c = STEP2["completions"] + [it["completion_ids"].tolist() for it in items]
    for b in range(n + extra):  # each row: its own prompt (left padding) and completion (right padding)
        pm, cm = new["prompt_mask"][b].bool(), new["completion_mask"][b].bool()
        assert new["prompt_ids"][b][pm].tolist() == rows_p[b]
        assert new["completion_ids"][b][cm].tolist() == rows_c[b]
        assert bool(pm[-1]) and bool(cm[0])  # left-padded prompt, right-padded completion
    r_want = STEP2["rewards"] + [it["reward"] for it in items]
    assert new["rewards"].tolist() == r_want
    assert new["tb_reward"].tolist() == [r - 0.25 for r in STEP2["rewards"]] + [it["tb_reward"] for it in items]
    assert new["advantages"][:n].tolist() == out2["advantages"].tolist() and new["advantages"][n:].tolist() == [0] * 3
    assert new["log_z"][:n].tolist() == out2["log_z"].tolist() and new["log_z"][n:].tolist() == [0] * 3
    # behaviour log-probs recomputed for every row (the stub's -(id + 1) / 10 on real tokens)
    want_old = -(new["completion_ids"].double() + 1) / 10
    torch.testing.assert_close(new["old_per_token_logps"], want_old)
    (pc, am, t_keep), *_ = st.scored
    assert t_keep == new["completion_ids"].shape[1]
    torch.testing.assert_close(pc, torch.cat([new["prompt_ids"], new["completion_ids"]], 1))
    torch.testing.assert_close(am, torch.cat([new["prompt_mask"], new["completion_mask"]], 1))
    # sampler IS ratio: the generated rows keep theirs, replayed rows get 1
    assert new["importance_sampling_ratio"].shape == (n + extra, 1)  # a sequence-level ratio stays [B, 1]
    assert new["importance_sampling_ratio"][:, 0].tolist() == [0.7] * n + [1.0] * 3
    n_tok = sum(map(len, STEP2["completions"])) + sum(len(it["completion_ids"]) for it in items)
    assert int(new["num_items_in_batch"]) == n_tok
    assert st._metrics["train"]["paced/replay_used"] == [0.0, 3.0]
    # then this step's correct rows entered (after the replay was read): the FIFO keeps the newest 5
    want2 = _naive_added(STEP2["prompts"], STEP2["completions"], STEP2["rewards"], STEP2["p_hats"], 3)
    buf = st._replay.contents()
    assert [it["prompt_ids"].tolist() for it in buf] == [it["prompt_ids"].tolist() for it in items[1:]] + [
        STEP2["prompts"][b] for b in want2
    ]


def test_replay_is_cut_to_whole_steps_and_to_the_cap():
    # steps_per_generation 2: only an even number of buffer rows is replayed; paced_replay_max caps it
    for spg, cap, want in [(2, None, 2), (1, 2, 2), (2, 3, 2), (1, None, 3)]:
        st = _Stub(n_add=3, capacity=5, replay_max=cap, spg=spg)
        PacedMixin._paced_replay(st, _out(**STEP1), None, None, G)
        items = st._replay.contents()
        new = PacedMixin._paced_replay(st, _out(**STEP2), None, None, G)
        assert new["prompt_ids"].shape[0] == 8 + want, (spg, cap)
        # the newest ``want`` rows of the buffer
        got = [new["completion_ids"][b][new["completion_mask"][b].bool()].tolist() for b in range(8, 8 + want)]
        assert got == [it["completion_ids"].tolist() for it in items[-want:]], (spg, cap)


def test_token_level_sampler_ratios_keep_their_rows_and_replayed_rows_get_one():
    st = _Stub(n_add=3, capacity=5)
    PacedMixin._paced_replay(st, _out(**STEP1), None, None, G)
    out2 = _out(**STEP2)
    t2 = out2["completion_ids"].shape[1]
    isr = torch.linspace(0.5, 1.5, 8 * t2, dtype=torch.float64).view(8, t2)
    out2["importance_sampling_ratio"] = isr
    # a longer replayed completion widens the batch beyond this step's completions
    st._replay.load_state_dict({"items": [dict(it) for it in st._replay.contents()]})
    st._replay._items[0]["completion_ids"] = torch.tensor([1, 2, 3, 4, 5])
    new = PacedMixin._paced_replay(st, out2, None, None, G)
    t_new = new["completion_ids"].shape[1]
    assert t_new == 5 > t2
    want = torch.ones(11, t_new, dtype=torch.float64)
    want[:8, :t2] = isr
    torch.testing.assert_close(new["importance_sampling_ratio"], want)


def _p_hat_case(monkeypatch, select_from, kl_coef, log_z_rows):
    """Replay with the PACED estimate ``p_hat = clip(kl_coef * log Z, 0, 1)`` from the frozen-embedding
    head or the live policy's head (both faked: log Z per row given)."""
    st = _Stub(n_add=3, capacity=5, select_from=select_from, kl_coef=kl_coef)
    out = _out(**STEP1)
    if select_from == "frozen":
        st.args.paced_select_from = "learned"
        st._paced_head = object()
        out["paced_emb"] = torch.tensor(log_z_rows, dtype=torch.float64)[:, None]
        st._paced_frozen_log_z = lambda emb: emb[:, 0].clone()
    else:
        import tiltlab.llm.train.paced as paced_mod

        st.args.paced_select_from = "learned"
        rows = torch.tensor(log_z_rows, dtype=torch.float64)
        monkeypatch.setattr(paced_mod, "prompt_log_z", lambda model, ids, mask, detach_input=False: rows.clone())
    PacedMixin._paced_replay(st, out, None, None, G)
    return st


@pytest.mark.parametrize("source", ["frozen", "live"])
def test_learned_p_hat_is_kl_coef_times_log_z_clipped(monkeypatch, source):
    # kl_coef 0.5: log Z 0.4 -> p_hat 0.2 (group 0), log Z 1.8 -> 0.9 (group 1): the disa case's order
    st = _p_hat_case(monkeypatch, source, 0.5, [0.4] * G + [1.8] * G)
    assert [it["completion_ids"].tolist() for it in st._replay.contents()] == [[10], [1], [2, 3]]
    assert st._metrics["train"]["paced/accuracy_error"][0] == pytest.approx(0.6, abs=1e-6)
    if source == "frozen":
        assert [float(it["paced_emb"][0]) for it in st._replay.contents()] == [1.8, 0.4, 0.4]
    # at kl_coef 1 (or with log Z and kl_coef swapped) the estimates would be 0.4 and 1 (clipped): other numbers
    st1 = _p_hat_case(monkeypatch, source, 1.0, [0.4] * G + [1.8] * G)
    assert st1._metrics["train"]["paced/accuracy_error"][0] == pytest.approx((4 * 0.35 + 4 * 0.75) / 8, abs=1e-6)


def test_disa_p_hat_is_clipped_to_zero_one():
    # log Z above beta or below 0 maps outside [0, 1]; the replay priority uses the clipped estimate
    st = _Stub(n_add=3, capacity=5)
    out = _out(**STEP1)
    out["log_z"] = torch.tensor([BETA + 0.5] * G + [-0.5] * G, dtype=torch.float64)  # p_hat ~1.68 and ~-0.02
    PacedMixin._paced_replay(st, out, None, None, G)
    # |3/4 - 1| and |1/4 - 0| per row
    assert st._metrics["train"]["paced/accuracy_error"][0] == pytest.approx(0.25, abs=1e-6)


def test_replay_cap_not_a_multiple_of_the_steps_per_generation():
    # 5 buffered rows, steps_per_generation 2, paced_replay_max 3: whole steps only, so 2 rows (not 4)
    st = _Stub(n_add=5, capacity=5, replay_max=3, spg=2)
    PacedMixin._paced_replay(st, _out(**STEP2), None, None, G)  # 5 correct rows enter
    assert len(st._replay) == 5
    new = PacedMixin._paced_replay(st, _out(**STEP1), None, None, G)
    assert new["prompt_ids"].shape[0] == 8 + 2
