"""``tiltlab llm eval``: the command line of :func:`tiltlab.llm.eval.run.run_eval` (flags from
:class:`~tiltlab.llm.eval.config.EvalConfig`, checks of the model and the datasets before anything loads, the
printed table)."""

from __future__ import annotations

import sys
from pathlib import Path

from tiltlab.dataclass_cli import add_dataclass_args
from tiltlab.hints import hint
from tiltlab.llm.base.config_args import config_from_args, config_section_values
from tiltlab.llm.base.data import MissingBenchmark, load_prompts
from tiltlab.llm.base.models import MODEL_ALIASES
from tiltlab.llm.base.rollout import resolve_engine
from tiltlab.llm.eval.config import EvalConfig, eval_from_run_config
from tiltlab.llm.eval.run import results_table, run_eval


def add_cli(subparsers) -> None:
    """``tiltlab llm eval``: flags = :class:`EvalConfig` fields (``--config`` reads the ``eval:`` section)."""

    p = subparsers.add_parser(
        "eval",
        help="k samples per prompt per benchmark: Mean@k, pass@k, distinct-n (+ optional judge)",
        description="Evaluate a model: Mean@k, unbiased pass@k, distinct-n diversity, "
        "optional LLM-judge diversity (DISA App. D.5); prints a table, writes JSON with --out-dir.",
    )
    add_dataclass_args(p, EvalConfig, config_section="eval")
    p.set_defaults(func=_cli_main)


def _check_model(name: str) -> None:
    """Refuse a ``--model`` that is neither ``tiny[:seed]``, an existing local path nor shaped like a
    hub id (``org/name``), before anything loads (a missing path would end in a hub error)."""

    if name == "tiny" or name.startswith("tiny:") or name in MODEL_ALIASES or Path(name).expanduser().exists():
        return
    looks_local = name.startswith((".", "/", "~")) or name.endswith("/") or name.count("/") != 1
    if looks_local:
        raise FileNotFoundError(f"model {name!r} does not exist: {hint('eval_model', aliases=sorted(MODEL_ALIASES))}")


def _check_datasets(cfg) -> None:
    """Load every dataset once before the model: a benchmark that is not on disk fails in a second."""

    for name in cfg.datasets:
        try:
            rows = load_prompts(name, data_dir=cfg.data_dir, limit=cfg.limit, seed=cfg.seed)
        except MissingBenchmark as exc:
            raise MissingBenchmark(f"{exc} ({hint('eval_data_dir')})") from None
        if not rows:
            raise ValueError(f"dataset {name!r} has no rows (after --limit); nothing to evaluate")


def _cli_main(args) -> int:

    cfg = config_from_args(EvalConfig, args, section="eval", translate=eval_from_run_config)
    if getattr(args, "config", None) and not hasattr(args, "model"):
        values, rc = config_section_values(args, "eval")
        if "model" not in values and rc.objective != "none" and not Path(rc.output_dir).exists():
            raise FileNotFoundError(
                f"the trained model {rc.output_dir} (output_dir of {args.config}) does not exist: "
                + hint("train_first", config=args.config)
            )
    _check_model(cfg.model)
    _check_datasets(cfg)
    if cfg.out_dir:
        out = Path(cfg.out_dir)
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out-dir {out} is a file; pass a directory")

    print(
        f"[eval] {cfg.model}: {len(cfg.datasets)} dataset(s), k = {cfg.k} samples per prompt, "
        f"engine {resolve_engine(cfg.engine, cfg.model)}",
        file=sys.stderr,
        flush=True,
    )
    results = run_eval(cfg)
    print(results_table(results))
    if cfg.out_dir:
        print(f"results written to {cfg.out_dir} (results.json, results.md, samples.jsonl)")
    else:
        print("no --out-dir given: results printed only")
    return 0
