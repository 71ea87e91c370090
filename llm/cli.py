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
import sys
import typing
from pathlib import Path
from typing import Any

_SUBCOMMANDS: list[str] = [
    "tiltlab.llm.stage1",
    "tiltlab.llm.stage2",
    "tiltlab.llm.cli:add_eval_cli",
    "tiltlab.llm.trainers.cli",
    "tiltlab.llm.demo",
    # llm-part-2 appends its training command module here (e.g. "tiltlab.llm.train").
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


def add_dataclass_args(
    parser: argparse.ArgumentParser, cls, skip: tuple[str, ...] = (), config_section: str | None = None
) -> None:
    """One flag per dataclass field; help = the field's docstring; lists take several values.

    With ``config_section`` the command also takes ``--config FILE`` (a run config of ``configs/``,
    schema :class:`llm.trainers.config.RunConfig`) whose ``<config_section>:`` mapping supplies the
    fields, and ``--set KEY=VALUE`` overrides (dotted, e.g. ``stage1.M=16``). Precedence: dataclass
    default < config file < ``--set`` < explicit flags. Flags are then not argparse-required: a field
    without a default must come from one of the three sources (checked in :func:`config_from_args`).
    """
    docs = field_docs(cls)
    if config_section is not None:
        parser.add_argument("--config", default=None, metavar="FILE",
                            help=f"run config (configs/*.yaml); its `{config_section}:` section supplies the fields")
        parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                            help="override a config value (dotted key, YAML value); repeatable")
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
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, help=help_,
                                **{k: v for k, v in kw.items() if k != "required"})
            continue
        parser.add_argument(flag, dest=f.name, type=tp, help=help_, metavar=f.name.upper(),
                            nargs="+" if is_list else None, **kw)


def config_section_values(args: argparse.Namespace, section: str) -> tuple[dict, Any]:
    """The ``section`` mapping of ``args.config`` with ``args.overrides`` applied, and the whole
    :class:`~llm.trainers.config.RunConfig` (``({}, None)`` without ``--config``)."""
    path = getattr(args, "config", None)
    overrides = list(getattr(args, "overrides", []) or [])
    if path is None:
        if overrides:
            raise ValueError("--set needs --config")
        return {}, None
    from tiltlab.llm.trainers.config import load_run_config

    rc = load_run_config(path, overrides, validate=False)
    values = getattr(rc, section, None)
    if values is None:
        raise ValueError(f"{path}: no `{section}:` section")
    return dict(values), rc


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
            raise ValueError(f"{getattr(args, 'config', '')}: unknown keys in `{section}:` for {cls.__name__}: {unknown}")
        kw.update(values)
    kw.update({n: getattr(args, n) for n in names if hasattr(args, n)})
    kw.update(overrides)
    missing = [f.name for f in dataclasses.fields(cls)
               if f.name not in kw and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        flags = ", ".join("--" + m.replace("_", "-") for m in missing)
        raise ValueError(f"missing required value(s) {flags} (give the flags or a --config with them)")
    return cls(**kw)


# ---------------------------------------------------------------------------------------------
# tiltlab llm eval  (glue around llm.evaluate, written by its own author)
# ---------------------------------------------------------------------------------------------

def add_eval_cli(subparsers) -> None:
    """``tiltlab llm eval``: registered only when ``llm.evaluate`` exists."""
    import importlib.util

    if importlib.util.find_spec("tiltlab.llm.evaluate") is None:
        return
    from tiltlab.llm.evaluate import EvalConfig

    p = subparsers.add_parser(
        "eval", help="k samples per prompt per benchmark: Mean@k, pass@k, distinct-n (+ optional judge)",
        description="Evaluate a model (llm.evaluate): Mean@k, unbiased pass@k, distinct-n diversity, "
                    "optional LLM-judge diversity (DISA App. D.5); prints a table, writes JSON with --out-dir.")
    add_dataclass_args(p, EvalConfig, config_section="eval")
    p.set_defaults(func=_eval_main)


def _eval_from_run_config(values: dict, rc) -> dict:
    """A run config's ``eval:`` section -> :class:`llm.evaluate.EvalConfig` fields: the model is the
    run's trained output (``output_dir``) unless the objective is ``none`` (a base-model row);
    ``benchmarks`` are the dataset names; results go to ``<output_dir>/eval``."""
    values = dict(values)
    if "benchmarks" in values:
        values["datasets"] = list(values.pop("benchmarks"))
    split = values.pop("split", "test")
    if split != "test":
        raise ValueError(f"eval split {split!r}: the benchmark loaders read the local test copies only")
    values.setdefault("model", rc.model if rc.objective == "none" else rc.output_dir)
    values.setdefault("out_dir", str(Path(rc.output_dir) / "eval"))
    return values


def _eval_main(args) -> int:
    from tiltlab.llm.evaluate import EvalConfig, results_table, run_eval

    try:
        cfg = config_from_args(EvalConfig, args, section="eval", translate=_eval_from_run_config)
    except (ValueError, FileNotFoundError) as e:
        print(f"tiltlab llm eval: error: {e}", file=sys.stderr)
        return 2
    results = run_eval(cfg)
    print(results_table(results))
    if cfg.out_dir:
        print(f"results written to {cfg.out_dir}")
    return 0
