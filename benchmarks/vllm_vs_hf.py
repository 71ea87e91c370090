"""Rollout throughput: vLLM (:class:`tiltlab.llm.base.rollout.VLLMEngine`) vs transformers
(:class:`tiltlab.llm.base.rollout.HFEngine`) on the same prompts, samples per prompt and length limit.

Each engine samples ``--n`` completions of ``--max-new-tokens`` tokens at most for ``--prompts``
synthetic arithmetic prompts (chat template applied) after one small warm-up call; tokens/s = sampled
tokens (end-of-sequence included) / wall time of the ``generate`` call. Engine start time is reported
separately. The tiny model is built with ``head_dim=32`` (vLLM's CPU attention has no head size 16).

    OMP_NUM_THREADS=2 python benchmarks/vllm_vs_hf.py
    OMP_NUM_THREADS=2 python benchmarks/vllm_vs_hf.py --model /path/to/SmolLM2-135M-Instruct --no-tiny

Not a test: numbers depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from pathlib import Path


def _prompts(tokenizer, n: int) -> list[str]:
    from tiltlab.llm.base.prompts import format_prompt
    from tiltlab.llm.base.tasks import arithmetic_tasks

    return [format_prompt(tokenizer, r["prompt"]) for r in arithmetic_tasks(n, seed=0)]


def _run(engine, prompts, n, max_new_tokens, seed=0) -> tuple[float, int, float]:
    from tiltlab.llm.base.rollout import SamplingConfig

    engine.generate(prompts[:1], n=1, sampling=SamplingConfig(max_new_tokens=4, seed=seed))  # warm-up
    t = time.perf_counter()
    groups = engine.generate(prompts, n=n, sampling=SamplingConfig(max_new_tokens=max_new_tokens, seed=seed))
    dt = time.perf_counter() - t
    tokens = sum(len(c) for g in groups for c in g.completion_ids)
    finished = sum(sum(g.finished) for g in groups) / (len(groups) * n)
    return dt, tokens, finished


def bench_model(label: str, path: str, args) -> list[dict]:
    from tiltlab.llm.base.models import load_model, load_tokenizer
    from tiltlab.llm.base.rollout import HFEngine, VLLMEngine

    tok = load_tokenizer(path)
    prompts = _prompts(tok, args.prompts)
    rows = []
    t = time.perf_counter()
    hf = HFEngine(load_model(path, dtype=args.hf_dtype, device="cpu"), tok, batch_size=args.hf_batch_size)
    start = time.perf_counter() - t
    dt, ntok, fin = _run(hf, prompts, args.n, args.max_new_tokens)
    rows.append(dict(model=label, engine="transformers", dtype=args.hf_dtype, start=start, s=dt, tokens=ntok, fin=fin))
    del hf
    t = time.perf_counter()
    vl = VLLMEngine(path, dtype=args.vllm_dtype, enforce_eager=not args.compile, max_model_len=args.max_model_len)
    start = time.perf_counter() - t
    dt, ntok, fin = _run(vl, prompts, args.n, args.max_new_tokens)
    rows.append(dict(model=label, engine="vllm", dtype=args.vllm_dtype, start=start, s=dt, tokens=ntok, fin=fin))
    vl.close()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", action="append", default=[], help="extra model directory (repeatable)")
    p.add_argument("--no-tiny", action="store_true", help="skip the tiny random model")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--n", type=int, default=4, help="samples per prompt")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--hf-dtype", default="float32")
    p.add_argument("--hf-batch-size", type=int, default=64)
    p.add_argument("--vllm-dtype", default="bfloat16")
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--compile", action="store_true", help="vLLM with torch.compile (slower start, faster decode)")
    args = p.parse_args()
    models = []
    tmp = tempfile.TemporaryDirectory()
    if not args.no_tiny:
        from tiltlab.llm.base.models import build_tiny

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            build_tiny(out_dir=tmp.name, seed=0, head_dim=32)
        models.append(("tiny (Qwen3, 2 layers, head_dim 32)", tmp.name))
    for m in args.model:
        if not Path(m).is_dir():
            raise SystemExit(f"--model {m}: no such directory")
        models.append((Path(m).name, m))
    rows = [r for label, path in models for r in bench_model(label, path, args)]
    print(f"\n{args.prompts} prompts x {args.n} samples, <= {args.max_new_tokens} new tokens, CPU")
    print("| model | engine | dtype | start (s) | tokens | finished | generate (s) | tokens/s | vs transformers |")
    print("|---|---|---|---|---|---|---|---|---|")
    base = {}
    for r in rows:
        tps = r["tokens"] / r["s"]
        base.setdefault(r["model"], tps)
        print(
            f"| {r['model']} | {r['engine']} | {r['dtype']} | {r['start']:.1f} | {r['tokens']} | {r['fin']:.2f} | "
            f"{r['s']:.2f} | {tps:.1f} | {tps / base[r['model']]:.1f}x |"
        )
    tmp.cleanup()


if __name__ == "__main__":
    main()
