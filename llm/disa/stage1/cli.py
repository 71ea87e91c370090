"""``tiltlab llm stage1``: the command line of :func:`tiltlab.llm.disa.stage1.pipeline.run_stage1`."""

from __future__ import annotations

import json

import tiltlab.llm.disa.stage1 as package
from tiltlab.dataclass_cli import add_dataclass_args
from tiltlab.llm.base.config_args import config_from_args
from tiltlab.llm.disa.stage1.config import RENAMED_FIELDS, Stage1Config
from tiltlab.llm.disa.stage1.pipeline import run_stage1

# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------


def add_cli(subparsers) -> None:
    """``tiltlab llm stage1``: flags = :class:`Stage1Config` fields."""

    p = subparsers.add_parser(
        "stage1",
        help="DISA Stage 1: importance-sampled log Z labels (resumable sharded Parquet)",
        description=(package.__doc__ or "").split("\n\n")[0]
        + " Refuses top-k/top-p truncation unless --allow-truncated.",
    )
    add_dataclass_args(p, Stage1Config, config_section="stage1", renamed=RENAMED_FIELDS)
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_cli_main)


def _cli_main(args) -> int:

    cfg = config_from_args(Stage1Config, args, section="stage1")  # errors: one line, exit 2 (tiltlab.cli)
    summary = run_stage1(cfg, progress=not args.quiet)
    print(json.dumps(summary, indent=2))
    print(f"labels and samples written to {cfg.out_dir}")
    return 0
