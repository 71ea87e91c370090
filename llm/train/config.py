"""Loading a run config for training: :func:`tiltlab.llm.base.run_config.read_run_config` plus the
checks against the trainer configs and the Stage-1/2 config dataclasses (no model is loaded).

The schema itself (:class:`RunConfig`, :data:`SECTION_KEYS`, ``--set`` overrides) lives in
:mod:`tiltlab.llm.base.run_config`, re-exported here as the public place to load a run config from.
"""

from __future__ import annotations

from pathlib import Path

from tiltlab.llm.base.run_config import (
    SECTION_KEYS,
    RunConfig,
    apply_overrides,
    read_run_config,
)
from tiltlab.llm.train.precheck import check_trainer_sections

__all__ = [
    "SECTION_KEYS",
    "RunConfig",
    "apply_overrides",
    "load_run_config",
    "validate_run_config",
]


def validate_run_config(cfg: RunConfig, overrides=()) -> None:
    """Check ``trl`` and the objective sections against the trainer config's fields (names with their close
    match, value types), and the ``stage1`` / ``stage2`` sections against
    :class:`~tiltlab.llm.disa.stage1.Stage1Config` / :class:`~tiltlab.llm.disa.stage2.config.Stage2Config`
    (:func:`tiltlab.llm.train.precheck.check_trainer_sections`: no torch / TRL is imported)."""
    check_trainer_sections(cfg, overrides)


def load_run_config(path: str | Path, overrides: list[str] | None = None, validate: bool = True) -> RunConfig:
    """Read a YAML run config, apply ``--set`` overrides and (``validate``) check it."""
    cfg = read_run_config(path, overrides)
    if validate:
        validate_run_config(cfg, overrides or ())
    return cfg
