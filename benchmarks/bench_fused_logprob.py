"""Peak memory and forward+backward time: chunked fused-linear log-probs vs the naive path.

The naive path is what a trainer does by default: materialize the logits, log-softmax, gather,

    logits = hidden @ weight.T                       # [N, V] float32
    logp = log_softmax(logits, -1).gather(-1, ids)   # [N]

The chunked path is ``objectives.fused.fused_linear_logprobs``. Two more variants, for GPUs
(``--variants naive,chunked,liger,trl``; benchmarks/gpu/run.py runs all four):

* ``liger``: Liger-Kernel's fused linear cross-entropy with ``reduction="none"``, log p = -CE;
* ``trl``: the ``[N, V]`` logits in the input dtype, then TRL's ``selective_log_softmax``.

A variant whose library is not installed reports ``status: unavailable``, one that runs out of
memory ``status: oom`` (the worker exits 0 either way). Each variant runs in its own
fresh subprocess (so one variant's allocator state cannot hide or inflate the other's):

* CPU memory: the process's peak resident set size during forward+backward minus its resident
  set size just before (inputs already built). The kernel's peak counter (VmHWM) is reset
  through ``/proc/self/clear_refs`` right before the measured step, so the peak belongs to the
  step alone; where that file is not writable the lifetime peak (``ru_maxrss``) is used, which
  is still the step's peak because setup allocates far less. PyTorch's CPU allocator hands
  large blocks straight to/from the OS, so resident memory tracks tensor allocations; a
  calibration run (allocate and fill a known-size tensor) is recorded to show it.
  (``tracemalloc`` does not see torch allocations; this does.)
* CUDA memory: ``torch.cuda.max_memory_allocated()`` minus the allocation before the step.
* Time: wall clock of forward + backward (``loss = logp.sum(); loss.backward()``), best of
  ``--repeats`` after one untimed warm-up on a small problem; CUDA is synchronized. The
  process CPU time of the same step is recorded too: on a shared machine wall time is
  inflated by other processes, CPU time (single-threaded runs) is not; both ratios are reported.

Both variants also report a checksum of their output and gradients; the parent compares them,
so a fast-but-wrong kernel cannot pass.

Usage (defaults: N = 4096 tokens, V = 151,936 = Qwen vocabulary, H = 512, float32, CPU)::

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 python benchmarks/bench_fused_logprob.py --out results/bench_fused.json
    python benchmarks/bench_fused_logprob.py --device cuda --dtype bfloat16 --hidden 4096
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------------------------
# memory probes (CPU)


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS counter (Linux >= 4.0); False where not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _rss_bytes() -> int:
    kib = _status_kib("VmRSS")
    if kib is not None:
        return kib * 1024
    import psutil  # fallback off Linux

    return psutil.Process().memory_info().rss


def _peak_rss_bytes(reset_ok: bool) -> int:
    kib = _status_kib("VmHWM") if reset_ok else None
    if kib is not None:
        return kib * 1024
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if sys.platform == "darwin" else r * 1024


# ----------------------------------------------------------------------------------------------
# worker: one variant in this process


def _make_inputs(torch, n, v, h, dtype, device, seed):
    # CUDA: drawn on the device (a 151,936 x 4,096 weight is 622M normals); the same seed gives every
    # variant the same inputs on one device, and CPU runs keep their CPU generator
    gen_device = "cuda" if torch.device(device).type == "cuda" else "cpu"
    g = torch.Generator(device=gen_device).manual_seed(seed)
    hidden = (torch.randn(n, h, generator=g, device=gen_device) / h**0.25).to(device=device, dtype=dtype)
    weight = (torch.randn(v, h, generator=g, device=gen_device) / h**0.25).to(device=device, dtype=dtype)
    ids = torch.randint(0, v, (n,), generator=g, device=gen_device).to(device)
    return hidden.requires_grad_(), weight.requires_grad_(), ids


def _step(torch, variant, hidden, weight, ids, args):
    if variant == "naive":
        logits = hidden @ weight.T  # [N, V]
        logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[:, None]).squeeze(-1)
    elif variant == "chunked":
        from tiltlab.objectives.fused import fused_linear_logprobs

        logp = fused_linear_logprobs(hidden, weight, ids, token_chunk=args.token_chunk, vocab_chunk=args.vocab_chunk)
    elif variant == "liger":
        # Liger-Kernel's fused linear cross-entropy, per token (reduction="none": its backward recomputes
        # the chunks and folds in the per-token upstream gradient); log p = -CE; float32 accumulation
        # of the weight gradient, as the chunked path does
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

        logp = -liger_fused_linear_cross_entropy(hidden, weight, ids, reduction="none", accum_dtype=torch.float32)
    elif variant == "trl":
        # what TRL's trainers do: the lm-head matmul in the input dtype ([N, V] logits), then TRL's
        # selective_log_softmax (a Triton kernel on CUDA) on [B, T, V] with T = 1024 tokens per row
        from trl.trainer.utils import selective_log_softmax

        t = 1024 if ids.numel() % 1024 == 0 else ids.numel()
        logits = (hidden @ weight.T).view(-1, t, weight.shape[0])
        logp = selective_log_softmax(logits, ids.view(-1, t)).reshape(-1)
    else:
        raise ValueError(f"unknown variant {variant!r}")
    logp.sum().backward()
    return logp.detach()


def _worker(args) -> dict:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    if args.variant == "calibrate":  # does the probe see a known torch allocation?
        base = _rss_bytes()
        ok = _reset_peak_rss()
        x = torch.empty(256 * 2**20 // 4, dtype=torch.float32).fill_(1.0)  # 256 MiB
        peak = _peak_rss_bytes(ok) - base
        del x
        return {"variant": "calibrate", "allocated_bytes": 256 * 2**20, "measured_bytes": peak}

    try:
        return _measure(torch, args, dtype, dev, cuda, sync)
    except ImportError as e:  # an optional library (liger_kernel, trl) is not installed here
        return {"variant": args.variant, "status": "unavailable", "error": f"{type(e).__name__}: {e}"[:500]}
    except (torch.OutOfMemoryError, RuntimeError) as e:
        if isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower():
            return {"variant": args.variant, "status": "oom", "error": f"{type(e).__name__}: {e}"[:500]}
        raise


def _measure(torch, args, dtype, dev, cuda, sync) -> dict:
    # warm-up on a small problem (library init, thread pools, kernel selection)
    hw, ww, iw = _make_inputs(torch, 64, 1024, args.hidden, dtype, dev, 1)
    _step(torch, args.variant, hw, ww, iw, args)
    del hw, ww, iw

    hidden, weight, ids = _make_inputs(torch, args.n, args.vocab, args.hidden, dtype, dev, args.seed)
    times, cpu_times, peaks = [], [], []
    out = None
    for _ in range(args.repeats):
        hidden.grad = None
        weight.grad = None
        sync()
        if cuda:
            torch.cuda.empty_cache()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        else:
            base = _rss_bytes()
            reset_ok = _reset_peak_rss()
        t0, c0 = time.perf_counter(), time.process_time()
        out = _step(torch, args.variant, hidden, weight, ids, args)
        sync()
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - c0)
        peaks.append(torch.cuda.max_memory_allocated() - base if cuda else _peak_rss_bytes(reset_ok) - base)
    out = out.float()
    if args.perturb_output:  # a self-test of the callers' comparisons: a deliberately wrong output
        out = out + args.perturb_output
    if args.save_logp:  # the per-token log-probs, for a caller that compares variants token by token
        torch.save(out.cpu(), args.save_logp)
    return {
        "variant": args.variant,
        "status": "ok",
        "time_s": min(times),
        "tokens_per_s": args.n / min(times) if min(times) > 0 else None,
        "times_s": times,
        "cpu_time_s": cpu_times[times.index(min(times))],
        "cpu_times_s": cpu_times,
        "peak_bytes": max(peaks),
        "memory_method": "cuda.max_memory_allocated"
        if cuda
        else ("VmHWM after clear_refs" if reset_ok else "ru_maxrss"),
        "checksum": {
            "logp_sum": float(out.double().sum()),
            "grad_hidden_norm": float(hidden.grad.double().norm()),
            "grad_weight_norm": float(weight.grad.double().norm()),
            "grad_hidden_dot": float((hidden.grad.double() * hidden.detach().double()).sum()),
        },
    }


# ----------------------------------------------------------------------------------------------
# parent: run each variant in a subprocess, compare, write JSON + markdown


def _run_variant(variant: str, args) -> dict:
    """One variant in a fresh subprocess: its result dict (``status`` ok, oom or unavailable);
    RuntimeError when the worker crashed."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--variant", variant]
    for k in ("n", "vocab", "hidden", "dtype", "device", "token_chunk", "vocab_chunk", "repeats", "seed", "threads"):
        cmd += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
    for k in ("save_logp", "perturb_output"):
        if getattr(args, k, None):
            cmd += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    print(f"[bench] running {variant} ...", file=sys.stderr, flush=True)
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"variant {variant} failed (rc={res.returncode}):\n{res.stderr[-4000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def _ratio(num: float, den: float) -> float | None:
    """``num / den``, or None where the denominator measured 0 (RSS growth below a page, a CPU time
    below the clock's resolution): a tiny problem has no ratio, not an infinite one."""
    return num / den if den > 0 else None


MEMORY_BOUND, TIME_BOUND = 0.25, 1.5
"""The bounds the chunked path is measured against: peak memory <= 0.25 x and wall time <= 1.5 x the naive path's."""


def _summary(nv: dict, ch: dict) -> dict:
    """Chunked vs naive: the three ratios (None where the naive run measured 0), the largest relative
    checksum difference, and whether each bound is met (None where its ratio is None)."""
    diffs = [abs(ch["checksum"][k] - v) / max(abs(v), 1e-12) for k, v in nv["checksum"].items()]
    summary = {
        "memory_ratio": _ratio(ch["peak_bytes"], nv["peak_bytes"]),
        "time_ratio": _ratio(ch["time_s"], nv["time_s"]),
        "cpu_time_ratio": _ratio(ch["cpu_time_s"], nv["cpu_time_s"]),
        "max_rel_checksum_diff": max(diffs),
    }
    m, t = summary["memory_ratio"], summary["time_ratio"]
    summary["memory_ok"] = None if m is None else m <= MEMORY_BOUND
    summary["time_ok"] = None if t is None else t <= TIME_BOUND
    return summary


def _fmt_bound(value: float | None, ok: bool | None, bound: str | None) -> str:
    if value is None:
        return "n/a (the naive run measured 0" + (f"; bound {bound} not judged)" if bound else ")")
    return f"{value:.3f}" + (f" (bound {bound}: {'met' if ok else 'NOT met'})" if bound else "")


def _markdown(report: dict) -> str:
    c = report["config"]
    lines = [
        f"N = {c['n']} tokens, V = {c['vocab']}, H = {c['hidden']}, {c['dtype']}, device {c['device']} "
        f"({c['threads']} thread(s)), tiles {c['token_chunk']} x {c['vocab_chunk']}, forward + backward",
        "",
        "| variant | peak memory (MiB) | wall time (s) | process CPU time (s) |",
        "|---|---:|---:|---:|",
    ]
    for r in report["results"]:
        if r.get("status", "ok") != "ok":
            lines.append(f"| {r['variant']} | {r['status']} | – | – |")
            continue
        lines.append(f"| {r['variant']} | {r['peak_bytes'] / 2**20:,.0f} | {r['time_s']:.2f} | {r['cpu_time_s']:.2f} |")
    s = report["summary"]
    lines += [
        "",
        f"memory ratio chunked/naive = {_fmt_bound(s['memory_ratio'], s['memory_ok'], f'<= {MEMORY_BOUND:g}')}; "
        f"wall-time ratio chunked/naive = {_fmt_bound(s['time_ratio'], s['time_ok'], f'<= {TIME_BOUND:g}')}; "
        f"CPU-time ratio {_fmt_bound(s['cpu_time_ratio'], None, None)}; "
        f"load average at start {report['config']['loadavg_start']}; "
        f"max relative checksum difference {s['max_rel_checksum_diff']:.2e}",
    ]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=4096, help="tokens")
    p.add_argument("--vocab", type=int, default=151936, help="vocabulary size (Qwen: 151,936)")
    p.add_argument("--hidden", type=int, default=512, help="hidden size H")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--token-chunk", type=int, default=None, help="default: objectives.fused.DEFAULT_(CUDA_)TOKEN_CHUNK")
    p.add_argument("--vocab-chunk", type=int, default=None, help="default: objectives.fused.DEFAULT_(CUDA_)VOCAB_CHUNK")
    p.add_argument("--repeats", type=int, default=1, help="timed repeats per variant (best is reported)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default / OMP_NUM_THREADS)")
    p.add_argument("--variants", default="naive,chunked", help="comma-separated: naive, chunked, liger, trl")
    p.add_argument("--out", default="results/bench_fused.json", help="JSON path; a .md table is written beside it")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--variant", default=None, help=argparse.SUPPRESS)
    p.add_argument("--save-logp", default=None, help=argparse.SUPPRESS)  # worker: torch.save the [N] log-probs
    p.add_argument("--perturb-output", type=float, default=0.0, help=argparse.SUPPRESS)  # worker: add to log-probs
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)

    if args.token_chunk is None or args.vocab_chunk is None:
        sys.path.insert(0, str(REPO_ROOT))
        from tiltlab.objectives import fused

        cuda = args.device.startswith("cuda")
        args.token_chunk = args.token_chunk or (fused.DEFAULT_CUDA_TOKEN_CHUNK if cuda else fused.DEFAULT_TOKEN_CHUNK)
        args.vocab_chunk = args.vocab_chunk or (fused.DEFAULT_CUDA_VOCAB_CHUNK if cuda else fused.DEFAULT_VOCAB_CHUNK)
    if args.worker:
        print(json.dumps(_worker(args)))
        return 0

    import torch

    threads = args.threads or int(os.environ.get("OMP_NUM_THREADS", "0") or 0) or torch.get_num_threads()
    loadavg = [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None
    results = [_run_variant(v, args) for v in args.variants.split(",")]
    by = {r["variant"]: r for r in results if r.get("status") == "ok"}
    summary = _summary(by["naive"], by["chunked"]) if "naive" in by and "chunked" in by else {}
    calibration = _run_variant("calibrate", args) if args.device == "cpu" else None
    report = {
        "config": {
            "n": args.n,
            "vocab": args.vocab,
            "hidden": args.hidden,
            "dtype": args.dtype,
            "device": args.device,
            "threads": threads,
            "token_chunk": args.token_chunk,
            "vocab_chunk": args.vocab_chunk,
            "repeats": args.repeats,
            "torch": torch.__version__,
            "machine": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "loadavg_start": loadavg,
        },
        "results": results,
        "summary": summary,
        "calibration": calibration,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    md = _markdown(report) if summary else ""
    out.with_suffix(".md").write_text(md)
    print(md or json.dumps(report, indent=2))
    return 0 if (not summary or summary["max_rel_checksum_diff"] < 1e-3) else 1


if __name__ == "__main__":
    raise SystemExit(main())
