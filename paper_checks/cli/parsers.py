"""The argument parsers of ``tiltlab check``, ``tiltlab reproduce`` and ``tiltlab report`` (:func:`register`)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from tiltlab.paper_checks.cli.check import _cmd_check
from tiltlab.paper_checks.cli.report_command import _cmd_report
from tiltlab.paper_checks.cli.reproduce import _cmd_reproduce
from tiltlab.paper_checks.cli.runner import _ALL_LLM, LAYERS

_CHECK_HELP = """Run the claim checks and compare every verdict with the one recorded as expected.

The llm-layer checks (small real models trained on CPU, all slow) run only when asked for:
`--layer llm --slow` (or `--only llm --slow`); otherwise their last full run, shipped with the
project, is merged and marked "recorded" (not re-run; never affects the exit status).

The record is merged, never shrunk: a partial run replaces the rows of the checks it ran and keeps
the others, each with the time, command, mode and commit of its run; --replace writes this run only.
An --out that is not a tiltlab record is refused (with --replace too).
A check that records expected per-item outcomes fails when an item changes, even if its verdict
does not.

Exit status: 0 when every selected check returns its expected verdict (a claim that is
refuted and stays refuted is green); 1 when a verdict changed or a check crashed; 2 on
bad arguments (an empty selection included; the record is then left untouched). Failing
checks are followed by a reproducer line. --list prints the selection without running it."""

_REPRO_HELP = """Run all checks and all simulator figures and write the report:
OUT/claims.json, OUT/figures/*.png|json, OUT/REPORT.md and OUT/report.html (self-contained).

Everything is written into a temporary folder next to OUT and moved into place at the end, so an
interrupted run leaves the previous outputs. --quick writes to results/quick/ by default and refuses
an OUT that holds a full run. The llm layer comes from its shipped record (marked recorded) unless --llm."""


_REPORT_HELP = """Work from a record instead of re-running checks.

  tiltlab report                      rewrite REPORT.md and report.html next to a reproduce record
  tiltlab report --format csv|latex|md  the per-claim table (claim, paper, section, verdict, deciding
                                      layers, key numbers with CIs, commit, source) on stdout or --out
  tiltlab report --docs               rewrite the generated sections of README.md and docs/llm-checks.md
  tiltlab report --ship-llm FILE      ship a full llm-layer run as the shipped llm record (refused
                                      unless every row is strictly pre-registered, see --preregister)
  tiltlab report --preregister [CHECK]  write the sha256 of CHECK's (default: all llm checks') rule
                                      files into paper_checks/preregistration.toml
  tiltlab report --rejudge FILE       re-derive every verdict of a record from its raw per-unit
                                      values; exit 1 when one differs from the recorded verdict

The llm-layer checks of the shipped record are merged (marked recorded) into a record that lacks them."""


#: ``tiltlab report --preregister`` without a check name: every ``[[rule]]`` of the file.


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "check",
        help="run the claim checks (theory + sim + data)",
        description=_CHECK_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--only", metavar="PREFIX", help="claim-id prefix (e.g. disa.prop1) or a layer name (theory, sim, data, llm)"
    )
    p.add_argument("--layer", choices=LAYERS, help="only checks of this layer")
    p.add_argument("--check", metavar="NAME", help="only the check with this name (as printed in reproducer lines)")
    p.add_argument("--seed", type=int, default=0, help="seed passed to every check (default 0)")
    p.add_argument("--slow", action="store_true", help="include checks marked slow")
    p.add_argument(
        "--long",
        action="store_true",
        help="include checks marked long (the longest llm-layer runs; never part of a layer's run; implies --slow)",
    )
    p.add_argument("--json", action="store_true", help="print the JSON record to stdout instead of the table")
    p.add_argument(
        "--list", action="store_true", help="print the selected checks (claim, check, layer, slow) and run none"
    )
    p.add_argument(
        "--jobs",
        type=_positive_int,
        default=min(2, os.cpu_count() or 1),
        help="run checks in this many forked processes (default: min(2, CPUs); 1 = in this process); llm-layer "
        "checks run one at a time, each with its seeds in this many processes",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("results/claims.json"),
        help="where to write the JSON record (default results/claims.json)",
    )
    p.add_argument(
        "--claims",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="also read [[claim]] TOML files from DIR (repeatable; for your own project's claims)",
    )
    p.add_argument(
        "--module",
        action="append",
        default=[],
        metavar="NAME",
        help="also import this module, which registers checks with paper_checks.register_check (repeatable; "
        "the current directory is importable)",
    )
    p.add_argument(
        "--replace",
        action="store_true",
        help="write only this run's checks to --out, over an existing record (default: merge into it, keeping the "
        "rows of checks not run now with their own time, mode and commit); a file that is not a record is never "
        "overwritten",
    )
    p.set_defaults(func=_cmd_check)

    r = subparsers.add_parser(
        "reproduce", help="all checks + all simulator figures -> REPORT.md and report.html", description=_REPRO_HELP
    )
    r.add_argument(
        "--quick",
        action="store_true",
        help="reduced figure settings, skip the slow checks (measured run times: README's timings table, from records)",
    )
    r.add_argument(
        "--llm",
        action="store_true",
        help="also run the llm-layer checks (small real models trained on CPU, slow: the shipped llm record gives "
        "its run's wall time; needs the [llm] extra)",
    )
    r.add_argument("--seed", type=int, default=0, help="seed for every check and figure (default 0)")
    r.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output directory (default results/, and results/quick/ with --quick so a quick run never replaces a "
        "full one)",
    )
    r.add_argument(
        "--jobs",
        type=_positive_int,
        default=min(2, os.cpu_count() or 1),
        help="processes: figures run in JOBS-1 worker processes while the checks run (default: min(2, CPUs))",
    )
    r.set_defaults(func=_cmd_reproduce)

    t = subparsers.add_parser(
        "report",
        help="the report, the per-claim table (csv, latex, md) or the README sections, from a record",
        description=_REPORT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    t.add_argument(
        "--record",
        type=Path,
        default=Path("results/claims.json"),
        help="the record to read (default results/claims.json, written by tiltlab reproduce / check)",
    )
    t.add_argument("--format", choices=("csv", "latex", "md"), help="print the per-claim table in this format")
    t.add_argument("--out", type=Path, help="write the table here instead of stdout (--format), or the shipped record")
    t.add_argument(
        "--docs",
        action="store_true",
        help="rewrite the generated sections of README.md (counts, verdict table, timings) and docs/llm-checks.md",
    )
    t.add_argument(
        "--timings",
        type=Path,
        action="append",
        default=[],
        metavar="RECORD",
        help="with --docs: records whose run times fill the timings table (repeatable; default: --record)",
    )
    t.add_argument("--readme", type=Path, default=None, help="with --docs: the README to rewrite (default: the repo's)")
    t.add_argument(
        "--ship-llm",
        type=Path,
        metavar="RECORD",
        help="stamp the record of a full llm-layer run and write it as the shipped llm record "
        "(paper_checks/records/llm.json, or --out)",
    )
    t.add_argument(
        "--set-llm-expectations",
        action="store_true",
        help="after an llm-layer run under a new rule, once its expectations are set from it in the checks' code: "
        "give the shipped llm record (or --out) today's expected verdicts and items, ok flags and registry hash "
        "(the run's verdicts, items and numbers are not touched)",
    )
    t.add_argument(
        "--rejudge",
        type=Path,
        metavar="RECORD",
        help="re-derive every verdict of RECORD (a claims.json or the shipped llm record) from its raw per-unit "
        "values with the one decision rule; exit 1 when a recorded verdict is not what its values give",
    )
    t.add_argument(
        "--preregister",
        nargs="?",
        const=_ALL_LLM,
        metavar="CHECK",
        help="write the sha256 of the rule files of CHECK (default: every registered llm check) into "
        "paper_checks/preregistration.toml; commit it before the run that decides the rule",
    )
    t.add_argument(
        "--pin",
        action="store_true",
        help="write the numbers of the record's theory, sim and data checks as the pinned numbers "
        "(paper_checks/pins.json, or --out) with a relative tolerance of --pin-rtol",
    )
    t.add_argument(
        "--pin-rtol",
        type=float,
        default=1e-4,
        help="with --pin: relative tolerance of every pinned number (default 1e-4; absolute floor 1e-9)",
    )
    t.add_argument(
        "--costs",
        action="store_true",
        help="write the run times of the record's theory, sim and data checks (from a `tiltlab check --jobs 1` run) "
        "as the costs by which `tiltlab check` starts the longest checks first (paper_checks/costs.json, or --out)",
    )
    t.add_argument("--machine", help="with --ship-llm: the machine that ran it (default: the record's)")
    t.add_argument("--run-seconds", type=float, help="with --ship-llm: its wall time (default: the record's)")
    t.set_defaults(func=_cmd_report)


# --------------------------------------------------------------------------- shared


def _positive_int(text: str) -> int:
    """argparse type of ``--jobs``: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 (1 = run in this process), got {value}")
    return value
