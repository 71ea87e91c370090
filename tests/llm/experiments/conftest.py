"""Fixtures shared by the llm check tests."""

from __future__ import annotations

import pytest

from tiltlab.llm.experiments import warmup


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny model warmed up for 3 steps (seed 0) and its task, with a cache of the module's own:
    enough to run every check's machinery, not to decide anything."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TILTLAB_CACHE", str(tmp_path_factory.mktemp("cache")))
    mp.setattr(warmup, "WARM_STEPS", 3)
    model, task = warmup.warm_reference(0)
    yield model, task
    mp.undo()
