"""DISA Stage 2's work: embed the labelled prompts (cached), fit the regressor, save it; load it for later
stages (:class:`LogZPredictor`, :func:`predict_log_z`) and annotate a dataset with its predictions.

Import-light (torch etc. are imported inside functions) so the CLI parser builds quickly.
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tiltlab.files import atomic_path
from tiltlab.llm.base import learning_signal as ls
from tiltlab.llm.base.data import load_prompts, save_prompts
from tiltlab.llm.base.models import (
    load_model,
    load_tokenizer,
    masked_mean_pool,
    model_fingerprint,  # the cache key (re-exported: stage2.model_fingerprint)
)
from tiltlab.llm.base.prompts import format_prompt, prompt_text
from tiltlab.llm.disa.stage1 import atomic_write_json, load_stage1, read_manifest
from tiltlab.llm.disa.stage2.config import CONFIG_FILE, REGRESSOR_FILE, Stage2Config
from tiltlab.progress import progress as progress_bar

__all__ = [
    "POOLING",
    "LogZPredictor",
    "annotate_log_z",
    "cached_embeddings",
    "embed_prompts",
    "load_log_z_predictor",
    "model_fingerprint",
    "predict_log_z",
    "run_stage2",
]

POOLING = "mean_last_hidden"


# ---------------------------------------------------------------------------------------------
# embeddings
# ---------------------------------------------------------------------------------------------


def embed_prompts(model, tokenizer, texts: Sequence[str], batch_size: int = 16, progress: bool = False):
    """``[N, H]`` float32 CPU: mean over each text's tokens of the final hidden state (frozen).

    ``texts`` are already formatted (e.g. chat-templated); tokenized without added special
    tokens, right-padded; the pooling ignores padding, so results do not depend on batching.
    """
    import torch

    from tiltlab.llm.base.scoring import hidden_states

    if isinstance(texts, str):
        raise ValueError("texts must be a list of strings")
    dev = next(model.parameters()).device
    out = []
    side = tokenizer.padding_side
    tokenizer.padding_side = "right"
    bar = progress_bar(len(texts), desc="stage2 embedding", unit="prompt", mode=None if progress else "off")
    try:
        for s in range(0, len(texts), batch_size):
            enc = tokenizer(
                list(texts[s : s + batch_size]), return_tensors="pt", padding=True, add_special_tokens=False
            )
            ids, attn = enc["input_ids"].to(dev), enc["attention_mask"].to(dev)
            if bool((attn.sum(-1) == 0).any()):
                raise ValueError("an empty prompt cannot be embedded")
            with torch.no_grad():
                h = hidden_states(model, ids, attn)  # [B, L, H]
                out.append(masked_mean_pool(h.float(), attn).cpu())  # [B, H]
            bar.update(len(texts[s : s + batch_size]))
    finally:
        tokenizer.padding_side = side
        bar.close()
    if not out:
        return torch.zeros(0, 0)
    return torch.cat(out)


def cached_embeddings(
    model,
    tokenizer,
    texts: Sequence[str],
    cache_dir: str | Path,
    model_name: str,
    batch_size: int = 16,
    progress: bool = False,
):
    """:func:`embed_prompts`, cached in ``cache_dir`` as safetensors keyed by
    ``sha256(model fingerprint, pooling, texts)``; a hit skips the model entirely."""
    from safetensors.torch import load_file, save_file

    key = hashlib.sha256()
    key.update(model_fingerprint(model, model_name).encode() + POOLING.encode())
    for t in texts:
        key.update(hashlib.sha256(t.encode()).digest())
    path = Path(cache_dir) / f"emb-{key.hexdigest()[:32]}.safetensors"
    if path.exists():
        return load_file(str(path))["embeddings"], True
    emb = embed_prompts(model, tokenizer, texts, batch_size, progress)
    with atomic_path(path) as tmp:
        save_file(
            {"embeddings": emb.contiguous()},
            str(tmp),
            metadata={"model": str(model_name), "pooling": POOLING, "n": str(len(texts))},
        )
    return emb, False


def _model_ref(name: str) -> str:
    """A local path made absolute (so a later stage finds it from any directory); HF ids unchanged."""
    if name == "tiny" or name.startswith("tiny:"):  # llm.base.models builds these in memory
        return name
    p = Path(name)
    return str(p.resolve()) if p.exists() else name


# ---------------------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------------------


def run_stage2(cfg: Stage2Config, progress: bool = True) -> dict:
    """Embed the labelled prompts, fit the regressor, save it; returns the metrics dict."""
    import torch
    from safetensors.torch import save_file

    from tiltlab.objectives.regressor import fit_regressor

    man = read_manifest(cfg.labels)
    s1 = man.get("config", {})
    embed_name = cfg.embed_model or s1.get("reference")
    if not embed_name:
        raise ValueError("no embedding model: pass embed_model (the Stage 1 manifest names no reference)")
    chat = s1.get("chat_template", True) if cfg.chat_template is None else cfg.chat_template
    # Stage 1's chat-template arguments (e.g. enable_thinking): the embedded prompt is the one pi_ref saw
    template_kwargs = (s1.get("chat_template_kwargs") or None) if chat else None
    if not man.get("complete"):
        warnings.warn(f"Stage 1 run in {cfg.labels} is not complete; fitting on its finished shards only", stacklevel=2)
    _, labels = load_stage1(cfg.labels)
    lab = labels.to_pydict()
    prompts, targets, stage1_texts, dropped = [], [], [], 0
    for i, (p, y) in enumerate(zip(lab["prompt"], lab[cfg.target])):
        if y is None or not math.isfinite(y):
            dropped += 1
            continue
        prompts.append(p)
        targets.append(float(y))
        stage1_texts.append(lab["prompt_text"][i] if "prompt_text" in lab else None)
    if dropped:
        warnings.warn(f"dropped {dropped} prompts with a non-finite {cfg.target} label", stacklevel=2)
    if len(prompts) < 3:
        raise ValueError(f"need >= 3 prompts with finite labels to fit with a held-out split, got {len(prompts)}")

    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = load_tokenizer(embed_name)
    model = load_model(embed_name, dtype=cfg.dtype, device=cfg.device)
    texts = [format_prompt(tok, p, chat, chat_template_kwargs=template_kwargs) for p in prompts]
    same_format = embed_name == s1.get("reference") and chat == s1.get("chat_template", True)
    if same_format and s1.get("tokenizer", "reference") == "reference":
        n_diff = sum(t != s for t, s in zip(texts, stage1_texts) if s is not None)
        if n_diff:
            warnings.warn(
                f"{n_diff} Stage-2 prompt(s) differ from the text pi_ref was conditioned on in Stage 1 "
                "(labels' prompt_text): was the tokenizer's chat template changed?",
                stacklevel=2,
            )
    feats, hit = cached_embeddings(
        model, tok, texts, cfg.cache_dir or out / "embed_cache", embed_name, cfg.embed_batch_size, progress
    )
    del model
    y = torch.tensor(targets, dtype=torch.float32)
    fit_bar = progress_bar(cfg.epochs, desc="stage2 fit", unit="epoch", mode=None if progress else "off")
    fit = fit_regressor(
        feats,
        y,
        val_fraction=cfg.val_fraction,
        epochs=cfg.epochs,
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        hidden=cfg.hidden,
        n_layers=cfg.n_layers,
        batch_size=cfg.fit_batch_size,
        seed=cfg.seed,
        on_epoch=(lambda ep, tr, va: fit_bar.update(1, postfix=f"train MSE {tr:.4g}, val MSE {va:.4g}")),
    )
    fit_bar.close()
    signal = _signal_record(y, fit.val_idx, cfg.target)
    metrics = {
        "n_train": int(fit.train_idx.numel()),
        "n_val": int(fit.val_idx.numel()),
        "n_dropped": dropped,
        "train_mse": fit.train_mse,
        "val_mse": fit.val_mse,
        "val_r2": fit.val_r2,
        "baseline_val_mse": fit.baseline_val_mse,
        "best_epoch": fit.best_epoch,
        "label_mean": float(y.mean()),
        "label_std": float(y.std()) if len(y) > 1 else 0.0,
        "embedding_cache_hit": hit,
    }
    with atomic_path(out / REGRESSOR_FILE) as tmp:
        save_file({k: v.contiguous() for k, v in fit.model.state_dict().items()}, str(tmp))
    config = {
        "format": "tiltlab.stage2/1",
        "regressor": fit.model.config(),
        "embed_model": _model_ref(embed_name),
        "pooling": POOLING,
        "chat_template": bool(chat),
        "chat_template_kwargs": template_kwargs,
        "target": cfg.target,
        "tilt_beta": man.get("tilt_beta"),
        "reward_transform": man.get("reward_transform"),
        "stage1_dir": str(Path(cfg.labels).resolve()),
        "stage2_config": asdict(cfg),
        "metrics": metrics,
        "signal": signal,  # vacuous-run findings (tiltlab.llm.base.learning_signal); [] = checked, none held
        "history": fit.history,
    }
    atomic_write_json(out / CONFIG_FILE, config)
    plot_loss_curve(
        fit.history,
        fit.baseline_val_mse,
        out / "loss_curve.png",
        title=f"Stage 2: val MSE {fit.val_mse:.4g}, R² {fit.val_r2:.3f}",
    )
    return metrics


def _signal_record(y, val_idx, target: str) -> list[dict]:
    """Constant regression targets (R^2 undefined): all finite labels, else the validation split's."""

    found = ls.constant_targets(y.tolist(), what=f"finite {target} labels")
    if found is None:
        found = ls.constant_targets(y[val_idx].tolist(), what=f"validation {target} labels")
    return ls.report([found], stacklevel=3)


def plot_loss_curve(history: dict[str, list[float]], baseline: float, path: Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6), dpi=120)
    ep = range(1, len(history["train_mse"]) + 1)
    ax.plot(ep, history["train_mse"], label="train MSE")
    ax.plot(ep, history["val_mse"], label="validation MSE")
    ax.axhline(baseline, color="grey", ls="--", lw=1, label="predict train mean (R² = 0)")
    ax.set_yscale("log")
    ax.set_xlabel("epoch")
    ax.set_ylabel("MSE of log Z")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        with atomic_path(path) as tmp:  # keeps the .png suffix savefig reads the format from
            fig.savefig(tmp)
    finally:
        plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------
# loading for later stages
# ---------------------------------------------------------------------------------------------


class LogZPredictor:
    """Frozen ``log Z_psi(x)``: embedding model + regressor, as recorded by Stage 2.

    ``predict_log_z(prompts)`` takes raw user-turn prompts (or chat message lists, whose last
    message's content is used) and returns a ``[N]`` float32 CPU tensor, detached.
    """

    def __init__(
        self,
        regressor,
        model,
        tokenizer,
        chat_template: bool,
        batch_size: int = 16,
        config: dict | None = None,
        chat_template_kwargs: dict | None = None,
    ):
        self.regressor = regressor.eval()
        self.model = model
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.chat_template_kwargs = chat_template_kwargs
        self.batch_size = batch_size
        self.config = config or {}

    def predict_log_z(self, prompts: Sequence[Any]):
        import torch

        if isinstance(prompts, str):
            raise ValueError("prompts must be a list")
        texts = [prompt_text(p) for p in prompts]
        feats = embed_prompts(
            self.model,
            self.tokenizer,
            [
                format_prompt(self.tokenizer, t, self.chat_template, chat_template_kwargs=self.chat_template_kwargs)
                for t in texts
            ],
            self.batch_size,
        )
        with torch.no_grad():
            return self.regressor(feats).float().cpu()

    __call__ = predict_log_z


def load_log_z_predictor(
    path: str | Path,
    model=None,
    tokenizer=None,
    embed_model: str | None = None,
    dtype: str = "auto",
    device: str | None = None,
    batch_size: int = 16,
) -> LogZPredictor:
    """Load a Stage-2 directory. Pass an already loaded ``model``/``tokenizer`` (e.g. Stage 3's
    frozen pi_ref when it is the embedding model) to avoid loading it twice, or ``embed_model``
    to override the recorded path (e.g. on another machine)."""
    from safetensors.torch import load_file

    from tiltlab.objectives.regressor import PartitionRegressor

    path = Path(path)
    cfg_path = path / CONFIG_FILE
    if not cfg_path.exists():
        raise FileNotFoundError(f"no Stage 2 regressor config at {cfg_path}")
    config = json.loads(cfg_path.read_text())
    reg = PartitionRegressor(**config["regressor"])
    reg.load_state_dict(load_file(str(path / REGRESSOR_FILE)))
    if model is None or tokenizer is None:
        name = embed_model or config["embed_model"]
        model = model if model is not None else load_model(name, dtype=dtype, device=device)
        tokenizer = tokenizer if tokenizer is not None else load_tokenizer(name)
    chat = bool(config["chat_template"])
    kwargs = config.get("chat_template_kwargs") if chat else None
    return LogZPredictor(reg, model, tokenizer, chat, batch_size, config, chat_template_kwargs=kwargs)


def predict_log_z(prompts: Sequence[Any], path: str | Path | LogZPredictor, **load_kwargs):
    """``[N]`` predicted ``log Z(x)`` for raw prompts from a Stage-2 directory (or a loaded predictor)."""
    pred = path if isinstance(path, LogZPredictor) else load_log_z_predictor(path, **load_kwargs)
    return pred.predict_log_z(prompts)


def annotate_log_z(
    stage2_dir: str | Path | LogZPredictor,
    dataset: str | Path | list[dict],
    out: str | Path,
    column: str = "log_z",
    batch_size: int = 64,
    progress: bool = True,
    **load_kwargs,
) -> Path:
    """Write ``dataset`` (a path or rows, read by :func:`tiltlab.llm.base.data.load_prompts`) to ``out``
    (``.jsonl`` / ``.parquet``) with a ``column`` of Stage-2 predictions ``log Z_psi(x)``, so that
    DISA Stage 3 (``disa.label: column``) reads the frozen partition function from the data and
    loads no second model. The file is written atomically; an existing ``column`` is refused."""

    import torch

    rows = load_prompts(dataset)
    if not rows:
        raise ValueError(f"annotate_log_z: the dataset {dataset!r} has no rows")
    if column in rows[0]:
        raise ValueError(f"annotate_log_z: the dataset already has a {column!r} column; write to another column")
    pred = stage2_dir if isinstance(stage2_dir, LogZPredictor) else load_log_z_predictor(stage2_dir, **load_kwargs)

    vals = []
    with progress_bar(len(rows), desc="stage2 annotate log Z", unit="prompt", mode=None if progress else "off") as bar:
        for s in range(0, len(rows), batch_size):
            vals.append(pred.predict_log_z([r["prompt"] for r in rows[s : s + batch_size]]))
            bar.update(len(rows[s : s + batch_size]))
    log_z = torch.cat(vals)
    if log_z.numel() != len(rows) or not torch.isfinite(log_z).all():
        raise ValueError("annotate_log_z: the predictor returned a non-finite or wrong number of log Z values")
    out = Path(out)
    with atomic_path(out) as tmp:  # keeps the suffix save_prompts reads the format from
        save_prompts([{**r, column: float(v)} for r, v in zip(rows, log_z.tolist())], tmp)
    return out
