"""Per-file test durations from a JUnit XML report, for the suite's scheduling hint.

``tests/conftest.py`` runs the test files with the largest recorded duration first: pytest-xdist's
``--dist loadfile`` hands files to the workers in collection order, so a long file collected last
runs alone at the end while the other worker idles. This script writes that record::

    PYTEST_ADDOPTS="--junitxml=/tmp/junit.xml -o junit_family=xunit1" bash .ci/run
    python .ci/durations.py /tmp/junit.xml            # writes tests/durations.json

A testcase's time is its setup, call and teardown together (pytest's default ``junit_duration_report``).
The record only orders files; a file it does not list runs after the listed ones, in collection order.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

from tiltlab.files import write_json

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "durations.json"


def file_seconds(junit: str | os.PathLike) -> dict[str, float]:
    """Seconds per test file (path relative to the repository, as in a node id) from an xunit1 report."""
    totals: dict[str, float] = defaultdict(float)
    for case in ET.parse(junit).getroot().iter("testcase"):
        path = case.get("file")
        if not path:
            raise ValueError(
                f"{junit}: a testcase without a file attribute; write the report with -o junit_family=xunit1"
            )
        totals[Path(path).as_posix()] += float(case.get("time") or 0.0)
    if not totals:
        raise ValueError(f"{junit}: no testcase")
    return {k: round(v, 1) for k, v in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("junit", help="JUnit XML written with -o junit_family=xunit1")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    try:
        seconds = file_seconds(args.junit)
    except (OSError, ET.ParseError, ValueError) as e:
        print(f"durations: {e}", file=sys.stderr)
        return 2
    rec = {
        "about": "seconds per test file in one run of the suite (setup, call and teardown); tests/conftest.py runs "
        "the longest files first. Regenerate with .ci/durations.py",
        "cpu": platform.processor() or platform.machine(),
        "seconds": seconds,
    }
    out = Path(args.out)
    write_json(out, rec, indent=1)
    print(f"{len(seconds)} files, {sum(seconds.values()):.0f} s in all -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
