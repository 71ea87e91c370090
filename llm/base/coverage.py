"""Coverage of a set of correct answers by one prompt's ``k`` samples (questions with several right
answers, ``answer_format = "set"``: ``synthetic:multi``).

A distribution-matching objective (DISA's target ``pi_ref exp(beta r) / Z``) keeps ``pi_ref``'s spread
over the correct answers; a reward maximiser may put all its mass on one. For one prompt, with ``a_j``
the answer of sample ``j`` (:func:`llm.base.rewards.plain_answer`) when it is correct and nothing otherwise,
``c`` the number of correct samples and ``n_x`` how many of them answer ``x``:

* ``mean_at_k`` = ``c / k`` (:func:`objectives.metrics.mean_at_k`);
* ``pass_at_k`` = 1 if ``c > 0`` else 0 (the unbiased pass@k of ``c`` correct of ``n = k``);
* ``distinct_correct`` = the number of distinct correct answers given;
* ``correct_entropy_exp`` = ``exp(H)``, ``H = -sum_x (n_x / c) ln(n_x / c)``: the effective number of
  correct answers covered (1 when every correct sample gives the same answer, ``distinct_correct``
  when they are spread evenly, never more); 0 when no sample is correct (no answer covered);
* ``n_answers`` = ``|C|``, the size of the correct set: ``correct_entropy_exp / n_answers`` is the share
  of the set covered, the coverage the tiny llm checks report (docs/llm-checks.md).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tiltlab.objectives.metrics import mean_at_k, pass_at_k

from .rewards import completion_text, gold_numbers, plain_answer

__all__ = ["Coverage", "correct_answers", "correct_entropy_exp", "coverage", "distinct_correct"]


def correct_answers(prompt: str, completions: Sequence[Any], gold_set: str) -> list[float | None]:
    """Per completion, the number it answers (:func:`llm.base.rewards.plain_answer`) when that number is in
    ``gold_set`` (``"14 21 28"``, see :func:`llm.base.rewards.gold_numbers`), else None: the correct answer
    each sample gives, exactly where :func:`llm.base.rewards.set_number_correct` pays it."""
    gold = gold_numbers(gold_set)
    out: list[float | None] = []
    for comp in completions:
        a = plain_answer(prompt, completion_text(comp))
        out.append(a if a in gold else None)
    return out


def distinct_correct(answers: Sequence[float | None]) -> int:
    """How many distinct correct answers ``answers`` (None = an incorrect sample) holds."""
    return len({a for a in answers if a is not None})


def correct_entropy_exp(answers: Sequence[float | None]) -> float:
    """``exp(H)`` of the empirical distribution of the correct answers (None = an incorrect sample,
    left out): ``H = -sum_x p_x ln p_x`` with ``p_x`` the share of the correct samples that answer
    ``x``. 1.0 when they all give one answer, ``m`` for ``m`` answers given equally often, 0.0 when no
    sample is correct."""
    counts = Counter(a for a in answers if a is not None)
    c = sum(counts.values())
    if c == 0:
        return 0.0
    return math.exp(-sum(n / c * math.log(n / c) for n in counts.values()))


@dataclass(frozen=True)
class Coverage:
    """One prompt's ``k`` samples against its correct set (the module docstring gives each formula)."""

    k: int
    mean_at_k: float
    pass_at_k: float
    distinct_correct: int
    correct_entropy_exp: float
    n_answers: int


def coverage(prompt: str, completions: Sequence[Any], gold_set: str) -> Coverage:
    """Mean@k, pass@k, the distinct correct answers and ``exp`` of their entropy for one prompt's ``k``
    completions (strings or chat messages) and its correct set ``gold_set`` (``"14 21 28"``), whose
    size is ``n_answers``."""
    if len(completions) == 0:
        raise ValueError("coverage needs at least one completion, got 0")
    answers = correct_answers(prompt, completions, gold_set)
    k = len(answers)
    c = sum(a is not None for a in answers)
    return Coverage(
        k=k,
        mean_at_k=mean_at_k([a is not None for a in answers]),
        pass_at_k=pass_at_k(k, c, k),
        distinct_correct=distinct_correct(answers),
        correct_entropy_exp=correct_entropy_exp(answers),
        n_answers=len(gold_numbers(gold_set)),
    )
