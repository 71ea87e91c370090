"""Questions with several right answers (``synthetic:multi``): the ``set`` grading rule of the math
reward, the generator, and the coverage statistics of one prompt's samples."""

from __future__ import annotations

import math
import re

import pytest

from tiltlab.llm.base.coverage import Coverage, correct_answers, correct_entropy_exp, coverage, distinct_correct
from tiltlab.llm.base.data import load_prompts
from tiltlab.llm.base.rewards import (
    gold_numbers,
    math_reward,
    plain_answer,
    plain_number_correct,
    set_number_correct,
    verifiable_reward,
)
from tiltlab.llm.base.tasks import (
    MULTI_DEFAULT_TEMPLATES,
    MULTI_MAX_VALUE,
    MULTI_TEMPLATES,
    multi_answer_tasks,
    multi_questions,
)

# ------------------------------------------------------------------ the set rule

Q = "Name a number between 10 and 30 that is divisible by 7. Answer with just the number."
GOLD = "14 21 28"


@pytest.mark.parametrize(
    ("text", "answer", "paid"),
    [
        ("14", 14.0, True),
        ("28", 28.0, True),
        ("The answer is 21.", 21.0, True),
        ("**21**", 21.0, True),
        ("21.0", 21.0, True),
        ("Between 10 and 30, 7 divides 21", 21.0, True),  # the question's numbers are not a second answer
        ("21 = 3 x 7, so 21", None, False),  # 3 is neither the answer nor the question's
        ("14, 21, 28", None, False),  # a list of candidates, all of them right: not paid
        ("14 or 21", None, False),
        ("It is 15. No, 14", None, False),
        ("15", 15.0, False),  # an answer, not in the set
        ("7", 7.0, False),  # a number of the question, not in the set
        ("-14", -14.0, False),
        ("140", 140.0, False),
        ("", None, False),
        ("fourteen", None, False),
    ],
)
def test_set_answers(text, answer, paid):
    assert plain_answer(Q, text) == answer
    assert set_number_correct(Q, text, GOLD) is paid
    assert math_reward([Q], [text], answer=[GOLD], answer_format=["set"]) == [float(paid)]


def test_plain_answer_is_the_plain_rule():
    # plain_number_correct pays exactly the text whose plain_answer is the gold number
    q = "What is 23 + 14? Answer with just the number."
    for text in ["37", "23 + 14 = 37", "35, 36, 37", "36. No, 37", "37 or 38", "1,037", "x"]:
        for gold in ("37", "1037", "36"):
            assert plain_number_correct(q, text, gold) is (plain_answer(q, text) == float(gold))
    assert plain_answer(q, "1,234") == 1234.0 and plain_answer(q, "23 then 14") == 14.0


def test_a_one_number_set_is_the_plain_rule_and_the_column_selects_the_rule():
    q = "What is 23 + 14? Answer with just the number."
    texts = ["37", "23 + 14 = 37", "35, 36, 37", "36", "37.0", "no"]
    n = len(texts)
    assert math_reward([q] * n, texts, answer=["37"] * n, answer_format=["set"] * n) == math_reward(
        [q] * n, texts, answer=["37"] * n, answer_format=["plain"] * n
    )
    # "14 21 28" is not one number: the plain rule refuses it, the set rule reads three; the box rule needs a box
    with pytest.raises(ValueError, match="numeric"):
        math_reward([Q], ["21"], answer=[GOLD], answer_format=["plain"])
    assert math_reward([Q] * 2, ["21", "\\boxed{21}"], answer=[GOLD] * 2, answer_format=["set", None]) == [1.0, 0.0]
    assert verifiable_reward([Q], ["21"], answer=[GOLD], answer_format="set") == [1.0]
    chat = [[{"role": "user", "content": Q}]]  # TRL passes conversational prompts
    assert math_reward(chat, ["Between 10 and 30: 28"], answer=[GOLD], answer_format=["set"]) == [1.0]
    assert math_reward([Q], ["21"], answer=[None], answer_format=["set"]) == [None]


@pytest.mark.parametrize("bad", ["", "  ", "14, 21", "14,21", "fourteen", "14 x", "nan", "14 inf"])
def test_a_set_answer_must_be_finite_numbers_separated_by_spaces(bad):
    with pytest.raises(
        ValueError, match=f"answer_format 'set' needs finite numbers separated by spaces, got {re.escape(repr(bad))}"
    ):
        set_number_correct(Q, "14", bad)


def test_gold_numbers_reads_any_whitespace_and_decimals():
    assert gold_numbers("14 21 28") == {14.0, 21.0, 28.0}
    assert gold_numbers(" 3\t-2\n0.5 3 ") == {3.0, -2.0, 0.5}
    assert set_number_correct("Name a number.", "It is -2", "3 -2 0.5")
    assert set_number_correct("Name a number.", "0.50", "3 -2 0.5")


# ------------------------------------------------------------------ the generator


def _is_prime(x: int) -> bool:
    return x >= 2 and all(x % d for d in range(2, x))


_RULES = {
    "divisible": (
        r"Name a number between (-?\d+) and (-?\d+) that is divisible by (-?\d+)\.",
        lambda x, a, b, m: a < x < b and x % m == 0,
    ),
    "even": (r"Name an even number between (-?\d+) and (-?\d+)\.", lambda x, a, b: a < x < b and x % 2 == 0),
    "odd": (r"Name an odd number between (-?\d+) and (-?\d+)\.", lambda x, a, b: a < x < b and x % 2 == 1),
    "prime": (r"Name a prime number between (-?\d+) and (-?\d+)\.", lambda x, a, b: a < x < b and _is_prime(x)),
    "between": (r"Name a whole number greater than (-?\d+) and less than (-?\d+)\.", lambda x, a, b: a < x < b),
}


def _brute_force(template: str, question: str) -> tuple[list[int], list[int]]:
    """``(correct answers, numbers of the question)``, recomputed from the question's text alone by
    trying every integer from -500 to 500 (an answer outside the stated range would show as missing)."""
    pattern, ok = _RULES[template]
    m = re.fullmatch(pattern, question)
    assert m, f"{question!r} is not a {template!r} question"
    args = [int(g) for g in m.groups()]
    return [x for x in range(-500, 501) if ok(x, *args)], args


@pytest.mark.parametrize("max_value", [10, 20, 60])
@pytest.mark.parametrize("template", MULTI_TEMPLATES)
def test_every_question_has_exactly_its_answers_by_brute_force(template, max_value):
    questions = multi_questions(template, max_value)
    assert len({q for q, _ in questions}) == len(questions) > 0  # no question twice
    for question, answers in questions:
        want, numbers = _brute_force(template, question)
        assert answers == want  # the whole correct set, ascending
        assert 2 <= len(want) <= 6 and all(1 <= x <= max_value for x in want)
        assert not set(want) & set(numbers)  # echoing the question is never right
        if template != "between":  # "between" reads the same with its ends: the ends are not answers
            lo, hi = numbers[:2]
            assert want == _brute_force(template, question.replace(f"{lo} and {hi}", f"{lo - 1} and {hi + 1}"))[0]
    if max_value == 60:  # every set size occurs
        assert {len(a) for _, a in questions} == {2, 3, 4, 5, 6}


def test_multi_rows_are_seeded_distinct_and_cycle_the_templates():
    rows = multi_answer_tasks(60, seed=3)
    assert rows == multi_answer_tasks(60, seed=3) and rows != multi_answer_tasks(60, seed=4)
    assert multi_answer_tasks(60) == multi_answer_tasks(60, seed=0) != rows
    assert (
        [r["template"] for r in rows[:8]]
        == ["even", "odd", "prime", "between"] * 2
        == list(MULTI_DEFAULT_TEMPLATES) * 2
    )
    assert len({r["prompt"] for r in rows}) == 60 and len({r["id"] for r in rows}) == 60
    by_question = {q: a for t in MULTI_DEFAULT_TEMPLATES for q, a in multi_questions(t)}
    for i, r in enumerate(rows):
        question = r["prompt"].removesuffix(" Answer with just the number.")
        assert r["answer"] == " ".join(str(a) for a in by_question[question])  # ascending, one space apart
        assert r["n_answers"] == len(by_question[question])
        assert r["id"] == f"multi-{r['template']}-{i}" and r["answer_format"] == "set" and r["task"] == "multi_answer"
    # every question of a template, once each: the whole pool in a seeded order
    evens = multi_answer_tasks(len(multi_questions("even")), seed=1, templates="even")
    assert sorted(r["prompt"] for r in evens) == sorted(
        f"{q} Answer with just the number." for q, _ in multi_questions("even")
    )
    assert [r["template"] for r in multi_answer_tasks(4, templates=["divisible", "prime"])] == [
        "divisible",
        "prime",
    ] * 2
    assert set(MULTI_TEMPLATES) - set(MULTI_DEFAULT_TEMPLATES) == {"divisible"}
    assert multi_answer_tasks(0) == []
    # max_value away from its default: larger answers appear, none above it
    wide = multi_answer_tasks(50, seed=2, max_value=60)
    top = max(int(x) for r in wide for x in r["answer"].split())
    assert MULTI_MAX_VALUE < top <= 60
    assert max(int(x) for r in rows for x in r["answer"].split()) <= MULTI_MAX_VALUE == 20
    assert load_prompts("synthetic:multi:7", seed=5) == multi_answer_tasks(7, seed=5)
    assert load_prompts("synthetic:multi:6:prime,even", seed=2) == multi_answer_tasks(
        6, seed=2, templates=["prime", "even"]
    )


def test_multi_tasks_refuse_bad_arguments():
    with pytest.raises(ValueError, match="n must be >= 0, got -1"):
        multi_answer_tasks(-1)
    with pytest.raises(ValueError, match="template must be one of even, odd, prime, between, divisible, got 'square'"):
        multi_answer_tasks(2, templates=["even", "square"])
    with pytest.raises(ValueError, match="templates list is empty"):
        multi_answer_tasks(2, templates=[])
    with pytest.raises(ValueError, match="max_value must be an int >= 10 .*, got 9"):
        multi_answer_tasks(2, max_value=9)
    with pytest.raises(ValueError, match="max_value must be an int >= 10 .*, got 20.0"):
        multi_questions("even", 20.0)
    assert len(multi_questions("even", 10)) == 10  # 2 4 6 8 10 in windows of 2..5 with odd bounds
    assert len(multi_answer_tasks(10, templates="even", max_value=10)) == 10
    with pytest.raises(ValueError, match="n = 21 needs 11 'even' questions; max_value = 10 gives 10"):
        multi_answer_tasks(21, templates=["even", "odd"], max_value=10)
    # at the default max_value: the question counts the docstring states, so at most 140 default rows
    sizes = {t: len(multi_questions(t)) for t in MULTI_TEMPLATES}
    assert sizes == {"even": 35, "odd": 35, "prime": 62, "between": 85, "divisible": 167}
    assert len(multi_answer_tasks(140)) == 140
    with pytest.raises(ValueError, match="n = 141 needs 36 'even' questions; max_value = 20 gives 35"):
        multi_answer_tasks(141)
    with pytest.raises(ValueError, match="unknown synthetic task 'multiple'; use math, qa, multi, code or mixed"):
        load_prompts("synthetic:multiple:3")
    with pytest.raises(ValueError, match=r"synthetic:multi:N\[:templates\]"):
        load_prompts("synthetic:multi:x")
    with pytest.raises(FileNotFoundError, match="synthetic:multi:N"):
        load_prompts("no-such-dataset")


# ------------------------------------------------------------------ coverage statistics


def _naive(answers: list[float | None]) -> tuple[int, float]:
    """``(distinct, exp(entropy))`` by hand: the counts of each correct answer, then the formula."""
    correct = [a for a in answers if a is not None]
    if not correct:
        return 0, 0.0
    values = sorted(set(correct))
    shares = [correct.count(v) / len(correct) for v in values]
    return len(values), math.exp(-sum(p * math.log(p) for p in shares))


@pytest.mark.parametrize(
    ("answers", "distinct", "exp_h"),
    [
        ([None, None, None, None], 0, 0.0),  # nothing correct: nothing covered
        ([14.0, 14.0, 14.0, 14.0], 1, 1.0),  # all one answer
        ([14.0, None, 14.0, None], 1, 1.0),  # incorrect samples do not count
        ([14.0, 21.0, 28.0], 3, 3.0),  # all distinct, evenly
        ([14.0, 21.0, None, None], 2, 2.0),
        ([14.0, 14.0, 21.0, 21.0], 2, 2.0),  # a tie
        ([14.0, 14.0, 14.0, 21.0], 2, math.exp(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)))),  # 1.7548...
        ([14.0, 14.0, 21.0, 28.0], 3, 2**1.5),  # shares 1/2, 1/4, 1/4: H = 1.5 ln 2
    ],
)
def test_distinct_and_entropy_on_hand_cases(answers, distinct, exp_h):
    assert distinct_correct(answers) == distinct
    # the formula's exact value; 1e-12 is float rounding of a sum of three logs
    assert correct_entropy_exp(answers) == pytest.approx(exp_h, abs=1e-12)
    assert (distinct, correct_entropy_exp(answers)) == pytest.approx(_naive(answers), abs=1e-12)
    assert correct_entropy_exp(answers) <= distinct + 1e-12  # never more than the answers given


def test_coverage_of_one_prompt_against_a_hand_count():
    samples = [
        "14",  # right
        "The answer is 21.",  # right
        "14, 21, 28",  # a list: wrong
        "21",  # right
        "15",  # wrong
        [{"role": "assistant", "content": "21"}],  # right, as a chat message
        "",  # wrong
        "Between 10 and 30: 28",  # right
    ]
    assert correct_answers(Q, samples, GOLD) == [14.0, 21.0, None, 21.0, None, 21.0, None, 28.0]
    cov = coverage(Q, samples, GOLD)
    # 5 of 8 right; answers 14, 21, 21, 21, 28: shares 1/5, 3/5, 1/5
    h = -(2 * 0.2 * math.log(0.2) + 0.6 * math.log(0.6))
    assert cov == Coverage(
        k=8,
        mean_at_k=5 / 8,
        pass_at_k=1.0,
        distinct_correct=3,
        correct_entropy_exp=pytest.approx(math.exp(h), abs=1e-12),  # float rounding of three logs
        n_answers=3,
    )
    # the rows agree with what the reward pays
    assert [a is not None for a in correct_answers(Q, samples, GOLD)] == [
        bool(x) for x in math_reward([Q] * 8, samples, answer=[GOLD] * 8, answer_format=["set"] * 8)
    ]
    none = coverage(Q, ["15", "14 or 21", "7"], GOLD)
    assert none == Coverage(k=3, mean_at_k=0.0, pass_at_k=0.0, distinct_correct=0, correct_entropy_exp=0.0, n_answers=3)
    one = coverage(Q, ["28", "28"], GOLD)
    assert one == Coverage(k=2, mean_at_k=1.0, pass_at_k=1.0, distinct_correct=1, correct_entropy_exp=1.0, n_answers=3)
    # another set: four answers, two of them given (once and twice), one sample wrong
    even = "Name an even number between 1 and 9. Answer with just the number."
    h = -(1 / 3 * math.log(1 / 3) + 2 / 3 * math.log(2 / 3))
    assert coverage(even, ["2", "4", "Between 1 and 9: 4", "9"], "2 4 6 8") == Coverage(
        k=4,
        mean_at_k=0.75,
        pass_at_k=1.0,
        distinct_correct=2,
        correct_entropy_exp=pytest.approx(math.exp(h), abs=1e-12),
        n_answers=4,
    )
    with pytest.raises(ValueError, match="coverage needs at least one completion, got 0"):
        coverage(Q, [], GOLD)
    with pytest.raises(ValueError, match="answer_format 'set'"):
        coverage(Q, ["14"], "14,21")


def test_coverage_separates_collapse_from_spread():
    """Same accuracy, different coverage: what tells distribution matching from reward maximisation."""
    collapsed = coverage(Q, ["14"] * 6 + ["15"] * 2, GOLD)
    spread = coverage(Q, ["14", "21", "28", "14", "21", "28", "15", "15"], GOLD)
    assert collapsed.mean_at_k == spread.mean_at_k == 0.75 and collapsed.pass_at_k == spread.pass_at_k == 1.0
    assert (collapsed.distinct_correct, collapsed.correct_entropy_exp) == (1, 1.0)
    assert spread.distinct_correct == 3 and spread.correct_entropy_exp == pytest.approx(3.0, abs=1e-12)
