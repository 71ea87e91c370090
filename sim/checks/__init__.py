"""Numeric claim checks of the simulator layer (``layer="sim"``).

Importing this package registers every check of its submodules with ``tiltlab.claims.registry``:
``training`` (checks through the trainers), ``estimators`` (DISA Stage-1 estimator and bias checks),
``fpa`` (FPA checks), ``mechanisms`` (toy mechanisms of text and figure claims), ``paced_sched`` (PACED-RL selection and replay) and ``text_claims`` (claims
from the papers' text: remarks, section statements, figure readings). The numbers a check judges
come from ``tiltlab.sim.experiments``, which the figures read too.
"""

from __future__ import annotations

from tiltlab.sim.checks import estimators, fpa, mechanisms, paced_sched, text_claims, training

__all__ = ["estimators", "fpa", "mechanisms", "paced_sched", "text_claims", "training"]
