"""The real backbone ``smollm2-135m`` through the whole DISA pipeline on CPU, on vLLM: Stage 1 with the
vLLM proposal engine (``vllm_proposal_engine``), Stage 2 (``run_stage2``), then DISA and GRPO trained by
``tiltlab llm train`` with ``trl.use_vllm: true, vllm_mode: colocate`` (TRL generates the rollouts with
a vLLM engine colocated in the trainer process, which tiltlab adapts to the CPU).

Each training run is its own ``tiltlab llm train`` process, as a user runs it (TRL's colocated engine
sets the process's distributed environment). The full variant (8 prompts, M = 4, two optimizer steps
per method) is ``slow``; the short variant (4 prompts, M = 2, one DISA step) runs in CI.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import math
import os
import subprocess
import sys

import pytest

pytest.importorskip("trl")
try:  # a broken install (e.g. mismatched torchvision) fails at import: skip, do not error
    import vllm  # noqa: F401
except Exception as e:  # pragma: no cover - depends on the machine
    pytest.skip(f"vLLM is not importable: {e}", allow_module_level=True)

from tiltlab.llm.base.models import MODEL_ALIASES, resolve_model

pytestmark = pytest.mark.vllm
ALIAS = "smollm2-135m"
SIZES = {
    "full": dict(prompts=8, M=4, steps=2, new_tokens=24, objectives=("disa", "grpo")),
    # CI: each `tiltlab llm train` process starts its own colocated engine (~45 s with its imports, model
    # and reference loads on a 2-core machine), so the short variant trains DISA only
    "short": dict(prompts=4, M=2, steps=1, new_tokens=8, objectives=("disa",)),
}
KEY = "model.layers.29.mlp.down_proj.weight"


@pytest.fixture(scope="module")
def smollm2_dir():
    try:
        md.distribution(MODEL_ALIASES[ALIAS].distribution)
    except md.PackageNotFoundError:
        pytest.skip(f"needs `{MODEL_ALIASES[ALIAS].install}`")
    return resolve_model(ALIAS)


def _train(tmp_path, objective, model, size, data, extra=None) -> tuple[list[dict], str, str]:
    """``tiltlab llm train`` in a subprocess; returns (TRL's log history, the output dir, stderr)."""
    import yaml

    out = tmp_path / f"rl_{objective}"
    cfg = {
        "kind": "online",
        "objective": objective,
        "model": model,
        "dataset": data,
        "reward": "math",
        "output_dir": str(out),
        "trl": {
            "learning_rate": 1e-5,
            "per_device_train_batch_size": 2 * size["M"],
            "num_generations": size["M"],
            "max_completion_length": size["new_tokens"],
            "max_steps": size["steps"],
            "temperature": 1.0,
            "beta": 0.0,
            "use_cpu": True,
            "report_to": "none",
            "save_strategy": "steps",  # the last step's checkpoint keeps trainer_state.json (log history)
            "save_steps": size["steps"],
            "logging_steps": 1,
            "disable_tqdm": True,
            "seed": 0,
            "use_vllm": True,
            "vllm_mode": "colocate",
            "vllm_kv_cache_memory_bytes": 64 << 20,
            "vllm_max_model_length": 512,
        },
        **(extra or {}),
    }
    path = tmp_path / f"{objective}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    cmd = [sys.executable, "-m", "tiltlab.cli", "llm", "train", "--config", str(path)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stderr[-4000:]
    assert f"[train] {size['steps']} optimizer steps" in res.stdout
    state = json.loads((out / f"checkpoint-{size['steps']}" / "trainer_state.json").read_text())
    return state["log_history"], str(out), res.stderr


@pytest.mark.parametrize("size", [pytest.param("full", marks=pytest.mark.slow), "short"])
def test_smollm2_stage1_stage2_disa_grpo_on_vllm(smollm2_dir, tmp_path, size):
    import torch
    from safetensors.torch import load_file

    from tiltlab.llm.base.rollout import VLLMEngine
    from tiltlab.llm.disa.stage1 import Stage1Config, load_stage1, run_stage1
    from tiltlab.llm.disa.stage2.config import Stage2Config
    from tiltlab.llm.disa.stage2.run import load_log_z_predictor, run_stage2

    sz = SIZES[size]
    beta = 2.0
    # plain-answer questions the 135M model answers correctly some of the time (one-digit sums: pi_ref pass
    # rate ~0.26): on the boxed synthetic:math task it never does, every label is log Z = 0 and the run is vacuous
    data = f"synthetic:qa:{sz['prompts']}:1"
    s1, s2 = tmp_path / "stage1", tmp_path / "stage2"
    cfg = Stage1Config(
        proposal=ALIAS,
        reference=ALIAS,
        dataset=data,
        out_dir=str(s1),
        M=sz["M"],
        tilt_beta=beta,
        reward="math",
        max_new_tokens=sz["new_tokens"],
        engine="vllm",
        max_model_len=512,  # the KV cache below holds one 512-token sequence (the config's 8192 needs 0.35 GiB)
        dtype="fp32",  # vLLM (proposal) and transformers (reference) score the same fp32 weights
        device="cpu",
        gen_batch_size=64,
        score_batch_size=16,
    )
    # Stage 1's proposal engine as vllm_proposal_engine builds it on CPU (eager, no chunked prefill), with
    # a 64 MiB KV cache instead of its default 0.3 of the host's memory (too much for a shared CI machine)
    engine = VLLMEngine(
        smollm2_dir, dtype=cfg.dtype, seed=cfg.seed, max_model_len=cfg.max_model_len, kv_cache_memory_bytes=64 << 20
    )
    try:
        summary = run_stage1(cfg, engine=engine, progress=False)
    finally:
        engine.close()
    samples, labels = load_stage1(s1)
    assert (labels.num_rows, samples.num_rows) == (sz["prompts"], sz["prompts"] * sz["M"])
    log_z = labels.column("log_z").to_pylist()
    # q = pi_ref: the proposal's sampled log-probs and pi_ref's of the same tokens differ only by kernel
    # summation order (fp32, ~1e-5 per token), so log w = beta r up to that ...
    col = {k: samples.column(k).to_pylist() for k in ("log_w", "reward", "logp_ref", "logp_proposal", "prompt_id")}
    assert max(abs(a - b) for a, b in zip(col["logp_ref"], col["logp_proposal"])) < 1e-2, col
    assert max(abs(w - beta * r) for w, r in zip(col["log_w"], col["reward"])) < 1e-2, col
    # ... the label log mean_j exp(beta r_j) of rewards in {0, 1} lies in [0, beta] up to that, and the ESS
    # is that of the weights exp(beta r_j) (M when a prompt's rewards are all equal)
    assert all(-1e-2 <= v <= beta + 1e-2 for v in log_z), log_z
    for pid, ess in zip(labels.column("prompt_id").to_pylist(), labels.column("ess").to_pylist()):
        w = [math.exp(beta * r) for p, r in zip(col["prompt_id"], col["reward"]) if p == pid]
        assert len(w) == sz["M"] and abs(ess - sum(w) ** 2 / sum(x * x for x in w)) < 1e-2 * sz["M"]
    assert math.isfinite(summary["mean_log_z"])
    man = json.loads((s1 / "manifest.json").read_text())
    assert man["config"]["reference"] == ALIAS and man["config"]["engine"] == "vllm"

    metrics = run_stage2(
        Stage2Config(labels=str(s1), out_dir=str(s2), val_fraction=0.25, epochs=20, hidden=32, device="cpu"),
        progress=False,
    )
    mses = {k: v for k, v in metrics.items() if k.endswith("mse")}
    assert mses and all(math.isfinite(v) for v in mses.values()), metrics  # (R^2 is nan for constant labels)
    predict = load_log_z_predictor(s2, device="cpu")
    pred = predict([[{"role": "user", "content": "What is 2 + 3? Answer with just the number."}]])
    assert pred.shape == (1,) and torch.isfinite(pred).all()
    del predict

    start = load_file(f"{smollm2_dir}/model.safetensors")[KEY].float()
    disa = {
        "tilt_beta": beta,
        "disa": {"stage1_dir": str(s1), "stage2_dir": str(s2), "logprob_scale": "sum"},
    }
    for objective, extra in (("disa", disa), ("grpo", None)):
        if objective not in sz["objectives"]:
            continue
        history, out, err = _train(tmp_path, objective, ALIAS, sz, data, extra)
        assert "vLLM colocate on CPU" in err  # the trainer built TRL's engine with CPU settings
        steps = [h for h in history if "loss" in h]
        assert [h["step"] for h in steps] == list(range(1, sz["steps"] + 1)), objective
        assert all(math.isfinite(h["loss"]) for h in steps), steps
        moved = not torch.equal(load_file(f"{out}/model.safetensors")[KEY].float(), start)
        if objective == "grpo" and all(h["frac_reward_zero_std"] == 1.0 for h in steps):
            # every group's rewards were constant: zero advantages, so GRPO (KL coefficient 0) must not move
            assert not moved, "GRPO moved the weights with zero advantages"
        else:
            assert moved, f"{objective} did not move the weights"
