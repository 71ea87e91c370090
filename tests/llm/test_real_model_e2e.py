"""The real backbone ``smollm2-135m`` through the whole DISA pipeline on CPU: Stage 1 (``run_stage1``),
Stage 2 (``run_stage2``), then DISA and GRPO built by ``tiltlab llm train``'s ``build_trainer``.

Rollouts use the transformers engine (``engine="hf"``): the CPU vLLM path is exercised in the
vLLM tests. The full variant (8 prompts, M = 4, two optimizer steps per method) is ``slow``; the
short variant (4 prompts, M = 2, one step each) runs by default.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import math

import pytest

pytest.importorskip("trl")

from tiltlab.llm.models import MODEL_ALIASES, resolve_model

ALIAS = "smollm2-135m"
SIZES = {
    "full": dict(prompts=8, M=4, steps=2, new_tokens=24),
    "short": dict(prompts=4, M=2, steps=1, new_tokens=8),
}


@pytest.fixture(scope="module")
def smollm2_dir():
    try:
        md.distribution(MODEL_ALIASES[ALIAS].distribution)
    except md.PackageNotFoundError:
        pytest.skip(f"needs `{MODEL_ALIASES[ALIAS].install}`")
    return resolve_model(ALIAS)


def _train_config(tmp_path, objective, model, size, data, extra=None):
    import yaml

    cfg = {
        "kind": "online",
        "objective": objective,
        "model": model,
        "dataset": data,
        "reward": "math",
        "output_dir": str(tmp_path / f"rl_{objective}"),
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
            "save_strategy": "no",
            "logging_steps": 1,
            "disable_tqdm": True,
            "seed": 0,
        },
        **(extra or {}),
    }
    path = tmp_path / f"{objective}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.parametrize("size", [pytest.param("full", marks=pytest.mark.slow), "short"])
def test_smollm2_stage1_stage2_disa_grpo(smollm2_dir, tmp_path, size):
    import torch
    from safetensors.torch import load_file

    from tiltlab.llm.stage1 import Stage1Config, load_stage1, run_stage1
    from tiltlab.llm.stage2 import Stage2Config, load_log_z_predictor, run_stage2
    from tiltlab.llm.trainers.cli import build_trainer
    from tiltlab.llm.trainers.config import load_run_config

    sz = SIZES[size]
    beta = 2.0
    data = f"synthetic:math:{sz['prompts']}:1"
    s1, s2 = tmp_path / "stage1", tmp_path / "stage2"
    summary = run_stage1(
        Stage1Config(
            proposal=ALIAS,
            reference=ALIAS,
            dataset=data,
            out_dir=str(s1),
            M=sz["M"],
            beta=beta,
            reward="math",
            max_new_tokens=sz["new_tokens"],
            engine="hf",
            device="cpu",
            gen_batch_size=64,
            score_batch_size=16,
        ),
        progress=False,
    )
    samples, labels = load_stage1(s1)
    assert (labels.num_rows, samples.num_rows) == (sz["prompts"], sz["prompts"] * sz["M"])
    log_z = labels.column("log_z").to_pylist()
    # q = pi_ref: the sampler's log-probs and pi_ref's teacher-forced ones score the same tokens
    # (fp32; batched-generation vs scoring numerics differ by ~1e-5 per token), so log w ~ 0 ...
    log_w = samples.column("log_w").to_pylist()
    assert max(abs(v) for v in log_w) < 1e-2, log_w
    # ... and the label log mean_j w_j exp(beta r_j) of rewards in {0, 1} lies in [0, beta] up to that
    assert all(-1e-2 <= v <= beta + 1e-2 for v in log_z), log_z
    assert all(abs(e - sz["M"]) < 1e-2 for e in labels.column("ess").to_pylist())
    assert math.isfinite(summary["mean_log_z"])
    man = json.loads((s1 / "manifest.json").read_text())
    assert man["config"]["reference"] == ALIAS  # the manifest keeps the portable alias

    metrics = run_stage2(
        Stage2Config(labels=str(s1), out_dir=str(s2), val_fraction=0.25, epochs=20, hidden=32, device="cpu"),
        progress=False,
    )
    mses = {k: v for k, v in metrics.items() if k.endswith("mse")}
    assert mses and all(math.isfinite(v) for v in mses.values()), metrics  # (R^2 is nan for constant labels)
    predict = load_log_z_predictor(s2, device="cpu")
    pred = predict([[{"role": "user", "content": "Compute 2 + 3."}]])
    assert pred.shape == (1,) and torch.isfinite(pred).all()

    start = load_file(f"{smollm2_dir}/model.safetensors")
    key = "model.layers.29.mlp.down_proj.weight"
    disa = {
        "beta": beta,
        "disa": {"stage1_dir": str(s1), "stage2_dir": str(s2), "length_normalize": False},
    }
    for objective, extra in (("disa", disa), ("grpo", None)):
        # TRL loads a model given by name itself: it gets the resolved directory
        trainer = build_trainer(load_run_config(_train_config(tmp_path, objective, smollm2_dir, sz, data, extra)))
        trainer.train()
        steps = [h for h in trainer.state.log_history if "loss" in h]
        assert [h["step"] for h in steps] == list(range(1, sz["steps"] + 1)), objective
        assert all(math.isfinite(h["loss"]) for h in steps), steps
        moved = not torch.equal(trainer.model.state_dict()[key].detach().float(), start[key].float())
        if objective == "grpo" and all(h["frac_reward_zero_std"] == 1.0 for h in steps):
            # every group's rewards were constant: zero advantages, so GRPO (KL coefficient 0) must not move
            assert not moved, "GRPO moved the weights with zero advantages"
        else:
            assert moved, f"{objective} did not move the weights"
