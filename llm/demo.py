"""``tiltlab llm demo``: the whole pipeline on CPU, on the tiny Qwen3 model and synthetic arithmetic.

1. **SFT warm-up** of the randomly initialized tiny model on ``Compute a + 0.`` (two-digit ``a``,
   the easiest arithmetic there is: the answer copies ``a``) answered as ``\\boxed{a}``, with a
   fraction of the warm-up answers wrong (a stray ``0`` appended) so that the warm model has a
   nonzero but imperfect pass rate (objective ``sft`` = :func:`objectives.offline.sft_loss`).
   This model is ``pi_ref`` and the common start of every method.
2. **DISA Stage 1** (:func:`llm.stage1.run_stage1`, proposal ``q = pi_ref``), **Stage 2**
   (:func:`llm.stage2.run_stage2`: the regressor on frozen ``pi_ref`` prompt embeddings, held-out
   MSE / R^2 reported), **Stage 3** (:class:`llm.trainers.online.TiltGRPOTrainer`,
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
from a real pretrained model instead (e.g. ``smollm2-135m``, see :func:`llm.models.resolve_model`):
no tiny model, no SFT warm-up (the pretrained model is ``pi_ref``), smaller learning rates and
longer completions (:data:`REAL_MODEL_OVERRIDES`); slow on CPU.
"""

from __future__ import annotations

import contextlib
import random
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from tiltlab.files import atomic_path, write_json

__all__ = ["REAL_MODEL_OVERRIDES", "DemoConfig", "add_cli", "run_demo", "run_demo_seeds"]


@dataclass
class DemoConfig:
    """Budget of ``tiltlab llm demo`` (``--quick`` uses :meth:`quick`)."""

    out_dir: str = "runs/demo"
    """Output directory (model checkpoints, Stage 1/2 files, results.json, curves.png)."""
    model: str = "tiny"
    """Starting model: "tiny" (random tiny Qwen3 + SFT warm-up) or a pretrained model / alias used as pi_ref."""
    seed: int = 0
    """Seed of the tiny model, the data split, SFT, the trainers and the evaluation sampler."""
    n_train: int = 60
    """Training prompts (distinct values of a in "Compute a + 0.")."""
    n_eval: int = 30
    """Held-out prompts (values of a disjoint from training)."""
    sft_steps: int = 300
    """SFT warm-up optimizer steps."""
    sft_lr: float = 1e-2
    """SFT learning rate (AdamW)."""
    sft_noise: float = 0.5
    """Fraction of warm-up answers replaced by a wrong (off-by-one) answer."""
    rl_steps: int = 40
    """Optimizer steps of each RL method."""
    rl_lr: float = 2e-3
    """Learning rate of GRPO."""
    tb_lr: float = 5e-4
    """Learning rate of DISA and FlowRL: their squared trajectory-balance residual on summed
    log-probs has larger gradients than GRPO's ratio surrogate; at 2e-3 the quick run's DISA policy
    got worse (0.29 -> 0.19 held-out Mean@8, seed 0) while 5e-4 improved it (0.29 -> 0.46)."""
    prompts_per_step: int = 8
    """Prompts per RL step (x num_generations completions)."""
    num_generations: int = 8
    """Group size G of the RL methods (and M of Stage 1)."""
    beta: float = 2.0
    """Tilt beta of DISA and FlowRL (multiplies r~ = r; target pi* ~ pi_ref exp(beta r))."""
    eval_k: int = 8
    """Samples per held-out prompt for Mean@k / pass@k."""
    max_new_tokens: int = 8
    """Completion length cap (an answer is \\boxed{n} + end of turn: 5-6 tokens)."""
    methods: tuple = ("grpo", "flowrl", "disa")
    """RL methods trained from the warm-up model."""
    curve_every: int = 5
    """Held-out Mean@k is evaluated every this many RL steps (and after the last) for the curves."""
    threads: int = 1
    """torch intra-op threads for the run. Fixed (not the machine's core count) because a parallel
    reduction sums in an order that depends on the thread count, and these short training runs
    amplify such last-bit differences: seed 0 gives warm-up -> DISA held-out Mean@8 0.050 -> 0.071
    with 1 thread and 0.125 -> 0.154 with 2. The 64-wide model gains little from more threads (seed 1
    on a loaded 2-core machine: 13 s with 1 thread, 20 s with 2)."""

    def __post_init__(self) -> None:
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if self.curve_every < 1:
            raise ValueError(f"curve_every must be >= 1, got {self.curve_every}")
        unknown = set(self.methods) - {"grpo", "flowrl", "disa"}
        if unknown:
            raise ValueError(f"unknown demo methods {sorted(unknown)}; use grpo, flowrl, disa")

    @property
    def is_tiny(self) -> bool:
        return self.model == "tiny" or self.model.startswith("tiny:")

    @classmethod
    def quick(cls, **kw) -> DemoConfig:
        base = dict(n_train=60, n_eval=30, sft_steps=150, rl_steps=15, prompts_per_step=4, num_generations=8, eval_k=8)
        base.update(kw)
        return cls(**base)


#: budget changes applied by ``tiltlab llm demo --model NAME`` for a pretrained model: no SFT
#: warm-up, learning rates for pretrained weights, completions long enough for an instruct answer.
REAL_MODEL_OVERRIDES = dict(
    sft_steps=0, rl_lr=1e-6, tb_lr=1e-6, max_new_tokens=48, n_train=16, n_eval=16, prompts_per_step=2, eval_k=4
)


def _split(cfg: DemoConfig) -> tuple[list[dict], list[dict]]:
    """The demo task, made easy enough for a 2-layer, 64-wide model to learn on CPU in seconds:
    ``Compute a + 0.`` for two-digit ``a`` (the answer copies ``a``). Train and held-out values of
    ``a`` are disjoint, so held-out gains measure a learned behaviour, not memorized answers."""
    from tiltlab.llm.tasks import BOXED_INSTRUCTION

    values = list(range(10, 100))
    random.Random(f"demo-{cfg.seed}").shuffle(values)
    if cfg.n_train + cfg.n_eval > len(values):
        raise ValueError(f"n_train + n_eval must be <= {len(values)}")

    def row(i, a, tag):
        return {"id": f"{tag}-{i}", "prompt": f"Compute {a} + 0. {BOXED_INSTRUCTION}", "answer": str(a)}

    train = [row(i, a, "train") for i, a in enumerate(values[: cfg.n_train])]
    held = [row(i, a, "eval") for i, a in enumerate(values[cfg.n_train : cfg.n_train + cfg.n_eval])]
    return train, held


def _chat(tok, prompt: str) -> str:
    from tiltlab.llm.prompts import format_prompt

    return format_prompt(tok, prompt)


def sft_warmup(model, tok, rows: list[dict], cfg: DemoConfig, log: list, bar=None) -> None:
    """SFT on ``\\boxed{answer}`` (+ end of turn); a ``sft_noise`` fraction of the targets is wrong
    (the answer with a stray ``0`` appended, a prompt-independent error RL can learn to avoid).
    ``bar``: a :class:`tiltlab.progress.Progress` advanced by one per optimizer step."""
    import torch

    from tiltlab.llm.scoring import score_completions
    from tiltlab.objectives.offline import sft_loss

    rng = random.Random(f"sft-{cfg.seed}")
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.sft_lr, weight_decay=0.0)
    model.train()
    p_ids = [tok(_chat(tok, r["prompt"]), add_special_tokens=False)["input_ids"] for r in rows]
    for step in range(cfg.sft_steps):
        idx = [rng.randrange(len(rows)) for _ in range(32)]
        comps = []
        for i in idx:
            ans = rows[i]["answer"]
            if rng.random() < cfg.sft_noise:
                ans = ans + "0"
            comps.append(tok(f"\\boxed{{{ans}}}", add_special_tokens=False)["input_ids"] + [tok.eos_token_id])
        sc = score_completions(
            model, [p_ids[i] for i in idx], comps, pad_token_id=tok.pad_token_id, batch_size=32, grad=True
        )
        loss = sft_loss(sc.token_logprobs, sc.mask).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 20 == 0 or step == cfg.sft_steps - 1:
            log.append({"phase": "sft", "step": step, "loss": float(loss.detach())})
        if bar is not None:
            bar.update(1, postfix=f"seed {cfg.seed} sft")
    model.eval()


def evaluate(model, tok, rows: list[dict], k: int, seed: int, max_new_tokens: int) -> dict[str, float]:
    """k samples per prompt at temperature 1: Mean@k, pass@1, pass@k, distinct-2 over completion tokens."""
    from tiltlab.llm.rewards import math_reward
    from tiltlab.llm.rollout import HFEngine, SamplingConfig
    from tiltlab.objectives.metrics import distinct_n, pass_at_k

    eng = HFEngine(model, tok, batch_size=256)
    groups = eng.generate(
        [_chat(tok, r["prompt"]) for r in rows],
        k,
        SamplingConfig(temperature=1.0, max_new_tokens=max_new_tokens, seed=seed),
    )
    correct, p1, pk, texts = [], [], [], []
    for r, g in zip(rows, groups):
        rew = math_reward([r["prompt"]] * k, g.texts, answer=[r["answer"]] * k)
        c = int(sum(1 for x in rew if x))
        correct.append(c / k)
        p1.append(pass_at_k(k, c, 1))
        pk.append(pass_at_k(k, c, k))
        texts.extend(tuple(c) for c in g.completion_ids)
    n = len(rows)
    return {
        "mean_at_k": sum(correct) / n,
        "pass_at_1": sum(p1) / n,
        "pass_at_k": sum(pk) / n,
        "distinct_2": distinct_n(texts, 2),
        "k": k,
    }


def _stage12(ref_dir: Path, train: list[dict], cfg: DemoConfig, out: Path, log: list) -> tuple[dict, Any]:
    """DISA Stage 1 (:func:`llm.stage1.run_stage1`, ``q = pi_ref``) and Stage 2
    (:func:`llm.stage2.run_stage2`); returns (Stage-1 manifest, the frozen ``predict_log_z``)."""
    import shutil

    from tiltlab.llm.stage1 import Stage1Config, read_manifest, run_stage1
    from tiltlab.llm.stage2 import Stage2Config, load_log_z_predictor, run_stage2

    s1_dir, s2_dir = out / "stage1", out / "stage2"
    for d in (s1_dir, s2_dir):  # the demo always starts from scratch (Stage 1 would otherwise resume)
        if d.exists():
            shutil.rmtree(d)
    s1 = Stage1Config(
        proposal=str(ref_dir),
        reference=str(ref_dir),
        dataset="unused",
        out_dir=str(s1_dir),
        M=cfg.num_generations,
        beta=cfg.beta,
        reward="math",
        max_new_tokens=cfg.max_new_tokens,
        seed=cfg.seed,
        prompts_per_shard=len(train),
        gen_batch_size=256,
        score_batch_size=64,
        device="cpu",
    )
    summary = run_stage1(s1, rows=[dict(r) for r in train], progress=False)
    metrics = run_stage2(
        Stage2Config(
            labels=str(s1_dir), out_dir=str(s2_dir), val_fraction=0.25, seed=cfg.seed, device="cpu", embed_batch_size=64
        ),
        progress=False,
    )
    log.append(
        {
            "phase": "stage2",
            **{k: v for k, v in metrics.items() if isinstance(v, (int, float, str))},
            "stage1_mean_log_z": summary.get("mean_log_z"),
            "stage1_mean_ess": summary.get("mean_ess"),
        }
    )
    return read_manifest(s1_dir), load_log_z_predictor(s2_dir, device="cpu")


def _train_rl(
    method: str,
    ref_dir: Path,
    train: list[dict],
    held: list[dict],
    cfg: DemoConfig,
    out: Path,
    log_z_fn,
    manifest,
    say,
    bar=None,
):
    """One RL run from the warm-up model; returns a dict: ``policy``, ``tokenizer``, ``history`` (per-step
    log), ``heldout`` (``[(step, Mean@k)]`` every ``cfg.curve_every`` steps and after the last),
    ``final`` (held-out metrics after the last step), ``target`` (the tilt the trainer fits, TB methods)."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback

    from tiltlab.llm.models import load_model, load_tokenizer
    from tiltlab.llm.rewards import math_reward
    from tiltlab.llm.trainers.online import TiltGRPOConfig, TiltGRPOTrainer

    model, tok = load_model(ref_dir, device="cpu"), load_tokenizer(ref_dir)
    ds = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]} for r in train]
    )
    extra: dict[str, Any] = {}
    if method in ("disa", "flowrl"):  # one target pi* ~ pi_ref exp(beta r) for both
        extra = dict(
            tilt_beta=cfg.beta, reward_transform="affine", reward_scale=1.0, reward_shift=0.0, length_normalize=False
        )
    if method == "flowrl":
        extra["log_z_dropout"] = 0.0
    args = TiltGRPOConfig(
        output_dir=str(out / f"rl_{method}"),
        objective=method,
        learning_rate=cfg.tb_lr if method in ("disa", "flowrl") else cfg.rl_lr,
        per_device_train_batch_size=cfg.prompts_per_step * cfg.num_generations,
        num_generations=cfg.num_generations,
        max_completion_length=cfg.max_new_tokens,
        max_steps=cfg.rl_steps,
        temperature=1.0,
        report_to="none",
        use_cpu=True,
        logging_steps=1,
        save_strategy="no",
        remove_unused_columns=False,
        seed=cfg.seed,
        lr_scheduler_type="constant",
        disable_tqdm=True,
        gradient_checkpointing=False,
        log_level="error",
        **extra,
    )
    tr = TiltGRPOTrainer(
        model=model,
        reward_funcs=math_reward,
        args=args,
        train_dataset=ds,
        processing_class=tok,
        log_z_fn=log_z_fn if method == "disa" else None,
        log_z_manifest=manifest if method == "disa" else None,
    )
    from transformers.trainer_callback import PrinterCallback

    heldout: list[tuple[int, float]] = []
    final: dict[str, dict] = {}

    class HeldOut(TrainerCallback):
        """Held-out Mean@k during training, on the random state of its own (training is unchanged)."""

        def on_step_end(self, args, state, control, model=None, **kw):
            step = state.global_step
            if bar is not None:
                bar.update(1, postfix=f"seed {cfg.seed} {method}")
            if step % cfg.curve_every and step != state.max_steps:
                return
            with torch.random.fork_rng(devices=[]):
                model.eval()
                metrics = evaluate(model, tok, held, cfg.eval_k, cfg.seed + 1, cfg.max_new_tokens)
                model.train()
            acc = metrics["mean_at_k"]
            heldout.append((step, acc))
            if step == state.max_steps:
                final["metrics"] = metrics  # the table's row: same model, same evaluation seed
            rew = [h["reward"] for h in state.log_history if "reward" in h]
            say(
                f"[demo] {method} step {step}/{state.max_steps}: training reward {rew[-1] if rew else float('nan'):.3f}, "
                f"held-out Mean@{cfg.eval_k} {acc:.3f}"
            )

    tr.remove_callback(PrinterCallback)
    tr.add_callback(HeldOut())
    tr.train()
    hist = [h for h in tr.state.log_history if "reward" in h]
    pol = tr.model
    pol.eval()  # the sampler below uses a KV cache: eval mode, no gradient checkpointing
    target = None
    if method in ("disa", "flowrl"):  # what the trainer actually fits: pi* ~ pi_ref exp(beta r~), r~ = a r + c
        target = {
            "tilt_beta": args.tilt_beta,
            "reward_transform": list(args.reward_transform_spec),
            "logprob_scale": args.logprob_scale,
        }
    return {
        "policy": pol,
        "tokenizer": tok,
        "history": hist,
        "heldout": heldout,
        "final": final.get("metrics"),
        "target": target,
    }


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
    from tiltlab.progress import progress

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

    from tiltlab.llm.models import _parse_tiny, build_tiny, load_model, load_tokenizer, resolve_model

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
        say(f"[demo] DISA Stage 1 (M = {cfg.num_generations}, beta = {cfg.beta}) and Stage 2")
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


def format_table(table: dict[str, dict], k: int) -> str:
    head = f"{'method':<8} {'Mean@' + str(k):>8} {'pass@1':>7} {'pass@' + str(k):>7} {'distinct-2':>10}"
    lines = [head, "-" * len(head)]
    for m, r in table.items():
        lines.append(
            f"{m:<8} {r['mean_at_k']:>8.3f} {r['pass_at_1']:>7.3f} {r['pass_at_k']:>7.3f} {r['distinct_2']:>10.3f}"
        )
    return "\n".join(lines)


def format_table_seeds(res: dict[str, Any], k: int) -> str:
    """The table of :func:`run_demo_seeds`: mean over seeds and, in brackets, the min-max range."""
    n = len(res["seeds"])
    head = f"{'method':<8} {'Mean@' + str(k):>22} {'pass@1':>22} {'pass@' + str(k):>22} {'distinct-2':>22}"
    lines = [f"mean over {n} seeds [min, max]", head, "-" * len(head)]
    for m, r in res["table"].items():
        cells = [
            f"{r[key]['mean']:.3f} [{r[key]['min']:.3f}, {r[key]['max']:.3f}]"
            for key in ("mean_at_k", "pass_at_1", "pass_at_k", "distinct_2")
        ]
        lines.append(f"{m:<8} " + " ".join(f"{c:>22}" for c in cells))
    return "\n".join(lines)


def _one_seed_caption(seed: int) -> str:
    return (
        f"one seed (seed {seed}), illustration only: not a ranking of the methods "
        "(the warm-up pass rate alone varies several-fold across seeds); --seeds N gives the mean and range"
    )


def _save_figure(fig, path: Path) -> Path:
    """PNG and PDF (TrueType fonts, no creation date), each written atomically."""
    import matplotlib.pyplot as plt

    try:
        for suffix, kw in ((".png", {"dpi": 110}), (".pdf", {"metadata": {"CreationDate": None}})):
            with atomic_path(path.with_suffix(suffix)) as tmp, plt.rc_context({"pdf.fonttype": 42}):
                fig.savefig(tmp, bbox_inches="tight", **kw)
    finally:
        plt.close(fig)
    return path


def _plot(
    curves: dict[str, list], heldout: dict[str, list], log: list[dict], path: Path, k: int, seed: int = 0
) -> tuple[Path, str]:
    """SFT loss, training reward per step and held-out Mean@k per method, captioned as one seed;
    PNG + PDF written atomically. Returns ``(png path, caption)``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.9))
    sft = [e for e in log if e.get("phase") == "sft"]
    axes[0].plot([e["step"] for e in sft], [e["loss"] for e in sft], color="k")
    axes[0].set(title="SFT warm-up" if sft else "SFT warm-up (none: pretrained pi_ref)", xlabel="step")
    axes[0].set(ylabel="token NLL")
    for m, c in curves.items():
        if c:
            axes[1].plot([s for s, _ in c], [r for _, r in c], marker=".", label=m)
    axes[1].set(title="training reward per step (train prompts)", xlabel="optimizer step", ylabel="reward")
    for m, c in heldout.items():
        axes[2].plot([s for s, _ in c], [r for _, r in c], marker="o", label=m)
    axes[2].set(title=f"held-out Mean@{k} (prompts never trained on)", xlabel="optimizer step", ylabel=f"Mean@{k}")
    for ax in axes[1:]:
        if ax.lines:
            ax.legend()
    caption = _one_seed_caption(seed)
    fig.suptitle(caption, fontsize=10.5, color="#b30000")
    fig.tight_layout()
    return _save_figure(fig, path), caption


def _plot_seeds(res: dict[str, Any], runs: list[dict], path: Path, k: int) -> tuple[Path, str]:
    """The summary of :func:`run_demo_seeds`: mean curves over seeds with the min-max band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(res["seeds"])
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.9))
    for r in runs:
        sft = [e for e in r["log"] if e.get("phase") == "sft"]
        axes[0].plot([e["step"] for e in sft], [e["loss"] for e in sft], color="k", alpha=0.6, lw=1)
    axes[0].set(title="SFT warm-up (one line per seed)", xlabel="step", ylabel="token NLL")
    for ax, name, title, ylabel in (
        (axes[1], "curves", "training reward per step (train prompts)", "reward"),
        (axes[2], "heldout_curves", f"held-out Mean@{k} (prompts never trained on)", f"Mean@{k}"),
    ):
        for i, (m, b) in enumerate(res[name].items()):
            if not b["step"]:
                continue
            col = f"C{i}"
            ax.plot(b["step"], b["mean"], marker="o" if name == "heldout_curves" else ".", color=col, label=m)
            ax.fill_between(b["step"], b["min"], b["max"], color=col, alpha=0.18, lw=0)
        ax.set(title=title, xlabel="optimizer step", ylabel=ylabel)
        if ax.lines:
            ax.legend()
    seeds = res["seeds"]
    caption = f"mean over {n} seeds ({seeds[0]}-{seeds[-1]}); bands: min-max over the seeds"
    fig.suptitle(caption, fontsize=10.5)
    fig.tight_layout()
    return _save_figure(fig, path), caption


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
        from tiltlab.llm.models import resolve_model

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
