"""benchmarks/README.md's GPU section, written from benchmarks/records/gpu.json (the record of
benchmarks/gpu/run.py, or the committed "not run yet" record).

    python benchmarks/gpu/report.py            # rewrite the section
    python benchmarks/gpu/report.py --check    # exit 1 when the section differs from the record

``tiltlab report --docs`` calls :func:`update_readme` too (in a checkout that has this file).
Standard library only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RECORD = REPO / "benchmarks" / "records" / "gpu.json"
README = REPO / "benchmarks" / "README.md"
BEGIN = "<!-- generated from benchmarks/records/gpu.json by benchmarks/gpu/report.py: gpu -->"
END = "<!-- end of generated section: gpu -->"


def _mib(b: Any) -> str:
    if b is None:
        return "–"
    return f"{b / 2**20:,.0f} MiB" if b >= 10 * 2**20 else f"{b / 2**20:.1f} MiB"


def _tps(x: Any) -> str:
    if x is None:
        return "–"
    return f"{x / 1e6:.2f} M" if x >= 1e6 else f"{x / 1e3:.1f} k"


def _s(x: Any) -> str:
    return "–" if x is None else f"{x:.3f}"


def _met(g: dict | None) -> str:
    if not g or g.get("met") is None:
        return "not judged"
    return "met" if g["met"] else "NOT met"


def _commands(rec: dict) -> list[str]:
    c = rec.get("commands", {})
    return [
        f"1. Here (downloads the wheels into `.whl/`, checks them against `benchmarks/gpu/manifest.json`): `{c.get('prepare')}`",
        f"2. The device call, with `carry: {json.dumps(c.get('carry'))}` and `timeout_s: 600`:",
        "",
        "   ```",
        f"   {c.get('device')}",
        "   ```",
        "",
        "3. Copy the returned `gpu.json` to `benchmarks/records/gpu.json` and run `python benchmarks/gpu/report.py`.",
    ]


def render(rec: dict) -> str:
    """The section's markdown (between the markers) for one record."""
    lines: list[str] = []
    if rec.get("status") != "ran":
        lines.append(f"**{rec.get('status', 'not run yet').capitalize()}.** {rec.get('reason', '')}".rstrip())
        lines += ["", "To produce the record:", "", *_commands(rec)]
        dry = rec.get("dry_run")
        if dry:
            lines += ["", f"The CPU dry run of the same code (`{dry.get('command')}`) is tested: {dry.get('test')}."]
        return "\n".join(lines) + "\n"

    dev, git, v = rec.get("device", {}), rec.get("git", {}), rec.get("versions", {})
    gpu = dev.get("gpu") or dev.get("device")
    lines.append(
        f"Run {rec.get('started')} on {gpu} ({rec.get('mode')}), commit `{(git.get('commit') or '?')[:12]}` "
        f"({git.get('source')}); torch {v.get('torch')}, transformers {v.get('transformers')}, trl {v.get('trl')}, "
        f"liger-kernel {v.get('liger-kernel')}. Verdict: **{'ok' if rec.get('ok') else 'FAILED'}**"
        + ("" if rec.get("complete", True) else " (incomplete record)")
        + "."
    )
    if rec.get("perturbed"):
        lines += ["", f"**A self-test run (`--perturb {rec['perturbed']}`): its numbers are deliberately wrong.**"]
    for f in rec.get("failures", []):
        lines.append(f"* failure: {f}")
    pt = rec.get("pytest")
    if pt:
        lines += [
            "",
            f"`pytest -m gpu`: {pt.get('passed')} passed, {pt.get('failed')} failed, {pt.get('skipped')} skipped.",
        ]
    fu = rec.get("fused")
    if fu and fu.get("results"):
        cfg = fu["config"]
        variants = cfg["variants"]
        lines += [
            "",
            f"Fused log-probs, forward + backward, V = {cfg['vocab']:,}, H = {cfg['hidden']:,}: tokens/s and peak memory.",
            "",
            "| dtype | N | " + " | ".join(variants) + " |",
            "|---|---:|" + "---:|" * len(variants),
        ]
        for dtype in cfg["dtypes"]:
            for n in cfg["ns"]:
                cells = []
                for var in variants:
                    r = next(
                        (x for x in fu["results"] if x["dtype"] == dtype and x["n"] == n and x["variant"] == var), None
                    )
                    if r is None:
                        cells.append("–")
                    elif r.get("status") == "ok":
                        cells.append(f"{_tps(r.get('tokens_per_s'))}, {_mib(r.get('peak_bytes'))}")
                    else:
                        cells.append(str(r.get("status")))
                lines.append(f"| {dtype} | {n:,} | " + " | ".join(cells) + " |")
        cmp_ = fu.get("comparisons", [])
        if cmp_:
            worst = max(cmp_, key=lambda c: c["logp_max_abs_diff"])
            lines += [
                "",
                f"{len(cmp_)} comparisons, {sum(c['ok'] for c in cmp_)} within tolerance; largest per-token "
                f"log-prob difference {worst['logp_max_abs_diff']:.2e} ({worst['variant']} vs {worst['reference']}, "
                f"{worst['dtype']}, N = {worst['n']:,}).",
            ]
    gr = rec.get("grpo")
    if gr and gr.get("runs"):
        lines += [
            "",
            f"GRPOTrainer steps ({gr['model'].get('config')}, {gr['settings'].get('per_device_train_batch_size')} "
            f"completions of ≤ {gr['settings'].get('max_completion_length')} tokens per step), median seconds:",
            "",
            "| run | generation | loss | backward | step | fixed-batch loss (device / fp32 CPU) | log-prob max diff |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for name, r in gr["runs"].items():
            m, fb = r["median"], r["fixed_batch"]
            loss = f"{fb.get('loss_device', float('nan')):.5g} / {fb.get('loss_cpu_fp32', float('nan')):.5g}"
            lines.append(
                f"| {name} | {_s(m['generation_s'])} | {_s(m['loss_s'])} | {_s(m['backward_s'])} | {_s(m['step_s'])} "
                f"| {loss} | {fb.get('logp_max_abs_diff', float('nan')):.2e} |"
            )
    goals = rec.get("goals", {})
    lines += [
        "",
        "Performance goals (reported, not asserted):",
        "",
        f"* fused ≥ Liger tokens/s at ≤ its peak memory, bf16: {_met(goals.get('fused_bf16_vs_liger'))}",
        f"* tiltlab objective loss + backward ≤ 1.05 × TRL GRPO's: {_met(goals.get('objective_step_vs_trl_grpo'))}",
    ]
    for name, g in ((goals.get("objective_step_vs_trl_grpo") or {}).get("per_objective") or {}).items():
        ratio = g.get("ratio")
        lines.append(
            f"  * {name}: {'–' if ratio is None else f'{ratio:.2f}×'} ({'met' if g.get('met') else 'NOT met'})"
        )
    return "\n".join(lines) + "\n"


def replace_section(text: str, body: str) -> str:
    if BEGIN not in text or END not in text:
        raise ValueError(f"benchmarks/README.md has no generated GPU section ({BEGIN} ... {END})")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{body}{END}{tail}"


def update_readme(record: Path = RECORD, readme: Path = README, check: bool = False) -> bool:
    """Rewrite (or, with ``check``, compare) the section; True when it already matched."""
    rec = json.loads(record.read_text(encoding="utf-8"))
    text = readme.read_text(encoding="utf-8")
    new = replace_section(text, render(rec))
    if new != text and not check:
        readme.write_text(new, encoding="utf-8")
    return new == text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--record", type=Path, default=RECORD)
    p.add_argument("--readme", type=Path, default=README)
    p.add_argument("--check", action="store_true", help="exit 1 when the section differs from the record")
    args = p.parse_args(argv)
    same = update_readme(args.record, args.readme, check=args.check)
    if args.check and not same:
        print(f"{args.readme}: the GPU section differs from {args.record}; run python benchmarks/gpu/report.py")
        return 1
    print(f"{args.readme}: GPU section {'unchanged' if same else 'rewritten'} from {args.record}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
