"""Config dataclass -> command-line flags, shared by ``tiltlab sim`` and ``tiltlab llm``.

One flag per field (``--snake-case``), the field's attribute docstring (the string literal right
after it) as its help, booleans as ``--x/--no-x``, ``list[...]`` fields as several values, ``dict``
fields as one JSON object (``--chat-template-kwargs '{"enable_thinking": false}'``); a field
without a default is a required flag. Standard library only, so ``tiltlab --help`` stays fast.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import itertools
import textwrap
from typing import Any

__all__ = ["add_dataclass_args", "field_docs"]


def field_docs(cls) -> dict[str, str]:
    """Attribute docstrings of a dataclass (the string literal right after each field)."""
    try:
        src = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    tree = ast.parse(src)
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for a, b in itertools.pairwise(body):
        if (
            isinstance(a, ast.AnnAssign)
            and isinstance(a.target, ast.Name)
            and isinstance(b, ast.Expr)
            and isinstance(b.value, ast.Constant)
            and isinstance(b.value.value, str)
        ):
            docs[a.target.id] = " ".join(b.value.value.split())
    return docs


def _field_type(tp: Any) -> tuple[type, bool]:
    """``(element type, is_list)`` for a field annotation: ``int``, ``float``, ``str``, ``bool``,
    ``list[...]`` of those, each optionally ``| None``."""
    if not isinstance(tp, str):
        tp = getattr(tp, "__name__", str(tp))
    parts = [t.strip() for t in tp.split("|") if t.strip() != "None"]
    names = {"int": int, "float": float, "str": str, "bool": bool}
    if len(parts) == 1 and parts[0] in names:
        return names[parts[0]], False
    if len(parts) == 1 and (parts[0] == "dict" or parts[0].startswith("dict[")):
        return dict, False
    if len(parts) == 1 and parts[0].startswith("list[") and parts[0][5:-1] in names:
        return names[parts[0][5:-1]], True
    raise TypeError(f"unsupported CLI field type {tp!r}")


def _json_object(text: str) -> dict:
    """A ``dict`` field's flag value: a JSON object."""
    import json

    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not a JSON object ({e}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object such as '{{\"key\": 1}}', got {text!r}")
    return value


def add_dataclass_args(
    parser: argparse.ArgumentParser, cls, skip: tuple[str, ...] = (), config_section: str | None = None
) -> None:
    """One flag per dataclass field; help = the field's docstring; lists take several values.

    With ``config_section`` the command also takes ``--config FILE`` (a run config of ``configs/``,
    schema :class:`tiltlab.llm.trainers.config.RunConfig`) whose ``<config_section>:`` mapping supplies the
    fields, and ``--set KEY=VALUE`` overrides (dotted, e.g. ``stage1.M=16``). Precedence: dataclass
    default < config file < ``--set`` < explicit flags. Flags are then not argparse-required: a field
    without a default must come from one of the three sources (checked in :func:`config_from_args`).
    """
    docs = field_docs(cls)
    if config_section is not None:
        parser.add_argument(
            "--config",
            default=None,
            metavar="FILE",
            help=f"run config (configs/*.yaml); its `{config_section}:` section supplies the fields",
        )
        parser.add_argument(
            "--set",
            dest="overrides",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override a config value (dotted key, YAML value); repeatable",
        )
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        tp, is_list = _field_type(f.type)
        help_ = docs.get(f.name, "")
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        default = None if required else (f.default if f.default is not dataclasses.MISSING else f.default_factory())
        if not required:
            help_ = f"{help_} (default: {default})"
        if config_section is not None:
            # absent flags stay absent so the config file can fill them
            kw = dict(default=argparse.SUPPRESS, required=False)
        else:
            kw = dict(default=default, required=required)
        if tp is bool and not is_list:
            parser.add_argument(
                flag,
                dest=f.name,
                action=argparse.BooleanOptionalAction,
                help=help_,
                **{k: v for k, v in kw.items() if k != "required"},
            )
            continue
        parser.add_argument(
            flag,
            dest=f.name,
            type=_json_object if tp is dict else tp,
            help=help_,
            metavar=f.name.upper(),
            nargs="+" if is_list else None,
            **kw,
        )
