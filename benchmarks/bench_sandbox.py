"""Throughput of the code reward: 64 correct programs through ``resolve_reward("code")`` at the default concurrency.

The rows are ``llm.tasks.function_tasks`` (a function ``f`` and five asserts each); every
completion is the row's reference solution, so every reward must be 1.0 (the script exits 1
otherwise, so a fast-but-wrong sandbox cannot report a number). ``--numpy`` makes every solution
import numpy first (the slower case the issue names). ``--backend legacy`` measures the fallback
without bubblewrap.

``--mixed`` measures the mix a training batch meets instead, cycled over the rows in a fixed order
(:data:`MIXED_KINDS`): correct, wrong, raising and unparsable function programs, a correct one that
imports numpy, correct and wrong stdio programs (two cases each, a process per case), and a correct
LiveCodeBench-style functional row (``Solution().add``). Each kind has its known reward, and the
script exits 1 when any row's reward differs. Programs that run into the time limit are left out:
they measure the limit, not the sandbox.

``--judge-server both`` times batches with judges forked from the judge server and batches with
judges started as their own interpreters, interleaved, and reports both and their ratio (``on``
alone is what the reward uses by default).

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

#: ``--mixed``: kind -> expected reward; row i is of kind ``i % len(MIXED_KINDS)`` (in this order).
MIXED_KINDS = {
    "correct": 1.0,
    "wrong": 0.0,
    "raises": 0.0,
    "syntax_error": 0.0,
    "numpy_correct": 1.0,
    "stdio_correct": 1.0,
    "stdio_wrong": 0.0,
    "functional_correct": 1.0,
}
_STDIO_TESTS = json.dumps({"cases": [{"input": "1 2\n", "output": "3"}, {"input": "40 2\n", "output": "42"}]})
_FUNCTIONAL_TESTS = json.dumps(
    {"cases": [{"input": "1\n2", "output": "3"}, {"input": "[1]\n[2]", "output": "[1, 2]"}], "func_name": "add"}
)


def mixed_rows(rows: list[dict]) -> tuple[list[str], dict[str, list], list[float]]:
    """Completions, reward columns and expected rewards of the ``--mixed`` batch built on ``rows``
    (``function_tasks``): row i is of kind ``list(MIXED_KINDS)[i % 8]``."""
    kinds = list(MIXED_KINDS)
    comps, cols, want = [], {"tests": [], "entry_point": [], "test_type": []}, []
    for i, r in enumerate(rows):
        kind = kinds[i % len(kinds)]
        tests, entry, ttype = r["tests"], "f", "assert"
        code = {
            "correct": r["solution"],
            "wrong": "def f(x):\n    return None\n",
            "raises": "def f(x):\n    raise ValueError('no')\n",
            "syntax_error": "def f(x) return x\n",
            "numpy_correct": "import numpy as np\n" + r["solution"],
        }.get(kind)
        if kind.startswith("stdio"):
            op = "+" if kind == "stdio_correct" else "-"
            code, tests, entry, ttype = (
                f"a, b = map(int, input().split())\nprint(a {op} b)\n",
                _STDIO_TESTS,
                None,
                "stdio",
            )
        elif kind == "functional_correct":
            code = "class Solution:\n    def add(self, a, b):\n        return a + b\n"
            tests, entry, ttype = _FUNCTIONAL_TESTS, "add", "functional"
        comps.append(f"```python\n{code}```")
        cols["tests"].append(tests)
        cols["entry_point"].append(entry)
        cols["test_type"].append(ttype)
        want.append(MIXED_KINDS[kind])
    return comps, cols, want


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=64, help="programs per batch")
    ap.add_argument("--repeats", type=int, default=3, help="batches timed")
    ap.add_argument("--numpy", action="store_true", help="every solution imports numpy")
    ap.add_argument("--mixed", action="store_true", help="the mix of MIXED_KINDS, each with its known reward")
    ap.add_argument("--backend", default="auto", choices=["auto", "bwrap", "legacy"])
    ap.add_argument("--workers", type=int, default=None, help="concurrent sandboxes (default: the CPU count)")
    ap.add_argument(
        "--judge-server",
        default="on",
        choices=["on", "off", "both"],
        help="judges forked from the judge server (on, the default), started as their own interpreters (off), "
        "or both, batches interleaved, with their ratio",
    )
    args = ap.parse_args(argv)

    from tiltlab.llm.rewards import code_reward, make_code_reward
    from tiltlab.llm.sandbox import SandboxConfig, SandboxWarning, isolation_report
    from tiltlab.llm.tasks import function_tasks

    warnings.simplefilter("ignore", SandboxWarning)
    if args.mixed and args.numpy:
        ap.error("--mixed already has its numpy rows; give one of --mixed and --numpy")
    rows = function_tasks(args.n, seed=0)
    if args.mixed:
        comps, cols, want = mixed_rows(rows)
    else:
        pre = "import numpy as np\n" if args.numpy else ""
        comps = [f"```python\n{pre}{r['solution']}```" for r in rows]
        cols = {"tests": [r["tests"] for r in rows], "entry_point": ["f"] * len(rows)}
        want = [1.0] * len(rows)
    arms = {"on": [True], "off": [False], "both": [True, False]}[args.judge_server]
    rewards = {}
    for served in arms:
        if args.backend == "auto" and args.workers is None and served:
            cfg, rewards[served] = SandboxConfig(), code_reward  # what resolve_reward("code") gives
        else:  # code_reward's config (a 10 s limit), with this arm's judges
            cfg = SandboxConfig(timeout_s=10.0, backend=args.backend, judge_server=served)
            rewards[served] = make_code_reward(cfg, max_workers=args.workers)
        rewards[served](
            None, comps[:2], **{k: v[:2] for k, v in cols.items()}
        )  # warm the probes (bwrap / unshare checks are cached) and the judge server
    load0 = os.getloadavg()
    by_arm: dict[bool, list[float]] = {served: [] for served in arms}
    for _ in range(args.repeats):
        for served in arms:  # interleaved: both arms see the same drift in the machine's load
            t = time.monotonic()
            out = rewards[served](None, comps, **cols)
            dt = time.monotonic() - t
            if out != want:
                bad = [i for i, (a, b) in enumerate(zip(out, want)) if a != b]
                print(
                    f"FAIL: {len(bad)}/{len(rows)} rewards differ from the expected ones (rows {bad[:10]}, "
                    f"judge server {'on' if served else 'off'})",
                    file=sys.stderr,
                )
                return 1
            by_arm[served].append(len(rows) / dt)
    rates = by_arm[arms[0]]
    rep = {
        "n": args.n,
        "numpy": args.numpy,
        "mixed": args.mixed,
        "paid": int(sum(want)),
        "workers": args.workers or os.cpu_count(),
        "repeats": args.repeats,
        "rewards_per_s_median": round(statistics.median(rates), 1),
        "rewards_per_s_best": round(max(rates), 1),
        "judge_server": args.judge_server,
        "cpus": os.cpu_count(),
        "loadavg_before": [round(x, 2) for x in load0],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "isolation": isolation_report(cfg)["level"],
        "python": sys.version.split()[0],
    }
    if args.judge_server == "both":
        off = by_arm[False]
        rep.update(
            rewards_per_s_median_off=round(statistics.median(off), 1),
            rewards_per_s_best_off=round(max(off), 1),
            ratio_on_off_median=round(statistics.median(rates) / statistics.median(off), 2),
        )
    print(json.dumps(rep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
