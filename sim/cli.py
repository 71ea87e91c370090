"""``tiltlab sim`` (one simulator experiment) and ``tiltlab figures`` (the ten toy figures)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import fields
from pathlib import Path

from tiltlab.dataclass_cli import add_dataclass_args


def _add_config_args(p: argparse.ArgumentParser) -> None:
    from tiltlab.sim.config import SimConfig

    add_dataclass_args(p, SimConfig)


def _cmd_sim(args: argparse.Namespace) -> int:
    from tiltlab.sim.api import run
    from tiltlab.sim.config import SimConfig

    cfg = SimConfig(**{f.name: getattr(args, f.name) for f in fields(SimConfig)})
    try:
        cfg.validate()
    except ValueError as exc:
        print(f"tiltlab sim: {exc}", file=sys.stderr)
        return 2
    res = run(cfg)
    h = res.history
    keys = [k for k in h if k != "step"]
    print(f"{cfg.method} (log Z {cfg.log_z}) on {cfg.env}: {cfg.steps} batches, {cfg.seeds} seeds, {res.seconds:.1f} s")
    print("step  " + "  ".join(f"{k:>10s}" for k in keys))
    for i, s in enumerate(h["step"]):
        print(f"{s:<5d} " + "  ".join(f"{h[k][i]:10.4g}" if i < len(h[k]) else " " * 10 for k in keys))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        res.save(args.out)
        print(f"wrote {args.out}")
    return 0


def _cmd_figures(args: argparse.Namespace) -> int:
    from tiltlab.sim.figures import FIGURES, make_all

    if args.only:
        known = [fid for fid, _ in FIGURES]
        bad = [o for o in args.only if not any(fid.startswith(o) or o in fid for fid in known)]
        if bad:
            print(f"tiltlab figures: unknown figure(s) {bad}; known: {known}", file=sys.stderr)
            return 2
    out = Path(args.out)
    t0 = time.perf_counter()
    records = make_all(
        out,
        quick=args.quick,
        seed=args.seed,
        only=args.only,
        progress=lambda fid: print(f"[figures] {fid} ...", flush=True),
    )
    total = time.perf_counter() - t0
    for r in records:
        print(f"  {r.id}: {r.seconds:.1f} s -> {r.png}")
        for line in r.findings:
            print(f"      - {line}")
    index = {"quick": args.quick, "seed": args.seed, "seconds": total, "figures": [r.to_json() for r in records]}
    (out / "index.json").write_text(json.dumps(index, indent=1))
    print(f"{len(records)} figure(s) in {total:.1f} s; index at {out / 'index.json'}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "sim",
        help="run one exact-simulator experiment (sim.SimConfig fields as options)",
        description="Train tabular softmax policies on an enumerable environment with one objective "
        "(TB with exact/frozen/learned/VarGrad log Z, FlowRL, PACED, LAD, GRPO, GSPO) and print the history.",
    )
    _add_config_args(p)
    p.add_argument("--out", default=None, help="write the RunResult as JSON here")
    p.set_defaults(func=_cmd_sim)

    f = subparsers.add_parser("figures", help="regenerate the ten toy figures (PNG + JSON)")
    f.add_argument("--quick", action="store_true", help="reduced versions (CI: all ten in under 90 s)")
    f.add_argument("--only", nargs="+", default=None, help="figure ids or prefixes, e.g. fig01 fig07")
    f.add_argument("--out", default="results/figures", help="output directory (default: results/figures)")
    f.add_argument("--seed", type=int, default=0, help="base seed (default: 0)")
    f.set_defaults(func=_cmd_figures)
