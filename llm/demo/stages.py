"""The demo's stages on one seed: the task split, the SFT warm-up, the held-out evaluation, DISA
Stages 1-2 and the RL runs of each method (see :mod:`tiltlab.llm.demo`)."""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

from tiltlab.llm.base.models import load_model, load_tokenizer
from tiltlab.llm.base.prompts import format_prompt
from tiltlab.llm.base.rewards import math_reward
from tiltlab.llm.base.rollout import HFEngine, SamplingConfig
from tiltlab.llm.base.tasks import BOXED_INSTRUCTION
from tiltlab.llm.disa.stage1 import Stage1Config, read_manifest, run_stage1
from tiltlab.llm.disa.stage2.config import Stage2Config
from tiltlab.llm.disa.stage2.run import load_log_z_predictor, run_stage2
from tiltlab.objectives.metrics import distinct_n, pass_at_k

from .config import DemoConfig


def _split(cfg: DemoConfig) -> tuple[list[dict], list[dict]]:
    """The demo task, made easy enough for a 2-layer, 64-wide model to learn on CPU in seconds:
    ``Compute a + 0.`` for two-digit ``a`` (the answer copies ``a``). Train and held-out values of
    ``a`` are disjoint, so held-out gains measure a learned behaviour, not memorized answers."""

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

    return format_prompt(tok, prompt)


def sft_warmup(model, tok, rows: list[dict], cfg: DemoConfig, log: list, bar=None) -> None:
    """SFT on ``\\boxed{answer}`` (+ end of turn); a ``sft_noise`` fraction of the targets is wrong
    (the answer with a stray ``0`` appended, a prompt-independent error RL can learn to avoid).
    ``bar``: a :class:`tiltlab.progress.Progress` advanced by one per optimizer step."""
    import torch

    from tiltlab.llm.base.scoring import score_completions
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
    """DISA Stage 1 (:func:`llm.disa.stage1.run_stage1`, ``q = pi_ref``) and Stage 2
    (:func:`llm.disa.stage2.run.run_stage2`); returns (Stage-1 manifest, the frozen ``predict_log_z``)."""

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
        tilt_beta=cfg.tilt_beta,
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

    from tiltlab.llm.train.online import TiltGRPOConfig, TiltGRPOTrainer

    model, tok = load_model(ref_dir, device="cpu"), load_tokenizer(ref_dir)
    ds = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]} for r in train]
    )
    extra: dict[str, Any] = {}
    if method in ("disa", "flowrl"):  # one target pi* ~ pi_ref exp(beta r) for both
        extra = dict(
            tilt_beta=cfg.tilt_beta, reward_transform="affine", reward_scale=1.0, reward_shift=0.0, logprob_scale="sum"
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
