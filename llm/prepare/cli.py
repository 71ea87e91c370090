"""``tiltlab llm prepare SOURCE``: the command line of the preparers of :mod:`tiltlab.llm.prepare.run` (one
subcommand per source, flags of ``select`` and ``fpa`` from :mod:`tiltlab.llm.prepare.config`)."""

from __future__ import annotations

import json

from tiltlab.dataclass_cli import add_dataclass_args
from tiltlab.llm.base.config_args import config_from_args
from tiltlab.llm.prepare import run
from tiltlab.llm.prepare.config import FpaConfig, SelectConfig
from tiltlab.llm.prepare.run import (
    build_fpa_offline,
    prepare_dapo,
    prepare_deepcoder,
    prepare_deepscaler,
    prepare_math,
    select_by_pass_rate,
    sft_rows_from_stage1,
    write_rows,
)


def add_cli(subparsers) -> None:
    p = subparsers.add_parser(
        "prepare",
        help="training data from local copies of the papers' datasets (DAPO, DeepScaleR, DeepCoder, MATH, SFT, FPA) and pass-rate selection",
        description=(run.__doc__ or "").split("\n\n")[0],  # the preparers' module: its first paragraph
    )
    sub = p.add_subparsers(dest="prepare_source", metavar="SOURCE")
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
    for name, help_ in (
        ("dapo", "DAPO-Math-17k Parquet/JSONL -> math prompts (boxed instruction)"),
        ("deepscaler", "DeepScaleR JSON/Parquet -> math prompts"),
        ("deepcoder", "DeepCoder Parquet/JSONL -> code prompts with stdio/functional tests"),
        ("math", "MATH train JSONL/Parquet -> prompts with FPA's prompt (App. B.5)"),
        ("sft", "Stage-1 directory -> SFT rows (correct, finished proposal samples)"),
    ):
        q = sub.add_parser(name, help=help_)
        q.add_argument("--input", required=True, help="local file (or the Stage-1 directory for `sft`)")
        q.add_argument("--out", required=True, help="output .jsonl or .parquet")
        q.set_defaults(func=_main_simple, prepare_source=name)

    sel = sub.add_parser(
        "select",
        help="Stage-1 run of pi_ref -> the prompts whose pi_ref pass rate lies in [min, max] (+ held-out split)",
    )
    add_dataclass_args(sel, SelectConfig)
    sel.set_defaults(func=_main_select)
    f = sub.add_parser("fpa", help="FPA's offline dataset: K samples at T per prompt, filtered, 5%% held out")
    add_dataclass_args(f, FpaConfig)
    f.set_defaults(func=_main_fpa)


def _main_select(args) -> int:

    cfg = config_from_args(SelectConfig, args)
    info = select_by_pass_rate(cfg)
    print(
        f"[prepare select] {info['n_kept']} of {info['n_labelled']} prompts have a pi_ref pass rate in "
        f"[{cfg.min_pass:g}, {cfg.max_pass:g}] (mean {info['mean_pass_all']:.3f} -> {info['mean_pass_train']:.3f}); "
        f"{info['n_train']} -> {cfg.out}" + (f", {info['n_heldout']} -> {cfg.heldout_out}" if cfg.heldout_out else "")
    )
    return 0


def _main_simple(args) -> int:
    src = args.prepare_source
    extra = ""
    if src == "dapo":
        rows = prepare_dapo(args.input)
    elif src == "deepscaler":
        rows = prepare_deepscaler(args.input)
    elif src == "deepcoder":
        rows, skipped = prepare_deepcoder(args.input)
        extra = f" ({skipped} rows skipped: unsupported test format)"
    elif src == "math":
        rows = prepare_math(args.input)
    else:
        rows = sft_rows_from_stage1(args.input)
    write_rows(rows, args.out)
    print(f"[prepare {src}] {len(rows)} rows -> {args.out}{extra}")
    return 0


def _main_fpa(args) -> int:

    cfg = config_from_args(FpaConfig, args)
    info = build_fpa_offline(cfg)
    print(f"[prepare fpa] {json.dumps(info)}")
    return 0
