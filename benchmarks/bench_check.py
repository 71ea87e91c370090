"""Time ``tiltlab check`` (the fast layers) in CPU-seconds and wall, this checkout next to an older commit.

Each run is a fresh ``tiltlab check`` process (``OMP_NUM_THREADS=1``) writing its record to a temporary
folder. CPU-seconds are the user + system time of that process and of every worker it forked and
waited for (``getrusage(RUSAGE_CHILDREN)`` before and after); wall is the elapsed time of the process.
The baseline is the same command on a ``git worktree`` of ``--baseline`` (removed at the end); both
trees are imported through the same small import hook, so they pay the same start-up. The runs are
interleaved (baseline, current, baseline, current, ...) so both see the same load, and the one-minute
load average is recorded before and after each run: on a shared machine compare the CPU-seconds, and
ratios measured in one invocation.

    python benchmarks/bench_check.py --baseline cce5652 --jobs default 1 --repeats 3

writes ``results/bench_check.json`` and ``results/bench_check.md`` (``--out`` changes the stem).
Every run must exit 0 with the same verdict counts, or the script exits 1: a faster check that
changed a verdict is not a result.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Runs ``tiltlab`` from the checkout named by argv[1]: ``tiltlab`` is ``ROOT/tiltlab`` and
#: ``tiltlab.<name>`` the top-level folder ``ROOT/<name>`` (the layout pyproject.toml installs).
_BOOT = r"""
import importlib.util, sys
from pathlib import Path
root = Path(sys.argv[1]); names = {"objectives", "theory", "sim", "llm", "paper_checks"}
class _Checkout:
    @staticmethod
    def find_spec(fullname, path=None, target=None):
        head, _, tail = fullname.partition(".")
        if head != "tiltlab" or "." in tail or (tail and tail not in names):
            return None
        folder = root / (tail or "tiltlab")
        return importlib.util.spec_from_file_location(
            fullname, folder / "__init__.py", submodule_search_locations=[str(folder)]
        )
sys.meta_path.insert(0, _Checkout)
sys.argv = ["tiltlab", *sys.argv[2:]]
from tiltlab.cli import main
sys.exit(main())
"""


def _one_run(tree: Path, jobs: str, out_dir: Path) -> dict:
    rec_path = out_dir / "claims.json"
    cmd = [sys.executable, "-c", _BOOT, str(tree), "check", "--out", str(rec_path)]
    if jobs != "default":
        cmd += ["--jobs", jobs]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    load0 = os.getloadavg()[0]
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=out_dir)
    wall = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    load1 = os.getloadavg()[0]
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    rec = json.loads(rec_path.read_text()) if rec_path.exists() else None
    # the checks this run ran: a newer record also carries the shipped llm-layer rows (marked recorded,
    # not re-run), which an older commit's record does not have
    ran = [r for r in (rec or {}).get("checks", []) if r.get("layer") != "llm"]
    summary = (
        {"verdicts": dict(sorted(Counter(r["verdict"] for r in ran).items())), "checks": len(ran)} if rec else None
    )
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-2000:] + proc.stderr[-2000:])
    return {
        "jobs": jobs,
        "rc": proc.returncode,
        "cpu_s": round(cpu, 2),
        "wall_s": round(wall, 2),
        "load_before": round(load0, 2),
        "load_after": round(load1, 2),
        "verdicts": summary and summary["verdicts"],
        "checks": summary and summary["checks"],
    }


def _worktree(ref: str, where: Path) -> Path:
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(where), ref],
        check=True,
        capture_output=True,
        text=True,
    )
    return where


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", metavar="REF", help="git commit to compare with (default: this checkout only)")
    ap.add_argument(
        "--jobs", nargs="+", default=["default"], help="--jobs values to time; 'default' passes none (default: default)"
    )
    ap.add_argument("--repeats", type=int, default=1, help="runs per tree and --jobs value (default 1)")
    ap.add_argument("--out", type=Path, default=Path("results/bench_check"), help="output stem (.json and .md)")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    for j in args.jobs:
        if j != "default" and not (j.isdigit() and int(j) >= 1):
            ap.error(f"--jobs values must be 'default' or whole numbers >= 1, got {j!r}")
    args.out.parent.mkdir(parents=True, exist_ok=True)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the clean-up below when stopped
    tmp = Path(tempfile.mkdtemp(prefix="bench-check-"))
    trees = {"current": ROOT}
    rows: list[dict] = []
    try:
        if args.baseline:
            trees = {"baseline": _worktree(args.baseline, tmp / "baseline"), "current": ROOT}
        for jobs in args.jobs:
            for rep in range(args.repeats):
                for name, tree in trees.items():
                    run_dir = tmp / f"{name}-{jobs}-{rep}"
                    run_dir.mkdir()
                    row = {"tree": name, "repeat": rep, **_one_run(tree, jobs, run_dir)}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        if args.baseline and (tmp / "baseline").exists():
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tmp / "baseline")], check=False
            )
        shutil.rmtree(tmp, ignore_errors=True)

    table = []
    for jobs in args.jobs:
        for name in trees:
            rs = [r for r in rows if r["tree"] == name and r["jobs"] == jobs]
            table.append(
                {
                    "tree": name,
                    "jobs": jobs,
                    "runs": len(rs),
                    "cpu_s_median": statistics.median(r["cpu_s"] for r in rs),
                    "wall_s_median": statistics.median(r["wall_s"] for r in rs),
                    "load_range": [min(r["load_before"] for r in rs), max(r["load_after"] for r in rs)],
                }
            )
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "describe", "--always", "--dirty", "--abbrev=12"], capture_output=True, text=True
    ).stdout.strip()
    result = {
        "command": "tiltlab check",
        "commit": commit,
        "baseline": args.baseline,
        "cpus": os.cpu_count(),
        "machine": f"{platform.system()} {platform.machine()} {platform.processor() or ''}".strip(),
        "runs": rows,
        "summary": table,
    }
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        f"`tiltlab check` at {commit} vs {args.baseline or '-'} ({os.cpu_count()} CPUs, OMP_NUM_THREADS=1)",
        "",
        "| tree | --jobs | runs | CPU-s (median) | wall s (median) | load avg (1 min) |",
        "|---|---|---:|---:|---:|---|",
    ]
    for t in table:
        lo, hi = t["load_range"]
        lines.append(
            f"| {t['tree']} | {t['jobs']} | {t['runs']} | {t['cpu_s_median']:.1f} | {t['wall_s_median']:.1f} "
            f"| {lo:.1f}-{hi:.1f} |"
        )
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    verdicts = {json.dumps(r["verdicts"], sort_keys=True) for r in rows}
    bad = [r for r in rows if r["rc"] != 0]
    if bad or len(verdicts) != 1:
        print(f"FAILED: {len(bad)} run(s) exited non-zero; verdict counts seen: {sorted(verdicts)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
