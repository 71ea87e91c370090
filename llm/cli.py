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
import dataclasses
import importlib
import sys
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
    p = subparsers.add_parser(
        "llm",
        help="LLM layer: DISA stages 1-2, evaluation, training",
        description="LLM layer commands (see `tiltlab llm COMMAND --help`).",
    )
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


from tiltlab.dataclass_cli import add_dataclass_args, field_docs  # noqa: E402,F401  (re-exported)


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
            raise ValueError(
                f"{getattr(args, 'config', '')}: unknown keys in `{section}:` for {cls.__name__}: {unknown}"
            )
        kw.update(values)
    kw.update({n: getattr(args, n) for n in names if hasattr(args, n)})
    kw.update(overrides)
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.name not in kw and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
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
        "eval",
        help="k samples per prompt per benchmark: Mean@k, pass@k, distinct-n (+ optional judge)",
        description="Evaluate a model (llm.evaluate): Mean@k, unbiased pass@k, distinct-n diversity, "
        "optional LLM-judge diversity (DISA App. D.5); prints a table, writes JSON with --out-dir.",
    )
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
