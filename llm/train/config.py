"""Loading a run config for training: :func:`tiltlab.llm.base.run_config.read_run_config` plus the
checks against the trainer configs and the Stage-1/2 config dataclasses (no model is loaded).

The schema itself (:class:`RunConfig`, :data:`SECTION_KEYS`, ``--set`` overrides) lives in
:mod:`tiltlab.llm.base.run_config`, re-exported here as the public place to load a run config from.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tiltlab.llm.base.run_config import (
    SECTION_KEYS,
    RunConfig,
    apply_overrides,
    read_run_config,
)
from tiltlab.llm.disa.stage1 import Stage1Config
from tiltlab.llm.disa.stage2.config import Stage2Config

__all__ = [
    "SECTION_KEYS",
    "RunConfig",
    "apply_overrides",
    "load_run_config",
    "validate_run_config",
]


def validate_run_config(cfg: RunConfig) -> None:
    """Check ``trl`` and the objective sections against the trainer config's fields, and the
    ``stage1`` / ``stage2`` sections against :class:`~tiltlab.llm.disa.stage1.Stage1Config` /
    :class:`~tiltlab.llm.disa.stage2.config.Stage2Config`."""
    if cfg.kind == "online":
        from tiltlab.llm.train.online import TiltGRPOConfig as cls
    else:
        from tiltlab.llm.train.offline import OfflineConfig as cls
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(cfg.trainer_kwargs()) - names)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} fields in trl/sections: {unknown}")
    if cfg.stage1:
        bad = sorted(set(cfg.stage1) - {f.name for f in dataclasses.fields(Stage1Config)})
        if bad:
            raise ValueError(f"stage1: unknown Stage1Config fields {bad}")
    if cfg.stage2:
        bad = sorted(set(cfg.stage2) - {f.name for f in dataclasses.fields(Stage2Config)})
        if bad:
            raise ValueError(f"stage2: unknown Stage2Config fields {bad}")


def load_run_config(path: str | Path, overrides: list[str] | None = None, validate: bool = True) -> RunConfig:
    """Read a YAML run config, apply ``--set`` overrides and (``validate``) check it."""
    cfg = read_run_config(path, overrides)
    if validate:
        validate_run_config(cfg)
    return cfg
