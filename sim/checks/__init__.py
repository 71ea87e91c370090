"""Numeric claim checks of the simulator layer (``layer="sim"``).

Importing this package registers every check of its submodules with ``paper_checks.registry``:
``training`` (checks through the trainers), ``estimators`` (DISA Stage-1 estimator and bias checks) and
``fpa`` (FPA checks). A submodule that does not exist yet is skipped; any other import error is raised.
"""

from __future__ import annotations

import importlib

_SUBMODULES = ("training", "estimators", "fpa", "paced_sched")

for _name in _SUBMODULES:
    try:
        importlib.import_module(f"{__name__}.{_name}")
    except ModuleNotFoundError as _exc:
        if _exc.name != f"{__name__}.{_name}":
            raise
