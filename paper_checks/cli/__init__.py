"""``tiltlab check`` and ``tiltlab reproduce``.

``tiltlab check`` runs every fast check (theory, sim, data; ``--slow`` adds the slow ones; the opt-in
``llm`` layer runs only with ``--layer llm``),
prints one row per check (claim, source as "DISA §2.2 eq. (10)", layer, verdict, one line of
evidence) plus one row per declared claim that has no check yet, merges them into ``results/claims.json`` (a
partial run never shrinks the record: rows of checks not run now are kept with their own time, mode and
commit; ``--replace`` writes this run only) and exits non-zero only
when a check returns a verdict other than the one recorded as expected for it, or crashes. The llm-layer
rows come from the shipped record of its last full run, marked ``recorded`` (:mod:`.record`).
Each failure is followed by the command that re-runs just that check. Arguments are checked
before any check runs: an empty selection, ``--jobs`` < 1 or an ``--out`` that cannot be written
is an error (exit 2) and leaves the record untouched. ``--list`` prints the selection only.

``tiltlab reproduce`` runs all checks (``--llm`` re-runs the llm layer instead of merging its shipped record) and all
simulator figures and writes ``claims.json``, ``REPORT.md`` and a self-contained ``report.html`` (figures embedded)
into ``--out`` (``results/``; ``results/quick/`` with ``--quick``), through a temporary folder moved into place at the
end. ``tiltlab report`` works from a record: the report again, the per-claim table (csv, latex, md), the README's
generated sections, and stamping the shipped llm record.

The package, one module per concern: :mod:`.parsers` (the argument parsers), :mod:`.runner` (selecting and
running checks), :mod:`.records` (a run's record), :mod:`.console` (what ``check`` prints), :mod:`.check`,
:mod:`.reproduce` and :mod:`.report_command` (the three commands). This module re-exports what the rest of the
project uses.
"""

from __future__ import annotations

from tiltlab.paper_checks.cli.console import _print_failures, reproducer
from tiltlab.paper_checks.cli.parsers import register
from tiltlab.paper_checks.cli.records import _claim_verdicts
from tiltlab.paper_checks.cli.reproduce import _collect_figures, _start_figures_in_background, environment, make_figures
from tiltlab.paper_checks.cli.runner import (
    COSTS_FILE,
    LAYERS,
    RUN_CACHE_ENV,
    _run,
    _run_cache,
    _run_checks,
    _select,
    check_costs,
    longest_first,
)

__all__ = [
    "COSTS_FILE",
    "LAYERS",
    "RUN_CACHE_ENV",
    "_claim_verdicts",
    "_collect_figures",
    "_print_failures",
    "_run",
    "_run_cache",
    "_run_checks",
    "_select",
    "_start_figures_in_background",
    "check_costs",
    "environment",
    "longest_first",
    "make_figures",
    "register",
    "reproducer",
]
