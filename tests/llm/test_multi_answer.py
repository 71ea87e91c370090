"""Questions with several right answers: the ``set`` grading rule of the math reward."""

from __future__ import annotations

import re

import pytest

from tiltlab.llm.rewards import (
    gold_numbers,
    math_reward,
    plain_answer,
    plain_number_correct,
    set_number_correct,
    verifiable_reward,
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
