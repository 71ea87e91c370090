"""The GPU kit's record (``benchmarks/records/gpu.json``, written by ``benchmarks/gpu/run.py``, or the
committed "not run yet" record) as the generated ``gpu`` section of ``benchmarks/README.md``.

``tiltlab report --docs`` rewrites the section in a checkout (the installed package has no
``benchmarks/``); ``python benchmarks/gpu/report.py [--check]`` does the same alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tiltlab.paper_checks.report import replace_section

__all__ = ["SECTION", "readme_path", "record_path", "render", "rendered_readme"]

SECTION = "gpu"
"""The name of the generated section in benchmarks/README.md (markers as for README.md's sections)."""


def record_path(root: Path) -> Path:
    return Path(root) / "benchmarks" / "records" / "gpu.json"


def readme_path(root: Path) -> Path:
    return Path(root) / "benchmarks" / "README.md"


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


def rendered_readme(root: Path) -> tuple[Path, str] | None:
    """(benchmarks/README.md, its text with the GPU section rendered from the record); None outside a
    checkout that has both files."""
    record, readme = record_path(root), readme_path(root)
    if not (record.is_file() and readme.is_file()):
        return None
    rec = json.loads(record.read_text(encoding="utf-8"))
    text = readme.read_text(encoding="utf-8")
    return readme, replace_section(text, SECTION, render(rec), str(readme))
