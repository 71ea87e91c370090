"""``tiltlab llm demo``: the whole pipeline on CPU, on the tiny Qwen3 model and synthetic arithmetic.

1. **SFT warm-up** of the randomly initialized tiny model on ``Compute a + 0.`` (two-digit ``a``,
   the easiest arithmetic there is: the answer copies ``a``) answered as ``\\boxed{a}``, with a
   fraction of the warm-up answers wrong (a stray ``0`` appended) so that the warm model has a
   nonzero but imperfect pass rate (objective ``sft`` = :func:`objectives.offline.sft_loss`).
   This model is ``pi_ref`` and the common start of every method.
2. **DISA Stage 1** (:func:`llm.disa.stage1.run_stage1`, proposal ``q = pi_ref``), **Stage 2**
   (:func:`llm.disa.stage2.run.run_stage2`: the regressor on frozen ``pi_ref`` prompt embeddings, held-out
   MSE / R^2 reported), **Stage 3** (:class:`llm.train.online.TiltGRPOTrainer`,
   ``objective="disa"``, frozen ``log Z_psi``).
3. **GRPO** and **FlowRL** from the same start with the same rollout budget. FlowRL runs at
   DISA's target: the same ``beta``, the same reward transform (``r~ = r``) and the same length
   normalization (none: summed log-probs), so both fit the same ``pi* ~ pi_ref exp(beta r)``; the
   only difference is the log partition function (FlowRL's learned head vs DISA's frozen Stage-2
   regressor). Both use the same learning rate.
4. **Evaluation** on held-out prompts (values of ``a`` never seen in training): Mean@k, pass@k
   (unbiased estimator), distinct-2 per method; a table on stdout, ``results.json`` and
   ``curves.png`` / ``curves.pdf`` in the output directory. The curves show the training reward per
   step and the held-out Mean@k every ``curve_every`` steps (the last point is the table's value).

One seed cannot rank the methods: the warm-up pass rate alone ranges from 0.02 to 0.41 across seeds
of the quick run, so a one-seed figure is captioned "one seed, illustration only". ``--seeds N``
(:func:`run_demo_seeds`) runs seeds ``seed .. seed+N-1`` (each in ``seed<s>/``) and writes the mean
over seeds with the min-max range as the interval, in the table and the figure.

``--quick`` shrinks every budget (about a minute on an idle 2-core machine, per seed). ``--model NAME`` starts
from a real pretrained model instead (e.g. ``smollm2-135m``, see :func:`llm.base.models.resolve_model`):
no tiny model, no SFT warm-up (the pretrained model is ``pi_ref``), smaller learning rates and
longer completions (:data:`REAL_MODEL_OVERRIDES`); slow on CPU.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from tiltlab.files import write_json
from tiltlab.llm.base.models import _parse_tiny, build_tiny, load_model, load_tokenizer, resolve_model
from tiltlab.progress import progress

from .config import REAL_MODEL_OVERRIDES, DemoConfig
from .report import _plot, _plot_seeds, format_table, format_table_seeds
from .stages import _split, _stage12, _train_rl, evaluate, sft_warmup

__all__ = ["REAL_MODEL_OVERRIDES", "DemoConfig", "add_cli", "run_demo", "run_demo_seeds"]


def run_demo(cfg: DemoConfig, progress: bool = True) -> dict[str, Any]:
    """Run the demo (one seed); returns ``{"table": {method: metrics}, "timings": {...}, ...}`` (also results.json).

    Runs with ``cfg.threads`` torch threads and restores the caller's setting afterwards. ``progress``:
    the ``[demo]`` lines on stdout and a progress bar over the optimizer steps (SFT + RL) on stderr."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        with _quiet_library_bars(), _bar(cfg, 1, progress) as bar:
            return _run_demo(cfg, progress, bar)
    finally:
        torch.set_num_threads(previous)


def run_demo_seeds(cfg: DemoConfig, seeds: int, progress: bool = True) -> dict[str, Any]:
    """The demo at seeds ``cfg.seed .. cfg.seed + seeds - 1``, each in ``<out_dir>/seed<s>/`` (a whole
    :func:`run_demo` output), and their summary in ``<out_dir>``: ``results.json`` with every seed's table
    and, per method and metric, the mean, min and max over seeds; ``curves.png`` / ``curves.pdf`` with the
    mean curves and the min-max band."""
    import torch

    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    say = _say_fn(progress)
    previous = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    runs = []
    t_all = time.perf_counter()
    try:
        with _quiet_library_bars(), _bar(cfg, seeds, progress) as bar:
            for i in range(seeds):
                one = replace(cfg, seed=cfg.seed + i, out_dir=str(out / f"seed{cfg.seed + i}"))
                say(f"[demo] seed {one.seed} ({i + 1} of {seeds}) -> {one.out_dir}/", bar)
                runs.append(_run_demo(one, progress, bar))
    finally:
        torch.set_num_threads(previous)
    res = summarize_seeds(runs)
    res["config"] = asdict(cfg)
    res["timings"] = {"total": time.perf_counter() - t_all}
    fig, caption = _plot_seeds(res, runs, out / "curves.png", cfg.eval_k)
    res["figure"], res["figure_pdf"], res["figure_caption"] = str(fig), str(fig.with_suffix(".pdf")), caption
    _write_json(res, out / "results.json")
    say(format_table_seeds(res, cfg.eval_k))
    say(f"[demo] {seeds} seeds: results.json, {fig.name} and {fig.with_suffix('.pdf').name} written to {out}/")
    return res


def summarize_seeds(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-seed results -> ``{"seeds", "tables", "table": {method: {metric: {"mean", "min", "max"}}},
    "heldout_curves" / "curves": {method: {"step", "mean", "min", "max"}}}``. Curves are summarized step by
    step; every seed runs the same schedule, so their steps agree (checked)."""
    seeds = [r["config"]["seed"] for r in runs]
    table: dict[str, dict] = {}
    for m in runs[0]["table"]:
        table[m] = {}
        for key in ("mean_at_k", "pass_at_1", "pass_at_k", "distinct_2"):
            vals = [r["table"][m][key] for r in runs]
            table[m][key] = {"mean": sum(vals) / len(vals), "min": min(vals), "max": max(vals)}

    def band(name: str) -> dict[str, dict]:
        outb = {}
        for m in runs[0][name]:
            steps = [s for s, _ in runs[0][name][m]]
            for r in runs[1:]:
                if [s for s, _ in r[name][m]] != steps:
                    raise ValueError(f"{name} of {m}: the seeds logged different steps; cannot summarize them")
            cols = list(zip(*([v for _, v in r[name][m]] for r in runs)))
            outb[m] = {
                "step": steps,
                "mean": [sum(c) / len(c) for c in cols],
                "min": [min(c) for c in cols],
                "max": [max(c) for c in cols],
            }
        return outb

    return {
        "seeds": seeds,
        "tables": {str(s): r["table"] for s, r in zip(seeds, runs)},
        "table": table,
        "heldout_curves": band("heldout_curves"),
        "curves": band("curves"),
        "seed_dirs": {str(s): str(Path(r["figure"]).parent) for s, r in zip(seeds, runs)},
    }


def _bar(cfg: DemoConfig, seeds: int, enabled: bool):
    """The demo's progress reporter: one unit per optimizer step (SFT and RL), over every seed."""

    total = seeds * (cfg.sft_steps + cfg.rl_steps * len(cfg.methods))
    return progress(total=total, desc="demo", unit="step", **({} if enabled else {"mode": "off"}))


@contextlib.contextmanager
def _quiet_library_bars():
    """transformers' own bars (writing and loading each checkpoint, several per run) would interleave
    with the demo's one bar; they are switched off for the run and restored after."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def _say_fn(enabled: bool):
    """``say(msg, bar)``: one ``[demo]`` line on stdout, written around a progress bar on a terminal."""

    def say(msg: str, bar=None) -> None:
        if not enabled:
            return
        if bar is not None and bar.mode == "bar":
            from tqdm import tqdm

            with tqdm.external_write_mode(file=sys.stdout):
                print(msg, flush=True)
        else:
            print(msg, flush=True)

    return say


def _write_json(res: dict, path: Path) -> None:
    write_json(path, res, indent=2, default=str, newline=False)


def _run_demo(cfg: DemoConfig, progress: bool, bar) -> dict[str, Any]:
    import torch

    t_all = time.perf_counter()
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    timings: dict[str, float] = {}
    log: list[dict] = []
    train, held = _split(cfg)
    say_bar = _say_fn(progress)

    def say(msg: str) -> None:
        say_bar(msg, bar)

    say(f"[demo] outputs -> {out}/ (model {cfg.model}, seed {cfg.seed}, {cfg.threads} torch thread(s))")

    t = time.perf_counter()
    if cfg.is_tiny:
        tiny_dir = out / "tiny_init"
        build_tiny(out_dir=tiny_dir, seed=_parse_tiny(cfg.model) + cfg.seed)
        model, tok = load_model(tiny_dir, device="cpu"), load_tokenizer(tiny_dir)
    else:
        source = Path(resolve_model(cfg.model))  # an alias is converted once (progress bar)
        model, tok = load_model(source, device="cpu"), load_tokenizer(source)
    if cfg.sft_steps > 0:
        say(f"[demo] SFT warm-up: {cfg.sft_steps} steps on {len(train)} training prompts")
        sft_warmup(model, tok, train, cfg, log, bar=bar)
    if cfg.is_tiny or cfg.sft_steps > 0:
        ref_dir = out / "warmup"
        model.save_pretrained(ref_dir)
        tok.save_pretrained(ref_dir)
    else:  # the pretrained model itself is pi_ref: no copy
        ref_dir = source
    timings["sft"] = time.perf_counter() - t
    say(f"[demo] warm-up model (pi_ref) ready in {timings['sft']:.1f}s -> {ref_dir}/")

    table: dict[str, dict] = {}
    t = time.perf_counter()
    table["warmup"] = evaluate(model, tok, held, cfg.eval_k, cfg.seed + 1, cfg.max_new_tokens)
    timings["eval"] = time.perf_counter() - t
    say(f"[demo] warm-up held-out Mean@{cfg.eval_k} = {table['warmup']['mean_at_k']:.3f} ({len(held)} prompts)")
    del model

    log_z_fn = manifest = None
    if "disa" in cfg.methods:
        say(f"[demo] DISA Stage 1 (M = {cfg.num_generations}, tilt_beta = {cfg.tilt_beta}) and Stage 2")
        t = time.perf_counter()
        manifest, log_z_fn = _stage12(ref_dir, train, cfg, out, log)
        timings["stage1+2"] = time.perf_counter() - t
        s2 = log[-1]
        say(
            f"[demo] Stage 1+2 done in {timings['stage1+2']:.1f}s: mean label log Z {s2['stage1_mean_log_z']:.3f}, "
            f"mean ESS {s2['stage1_mean_ess']:.2f}"
        )

    curves: dict[str, list] = {}
    heldout: dict[str, list] = {}
    targets: dict[str, dict] = {}
    for m in cfg.methods:
        say(f"[demo] training {m}: {cfg.rl_steps} steps x {cfg.prompts_per_step} prompts x {cfg.num_generations}")
        t0 = time.perf_counter()
        run = _train_rl(m, ref_dir, train, held, cfg, out, log_z_fn, manifest, say, bar=bar)
        curves[m] = [(h["step"], h["reward"]) for h in run["history"]]
        heldout[m] = [(0, table["warmup"]["mean_at_k"]), *run["heldout"]]
        if run["target"] is not None:
            targets[m] = run["target"]
        t = time.perf_counter()
        table[m] = run["final"] or evaluate(
            run["policy"], run["tokenizer"], held, cfg.eval_k, cfg.seed + 1, cfg.max_new_tokens
        )
        timings["eval"] += time.perf_counter() - t
        timings[f"train_{m}"] = t - t0  # includes the held-out evaluations of the curve
        say(
            f"[demo] {m}: done in {timings[f'train_{m}']:.1f}s, held-out Mean@{cfg.eval_k} = {table[m]['mean_at_k']:.3f}"
        )
    timings["total"] = time.perf_counter() - t_all
    fig, caption = _plot(curves, heldout, log, out / "curves.png", cfg.eval_k, seed=cfg.seed)
    res = {
        "config": asdict(cfg),
        "table": table,
        "timings": timings,
        "log": log,
        "curves": curves,
        "heldout_curves": heldout,
        "targets": targets,
        "figure": str(fig),
        "figure_pdf": str(fig.with_suffix(".pdf")),
        "figure_caption": caption,
        "n_train": len(train),
        "n_eval": len(held),
    }
    _write_json(res, out / "results.json")
    say(format_table(table, cfg.eval_k))
    say("timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))
    say(f"[demo] results.json, {fig.name} and {fig.with_suffix('.pdf').name} written to {out}/")
    return res


def add_cli(subparsers) -> None:
    """``tiltlab llm demo [--quick]``."""
    p = subparsers.add_parser(
        "demo",
        help="CPU end-to-end demo: SFT warm-up, DISA stages 1-3, GRPO, FlowRL, eval",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--quick", action="store_true", help="small budget (about a minute per seed on 2 idle cores)")
    p.add_argument(
        "--model",
        default="tiny",
        help="starting model: tiny (default; SFT warm-up) or a pretrained model, e.g. smollm2-135m (slow)",
    )
    p.add_argument("--out-dir", default="runs/demo", help="output directory (default: runs/demo)")
    p.add_argument("--seed", type=int, default=0, help="seed (default: 0)")
    p.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="run seeds SEED .. SEED+N-1 and report the mean and the min-max range over them (default: 1; "
        "one seed is an illustration, not a ranking)",
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads; results depend on it (default: 1)")
    p.set_defaults(func=_cli_main)


def _cli_main(args) -> int:
    if args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    if args.seeds < 1:
        raise ValueError(f"--seeds must be >= 1 (the number of seeds to run), got {args.seeds}")
    out = Path(args.out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out-dir {out} is a file; pass a directory")
    kw: dict[str, Any] = dict(out_dir=args.out_dir, seed=args.seed, threads=args.threads, model=args.model)
    if not (args.model == "tiny" or args.model.startswith("tiny:")):
        kw.update(REAL_MODEL_OVERRIDES)
        kw["model"] = resolve_model(args.model)  # converts an alias once (progress bar), before the run
        if args.quick:
            kw["rl_steps"] = 4
    cfg = (DemoConfig.quick if args.quick else DemoConfig)(**kw)
    print(
        f"[demo] {'quick' if args.quick else 'full'} run, {cfg.threads} torch thread(s), "
        + (f"{args.seeds} seeds" if args.seeds > 1 else "one seed (illustration only)")
        + f" -> {out}/",
        flush=True,
    )
    if args.seeds > 1:
        res = run_demo_seeds(cfg, args.seeds)
        print(
            f"[demo] done in {res['timings']['total']:.1f} s; outputs in {out}/: results.json, "
            f"{Path(res['figure']).name} (mean and min-max over {args.seeds} seeds), seed<s>/ (each seed's run)"
        )
        return 0
    res = run_demo(cfg)
    print(
        f"[demo] done in {res['timings']['total']:.1f} s; outputs in {out}/: results.json, "
        f"{Path(res['figure']).name}, warmup/, stage1/, stage2/, rl_<method>/"
    )
    return 0
