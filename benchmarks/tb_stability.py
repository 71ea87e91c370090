"""Where TB-family losses train on a real model: per-step diagnostics of DISA / FlowRL runs at several learning rates.

The task, the arms' configs and the evaluation are the registered real-model comparison's
(:mod:`tiltlab.llm.checks.real_comparison`: SmolLM2-135M-Instruct, ``tiltlab llm train`` with colocated vLLM on
CPU, 12 steps x 4 prompts x 4 completions, beta 2, token-sum log-probs); only the learning rate (and, with
``--scale``, the log-prob scale) changes. Each run's ``results.json`` (the trainer's per-step diagnostics and health
warnings, :mod:`tiltlab.llm.train.health`) and, with ``--eval``, its held-out Mean@8 / pass@8 / coverage go into one
record, ``benchmarks/records/tb_stability.json``; docs/llm-runs.md's table is :func:`render` of it (a test compares).

    python benchmarks/tb_stability.py task runs/tb/task                  # Stage 1 + selection + split (~7 min)
    python benchmarks/tb_stability.py run runs/tb disa 0 --lr 1e-5 --eval --core 0
    python benchmarks/tb_stability.py record runs/tb benchmarks/records/tb_stability.json
    python benchmarks/tb_stability.py docs benchmarks/records/tb_stability.json      # docs/llm-runs.md's table
    python benchmarks/tb_stability.py plot benchmarks/records/tb_stability.json --out docs/figures/tb_stability.png

Runs at the same time need their own cores (``--core``); scripts that start vLLM need the ``__main__`` guard.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

KEEP = (
    "loss", "grad_norm", "residual", "residual/abs_max", "kl_ref_seq", "residual/flip_frac",
    "residual/after_over_before", "reward",
)  # fmt: skip
"""The per-step diagnostics the record keeps of each run's results.json."""


def build_task(out: Path, seed: int) -> dict[str, Any]:
    from tiltlab.llm.base.models import resolve_model
    from tiltlab.llm.checks import real_comparison as rc

    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    model_dir = str(resolve_model(rc.ALIAS))
    task = {**rc.make_task(out, model_dir, seed), "model_dir": model_dir, "seed": seed}
    task["task_s"] = time.perf_counter() - t0
    (out / "task.json").write_text(json.dumps(task, indent=1))
    return task


def run_name(arm: str, seed: int, lr: float | None, scale: str | None) -> str:
    return arm if arm == "base" else f"{arm}-s{seed}-lr{lr:g}" + (f"-{scale}" if scale else "")


def one_run(
    root: Path,
    arm: str,
    seed: int,
    lr: float,
    scale: str | None,
    evaluate: bool,
    core: int | None,
    trl: dict[str, Any] | None = None,
    tag: str = "",
) -> dict:
    """Train ``arm`` (``base``: no training) at ``lr`` / ``scale`` on the task in ``root/task`` and evaluate it on the
    held-out prompts with the comparison's evaluation seed (``seed * 100 + 99``); ``root/<name>.summary.json``.
    ``trl``: further TRL options (``--trl KEY=VALUE``); ``tag``: appended to the run's name."""
    from tiltlab.llm.base.data import load_prompts
    from tiltlab.llm.checks import real_comparison as rc
    from tiltlab.llm.disa.logz_head import policy_only_dir

    task = json.loads((root / "task" / "task.json").read_text())
    name = run_name(arm, seed, lr, scale) + (f"-{tag}" if tag else "")
    res: dict[str, Any] = {"name": name, "arm": arm, "seed": seed, "lr": None if arm == "base" else lr, "scale": scale}
    if trl:
        res["trl"] = dict(trl)
    model = task["model_dir"]
    if arm != "base":
        cfg = rc.train_config(arm, task, root / name, seed, rc.STEPS)
        cfg["trl"]["learning_rate"] = lr
        if scale:
            cfg["trl"]["logprob_scale"] = scale
        cfg["trl"].update(trl or {})
        t0 = time.perf_counter()
        out_dir, _ = rc.train_in_process(name, cfg, root, core)
        res["train_s"] = time.perf_counter() - t0
        results = json.loads((Path(out_dir) / "results.json").read_text())
        res["steps"] = [{k: s[k] for k in ("step", *KEEP) if k in s} for s in results["steps"]]
        res["warnings"] = results["warnings"]
        res["step_times"] = rc.step_times(json.loads((Path(out_dir) / "trainer_state.json").read_text())["log_history"])
        model = str(policy_only_dir(out_dir))
    if evaluate or arm == "base":
        ev = rc.eval_in_process(model, task["heldout"], seed * 100 + 99, root / f"eval-{name}.json", core)
        res["heldout"] = rc.run_metrics(ev, load_prompts(task["heldout"]))
    (root / f"{name}.summary.json").write_text(json.dumps(res, indent=1))
    return res


def profile(default: dict[str, Any], no_is: dict[str, Any]) -> dict[str, Any]:
    """Two runs of one config side by side, one with TRL's vLLM importance-sampling correction off (the pi_old
    log-prob pass it needs is skipped): their mean step times and the largest relative difference of their per-step
    losses (with colocated fp32 vLLM the sampler is the policy: the correction's weights are ~1)."""
    diffs = [abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(default["steps"], no_is["steps"])]
    return {
        "runs": [default["name"], no_is["name"]],
        "step_times": {"default": default["step_times"], "no_is_correction": no_is["step_times"]},
        "max_rel_loss_diff": max(diffs),
        "steps": len(diffs),
    }


def render_profile(record: dict[str, Any]) -> str:
    """docs/llm-runs.md's step-time table: mean seconds per optimizer step and its parts, both runs."""
    prof = record["profile"]
    a, b = prof["step_times"]["default"], prof["step_times"]["no_is_correction"]
    names = {
        "step_time": "whole step (TRL's step_time)",
        "time/generate_and_score": "generate and score (below, and the rest of TRL's batch building)",
        "time/vLLM.generate": "  vLLM generation",
        "time/generation_logps": "  log-prob passes at generation (pi_ref; pi_old for the IS correction)",
        "time/sync_weights": "  weight sync to vLLM",
        "time/residual_flips": "after-step residual pass (log_residual_flips)",
    }
    lines = ["| part | default (s) | IS correction off (s) |", "|---|---:|---:|"]
    for k, label in names.items():
        lines.append(f"| {label} | {_f(a.get(k))} | {_f(b.get(k))} |")
    rest_a = a["step_time"] - a["time/generate_and_score"] - a.get("time/residual_flips", 0.0)
    rest_b = b["step_time"] - b["time/generate_and_score"] - b.get("time/residual_flips", 0.0)
    lines.append(f"| loss forward, backward, optimizer (the rest) | {_f(rest_a)} | {_f(rest_b)} |")
    lines.append(
        f"\n{prof['steps']} steps each; the per-step losses of the two runs differ by at most "
        f"{prof['max_rel_loss_diff']:.1e} (relative)."
    )
    return "\n".join(lines)


def make_record(root: Path, profile_root: Path | None = None, note: str = "") -> dict[str, Any]:
    """Every run summary under ``root`` (and the profile pair under ``profile_root``) with the commit the record was
    written at, the date, the machine and ``note`` (which code the runs ran on, when it was not that commit)."""
    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout.strip()
    cpu = next(
        (ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines() if "model name" in ln),
        platform.processor(),
    )
    task = json.loads((root / "task" / "task.json").read_text())
    runs = [json.loads(p.read_text()) for p in sorted(root.glob("*.summary.json"))]
    extra = {}
    if profile_root is not None:
        found = {
            p.name.removesuffix(".summary.json"): json.loads(p.read_text()) for p in profile_root.glob("*.summary.json")
        }
        (prof,) = [v for k, v in found.items() if k.endswith("-prof")]
        (no_is,) = [v for k, v in found.items() if k.endswith("-no-is")]
        extra["profile"] = profile(prof, no_is)
    return {
        "what": "TB-family runs of the real-model comparison's task at several learning rates (benchmarks/tb_stability.py)",
        "commit": commit,
        "date": dt.date.today().isoformat(),
        "machine": f"{cpu}, {platform.python_version()}",
        "note": note,
        "task": {k: task[k] for k in ("seed", "n_train", "n_heldout", "mean_pass_train")},
        "runs": runs,
        **extra,
    }


def replay(run: dict[str, Any]) -> list[dict[str, Any]]:
    """The health warnings the current :class:`~tiltlab.llm.train.health.HealthMonitor` gives on the run's logged
    steps (its default bounds, for the run's objective at the comparison's beta with its affine 0/1 reward): the
    same function of the same numbers as in training, so a bound changed after the run is applied to it too."""
    from types import SimpleNamespace

    from tiltlab.llm.checks.real_comparison import BETA
    from tiltlab.llm.train.health import HealthBounds, HealthMonitor, default_kl_bound

    args = SimpleNamespace(objective=run["arm"], tilt_beta=BETA, reward_transform="affine", reward_scale=1.0)
    m = HealthMonitor(HealthBounds(kl_bound=default_kl_bound(args)))
    m._quiet = True
    for s in run.get("steps") or []:
        m.observe(int(s["step"]), {"loss": s.get("loss"), **s})
    return m.warnings


def _f(v: Any, digits: int = 3) -> str:
    if v is None:
        return "–"
    v = float(v)
    return f"{v:.{digits}g}" if math.isfinite(v) else str(v)


def render(record: dict[str, Any]) -> str:
    """docs/llm-runs.md's table: per run, the step-1 update (flips, |delta| after / before), the largest mean |delta|,
    gradient norm and sequence KL over the run, the health warnings (:func:`replay`), and the held-out metrics where
    evaluated."""
    head = (
        "| run | lr | step-1 update: residuals flipped | step-1 \\|δ\\| after / before | max mean \\|δ\\| | "
        "max grad norm | max KL(π‖π_ref), seq. | warnings | held-out Mean@8 | pass@8 | coverage |\n"
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"
    )
    order = {"base": 0, "disa": 1, "flowrl": 2}
    runs = sorted(record["runs"], key=lambda r: (order.get(r["arm"], 9), r["seed"], -(r["lr"] or 0), r["scale"] or ""))
    lines = [head]
    for r in runs:
        steps = r.get("steps") or []
        first = steps[0] if steps else {}
        mx = {k: max((s[k] for s in steps if k in s), default=None) for k in ("residual", "grad_norm", "kl_ref_seq")}
        kinds = ", ".join(f"{w['kind']} (step {w['step']})" for w in replay(r)) or ("none" if steps else "–")
        h = r.get("heldout") or {}
        label = (
            "untrained model"
            if r["arm"] == "base"
            else f"{r['arm']}, seed {r['seed']}" + (f", {r['scale']} log-probs" if r.get("scale") else "")
        )
        lines.append(
            f"| {label} | {_f(r['lr'])} | {_f(first.get('residual/flip_frac'), 2)} | "
            f"{_f(first.get('residual/after_over_before'))} | {_f(mx['residual'])} | {_f(mx['grad_norm'])} | "
            f"{_f(mx['kl_ref_seq'])} | {kinds} | {_f(h.get('mean8'))} | {_f(h.get('pass8'))} | {_f(h.get('coverage'))} |"
        )
    return "\n".join(lines)


START, END = "<!-- tb-stability:start -->", "<!-- tb-stability:end -->"
"""The generated block of docs/llm-runs.md (:func:`update_docs`)."""
PROFILE_START, PROFILE_END = "<!-- tb-stability-profile:start -->", "<!-- tb-stability-profile:end -->"
"""The generated step-time block (:func:`render_profile`)."""


def _replace(text: str, start: str, end: str, body: str, doc: Path) -> str:
    if start not in text or end not in text:
        raise ValueError(f"{doc}: no {start} ... {end} block")
    a, b = text.index(start) + len(start), text.index(end)
    return text[:a] + "\n" + body + "\n" + text[b:]


def update_docs(record: dict[str, Any], doc: Path, check: bool = False) -> bool:
    """Write :func:`render` of ``record`` between :data:`START` and :data:`END` in ``doc`` (and, where the record
    has a profile, :func:`render_profile` between :data:`PROFILE_START` and :data:`PROFILE_END`); with ``check``,
    only say whether it is there already. Returns whether the doc is (now) current."""
    text = doc.read_text(encoding="utf-8")
    new = _replace(text, START, END, render(record), doc)
    if "profile" in record:
        new = _replace(new, PROFILE_START, PROFILE_END, render_profile(record), doc)
    if new == text:
        return True
    if not check:
        doc.write_text(new, encoding="utf-8")
    return not check


def plot(record: dict[str, Any], out: Path) -> Path:
    """The runs' per-step diagnostics (:func:`tiltlab.llm.train.diagnose.plot`)."""
    from tiltlab.llm.train.diagnose import plot as draw

    runs = [(r["name"], {"steps": r["steps"]}) for r in record["runs"] if r.get("steps")]
    return draw(runs, out)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tb_stability", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("task", help="Stage 1, the pass-rate selection and the held-out split")
    t.add_argument("out")
    t.add_argument("--seed", type=int, default=0)
    r = sub.add_parser("run", help="one training run (and its held-out evaluation with --eval)")
    r.add_argument("root")
    r.add_argument("arm", choices=["base", "disa", "flowrl", "grpo_kl", "grpo"])
    r.add_argument("seed", type=int)
    r.add_argument("--lr", type=float, default=1e-5)
    r.add_argument("--scale", choices=["sum", "mean"], default=None)
    r.add_argument("--eval", action="store_true")
    r.add_argument("--core", type=int, default=None)
    r.add_argument("--trl", action="append", default=[], metavar="KEY=VALUE", help="a TRL option (YAML value)")
    r.add_argument("--tag", default="", help="appended to the run's name")
    c = sub.add_parser("record", help="collect the run summaries into a record")
    c.add_argument("root")
    c.add_argument("out")
    c.add_argument("--profile", default=None, help="a folder with the two profile runs (tags prof and no-is)")
    c.add_argument("--note", default="", help="which code the runs ran on, and anything else a reader needs")
    g = sub.add_parser("plot", help="draw a record's per-step diagnostics")
    g.add_argument("record")
    g.add_argument("--out", required=True)
    s = sub.add_parser("render", help="print docs/llm-runs.md's table of a record")
    s.add_argument("record")
    d = sub.add_parser("docs", help="write the record's table into docs/llm-runs.md (--check: only compare)")
    d.add_argument("record")
    d.add_argument("--doc", default=str(Path(__file__).resolve().parents[1] / "docs" / "llm-runs.md"))
    d.add_argument("--check", action="store_true")
    a = p.parse_args(argv)
    if a.cmd == "task":
        print(json.dumps(build_task(Path(a.out), a.seed), indent=1))
    elif a.cmd == "run":
        import yaml

        trl = {k: yaml.safe_load(v) for k, v in (kv.split("=", 1) for kv in a.trl)}
        print(json.dumps(one_run(Path(a.root), a.arm, a.seed, a.lr, a.scale, a.eval, a.core, trl, a.tag)))
    elif a.cmd == "record":
        prof = Path(a.profile) if a.profile else None
        Path(a.out).write_text(json.dumps(make_record(Path(a.root), prof, a.note), indent=1) + "\n")
    elif a.cmd == "plot":
        print(plot(json.loads(Path(a.record).read_text()), Path(a.out)))
    elif a.cmd == "docs":
        current = update_docs(json.loads(Path(a.record).read_text()), Path(a.doc), a.check)
        print(f"{a.doc}: {'current' if current else 'stale: run without --check'}")
        return 0 if current else 1
    else:
        print(render(json.loads(Path(a.record).read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
