"""benchmarks/README.md's GPU section, written from benchmarks/records/gpu.json (the record of
benchmarks/gpu/run.py, or the committed "not run yet" record) by
:mod:`tiltlab.paper_checks.gpu_record`, which ``tiltlab report --docs`` runs too.

    python benchmarks/gpu/report.py            # rewrite the section
    python benchmarks/gpu/report.py --check    # exit 1 when the section differs from the record
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tiltlab.paper_checks.gpu_record import readme_path, record_path, rendered_readme

REPO = Path(__file__).resolve().parents[2]


def update_readme(root: Path = REPO, check: bool = False) -> bool:
    """Rewrite (or, with ``check``, compare) the section; True when it already matched."""
    got = rendered_readme(root)
    if got is None:
        raise FileNotFoundError(f"{record_path(root)} or {readme_path(root)} is missing")
    readme, new = got
    same = new == readme.read_text(encoding="utf-8")
    if not same and not check:
        readme.write_text(new, encoding="utf-8")
    return same


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--root", type=Path, default=REPO, help="the checkout (default: this one)")
    p.add_argument("--check", action="store_true", help="exit 1 when the section differs from the record")
    args = p.parse_args(argv)
    same = update_readme(args.root, check=args.check)
    readme, record = readme_path(args.root), record_path(args.root)
    if args.check and not same:
        print(f"{readme}: the GPU section differs from {record}; run python benchmarks/gpu/report.py")
        return 1
    print(f"{readme}: GPU section {'unchanged' if same else 'rewritten'} from {record}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
