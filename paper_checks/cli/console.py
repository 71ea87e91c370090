"""What ``tiltlab check`` prints: the table, the counts, the failures with their one-line reproducers."""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tiltlab.dataclass_cli import close_matches
from tiltlab.hints import hint
from tiltlab.paper_checks import catalog
from tiltlab.paper_checks.cli.runner import LAYERS


def reproducer(check, seed: int, claim_dirs: Sequence[Path] = (), modules: Sequence[str] = ()) -> str:
    """The command that re-runs exactly ``check``: the registry's line plus ``--slow`` for a slow
    check and the ``--claims`` / ``--module`` of another project's claims and checks."""
    line = check.reproducer(seed)
    if check.long and "--long" not in line.split():
        line += " --long"
    elif check.slow and "--slow" not in line.split():
        line += " --slow"
    line += "".join(f" --claims {shlex.quote(str(d))}" for d in claim_dirs)
    line += "".join(f" --module {shlex.quote(m)}" for m in modules)
    return line


def _counts_line(rec: dict[str, Any]) -> str:
    """Check counts and claim counts of the record, each labelled (:func:`tiltlab.claims.counts.record_counts`,
    the numbers the report and README show): "137 checks (verified 80, ...) of 70 claims (per claim, ...:
    verified 46, ..., unchecked 1)"."""
    from tiltlab.claims.counts import record_counts

    n = record_counts(rec)
    checks = ", ".join(f"{k} {v}" for k, v in sorted(n.checks.items()))
    per_claim = ", ".join(f"{k} {v}" for k, v in sorted(n.claims.items()))
    return (
        f"{n.n_checks} checks ({checks}) of {n.n_claims} claims "
        f"(per claim, its most informative check's verdict: {per_claim})"
    )


def _not_run_note(claim_id: str) -> str:
    """Why a claim that has checks has no row: the checks are all slow, long or of an opt-in layer, and
    what to add to run them."""
    from tiltlab.claims import registry

    chks = [c for c in registry.checks() if c.claim_id == claim_id]
    if chks and all(c.layer in registry.OPT_IN_LAYERS for c in chks):
        return f"not run: its checks are {chks[0].layer}-layer checks; {hint('add_opt_in_layer', layer=chks[0].layer)}"
    if chks and all(c.long for c in chks):
        return f"not run: its checks are long; {hint('add_long')}"
    return f"not run: its checks are slow; {hint('add_slow')}"


def _print_failures(outs, seed: int, stream=None, claim_dirs=(), modules=()) -> None:
    stream = stream or sys.stdout
    bad = [o for o in outs if not o.ok]
    if not bad:
        return
    from tiltlab.paper_checks.report import FAILED_TITLE

    print(f"\n{FAILED_TITLE}: {len(bad)}", file=stream)
    for o in bad:
        print(f"  FAIL {o.check.key}: {o.failure}", file=stream)
        print(f"       reproduce: {reproducer(o.check, seed, claim_dirs, modules)}", file=stream)


def _short(text: str, width: int = 36) -> str:
    """A citation cut to one table column (the full citation is in the JSON record)."""
    return text if len(text) <= width else text[: width - 1] + "…"


def _table(outs, unchecked, stream=None, not_run=()) -> None:
    stream = stream or sys.stdout
    from tiltlab.claims.registry import cite, get_claim

    rows = []
    for o in outs:
        ev = (
            o.result.summary
            if o.result is not None
            else "CRASHED: " + ((o.error or "").strip().splitlines()[-1:] or ["?"])[0]
        )
        verdict = (
            o.verdict
            if o.ok
            else (
                f"{o.verdict}!={o.check.expected.value}"
                if o.verdict != o.check.expected.value
                else f"{o.verdict}(items!)"
            )
        )
        if o.source == "recorded":
            verdict += " (recorded)"
        rows.append((o.check.claim_id, _short(cite(get_claim(o.check.claim_id))), o.check.layer, verdict, ev))
    for u in unchecked:
        rows.append((u["claim"], _short(u["cite"]), "-", "unchecked", "no check registered"))
    for cid in not_run:
        rows.append((cid, _short(cite(get_claim(cid))), "-", "unchecked", _not_run_note(cid)))
    order = {layer: i for i, layer in enumerate(LAYERS)}
    rows.sort(key=lambda r: (r[0], order.get(r[2], len(order))))  # per claim: theory, sim, data, llm
    if not rows:
        print("no checks selected", file=stream)
        return
    w = [max(len(r[i]) for r in [*rows, ("claim", "source", "layer", "verdict", "")]) for i in range(4)]
    width = shutil.get_terminal_size((200, 24)).columns if stream.isatty() else 200
    ev_w = max(40, width - sum(w) - 8)
    head = ("claim", "source", "layer", "verdict", "evidence")
    print("  ".join(h.ljust(w[i]) if i < 4 else h for i, h in enumerate(head)), file=stream)
    print("  ".join("-" * (w[i] if i < 4 else 8) for i in range(5)), file=stream)
    for r in rows:
        ev = r[4] if len(r[4]) <= ev_w else r[4][: ev_w - 1] + "…"
        print("  ".join(x.ljust(w[i]) for i, x in enumerate(r[:4])) + "  " + ev, file=stream)


def _empty_selection(prefix: str | None, layer: str | None, name: str | None, slow: bool) -> str:
    """Why nothing was selected, and what to pass instead (one line)."""
    from tiltlab.claims import registry

    all_checks = registry.checks()
    layers_with_checks = [x for x in LAYERS if any(c.layer == x for c in all_checks)]
    if layer and layer not in layers_with_checks:
        skipped = "".join(
            f"; check module {m} was skipped ({why})" for m, why in sorted(catalog.SKIPPED_MODULES.items())
        )
        return (
            f"no {layer} checks exist yet (layers with checks: {', '.join(layers_with_checks)}); "
            f"{hint('use_data_layer')}{skipped}"
        )
    if (
        not slow
        and registry.select(prefix, layer, True)
        and (not name or any(c.name == name for c in registry.select(prefix, layer, True)))
    ):
        return f"the selected checks are all slow: {hint('add_slow')}"
    longs = [c for c in registry.select(prefix, layer, True, include_long=True) if not name or c.name == name]
    if longs and all(c.long for c in longs):
        return f"the selected checks are all long: {hint('add_long')}"
    opt_in = [
        c
        for c in registry.select(prefix, None, True, include_llm=True)
        if c.layer in registry.OPT_IN_LAYERS and (not name or c.name == name) and not layer
    ]
    if opt_in:
        return f"--only {prefix} selects only {opt_in[0].layer}-layer checks, which run only when named: " + hint(
            "add_opt_in_layer", layer=opt_in[0].layer
        )
    what = " ".join(
        f"{flag} {value}" for flag, value in (("--only", prefix), ("--layer", layer), ("--check", name)) if value
    )
    return f"no check matches {what}{_close_selection(prefix, name)}; {hint('list_checks')}"


def _close_selection(prefix: str | None, name: str | None) -> str:
    """The close matches of a mistyped ``--only`` (among the claim ids and their dotted prefixes) and
    ``--check`` (among the check names): `` (did you mean --only disa.prop1?)``, or ``""``."""
    from tiltlab.claims import registry

    found = []
    ids = list(registry.claims())
    if prefix and not any(cid.startswith(prefix) for cid in ids):
        prefixes = {".".join(cid.split(".")[:i]) for cid in ids for i in range(1, cid.count(".") + 2)}
        found += [f"--only {m}" for m in close_matches(prefix, sorted(prefixes), n=1)]
    names = sorted({c.name for c in registry.checks()})
    if name and name not in names:
        found += [f"--check {m}" for m in close_matches(name, names, n=1)]
    return f" (did you mean {', '.join(found)}?)" if found else ""


def _list(chks, unchecked=(), recorded=(), scope=()) -> None:
    """``tiltlab check --list``: one row per check the run would write (the selected checks, then the
    shipped llm record's rows it would merge, marked recorded) and per counted claim without one
    (:func:`tiltlab.claims.counts.claims_counted`: the claims ``tiltlab check`` would count), nothing run."""
    from tiltlab.claims.counts import claims_counted

    rows = [(c.claim_id, c.name, c.layer, "long" if c.long else "slow" if c.slow else "") for c in chks]
    rows += [(str(r["claim"]), str(r["check"]), str(r["layer"]), "recorded") for r in recorded]
    listed = {r[0] for r in rows}
    no_check = {u["claim"] for u in unchecked}
    claims = claims_counted(scope, listed)
    rows += [
        (cid, "(no check yet)" if cid in no_check else f"({_not_run_note(cid)})", "-", "")
        for cid in claims
        if cid not in listed
    ]
    head = ("claim", "check", "layer", "slow")
    w = [max(len(r[i]) for r in [*rows, head]) for i in range(3)]
    print("  ".join(h.ljust(w[i]) if i < 3 else h for i, h in enumerate(head)).rstrip())
    for r in rows:
        print("  ".join(x.ljust(w[i]) if i < 3 else x for i, x in enumerate(r)).rstrip())
    n_checks = len(chks) + len(recorded)
    without = len(claims) - len(listed)
    print(
        f"{n_checks} checks of {len(claims)} claims: {len(chks)} to run ({sum(c.slow for c in chks)} slow)"
        + (f", {len(recorded)} recorded (the shipped llm record's, not re-run)" if recorded else "")
        + (f"; {without} claim(s) without a check to run" if without else "")
        + "; none run"
    )


def _report_check(args, outs, unchecked, rec, seconds, recorded=(), n_kept=0, rerendered=None) -> None:
    if args.json:
        json.dump(rec, sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
        _print_failures(outs, args.seed, sys.stderr, args.claims, args.module)
    else:
        from tiltlab.claims.counts import record_counts
        from tiltlab.claims.rows import outcomes_from_rows

        _table([*outs, *outcomes_from_rows(recorded)], unchecked, not_run=record_counts(rec).not_run)
        print(
            f"\n{_counts_line(rec)}; ran {len(outs)} in {seconds:.1f} s; {rec['summary']['failures']} changed/crashed."
        )
        print(f"record written to {args.out}")
        if recorded:
            r0 = recorded[0]
            print(
                f"note: {len(recorded)} llm check(s) shown as 'recorded' come from the shipped record of the last full "
                f"llm-layer run (commit {r0.get('commit')}, {r0.get('run_at')}), not re-run; " + hint("llm_rows_check")
            )
        if n_kept:
            print(
                f"note: merged into the existing record: {n_kept} check(s) kept from earlier runs with their own "
                f"time, mode and commit ({hint('merged_into_record')})"
            )
        if rerendered is not None:
            print(f"report rewritten from the merged record: {rerendered}")
        for m, why in rec["skipped_modules"].items():
            print(f"note: check module {m} was skipped ({why})")
        _print_failures(outs, args.seed, None, args.claims, args.module)
