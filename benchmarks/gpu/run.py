"""The GPU proof in one prepared call (issue 38): the gpu tests, the fused log-prob benchmark and a few
real GRPOTrainer steps, written to ONE JSON record.

One device call runs this end to end (benchmarks/gpu/README.md gives the exact command; an estimated 6
of its 10 minutes on an H100, not yet measured). Sections:

1. **pytest**: ``pytest -m gpu`` on the test files that carry a ``@pytest.mark.gpu`` test (a subprocess;
   its junit XML is parsed into per-test outcomes). On CUDA at least one must pass and none may fail.
2. **fused**: ``benchmarks/bench_fused_logprob.py``'s workers, one fresh process per (variant, dtype, N):
   tiltlab's ``fused_linear_logprobs`` (``chunked``), Liger-Kernel's fused linear cross-entropy with
   ``reduction="none"`` (``liger``), the ``[N, V]`` logits + TRL's ``selective_log_softmax`` (``trl``) and
   ``log_softmax(...).gather`` (``naive``); V = 151,936, H = 4,096, N = 4k / 16k / 64k, bf16 and fp32;
   forward + backward of ``logp.sum()``: tokens/s and peak CUDA memory. A variant that runs out of memory
   is recorded ``oom``. Per (dtype, N) every variant's per-token log-probs and gradient checksums are
   compared with a reference variant (naive where it ran, else chunked) within :data:`FUSED_TOL`.
3. **grpo**: TRL ``GRPOTrainer`` steps with tiltlab's ``TiltGRPOTrainer`` (DISA, FlowRL with its learned
   log Z head, GRPO) and with TRL's own ``GRPOTrainer`` (its GRPO loss: the baseline), on a Qwen3-0.6B-
   config model, random init from the config (no weights can be fetched; saved with bf16 values),
   built as ``tiltlab llm train`` builds it (the model passed as a path: TRL loads float32 weights and
   ``bf16=True`` runs under bf16 autocast), transformers generation.
   Per step: generation (``_generate_and_score_completions``: sampling, rewards, reference scoring),
   loss (``compute_loss``) and backward (``accelerator.backward``), CUDA-synchronized. One fixed batch
   (sampled before the first update) is scored after the last step by ``compute_loss`` in that
   precision and, in a subprocess on the device's CPU, in float32 from the same trained weights and
   tokens (behaviour and reference log-probs recomputed in float32 from the initial weights): the
   loss and the per-token log-probs must agree within :data:`LOSS_TOL` / :data:`LOGP_TOL`.

Performance goals, REPORTED (booleans in ``goals``), never asserted: the fused path at least as fast as
Liger's in bf16 at no more peak memory; each tiltlab objective's loss + backward time at most 1.05x
TRL's GRPO loss + backward time.

The record (``--out DIR`` -> ``DIR/gpu.json``) holds the GPU, the versions, the git commit (from git,
else ``--commit`` / ``TILTLAB_GIT_COMMIT``, else the stamp prepare.py wrote into ``.whl/``) and every
number; the exit status is 1 when any comparison, test or section failed. ``--device cpu --tiny`` runs
the same code at toy sizes on a CPU (Liger recorded ``unavailable``: its kernels are Triton-GPU only;
on CUDA a missing Liger is an error, because the kit carries it). ``--perturb fused|loss`` deliberately
corrupts one output, so a test can see the comparisons fail.

vLLM is never used: it is hidden from this process (``sys.modules["vllm"] = None``), as on the device,
which has none; TRL then does not import it (30 s on a small CPU).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SCHEMA = 1
RECORD_NAME = "gpu.json"

PREPARE_COMMAND = "python benchmarks/gpu/prepare.py"
DEVICE_COMMAND = (
    "set -o pipefail; python3 benchmarks/gpu/prepare.py --verify && "
    "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "
    ".whl/*.whl && export PYTHONPATH=/tmp/site && "
    'PYTHONUNBUFFERED=1 python3 benchmarks/gpu/run.py --device cuda --out "$OUT" 2>&1 | tee "$OUT/run.log"'
)
"""The device call's command line (run's ``carry: [".whl"]``, ``timeout_s: 600``)."""
CARRY = [".whl"]
TINY_COMMAND = "python benchmarks/gpu/run.py --device cpu --tiny --out results/gpu-tiny"

# ---------------------------------------------------------------------------------------------- sizes

FUSED_SIZES = {
    "gpu": {"vocab": 151_936, "hidden": 4096, "ns": [4096, 16_384, 65_536], "repeats": 2},
    "tiny": {"vocab": 1000, "hidden": 32, "ns": [64], "repeats": 1},
}
FUSED_DTYPES = ["bfloat16", "float32"]
FUSED_VARIANTS = ["naive", "chunked", "liger", "trl"]
REFERENCE_ORDER = ["naive", "chunked", "trl", "liger"]

FUSED_TOL = {
    "float32": {"logp_max_abs": 1e-2, "checksum_rel": 5e-3},
    "bfloat16": {"logp_max_abs": 5e-2, "checksum_rel": 2e-2},
}
FUSED_TOL_REASON = (
    "All variants get identical inputs (same seed, same device). float32: Triton kernels (Liger, TRL's "
    "selective_log_softmax) may multiply with TF32 (10-bit significand, u = 2^-11 = 4.9e-4); a logit "
    "z = h.w of size |z| <= 5 (h, w drawn with std H^-1/4, so z ~ N(0, 1)) is then off by a few u|z|, "
    "hence 1e-2 per token (20u at |z| = 1) and 5e-3 relative on the gradient checksums (norms and sums "
    "over N tokens, where independent rounding errors cancel). bfloat16: the naive and TRL variants "
    "materialize bf16 logits (8-bit significand, u = 2^-8 = 3.9e-3), so a log-prob inherits up to "
    "u|z| + u|lse| ~ 0.01 - 0.05 at |z| <= 5 and |lse| ~ 12 (the fused variants accumulate in float32); "
    "gradients come back in bf16: 2e-2 = 5u relative on their checksums. A wrong formula, a dropped "
    "token or a mis-scaled gradient is off by O(1)."
)

QWEN3_0_6B = {
    "vocab_size": 151_936,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40_960,
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "attention_bias": False,
    "use_sliding_window": False,
}
"""Qwen/Qwen3-0.6B's config.json (architecture fields); the weights are a random init from it."""

GRPO_SIZES = {
    "gpu": {
        "per_device_train_batch_size": 16,
        "num_generations": 8,
        "max_completion_length": 64,
        "max_steps": 4,
        "learning_rate": 1e-5,
    },
    "tiny": {
        "per_device_train_batch_size": 8,
        "num_generations": 4,
        "max_completion_length": 6,
        "max_steps": 2,
        "learning_rate": 1e-2,
    },
}
GRPO_RUNS = {
    "disa": ("tiltlab", "disa"),
    "flowrl": ("tiltlab", "flowrl"),
    "grpo": ("tiltlab", "grpo"),
    "trl-grpo": ("trl", None),
}
"""name -> (trainer, objective): tiltlab = TiltGRPOTrainer(objective), trl = TRL's GRPOTrainer (its loss)."""
DISA_MANIFEST = {"tilt_beta": 2.0, "reward_transform": "identity", "logprob_scale": "sum"}

LOGP_TOL = {"max_abs": 0.1, "mean_abs": 0.02}
LOSS_TOL = {"rtol": 0.05, "atol": 0.01}
GRPO_TOL_REASON = (
    "bf16 autocast on the device (TRL's bf16=True: float32 weights, bf16 matmuls) vs float32 on the CPU, "
    "same weights and same tokens. bf16 keeps 8 significant bits (u = 2^-8 = 3.9e-3); every matmul input "
    "of the policy's forward is rounded to it, so a "
    "logit carries a few u times its size and a token log-prob (target logit minus log-sum-exp) up to "
    "about 2u(|z| + |lse|): 0.1 per token at |lse| ~ 12, and a mean over the completion tokens of at most "
    "0.02 (errors of independent tokens average out). The loss is compared at the same tokens with the "
    "behaviour and reference log-probs recomputed in each precision, so the policy-minus-reference terms "
    "cancel in both and the loss differs by rounding alone: 5% of |loss| + 0.01 (the GRPO loss of a first, "
    "on-policy batch is ~0: ratio 1 times zero-sum group advantages). A wrong sign, a missing term or "
    "another normalization moves it by O(100%)."
)
STEP_GOAL = 1.05
"""tiltlab objective loss + backward time <= 1.05 x TRL's GRPO loss + backward time (reported, not asserted)."""

_T0 = time.perf_counter()
BUDGET_S = {"cuda": 480.0, "cpu": None}
"""Default time budget of one run: past it, the fused variants and GRPO runs not yet started are recorded
``skipped`` (a failure) and the record is still written inside the device call's 10 minutes."""
PYTEST_TIMEOUT_S = 240
_budget: list[float | None] = [None]


def over_budget() -> bool:
    b = _budget[0]
    return b is not None and time.perf_counter() - _T0 > b


def log(msg: str) -> None:
    print(f"[gpu-kit {time.perf_counter() - _T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def _load_module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _env() -> dict[str, str]:
    """Environment for subprocesses: the checkout first on PYTHONPATH, CI unset (tests/conftest.py
    turns an install skip into a failure under CI; the device lacks vLLM by design)."""
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *[p for p in [env.get("PYTHONPATH", "")] if p]])
    return env


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


# ---------------------------------------------------------------------------------------------- environment


def versions() -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in (
        "torch",
        "transformers",
        "accelerate",
        "trl",
        "liger-kernel",
        "datasets",
        "peft",
        "triton",
        "pyarrow",
        "pandas",
        "fsspec",
        "huggingface-hub",
        "dill",
        "multiprocess",
        "numpy",
        "pytest",
    ):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    try:
        import tiltlab

        out["tiltlab"] = tiltlab.__version__
    except Exception:  # the record still says what ran
        out["tiltlab"] = None
    return out


def device_info(device: str) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "device": device,
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
    }
    if device == "cuda" and torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(
            gpu=torch.cuda.get_device_name(0),
            capability=list(torch.cuda.get_device_capability(0)),
            gpu_memory_gib=round(p.total_memory / 2**30, 2),
            multiprocessors=p.multi_processor_count,
        )
    return info


def git_info(commit_arg: str | None) -> dict[str, Any]:
    """The commit: ``--commit``, else git (the tree may travel without ``.git``), else the environment's
    ``TILTLAB_GIT_COMMIT``, else the stamp prepare.py wrote into ``.whl/STAMP.json`` here."""
    if commit_arg:
        return {"commit": commit_arg, "dirty": None, "source": "--commit"}
    if (REPO / ".git").exists() and shutil.which("git"):
        try:

            def git(*a: str) -> str:
                return subprocess.run(
                    ["git", "-C", str(REPO), *a], capture_output=True, text=True, check=True, timeout=30
                ).stdout.strip()

            dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
            return {"commit": git("rev-parse", "HEAD"), "dirty": dirty, "source": "git"}
        except (OSError, subprocess.SubprocessError):
            pass
    if os.environ.get("TILTLAB_GIT_COMMIT"):
        return {"commit": os.environ["TILTLAB_GIT_COMMIT"], "dirty": None, "source": "TILTLAB_GIT_COMMIT"}
    stamp = REPO / ".whl" / "STAMP.json"
    if stamp.is_file():
        s = json.loads(stamp.read_text())
        return {
            "commit": s.get("commit"),
            "dirty": s.get("dirty"),
            "source": f".whl/STAMP.json, written by prepare.py at {s.get('written')} (later edits are not in it)",
        }
    return {"commit": None, "dirty": None, "source": "unknown (no .git, no --commit, no .whl/STAMP.json)"}


# ---------------------------------------------------------------------------------------------- 1. pytest


def gpu_test_files() -> list[Path]:
    """Test files with a ``@pytest.mark.gpu`` test."""
    pat = re.compile(r"^\s*@pytest\.mark\.gpu\b", re.M)
    return sorted(p for p in (REPO / "tests").rglob("test_*.py") if pat.search(p.read_text(encoding="utf-8")))


def start_pytest(work: Path) -> tuple[subprocess.Popen, Path, list[str]]:
    junit = work / "pytest-gpu.xml"
    files = [str(p.relative_to(REPO)) for p in gpu_test_files()]
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rA", "-p", "no:cacheprovider"]
    cmd += ["--junitxml", str(junit), *files]
    log("pytest -m gpu " + " ".join(files))
    proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, junit, cmd


def finish_pytest(proc: subprocess.Popen, junit: Path, cmd: list[str], cuda: bool) -> dict[str, Any]:
    try:
        out, _ = proc.communicate(timeout=PYTEST_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        out = f"{out or ''}\n[gpu-kit] pytest killed after {PYTEST_TIMEOUT_S} s"
    tests = []
    if junit.is_file():
        for case in ET.parse(junit).getroot().iter("testcase"):
            outcome, message = "passed", None
            for tag in ("failure", "error", "skipped"):
                el = case.find(tag)
                if el is not None:
                    outcome, message = {"failure": "failed"}.get(tag, tag), (el.get("message") or "")[:300]
                    break
            tests.append({"id": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome, "message": message})
    counts = {k: sum(t["outcome"] == k for t in tests) for k in ("passed", "failed", "error", "skipped")}
    ok = proc.returncode == 0 and counts["failed"] == 0 and counts["error"] == 0 and (counts["passed"] > 0 or not cuda)
    res = {
        "command": " ".join(["pytest", *cmd[3:]]),
        "returncode": proc.returncode,
        **counts,
        "tests": tests,
        "ok": ok,
        "output_tail": (out or "")[-3000:],
    }
    log(f"pytest: rc={proc.returncode} {counts} -> {'ok' if ok else 'FAILED'}")
    return res


# ---------------------------------------------------------------------------------------------- 2. fused


def run_fused(
    device: str, size: str, work: Path, perturb: str | None, variants: list[str], dtypes: list[str]
) -> dict[str, Any]:
    import torch

    from tiltlab.objectives import fused

    bench = _load_module("bench_fused_logprob", REPO / "benchmarks" / "bench_fused_logprob.py")
    cfg = FUSED_SIZES[size]
    cuda = device == "cuda"
    tc = fused.DEFAULT_CUDA_TOKEN_CHUNK if cuda else fused.DEFAULT_TOKEN_CHUNK
    vc = fused.DEFAULT_CUDA_VOCAB_CHUNK if cuda else fused.DEFAULT_VOCAB_CHUNK
    liger_missing = importlib.util.find_spec("liger_kernel") is None
    tasks = [(dtype, n, variant) for dtype in dtypes for n in cfg["ns"] for variant in variants]

    def one(task: tuple[str, int, str]) -> dict[str, Any]:
        dtype, n, variant = task
        base = {"variant": variant, "dtype": dtype, "n": n}
        if over_budget():
            log(f"fused {dtype} N={n} {variant}: skipped (time budget)")
            return {**base, "status": "skipped", "error": "the run's time budget was spent"}
        if variant == "liger" and not cuda:
            return {**base, "status": "unavailable", "error": "Liger's kernels are Triton GPU kernels (no CPU)"}
        if variant == "liger" and liger_missing:
            return {**base, "status": "unavailable", "error": "liger_kernel is not installed"}
        logp_path = work / f"logp-{dtype}-{n}-{variant}.pt"
        argv = ["--variant", variant, "--n", str(n), "--vocab", str(cfg["vocab"]), "--hidden", str(cfg["hidden"])]
        argv += ["--dtype", dtype, "--device", device, "--token-chunk", str(tc), "--vocab-chunk", str(vc)]
        argv += ["--repeats", str(cfg["repeats"]), "--threads", "0" if cuda else "1", "--save-logp", str(logp_path)]
        if perturb == "fused" and variant == "chunked":
            argv += ["--perturb-output", "0.5"]
        ns = bench.build_parser().parse_args(argv)
        try:
            r = bench._run_variant(variant, ns)
        except RuntimeError as e:
            r = {"status": "error", "error": str(e)[-2000:]}
        r = {**base, **r}
        if r.get("status") == "ok":
            r["logp_path"] = str(logp_path)
            log(
                f"fused {dtype} N={n} {variant}: {r['tokens_per_s']:.3g} tok/s, peak {r['peak_bytes'] / 2**20:,.1f} MiB"
            )
        else:
            log(f"fused {dtype} N={n} {variant}: {r.get('status')} {(r.get('error') or '')[:200]}")
        return r

    # CUDA: one variant at a time (the timings and peaks are the point); CPU (tiny): two at a time
    with ThreadPoolExecutor(max_workers=1 if cuda else 2) as pool:
        results = list(pool.map(one, tasks))

    comparisons, failures = [], []
    for dtype in dtypes:
        tol = FUSED_TOL[dtype]
        for n in cfg["ns"]:
            rows = {r["variant"]: r for r in results if r["dtype"] == dtype and r["n"] == n}
            for v, r in rows.items():
                if r["status"] == "unavailable" and (cuda or v != "liger"):  # the kit carries Liger and TRL
                    failures.append(f"fused {dtype} N={n} {v}: unavailable ({r.get('error')})")
                if r["status"] in ("error", "skipped"):
                    failures.append(
                        f"fused {dtype} N={n} {v}: {'the worker crashed' if r['status'] == 'error' else 'not run (time budget)'}"
                    )
                if v == "chunked" and r["status"] != "ok":
                    failures.append(f"fused {dtype} N={n}: tiltlab's chunked path did not run ({r['status']})")
            ok_rows = {v: r for v, r in rows.items() if r["status"] == "ok"}
            ref = next((v for v in REFERENCE_ORDER if v in ok_rows), None)
            if ref is None:
                continue
            ref_logp = torch.load(ok_rows[ref]["logp_path"])
            for v, r in ok_rows.items():
                if v == ref:
                    continue
                logp = torch.load(r["logp_path"])
                max_abs = float((logp.double() - ref_logp.double()).abs().max())
                rel = {k: abs(r["checksum"][k] - x) / max(abs(x), 1e-12) for k, x in ok_rows[ref]["checksum"].items()}
                finite = (
                    bool(torch.isfinite(logp).all())
                    and all(_finite(x) for x in r["checksum"].values())
                    and all(_finite(x) for x in ok_rows[ref]["checksum"].values())
                )
                ok = finite and max_abs <= tol["logp_max_abs"] and max(rel.values()) <= tol["checksum_rel"]
                comparisons.append(
                    {
                        "dtype": dtype,
                        "n": n,
                        "variant": v,
                        "reference": ref,
                        "logp_max_abs_diff": max_abs,
                        "checksum_max_rel_diff": max(rel.values()),
                        "checksum_rel_diff": rel,
                        "finite": finite,
                        "tolerance": tol,
                        "ok": ok,
                    }
                )
                if not ok:
                    failures.append(
                        f"fused {dtype} N={n}: {v} vs {ref}: log-prob max |diff| {max_abs:.3g} "
                        f"(tol {tol['logp_max_abs']}), checksum rel diff {max(rel.values()):.3g} "
                        f"(tol {tol['checksum_rel']})"
                    )
    for r in results:
        r.pop("logp_path", None)
    # goal (bf16): fused tokens/s >= Liger's at <= Liger's peak memory, per N where both ran
    per_n = {}
    for n in cfg["ns"]:
        rows = {r["variant"]: r for r in results if r["dtype"] == "bfloat16" and r["n"] == n}
        ch, lg = rows.get("chunked", {}), rows.get("liger", {})
        if ch.get("status") == "ok" and lg.get("status") == "ok":
            per_n[str(n)] = {
                "tokens_per_s_ratio": ch["tokens_per_s"] / lg["tokens_per_s"],
                "peak_ratio": ch["peak_bytes"] / lg["peak_bytes"] if lg["peak_bytes"] > 0 else None,
                "met": ch["tokens_per_s"] >= lg["tokens_per_s"] and ch["peak_bytes"] <= lg["peak_bytes"],
            }
    goal = {
        "goal": "bf16: fused (chunked) tokens/s >= Liger's at <= Liger's peak memory",
        "per_n": per_n,
        "met": all(v["met"] for v in per_n.values()) if per_n else None,
    }
    return {
        "config": {
            **cfg,
            "dtypes": dtypes,
            "variants": variants,
            "device": device,
            "token_chunk": tc,
            "vocab_chunk": vc,
            "step": "forward + backward of logp.sum(), gradients to hidden and weight",
            "tokens_per_s": "N / best wall time of --repeats timed steps (after a small warm-up)",
            "peak": "torch.cuda.max_memory_allocated() - allocated before the step (CPU: RSS growth)",
        },
        "tolerance": FUSED_TOL,
        "tolerance_reason": FUSED_TOL_REASON,
        "results": results,
        "comparisons": comparisons,
        "goal": goal,
        "failures": failures,
        "ok": not failures and bool(comparisons),
    }


# ---------------------------------------------------------------------------------------------- 3. grpo


def parity_reward(prompts, completions, completion_ids, **kw) -> list[float]:
    """1 when the completion's token ids sum to an even number (both outcomes occur)."""
    return [float(sum(ids) % 2 == 0) for ids in completion_ids]


def build_model_dir(path: Path, size: str, device: str, dtype) -> dict[str, Any]:
    """A random-init Qwen3 (the 0.6B config, or the tiny test config) saved with the tiny BPE tokenizer;
    the model's token ids for pad/bos/eos are the tokenizer's (its other ids decode to nothing)."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    from tiltlab.llm.base.models import build_tiny_tokenizer, tiny_config

    tok = build_tiny_tokenizer(seed=0)
    special = {"pad_token_id": tok.pad_token_id, "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}
    if size == "tiny":
        cfg = tiny_config(len(tok), **special)
    else:
        cfg = Qwen3Config(**QWEN3_0_6B, **special)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(cfg)
    model = model.to(dtype)
    model.generation_config = GenerationConfig(**special, do_sample=True, temperature=1.0, top_p=1.0, top_k=0)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    n_params = sum(p.numel() for p in model.parameters())
    del model
    return {
        "config": "Qwen3-0.6B" if size != "tiny" else "tiny Qwen3 (tests' config)",
        "parameters": n_params,
        "vocab_size": cfg.vocab_size,
        "layers": cfg.num_hidden_layers,
        "hidden": cfg.hidden_size,
        "tokenizer": f"tiltlab's tiny BPE ({len(tok)} tokens)",
        "init": "random from the config, seed 0",
    }


def _dataset():
    from datasets import Dataset

    from tiltlab.llm.base.tasks import arithmetic_tasks

    rows = arithmetic_tasks(32, seed=0)
    return Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"], "log_z": 0.1 * i}
            for i, r in enumerate(rows)
        ]
    )


def make_args(trainer: str, objective: str | None, out_dir: Path, size: str, use_cpu: bool, bf16: bool):
    common = dict(
        output_dir=str(out_dir),
        report_to="none",
        use_cpu=use_cpu,
        bf16=bf16,
        logging_steps=1,
        save_strategy="no",
        remove_unused_columns=False,
        seed=0,
        disable_tqdm=True,
        **GRPO_SIZES[size],
    )
    if trainer == "trl":
        from trl import GRPOConfig

        return GRPOConfig(**common)
    from tiltlab.llm.train.online import TiltGRPOConfig

    extra: dict[str, Any] = {"objective": objective}
    if objective == "disa":
        extra.update(tilt_beta=2.0, disa_stage1_manifest=dict(DISA_MANIFEST), disa_label="column")
    return TiltGRPOConfig(**common, **extra)


def build_trainer(
    trainer: str, objective: str | None, model_dir: Path, out_dir: Path, size: str, device: str, bf16: bool
):
    """The trainer as ``tiltlab llm train`` builds it: the model passed as a path, so TRL loads float32
    weights (its default) and ``bf16=True`` runs forward and backward under bf16 autocast."""
    from transformers import set_seed

    from tiltlab.llm.base.models import load_tokenizer

    set_seed(0)
    args = make_args(trainer, objective, out_dir, size, use_cpu=device == "cpu", bf16=bf16)
    if trainer == "trl":
        from trl import GRPOTrainer as cls
    else:
        from tiltlab.llm.train.online import TiltGRPOTrainer as cls
    return cls(
        model=str(model_dir),
        reward_funcs=parity_reward,
        args=args,
        train_dataset=_dataset(),
        processing_class=load_tokenizer(model_dir),
    )


def _seq(inputs: dict):
    import torch

    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    am = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    return ids, am, inputs["completion_ids"].shape[1]


def fixed_batch_eval(tr, inputs: dict) -> tuple[float, Any]:
    """``compute_loss`` and the per-token log-probs on one batch, eval mode (dropout off), no grad, in
    the trainer's precision context (bf16 autocast where ``bf16=True``), as its training step runs it."""
    import torch

    model = tr.model
    model.eval()
    try:
        with torch.no_grad(), tr.compute_loss_context_manager():
            loss = tr.compute_loss(model, inputs)
            ids, am, t = _seq(inputs)
            logp = tr._get_per_token_logps_and_entropies(model, ids, am, t)[0]
    finally:
        model.train()
    return float(loss), logp.float().cpu()


def compare_fixed_batch(loss_dev: float, loss_cpu: float, logp, logp_cpu, mask) -> dict[str, Any]:
    """The device's fixed-batch loss and per-token log-probs against the float32 CPU values
    (:data:`LOSS_TOL`, :data:`LOGP_TOL`); ``ok`` False on a difference beyond them or a non-finite value."""
    m = mask.bool()
    d = (logp.double() - logp_cpu.double()).abs()[m]
    out: dict[str, Any] = {
        "loss_cpu_fp32": loss_cpu,
        "loss_abs_diff": abs(loss_dev - loss_cpu),
        "loss_tolerance": LOSS_TOL["atol"] + LOSS_TOL["rtol"] * abs(loss_cpu),
        "logp_max_abs_diff": float(d.max()) if d.numel() else float("nan"),
        "logp_mean_abs_diff": float(d.mean()) if d.numel() else float("nan"),
        "logp_mean_cpu_fp32": float(logp_cpu.double()[m].mean()) if d.numel() else float("nan"),
    }
    finite = all(_finite(x) for x in (loss_dev, loss_cpu, out["logp_max_abs_diff"], out["logp_mean_abs_diff"]))
    out["ok"] = (
        finite
        and out["loss_abs_diff"] <= out["loss_tolerance"]
        and out["logp_max_abs_diff"] <= LOGP_TOL["max_abs"]
        and out["logp_mean_abs_diff"] <= LOGP_TOL["mean_abs"]
    )
    return out


class _StepTimes:
    """Per optimizer step: generation / loss / backward / whole step, CUDA-synchronized."""

    def __init__(self, cuda: bool) -> None:
        import torch

        self.sync = torch.cuda.synchronize if cuda else (lambda: None)
        self.steps: list[dict[str, float]] = []
        self.cur: dict[str, float] | None = None

    def wrap(self, fn, key: str):
        def timed(*a, **kw):
            self.sync()
            t0 = time.perf_counter()
            out = fn(*a, **kw)
            self.sync()
            if self.cur is not None:
                self.cur[key] += time.perf_counter() - t0
            return out

        return timed

    def callback(self):
        from transformers import TrainerCallback

        outer = self

        class Cb(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                outer.sync()
                outer.cur = {"generation_s": 0.0, "loss_s": 0.0, "backward_s": 0.0, "_t0": time.perf_counter()}

            def on_step_end(self, args, state, control, **kw):
                outer.sync()
                cur = outer.cur
                if cur is not None:
                    cur["step_s"] = time.perf_counter() - cur.pop("_t0")
                    outer.steps.append(cur)
                outer.cur = None

        return Cb()


def _median(steps: list[dict[str, float]], key: str) -> float | None:
    vals = [s[key] for s in (steps[1:] if len(steps) > 1 else steps)]  # the first step warms up
    return statistics.median(vals) if vals else None


def run_grpo(device: str, size: str, work: Path, perturb: str | None, names: list[str]) -> dict[str, Any]:
    import gc

    import torch

    cuda = device == "cuda"
    model_dir = work / "model"
    model_info = build_model_dir(model_dir, size, device, torch.bfloat16)
    log(f"grpo: model {model_info}")
    runs: dict[str, dict[str, Any]] = {}
    spec = []
    skipped = []
    for name in names:
        trainer, objective = GRPO_RUNS[name]
        if over_budget():
            log(f"grpo {name}: skipped (time budget)")
            skipped.append(f"grpo {name}: not run (time budget)")
            continue
        t0 = time.perf_counter()
        tr = build_trainer(trainer, objective, model_dir, work / f"out-{name}", size, device, bf16=True)
        build_s = time.perf_counter() - t0
        batch = next(iter(tr.get_train_dataloader()))
        tr.model.train()
        inputs = tr._generate_and_score_completions(batch)  # the fixed batch: sampled by the initial policy
        timer = _StepTimes(cuda)
        tr._generate_and_score_completions = timer.wrap(tr._generate_and_score_completions, "generation_s")
        tr.compute_loss = timer.wrap(tr.compute_loss, "loss_s")
        tr.accelerator.backward = timer.wrap(tr.accelerator.backward, "backward_s")
        tr.add_callback(timer.callback())
        t0 = time.perf_counter()
        tr.train()
        train_s = time.perf_counter() - t0
        # the fixed batch scored by the TRAINED policy (and head): the policy-minus-reference and importance
        # terms are then non-zero, so the loss depends on the precision of every forward
        loss, logp = fixed_batch_eval(tr, inputs)
        if perturb == "loss":  # a self-test of the comparison: a deliberately wrong device loss
            loss = loss * 1.5 + 0.5
        torch.save(
            {k: (v.detach().cpu() if torch.is_tensor(v) else v) for k, v in inputs.items()}, work / f"inputs-{name}.pt"
        )
        torch.save(logp, work / f"logp-{name}.pt")
        state = tr.accelerator.unwrap_model(tr.model).state_dict()  # the log Z head included (flowrl)
        torch.save({k: v.detach().cpu() for k, v in state.items()}, work / f"trained-{name}.pt")
        del state
        spec.append({"name": name, "trainer": trainer, "objective": objective})
        losses = [h["loss"] for h in tr.state.log_history if "loss" in h and "train_loss" not in h]
        steps = timer.steps
        runs[name] = {
            "trainer": "TRL GRPOTrainer (its GRPO loss)" if trainer == "trl" else "tiltlab TiltGRPOTrainer",
            "objective": objective or "grpo (TRL)",
            "build_s": build_s,
            "train_s": train_s,
            "steps": steps,
            "median": {k: _median(steps, k) for k in ("generation_s", "loss_s", "backward_s", "step_s")},
            "logged_losses": losses,
            "fixed_batch": {
                "when": f"sampled before step 1, scored after step {len(steps)}",
                "completions": int(inputs["completion_ids"].shape[0]),
                "completion_tokens": int(inputs["completion_mask"].sum()),
                "loss_device": loss,
            },
        }
        m = runs[name]["median"]
        log(
            f"grpo {name}: {len(steps)} steps, median gen {m['generation_s']:.3f}s loss {m['loss_s']:.3f}s "
            f"backward {m['backward_s']:.3f}s step {m['step_s']:.3f}s; fixed-batch loss {loss:.6g}"
        )
        del tr, inputs, batch, timer  # the timer's wrappers hold the trainer's bound methods
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()

    # the float32 CPU reference, in a subprocess (a fresh accelerate state, no GPU visible)
    (work / "cpu-ref.json").write_text(json.dumps({"size": size, "runs": spec}))
    env = _env()
    env["CUDA_VISIBLE_DEVICES"] = ""
    log("grpo: float32 CPU reference of the fixed batches ...")
    res = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--worker-cpu-ref", str(work)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    failures = list(skipped)
    if res.returncode != 0:
        failures.append(f"the float32 CPU reference crashed (rc={res.returncode}): {res.stderr[-3000:]}")
        ref = {}
    else:
        ref = json.loads(res.stdout.strip().splitlines()[-1])
    for name, run in runs.items():
        fb = run["fixed_batch"]
        if name not in ref:
            fb["ok"] = False
            failures.append(f"grpo {name}: no CPU reference")
            continue
        fb.update(
            compare_fixed_batch(
                fb["loss_device"],
                ref[name]["loss"],
                torch.load(work / f"logp-{name}.pt"),
                torch.load(work / f"logp-cpu-{name}.pt"),
                torch.load(work / f"inputs-{name}.pt")["completion_mask"],
            )
        )
        log(
            f"grpo {name}: fixed-batch loss {fb['loss_device']:.6g} vs fp32 CPU {fb['loss_cpu_fp32']:.6g} "
            f"(|diff| {fb['loss_abs_diff']:.3g}, tol {fb['loss_tolerance']:.3g}); log-prob |diff| max "
            f"{fb['logp_max_abs_diff']:.3g} mean {fb['logp_mean_abs_diff']:.3g} -> {'ok' if fb['ok'] else 'FAILED'}"
        )
        if not fb["ok"]:
            failures.append(
                f"grpo {name}: fixed batch: loss {fb['loss_device']:.6g} vs fp32 CPU {fb['loss_cpu_fp32']:.6g} "
                f"(tol {fb['loss_tolerance']:.3g}); log-prob |diff| max {fb['logp_max_abs_diff']:.3g} "
                f"(tol {LOGP_TOL['max_abs']}), mean {fb['logp_mean_abs_diff']:.3g} (tol {LOGP_TOL['mean_abs']})"
            )
        if not run["steps"] or not all(_finite(x) for s in run["steps"] for x in s.values()):
            failures.append(f"grpo {name}: no timed steps or a non-finite time")
        if not run["logged_losses"] or not all(_finite(x) for x in run["logged_losses"]):
            failures.append(f"grpo {name}: no logged loss or a non-finite one")
    # goal: each tiltlab objective's loss + backward <= 1.05 x TRL's GRPO loss + backward
    goal: dict[str, Any] = {
        "goal": f"tiltlab objective loss + backward time <= {STEP_GOAL} x TRL GRPO's",
        "per_objective": {},
    }
    base = runs.get("trl-grpo", {}).get("median", {})
    if base.get("loss_s") is not None:
        t_trl = base["loss_s"] + base["backward_s"]
        for name, run in runs.items():
            if name == "trl-grpo":
                continue
            t = run["median"]["loss_s"] + run["median"]["backward_s"]
            goal["per_objective"][name] = {"ratio": t / t_trl if t_trl > 0 else None, "met": t <= STEP_GOAL * t_trl}
    per = goal["per_objective"]
    goal["met"] = all(v["met"] for v in per.values()) if per else None
    return {
        "model": model_info,
        "settings": {
            **GRPO_SIZES[size],
            "dtype": "bfloat16",
            "generation": "transformers generate (no vLLM)",
            "reward": "parity of the completion's token ids",
            "timing": "median over the steps after the first (warm-up); generation = _generate_and_score_completions",
        },
        "tolerance": {"logp": LOGP_TOL, "loss": LOSS_TOL},
        "tolerance_reason": GRPO_TOL_REASON,
        "runs": runs,
        "goal": goal,
        "failures": failures,
        "ok": not failures,
    }


def worker_cpu_ref(work: Path) -> int:
    """Subprocess: each fixed batch's loss and per-token log-probs in float32 on the CPU, from the trained
    weights; the behaviour and reference log-probs recomputed in float32 from the initial weights (the
    policy that sampled the batch and the reference are both the initial model)."""
    import torch

    from tiltlab.llm.base.models import load_model

    spec = json.loads((work / "cpu-ref.json").read_text())
    out = {}
    initial = None
    for r in spec["runs"]:
        name = r["name"]
        tr = build_trainer(
            r["trainer"], r["objective"], work / "model", work / f"ref-{name}", spec["size"], "cpu", False
        )
        inputs = torch.load(work / f"inputs-{name}.pt", weights_only=False)
        ids, am, t = _seq(inputs)
        for key in ("old_per_token_logps", "ref_per_token_logps"):
            if torch.is_tensor(inputs.get(key)):
                if tr.ref_model is None and initial is None:
                    initial = load_model(work / "model", dtype="float32", device="cpu")
                model = tr.ref_model if tr.ref_model is not None else initial
                model.eval()
                with torch.no_grad():
                    inputs[key] = tr._get_per_token_logps_and_entropies(model, ids, am, t)[0]
        tr.model.load_state_dict(torch.load(work / f"trained-{name}.pt"))
        loss, logp = fixed_batch_eval(tr, inputs)
        torch.save(logp, work / f"logp-cpu-{name}.pt")
        out[name] = {"loss": loss}
        del tr
    print(json.dumps(out))
    return 0


# ---------------------------------------------------------------------------------------------- main


def _write(record: dict, out: Path) -> None:
    from tiltlab.files import write_json

    write_json(out, record, indent=2, default=str)


def _section(record: dict, name: str, fn, *a) -> None:
    try:
        record[name] = fn(*a)
    except Exception as e:
        log(f"{name}: ERROR {type(e).__name__}: {e}")
        record[name] = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-6000:]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument(
        "--tiny", action="store_true", help="toy sizes (a CPU dry run of the same code: ~100 CPU-s, mostly imports)"
    )
    p.add_argument("--out", type=Path, default=REPO / "results" / "gpu", help=f"folder for {RECORD_NAME}")
    p.add_argument("--sections", default="pytest,fused,grpo", help="comma-separated subset of pytest,fused,grpo")
    p.add_argument("--objectives", default=",".join(GRPO_RUNS), help=f"grpo runs: subset of {list(GRPO_RUNS)}")
    p.add_argument("--variants", default=",".join(FUSED_VARIANTS), help=f"fused variants: subset of {FUSED_VARIANTS}")
    p.add_argument("--dtypes", default=",".join(FUSED_DTYPES), help=f"fused dtypes: subset of {FUSED_DTYPES}")
    p.add_argument("--commit", default=None, help="git commit to record where the tree has no .git")
    p.add_argument("--perturb", choices=["fused", "loss"], default=None, help="self-test: corrupt one output")
    p.add_argument("--budget-s", type=float, default=None, help="time budget in s (default: 480 on cuda, none on cpu)")
    p.add_argument("--worker-cpu-ref", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    sys.modules.setdefault("vllm", None)  # type: ignore[arg-type]  # see the module docstring
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    if args.worker_cpu_ref is not None:
        return worker_cpu_ref(args.worker_cpu_ref)
    if args.device == "cpu" and not args.tiny:
        p.error("--device cpu runs only with --tiny (the full sizes are GPU sizes)")
    sections = [s for s in args.sections.split(",") if s]
    names = [s for s in args.objectives.split(",") if s]
    variants = [s for s in args.variants.split(",") if s]
    dtypes = [s for s in args.dtypes.split(",") if s]
    bad = [s for s in sections if s not in ("pytest", "fused", "grpo")] + [n for n in names if n not in GRPO_RUNS]
    bad += [v for v in variants if v not in FUSED_VARIANTS] + [d for d in dtypes if d not in FUSED_DTYPES]
    if bad:
        p.error(f"unknown sections / objectives: {bad}")
    size = "tiny" if args.tiny else "gpu"
    cuda = args.device == "cuda"
    _budget[0] = args.budget_s if args.budget_s is not None else BUDGET_S[args.device]

    import torch

    record: dict[str, Any] = {
        "schema": SCHEMA,
        "status": "ran",
        "mode": f"{args.device}{'-tiny' if args.tiny else ''}",
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "git": git_info(args.commit),
        "device": device_info(args.device),
        "versions": versions(),
        "commands": {
            "prepare": PREPARE_COMMAND,
            "device": DEVICE_COMMAND,
            "carry": CARRY,
            "this_run": " ".join(["python", "benchmarks/gpu/run.py", *(argv if argv is not None else sys.argv[1:])]),
        },
        "sections": sections,
        "perturbed": args.perturb,
    }
    failures: list[str] = []
    if cuda and not torch.cuda.is_available():
        failures.append("--device cuda but torch sees no CUDA device")
    if cuda and importlib.util.find_spec("liger_kernel") is None:
        failures.append(
            "Liger-Kernel is missing: the kit carries it (python benchmarks/gpu/prepare.py here, carry .whl)"
        )
    log(f"mode {record['mode']}, commit {record['git']['commit']} ({record['git']['source']})")
    log(f"device {record['device']}")
    log("versions " + ", ".join(f"{k} {v}" for k, v in record["versions"].items()))

    out = args.out / RECORD_NAME
    args.out.mkdir(parents=True, exist_ok=True)
    record["complete"] = False  # rewritten after each section: a run killed midway leaves what it measured
    _write(record, out)
    with tempfile.TemporaryDirectory(prefix="gpu-kit-") as tmp:
        work = Path(tmp)
        pending = None
        if "pytest" in sections:
            pending = start_pytest(work)
            if cuda:  # alone on the GPU: the benchmarks below must not share it
                record["pytest"] = finish_pytest(*pending, cuda)
                pending = None
                _write(record, out)
        if "fused" in sections and not failures:
            _section(record, "fused", run_fused, args.device, size, work, args.perturb, variants, dtypes)
            _write(record, out)
        if "grpo" in sections and not failures:
            _section(record, "grpo", run_grpo, args.device, size, work, args.perturb, names)
            _write(record, out)
        if pending is not None:  # CPU: pytest ran beside the other sections
            record["pytest"] = finish_pytest(*pending, cuda)

    for s in sections:
        sec = record.get(s)
        if sec is None:
            failures.append(f"{s}: did not run")
        elif not sec.get("ok"):
            failures.extend(sec.get("failures") or [f"{s}: {sec.get('error') or 'failed'}"])
    record["goals"] = {
        "fused_bf16_vs_liger": record.get("fused", {}).get("goal"),
        "objective_step_vs_trl_grpo": record.get("grpo", {}).get("goal"),
    }
    record["failures"] = failures
    record["ok"] = not failures
    record["complete"] = True
    record["elapsed_s"] = round(time.perf_counter() - _T0, 1)
    _write(record, out)
    for f in failures:
        log(f"FAILED: {f}")
    log(f"{'ok' if record['ok'] else 'FAILED'}: {out} ({record['elapsed_s']} s)")
    return 0 if record["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
