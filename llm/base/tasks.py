"""Synthetic *verifiable* tasks: boxed arithmetic and tiny function-writing with unit tests.

Used by the tests, the CPU demo and to train the tiny model's BPE tokenizer
(:func:`synthetic_corpus`). Everything is pure Python, deterministic given ``seed``.

Record schema (the same as :mod:`llm.base.data` prompt datasets):

* math rows:  ``{"id", "prompt", "answer", "difficulty", "task": "arithmetic"}`` where ``answer`` is
  the exact integer as a string; a correct completion ends with ``\\boxed{<answer>}``.
* plain-answer arithmetic rows (:func:`qa_tasks`): ``{"id", "prompt", "answer", "answer_format": "plain",
  "difficulty", "task": "arithmetic_qa"}``: "What is 23 + 14? Answer with just the number." -- graded by the
  math reward without the ``\\boxed{}`` requirement (``answer_format``), a task a 135M instruct model
  passes some of the time (the boxed task it never passes).
* multi-answer rows (:func:`multi_answer_tasks`): ``{"id", "prompt", "answer", "answer_format": "set",
  "n_answers", "template", "task": "multi_answer"}``: "Name an even number between 11 and 19. Answer with just
  the number." with ``answer = "12 14 16 18"`` (every correct answer, ascending, space-separated), graded by the
  math reward as right iff the completion's one number is in that set.
* code rows:  ``{"id", "prompt", "tests", "entry_point", "solution", "difficulty", "task": "function"}``
  where ``tests`` is assert-based Python source run after the completion's code (see
  :mod:`llm.base.rewards`), and ``solution`` is a reference implementation (for tests of the tests).
"""

from __future__ import annotations

import random
from typing import Any

__all__ = [
    "BOXED_INSTRUCTION",
    "MAX_DIFFICULTY",
    "MULTI_DEFAULT_TEMPLATES",
    "MULTI_MAX_VALUE",
    "MULTI_TEMPLATES",
    "answer_format_of_id",
    "arithmetic_task",
    "arithmetic_tasks",
    "function_tasks",
    "mixed_tasks",
    "multi_answer_tasks",
    "multi_questions",
    "qa_tasks",
    "synthetic_corpus",
]

BOXED_INSTRUCTION = "Put the final answer in \\boxed{}."
MAX_DIFFICULTY = 5

# difficulty -> (number of operands, max operand value, allowed operators)
_ARITH_LEVELS: dict[int, tuple[int, int, str]] = {
    1: (2, 9, "+"),
    2: (2, 99, "+-"),
    3: (3, 99, "+-*"),
    4: (4, 999, "+-*"),
    5: (5, 9999, "+-*"),
}


def _check_difficulty(difficulty: int) -> None:
    if difficulty not in _ARITH_LEVELS:
        raise ValueError(f"difficulty must be an int in 1..{MAX_DIFFICULTY}, got {difficulty!r}")


def arithmetic_task(rng: random.Random, difficulty: int, idx: int = 0) -> dict[str, Any]:
    """One arithmetic problem of the given difficulty (1 = one-digit sum ... 5 = five 4-digit operands).

    The expression is built from integers and ``+ - *`` and evaluated with Python's precedence;
    the gold answer is the exact integer (possibly negative) as a string.
    """
    _check_difficulty(difficulty)
    n_ops, max_val, ops = _ARITH_LEVELS[difficulty]
    operands = [rng.randint(0, max_val) for _ in range(n_ops)]
    operators = [rng.choice(ops) for _ in range(n_ops - 1)]
    # keep products small enough to be readable: at most one '*' per expression at levels <= 4
    if difficulty <= 4 and operators.count("*") > 1:
        first = operators.index("*")
        operators = [o if (o != "*" or i == first) else "+" for i, o in enumerate(operators)]
    expr = str(operands[0])
    for op, val in zip(operators, operands[1:]):
        expr += f" {op} {val}"
    value = _eval_int_expr(expr)
    return {
        "id": f"arith-d{difficulty}-{idx}",
        "prompt": f"Compute {expr}. {BOXED_INSTRUCTION}",
        "answer": str(value),
        "difficulty": difficulty,
        "task": "arithmetic",
    }


def _eval_int_expr(expr: str) -> int:
    """Evaluate ``a op b op c`` (ints, + - *) with standard precedence, without ``eval``."""
    tokens = expr.split()
    # first pass: multiplication
    terms: list[int] = [int(tokens[0])]
    signs: list[str] = []
    for op, tok in zip(tokens[1::2], tokens[2::2]):
        v = int(tok)
        if op == "*":
            terms[-1] = terms[-1] * v
        elif op in "+-":
            signs.append(op)
            terms.append(v)
        else:  # pragma: no cover - generator only emits + - *
            raise ValueError(f"unsupported operator {op!r}")
    total = terms[0]
    for s, v in zip(signs, terms[1:]):
        total = total + v if s == "+" else total - v
    return total


def arithmetic_tasks(n: int, difficulty: int | list[int] | None = None, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` arithmetic rows. ``difficulty``: an int, a list cycled over, or ``None`` = all levels 1..5 cycled."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    levels = (
        list(range(1, MAX_DIFFICULTY + 1))
        if difficulty is None
        else ([difficulty] if isinstance(difficulty, int) else list(difficulty))
    )
    if not levels:
        raise ValueError("difficulty list is empty")
    for d in levels:
        _check_difficulty(d)
    rng = random.Random(f"arith-{seed}")
    return [arithmetic_task(rng, levels[i % len(levels)], idx=i) for i in range(n)]


# plain-answer questions: level -> (left operand range, right operand range, operator)
_QA_LEVELS: dict[int, tuple[tuple[int, int], tuple[int, int], str]] = {
    1: ((1, 9), (1, 9), "+"),
    2: ((10, 99), (1, 99), "+"),
    3: ((10, 99), (1, 99), "-"),
    4: ((2, 12), (2, 12), "*"),
    5: ((10, 99), (2, 9), "*"),
}
QA_INSTRUCTION = "Answer with just the number."


def qa_tasks(n: int, difficulty: int | list[int] | None = None, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` plain-answer arithmetic questions ("What is 23 + 14? Answer with just the number.").

    ``difficulty`` as in :func:`arithmetic_tasks` (levels 1..5 of :data:`_QA_LEVELS`: one-digit sums,
    two-digit sums, two-digit differences (never negative), times tables, two-digit times one-digit).
    Rows carry ``answer_format = "plain"``: :func:`tiltlab.llm.base.rewards.math_reward` then grades the
    last number of the completion instead of requiring ``\\boxed{}``.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    levels = (
        list(_QA_LEVELS) if difficulty is None else ([difficulty] if isinstance(difficulty, int) else list(difficulty))
    )
    if not levels:
        raise ValueError("difficulty list is empty")
    for d in levels:
        if d not in _QA_LEVELS:
            raise ValueError(f"difficulty must be an int in 1..{len(_QA_LEVELS)}, got {d!r}")
    rng = random.Random(f"qa-{seed}")
    rows = []
    for i in range(n):
        d = levels[i % len(levels)]
        (a_lo, a_hi), (b_lo, b_hi), op = _QA_LEVELS[d]
        a, b = rng.randint(a_lo, a_hi), rng.randint(b_lo, b_hi)
        if op == "-" and b > a:
            a, b = b, a
        value = a + b if op == "+" else (a - b if op == "-" else a * b)
        expr = f"{a} {'times' if op == '*' else op} {b}"
        rows.append(
            {
                "id": f"qa-d{d}-{i}",
                "prompt": f"What is {expr}? {QA_INSTRUCTION}",
                "answer": str(value),
                "answer_format": "plain",
                "difficulty": d,
                "task": "arithmetic_qa",
            }
        )
    return rows


# ---------------------------------------------------------------------------------------------
# multi-answer questions: "Name an even number between 11 and 19." -- several answers are right
# ---------------------------------------------------------------------------------------------

MULTI_MIN_ANSWERS, MULTI_MAX_ANSWERS = 2, 6
"""Every multi-answer question has between 2 and 6 correct answers (both included)."""
MULTI_MAX_VALUE = 20
"""Default largest correct answer of :func:`multi_answer_tasks`: SmolLM2-135M-Instruct is right less
often with larger numbers (docs/llm-runs.md)."""


def _windows(members: list[int], max_value: int) -> list[tuple[int, int, list[int]]]:
    """Every ``(lo, hi, answers)``: ``answers`` = 2..6 consecutive entries of the ascending ``members``
    (the first entry is only a lower fence, never an answer), all at most ``max_value``, and ``lo``,
    ``hi`` strictly between the member before / after them. The members strictly between ``lo`` and
    ``hi`` are then exactly ``answers``, and neither bound is a member: "between" means the same with
    or without its ends."""
    out = []
    for i in range(1, len(members)):
        for count in range(MULTI_MIN_ANSWERS, MULTI_MAX_ANSWERS + 1):
            if i + count >= len(members) or members[i + count - 1] > max_value:
                break
            for lo in range(members[i - 1] + 1, members[i]):
                for hi in range(members[i + count - 1] + 1, members[i + count]):
                    out.append((lo, hi, members[i : i + count]))
    return out


def _multi_divisible(max_value: int) -> list[tuple[str, list[int]]]:
    return [
        (f"Name a number between {lo} and {hi} that is divisible by {m}.", ans)
        for m in range(3, 10)
        for lo, hi, ans in _windows(list(range(m, max_value + 2 * m, m)), max_value)
    ]


def _multi_even(max_value: int) -> list[tuple[str, list[int]]]:
    return [
        (f"Name an even number between {lo} and {hi}.", ans)
        for lo, hi, ans in _windows(list(range(0, max_value + 3, 2)), max_value)
    ]


def _multi_odd(max_value: int) -> list[tuple[str, list[int]]]:
    return [
        (f"Name an odd number between {lo} and {hi}.", ans)
        for lo, hi, ans in _windows(list(range(-1, max_value + 3, 2)), max_value)
    ]


def _multi_prime(max_value: int) -> list[tuple[str, list[int]]]:
    primes = [p for p in range(2, 2 * max_value + 3) if all(p % d for d in range(2, p))]
    return [(f"Name a prime number between {lo} and {hi}.", ans) for lo, hi, ans in _windows([0, *primes], max_value)]


def _multi_between(max_value: int) -> list[tuple[str, list[int]]]:
    return [
        (f"Name a whole number greater than {lo} and less than {lo + count + 1}.", list(range(lo + 1, lo + count + 1)))
        for count in range(MULTI_MIN_ANSWERS, MULTI_MAX_ANSWERS + 1)
        for lo in range(0, max_value - count + 1)
    ]


_MULTI_FAMILIES = {
    "even": _multi_even,
    "odd": _multi_odd,
    "prime": _multi_prime,
    "between": _multi_between,
    "divisible": _multi_divisible,
}
MULTI_TEMPLATES = tuple(_MULTI_FAMILIES)
"""Question templates of :func:`multi_answer_tasks`."""
MULTI_DEFAULT_TEMPLATES = ("even", "odd", "prime", "between")
"""The templates :func:`multi_answer_tasks` cycles by default: SmolLM2-135M-Instruct (8 samples at T = 1,
16 new tokens, answers up to 20) was right on 7-10% of its samples for each, on 1% for ``divisible``
(docs/llm-runs.md)."""


def multi_questions(template: str, max_value: int = MULTI_MAX_VALUE) -> list[tuple[str, list[int]]]:
    """Every question of ``template`` (a name of :data:`MULTI_TEMPLATES`) whose answers are at most
    ``max_value``, as ``(question, correct answers ascending)``, in a fixed order.

    * ``even`` / ``odd``: "Name an even / odd number between lo and hi.";
    * ``prime``: "Name a prime number between lo and hi.";
    * ``between``: "Name a whole number greater than lo and less than hi.";
    * ``divisible``: "Name a number between lo and hi that is divisible by m." (m = 3..9, answers from
      2m on, so that m itself is never one).

    Each has 2..6 correct answers, from 1 to ``max_value``, none of them a number of the question. The
    bounds ``lo >= 0`` and ``hi`` of all but ``between`` are never answers themselves, so "between"
    reads the same with or without its ends. With ``max_value = 20``: 35 ``even``, 35 ``odd``, 62
    ``prime``, 85 ``between`` and 167 ``divisible`` questions.
    """
    if template not in _MULTI_FAMILIES:
        raise ValueError(f"template must be one of {', '.join(MULTI_TEMPLATES)}, got {template!r}")
    if not isinstance(max_value, int) or max_value < 10:
        raise ValueError(f"max_value must be an int >= 10 (each template then has questions), got {max_value!r}")
    return _MULTI_FAMILIES[template](max_value)


def multi_answer_tasks(
    n: int, seed: int = 0, templates: str | list[str] | None = None, max_value: int = MULTI_MAX_VALUE
) -> list[dict[str, Any]]:
    """``n`` distinct questions with several correct integer answers ("Name an even number between 11
    and 19. Answer with just the number.": 12, 14, 16 or 18).

    ``templates``: a name of :data:`MULTI_TEMPLATES`, a list of names cycled over, or ``None`` =
    :data:`MULTI_DEFAULT_TEMPLATES` cycled (all but ``divisible``). Row ``i`` is the next question of
    its template in a seeded shuffle of all its questions (:func:`multi_questions` with ``max_value``),
    so no prompt repeats; an ``n`` that needs more questions of a template than it has is refused (the
    defaults give at most 140 rows: 35 ``even`` questions). Every answer lies in ``1..max_value``.

    Rows: ``answer`` the correct answers ascending, separated by single spaces (``"12 14 16 18"``),
    ``answer_format = "set"`` (:func:`tiltlab.llm.base.rewards.math_reward` pays a completion whose one number
    is in the set), ``n_answers`` their count (2..6), ``template`` the name.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    names = (
        list(MULTI_DEFAULT_TEMPLATES)
        if templates is None
        else ([templates] if isinstance(templates, str) else list(templates))
    )
    if not names:
        raise ValueError("templates list is empty")
    rng = random.Random(f"multi-{seed}")
    pools: dict[str, list[tuple[str, list[int]]]] = {}
    for t in names:
        if t not in pools:
            pools[t] = multi_questions(t, max_value)
            rng.shuffle(pools[t])
    used = dict.fromkeys(pools, 0)
    rows = []
    for i in range(n):
        name = names[i % len(names)]
        if used[name] == len(pools[name]):
            want = sum(1 for j in range(n) if names[j % len(names)] == name)
            raise ValueError(
                f"n = {n} needs {want} {name!r} questions; max_value = {max_value} gives {len(pools[name])}"
            )
        question, answers = pools[name][used[name]]
        used[name] += 1
        rows.append(
            {
                "id": f"multi-{name}-{i}",
                "prompt": f"{question} {QA_INSTRUCTION}",
                "answer": " ".join(str(a) for a in answers),
                "answer_format": "set",
                "n_answers": len(answers),
                "template": name,
                "task": "multi_answer",
            }
        )
    return rows


# ---------------------------------------------------------------------------------------------
# function-writing tasks: "write f(x) returning ..." with assert-based tests
# ---------------------------------------------------------------------------------------------


def _fn_affine(rng: random.Random) -> tuple[str, str, list[tuple[Any, Any]], int]:
    a, b = rng.randint(2, 9), rng.randint(0, 20)
    desc = f"returns {a} * x + {b} for an integer x"
    sol = f"def f(x):\n    return {a} * x + {b}\n"
    cases = [(x, a * x + b) for x in (0, 1, -3, 7, 12)]
    return desc, sol, cases, 1


def _fn_square_plus(rng: random.Random) -> tuple[str, str, list[tuple[Any, Any]], int]:
    k = rng.randint(1, 30)
    desc = f"returns x squared plus {k} for an integer x"
    sol = f"def f(x):\n    return x * x + {k}\n"
    cases = [(x, x * x + k) for x in (0, 2, -5, 11)]
    return desc, sol, cases, 1


def _fn_count_char(rng: random.Random) -> tuple[str, str, list[tuple[Any, Any]], int]:
    ch = rng.choice("abcdexyz")
    desc = f"returns how many times the letter '{ch}' occurs in the string x"
    sol = f"def f(x):\n    return x.count('{ch}')\n"
    words = ["", ch, ch * 3 + "q", "banana", "xyzzy", "abcabc" + ch]
    cases = [(w, w.count(ch)) for w in words]
    return desc, sol, cases, 2


def _fn_sum_multiples(rng: random.Random) -> tuple[str, str, list[tuple[Any, Any]], int]:
    m = rng.randint(2, 7)
    desc = f"returns the sum of the elements of the list x that are divisible by {m}"
    sol = f"def f(x):\n    return sum(v for v in x if v % {m} == 0)\n"
    lists = [[], [m], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [-m, m * 5, 13], [m * 2, m * 3 + 1]]
    cases = [(lst, sum(v for v in lst if v % m == 0)) for lst in lists]
    return desc, sol, cases, 2


def _fn_reverse_words(rng: random.Random) -> tuple[str, str, list[tuple[Any, Any]], int]:
    sep = rng.choice([" ", ",", "-"])
    desc = f"splits the string x on {sep!r}, reverses the order of the pieces and joins them with {sep!r}"
    sol = f"def f(x):\n    return {sep!r}.join(reversed(x.split({sep!r})))\n"
    inputs = ["a", f"a{sep}b", f"one{sep}two{sep}three", f"{sep}x"]
    cases = [(s, sep.join(reversed(s.split(sep)))) for s in inputs]
    return desc, sol, cases, 3


_FN_FAMILIES = [_fn_affine, _fn_square_plus, _fn_count_char, _fn_sum_multiples, _fn_reverse_words]


def function_tasks(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` function-writing rows (families cycled) with assert-based ``tests`` and a reference ``solution``."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(f"func-{seed}")
    rows = []
    for i in range(n):
        desc, sol, cases, difficulty = _FN_FAMILIES[i % len(_FN_FAMILIES)](rng)
        tests = "".join(f"assert f({x!r}) == {y!r}\n" for x, y in cases)
        rows.append(
            {
                "id": f"func-{i}",
                "prompt": (f"Write a Python function f(x) that {desc}. Answer with the code in a ```python``` block."),
                "tests": tests,
                "entry_point": "f",
                "solution": sol,
                "difficulty": difficulty,
                "task": "function",
            }
        )
    return rows


def mixed_tasks(n_math: int, n_code: int, seed: int = 0) -> list[dict[str, Any]]:
    """Arithmetic rows followed by function rows (missing columns filled with ``None``)."""
    rows = arithmetic_tasks(n_math, seed=seed) + function_tasks(n_code, seed=seed)
    keys = sorted({k for r in rows for k in r})
    return [{k: r.get(k) for k in keys} for r in rows]


def synthetic_corpus(seed: int = 0, n_math: int = 400, n_code: int = 100) -> list[str]:
    """Texts to train the tiny model's tokenizer on: prompts, worked boxed answers and code solutions."""
    texts: list[str] = []
    for row in arithmetic_tasks(n_math, seed=seed):
        texts.append(row["prompt"])
        texts.append(f"The answer is \\boxed{{{row['answer']}}}.")
    for row in function_tasks(n_code, seed=seed):
        texts.append(row["prompt"])
        texts.append(f"```python\n{row['solution']}```")
        texts.append(row["tests"])
    texts.append("You are a helpful assistant. Let's think step by step. So the final answer is")
    return texts


def answer_format_of_id(row_id: str) -> str:
    """The ``answer_format`` of a row made here, from its id: ``qa-*`` rows (:func:`qa_tasks`) are
    ``plain``, ``multi-*`` rows (:func:`multi_answer_tasks`) are ``set`` (a record that kept only the
    held-out ids re-derives its coverage from them; a test pins the two makers against this)."""
    if row_id.startswith("qa-"):
        return "plain"
    if row_id.startswith("multi-"):
        return "set"
    raise ValueError(f"row id {row_id!r} is not one of qa_tasks' (qa-*) or multi_answer_tasks' (multi-*)")
