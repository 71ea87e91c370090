"""Stage-1 wall time vs pure vLLM sampling of the same samples, for the three ways pi_ref is scored.

* **(a)** proposal = reference, T = 1, untruncated: ``reference_scoring="sampler"``, no scoring pass
  (the sampled log-probs are pi_ref's). Goal: overhead <= 10%.
* **(b)** the same model at T = 0.7 with top-p 0.9 (allowed): one pass of prompt log-probs on the
  proposal's engine that reads each prompt's KV from the prefix cache.

For (a) and (b) the scoring pass Stage 1 made before (prompt log-probs of every ``x + y`` with the
prefix cache unread) is timed too on the same samples (``score_uncached_s``), with the largest
difference between its log pi_ref and the one Stage 1 recorded.
* **(c)** a distinct reference (a copy of the model in another directory: a different model as far as
  Stage 1 can tell, with the same cost): a second vLLM engine scores shard k in a worker thread while
  the proposal samples shard k + 1. For comparison the same case with transformers teacher forcing.

One proposal engine (built by ``llm.disa.stage1.vllm_proposal_engine`` for case (b): on CPU its KV blocks
are 32 tokens) and, for (c), one reference engine (``vllm_reference_engine``) are started once and
warmed up; engine starts are not part of any timing. For each case, back to back:

1. **sampling**: ``engine.generate`` on the formatted prompts, shard by shard with Stage 1's per-shard
   seeds (``Stage1Config.sampling(k)``): exactly the sampling calls Stage 1 makes, nothing else;
2. **stage 1**: ``run_stage1(cfg, engine=..., reference_engine=...)`` into a fresh directory.

overhead = (stage-1 wall - sampling wall) / sampling wall, from walls a minute apart; on a machine shared
with other jobs the load drifts between the two, so the report also gives overhead_within_run =
(stage-1 wall - stage-1's own sample phase) / that phase, both from one invocation (the same sampling
calls, timed inside Stage 1). Stage 1's manifest gives its phases (setup, sample, score, score_wait,
reward, weights, io; see ``llm.disa.stage1.pipeline._PhaseTimer``) and the scoring facts of each shard.

Usage::

    OMP_NUM_THREADS=2 python benchmarks/stage1_overhead.py --model smollm2-135m --prompts 16 --M 8 \\
        --max-new-tokens 48 --prompts-per-shard 8 --out results/stage1_overhead.json

Without ``--model`` the tiny random Qwen3 (head_dim 32, vLLM CPU's smallest) is built in a temporary
directory. The measured table is in docs/llm-runs.md ("Stage 1 at engine speed").
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import shutil
import tempfile
import time
from pathlib import Path

CASES = ("a", "b", "c", "c_hf")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="local model dir or alias (e.g. smollm2-135m); default: tiny")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--M", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--prompts-per-shard", type=int, default=8)
    ap.add_argument("--score-batch-size", type=int, default=16)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {CASES}")
    ap.add_argument("--out", default=None, help="write the JSON report here")
    args = ap.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    if bad := [c for c in cases if c not in CASES]:
        ap.error(f"--cases: unknown {bad}; expected a subset of {CASES}")

    from tiltlab.llm.base.models import resolve_model
    from tiltlab.llm.base.prompts import format_prompt
    from tiltlab.llm.base.tasks import arithmetic_tasks
    from tiltlab.llm.disa.stage1 import (
        Stage1Config,
        load_stage1,
        read_manifest,
        run_stage1,
        vllm_proposal_engine,
        vllm_reference_engine,
    )

    tmp = Path(tempfile.mkdtemp(prefix="stage1_overhead_"))
    if args.model is None:
        from tiltlab.llm.base.models import build_tiny

        model = str(tmp / "tiny")
        build_tiny(out_dir=model, seed=0, head_dim=32)
    else:
        model = resolve_model(args.model)
    reference = str(tmp / "reference_copy")  # a distinct path: Stage 1 treats it as another model
    if any(c.startswith("c") for c in cases):
        shutil.copytree(model, reference)
    rows = [{k: r[k] for k in ("id", "prompt", "answer")} for r in arithmetic_tasks(args.prompts, seed=0)]

    def cfg(case: str, out: str) -> Stage1Config:
        kw: dict = {}
        if case == "b":
            kw = dict(temperature=0.7, top_p=0.9, allow_truncated=True)
        elif case in ("c", "c_hf"):
            kw = dict(reference=reference, reference_scoring="vllm" if case == "c" else "hf")
        return Stage1Config(
            proposal=model,
            reference=kw.pop("reference", model),
            dataset="synthetic",
            out_dir=out,
            M=args.M,
            max_new_tokens=args.max_new_tokens,
            engine="vllm",
            reward="math",
            dtype=args.dtype,
            device="cpu",
            prompts_per_shard=args.prompts_per_shard,
            score_batch_size=args.score_batch_size,
            seed=0,
            **kw,
        )

    from tiltlab.llm.base.rollout import SamplingConfig

    t0 = time.perf_counter()
    engine = vllm_proposal_engine(cfg("b", str(tmp / "unused")))
    starts = {"proposal_engine_s": round(time.perf_counter() - t0, 1)}
    ref_engine = None
    if "c" in cases:
        t0 = time.perf_counter()
        ref_engine = vllm_reference_engine(cfg("c", str(tmp / "unused")))
        starts["reference_engine_s"] = round(time.perf_counter() - t0, 1)
    tok = engine.tokenizer
    pids = [tok(format_prompt(tok, r["prompt"]), add_special_tokens=False)["input_ids"] for r in rows]
    engine.generate(pids[:2], 2, SamplingConfig(max_new_tokens=4, seed=123))  # warm-up
    if ref_engine is not None:
        ref_engine.generate(pids[:2], 2, SamplingConfig(max_new_tokens=4, seed=123))

    pp = args.prompts_per_shard
    report: dict = {
        "model": args.model or "tiny (random, head_dim 32)",
        "dtype": args.dtype,
        "prompts": len(rows),
        "M": args.M,
        "max_new_tokens": args.max_new_tokens,
        "prompts_per_shard": pp,
        **starts,
        "cases": {},
    }
    for case in cases:
        c = cfg(case, str(tmp / f"run_{case}"))
        t0 = time.perf_counter()
        pure = []
        for k in range(0, len(rows), pp):
            pure += engine.generate(pids[k : k + pp], args.M, c.sampling(k // pp))
        t_sample = time.perf_counter() - t0

        t0 = time.perf_counter()
        summary = run_stage1(c, rows=rows, engine=engine, reference_engine=ref_engine if case == "c" else None)
        t_stage1 = time.perf_counter() - t0
        man = read_manifest(c.out_dir)
        samples = load_stage1(c.out_dir)[0]
        ids = samples.column("completion_ids").to_pylist()
        pure_ids = [x for g in pure for x in g.completion_ids]
        row = {
            "reference_scoring": man["reference_scoring"],
            "completion_tokens": sum(len(x) for x in ids),
            "sampling_s": round(t_sample, 3),
            "stage1_s": round(t_stage1, 3),
            "overhead": round((t_stage1 - t_sample) / t_sample, 4),
            "overhead_without_setup": round((t_stage1 - man["seconds"].get("setup", 0.0) - t_sample) / t_sample, 4),
            # the same ratio against Stage 1's own sampling phase: both walls from one invocation
            "overhead_within_run": round((t_stage1 - man["seconds"]["sample"]) / man["seconds"]["sample"], 4),
            "stage1_phases_s": {k: round(v, 3) for k, v in man["seconds"].items()},
            "shard_scoring": [s["reference_scoring"] for s in man["shards"].values()],
            "same_completions": round(sum(a == b for a, b in zip(ids, pure_ids)) / len(pure_ids), 4),
            "mean_log_z": summary["mean_log_z"],
        }
        if case in ("a", "b"):  # the scoring pass of the path before: prompt log-probs, prefix cache unread
            from vllm import SamplingParams

            by_id = dict(zip([r["id"] for r in rows], pids))
            reqs = [
                {"prompt_token_ids": by_id[p] + c_ids} for p, c_ids in zip(samples.column("prompt_id").to_pylist(), ids)
            ]
            params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False, temperature=1.0, seed=0)
            t0 = time.perf_counter()
            outs = engine.llm.generate(reqs, params, use_tqdm=False)
            row["score_uncached_s"] = round(time.perf_counter() - t0, 3)
            assert all(o.num_cached_tokens == 0 for o in outs)
            got = samples.column("logp_ref").to_pylist()
            pl = [len(by_id[p]) for p in samples.column("prompt_id").to_pylist()]
            want = [
                math.fsum(o.prompt_logprobs[n + t][x].logprob for t, x in enumerate(c_ids))
                for n, c_ids, o in zip(pl, ids, outs)
            ]
            row["max_abs_logp_ref_diff_vs_uncached"] = max(abs(a - b) for a, b in zip(got, want))
            row["max_abs_logp_ref_diff_per_token_vs_uncached"] = max(
                abs(a - b) / len(c_ids) for a, b, c_ids in zip(got, want, ids)
            )
        report["cases"][case] = row
        print(json.dumps({case: row}), flush=True)
    report["python"] = platform.python_version()
    report["machine"] = platform.machine()
    if ref_engine is not None:
        ref_engine.close()
    engine.close()  # stop the engine processes before interpreter exit
    print(json.dumps(report, indent=2))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
