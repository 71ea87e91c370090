"""Config dataclass -> command-line flags, shared by ``tiltlab sim`` and ``tiltlab llm``.

One flag per field (``--snake-case``), the field's attribute docstring (the string literal right
after it) as its help, booleans as ``--x/--no-x``, ``list[...]`` fields as several values, ``dict``
fields as one JSON object (``--chat-template-kwargs '{"enable_thinking": false}'``); a field
without a default is a required flag. Standard library only, so ``tiltlab --help`` stays fast.

The same field types check values that come from a config file or ``--set`` rather than a flag
(:func:`check_field_values`: ``beta: expected a number, got 'abc'``), and :func:`did_you_mean` /
:func:`unknown_keys_message` name the close matches of a mistyped key, flag or command.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import inspect
import itertools
import textwrap
from collections.abc import Iterable
from typing import Any

__all__ = [
    "add_dataclass_args",
    "check_field_values",
    "check_values",
    "close_matches",
    "did_you_mean",
    "field_docs",
    "unknown_keys_message",
]


def close_matches(word: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """The ``choices`` closest to ``word`` (difflib ratio >= 0.6, best first; case-insensitive)."""
    choices = list(dict.fromkeys(str(c) for c in choices))
    lower = {c.lower(): c for c in choices}
    return [lower[m] for m in difflib.get_close_matches(str(word).lower(), list(lower), n=n, cutoff=0.6)]


def did_you_mean(word: str, choices: Iterable[str], fmt: str = "{!r}") -> str:
    """``" (did you mean 'eval'?)"`` for the closest match of ``word`` among ``choices``, else ``""``.
    ``fmt`` renders the match (``"{}"`` for a flag such as ``--only``)."""
    found = close_matches(word, choices, n=1)
    return f" (did you mean {fmt.format(found[0])}?)" if found else ""


def unknown_keys_message(unknown: Iterable[str], valid: Iterable[str], where: str, list_valid: bool = True) -> str:
    """One line naming the unknown keys of ``where`` (e.g. ``"`stage2:`"``), the close matches and
    every valid key: ``unknown keys ['epohcs'] in `stage2:` (did you mean 'epochs'?); valid keys: ...``
    (``list_valid=False``: without the list, for a table of hundreds of keys such as TRL's)."""
    unknown, valid = sorted(unknown), sorted(valid)
    if len(unknown) == 1:
        hint = did_you_mean(unknown[0], valid)
    else:
        pairs = [(u, close_matches(u, valid, n=1)) for u in unknown]
        found = [f"{ms[0]!r} for {u!r}" for u, ms in pairs if ms]
        hint = f" (did you mean {', '.join(found)}?)" if found else ""
    return f"unknown keys {unknown} in {where}{hint}" + (f"; valid keys: {', '.join(valid)}" if list_valid else "")


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


def _is_optional(tp: Any) -> bool:
    text = tp if isinstance(tp, str) else getattr(tp, "__name__", str(tp))
    return "None" in [t.strip() for t in text.split("|")]


_TYPE_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false", dict: "a mapping"}
_LIST_WORDS = {int: "integers", float: "numbers", str: "strings", bool: "booleans"}


def _expected(tp: type, is_list: bool, optional: bool) -> str:
    word = f"a list of {_LIST_WORDS[tp]}" if is_list else _TYPE_WORDS[tp]
    return word + (" or null" if optional else "")


def _coerce(tp: type, value: Any) -> Any:
    """``value`` as a ``tp`` field value, or raise ``TypeError``. An int is a number; a string that
    reads as a float is one (YAML 1.1 reads ``2e-6`` as a string); a bool is only a bool."""
    if isinstance(value, bool):
        if tp is bool:
            return value
        raise TypeError
    if tp is float:
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise TypeError
    if isinstance(value, tp):  # a bool value returned above; no other value is a bool
        return value
    raise TypeError


def check_field_values(cls, values: dict, prefix: str = "") -> dict:
    """``values`` (from a config file or ``--set``) checked against the annotations of dataclass
    ``cls``: a one-line ``ValueError`` such as ``stage2.epochs: expected an integer, got 'abc'`` on a
    mismatch; ints given for float fields become floats. Keys that are not fields, and fields whose
    type :func:`add_dataclass_args` cannot express (e.g. ``Any``), are passed through unchecked."""
    return check_values({f.name: f.type for f in dataclasses.fields(cls)}, values, prefix)


def check_values(types: dict[str, Any], values: dict, prefix: str = "") -> dict:
    """:func:`check_field_values` against a table ``name -> annotation`` (a type or its text, e.g.
    ``"float | None"``) in place of a dataclass: the run-config pre-check reads the trainer configs' fields
    from a generated table (:mod:`tiltlab.llm.train.trl_fields`) without importing them."""
    out = dict(values)
    for name, value in values.items():
        if name not in types:
            continue
        try:
            tp, is_list = _field_type(types[name])
        except TypeError:
            continue
        optional = _is_optional(types[name])
        if value is None and optional:
            continue
        try:
            if is_list:
                if not isinstance(value, (list, tuple)):
                    raise TypeError
                out[name] = [_coerce(tp, v) for v in value]
            else:
                out[name] = _coerce(tp, value)
        except TypeError:
            raise ValueError(f"{prefix}{name}: expected {_expected(tp, is_list, optional)}, got {value!r}") from None
    return out


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


class _RenamedFlag(argparse.Action):
    """The flag of a renamed field: refused in one line naming the new flag."""

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is now {self.default}")


def add_dataclass_args(
    parser: argparse.ArgumentParser,
    cls,
    skip: tuple[str, ...] = (),
    config_section: str | None = None,
    renamed: dict[str, str] | None = None,
) -> None:
    """One flag per dataclass field; help = the field's docstring; lists take several values.

    ``renamed`` (old field name -> new): the old flags stay known, hidden, and are refused in one line
    naming the new flag (``--beta is now --tilt-beta``).

    With ``config_section`` the command also takes ``--config FILE`` (a run config of ``configs/``,
    schema :class:`tiltlab.llm.train.config.RunConfig`) whose ``<config_section>:`` mapping supplies the
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
    for old, new in (renamed or {}).items():
        parser.add_argument(
            "--" + old.replace("_", "-"),
            nargs="?",
            action=_RenamedFlag,
            default="--" + new.replace("_", "-"),
            help=argparse.SUPPRESS,
        )
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        tp, is_list = _field_type(f.type)
        help_ = docs.get(f.name) or str(f.metadata.get("help", ""))
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
