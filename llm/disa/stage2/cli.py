"""``tiltlab llm stage2`` and ``tiltlab llm stage2-annotate``: the command lines of
:func:`tiltlab.llm.disa.stage2.run.run_stage2` and :func:`tiltlab.llm.disa.stage2.run.annotate_log_z`."""

from __future__ import annotations

import sys
from pathlib import Path

import tiltlab.llm.disa.stage2 as package
from tiltlab.dataclass_cli import add_dataclass_args
from tiltlab.hints import hint
from tiltlab.llm.base.config_args import config_from_args
from tiltlab.llm.disa.stage1 import MANIFEST
from tiltlab.llm.disa.stage2.config import Stage2Config
from tiltlab.llm.disa.stage2.run import annotate_log_z, run_stage2


def add_cli(subparsers) -> None:
    """``tiltlab llm stage2``: flags = :class:`Stage2Config` fields."""

    p = subparsers.add_parser(
        "stage2",
        help="DISA Stage 2: fit log Z regressor on frozen pi_ref prompt embeddings",
        description=(package.__doc__ or "").split("\n\n")[0],
    )
    add_dataclass_args(p, Stage2Config, config_section="stage2")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_cli_main)
    a = subparsers.add_parser(
        "stage2-annotate",
        help="write a dataset with a log_z column predicted by a Stage-2 regressor (for disa.label=column)",
        description="DISA: precompute log Z_psi(x) for every prompt of a dataset, so that Stage 3 loads no second model.",
    )
    a.add_argument("--stage2-dir", required=True, help="output directory of `tiltlab llm stage2`")
    a.add_argument("--dataset", required=True, help="prompts: .jsonl / .parquet / save_to_disk dir / synthetic:...")
    a.add_argument("--out", required=True, help="output .jsonl or .parquet (the dataset plus a log_z column)")
    a.add_argument("--column", default="log_z", help="name of the new column (default log_z)")
    a.add_argument("--batch-size", type=int, default=64)
    a.add_argument("--embed-model", default=None, help="override the embedding model path recorded by Stage 2")
    a.add_argument("--quiet", action="store_true", help="no progress bars")
    a.set_defaults(func=_annotate_main)


def _annotate_main(args) -> int:
    out = annotate_log_z(
        args.stage2_dir,
        args.dataset,
        args.out,
        column=args.column,
        batch_size=args.batch_size,
        progress=not args.quiet,
        embed_model=args.embed_model,
    )
    print(f"wrote {out} with a {args.column!r} column (set disa.label: column and dataset: {out})")
    return 0


def _cli_main(args) -> int:

    cfg = config_from_args(Stage2Config, args, section="stage2")
    if not (Path(cfg.labels) / MANIFEST).is_file():
        raise FileNotFoundError(
            f"no Stage 1 output in {cfg.labels} (no {MANIFEST}): {hint('stage1_first', labels=cfg.labels)}"
        )
    print(f"[stage2] fitting on the Stage 1 labels in {cfg.labels}", file=sys.stderr, flush=True)
    m = run_stage2(cfg, progress=not args.quiet)
    print(
        f"Stage 2: {m['n_train']} train / {m['n_val']} val prompts; val MSE {m['val_mse']:.5g} "
        f"(predict-the-mean baseline {m['baseline_val_mse']:.5g}), val R^2 {m['val_r2']:.4f}, "
        f"train MSE {m['train_mse']:.5g}, best epoch {m['best_epoch']}"
    )
    print(f"regressor, config and loss_curve.png written to {cfg.out_dir}")
    return 0
