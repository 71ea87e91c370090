"""``tiltlab sim`` (one simulator experiment) and ``tiltlab figures`` (the ten toy figures, PNG + PDF + JSON)."""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import time
from dataclasses import fields
from pathlib import Path

from tiltlab.dataclass_cli import add_dataclass_args, did_you_mean
from tiltlab.files import staging_dir, write_json
from tiltlab.hints import hint


def _add_config_args(p: argparse.ArgumentParser) -> None:
    from tiltlab.sim.config import RENAMED_FIELDS, SimConfig

    add_dataclass_args(p, SimConfig, renamed=RENAMED_FIELDS)


#: environments ``tiltlab sim --env`` builds (:func:`tiltlab.sim.api.make_env`)
ENVS = ("multiprompt", "bandit", "lad_bandit", "two_outcome")


def _cmd_sim(args: argparse.Namespace) -> int:
    from tiltlab.sim.api import make_env, run
    from tiltlab.sim.config import SimConfig

    cfg = SimConfig(**{f.name: getattr(args, f.name) for f in fields(SimConfig)})
    if cfg.env not in ENVS:
        raise ValueError(f"unknown --env {cfg.env!r}{did_you_mean(cfg.env, ENVS)}; choose one of {', '.join(ENVS)}")
    cfg.validate()  # ValueError -> one line, exit 2 (tiltlab.cli.main)
    if args.out:
        _check_writable(Path(args.out))
    res = run(cfg, make_env(cfg))
    h = res.history
    keys = [k for k in h if k != "step"]
    print(f"{cfg.method} (log Z {cfg.log_z}) on {cfg.env}: {cfg.steps} batches, {cfg.seeds} seeds, {res.seconds:.1f} s")
    print("step  " + "  ".join(f"{k:>10s}" for k in keys))
    for i, s in enumerate(h["step"]):
        print(f"{s:<5d} " + "  ".join(f"{h[k][i]:10.4g}" if i < len(h[k]) else " " * 10 for k in keys))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        res.save(args.out)
        print(f"wrote {args.out}")
    return 0


def _check_writable(path: Path) -> None:
    """Refuse an output file that cannot be written, before the run (one line, exit 2)."""
    if path.is_dir():
        raise ValueError(f"--out {path} is a directory; pass a file path such as {path / 'run.json'}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path.parent, prefix=".tiltlab-write-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ValueError(f"cannot write --out {path} ({exc.strerror or exc}); pass a writable path") from None


def resolve_figure_ids(requested: list[str], known: list[str]) -> list[str]:
    """Each requested name -> one figure id: the exact id, the figure number (``fig1``, ``fig01``,
    ``1`` -> ``fig01_...``) or an unambiguous prefix. Unknown or ambiguous names raise ``ValueError``
    listing the candidates, so ``fig1`` never silently means ``fig10``."""
    out: list[str] = []
    for name in requested:
        if name in known:
            out.append(name)
            continue
        m = re.fullmatch(r"(?:fig)?0*(\d+)", name)
        matches = [k for k in known if m and k.startswith(f"fig{int(m.group(1)):02d}_")]
        if not matches:
            matches = [k for k in known if k.startswith(name)]
        if len(matches) == 1:
            out.append(matches[0])
        elif matches:
            raise ValueError(f"figure {name!r} is ambiguous: it matches {', '.join(matches)}; give more of the id")
        else:
            raise ValueError(
                f"unknown figure {name!r}{did_you_mean(name, known)}; known: {', '.join(known)} ({hint('figure_number')})"
            )
    return list(dict.fromkeys(out))


def _read_index(out: Path) -> dict | None:
    """The ``index.json`` of an earlier ``tiltlab figures`` run in ``out`` (None when there is none)."""
    path = out / "index.json"
    if not path.exists():
        return None
    try:
        index = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(
            f"--out {out}: {path} is not a figures index ({exc}); {hint('another_out', path=path)}"
        ) from None
    if not isinstance(index, dict) or not isinstance(index.get("figures"), list):
        raise ValueError(f"--out {out}: {path} is not a figures index; {hint('another_out', path=path)}")
    return index


def _merge_index(old: dict | None, new_entries: list[dict], known: list[str]) -> dict:
    """The index after a run: the entries of this run replace those of the same figures, every other
    figure of ``old`` stays with its own mode, seed and time; entries in report order."""
    by_id = {e["id"]: e for e in (old or {}).get("figures", []) if isinstance(e, dict) and "id" in e}
    by_id.update({e["id"]: e for e in new_entries})
    entries = [by_id[f] for f in known if f in by_id] + [e for f, e in by_id.items() if f not in known]
    modes = {bool(e.get("quick")) for e in entries}
    return {
        "quick": modes.pop() if len(modes) == 1 else "mixed",
        "seconds": sum(float(e.get("seconds", 0.0)) for e in entries),
        "figures": entries,
    }


def _cmd_figures(args: argparse.Namespace) -> int:
    import datetime as dt

    from tiltlab.progress import progress
    from tiltlab.sim.figures import FIGURES, make_all

    known = [fid for fid, _ in FIGURES]
    only = resolve_figure_ids(args.only, known) if args.only else None
    selected = [fid for fid in known if only is None or fid in only]  # report order
    out = Path(args.out if args.out is not None else ("results/quick/figures" if args.quick else "results/figures"))
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; pass a directory")
    old = _read_index(out)
    if args.quick and old is not None:
        full = [e["id"] for e in old["figures"] if not e.get("quick", True)]
        if full:
            raise ValueError(
                f"--out {out} holds full-mode figures ({', '.join(full[:3])}{', ...' if len(full) > 3 else ''}); "
                + hint("quick_over_full", what="them with reduced ones", default="results/quick/figures")
            )
    # The figures are made in a temporary folder next to --out and moved into place, with the index, only when
    # every one of them is complete: an interrupted or failed run leaves the earlier figures and index.json as
    # they were (and no empty --out); the temporary folders of killed runs are removed first.
    t0 = time.perf_counter()
    records, stamps = [], []
    with staging_dir(out) as tmp:
        # progress on stderr (a bar on a terminal, periodic lines elsewhere) plus one line per finished
        # figure; the findings go to stdout at the end
        with progress(total=len(selected), desc="figures", unit="figure") as bar:
            for fid in selected:
                made = make_all(tmp, quick=args.quick, seed=args.seed, only=[fid])
                for rec in made:
                    stamps.append(dt.datetime.now(dt.UTC).isoformat(timespec="seconds"))
                    bar.write(f"[figures] {rec.id}: {rec.seconds:.1f} s")
                records += made
                bar.update(1, postfix=fid)
        out.mkdir(parents=True, exist_ok=True)
        entries = []
        for rec, stamp in zip(records, stamps, strict=True):
            for src in (Path(rec.png), rec.pdf, Path(rec.data)):
                os.replace(src, out / src.name)
            rec.png, rec.data = out / Path(rec.png).name, out / Path(rec.data).name  # rec.pdf follows rec.png
            entry = {"pdf": str(rec.pdf), "quick": bool(args.quick), "seed": args.seed, "made_at": stamp}
            entries.append({**rec.to_json(), **entry})
        index = _merge_index(old, entries, known)
        write_json(out / "index.json", index, indent=1, newline=False)
    total = time.perf_counter() - t0
    for r in records:
        print(f"  {r.id}: {r.seconds:.1f} s -> {r.png} (+ {r.pdf.name})")
        for line in r.findings:
            print(f"      - {line}")
    kept = len(index["figures"]) - len(entries)
    print(
        f"{len(records)} figure(s) in {total:.1f} s; outputs in {out}/ (index: {out / 'index.json'}"
        + (f"; {kept} earlier figure(s) kept with their own mode and time" if kept else "")
        + ")"
    )
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "sim",
        help="run one exact-simulator experiment (sim.SimConfig fields as options)",
        description="Train tabular softmax policies on an enumerable environment with one objective "
        "(TB with exact/frozen/learned/VarGrad log Z, FlowRL, PACED, LAD, GRPO, GSPO) and print the history.",
    )
    _add_config_args(p)
    p.add_argument("--out", default=None, help="write the RunResult as JSON here")
    p.set_defaults(func=_cmd_sim)

    f = subparsers.add_parser(
        "figures",
        help="regenerate the ten toy figures (PNG + PDF + JSON)",
        description="Regenerate the ten toy figures: <id>.png, <id>.pdf and <id>.json (the numbers behind the plot) "
        "per figure, and index.json. Progress goes to stderr: a bar on a terminal, elsewhere one line per figure "
        "(TILTLAB_PROGRESS=bar|lines|off overrides).",
    )
    f.add_argument("--quick", action="store_true", help="reduced versions (each figure's run time: index.json)")
    f.add_argument(
        "--only", nargs="+", default=None, help="figure ids, numbers or unambiguous prefixes, e.g. fig01 7 fig10_lad"
    )
    f.add_argument(
        "--out",
        default=None,
        help="output directory (default: results/figures, and results/quick/figures with --quick, so reduced "
        "figures never replace full ones); --only merges into the folder's index.json",
    )
    f.add_argument("--seed", type=int, default=0, help="base seed (default: 0)")
    f.set_defaults(func=_cmd_figures)
