"""Progress of the long LLM commands through :mod:`tiltlab.progress`: ``llm eval`` per dataset and
inside one (sampling, scoring, judging), Stage 1 per shard (and a resumed run counting only its own
prompts), Stage 2 per embedding batch and per epoch. The reporter runs in ``lines`` mode with a
0-second interval, so every update is one line on stderr; ``progress=False`` prints none of them.
Progress changes no number: the seeded samples and the chunked rewards equal the silent run's."""

from __future__ import annotations

import json

import pytest

from tiltlab.llm.eval.judge import judge_diversity
from tiltlab.llm.eval.run import evaluate

pytestmark = pytest.mark.llm


@pytest.fixture
def lines(monkeypatch):
    monkeypatch.setenv("TILTLAB_PROGRESS", "lines")
    monkeypatch.setenv("TILTLAB_PROGRESS_INTERVAL", "0")


class ListEngine:
    """``generate(prompts, n) -> list[list[str]]`` from a table keyed by prompt."""

    tokenizer = None

    def __init__(self, table):
        self.table = table

    def generate(self, prompts, n):
        return [self.table[p][:n] for p in prompts]


def _rows(prefix: str, n: int) -> list[dict]:
    return [{"id": f"{prefix}{i}", "prompt": f"{prefix}q{i}", "answer": str(i % 3)} for i in range(n)]


def _table(rows: list[dict]) -> dict:
    return {r["prompt"]: [f"\\boxed{{{j}}}" for j in range(2)] for r in rows}


def test_eval_reports_each_dataset_and_its_scoring(capsys, lines):
    data = {"A": _rows("a", 20), "B": _rows("b", 3)}
    table = {**_table(data["A"]), **_table(data["B"])}
    res = evaluate(ListEngine(table), data, k=2, chat_template=False, progress=True)
    err = capsys.readouterr().err.splitlines()
    assert "[eval] A (1/2): sampling 20 prompts x 2" in err
    assert "[eval] B (2/2): sampling 3 prompts x 2" in err
    # the rewards of 20 prompts come in chunks of 16: one line after the first chunk, one at the end
    assert any(ln.startswith("scoring A: 16/20 prompt (80%)") for ln in err), err
    assert any(ln.startswith("scoring A: 20/20 prompt (100%)") for ln in err), err
    assert any(ln.startswith("eval: 1/2 dataset (50%)") and ln.endswith("[A: Mean@2 35.0]") for ln in err), err
    assert err[-1].startswith("eval: 2/2 dataset (100%)"), err
    # chunked scoring = one call over all completions (math reward: c = 1 on each prompt with answer 0 or 1)
    assert [p["c"] for p in res["A"].per_prompt] == [1 if i % 3 < 2 else 0 for i in range(20)]
    silent = evaluate(ListEngine(table), data, k=2, chat_template=False, progress=False)
    assert capsys.readouterr().err == ""
    assert [p["rewards"] for p in silent["A"].per_prompt] == [p["rewards"] for p in res["A"].per_prompt]


def test_a_reward_function_returning_a_wrong_count_is_named(lines):
    data = {"A": _rows("a", 3)}
    with pytest.raises(ValueError, match="scoring A: the reward function returned 1 rewards for 6 completions"):
        evaluate(
            ListEngine(_table(data["A"])),
            data,
            k=2,
            chat_template=False,
            reward_fn=lambda p, c, ids, **kw: [1.0],
            progress=False,
        )


def test_judging_reports_each_prompt(capsys, lines, monkeypatch):
    import tiltlab.llm.eval.judge as ev  # where judge_diversity looks _post_chat up

    replies = iter(["3", "no score", "5"])
    monkeypatch.setattr(ev, "_post_chat", lambda cfg, messages: next(replies))
    scores = judge_diversity(["p1", "p2", "p3"], [["a"], ["b"], ["c"]], progress=True)
    assert scores == [3, None, 5]
    err = capsys.readouterr().err.splitlines()
    assert [ln.split(" ", 2)[:2] for ln in err] == [["judging:", "1/3"], ["judging:", "2/3"], ["judging:", "3/3"]]


def test_hf_sampling_reports_batches_and_tokens_and_samples_the_same(capsys, lines, tiny_model, tiny_tokenizer):
    from tiltlab.llm.base.rollout import HFEngine, SamplingConfig

    sampling = SamplingConfig(temperature=1.0, max_new_tokens=3, seed=7)
    prompts = ["a b", "c d e", "f"]
    loud = HFEngine(tiny_model, tiny_tokenizer, batch_size=4, show_progress=True).generate(prompts, 2, sampling)
    err = capsys.readouterr().err.splitlines()
    assert "sampling: 0/6 completion (0%) 0s elapsed [batch 1/2, token 0/3]" in err, err
    assert any(ln.startswith("sampling: 4/6 completion (67%)") and "[batch 1/2, token 2/3]" in ln for ln in err), err
    assert any("[batch 2/2, token 0/3]" in ln for ln in err), err
    assert err[-1].startswith("sampling: 6/6 completion (100%)"), err
    quiet = HFEngine(tiny_model, tiny_tokenizer, batch_size=4).generate(prompts, 2, sampling)
    assert capsys.readouterr().err == ""
    assert [g.completion_ids for g in loud] == [g.completion_ids for g in quiet]


def _stage1_cfg(tiny_dir, out):
    from tiltlab.llm.disa.stage1 import Stage1Config

    return Stage1Config(
        proposal=str(tiny_dir),
        reference=str(tiny_dir),
        dataset="synthetic:math:4",
        out_dir=str(out),
        M=2,
        max_new_tokens=2,
        prompts_per_shard=2,
        device="cpu",
    )


def test_stage1_reports_each_shard_and_a_resume_counts_its_own_prompts(capsys, lines, tiny_dir, math_rows, tmp_path):
    from tiltlab.llm.disa.stage1 import MANIFEST, run_stage1

    out = tmp_path / "s1"
    rows = math_rows[:4]
    first = run_stage1(_stage1_cfg(tiny_dir, out), rows=rows, progress=True)
    err = capsys.readouterr().err.splitlines()
    for phase in ("sample", "score", "reward"):
        assert any(ln.startswith("stage1: 0/4 prompt") and ln.endswith(f"[shard 1/2: {phase}]") for ln in err), err
    assert any(ln.startswith("stage1: 2/4 prompt (50%)") and ln.endswith("[shard 1/2 written]") for ln in err), err
    assert any(ln.endswith("[shard 2/2: sample]") for ln in err), err
    assert err[-1].startswith("stage1: 4/4 prompt (100%)"), err
    # forget shard 2 as a run killed after shard 1 would have: the resume counts its 2 prompts only
    man = json.loads((out / MANIFEST).read_text())
    del man["shards"]["1"]
    man["complete"] = False
    (out / MANIFEST).write_text(json.dumps(man))
    again = run_stage1(_stage1_cfg(tiny_dir, out), rows=rows, progress=True)
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith("stage1 (resumed: 1/2 shards done): 2/2 prompt (100%)"), err
    assert again["mean_log_z"] == first["mean_log_z"]
    run_stage1(_stage1_cfg(tiny_dir, tmp_path / "quiet"), rows=rows, progress=False)
    assert "stage1" not in capsys.readouterr().err


def test_stage2_reports_embedding_and_each_epoch(capsys, lines, tiny_dir, math_rows, tmp_path):
    from tiltlab.llm.disa.stage1 import run_stage1
    from tiltlab.llm.disa.stage2.config import Stage2Config
    from tiltlab.llm.disa.stage2.run import run_stage2

    s1 = tmp_path / "s1"
    run_stage1(_stage1_cfg(tiny_dir, s1), rows=math_rows[:4], progress=False)
    capsys.readouterr()
    cfg = Stage2Config(labels=str(s1), out_dir=str(tmp_path / "s2"), epochs=3, hidden=8, device="cpu")
    metrics = run_stage2(cfg, progress=True)
    err = capsys.readouterr().err.splitlines()
    assert any(ln.startswith("stage2 embedding: 4/4 prompt (100%)") for ln in err), err
    fit = [ln for ln in err if ln.startswith("stage2 fit: ")]
    assert [ln.split(" ", 3)[2] for ln in fit] == ["1/3", "2/3", "3/3"], fit
    assert all("train MSE " in ln and ", val MSE " in ln for ln in fit), fit
    assert metrics["best_epoch"] in (0, 1, 2)
