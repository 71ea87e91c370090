"""The catalog of check layers: the one module that knows where checks live.

Each layer registers its checks with :func:`tiltlab.claims.registry.register_check` when its check
module is imported. :func:`discover` loads the claims and imports those modules, statically, so
import-linter sees every dependency:

- ``tiltlab.theory.checks`` (sympy), ``tiltlab.sim.checks`` (the exact simulator) and
  :mod:`tiltlab.paper_checks.data_checks` (the papers' own numbers): part of every install, so a
  failure to import one is an error, raised;
- ``tiltlab.llm.checks``: needs the ``[llm]`` extra (transformers, TRL); when it cannot be imported
  the reason is kept in :data:`SKIPPED_MODULES`, the CLI prints it, and the llm rows of a run come
  from the shipped record.

Then it marks the registry complete (:func:`tiltlab.claims.registry.mark_catalogued`), which the
record's functions that need every check require.
"""

from __future__ import annotations

from collections.abc import Callable

from tiltlab.claims import registry
from tiltlab.claims.registry import Check, Outcome

__all__ = ["LLM_CHECKS", "SKIPPED_MODULES", "check_modules", "discover", "run_checks"]

#: The name under which the optional llm layer is reported when it is skipped.
LLM_CHECKS = "tiltlab.llm.checks"

#: Check modules that could not be imported (module -> reason); only the llm layer can be skipped.
SKIPPED_MODULES: dict[str, str] = {}

_LOADED: list[str] = []


def _import_layers() -> list[str]:
    """Import every check module (each registers its checks once, at its first import); the names
    of those that loaded."""
    from tiltlab.paper_checks import data_checks
    from tiltlab.sim import checks as sim_checks
    from tiltlab.theory import checks as theory_checks

    loaded = [theory_checks.__name__, sim_checks.__name__, data_checks.__name__]
    try:
        from tiltlab.llm import checks as llm_checks
    except ImportError as exc:  # the [llm] extra is not installed (or is broken): say so, run the rest
        SKIPPED_MODULES[LLM_CHECKS] = f"not importable: {exc}"
    else:
        SKIPPED_MODULES.pop(LLM_CHECKS, None)
        loaded.append(llm_checks.__name__)
    return loaded


def discover() -> None:
    """Load the claims and papers and register every layer's checks; idempotent."""
    registry.load_claims()
    _LOADED[:] = _import_layers()
    registry.mark_catalogued()


def check_modules() -> list[str]:
    """The check modules of the last :func:`discover`, loaded or skipped, in layer order."""
    return [*_LOADED, *(m for m in SKIPPED_MODULES if m not in _LOADED)]


def run_checks(
    prefix: str | None = None,
    *,
    layer: str | None = None,
    seed: int = 0,
    include_slow: bool = False,
    include_llm: bool | None = None,
    progress: Callable[[Check], None] | None = None,
) -> list[Outcome]:
    """Discover, then run the selected checks in this process (``tiltlab check`` runs them in a pool)."""
    discover()
    registry.validate()
    outs = []
    for chk in registry.select(prefix, layer, include_slow, include_llm):
        if progress is not None:
            progress(chk)
        outs.append(registry.run_one(chk, seed))
    return outs
