"""The demo's table (stdout) and figures (``curves.png`` / ``.pdf``), for one seed or the mean over seeds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tiltlab.files import atomic_path


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
