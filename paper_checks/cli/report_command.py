"""``tiltlab report``: work from a record (re-render, export, re-derive, ship, pre-register, regenerate docs)."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from tiltlab.claims import pinned
from tiltlab.files import write_text
from tiltlab.hints import hint
from tiltlab.paper_checks import catalog
from tiltlab.paper_checks.cli.records import _check_writable_file
from tiltlab.paper_checks.cli.runner import _ALL_LLM, COSTS_FILE

# --------------------------------------------------------------------------- tiltlab report


def _with_recorded_llm(rec: dict[str, Any]) -> dict[str, Any]:
    """``rec`` plus the shipped llm record's rows (as ``recorded``) when it has no llm rows."""
    from tiltlab.claims.llm_record import recorded_llm_rows

    if any(r.get("layer") == "llm" for r in rec.get("checks", [])):
        return rec
    rows, _ = recorded_llm_rows()
    return {**rec, "checks": [*rec.get("checks", []), *rows]} if rows else rec


def _rejudge(path: Path) -> int:
    """``tiltlab report --rejudge FILE``: each row re-derived bottom up from its raw values
    (:mod:`tiltlab.claims.rejudge`): a table of recorded against re-derived verdicts, then every field
    that does not follow, named; 1 on a difference."""
    from tiltlab.claims.rejudging import rejudge_rows
    from tiltlab.claims.rows import read_record, respecified_views

    rec = read_record(path, "--rejudge", hint("record_to_rejudge"))
    if rec is None:
        raise FileNotFoundError(f"--rejudge {path}: no such file")
    catalog.discover()  # the checks' re-derivations of their item values from their raw values
    rows = rejudge_rows(rec.get("checks", []))
    w = max([len(str(r["claim"])) for r in rows] + [5])
    print(
        f"{'claim':<{w}}  {'layer':<6} {'recorded':<13} {'re-derived':<13} {'other threshold':<16} {'status':<8} from"
    )
    for r in rows:
        print(
            f"{r['claim']:<{w}}  {r['layer']:<6} {r['recorded']:<13} {r['rejudged'] or '-':<13} "
            f"{r['other_threshold'] or '-':<16} {r['status']:<8} {r['from'] or '-'}"
        )
    n = {k: sum(r["status"] == k for r in rows) for k in ("same", "differs", "no raw values")}
    for r in rows:
        for line in r["differences"]:
            print(f"differs: {r['claim']} [{r['layer']}:{r['check']}] {line}")
    from tiltlab.claims import prereg
    from tiltlab.claims.rejudge import per_experiment

    checks = rec.get("checks", [])
    fam = per_experiment(checks, prereg.shared_runs())
    shared = [(r, f) for r, f in zip(checks, fam) if f is not None and len(f["family"]) > 1]
    moved = [(r, f) for r, f in shared if f["verdict"] != r.get("verdict")]
    if shared:
        print(
            f"\none Holm family per experiment (the [[shared_run]] tables of {prereg.PREREG_PATH}; the registered "
            f"rule is one family per check): {len(moved)} of {len(shared)} verdicts of shared runs move"
            + "".join(f"\n  {r['claim']}: {r.get('verdict')} -> {f['verdict']}" for r, f in moved)
        )
    views = [(r, v) for r in checks for v in respecified_views(r)]
    if views:
        print(f"\nre-specified claims ([[respecification]] in {prereg.PREREG_PATH}): each run under both item sets")
        for r, v in views:
            print(
                f"  {r['claim']}: recorded {r.get('verdict')}; under the items registered now {v['now']}, under the "
                f"items before {v['before'][:7]} {v['earlier']}"
            )
    print(
        f"\n{len(rows)} rows: {n['same']} re-derived as recorded, {n['differs']} differ, "
        f"{n['no raw values']} without raw values (deterministic checks or rows recorded before raw values were kept)"
    )
    return 1 if n["differs"] else 0


def _cmd_report(args: argparse.Namespace) -> int:
    from tiltlab.claims import llm_record, pinning, rows
    from tiltlab.paper_checks import report as P

    if args.ship_llm is not None or args.set_llm_expectations:
        catalog.discover()  # both need every registered check (the llm layer's included)
    if args.ship_llm is not None:
        dest = args.out or llm_record.llm_record_path()
        shipped = llm_record.ship_llm_record(
            args.ship_llm, dest, machine_desc=args.machine, run_seconds=args.run_seconds
        )
        commits = sorted({str(r["commit"]) for r in shipped["checks"]})
        print(
            f"shipped llm record written to {dest}: {len(shipped['checks'])} checks, run at commit(s) "
            f"{', '.join(commits)}, each strictly pre-registered; registry hash {shipped['registry_hash']}"
        )
        return 0
    if args.set_llm_expectations:
        dest = args.out or llm_record.llm_record_path()
        rec = llm_record.set_llm_expectations(dest)
        bad = [rows.row_key(r) for r in rec["checks"] if not r["ok"]]
        print(
            f"{dest}: expectations of {len(rec['checks'])} rows set from the registry (registry hash "
            f"{rec['registry_hash']}); {len(bad)} row(s) do not meet them" + (f": {', '.join(bad)}" if bad else "")
        )
        return 1 if bad else 0
    if args.preregister is not None:
        return _preregister(args.preregister)
    if args.rejudge is not None:
        return _rejudge(args.rejudge)
    rec = rows.read_record(args.record, "--record", hint("record_for_report", path=args.record))
    if rec is None:
        raise FileNotFoundError(f"--record {args.record}: no such file; {hint('no_record_yet')}")
    if args.pin:
        from tiltlab.claims import registry

        dest = args.out or pinned.pins_file()
        n_checks, n_nums = pinning.write_pins(rec, dest, rtol=args.pin_rtol, llm_rec=llm_record.load_llm_record())
        print(f"pinned {n_nums} numbers of {n_checks} checks (rtol {args.pin_rtol:g}) in {dest}")
        return 0
    if args.costs:
        dest = args.out or COSTS_FILE
        n = pinning.write_costs(rec, dest)
        print(f"run times of {n} checks written to {dest}")
        return 0
    rec = _with_recorded_llm(rec)
    if args.format:
        from tiltlab.claims import registry

        catalog.discover()
        text = P.render_table(
            P.claim_table(registry.claims(), rows.outcomes_from_rows(rec["checks"]), rec.get("commit")), args.format
        )
        if args.out:
            _check_writable_file(args.out)
            write_text(args.out, text)
            print(f"per-claim table ({args.format}) written to {args.out}")
        else:
            sys.stdout.write(text)
        return 0
    if args.docs:
        return _write_docs(args, rec)
    if "figures" not in rec:
        raise ValueError(
            f"--record {args.record} is a `tiltlab check` record (no figures); {hint('report_needs_reproduce')}"
        )
    md, ht = P.write_report(P.report_input_from_record(rec, args.record.parent))
    print(f"report rewritten from {args.record}: {md}, {ht}")
    return 0


def _preregister(check: str) -> int:
    """``tiltlab report --preregister [CHECK]``: the registered rule files' hashes of CHECK (or every
    ``[[rule]]``) rewritten in paper_checks/preregistration.toml, atomically, other lines kept."""
    from tiltlab.claims import prereg

    path = prereg.prereg_file()
    text, changed = prereg.preregister_text(
        path.read_text(encoding="utf-8"), None if check == _ALL_LLM else [check], path.parents[1]
    )
    write_text(path, text)
    by_check = Counter(c for c, _ in changed)
    what = ", ".join(f"{c}: {n} file(s) changed" for c, n in sorted(by_check.items())) or "no hash changed"
    print(
        f"rule-file hashes written to {path} ({what}); commit it, then run: the registration commit "
        "must be a strict ancestor of the run's commit"
    )
    return 0


def _write_docs(args: argparse.Namespace, rec: dict[str, Any]) -> int:
    """``tiltlab report --docs``: README's results and timings sections, docs/llm-checks.md's last run,
    benchmarks/README.md's GPU section (in a checkout)."""
    from tiltlab.claims import llm_record, rows
    from tiltlab.paper_checks import gpu_record
    from tiltlab.paper_checks import report as P

    root = Path(__file__).resolve().parents[2]
    readme = args.readme or root / "README.md"
    llm_rec = llm_record.load_llm_record()
    timing_recs = [rec]
    for path in args.timings:
        other = rows.read_record(path, "--timings", hint("record_for_timings"))
        if other is None:
            raise FileNotFoundError(f"--timings {path}: no such file")
        timing_recs.append(other)
    text = readme.read_text(encoding="utf-8")
    text = P.replace_section(text, "results", P.results_section(rec, llm_rec), str(readme))
    text = P.replace_section(text, "timings", P.timings_section(timing_recs, llm_rec), str(readme))
    written = [readme]
    llm_doc = root / "docs" / "llm-checks.md"
    new_llm = None
    if llm_rec is not None and args.readme is None and llm_doc.is_file():
        new_llm = P.replace_section(
            llm_doc.read_text(encoding="utf-8"), "llm-run", P.llm_run_section(llm_rec), str(llm_doc)
        )
        new_llm = P.replace_section(new_llm, "llm-items", P.item_rules_section("llm"), str(llm_doc))
        new_llm = P.replace_section(new_llm, "llm-posthoc", P.posthoc_section(llm_rec), str(llm_doc))
    gpu = gpu_record.rendered_readme(root) if args.readme is None else None
    write_text(readme, text)  # after every section rendered: nothing half-written on an error
    if new_llm is not None:
        write_text(llm_doc, new_llm)
        written.append(llm_doc)
    if gpu is not None:
        write_text(*gpu)
        written.append(gpu[0])
    print("generated sections rewritten in " + ", ".join(str(w) for w in written))
    return 0
