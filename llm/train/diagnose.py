"""``tiltlab llm diagnose RUN_DIR [RUN_DIR ...]``: a training run's per-step diagnostics, as a table and a PNG.

Reads each run's ``results.json`` (:func:`tiltlab.llm.train.cli.write_results`: written by ``tiltlab llm
train`` at the end of a run or when it is stopped) and prints, per run, one row per step (loss, gradient norm
before clipping, mean and largest ``|TB residual|``, the sequence KL to pi_ref, the share of residuals whose
sign the update flipped, ``|residual|`` after / before, the batch reward) and the health warnings it gave;
``--out PNG`` draws the same series, one panel per quantity, every run in each panel (log scale where the
series span decades).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tiltlab.files import atomic_path

PANELS = (
    ("loss", "loss", True),
    ("grad_norm", "gradient norm (before clipping)", True),
    ("residual", "mean |TB residual|", True),
    ("residual/abs_max", "largest |TB residual|", True),
    ("kl_ref_seq", "sequence KL(pi || pi_ref)", False),
    ("residual/flip_frac", "share of residuals whose sign the update flipped", False),
    ("residual/after_over_before", "|residual| after / before the update", True),
    ("reward", "batch reward", False),
)
"""``(results.json key, title, log scale)`` of each panel and table column."""


def read_results(run: str | Path) -> dict[str, Any]:
    """A run's ``results.json`` (``run`` is the run directory or the file); one-line errors when absent or not one."""
    p = Path(run)
    path = p / "results.json" if p.is_dir() else p
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no results.json (written by `tiltlab llm train` when a run ends or stops)")
    try:
        rec = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(rec, dict) or not isinstance(rec.get("steps"), list):
        raise ValueError(f"{path}: not a run's results.json (no 'steps' list)")
    return rec


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    v = float(v)
    return f"{v:.3g}" if math.isfinite(v) else str(v)


def table(name: str, rec: dict[str, Any]) -> str:
    """The run's steps as a fixed-width text table, then its warnings."""
    cols = [("step", "step")] + [(k, k.removeprefix("residual/")) for k, _, _ in PANELS]
    rows = [[_fmt(s.get(k)) if k != "step" else str(s["step"]) for k, _ in cols] for s in rec["steps"]]
    heads = [h for _, h in cols]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(heads)]
    out = [f"{name} ({rec.get('objective', '?')}, {rec.get('global_step', '?')} of {rec.get('max_steps', '?')} steps)"]
    out.append("  ".join(h.rjust(w) for h, w in zip(heads, widths)))
    out += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    warns = rec.get("warnings") or []
    out += [f"  warning (step {w['step']}, {w['kind']}): {w['message']}" for w in warns] or ["  no health warning"]
    return "\n".join(out)


def plot(runs: Sequence[tuple[str, dict[str, Any]]], out: str | Path) -> Path:
    """One panel per :data:`PANELS` entry, every run in each, the first panel's legend naming the runs; written
    atomically to ``out`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 4, figsize=(17, 7.5))
    for ax, (key, title, log) in zip(axes.flat, PANELS):
        drawn = False
        for name, rec in runs:
            pts = [(s["step"], float(s[key])) for s in rec["steps"] if key in s and math.isfinite(float(s[key]))]
            if pts:
                ax.plot(*zip(*pts), marker="o", ms=3, label=name)
                drawn = True
        if drawn and log and all(v > 0 for _, rec in runs for s in rec["steps"] if key in s for v in [float(s[key])]):
            ax.set_yscale("log")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        if not drawn:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="grey")
    axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    out = Path(out)
    with atomic_path(out) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return out


def add_cli(subparsers) -> None:
    p = subparsers.add_parser(
        "diagnose",
        help="a training run's per-step diagnostics (results.json) as a table and a PNG",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories (or their results.json)")
    p.add_argument("--out", default=None, metavar="PNG", help="also draw the diagnostics to this PNG")
    p.set_defaults(func=main)


def main(args) -> int:
    runs = [(Path(r).name if Path(r).is_dir() else Path(r).parent.name, read_results(r)) for r in args.runs]
    for name, rec in runs:
        print(table(name, rec))
    if args.out:
        print(f"[diagnose] {plot(runs, args.out)}", file=sys.stderr)
    return 0
