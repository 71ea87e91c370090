"""What a deferred import saves: the import time of each package the light modules of ``llm/`` defer, and of
the three entry points they keep light (docs/architecture.md "Deferred imports").

Each number is the median wall time of ``--repeats`` fresh interpreters (``python -c "import X"``) minus the
median of an empty interpreter (``python -c pass``), so it is the import alone, on a warm file cache (one
unmeasured run first). The packages are the third-party ones that a light module defers
(``tests/import_rules.py``'s survey); the entry points are ``tests/import_rules.py``'s.

    python benchmarks/import_cost.py --repeats 5 --out results/import_cost.json

prints a Markdown table (what docs/architecture.md quotes) and writes the raw times as JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import import_rules as rules  # noqa: E402  (the rule's own survey names what to time)


def wall(code: str) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], cwd="/", check=True, capture_output=True)
    return time.perf_counter() - t


def median_wall(code: str, repeats: int) -> tuple[float, list[float]]:
    wall(code)  # warm the file cache
    runs = [wall(code) for _ in range(repeats)]
    return statistics.median(runs), runs


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None, help="JSON file for the raw times")
    args = ap.parse_args(argv)
    allowed, _ = rules.survey()
    light = sorted(
        {
            t.split(".")[0]
            for d, why in allowed
            if why.startswith("light")
            for t in d.target.split(", ")
            if not t.startswith("tiltlab")
        }
    )
    base, _ = median_wall("pass", args.repeats)
    rows, raw = [], {"python": base}
    for pkg in light:
        t, runs = median_wall(f"import {pkg}", args.repeats)
        raw[pkg] = runs
        rows.append((f"`import {pkg}`", max(t - base, 0.0)))
    rows.sort(key=lambda r: -r[1])
    t, runs = median_wall("import " + ", ".join(light), args.repeats)
    raw["all deferred packages"] = runs
    rows.append(("all of them together (what the light entry points would load with these at the top)", t - base))
    entries = {**rules.LIGHT_ENTRIES, rules.BASE_ENTRY: rules.BASE_ENTRY}
    for label, code in entries.items():
        t, runs = median_wall(code, args.repeats)
        raw[label] = runs
        rows.append((f"{label} (`{code}`)", t - base))
    print(f"CPU: {cpu_name()}; Python {platform.python_version()}; median of {args.repeats} fresh interpreters")
    print("| import | seconds |\n| --- | ---: |")
    for name, t in rows:
        print(f"| {name} | {t:.2f} |")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"cpu": cpu_name(), "repeats": args.repeats, "wall_s": raw}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
