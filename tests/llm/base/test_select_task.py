"""A real-model task with signal: ``synthetic:qa`` questions, their plain-number grading, and
``tiltlab llm prepare select`` (keep the prompts whose pi_ref pass rate lies in [min, max])."""

from __future__ import annotations

import json
import math

import pytest

from tiltlab.llm.base.data import load_prompts, save_prompts
from tiltlab.llm.base.rewards import math_reward, plain_number_correct, verifiable_reward
from tiltlab.llm.base.tasks import qa_tasks
from tiltlab.llm.prepare import run as prepare
from tiltlab.llm.prepare.config import SelectConfig

Q = "What is 23 + 14? Answer with just the number."


def test_qa_tasks_answers_levels_and_determinism():
    rows = qa_tasks(50, seed=3)
    assert rows == qa_tasks(50, seed=3) and rows != qa_tasks(50, seed=4)
    assert [r["difficulty"] for r in rows[:10]] == [1, 2, 3, 4, 5, 1, 2, 3, 4, 5]
    for r in rows:  # the gold answer recomputed naively from the question's text
        a, op, b = r["prompt"].removeprefix("What is ").split("?")[0].split()
        want = {"+": int(a) + int(b), "-": int(a) - int(b), "times": int(a) * int(b)}[op]
        assert r["answer"] == str(want) and want >= 0
        assert r["answer_format"] == "plain" and r["id"].startswith(f"qa-d{r['difficulty']}-")
    assert {r["difficulty"] for r in qa_tasks(6, difficulty=[2, 4])} == {2, 4}
    assert load_prompts("synthetic:qa:5:3", seed=1) == qa_tasks(5, difficulty=[3], seed=1)
    assert qa_tasks(0) == []
    with pytest.raises(ValueError, match="difficulty"):
        qa_tasks(2, difficulty=6)
    with pytest.raises(ValueError, match="n must be"):
        qa_tasks(-1)


@pytest.mark.parametrize(
    ("text", "paid"),
    [
        ("37", True),
        ("The answer is 37.", True),
        ("23 + 14 = 37", True),  # restating the question's numbers is not a second answer
        ("**37**", True),
        ("37.0", True),
        ("35, 36, 37", False),  # a list of candidates
        ("It is 36. No wait, 37", False),
        ("37 or 38", False),
        ("The answer is 37. 2+2=4", False),
        ("-37", False),
        ("370", False),
        ("3.7", False),
        ("", False),
        ("thirty-seven", False),
    ],
)
def test_plain_answers(text, paid):
    assert plain_number_correct(Q, text, "37") is paid
    assert math_reward([Q], [text], answer=["37"], answer_format=["plain"]) == [float(paid)]


def test_answer_format_column_changes_grading_only_where_set():
    comps = ["The answer is 37.", "\\boxed{37}"]
    # without the column the math reward requires a box (the default); with "plain" it reads the number
    assert math_reward([Q] * 2, comps, answer=["37"] * 2) == [0.0, 1.0]
    assert math_reward([Q] * 2, comps, answer=["37"] * 2, answer_format=["plain", None]) == [1.0, 1.0]
    assert math_reward([Q] * 2, comps, answer=["37"] * 2, answer_format=[None, "plain"]) == [0.0, 1.0]
    assert verifiable_reward([Q] * 2, comps, answer=["37"] * 2, answer_format="plain") == [1.0, 1.0]
    chat = [[{"role": "user", "content": Q}]]  # TRL passes conversational prompts
    assert math_reward(chat, ["23 + 14 = 37"], answer=["37"], answer_format=["plain"]) == [1.0]
    with pytest.raises(ValueError, match="answer_format"):
        math_reward([Q], ["37"], answer=["37"], answer_format=["latex"])
    with pytest.raises(ValueError, match="numeric"):
        math_reward([Q], ["37"], answer=["x + 1"], answer_format=["plain"])


# --- prepare select on a real Stage-1 run (tiny model, a reward that fixes each prompt's pass rate) ---
M = 8


def counted_reward(prompts, completions, completion_ids=None, k=None, **kw):
    """1.0 for the first ``k`` of each prompt's ``M`` samples: pass rate exactly ``k / M``."""
    return [1.0 if (i % M) < int(kk) else 0.0 for i, kk in enumerate(k)]


def _stage1(tmp_path, tiny_dir, ks, temperature=1.0, proposal=None):
    from tiltlab.llm.disa.stage1 import Stage1Config, run_stage1

    rows = [{"id": f"p{i}", "prompt": f"question {i}", "answer": "1", "k": k} for i, k in enumerate(ks)]
    data = tmp_path / "rows.jsonl"
    save_prompts(rows, data)
    cfg = Stage1Config(
        proposal=str(proposal or tiny_dir),
        reference=str(tiny_dir),
        dataset=str(data),
        out_dir=str(tmp_path / f"s1-{temperature}-{proposal is not None}"),
        M=M,
        tilt_beta=2.0,
        temperature=temperature,
        max_new_tokens=2,
        device="cpu",
        dtype="fp32",
        prompts_per_shard=3,  # several shards: the selection reads all of them
    )
    run_stage1(cfg, reward_fn=counted_reward, progress=False)
    return cfg, rows


def test_select_keeps_the_pass_rate_window_with_labels_and_split(tmp_path, tiny_dir):
    from tiltlab.llm.disa.stage1 import load_stage1

    ks = [0, 1, 2, 3, 4, 5, 6, 7, 8, 2, 6]  # pass rates k/8
    cfg, rows = _stage1(tmp_path, tiny_dir, ks)
    _, labels = load_stage1(cfg.out_dir)
    label = dict(zip(labels.column("prompt_id").to_pylist(), labels.column("log_z").to_pylist()))
    # away from the defaults (0.1, 0.9): the window [0.25, 0.75] with both ends on a pass rate
    sel = SelectConfig(
        stage1=cfg.out_dir,
        out=str(tmp_path / "train.jsonl"),
        min_pass=0.25,
        max_pass=0.75,
        heldout_fraction=0.4,
        heldout_out=str(tmp_path / "held.jsonl"),
        seed=5,
    )
    info = prepare.select_by_pass_rate(sel)
    want = {f"p{i}" for i, k in enumerate(ks) if 2 <= k <= 6}
    train, held = load_prompts(sel.out), load_prompts(sel.heldout_out)
    got = [r["id"] for r in train] + [r["id"] for r in held]
    assert sorted(got) == sorted(want) and len(set(got)) == len(got)  # a partition of the kept prompts
    assert len(held) == round(0.4 * len(want)) == info["n_heldout"]
    assert info["n_labelled"] == len(ks) and info["n_kept"] == len(want) and info["n_train"] == len(train)
    assert info["mean_pass_all"] == pytest.approx(sum(ks) / M / len(ks))
    by_id = {r["id"]: r for r in rows}
    for r in train + held:
        k = by_id[r["id"]]["k"]
        assert r["ref_pass_rate"] == k / M and r["prompt"] == by_id[r["id"]]["prompt"]
        # q = pi_ref: log w = beta r, so the label is log mean exp(beta r) = log(1 + p (e^beta - 1))
        assert r["log_z"] == label[r["id"]]
        assert r["log_z"] == pytest.approx(math.log(1 + k / M * (math.exp(2.0) - 1)), abs=1e-6)
    assert info["mean_pass_train"] == pytest.approx(sum(r["ref_pass_rate"] for r in train) / len(train))
    # the split is seeded: the same seed gives the same held-out ids, and the seed is used (10 seeds give
    # more than one of the 35 ways to hold out 3 of the 7 kept prompts; all equal by chance: 35^-9)
    prepare.select_by_pass_rate(sel)
    assert [r["id"] for r in load_prompts(sel.heldout_out)] == [r["id"] for r in held]
    splits = set()
    for seed in range(10):
        other = SelectConfig(**{**sel.__dict__, "seed": seed, "heldout_out": str(tmp_path / "h.jsonl")})
        prepare.select_by_pass_rate(other)
        splits.add(frozenset(r["id"] for r in load_prompts(other.heldout_out)))
    assert len(splits) > 1

    # the CLI: same selection at the defaults (0.1, 0.9), no held-out file
    from tiltlab.cli import main

    out = tmp_path / "cli.jsonl"
    assert main(["llm", "prepare", "select", "--stage1", cfg.out_dir, "--out", str(out)]) == 0
    assert {json.loads(x)["id"] for x in out.read_text().splitlines()} == {
        f"p{i}" for i, k in enumerate(ks) if 0.1 <= k / M <= 0.9
    }


def test_select_refuses_what_is_not_pi_ref_or_has_no_signal(tmp_path, tiny_dir):
    cfg, _ = _stage1(tmp_path, tiny_dir, [0, 8, 0], temperature=0.7)
    with pytest.raises(ValueError, match="pi_ref's own samples"):
        prepare.select_by_pass_rate(SelectConfig(stage1=cfg.out_dir, out=str(tmp_path / "x.jsonl")))
    cfg, _ = _stage1(tmp_path, tiny_dir, [0, 8, 0])
    # each other way a run is not pi_ref's own sampling (recorded in its manifest) is refused too
    import shutil

    for i, change in enumerate(({"top_p": 0.9}, {"top_k": 20}, {"proposal": "another-model"})):
        d = tmp_path / f"patched{i}"
        shutil.copytree(cfg.out_dir, d)
        man = json.loads((d / "manifest.json").read_text())
        man["config"].update(change)
        (d / "manifest.json").write_text(json.dumps(man))
        with pytest.raises(ValueError, match="pi_ref's own samples"):
            prepare.select_by_pass_rate(SelectConfig(stage1=str(d), out=str(tmp_path / "x.jsonl"), min_pass=0))
    with pytest.raises(ValueError, match="no signal"):
        prepare.select_by_pass_rate(SelectConfig(stage1=cfg.out_dir, out=str(tmp_path / "x.jsonl")))
    assert not (tmp_path / "x.jsonl").exists()  # nothing written on refusal
    with pytest.raises(ValueError, match="not in the dataset"):
        prepare.select_by_pass_rate(
            SelectConfig(stage1=cfg.out_dir, out=str(tmp_path / "x.jsonl"), min_pass=0.0),
            rows=[{"id": "other", "prompt": "q"}],
        )
    for bad in ({"min_pass": 0.6, "max_pass": 0.4}, {"heldout_fraction": 0.5}, {"heldout_fraction": 1.0}):
        with pytest.raises(ValueError):
            SelectConfig(stage1="s", out="o.jsonl", **bad)
