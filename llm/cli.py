"""``tiltlab llm ...``: the LLM layer's commands.

Each subcommand lives in its own module that exposes ``add_cli(subparsers)``; this file only
lists them in :data:`_SUBCOMMANDS` (order = order in ``tiltlab llm --help``). A later command
(``train``, ``demo``, ...) is added by appending its module name here and giving that module an
``add_cli``. Modules listed here must be import-light (no torch/transformers at import time):
their handlers import the heavy stack lazily.

:func:`add_dataclass_args` / :func:`config_from_args` turn a config dataclass into flags: one
flag per field (``--snake-case``), the field's attribute docstring as its help, booleans as
``--x/--no-x``; a field without a default is a required flag.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import inspect
import textwrap
import typing
from typing import Any

_SUBCOMMANDS: list[str] = [
    "llm.stage1",
    "llm.stage2",
    "llm.cli:add_eval_cli",
]
"""Entries ``"module"`` (its ``add_cli(subparsers)`` adds the command) or ``"module:function"``
(that function is used instead of ``add_cli``)."""


def register(subparsers) -> None:
    """Called by ``tiltlab.cli``: add ``tiltlab llm`` and its subcommands."""
    p = subparsers.add_parser("llm", help="LLM layer: DISA stages 1-2, evaluation, training",
                              description="LLM layer commands (see `tiltlab llm COMMAND --help`).")
    sub = p.add_subparsers(dest="llm_command", metavar="COMMAND")
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
    for entry in _SUBCOMMANDS:
        name, _, fn = entry.partition(":")
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as exc:  # an optional command whose module is not written/installed
            if exc.name == name:
                continue
            raise
        getattr(mod, fn or "add_cli")(sub)


# ---------------------------------------------------------------------------------------------
# dataclass <-> argparse
# ---------------------------------------------------------------------------------------------

def field_docs(cls) -> dict[str, str]:
    """Attribute docstrings of a dataclass (the string literal right after each field)."""
    try:
        src = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    tree = ast.parse(src)
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for a, b in zip(body, body[1:]):
        if isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name) and isinstance(b, ast.Expr) \
                and isinstance(b.value, ast.Constant) and isinstance(b.value.value, str):
            docs[a.target.id] = " ".join(b.value.value.split())
    return docs


def _scalar_type(tp: Any):
    """``(python type, optional?)`` for an annotation (string or typing object)."""
    if isinstance(tp, str):
        parts = [t.strip() for t in tp.split("|")]
        optional = "None" in parts
        parts = [t for t in parts if t != "None"]
        names = {"int": int, "float": float, "str": str, "bool": bool}
        if len(parts) != 1 or parts[0] not in names:
            raise TypeError(f"unsupported CLI field type {tp!r}")
        return names[parts[0]], optional
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if args:
        return args[0], len(args) < len(typing.get_args(tp))
    return tp, False


def add_dataclass_args(parser: argparse.ArgumentParser, cls, skip: tuple[str, ...] = ()) -> None:
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        tp, optional = _scalar_type(f.type)
        help_ = docs.get(f.name, "")
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        default = None if required else (f.default if f.default is not dataclasses.MISSING else f.default_factory())
        if tp is bool:
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=default,
                                help=help_)
            continue
        if not required:
            help_ = f"{help_} (default: {default})"
        parser.add_argument(flag, dest=f.name, type=tp, required=required, default=default, help=help_,
                            metavar=f.name.upper())


def config_from_args(cls, args: argparse.Namespace, **overrides):
    kw = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    kw.update(overrides)
    return cls(**kw)


# ---------------------------------------------------------------------------------------------
# tiltlab llm eval  (glue around llm.evaluate, written by its own author)
# ---------------------------------------------------------------------------------------------

def add_eval_cli(subparsers) -> None:
    """``tiltlab llm eval``: registered only when ``llm.evaluate`` exists."""
    import importlib.util

    if importlib.util.find_spec("llm.evaluate") is None:
        return
