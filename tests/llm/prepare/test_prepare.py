"""``tiltlab llm prepare``: the papers' training sets from tiny fixture files in the published schemas."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pa = pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402

from tests.patching import patch_everywhere  # noqa: E402
from tiltlab.llm.base.data import DEFAULT_MATH_INSTRUCTION, load_prompts  # noqa: E402
from tiltlab.llm.prepare import run as prepare  # noqa: E402
from tiltlab.llm.prepare.config import FpaConfig  # noqa: E402

DAPO_WRAP = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{p}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)


def _dapo_file(tmp_path: Path) -> Path:
    """DAPO-Math-17k's published Parquet schema: data_source, prompt (chat messages), ability,
    reward_model {ground_truth, style}, extra_info {index}; the release repeats prompts."""
    rows = [
        {
            "data_source": "math_dapo",
            "prompt": [{"role": "user", "content": DAPO_WRAP.format(p=p)}],
            "ability": "MATH",
            "reward_model": {"ground_truth": gt, "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": idx},
        }
        for p, gt, idx in [
            ("What is $3+4$?", "7", "a1"),
            ("Compute $2^{10}$.", "1024", "b2"),
            ("What is $3+4$?", "7", "a1"),
        ]
    ]
    path = tmp_path / "dapo.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_dapo_prompt_asks_for_boxed_and_the_reward_agrees(tmp_path):
    from tiltlab.llm.base.rewards import math_reward

    rows = prepare.prepare_dapo(_dapo_file(tmp_path))
    assert [r["id"] for r in rows] == ["a1", "b2"]  # the repeated prompt is kept once
    assert rows[0]["prompt"] == f"What is $3+4$?\n{DEFAULT_MATH_INSTRUCTION}"
    assert all("Answer:" not in r["prompt"] and "\\boxed{}" in r["prompt"] for r in rows)
    # a completion that follows the prepared prompt's instruction is graded correct, a wrong one not
    got = math_reward(
        [r["prompt"] for r in rows] * 2,
        ["so \\boxed{7}", "\\boxed{1024}", "\\boxed{8}", "\\boxed{1000}"],
        answer=[r["answer"] for r in rows] * 2,
    )
    assert got == [1.0, 1.0, 0.0, 0.0]


def test_dapo_processed_schema_and_cli(tmp_path):
    """open-r1/DAPO-Math-17k-Processed: prompt string + solution; via the CLI into JSONL."""
    from tiltlab.cli import main

    src = tmp_path / "proc.jsonl"
    src.write_text(json.dumps({"prompt": "Find $x$ if $x+1=3$.", "solution": "2", "data_source": "x"}) + "\n")
    out = tmp_path / "out" / "dapo.jsonl"
    assert main(["llm", "prepare", "dapo", "--input", str(src), "--out", str(out)]) == 0
    rows = load_prompts(str(out))
    assert rows[0]["answer"] == "2" and rows[0]["prompt"].endswith(DEFAULT_MATH_INSTRUCTION)
    assert not list(out.parent.glob(".dapo.jsonl.*"))  # no temporary file left


def test_deepscaler_json_list(tmp_path):
    src = tmp_path / "deepscaler.json"
    src.write_text(
        json.dumps([{"problem": "1+1?", "answer": "2", "solution": "..."}, {"problem": "2*3?", "answer": "6"}])
    )
    rows = prepare.prepare_deepscaler(src)
    assert [r["answer"] for r in rows] == ["2", "6"]
    assert rows[1]["prompt"] == f"2*3?\n{DEFAULT_MATH_INSTRUCTION}"
    with pytest.raises(ValueError, match="'problem' and 'answer'"):
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps([{"question": "x"}]))
        prepare.prepare_deepscaler(bad)


def test_deepcoder_formats(tmp_path):
    """DeepCoder's tests column (a JSON string): LiveCodeBench-style case lists (stdin / functional
    with metadata.func_name), TACO's {inputs, outputs}; an unknown format is skipped and counted."""
    rows = [
        {
            "problem": "Print the sum of two integers.",
            "tests": json.dumps([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]),
            "metadata": "{}",
        },
        {
            "problem": "Return a+b.",
            "tests": json.dumps(
                [{"input": "1\n2", "output": "3", "testtype": "functional", "metadata": {"func_name": "add"}}]
            ),
            "metadata": "{}",
            "starter_code": "class Solution:\n    def add(self, a, b):",
        },
        {"problem": "Echo.", "tests": json.dumps({"inputs": ["x\n"], "outputs": ["x\n"]}), "metadata": "{}"},
        {"problem": "Weird.", "tests": json.dumps({"something": 1}), "metadata": "{}"},
    ]
    rows = [{"starter_code": "", **r} for r in rows]
    src = tmp_path / "deepcoder.parquet"
    pq.write_table(pa.Table.from_pylist(rows), src)
    out, skipped = prepare.prepare_deepcoder(src)
    assert skipped == 1 and [r["test_type"] for r in out] == ["stdio", "functional", "stdio"]
    assert json.loads(out[0]["tests"]) == {"cases": [{"input": "1 2\n", "output": "3\n"}]}
    assert out[1]["entry_point"] == "add" and json.loads(out[1]["tests"])["func_name"] == "add"
    assert "class Solution" in out[1]["prompt"]


def test_deepcoder_stdio_row_is_graded_by_the_code_reward(tmp_path):
    from tiltlab.llm.base.rewards import code_reward

    src = tmp_path / "dc.jsonl"
    src.write_text(
        json.dumps({"problem": "Sum.", "tests": json.dumps([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}])})
        + "\n"
    )
    (row,), _ = prepare.prepare_deepcoder(src)
    good = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    bad = "```python\nprint(0)\n```"
    cols = {k: [row.get(k)] * 2 for k in ("tests", "test_type", "entry_point")}
    assert code_reward([row["prompt"]] * 2, [good, bad], **cols) == [1.0, 0.0]


def test_math_train_uses_fpa_prompt_and_boxed_gold(tmp_path):
    src = tmp_path / "math_train.jsonl"
    src.write_text(
        json.dumps(
            {"problem": "What is 2+2?", "solution": "We add: $\\boxed{4}$.", "level": "Level 1", "type": "Algebra"}
        )
        + "\n"
    )
    (row,) = prepare.prepare_math(src)
    assert row["answer"] == "4" and row["level"] == "Level 1"
    assert row["prompt"].startswith("Solve this math problem step by step.")
    assert row["prompt"].endswith("Q:What is 2+2? A:") and "\\boxed{X}" in row["prompt"]


def _stage1_dir(tmp_path: Path) -> Path:
    d = tmp_path / "stage1"
    d.mkdir()
    pq.write_table(
        pa.table({"prompt_id": ["p0", "p1"], "prompt": ["Q0", "Q1"], "log_z": [0.1, 0.2]}), d / "labels-00000.parquet"
    )
    pq.write_table(
        pa.table(
            {
                "prompt_id": ["p0", "p0", "p1", "p1"],
                "sample_idx": [0, 1, 0, 1],
                "completion": ["right0", "wrong0", "right-unfinished", "right1"],
                "reward_raw": [1.0, 0.0, 1.0, 1.0],
                "finished": [True, True, False, True],
            }
        ),
        d / "samples-00000.parquet",
    )
    return d


def test_sft_rows_from_stage1_feed_the_sft_trainer_rows(tmp_path):
    """The SFT-LoRA baseline's corpus (DISA App. D.4): correct, finished samples with their prompt
    text; the offline trainer's sft preparation accepts them unchanged."""
    from tiltlab.llm.train.offline import prepare_offline_rows

    d = _stage1_dir(tmp_path)
    rows = prepare.sft_rows_from_stage1(d)
    assert [(r["prompt"], r["completion"]) for r in rows] == [("Q0", "right0"), ("Q1", "right1")]
    assert prepare_offline_rows(rows, "sft") == rows
    out = tmp_path / "sft.jsonl"
    from tiltlab.cli import main

    assert main(["llm", "prepare", "sft", "--input", str(d), "--out", str(out)]) == 0
    assert len(out.read_text().splitlines()) == 2
    with pytest.raises(FileNotFoundError, match="Stage-1"):
        prepare.sft_rows_from_stage1(tmp_path)


def test_fpa_rows_filter_all_same_and_hold_out():
    rows = [{"id": f"q{i}", "prompt": f"P{i}", "answer": "1"} for i in range(6)]
    texts = [[f"c{i}{j}" for j in range(4)] for i in range(6)]
    rewards = [1, 1, 1, 1] + [0, 0, 0, 0] + [1, 0, 0, 0] * 4  # q0 all right, q1 all wrong, q2..q5 mixed
    train, val, counts = prepare.fpa_rows_from_groups(rows, texts, rewards, 0.25, seed=42)
    assert counts == {"prompts": 6, "kept": 4, "all_correct": 1, "all_wrong": 1, "val_prompts": 1}
    assert len(train) == 12 and len(val) == 4
    ids_train, ids_val = {r["prompt_id"] for r in train}, {r["prompt_id"] for r in val}
    assert ids_train | ids_val == {"q2", "q3", "q4", "q5"} and not ids_train & ids_val  # split by prompt
    again = prepare.fpa_rows_from_groups(rows, texts, rewards, 0.25, seed=42)
    assert again[1] == val  # the split is a function of the seed


class _FakeEngine:
    """Returns completions 'k=<j>' for sample j; records the sampling config."""

    tokenizer = None

    def __init__(self):
        self.calls = []

    def generate(self, prompts, n, sampling):
        from tiltlab.llm.base.rollout import RolloutGroup

        self.calls.append((list(prompts), n, sampling))
        return [
            RolloutGroup(p, [1], [[1]] * n, [f"\\boxed{{{j}}}" for j in range(n)], [[0.0]] * n, [True] * n)
            for p in prompts
        ]


def test_build_fpa_offline_with_the_paper_defaults(tmp_path):
    """K = 8 samples at T = 0.7, max 2,048 tokens, seed 42; the gold answer 3 makes exactly one of the
    8 samples correct (kept); gold 99 makes all wrong (dropped); 5% of 40 kept prompts = 2 held out."""
    data = tmp_path / "prompts.jsonl"
    rows = [{"id": f"q{i}", "prompt": f"P{i}", "answer": "3"} for i in range(40)] + [
        {"id": "never", "prompt": "X", "answer": "99"}
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    eng = _FakeEngine()
    cfg = FpaConfig(model="unused", dataset=str(data), out=str(tmp_path / "fpa.jsonl"), batch_size=16)
    info = prepare.build_fpa_offline(cfg, engine=eng)
    _, n, s = eng.calls[0]
    assert (n, s.temperature, s.max_new_tokens, s.top_p) == (8, 0.7, 2048, 1.0)
    assert info["kept"] == 40 and info["all_wrong"] == 1 and info["val_prompts"] == 2
    train = load_prompts_rows(tmp_path / "fpa.jsonl")
    val = load_prompts_rows(tmp_path / "fpa.val.jsonl")
    assert len(train) == 38 * 8 and len(val) == 2 * 8
    assert sum(r["reward"] for r in train) == 38  # one correct sample per kept prompt
    assert {r["prompt_id"] for r in train}.isdisjoint({r["prompt_id"] for r in val})


def load_prompts_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_build_fpa_offline_on_the_tiny_model(tmp_path, monkeypatch):
    """The real rollout engine (HF, tiny model): K samples per prompt reach the reward; a reward
    that marks the first sample of each prompt correct keeps every prompt."""
    import tiltlab.llm.base.rewards as rewards

    def first_right(prompts, completions, completion_ids=None, **kw):
        return [1.0 if i % 3 == 0 else 0.0 for i in range(len(completions))]

    patch_everywhere(monkeypatch, rewards, "resolve_reward", lambda name: first_right)
    data = tmp_path / "p.jsonl"
    data.write_text(
        "".join(json.dumps({"id": f"q{i}", "prompt": f"Compute {i}+1.", "answer": str(i + 1)}) + "\n" for i in range(4))
    )
    cfg = FpaConfig(
        model="tiny",
        dataset=str(data),
        out=str(tmp_path / "o.parquet"),
        k=3,
        max_new_tokens=4,
        engine="hf",
        holdout_fraction=0.25,
    )
    info = prepare.build_fpa_offline(cfg)
    assert info["kept"] == 4 and info["train_rows"] == 9 and info["val_rows"] == 3
    t = pq.read_table(tmp_path / "o.parquet").to_pylist()
    assert {"prompt", "completion", "reward", "prompt_id"} <= set(t[0])


def test_prepare_fpa_cli_refuses_a_dataset_with_nothing_to_keep(tmp_path, capsys):
    """`tiltlab llm prepare fpa` end to end on the tiny model: its samples never box the gold answer,
    so every prompt is all-wrong and the command fails with a clear message, writing nothing."""
    from tiltlab.cli import main

    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"id": "q0", "prompt": "Compute 1+1.", "answer": "123456789"}) + "\n")
    out = tmp_path / "fpa.jsonl"
    argv = ["llm", "prepare", "fpa", "--model", "tiny", "--dataset", str(data), "--out", str(out)]
    assert main([*argv, "--engine", "hf", "--k", "2", "--max-new-tokens", "2"]) != 0
    assert "no prompt with both correct and wrong samples" in capsys.readouterr().err
    assert not out.exists()


def test_build_fpa_offline_refuses_a_reward_with_one_none(tmp_path, monkeypatch):
    """One ungraded sample (the reward returned None for it, e.g. a prompt without an answer) stops the
    build before anything is written: a None among numbers is not a wrong answer."""
    import tiltlab.llm.base.rewards as rewards

    def one_none(prompts, completions, completion_ids=None, **kw):
        return [None if i == 3 else float(i % 2) for i in range(len(completions))]

    patch_everywhere(monkeypatch, rewards, "resolve_reward", lambda name: one_none)
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"P{i}", "answer": "3"}) + "\n" for i in range(4)))
    cfg = FpaConfig(model="unused", dataset=str(data), out=str(tmp_path / "fpa.jsonl"), batch_size=16)
    with pytest.raises(ValueError, match="the reward returned None"):
        prepare.build_fpa_offline(cfg, engine=_FakeEngine())
    assert list(tmp_path.iterdir()) == [data]
