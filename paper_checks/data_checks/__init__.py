"""Checks of the papers' own numbers (layer ``data``).

Two kinds of check live here, both registered on import:

``llm_scale`` — one per claim that carries an ``llm_command`` (the LLM-scale tables and
figures of the five papers). Such a claim cannot be re-measured on a CPU, so the check
returns :attr:`Verdict.OUT_OF_REACH` with the paper's numbers and the command in its
evidence. It still checks the data: every table's average column must equal the mean of
its component columns up to the paper's rounding (otherwise the paper's table is internally
inconsistent and the verdict is :attr:`Verdict.PARTLY`, with the offending rows). Problems
on *our* side — a claim without ``paper_numbers``, a malformed table, a command naming a
config that ``configs/`` does not contain once ``configs/`` holds any config — raise
``ValueError``: the check is then reported as an error and ``tiltlab check`` fails loudly.

``paper_internal`` — the quantitative sentences of the papers' text (``+3.31 on AIME 2024``,
``up to 13.8 Mean@8 points``, ``lambda = 10 never below Off-RL`` ...) recomputed from the
tables the claims register holds. A verdict here says whether the paper's text agrees with
its own tables; it says nothing about whether the LLM-scale numbers reproduce.

Rounding: a printed value with ``d`` decimals stands for an interval of half-width
``0.5 * 10**-d``; every comparison below allows exactly the worst-case propagated rounding
(sum of half-widths for sums and differences, interval arithmetic for ratios), nothing more.
"""

from __future__ import annotations

from tiltlab.claims.registry import Verdict, claims, load_claims, register_check

# the paper_internal checks of each paper register themselves in tables._INTERNAL on import
from . import disa, flowrl, fpa, lad, paced  # noqa: F401
from .llm_scale import (
    CONFIG_DIR,
    EXPECTED_LLM_SCALE,
    NOT_REPRODUCIBLE,
    TYPO_CLAIMS,
    _not_reproducible,
    command_problems,
    config_problems,
    llm_scale_check,
)
from .tables import _INTERNAL, average_problems, halfwidth, numeric_tables

__all__ = [
    "CONFIG_DIR",
    "EXPECTED_LLM_SCALE",
    "TYPO_CLAIMS",
    "average_problems",
    "command_problems",
    "config_problems",
    "halfwidth",
    "llm_scale_check",
    "numeric_tables",
]


def _register_all() -> None:
    load_claims()
    declared = claims()
    for cid in sorted(NOT_REPRODUCIBLE):
        register_check(cid, layer="data", expected=Verdict.OUT_OF_REACH, name="llm_scale")(_not_reproducible(cid))
    for cid, c in sorted(declared.items()):
        if c.llm_command:
            register_check(
                cid, layer="data", expected=EXPECTED_LLM_SCALE.get(cid, Verdict.OUT_OF_REACH), name="llm_scale"
            )(llm_scale_check(cid))
    for cid, (expected, fn, items) in sorted(_INTERNAL.items()):
        if cid not in declared:
            raise ValueError(f"paper_internal check for undeclared claim {cid!r}")
        register_check(cid, layer="data", expected=expected, name="paper_internal", expected_items=items)(fn)


_register_all()
