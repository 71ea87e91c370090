"""Throughput of the code reward: 64 correct programs through ``resolve_reward("code")`` at the default concurrency.

The rows are ``llm.base.tasks.function_tasks`` (a function ``f`` and five asserts each); every
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
CPUs idle.

And CPU-ms per reward over the whole run tree (the timed batches only; a small table, then the JSON line):

* ``cgroup`` (when this process may make a cgroup: root with cgroup v1 ``cpuacct`` or a writable cgroup v2):
  the script moves itself into a cgroup of its own before anything starts, and reads its CPU usage. It
  counts every process the reward starts (this process's threads, the judge server and its judges, bwrap,
  the candidates, stdio's per-case children), also those no one of the tree waits for.
* the parts, from ``getrusage`` and ``/proc``: ``self`` (this process: encoding, the threads that wait),
  ``reaped`` (``RUSAGE_CHILDREN``: each reaped child with what it reaped in turn: the own-interpreter
  judges, bwrap's own processes, the namespaces level's candidates, retired judge servers),
  ``servers`` (the live judge servers: their own CPU and the judges they reaped, from ``/proc/<pid>/stat``
  utime+stime+cutime+cstime, as deltas over the batch). ``sandboxes`` is ``cgroup`` less the three: at the
  bwrap level bwrap's monitor learns its sandbox's exit through a descriptor and never waits for the
  sandbox's init, so the candidates' CPU is in no ``RUSAGE_CHILDREN``; without a cgroup it is not counted
  (``n/a``) and the total is a lower bound.
* never counted: kernel work done outside the tree's processes on its behalf (namespace teardown in kernel
  workers, RCU callbacks), and other work on the machine.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/bench_sandbox.py
    OMP_NUM_THREADS=1 python benchmarks/bench_sandbox.py --numpy --repeats 3
    OMP_NUM_THREADS=1 python benchmarks/bench_sandbox.py --mixed --n 200 --repeats 3 --judge-server both

An older commit's code, with this script: ``git worktree add /tmp/old <commit>`` and then
``OMP_NUM_THREADS=1 PYTHONPATH=/tmp/old python benchmarks/bench_sandbox.py --mixed ...`` (``code`` in the
JSON line says which checkout's ``tiltlab`` ran).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
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


def _proc_cpu_s(pid: int) -> float:
    """utime + stime + cutime + cstime of a live (or not yet reaped) process, in seconds; 0 when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


class TreeCPU:
    """CPU seconds of this process and everything it starts: a cgroup of its own when one can be made
    (:meth:`read` ``["cgroup"]``), and the parts ``getrusage`` and ``/proc`` see (see the module's doc)."""

    def __init__(self, use_cgroup: bool = True):
        self.dir = self.parent = self.usage = None
        if use_cgroup:
            self._enter()

    def _enter(self) -> None:
        mine = {}
        with open("/proc/self/cgroup") as f:
            for line in f:
                _n, ctl, path = line.rstrip("\n").split(":", 2)
                for c in ctl.split(",") if ctl else [""]:
                    mine[c] = path
        tries = [("/sys/fs/cgroup/cpuacct", "cpuacct", "cpuacct.usage")]
        tries += [(b, "", "cpu.stat") for b in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup")]
        for base, ctl, usage in tries:
            if ctl not in mine or not os.path.exists(os.path.join(base, "cgroup.procs")):
                continue
            parent = os.path.join(base, mine[ctl].lstrip("/"))
            d = os.path.join(parent, f"tiltlab-bench-{os.getpid()}")
            try:
                os.mkdir(d)
            except OSError:
                continue
            try:
                with open(os.path.join(d, "cgroup.procs"), "w") as f:
                    f.write(str(os.getpid()))
                self.dir, self.parent, self.usage = d, parent, os.path.join(d, usage)
                self._usage_s()
                return
            except (OSError, ValueError):
                self.close()
                with contextlib.suppress(OSError):
                    os.rmdir(d)

    def _usage_s(self) -> float:
        with open(self.usage) as f:
            text = f.read()
        if self.usage.endswith("cpuacct.usage"):
            return int(text) / 1e9
        return int(dict(ln.split() for ln in text.splitlines())["usage_usec"]) / 1e6

    @staticmethod
    def _servers() -> list[int]:
        try:
            from tiltlab.llm.base.sandbox import server
        except ImportError:
            return []
        cls = server._JudgeServer
        procs = [cls._current, *getattr(cls, "_retired", [])]  # _retired: only where servers are retired
        return [p.proc.pid for p in procs if p is not None and p.owner == os.getpid()]

    def read(self) -> dict[str, float | None]:
        me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return {
            "self": me.ru_utime + me.ru_stime,
            "reaped": kids.ru_utime + kids.ru_stime,
            "servers": sum(_proc_cpu_s(pid) for pid in self._servers()),
            "cgroup": self._usage_s() if self.usage else None,
        }

    def close(self) -> None:
        """Leave the cgroup and remove it (after the judge servers, which live in it, are gone)."""
        if self.dir is None:
            return
        with contextlib.suppress(ImportError):
            from tiltlab.llm.base.sandbox import server

            server._JudgeServer.drop()
            for r in getattr(server._JudgeServer, "_retired", []):
                r.proc.wait()
        with contextlib.suppress(OSError), open(os.path.join(self.parent, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        for _ in range(50):  # a process of the tree may still be exiting
            try:
                os.rmdir(self.dir)
                break
            except OSError:
                time.sleep(0.1)
        else:
            print(f"note: could not remove the cgroup {self.dir}", file=sys.stderr)
        self.dir = None


def cpu_table(rows: dict[str, dict]) -> str:
    """The table of rewards/s and CPU-ms per reward (with its parts) of each arm."""
    cols = ["rewards/s", "CPU-ms/reward", "self", "reaped", "servers", "sandboxes"]
    lines = [f"{'arm':<22}" + "".join(f"{c:>15}" for c in cols)]
    for arm, r in rows.items():
        p = r["cpu_ms_per_reward_parts"]
        vals = [r["rewards_per_s_median"], r["cpu_ms_per_reward"], p["self"], p["reaped"], p["servers"]]
        vals.append(p["sandboxes"])
        lines.append(f"{arm:<22}" + "".join(f"{'n/a' if v is None else v:>15}" for v in vals))
    return "\n".join(lines)


def _per_reward(spent: dict[str, float], rewards: int) -> tuple[float, dict]:
    ms = {k: (None if v is None else round(1000 * v / rewards, 1)) for k, v in spent.items()}
    rusage = spent["self"] + spent["reaped"] + spent["servers"]
    cg = spent["cgroup"]
    parts = {k: ms[k] for k in ("self", "reaped", "servers")}
    parts["sandboxes"] = None if cg is None else round(1000 * (cg - rusage) / rewards, 1)
    return round(1000 * (cg if cg is not None else rusage) / rewards, 1), parts


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
    ap.add_argument(
        "--no-cgroup", action="store_true", help="CPU per reward from getrusage and /proc only (no cgroup of its own)"
    )
    args = ap.parse_args(argv)
    tree = TreeCPU(use_cgroup=not args.no_cgroup)  # before anything starts: every process after is inside
    try:
        return _main(ap, args, tree)
    finally:
        tree.close()


def _main(ap, args, tree: TreeCPU) -> int:
    import tiltlab
    from tiltlab.llm.base.rewards import code_reward, make_code_reward
    from tiltlab.llm.base.sandbox import SandboxConfig, SandboxWarning, isolation_report
    from tiltlab.llm.base.tasks import function_tasks

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
    cpu: dict[bool, dict[str, float]] = {served: {} for served in arms}
    for _ in range(args.repeats):
        for served in arms:  # interleaved: both arms see the same drift in the machine's load
            c0 = tree.read()
            t = time.monotonic()
            out = rewards[served](None, comps, **cols)
            dt = time.monotonic() - t
            c1 = tree.read()
            for k, v in c1.items():
                cpu[served][k] = None if v is None else cpu[served].get(k, 0.0) + v - c0[k]
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
    table = {}
    for served in arms:
        total, parts = _per_reward(cpu[served], len(rows) * args.repeats)
        arm = "judge server" if served else "own interpreters"
        table[arm] = {
            "rewards_per_s_median": round(statistics.median(by_arm[served]), 1),
            "cpu_ms_per_reward": total,
            "cpu_ms_per_reward_parts": parts,
        }
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
        "code": os.path.dirname(os.path.dirname(os.path.abspath(tiltlab.__file__))),
        "cpu_ms_per_reward": table[next(iter(table))]["cpu_ms_per_reward"],
        "cpu_ms_per_reward_parts": table[next(iter(table))]["cpu_ms_per_reward_parts"],
        "cpu_measured_by": "cgroup" if tree.usage else "getrusage+/proc (sandboxes not counted at the bwrap level)",
    }
    if args.judge_server == "both":
        off = by_arm[False]
        rep.update(
            rewards_per_s_median_off=round(statistics.median(off), 1),
            rewards_per_s_best_off=round(max(off), 1),
            ratio_on_off_median=round(statistics.median(rates) / statistics.median(off), 2),
            cpu_ms_per_reward_off=table["own interpreters"]["cpu_ms_per_reward"],
            cpu_ms_per_reward_parts_off=table["own interpreters"]["cpu_ms_per_reward_parts"],
        )
    print(cpu_table(table))
    print(json.dumps(rep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
