"""``tiltlab check``."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from tiltlab.hints import hint
from tiltlab.paper_checks.cli import runner  # _select and _run through the module: tests replace them there
from tiltlab.paper_checks.cli.console import _empty_selection, _list, _report_check
from tiltlab.paper_checks.cli.records import (
    _check_writable_file,
    _provenance,
    _record,
    _rule_hashes,
    _runtime,
    _unchecked,
    _write_json,
)
from tiltlab.paper_checks.cli.runner import LAYERS, _load_extra

# --------------------------------------------------------------------------- tiltlab check


def _cmd_check(args: argparse.Namespace) -> int:
    prefix, layer = args.only, args.layer
    if prefix in LAYERS:
        if layer and layer != prefix:
            raise ValueError(f"--only {prefix} (a layer) conflicts with --layer {layer}; {hint('only_or_layer')}")
        prefix, layer = None, prefix
    t0 = time.perf_counter()
    try:
        _load_extra(args.claims, args.module)
    except ImportError as exc:
        raise ValueError(f"--module: {exc} (the module must be importable from the current directory)") from None
    long_ = bool(getattr(args, "long", False))
    chks = runner._select(prefix, layer, args.check, args.slow, include_long=long_)
    unchecked = [] if (layer or args.check) else _unchecked(prefix)
    if not chks and not unchecked:
        raise ValueError(_empty_selection(prefix, layer, args.check, args.slow or long_))
    sel = {
        "only": prefix,
        "layer": layer,
        "check": args.check,
        "slow": bool(args.slow),
        "long": long_,
        "claims": [str(d) for d in args.claims],
        "module": list(args.module),
    }
    from tiltlab.claims import merging
    from tiltlab.claims.llm_record import recorded_llm_rows

    if args.list:  # what a run into a new --out would write and count
        from tiltlab.claims import registry
        from tiltlab.claims.counts import selection_scope

        shipped = recorded_llm_rows()[0]
        keys = [c.key for c in chks]
        recorded = merging.check_run_rows(None, keys, shipped, prefix=prefix, layer=layer, name=args.check).recorded
        _list(chks, unchecked, recorded, selection_scope(sel, registry.claims()))
        return 0
    _check_writable_file(args.out)  # before any check runs
    from tiltlab.claims.rows import read_record

    # a non-record --out is refused before any run, with --replace too: that writes over a record, not a user's file
    old = read_record(args.out, "--out", hint("another_out", path=args.out))
    old = None if args.replace else old
    prov = _provenance(_check_command(args), "check", bool(args.slow) or long_, args.seed)
    hashes = _rule_hashes(chks)  # the rule files as this run finds them, with the commit it runs at
    outs = runner._run(chks, args.seed, progress=True, jobs=args.jobs)
    seconds = time.perf_counter() - t0
    # the old record's rows not re-run, and the last full llm-layer run shipped with the repository merged
    # as recorded (not re-run): the merge policy is the claims core's (tiltlab.claims.merging)
    rows = merging.check_run_rows(
        old, [o.check.key for o in outs], recorded_llm_rows()[0], prefix=prefix, layer=layer, name=args.check
    )
    kept, recorded = rows.kept, rows.recorded
    rec = _record(outs, unchecked, args.seed, sel, seconds, args.claims, args.module, prov, kept, recorded, hashes)
    rec["runtime"] = _runtime(seconds)
    merging.merge_record_header(rec, old, unchecked, prov["run_at"])
    _write_json(args.out, rec)
    rerendered = _rerender_report(args.out, rec) if old else None
    rc = 1 if rec["summary"]["failures"] else 0
    try:
        _report_check(args, outs, unchecked, rec, seconds, recorded, len(kept), rerendered)
    except BrokenPipeError:  # e.g. `tiltlab check | head`: the record is written, keep the exit status
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return rc


def _check_command(args: argparse.Namespace) -> str:
    """The ``tiltlab check`` command line of this run (without ``--out``/``--json``/``--jobs``)."""
    parts = ["tiltlab check"]
    for flag, value in (("--only", args.only), ("--layer", args.layer), ("--check", args.check)):
        if value:
            parts.append(f"{flag} {shlex.quote(value)}")
    if args.slow:
        parts.append("--slow")
    if getattr(args, "long", False):
        parts.append("--long")
    if args.seed:
        parts.append(f"--seed {args.seed}")
    return " ".join(parts)


def _rerender_report(out: Path, rec: dict[str, Any]) -> Path | None:
    """After merging into a ``tiltlab reproduce`` record, rewrite its REPORT.md and report.html from
    the merged record, so the report never disagrees with the record next to it."""
    folder = out.parent
    if "figures" not in rec or out.name != "claims.json" or not (folder / "REPORT.md").is_file():
        return None
    from tiltlab.paper_checks.report import report_input_from_record, write_report

    write_report(report_input_from_record(rec, folder))
    return folder / "REPORT.md"
