"""Prompt datasets (JSONL / Parquet / save_to_disk), synthetic tasks and benchmark loaders."""

import base64
import json
import pickle
import zlib

import pytest

from tiltlab.llm.base.data import (
    BENCHMARKS,
    as_chat,
    benchmark_path,
    load_benchmark,
    load_prompts,
    normalize_rows,
    read_table,
    save_prompts,
)
from tiltlab.llm.base.rewards import code_reward, math_reward
from tiltlab.llm.base.tasks import (
    MAX_DIFFICULTY,
    _eval_int_expr,
    arithmetic_tasks,
    function_tasks,
    mixed_tasks,
    synthetic_corpus,
)

ROWS = [{"id": "a", "prompt": "1+1?", "answer": "2"}, {"id": "b", "prompt": "2+2?", "answer": "4"}]


# ------------------------------------------------------------------ synthetic tasks


def test_arithmetic_tasks_deterministic_and_graded():
    a, b = arithmetic_tasks(25, seed=7), arithmetic_tasks(25, seed=7)
    assert a == b and a != arithmetic_tasks(25, seed=8)
    assert sorted({r["difficulty"] for r in a}) == list(range(1, MAX_DIFFICULTY + 1))

    def expr(r):
        return r["prompt"][len("Compute ") : r["prompt"].index(".")]

    rows = arithmetic_tasks(200, seed=7)
    size = {
        d: max(
            (len(expr(r).split()) + 1) // 2 * 10**5 + max(int(t) for t in expr(r).split()[::2])
            for r in rows
            if r["difficulty"] == d
        )
        for d in range(1, 6)
    }
    # each level has more operands, or as many operands and larger ones, than the level below
    assert all(size[d] < size[d + 1] for d in range(1, 5)), size
    for r in rows:
        assert int(r["answer"]) == eval(expr(r))  # independent reference: Python's own evaluator
        assert "\\boxed{}" in r["prompt"]
    assert len({r["id"] for r in a}) == 25


def test_eval_int_expr_matches_python():
    for e in ["1 + 2 * 3", "10 - 4 - 3", "2 * 3 * 4 - 5", "7 - 8 * 9 + 1"]:
        assert _eval_int_expr(e) == eval(e)


def test_arithmetic_difficulty_errors():
    with pytest.raises(ValueError, match="difficulty"):
        arithmetic_tasks(3, difficulty=9)
    with pytest.raises(ValueError, match="n must be"):
        arithmetic_tasks(-1)


def test_function_tasks_solutions_pass_own_tests_and_wrong_fails():
    rows = function_tasks(10, seed=2)
    assert rows == function_tasks(10, seed=2)
    for r in rows:
        ns: dict = {}
        exec(r["solution"] + "\n" + r["tests"], ns)  # trusted reference code
        ns = {}
        with pytest.raises(AssertionError):
            exec("def f(x):\n    return None\n" + r["tests"], ns)


def test_mixed_and_corpus():
    rows = mixed_tasks(3, 2)
    assert [r["task"] for r in rows] == ["arithmetic"] * 3 + ["function"] * 2
    assert rows[0]["tests"] is None and rows[-1]["answer"] is None
    corpus = synthetic_corpus(seed=0)
    assert any("\\boxed{" in t for t in corpus) and any("def f(x)" in t for t in corpus)


# ------------------------------------------------------------------ files


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_roundtrip_files(tmp_path, suffix):
    p = save_prompts(ROWS, tmp_path / f"d{suffix}")
    rows = load_prompts(p)
    assert [(r["id"], r["prompt"], r["answer"]) for r in rows] == [(r["id"], r["prompt"], r["answer"]) for r in ROWS]


def test_json_list_parquet_dir_and_limit(tmp_path):
    (tmp_path / "d.json").write_text(json.dumps(ROWS))
    assert [r["id"] for r in load_prompts(tmp_path / "d.json", limit=1)] == ["a"]
    shards = tmp_path / "shards"
    save_prompts(ROWS[:1], shards / "part-0.parquet")
    save_prompts(ROWS[1:], shards / "part-1.parquet")
    assert [r["id"] for r in load_prompts(shards)] == ["a", "b"]


def test_save_to_disk_dataset_and_dict(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list([{"problem": "3*3?", "answer": "9"}])
    ds.save_to_disk(str(tmp_path / "ds"))
    rows = load_prompts(tmp_path / "ds")
    assert rows[0]["prompt"] == "3*3?" and rows[0]["id"] == "ds-0"
    datasets.DatasetDict({"train": ds, "test": ds}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(ValueError, match="pass split="):
        load_prompts(tmp_path / "dd")
    assert load_prompts(tmp_path / "dd", split="test")[0]["answer"] == "9"


def test_missing_columns_errors(tmp_path):
    save_prompts([{"id": "x", "text": "hi", "answer": "1"}], tmp_path / "noprompt.jsonl")
    with pytest.raises(ValueError, match="no prompt column.*columns present: \\['answer', 'id', 'text'\\]"):
        load_prompts(tmp_path / "noprompt.jsonl")
    save_prompts([{"id": "x", "prompt": "hi"}], tmp_path / "notarget.jsonl")
    with pytest.raises(ValueError, match="neither an answer column"):
        load_prompts(tmp_path / "notarget.jsonl")
    # explicit column mapping fixes it
    rows = load_prompts(tmp_path / "noprompt.jsonl", columns={"prompt": "text"})
    assert rows[0]["prompt"] == "hi"
    with pytest.raises(ValueError, match="duplicate ids"):
        normalize_rows([ROWS[0], ROWS[0]])
    with pytest.raises(FileNotFoundError):
        load_prompts(tmp_path / "absent.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"id": 1}\nnot json\n')
    with pytest.raises(ValueError, match="line 2"):
        read_table(tmp_path / "bad.jsonl")
    (tmp_path / "x.csv").write_text("a,b")
    with pytest.raises(ValueError, match="unsupported"):
        load_prompts(tmp_path / "x.csv")


def test_synthetic_specs_and_chat():
    assert len(load_prompts("synthetic:math:6")) == 6
    assert {r["difficulty"] for r in load_prompts("synthetic:math:6:2")} == {2}
    assert len(load_prompts("synthetic:code:3")) == 3
    assert len(load_prompts("synthetic:mixed:5")) == 5
    with pytest.raises(ValueError, match="bad synthetic spec"):
        load_prompts("synthetic:math")
    chat = as_chat(ROWS, system="sys")
    assert chat[0]["prompt"] == [{"role": "system", "content": "sys"}, {"role": "user", "content": "1+1?"}]
    # conversational prompts are read back as the last user turn
    assert normalize_rows(chat)[0]["prompt"] == "1+1?"


def test_hf_dataset():
    pytest.importorskip("datasets")
    from tiltlab.llm.base.data import to_hf_dataset

    ds = to_hf_dataset(ROWS)
    assert ds.column_names == ["id", "prompt", "answer"] and len(ds) == 2


# ------------------------------------------------------------------ benchmarks (fake local copies in real schemas)


def test_benchmark_absent_names_expected_file(tmp_path, monkeypatch):
    monkeypatch.setenv("TILTLAB_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="math500.jsonl") as e:
        load_benchmark("MATH-500")
    assert "HuggingFaceH4/MATH-500" in str(e.value) and str(tmp_path) in str(e.value)
    with pytest.raises(ValueError, match="unknown benchmark"):
        load_benchmark("mmlu")
    assert set(BENCHMARKS) >= {
        "math500",
        "aime24",
        "aime25",
        "amc23",
        "gsm8k",
        "minerva",
        "olympiadbench",
        "humanevalplus",
        "livecodebench",
        "codeforces",
    }


def test_math_benchmarks_normalized(tmp_path):
    save_prompts(
        [{"problem": "What is 1/2+1/2?", "solution": "...", "answer": "1", "unique_id": "test/x/1.json", "level": 1}],
        tmp_path / "math500.jsonl",
    )
    save_prompts(
        [{"question": "Nat has 3 apples...", "answer": "3 + 4 = <<3+4=7>>7\n#### 1,007"}], tmp_path / "gsm8k.jsonl"
    )
    save_prompts(
        [{"id": 5, "question": "Olympiad q", "final_answer": ["$\\frac{3}{4}$"]}], tmp_path / "olympiadbench.parquet"
    )
    save_prompts([{"problem": "AMC q", "answer": 27.0, "url": "u"}], tmp_path / "amc23.jsonl")
    m = load_benchmark("math500", data_dir=tmp_path)[0]
    assert m["id"] == "test/x/1.json" and m["answer"] == "1" and m["task"] == "math"
    assert m["prompt"].endswith("\\boxed{}.") and m["problem_text"] == "What is 1/2+1/2?"
    assert load_benchmark("gsm8k", data_dir=tmp_path)[0]["answer"] == "1007"
    o = load_benchmark("OlympiadBench", data_dir=tmp_path, instruction=None)[0]
    assert o["answer"] == "\\frac{3}{4}" and o["prompt"] == "Olympiad q"
    assert load_benchmark("amc", data_dir=tmp_path)[0]["answer"] == "27"
    assert benchmark_path("amc23", tmp_path).name == "amc23.jsonl"
    # the gold answers verify with the math reward
    rows = load_benchmark("olympiadbench", data_dir=tmp_path)
    assert math_reward(None, ["\\boxed{0.75}"], answer=[rows[0]["answer"]]) == [1.0]
    assert load_prompts("bench:gsm8k", data_dir=tmp_path)[0]["answer"] == "1007"


def test_code_benchmarks_end_to_end(tmp_path):
    save_prompts(
        [
            {
                "task_id": "HumanEval/0",
                "prompt": 'def inc(x):\n    """Add one."""\n',
                "canonical_solution": "    return x + 1\n",
                "entry_point": "inc",
                "test": "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(-1) == 0\n",
            }
        ],
        tmp_path / "humanevalplus.jsonl",
    )
    private = base64.b64encode(
        zlib.compress(pickle.dumps(json.dumps([{"input": "5 6\n", "output": "11\n", "testtype": "stdin"}])))
    ).decode()
    save_prompts(
        [
            {
                "question_id": "abc301_a",
                "question_content": "Add two numbers.",
                "starter_code": "",
                "public_test_cases": json.dumps([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]),
                "private_test_cases": private,
                "metadata": "{}",
            },
            {
                "question_id": "lc1",
                "question_content": "Add k.",
                "starter_code": "class Solution:\n    def addK(self, nums: List[int], k: int) -> List[int]:",
                "public_test_cases": json.dumps([{"input": "[1, 2]\n3", "output": "[4, 5]", "testtype": "functional"}]),
                "private_test_cases": "",
                "metadata": json.dumps({"func_name": "addK"}),
            },
        ],
        tmp_path / "livecodebench.jsonl",
    )
    save_prompts(
        [{"problem": "Print the max.", "tests": json.dumps([{"input": "3\n1 5 2\n", "output": "5"}])}],
        tmp_path / "codeforces.jsonl",
    )
    he = load_benchmark("humaneval+", data_dir=tmp_path)
    lcb = load_benchmark("lcb", data_dir=tmp_path)
    cf = load_benchmark("codeforces", data_dir=tmp_path)
    assert he[0]["task"] == "code" and he[0]["answer"] is None and "```python" in he[0]["prompt"]
    assert [r["test_type"] for r in lcb] == ["stdio", "functional"]
    assert len(json.loads(lcb[0]["tests"])["cases"]) == 2  # public + decoded private

    def score(rows, comps):
        cols = {k: [r.get(k) for r in rows] for k in ("tests", "entry_point", "test_type", "code_prefix")}
        return code_reward([r["prompt"] for r in rows], comps, **cols)

    assert score(he * 3, ["    return x + 1\n", "```python\ndef inc(x):\n    return x + 1\n```", "    return x\n"]) == [
        1.0,
        1.0,
        0.0,
    ]
    assert score(
        lcb,
        [
            "a, b = map(int, input().split())\nprint(a + b)",
            "class Solution:\n    def addK(self, nums, k):\n        return [x + k for x in nums]",
        ],
    ) == [1.0, 1.0]
    assert score(lcb, ["print(3)", "class Solution:\n    def addK(self, nums, k):\n        return nums"]) == [0.0, 0.0]
    assert score(cf * 2, ["input()\nprint(max(map(int, input().split())))", "print(1)"]) == [1.0, 0.0]


def test_lcb_refuses_malicious_pickle(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    payload = base64.b64encode(zlib.compress(pickle.dumps(Evil()))).decode()
    save_prompts(
        [
            {
                "question_id": "q",
                "question_content": "x",
                "public_test_cases": "[]",
                "private_test_cases": payload,
                "metadata": "{}",
            }
        ],
        tmp_path / "livecodebench.jsonl",
    )
    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        load_benchmark("livecodebench", data_dir=tmp_path)


def test_a_dataset_dict_with_one_split_loads_it_without_a_split_argument(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list([{"problem": "2+5?", "answer": "7"}, {"problem": "1+1?", "answer": "2"}])
    datasets.DatasetDict({"validation": ds}).save_to_disk(str(tmp_path / "one"))
    rows = load_prompts(tmp_path / "one")
    assert [(r["prompt"], r["answer"]) for r in rows] == [("2+5?", "7"), ("1+1?", "2")]
    with pytest.raises(ValueError, match="split 'train' not in"):
        load_prompts(tmp_path / "one", split="train")


#: sha256 (first 16 hex digits) of each synthetic dataset's rows as sorted-key JSON: the synthetic tasks are
#: pure Python ``random.Random`` with string seeds, the same on every machine and Python version, and the
#: tiny-model caches, the recorded llm rows and Stage-1 labels depend on their exact content
SYNTHETIC_SHA = {
    "synthetic:math:64": "b16e0dbc457cb3f6",
    "synthetic:qa:64": "f8bbcf02ad801818",
    "synthetic:multi:64": "1ab78cd37f20961b",
    "synthetic:code:40": "c9b9d15c64794f50",
    "synthetic:mixed:20": "f75e0b962f0dad61",
}


@pytest.mark.parametrize("spec", sorted(SYNTHETIC_SHA))
def test_synthetic_datasets_are_pinned_to_their_content(spec):
    """A change to a generator (a word of a function task's test cases, an operand range) changes the data
    every recorded result was made on: it must show here, and the pin be renewed on purpose."""
    import hashlib
    import json

    from tiltlab.llm.base.data import load_prompts

    rows = load_prompts(spec)
    assert hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:16] == SYNTHETIC_SHA[spec]
