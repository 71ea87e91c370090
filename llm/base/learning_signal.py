"""Guards against vacuous runs: the conditions under which Stage 1, Stage 2 or training cannot learn.

A run on a task the model never (or always) solves produces well-formed outputs that mean nothing:
every reward 0, every Stage-1 label ``log Z_hat = beta r~`` the same, ESS = M, Stage 2's R^2 NaN,
DISA regressing onto constant labels, and FlowRL/GRPO steps whose loss and gradient are exactly 0
(the weights stay bit-identical to the base model). Each function below tests one such condition
and returns a :class:`SignalFinding` (or ``None`` when the condition does not hold); :func:`report`
warns about each finding in one line (:class:`VacuousRunWarning`) and returns the records the
callers store (Stage 1: ``manifest.json["signal"]``; Stage 2: ``regressor.json["signal"]``;
training: ``<output_dir>/signal.json``, :mod:`tiltlab.llm.train.signal_guard`).

The conditions, precisely:

* ``equal_rewards``: every reward of a batch (training: one generation batch, gathered over
  processes) or of a whole dataset (Stage 1: all ``P x M`` samples) is the same float. Exact
  equality: verifier rewards are discrete, and an affine transform ``a r + c`` (``a > 0``) keeps
  equality. One differing reward is signal and does not warn.
* ``ess_uniform`` (Stage 1, ``M > 1``): on every prompt with a finite ESS,
  ``ESS >= (1 - ESS_UNIFORM_RTOL) M``. For small spreads ``1 - ESS/M ~ Var(w)/E[w]^2 ~ Var(log w)``,
  so the threshold ``1e-6`` means a standard deviation of the log-weights below ~1e-3 on every
  prompt: each prompt's M weights are (numerically) equal, which with ``q = pi_ref`` means no prompt
  saw two different rewards among its samples.
* ``ess_collapsed`` (Stage 1, ``M > 1``): on every prompt with a finite ESS,
  ``ESS <= ESS_COLLAPSED_MAX`` (1.05): one sample carries about 97.5% or more of each prompt's
  normalized weight, so every label is a one-sample estimate (``ESS ~ 1 + 2 delta`` when the other
  samples share mass ``delta``). With ``M == 1`` ESS is 1 = M by construction and neither ESS
  condition is tested.
* ``constant_targets`` (Stage 2): the regression targets (the finite labels, or the validation
  split's) span at most ``CONSTANT_TARGET_ATOL`` = 1e-4 nats (``max - min``): the fit has nothing to
  explain and ``R^2 = 1 - SS_res/SS_tot`` is undefined (``SS_tot = 0``) or fits rounding noise. The
  tolerance covers the float32 rounding of the sequence log-probs inside ``log w``: with all
  rewards 0 and ``q = pi_ref`` the labels are ``log pi_ref - log q ~ 1e-6``, not exactly 0, when
  the sampler and the scorer are two float32 computations (transformers on CPU).
* ``zero_update`` (training): in one optimizer step every micro-batch loss is exactly 0 and every
  parameter gradient present is exactly 0. Parameters without a gradient (frozen, or sharded away
  by DeepSpeed ZeRO) are not looked at; when no parameter has one the condition is not decided.

Import-light: standard library only (gradients are tested through their own methods).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "CONSTANT_TARGET_ATOL",
    "ESS_COLLAPSED_MAX",
    "ESS_UNIFORM_RTOL",
    "SELECT_HINT",
    "SignalFinding",
    "VacuousRunWarning",
    "constant_targets",
    "degenerate_ess",
    "equal_rewards",
    "grads_all_zero",
    "over_run",
    "report",
    "zero_update",
]

ESS_UNIFORM_RTOL = 1e-6
"""``ess_uniform`` holds when ``ESS >= (1 - ESS_UNIFORM_RTOL) * M`` on every prompt."""
CONSTANT_TARGET_ATOL = 1e-4
"""``constant_targets`` holds when the targets' ``max - min <= CONSTANT_TARGET_ATOL`` (nats)."""
ESS_COLLAPSED_MAX = 1.05
"""``ess_collapsed`` holds when ``ESS <= ESS_COLLAPSED_MAX`` on every prompt."""
SELECT_HINT = "select prompts with a Stage-1 pass rate strictly between 0 and 1 (`tiltlab llm prepare select`)"
"""What to do about a task without signal (the command filters prompts by their Stage-1 pass rate)."""


class VacuousRunWarning(RuntimeWarning):
    """A run that cannot learn: no reward signal, degenerate importance weights, nothing to fit, or
    an optimizer step that changes nothing. ``python -W error::tiltlab.llm.base.learning_signal.VacuousRunWarning``
    turns it into an error."""


@dataclass(frozen=True)
class SignalFinding:
    """One observed condition: ``kind`` (see the module docstring), the ``stage`` that saw it
    (``stage1`` / ``stage2`` / ``train``), the one-line ``message`` (what was observed and what to
    do) and the ``observed`` numbers behind it."""

    kind: str
    stage: str
    message: str
    observed: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _floats(values: Iterable[Any]) -> list[float]:
    return [float(v) for v in values]


def equal_rewards(rewards: Iterable[Any], *, stage: str, scope: str) -> SignalFinding | None:
    """All ``rewards`` (floats) equal: no signal. ``scope`` names the set in the message
    (e.g. ``"dataset (64 prompts x 8 samples)"``, ``"generation batch of step 3"``)."""
    r = _floats(rewards)
    if not r or any(x != r[0] for x in r):
        return None
    return SignalFinding(
        "equal_rewards",
        stage,
        f"{stage}: all {len(r)} rewards of the {scope} equal {r[0]:g}: no learning signal (constant labels, "
        f"zero advantages, zero TB residual gradients); {SELECT_HINT}, or use an easier task / more new tokens",
        {"n": len(r), "value": r[0], "scope": scope},
    )


def degenerate_ess(ess: Iterable[Any], M: int, *, stage: str = "stage1") -> SignalFinding | None:
    """ESS equal to M on every prompt (``ess_uniform``) or close to 1 on every prompt
    (``ess_collapsed``); prompts with a non-finite ESS are left out; ``None`` for ``M == 1``."""
    if M < 1:
        raise ValueError(f"M must be >= 1, got {M}")
    e = [x for x in _floats(ess) if math.isfinite(x)]
    if M == 1 or not e:
        return None
    lo, hi = min(e), max(e)
    if lo >= (1.0 - ESS_UNIFORM_RTOL) * M:
        return SignalFinding(
            "ess_uniform",
            stage,
            f"{stage}: ESS = M = {M} on all {len(e)} prompts (min ESS {lo:.6g}): each prompt's importance weights are "
            f"equal, so no prompt's samples differ in reward and every label is beta * its one reward; {SELECT_HINT}",
            {"n_prompts": len(e), "M": M, "min_ess": lo, "max_ess": hi, "rtol": ESS_UNIFORM_RTOL},
        )
    if hi <= ESS_COLLAPSED_MAX:
        return SignalFinding(
            "ess_collapsed",
            stage,
            f"{stage}: ESS <= {ESS_COLLAPSED_MAX} on all {len(e)} prompts (max ESS {hi:.4g} of M = {M}): one sample "
            "carries each prompt's label; bring the proposal closer to pi_ref (the same model at T = 1), lower "
            "beta, or raise M",
            {"n_prompts": len(e), "M": M, "min_ess": lo, "max_ess": hi, "threshold": ESS_COLLAPSED_MAX},
        )
    return None


def constant_targets(values: Iterable[Any], *, stage: str = "stage2", what: str = "labels") -> SignalFinding | None:
    """Regression targets within ``CONSTANT_TARGET_ATOL`` of each other (``R^2`` undefined or noise);
    fewer than two values, or a non-finite one (Stage 2 drops those first), is not tested."""
    v = _floats(values)
    if len(v) < 2 or not all(math.isfinite(x) for x in v):
        return None
    lo, hi = min(v), max(v)
    if hi - lo > CONSTANT_TARGET_ATOL:
        return None
    return SignalFinding(
        "constant_targets",
        stage,
        f"{stage}: all {len(v)} {what} lie in [{lo:.6g}, {hi:.6g}] (spread <= {CONSTANT_TARGET_ATOL:g}): the "
        f"regressor has nothing to fit and R^2 is undefined (NaN) or fits rounding noise; re-run Stage 1 on "
        f"prompts with signal: {SELECT_HINT}",
        {"n": len(v), "min": lo, "max": hi, "what": what, "atol": CONSTANT_TARGET_ATOL},
    )


def grads_all_zero(parameters: Iterable[Any]) -> bool | None:
    """``True`` when every gradient present is exactly 0, ``False`` when one is not, ``None`` when
    no parameter has a gradient (nothing to decide on)."""
    seen = False
    for p in parameters:
        g = getattr(p, "grad", None)
        if g is None:
            continue
        seen = True
        if bool((g != 0).any()):
            return False
    return True if seen else None


def zero_update(losses: Sequence[Any], grads_zero: bool | None, *, step: int, stage: str = "train"):
    """One optimizer step whose micro-batch ``losses`` are all exactly 0 and whose gradients are
    exactly 0 (``grads_zero`` from :func:`grads_all_zero`): the step changes nothing the loss sees."""
    ls = _floats(losses)
    if not ls or any(x != 0.0 for x in ls) or grads_zero is not True:
        return None
    return SignalFinding(
        "zero_update",
        stage,
        f"{stage}: step {step}: loss and gradient are exactly 0 (over {len(ls)} micro-batch(es)): the step "
        f"cannot change the policy, e.g. all rewards of its groups are equal; {SELECT_HINT}",
        {"step": step, "n_micro_batches": len(ls)},
    )


_PER_STEP = {
    "zero_update": "had loss and gradient exactly 0 (the policy did not change)",
    "equal_rewards": "had all rewards of their generation batch equal (no signal)",
}


def over_run(kind: str, steps: Iterable[int], n_total: int, what: str, *, stage: str = "train"):
    """The run-level record of a per-step condition (``zero_update`` or ``equal_rewards``):
    ``k of n_total`` ``what`` (e.g. "optimizer steps") had it; ``None`` when none had."""
    if kind not in _PER_STEP:
        raise ValueError(f"kind must be one of {sorted(_PER_STEP)}, got {kind!r}")
    s = sorted(set(steps))
    if not s:
        return None
    head = f"all {n_total} {what}" if len(s) == n_total else f"{len(s)} of the {n_total} {what}"
    return SignalFinding(
        kind,
        stage,
        f"{stage}: {head} {_PER_STEP[kind]}, first at step {s[0]}; {SELECT_HINT}",
        {"n": len(s), "n_total": n_total, "steps": s},
    )


def report(findings: Iterable[SignalFinding | None], stacklevel: int = 1) -> list[dict[str, Any]]:
    """Warn once per finding (one line, :class:`VacuousRunWarning`) and return their records
    (``[]`` when every condition was tested and none held: the record says the check ran).
    ``stacklevel`` counts from the caller of ``report`` (1: the warning points at that caller)."""
    out = []
    for f in findings:
        if f is None:
            continue
        warnings.warn(f.message, VacuousRunWarning, stacklevel=stacklevel + 1)
        out.append(f.as_dict())
    return out
