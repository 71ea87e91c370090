"""Monkeypatching a function that other modules import by name at their top.

``from tiltlab.llm.base.models import load_model`` binds ``load_model`` in the importing module, so
patching ``models.load_model`` alone does not reach that module's calls. :func:`patch_everywhere` patches the
attribute on its own module and on every loaded tiltlab module that holds the same object.
"""

from __future__ import annotations

import sys
from types import ModuleType


def patch_everywhere(monkeypatch, module: ModuleType, name: str, value) -> list[str]:
    """Set ``module.name = value`` and the same name wherever a loaded ``tiltlab`` module bound the
    original object; undone at the test's end. Returns the names of the modules patched."""
    original = getattr(module, name)
    patched = []
    for mod_name, mod in list(sys.modules.items()):
        if not mod_name.startswith("tiltlab") or mod is None:
            continue
        if mod is module or vars(mod).get(name) is original:
            monkeypatch.setattr(mod, name, value)
            patched.append(mod_name)
    if module.__name__ not in patched:
        monkeypatch.setattr(module, name, value)
        patched.append(module.__name__)
    return patched
