"""The one decision rule of the llm checks: paired per-seed differences, a stated margin, Holm.

Every llm check reduces its evidence to *items*: one per statement of the claim, each a list of
per-seed paired differences (both arms trained from the same warm-up model with the same seed),
oriented so that the paper's statement predicts a positive difference, with a *margin* (the
smallest effect of interest, in the item's own units). For ``k`` items:

* an item **supports** the claim when a one-sided t-test rejects ``mean <= 0``;
* an item goes **against** the claim when a one-sided t-test rejects ``mean >= -margin`` (the
  effect lies in the opposite direction, beyond the margin);
* each family (the ``k`` support tests, the ``k`` against tests) is controlled at level
  :data:`ALPHA` (one-sided 0.025, the 95% two-sided interval for one item) by Holm's step-down
  procedure.

Verdict: every item supports -> verified; some support -> partly; none supports and one goes
against -> refuted; otherwise inconclusive (not significant is never refuted). A check whose runs
did not train (the "it ran" items: losses moved, weights moved, accuracy left its warm-up value)
is inconclusive whatever its items say, and its expected "ran" items fail ``tiltlab check``.

Items that hold by construction are never in the family; checks report them as context only.

The statistics (t p-values, intervals, Holm) are :mod:`tiltlab.paper_checks.stats`'s, shared with the
simulator's checks. The sim rule (``stats.decide``) asks more for support: the interval above
``+margin``; this rule asks for a positive effect (at this scale a smaller effect in the paper's
direction is still support) and keeps the margin for refutation, as pre-registered at 3dfabd9.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tiltlab.paper_checks import stats
from tiltlab.paper_checks.registry import Verdict

__all__ = ["ALPHA", "Item", "RunLog", "holm", "judge", "one_sided_p", "prefix_verdicts"]

ALPHA = 0.025
"""One-sided family-wise level of each family of item tests (= a 95% two-sided interval for one item)."""


@dataclass(frozen=True)
class Item:
    """One statement of a claim: per-seed paired differences (positive = the paper's direction)
    and its margin (smallest effect of interest, >= 0)."""

    name: str
    diffs: tuple[float, ...]
    margin: float

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("an item needs a name")
        if not (math.isfinite(self.margin) and self.margin >= 0):
            raise ValueError(f"item {self.name}: margin must be a finite number >= 0, got {self.margin}")
        bad = [d for d in self.diffs if not math.isfinite(d)]
        if bad:
            raise ValueError(f"item {self.name}: non-finite paired difference(s) {bad[:3]}: a NaN run has no verdict")


def one_sided_p(xs: Sequence[float], null: float, greater: bool) -> float:
    """p-value of the one-sided t-test of ``mean > null`` (``greater``) or ``mean < null``
    (:func:`tiltlab.paper_checks.stats.t_pvalue`: exact with zero spread). Needs two values."""
    if len(xs) < 2:
        raise ValueError(f"a paired t-test needs at least 2 seeds, got {len(xs)}")
    return stats.t_pvalue(xs, null, "greater" if greater else "less")


def holm(pvalues: Sequence[float], alpha: float = ALPHA) -> list[bool]:
    """Holm's step-down procedure at ``alpha`` (:func:`tiltlab.paper_checks.stats.holm`)."""
    return stats.holm(pvalues, alpha)


def t_interval(xs: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """``(mean, lo, hi)`` of the two-sided Student-t interval (:func:`tiltlab.paper_checks.stats.paired_t_ci`)."""
    return stats.paired_t_ci(xs, level)


def judge(items: Sequence[Item], ran: Mapping[str, bool] | None = None) -> tuple[Verdict, dict, dict]:
    """``(verdict, numbers, items)`` of the rule above. ``numbers`` per item: mean, 95% interval,
    margin, the two p-values; ``items`` per item: ``<name>_supports`` / ``<name>_against`` (after
    Holm), plus the ``ran`` items as given."""
    if not items:
        raise ValueError("judge needs at least one item")
    names = [i.name for i in items]
    if len(set(names)) != len(names):
        raise ValueError(f"item names repeat: {names}")
    n = {len(i.diffs) for i in items}
    if len(n) != 1:
        raise ValueError(f"items are paired per seed and need the same number of seeds, got {sorted(n)}")
    p_sup = [one_sided_p(i.diffs, 0.0, greater=True) for i in items]
    p_ag = [one_sided_p(i.diffs, -i.margin, greater=False) for i in items]
    sup, ag = holm(p_sup), holm(p_ag)
    nums: dict[str, float] = {}
    out: dict[str, bool] = {}
    for it, ps, pa, s, a in zip(items, p_sup, p_ag, sup, ag):
        m, lo, hi = t_interval(it.diffs)
        nums.update({it.name: m, f"{it.name}_lo": lo, f"{it.name}_hi": hi, f"{it.name}_margin": it.margin})
        nums.update({f"{it.name}_p_supports": ps, f"{it.name}_p_against": pa})
        out[f"{it.name}_supports"] = s
        out[f"{it.name}_against"] = a
    nums["seeds"] = len(items[0].diffs)
    ran = dict(ran or {})
    out.update(ran)
    if not all(ran.values()):
        return Verdict.INCONCLUSIVE, nums, out
    if all(sup):
        return Verdict.VERIFIED, nums, out
    if any(sup):
        return Verdict.PARTLY, nums, out
    return (Verdict.REFUTED if any(ag) else Verdict.INCONCLUSIVE), nums, out


def prefix_verdicts(items: Sequence[Item], ns: Sequence[int] = (3, 5)) -> dict[str, str]:
    """The verdict the same rule gives on the first ``n`` seeds of the run, for each ``n`` (the
    sample sizes of earlier runs: a verdict that depends on the seed count shows it)."""
    out = {}
    total = len(items[0].diffs) if items else 0
    for k in ns:
        if 2 <= k < total:
            v, _, _ = judge([Item(i.name, i.diffs[:k], i.margin) for i in items])
            out[f"verdict_at_{k}_seeds"] = v.value
    return out


def describe(items: Sequence[Item], nums: Mapping[str, float], flags: Mapping[str, bool], digits: int = 3) -> str:
    """One line per item: ``name +0.012 [-0.003, +0.027] (margin 0.02): supports|against|neither``."""
    parts = []
    for it in items:
        state = (
            "supports"
            if flags[f"{it.name}_supports"]
            else ("against" if flags[f"{it.name}_against"] else "not significant")
        )
        parts.append(
            f"{it.name} {nums[it.name]:+.{digits}f} [{nums[f'{it.name}_lo']:+.{digits}f}, "
            f"{nums[f'{it.name}_hi']:+.{digits}f}] (margin {it.margin:g}): {state}"
        )
    return "; ".join(parts)


def rule_text(unit: str = "per-seed") -> str:
    """The rule of :func:`judge` in words, for a check's summary; ``unit`` names the paired unit
    (``per-seed``; the real-model Stage-1 check pairs ``per-prompt`` means)."""
    return (
        f"rule: {unit} paired differences (positive = the paper's direction); an item supports if a one-sided "
        f"t-test rejects mean <= 0, goes against if it rejects mean >= -margin, each family Holm-corrected at {ALPHA:g}; "
        "all support verified, some partly, none and one against refuted, else inconclusive; inconclusive if a run "
        "did not train"
    )


RULE_TEXT = rule_text()


@dataclass
class RunLog:
    """The "it ran" evidence of a check: for every training run, whether its loss moved, its weights
    moved and its accuracy left the warm-up value (exact accuracies: any real update moves them)."""

    loss_moved: list[bool] = field(default_factory=list)
    params_moved: list[bool] = field(default_factory=list)
    acc_moved: list[bool] = field(default_factory=list)

    def add(self, trace, acc_before: float | None = None, acc_after: float | None = None) -> None:
        """Record one run: ``trace`` from :func:`tiltlab.llm.checks.task.train_online` (or the offline
        trainer); the accuracies before and after (None: the run has no accuracy to move)."""
        self.loss_moved.append(trace.loss_moved)
        self.params_moved.append(trace.param_change > 0.0)
        if acc_before is not None and acc_after is not None:
            if not (math.isfinite(acc_before) and math.isfinite(acc_after)):
                raise ValueError(f"non-finite accuracy {acc_before} -> {acc_after}: a NaN run has no verdict")
            self.acc_moved.append(abs(acc_after - acc_before) > 1e-9)

    def items(self) -> dict[str, bool]:
        if not self.loss_moved:
            raise ValueError("no training run was recorded")
        out = {"ran_loss_moved": all(self.loss_moved), "ran_weights_moved": all(self.params_moved)}
        if self.acc_moved:
            out["ran_accuracy_moved"] = all(self.acc_moved)
        return out

    def numbers(self) -> dict[str, float]:
        return {
            "runs": len(self.loss_moved),
            "runs_loss_moved": sum(self.loss_moved),
            "runs_weights_moved": sum(self.params_moved),
            "runs_accuracy_moved": sum(self.acc_moved),
        }
