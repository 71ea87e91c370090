"""The statistics ``tiltlab llm eval`` reports, against a naive computation on numbers where the usual
mix-ups give other values: Mean@k's standard error (sample sd over prompts / sqrt(P), not the sd, not
the population sd), pass@k' (the mean over prompts of the fraction of k'-subsets holding a correct
sample), the judge's mean and population sd (DISA Table 3's "empirical std"), and the table's cells."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import pytest

from tiltlab.llm.eval import run as ev
from tiltlab.llm.eval.judge import JudgeConfig

K = 4
CORRECT = [4, 1, 0, 2, 3]  # correct samples per prompt (of K): per-prompt accuracies 1, .25, 0, .5, .75


class _Engine:
    tokenizer = None

    def __init__(self, table):
        self.table = table

    def generate(self, prompts, n):
        return [self.table[p][:n] for p in prompts]


def _dataset():
    rows, table = [], {}
    for i, c in enumerate(CORRECT):
        rows.append({"id": f"p{i}", "prompt": f"q{i}", "answer": "7"})
        table[f"q{i}"] = ["\\boxed{7}"] * c + [f"\\boxed{{{i}}} w{i}"] * (K - c)
    return rows, table


def _naive():
    acc = [c / K for c in CORRECT]
    p = len(acc)
    mean = sum(acc) / p
    sd = math.sqrt(sum((a - mean) ** 2 for a in acc) / (p - 1))
    pop_sd = math.sqrt(sum((a - mean) ** 2 for a in acc) / p)
    pass_at = {}
    for kk in (1, 2, 3):
        per = []
        for c in CORRECT:
            flags = [True] * c + [False] * (K - c)
            subsets = list(itertools.combinations(range(K), kk))
            per.append(sum(any(flags[i] for i in s) for s in subsets) / len(subsets))
        pass_at[kk] = sum(per) / p
    return mean, sd / math.sqrt(p), sd, pop_sd / math.sqrt(p), pass_at


def test_mean_at_k_standard_error_and_pass_at_k_match_a_naive_computation(monkeypatch):
    rows, table = _dataset()
    scores = [5, 2, None, 4, 4]  # one unparsable judge answer: excluded from the judge's mean and sd
    monkeypatch.setattr(ev, "judge_diversity", lambda problems, texts, cfg, progress=True: list(scores))
    res = ev.evaluate(
        _Engine(table),
        {"toy": rows},
        k=K,
        pass_ks=[1, 2, 3],
        distinct_ns=[1],
        chat_template=False,
        judge=JudgeConfig(base_url="http://unused", model="m"),
        progress=False,
    )["toy"]
    mean, se, sd, pop_se, pass_at = _naive()
    assert res.mean_at_k == pytest.approx(mean, abs=1e-12)
    assert res.mean_at_k_se == pytest.approx(se, abs=1e-12)
    # the numbers where the mix-ups show: sd (0.395) and the population-sd s.e. (0.158) are not the s.e.
    assert abs(se - sd) > 0.2 and abs(se - pop_se) > 0.01
    for kk, v in pass_at.items():
        assert res.pass_at[kk] == pytest.approx(v, abs=1e-12)
    assert pass_at[1] == pytest.approx(mean)  # pass@1 is Mean@k on these rows; pass@2, @3 are not
    valid = [s for s in scores if s is not None]
    jm = sum(valid) / len(valid)
    assert res.judge_n == 4 and res.judge_mean == pytest.approx(jm, abs=1e-12)
    assert res.judge_std == pytest.approx(math.sqrt(sum((s - jm) ** 2 for s in valid) / len(valid)), abs=1e-12)
    assert [p["judge"] for p in res.per_prompt] == scores
    # the table prints Mean@k in percent with its s.e., pass@k', and the judge's mean ± sd
    line = ev.results_table({"toy": res}).splitlines()[2]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[:3] == ["toy", "5", f"{100 * mean:.1f} ± {100 * se:.1f}"]
    assert cells[3:6] == [f"{100 * pass_at[kk]:.1f}" for kk in (1, 2, 3)]
    assert cells[6] == f"{res.distinct[1]:.3f}" and 0 < res.distinct[1] < 1
    assert cells[-1] == f"{jm:.2f} ± {res.judge_std:.2f}"


def test_one_prompt_has_no_standard_error():
    rows, table = _dataset()
    res = ev.evaluate(_Engine(table), {"one": rows[1:2]}, k=K, chat_template=False, progress=False)["one"]
    assert res.mean_at_k == pytest.approx(0.25) and math.isnan(res.mean_at_k_se)
    assert "| one | 1 | 25.0 |" in ev.results_table({"one": res})  # no "± nan"


def test_a_reward_of_one_half_is_not_correct():
    # "correct" is reward > 0.5 for Mean@k, pass@k and the per-prompt count
    rows = [{"id": "a", "prompt": "qa", "answer": "7"}]
    table = {"qa": ["good", "half", "half", "bad"]}

    def reward(prompts, completions, completion_ids=None, **cols):
        return [{"good": 1.0, "half": 0.5, "bad": 0.0}[c] for c in completions]

    res = ev.evaluate(
        _Engine(table), {"t": rows}, k=4, pass_ks=[2], reward_fn=reward, chat_template=False, progress=False
    )["t"]
    assert res.per_prompt[0]["rewards"] == [1.0, 0.5, 0.5, 0.0] and res.per_prompt[0]["c"] == 1
    assert res.mean_at_k == 0.25
    assert res.pass_at[2] == pytest.approx(1 - 3 / 6)  # 1 - C(3, 2) / C(4, 2)


class _Groups:
    """An engine that returns groups with token ids and finished flags (the RolloutEngine protocol)."""

    tokenizer = None

    def __init__(self, table):
        self.table = table

    def generate(self, prompts, n, sampling=None):
        return [
            SimpleNamespace(
                texts=[t for t, _, _ in self.table[p]],
                completion_ids=[ids for _, ids, _ in self.table[p]],
                finished=[f for _, _, f in self.table[p]],
            )
            for p in prompts
        ]


def test_completion_length_and_finished_fraction_over_all_completions(monkeypatch):
    table = {
        "q0": [("\\boxed{7}", [1, 2, 3], True), ("x", [4], False), ("\\boxed{7}", [5, 6], True)],
        "q1": [("y", [1, 1, 1, 1, 1, 1], False), ("z", [2], True), ("\\boxed{7}", [3, 3], True)],
    }
    rows = [{"id": "a", "prompt": "q0", "answer": "7"}, {"id": "b", "prompt": "q1", "answer": "7"}]
    scores = [None, 3]  # one valid judge score: its sd is 0
    monkeypatch.setattr(ev, "judge_diversity", lambda problems, texts, cfg, progress=True: list(scores))
    res = ev.evaluate(
        _Groups(table),
        {"t": rows},
        k=3,
        chat_template=False,
        progress=False,
        judge=JudgeConfig(base_url="http://unused", model="m"),
    )["t"]
    assert res.mean_completion_tokens == pytest.approx((3 + 1 + 2 + 6 + 1 + 2) / 6)
    assert res.finished_frac == pytest.approx(4 / 6)
    assert res.mean_at_k == pytest.approx((2 / 3 + 1 / 3) / 2)
    # two prompts already have a standard error: sd (n - 1) of 2/3 and 1/3 over sqrt(2)
    assert res.mean_at_k_se == pytest.approx(math.sqrt(2 * (1 / 6) ** 2) / math.sqrt(2), abs=1e-12)
    assert res.judge_n == 1 and res.judge_mean == 3 and res.judge_std == 0.0


def test_judge_datasets_judges_only_the_named_datasets(monkeypatch):
    """``judge_datasets`` away from its default (None = every dataset): only the named dataset is
    sent to the judge; the other keeps no judge numbers and no per-prompt judge key."""
    table = {"q0": [("\\boxed{7}", [1], True)] * 2, "q1": [("x", [2], True)] * 2}
    rows = {
        "judged": [{"id": "a", "prompt": "q0", "answer": "7"}],
        "plain": [{"id": "b", "prompt": "q1", "answer": "7"}],
    }
    calls = []

    def fake_judge(problems, texts, cfg, progress=True):
        calls.append(list(problems))
        return [4] * len(problems)

    monkeypatch.setattr(ev, "judge_diversity", fake_judge)
    res = ev.evaluate(
        _Groups(table),
        rows,
        k=2,
        chat_template=False,
        progress=False,
        judge=JudgeConfig(base_url="http://unused", model="m"),
        judge_datasets=["judged"],
    )
    assert calls == [["q0"]]
    assert res["judged"].judge_n == 1 and res["judged"].judge_mean == 4 and res["judged"].judge_std == 0.0
    assert res["plain"].judge_n == 0 and res["plain"].judge_mean is None and res["plain"].judge_std is None
    assert "judge" not in res["plain"].per_prompt[0] and res["judged"].per_prompt[0]["judge"] == 4
