"""Throughput of the code reward: 64 correct programs through ``resolve_reward("code")`` at the default concurrency.

The rows are ``llm.tasks.function_tasks`` (a function ``f`` and five asserts each); every
completion is the row's reference solution, so every reward must be 1.0 (the script exits 1
otherwise, so a fast-but-wrong sandbox cannot report a number). ``--numpy`` makes every solution
import numpy first (the slower case the issue names). ``--backend legacy`` measures the fallback
without bubblewrap.

Reported: rewards per second of wall time over ``--repeats`` batches (median and best), the
load average before and after, the CPU count and the isolation level that ran. On a machine that
other work shares, the rate is what this run's share of the CPUs gave, a lower bound for the same
CPUs idle. (No CPU time per reward: the candidate's processes die in a PID namespace whose init
reaps them, so their CPU time never reaches this process's ``RUSAGE_CHILDREN``.)

Usage::

    OMP_NUM_THREADS=1 python benchmarks/bench_sandbox.py
    OMP_NUM_THREADS=1 python benchmarks/bench_sandbox.py --numpy --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=64, help="programs per batch")
    ap.add_argument("--repeats", type=int, default=3, help="batches timed")
    ap.add_argument("--numpy", action="store_true", help="every solution imports numpy")
    ap.add_argument("--backend", default="auto", choices=["auto", "bwrap", "legacy"])
    ap.add_argument("--workers", type=int, default=None, help="concurrent sandboxes (default: the CPU count)")
    args = ap.parse_args(argv)

    from tiltlab.llm.rewards import code_reward, make_code_reward
    from tiltlab.llm.sandbox import SandboxConfig, SandboxWarning, isolation_report
    from tiltlab.llm.tasks import function_tasks

    warnings.simplefilter("ignore", SandboxWarning)
    rows = function_tasks(args.n, seed=0)
    pre = "import numpy as np\n" if args.numpy else ""
    comps = [f"```python\n{pre}{r['solution']}```" for r in rows]
    tests = [r["tests"] for r in rows]
    if args.backend == "auto" and args.workers is None:
        reward, cfg = code_reward, SandboxConfig()
    else:
        cfg = SandboxConfig(backend=args.backend)
        reward = make_code_reward(cfg, max_workers=args.workers)
    reward(None, comps[:2], tests=tests[:2])  # warm the probes (bwrap / unshare checks are cached)
    load0 = os.getloadavg()
    rates = []
    for _ in range(args.repeats):
        t = time.monotonic()
        out = reward(None, comps, tests=tests, entry_point=["f"] * len(rows))
        dt = time.monotonic() - t
        if out != [1.0] * len(rows):
            print(f"FAIL: {out.count(1.0)}/{len(rows)} correct programs paid", file=sys.stderr)
            return 1
        rates.append(len(rows) / dt)
    rep = {
        "n": args.n,
        "numpy": args.numpy,
        "workers": args.workers or os.cpu_count(),
        "repeats": args.repeats,
        "rewards_per_s_median": round(statistics.median(rates), 1),
        "rewards_per_s_best": round(max(rates), 1),
        "cpus": os.cpu_count(),
        "loadavg_before": [round(x, 2) for x in load0],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "isolation": isolation_report(cfg)["level"],
        "python": sys.version.split()[0],
    }
    print(json.dumps(rep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
