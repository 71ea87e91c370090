"""tiltlab.objectives — the one home of all loss and estimator math.

Pure torch functions of log-prob tensors; the simulator (``sim``) and the LLM layer (``llm``)
import them unchanged. Conventions:

- tokens ``[B, T]`` with a float ``mask``; a sequence log-prob is the masked sum
  (:func:`objectives.tb.sequence_logprob`); groups ``[P, G]`` are group-major (``B = P * G``);
- ``beta`` always *multiplies* the reward (DISA's convention); PACED's ``exp(r / beta)`` is
  exposed as ``kl_coef``;
- every docstring carries its formula and source (paper short name + equation / section;
  the notation is ``docs/math.md``'s).

Modules: :mod:`~objectives.estimators` (Stage-1 log Z), :mod:`~objectives.tb` (TB / DISA /
FlowRL / VarGrad), :mod:`~objectives.lad`, :mod:`~objectives.pg` (GRPO, GSPO, PPO+KL),
:mod:`~objectives.offline` (Off-RL, FPA, DPO, RPO, KTO, SimPER, A*-PO, SFT),
:mod:`~objectives.paced`, :mod:`~objectives.regressor` (Stage 2), :mod:`~objectives.metrics`,
:mod:`~objectives.fused` (memory-lean chunked log-probs), :mod:`~objectives.output` (:class:`LossOutput`,
what every ``*_loss`` returns).

Only torch is imported: no LLM library is loaded by ``import objectives``; and the package itself
imports its modules lazily (on first attribute access), so :mod:`~objectives.catalog` (the
declaration of every objective, no torch) is read by config checks and ``--help`` without loading
torch (measured here: the loss modules with torch import in 1.7 s; the run-config and simulator-config
modules, which read the catalog, in 0.1 s).
"""

from __future__ import annotations

import importlib
from typing import Any

if __name__ != "tiltlab.objectives":  # imported by its bare folder name (the repo root is on sys.path)
    raise ImportError(f"import this package as tiltlab.objectives, not as {__name__!r}")

__all__ = [
    "LossOutput",
    "catalog",
    "estimators",
    "lad",
    "metrics",
    "offline",
    "output",
    "paced",
    "pg",
    "regressor",
    "tb",
]


def __getattr__(name: str) -> Any:
    """The submodule ``name`` (or :class:`~objectives.output.LossOutput`), imported on first access."""
    if name == "LossOutput":
        return importlib.import_module("tiltlab.objectives.output").LossOutput
    if name in __all__:
        return importlib.import_module(f"tiltlab.objectives.{name}")
    raise AttributeError(f"module 'tiltlab.objectives' has no attribute {name!r}")
