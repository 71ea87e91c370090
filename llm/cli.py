"""``tiltlab llm ...``: the LLM layer's commands.

Each subcommand lives in its own module that exposes ``add_cli(subparsers)``; this file only
lists them in :data:`_SUBCOMMANDS` (order = order in ``tiltlab llm --help``). A later command
(``train``, ``demo``, ...) is added by appending its module name here and giving that module an
``add_cli``. Modules listed here must be import-light (no torch/transformers at import time):
their handlers import the heavy stack lazily.

:func:`add_dataclass_args` / :func:`config_from_args` turn a config dataclass into flags: one
flag per field (``--snake-case``), the field's attribute docstring as its help, booleans as
``--x/--no-x``; a field without a default is a required flag.

DISA Stages 1-2 on a real backbone (GPU; ``pip install 'tiltlab[llm,vllm]'``)::

    tiltlab llm stage1 --proposal Qwen/Qwen3-32B --reference Qwen/Qwen3-1.7B \
        --dataset prompts.jsonl --out-dir runs/disa/stage1 --M 8 --beta 1.0 --reward math \
        --engine vllm --temperature 1.0 --max-new-tokens 4096 --gpu-memory-utilization 0.6
    tiltlab llm stage2 --labels runs/disa/stage1 --out-dir runs/disa/stage2
    # later stages: llm.stage2.load_log_z_predictor("runs/disa/stage2").predict_log_z(prompts)

Both models must share one tokenizer (Qwen3 sizes do). An interrupted Stage 1 resumes when
rerun with the same flags.
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
    "llm.trainers.cli",
    "llm.demo",
    # llm-part-2 appends its training command module here (e.g. "llm.train").
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


def _field_type(tp: Any) -> tuple[type, bool]:
    """``(element type, is_list)`` for a field annotation: ``int``, ``float``, ``str``, ``bool``,
    ``list[...]`` of those, each optionally ``| None``."""
    if not isinstance(tp, str):
        tp = getattr(tp, "__name__", str(tp))
    parts = [t.strip() for t in tp.split("|") if t.strip() != "None"]
    names = {"int": int, "float": float, "str": str, "bool": bool}
    if len(parts) == 1 and parts[0] in names:
        return names[parts[0]], False
    if len(parts) == 1 and parts[0].startswith("list[") and parts[0][5:-1] in names:
        return names[parts[0][5:-1]], True
    raise TypeError(f"unsupported CLI field type {tp!r}")


def add_dataclass_args(parser: argparse.ArgumentParser, cls, skip: tuple[str, ...] = ()) -> None:
    """One flag per dataclass field; help = the field's docstring; lists take several values."""
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        tp, is_list = _field_type(f.type)
        help_ = docs.get(f.name, "")
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        default = None if required else (f.default if f.default is not dataclasses.MISSING else f.default_factory())
        if tp is bool and not is_list:
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=default,
                                help=help_)
            continue
        if not required:
            help_ = f"{help_} (default: {default})"
        parser.add_argument(flag, dest=f.name, type=tp, required=required, default=default, help=help_,
                            metavar=f.name.upper(), nargs="+" if is_list else None)


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
    from llm.evaluate import EvalConfig

    p = subparsers.add_parser(
        "eval", help="k samples per prompt per benchmark: Mean@k, pass@k, distinct-n (+ optional judge)",
        description="Evaluate a model (llm.evaluate): Mean@k, unbiased pass@k, distinct-n diversity, "
                    "optional LLM-judge diversity (DISA App. D.5); prints a table, writes JSON with --out-dir.")
    add_dataclass_args(p, EvalConfig)
    p.set_defaults(func=_eval_main)


def _eval_main(args) -> int:
    from llm.evaluate import EvalConfig, results_table, run_eval

    cfg = config_from_args(EvalConfig, args)
    results = run_eval(cfg)
    print(results_table(results))
    if cfg.out_dir:
        print(f"results written to {cfg.out_dir}")
    return 0
