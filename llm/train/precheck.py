"""The checks of a run config that need no torch / TRL / vLLM, run by ``tiltlab llm train`` (and its
``--dry-run``) before those load: a mistyped key or value fails in well under a second, with its close
match, rather than after the imports.

:func:`check_trainer_sections` checks the ``trl:`` keys and the objective sections' values against the
trainer config's fields (:func:`tiltlab.llm.train.trl_fields.trainer_fields`: names, annotations,
defaults) and the ``stage1:`` / ``stage2:`` sections against their config dataclasses;
:func:`precheck` adds the rules of the trainer config (:func:`tiltlab.llm.train.online_rules.check_options`,
the same function ``TiltGRPOConfig.__post_init__`` runs, on a namespace of the fields' defaults updated
with the config's values), the ``validation:`` and ``lora:`` sections, the reward name, and DISA's label
check against the Stage-1 manifest in ``disa.stage1_dir`` (:func:`check_labels`, as the trainer runs it).
What needs TRL's own checks (batch divisibility ...) or the data is left to the trainer config and the
trainer (``--dry-run`` builds the first). Import-light.
"""

from __future__ import annotations

import dataclasses
import os
from types import SimpleNamespace
from typing import Any

from tiltlab.dataclass_cli import check_values, did_you_mean, unknown_keys_message
from tiltlab.llm.base.rewards import resolve_reward
from tiltlab.llm.base.run_config import SECTION_KEYS, RunConfig
from tiltlab.llm.disa.labels import check_label_compat
from tiltlab.llm.disa.stage1 import Stage1Config, read_manifest
from tiltlab.llm.disa.stage2.config import Stage2Config
from tiltlab.objectives.catalog import names

from .online_rules import check_options, loss_types, reward_transform_spec
from .trl_fields import CLASSES, trainer_fields

__all__ = [
    "VALIDATION_METRICS",
    "check_labels",
    "check_lora",
    "check_loss_type_name",
    "check_trainer_sections",
    "check_validation",
    "needs_frozen_log_z",
    "precheck",
    "trainer_namespace",
]

VALIDATION_METRICS = ("reward", "accuracy")
"""The online ``validation.metric`` values (held-out mean reward / accuracy over ``k`` samples)."""


def _origin(overrides, section: str, keys) -> str:
    """``--set trl.lerning_rate=1`` when the first of ``section``'s ``keys`` came from a ``--set``, else ''."""
    for item in overrides or ():
        key = str(item).partition("=")[0].strip()
        if key in {f"{section}.{k}" for k in keys}:
            return f"--set {item}: "
    return ""


def check_trainer_sections(cfg: RunConfig, overrides=()) -> None:
    """Every ``trl:`` key a field of the trainer config (a close match named), every value of ``trl:`` and of
    the objective sections of the field's type where the annotation says it (``trl.learning_rate: abc``
    fails), and ``stage1:`` / ``stage2:`` keys fields of :class:`Stage1Config` / :class:`Stage2Config`."""
    fields = trainer_fields(cfg.kind)
    cls = CLASSES[cfg.kind][1]
    unknown = sorted(set(cfg.trl) - set(fields))
    if unknown:
        where = f"`trl:` ({cls} fields)"
        raise ValueError(
            _origin(overrides, "trl", unknown) + unknown_keys_message(unknown, fields, where, list_valid=False)
        )
    types = {k: ann for k, (ann, _) in fields.items()}
    check_values(types, cfg.trl, prefix="trl.")
    for sec, keys in SECTION_KEYS.items():
        values = {k: v for k, v in getattr(cfg, sec).items() if keys.get(k) in types}
        check_values({k: types[keys[k]] for k in values}, values, prefix=f"{sec}.")
    other = sorted(set(cfg.trainer_kwargs()) - set(fields))
    if other:  # a section key mapped onto a field the trainer config lacks: a schema error of tiltlab's
        raise ValueError(f"unknown {cls} fields in the objective sections: {other}")
    for sec, dc in (("stage1", Stage1Config), ("stage2", Stage2Config)):
        valid = {f.name for f in dataclasses.fields(dc)}
        bad = sorted(set(getattr(cfg, sec)) - valid)
        if bad:
            raise ValueError(
                _origin(overrides, sec, bad) + unknown_keys_message(bad, valid, f"`{sec}:` ({dc.__name__})")
            )


def check_loss_type_name(objective: str, loss_type) -> None:
    """A mistyped ``trl.loss_type`` named with its close match among the loss types ``objective``
    implements and the objectives that are TRL loss types of their own (``loss_type="cispo"`` is
    ``objective: cispo``). Any other value is left to :func:`~tiltlab.llm.train.online_rules.check_options`,
    which refuses it in its own words."""
    types = loss_types(objective)
    own = names(tag="trl_loss_type")
    if loss_type is None or loss_type in types or loss_type in own:
        return
    close = did_you_mean(str(loss_type), [*types, *own])
    if close:
        raise ValueError(
            f"trl.loss_type={loss_type!r}{close}: objective={objective!r} implements loss_type in "
            f"{types or '(none: leave it unset)'}"
        )


def trainer_namespace(cfg: RunConfig, kw: dict | None = None) -> SimpleNamespace:
    """The online trainer config's fields at their defaults, updated with the run's trainer kwargs and checked
    by :func:`~tiltlab.llm.train.online_rules.check_options` (which resolves the per-objective defaults:
    ``reward_transform``, ``logprob_scale``, ``loss_type``): what ``TiltGRPOConfig`` holds after its
    ``__post_init__`` for every field the tiltlab rules read."""
    kw = dict(cfg.trainer_kwargs() if kw is None else kw)
    check_loss_type_name(cfg.objective, kw.get("loss_type"))
    ns = SimpleNamespace(**{k: default for k, (_, default) in trainer_fields("online").items()})
    for k, v in kw.items():
        setattr(ns, k, v)
    check_options(ns)
    return ns


def needs_frozen_log_z(cfg: RunConfig, args: Any) -> bool:
    """The run reads DISA's frozen log Z: objective ``disa``, or ``paced`` selecting from it."""
    return cfg.objective == "disa" or (cfg.objective == "paced" and args.paced_select_from == "disa")


def check_labels(cfg: RunConfig, args: Any, notes: list[str] | None = None) -> None:
    """DISA's label check (:func:`~tiltlab.llm.disa.labels.check_label_compat`, as the trainer runs it) against
    the Stage-1 manifest in ``disa.stage1_dir`` when it is on this machine: a tilt, reward transform or log-prob
    scale the labels were not made with fails here as it fails the run (one line). ``args``: the trainer config
    or :func:`trainer_namespace`. A ``stage1_dir`` without a manifest yet is noted in ``notes``."""
    s1 = cfg.disa.get("stage1_dir")
    if not needs_frozen_log_z(cfg, args) or not s1:
        return
    if not os.path.exists(os.path.join(str(s1), "manifest.json")):
        if notes is not None and os.path.exists(str(s1)):
            notes.append(f"disa.stage1_dir {str(s1)!r} has no manifest.json yet: the label check runs when it does")
        return
    check_label_compat(
        read_manifest(s1),
        tilt_beta=args.tilt_beta,
        reward_transform=reward_transform_spec(args),
        logprob_scale=args.logprob_scale,
        chat_template=True,  # build_trainer's online_dataset renders chat turns
        allow_mismatch=args.disa_allow_label_mismatch,
        reason=args.disa_mismatch_reason,
    )


def check_validation(cfg: RunConfig) -> None:
    """The ``validation:`` section's own rules (the rows it names are read by the run)."""
    v = dict(cfg.validation)
    if not v:
        return
    if cfg.kind != "online":
        if "dataset" not in v:
            raise ValueError(
                "validation for offline runs needs validation.dataset (held-out prompts, e.g. the .val file "
                "`tiltlab llm prepare fpa` writes); holdout_fraction would split one prompt's samples"
            )
        if v.get("metric", "loss") != "loss":
            raise ValueError(
                f"validation.metric for offline runs is 'loss' (the objective on held-out rows), got {v['metric']!r}; "
                "select on accuracy by evaluating the saved checkpoints with `tiltlab llm eval`"
            )
    elif ("dataset" in v) == ("holdout_fraction" in v):
        raise ValueError("validation: give exactly one of dataset (a path) or holdout_fraction (of the training rows)")
    every = v.get("every_steps")
    if not (isinstance(every, int) and not isinstance(every, bool) and every > 0):
        raise ValueError(f"validation.every_steps must be a positive integer, got {every!r}")
    if cfg.kind == "online":
        metric = v.get("metric", "reward")
        if metric not in VALIDATION_METRICS:
            raise ValueError(
                f"validation.metric must be one of {VALIDATION_METRICS}, got {metric!r}"
                f"{did_you_mean(str(metric), VALIDATION_METRICS)}"
            )
        if "holdout_fraction" in v and not 0.0 < float(v["holdout_fraction"]) < 1.0:
            raise ValueError(f"validation.holdout_fraction must lie in (0, 1), got {v['holdout_fraction']}")


LORA_DEFAULTS = {"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": "all-linear"}


def check_lora(cfg: RunConfig) -> dict:
    """The ``lora:`` section with its defaults (:data:`LORA_DEFAULTS`), checked: a positive integer rank, a
    positive alpha, a dropout in [0, 1)."""
    lo = {**LORA_DEFAULTS, **cfg.lora}
    if not (isinstance(lo["r"], int) and lo["r"] > 0) or not float(lo["alpha"]) > 0:
        raise ValueError(
            f"lora.r must be a positive integer and lora.alpha > 0, got r={lo['r']!r}, alpha={lo['alpha']!r}"
        )
    if not 0.0 <= float(lo["dropout"]) < 1.0:
        raise ValueError(f"lora.dropout must lie in [0, 1), got {lo['dropout']!r}")
    return lo


def precheck(cfg: RunConfig, overrides=(), notes: list[str] | None = None) -> SimpleNamespace | None:
    """Every check of a run config that needs neither torch / TRL / vLLM nor the data (module docstring), in
    the order a run meets them; a one-line ``ValueError`` on the first that fails. Returns the online trainer
    config's checked fields (:func:`trainer_namespace`; None offline or for ``objective: none``)."""
    check_trainer_sections(cfg, overrides)
    if cfg.objective == "none":
        return None
    if not cfg.dataset:
        raise ValueError("the config names no dataset")
    check_validation(cfg)
    if cfg.lora:
        check_lora(cfg)
    if cfg.kind != "online":
        return None
    args = trainer_namespace(cfg)
    if isinstance(cfg.reward, str) and ":" not in cfg.reward:  # a module's reward is imported by the run
        resolve_reward(cfg.reward)
    check_labels(cfg, args, notes)
    return args
