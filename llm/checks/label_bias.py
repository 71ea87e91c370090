"""The selection bias of the real-model comparison's Stage-1 label, measured against fresh samples.

With ``q = pi_ref`` the Stage-1 label of a prompt is not an importance-sampled estimate in any useful
sense: every weight is 1, so ``log Z_hat_8 = log mean_j exp(beta r_j) = log(1 + (k/8)(e^beta - 1))``
with ``k`` the number of correct samples of 8 -- a *pass-rate plug-in*. The comparison then keeps the
prompts whose pass rate ``k/8`` lies in ``[1/8, 7/8]``, judged on the *same* 8 samples, so the kept
labels are conditioned on their own noise: a prompt that drew more correct samples than its pass rate
gives is more often kept (from below 1/8) and carries a label that is too high.

:func:`label_bias` measures it the way a reviewer would: Stage 1 and the selection exactly as the
check runs them (:func:`tiltlab.llm.checks.real_comparison.make_task`), then ``fresh_m`` fresh samples
of ``pi_ref`` on every kept prompt with another seed, and per prompt ``label - log(1 + p_fresh (e^beta -
1))``, over the held-out prompts and over all kept ones (mean with its 95% t-interval over prompts).
The fresh plug-in has its own (smaller, downward: Jensen) bias; :func:`plugin_bias` estimates it per
prompt at the fresh pass rate, and ``label - truth`` is about ``(label - fresh) + (fresh - truth)``. Run::

    python -m tiltlab.llm.checks.label_bias --out results/label_bias.json

(Stage 1 on 300 prompts and 40 fresh samples of each kept prompt: about 30 minutes on two CPU cores;
the measurement of 2026-12-01 is benchmarks/records/label_bias.json.)
"""

from __future__ import annotations

import argparse
import math
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tiltlab.claims import stats
from tiltlab.files import write_json
from tiltlab.llm.base.data import load_prompts
from tiltlab.llm.base.models import resolve_model
from tiltlab.llm.base.rollout import VLLMEngine
from tiltlab.llm.checks import real_comparison as C
from tiltlab.llm.disa.stage1 import Stage1Config, load_stage1, run_stage1

__all__ = ["label_bias", "main", "plugin_bias", "plugin_label", "summarize"]


def plugin_label(pass_rate: float, beta: float) -> float:
    """``log(1 + p (e^beta - 1))``: the log-mean-exp of ``beta r`` over samples with a 0/1 reward whose
    mean is ``p`` (what Stage 1 with ``q = pi_ref`` writes as ``log_z``)."""
    if not 0.0 <= pass_rate <= 1.0:
        raise ValueError(f"pass_rate must lie in [0, 1], got {pass_rate}")
    return math.log1p(pass_rate * math.expm1(beta))


def plugin_bias(pass_rate: float, m: int, beta: float) -> float:
    """``E[plugin(k/m)] - plugin(p)`` for ``k ~ Binomial(m, p)``: the plug-in label's own bias at ``m``
    samples (negative: the log is concave), exact by enumeration."""
    p = pass_rate
    return math.fsum(math.comb(m, k) * p**k * (1 - p) ** (m - k) * plugin_label(k / m, beta) for k in range(m + 1)) - (
        plugin_label(p, beta)
    )


def summarize(
    labels: Mapping[str, float], fresh_rates: Mapping[str, float], ids: Sequence[str], beta: float
) -> dict[str, float]:
    """``{"n", "mean", "lo", "hi"}``: per prompt of ``ids``, the recorded label minus the plug-in label of
    the fresh pass rate (positive: the kept label is too high), its mean and 95% t-interval over prompts."""
    diffs = [labels[i] - plugin_label(fresh_rates[i], beta) for i in ids]
    m, lo, hi = stats.paired_t_ci(diffs)
    return {"n": float(len(diffs)), "mean": m, "lo": lo, "hi": hi}


def label_bias(seed: int = 0, fresh_m: int = 40, root: Path | None = None) -> dict[str, Any]:
    """Stage 1 and the selection of the comparison's task at ``seed``, then ``fresh_m`` fresh samples per
    kept prompt (module docstring): the bias on the held-out and on all kept prompts, and the inputs."""

    model_dir = resolve_model(C.ALIAS)
    with tempfile.TemporaryDirectory(prefix="tiltlab-label-bias-") as tmp:
        work = Path(root) if root is not None else Path(tmp)
        task = C.make_task(work, model_dir, seed)
        kept = load_prompts(str(work / "selected.jsonl"))
        held = {str(r["id"]) for r in load_prompts(task["heldout"])}
        cfg = Stage1Config(
            proposal=model_dir,
            reference=model_dir,
            dataset=str(work / "selected.jsonl"),
            out_dir=str(work / "fresh"),
            M=fresh_m,
            tilt_beta=C.BETA,
            reward="math",
            max_new_tokens=C.NEW_TOKENS,
            seed=seed + 7919,  # another sampling seed than the labels' (Stage 1 ran at ``seed``)
            engine="vllm",
            dtype="fp32",
            device="cpu",
            max_model_len=C.MAX_MODEL_LEN,
            prompts_per_shard=len(kept),
        )
        engine = VLLMEngine(
            model_dir,
            dtype="fp32",
            seed=cfg.seed,
            max_model_len=C.MAX_MODEL_LEN,
            kv_cache_memory_bytes=C.EVAL_KV_CACHE_BYTES,
        )
        try:
            run_stage1(cfg, progress=True, engine=engine)
        finally:
            engine.close()
        _, fresh = load_stage1(cfg.out_dir)
    rates = dict(zip(fresh.column("prompt_id").to_pylist(), fresh.column("mean_reward").to_pylist()))
    labels = {str(r["id"]): float(r["log_z"]) for r in kept}
    kept_rates = {str(r["id"]): float(r["ref_pass_rate"]) for r in kept}
    ids = [str(r["id"]) for r in kept]
    held_ids = [i for i in ids if i in held]
    return {
        "seed": seed,
        "beta": C.BETA,
        "select_m": C.SELECT_M,
        "fresh_m": fresh_m,
        "n_candidates": task["n_labelled"],
        "heldout": summarize(labels, rates, held_ids, C.BETA),
        "all_kept": summarize(labels, rates, ids, C.BETA),
        "fresh_plugin_bias_mean": math.fsum(plugin_bias(rates[i], fresh_m, C.BETA) for i in ids) / len(ids),
        "pass_rate_kept_mean": sum(kept_rates.values()) / len(ids),
        "pass_rate_fresh_mean": sum(rates[i] for i in ids) / len(ids),
        "prompts": [
            {
                "id": i,
                "heldout": i in held,
                "label": labels[i],
                "pass_rate_8": kept_rates[i],
                "pass_rate_fresh": rates[i],
            }
            for i in ids
        ],
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tiltlab.llm.checks.label_bias", description=__doc__.split("\n")[0])
    p.add_argument("--seed", type=int, default=0, help="the comparison's task seed (default 0, the shipped run's)")
    p.add_argument("--fresh-m", type=int, default=40, help="fresh samples per kept prompt (default 40)")
    p.add_argument("--out", type=Path, help="write the result as JSON here")
    a = p.parse_args(argv)
    if a.fresh_m < 2:
        p.error(f"--fresh-m must be >= 2, got {a.fresh_m}")
    res = label_bias(a.seed, a.fresh_m)
    for k in ("heldout", "all_kept"):
        s = res[k]
        print(
            f"{k}: label - fresh plug-in {s['mean']:+.3f} [{s['lo']:+.3f}, {s['hi']:+.3f}] nats over {int(s['n'])} prompts"
        )
    if a.out:
        write_json(a.out, res, indent=1)
        print(f"written to {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
