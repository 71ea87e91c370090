"""Config dataclass from command-line flags and a run config's section: the ``--config`` /
``--set`` plumbing of ``tiltlab llm stage1|stage2|eval``.

The flags themselves come from :func:`tiltlab.dataclass_cli.add_dataclass_args` (one flag per
field, ``--config FILE`` and ``--set KEY=VALUE`` with ``config_section``). Precedence: dataclass
default < config file section < ``--set`` < explicit flags. Import-light (standard library; the
YAML reader is imported when a ``--config`` is given).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from tiltlab.dataclass_cli import check_field_values, unknown_keys_message
from tiltlab.hints import hint
from tiltlab.llm.base.run_config import read_run_config

__all__ = ["config_from_args", "config_section_values", "read_config"]


def _yaml_problem(exc: Exception) -> str:
    """A YAML parse error as one phrase: "expected ',' or ']', but got ':' at line 2, column 6"."""
    problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
    mark = getattr(exc, "problem_mark", None)
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem


def read_config(path, overrides=(), loader=None):
    """``loader(path, overrides)`` (default :func:`tiltlab.llm.base.run_config.read_run_config`) with
    one-line errors for the user's mistakes: a config file that does not exist, a file or a
    ``--set`` value that is not valid YAML (``FileNotFoundError`` / ``ValueError``)."""

    import yaml

    if loader is None:
        loader = read_run_config
    p = Path(path)
    if not p.is_file():
        what = "is a directory" if p.is_dir() else "does not exist"
        raise FileNotFoundError(f"config {str(p)!r} {what}; {hint('config_file')}")
    try:
        yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ValueError(f"{p}: not valid YAML: {_yaml_problem(exc)}; fix the file") from None
    for item in overrides:
        _, sep, raw = str(item).partition("=")
        if not sep:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        try:
            yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise ValueError(f"--set {item}: the value is not valid YAML ({_yaml_problem(exc)})") from None
    return loader(p, list(overrides))


def config_section_values(args: argparse.Namespace, section: str) -> tuple[dict, Any]:
    """The ``section`` mapping of ``args.config`` with ``args.overrides`` applied, and the whole
    :class:`~tiltlab.llm.base.run_config.RunConfig` (``({}, None)`` without ``--config``)."""
    path = getattr(args, "config", None)
    overrides = list(getattr(args, "overrides", []) or [])
    if path is None:
        if overrides:
            raise ValueError("--set needs --config")
        return {}, None
    rc = read_config(path, overrides)
    values = getattr(rc, section, None)
    if values is None:
        raise ValueError(f"{path}: no `{section}:` section")
    return dict(values), rc


def _origin(args: argparse.Namespace, section: str, keys: list[str]) -> str:
    """Where the first of ``section``'s ``keys`` came from: ``--set stage2.epohcs=3`` or the config file."""
    for item in getattr(args, "overrides", None) or []:
        key = str(item).partition("=")[0].strip()
        if key in {f"{section}.{k}" for k in keys}:
            return f"--set {item}"
    return str(getattr(args, "config", ""))


def config_from_args(cls, args: argparse.Namespace, section: str | None = None, translate=None, **overrides):
    """Build ``cls`` from (config section) + (flags present in ``args``) + ``overrides``.

    ``translate(values, run_config) -> values`` maps a config section onto ``cls``'s field names
    (e.g. eval's ``benchmarks`` -> ``datasets``).
    """
    names = {f.name for f in dataclasses.fields(cls)}
    kw: dict[str, Any] = {}
    if section is not None:
        values, rc = config_section_values(args, section)
        if translate is not None and rc is not None:
            values = translate(values, rc)
        unknown = sorted(set(values) - names)
        if unknown:
            where = f"`{section}:` ({cls.__name__})"
            raise ValueError(f"{_origin(args, section, unknown)}: {unknown_keys_message(unknown, names, where)}")
        kw.update(check_field_values(cls, values, prefix=f"{section}."))
    kw.update({n: getattr(args, n) for n in names if hasattr(args, n)})
    kw.update(overrides)
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.name not in kw and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        flags = ", ".join("--" + m.replace("_", "-") for m in missing)
        raise ValueError(f"missing required value(s) {flags} ({hint('flags_or_config')})")
    return cls(**kw)
