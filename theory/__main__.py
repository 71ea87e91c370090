"""``python -m tiltlab.theory [PREFIX] [--seed N]``: run every theory check, one line per check.

Each line: ``claim [check] verdict (expected ...) seconds | evidence``. Exit status 1 if a
verdict differs from the recorded ``expected`` or a check crashed, else 0.
"""

from __future__ import annotations

import argparse
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tiltlab.theory", description=__doc__.splitlines()[0])
    ap.add_argument("prefix", nargs="?", default=None, help="only claims whose id starts with this")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    from tiltlab.claims.registry import run_checks

    t0 = time.perf_counter()
    progress = None
    if sys.stderr.isatty():
        progress = lambda c: print(f"... {c.claim_id} [{c.name}]\033[K", end="\r", file=sys.stderr, flush=True)
    outs = run_checks(args.prefix, layer="theory", seed=args.seed, progress=progress)
    bad = 0
    for o in outs:
        mark = "ok " if o.ok else "CHANGED" if o.result is not None else "ERROR"
        summ = o.result.summary if o.result is not None else (o.error or "").strip().splitlines()[-1]
        print(
            f"{mark} {o.check.claim_id} [{o.check.name}] {o.verdict} (expected {o.check.expected.value}) "
            f"{o.seconds:.2f}s | {summ}"
        )
        bad += not o.ok
    print(f"{len(outs)} theory checks, {bad} changed/errored, {time.perf_counter() - t0:.1f}s total", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
