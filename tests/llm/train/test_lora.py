"""`lora:` in a run config: `tiltlab llm train` trains LoRA adapters (peft) and, for the learned
log Z objectives, the head in full (modules_to_save); every base weight stays as it was."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("peft")

from tests.patching import patch_everywhere
from tiltlab.llm.base import rewards
from tiltlab.llm.base.run_config import RunConfig
from tiltlab.llm.train.cli import build_trainer

LORA = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}


def _reward(prompts, completions, completion_ids, **kw):
    return [float(sum(ids) % 2 == 0) for ids in completion_ids]


def _cfg(tiny_dir, tmp_path, objective, kind="online"):
    trl = {
        "max_steps": 2,
        "learning_rate": 1e-2,
        "use_cpu": True,
        "report_to": "none",
        "save_strategy": "no",
        "seed": 0,
    }
    if kind == "online":
        data = "synthetic:math:8:1"
        trl.update(per_device_train_batch_size=8, num_generations=4, max_completion_length=6)
    else:
        rows = [
            {"prompt": "Compute 1 + 2.", "completion": c, "reward": r}
            for c, r in (("\\boxed{3}", 1), ("\\boxed{4}", 0))
        ]
        data = str(tmp_path / "off.jsonl")
        (tmp_path / "off.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows * 2))
        trl.update(per_device_train_batch_size=2)
    return RunConfig(
        model=str(tiny_dir),
        kind=kind,
        objective=objective,
        dataset=data,
        output_dir=str(tmp_path / "out"),
        trl=trl,
        lora=LORA,
    )


@pytest.mark.parametrize(("objective", "kind"), [("flowrl", "online"), ("grpo", "online"), ("fpa", "offline")])
def test_lora_trains_only_adapters_and_the_head(objective, kind, tiny_dir, tmp_path, monkeypatch):
    patch_everywhere(monkeypatch, rewards, "resolve_reward", lambda name: _reward)
    tr = build_trainer(_cfg(tiny_dir, tmp_path, objective, kind))
    before = {k: v.detach().clone() for k, v in tr.model.named_parameters()}
    tr.train()
    after = dict(tr.model.named_parameters())
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    adapters = {k for k in before if "lora_A" in k or "lora_B" in k}
    head = {k for k in before if "log_z_head" in k and "modules_to_save" in k}
    assert adapters and all("q_proj" in k or "v_proj" in k for k in adapters)  # target_modules honoured
    assert changed <= adapters | head, f"non-adapter parameters changed: {sorted(changed - adapters - head)[:5]}"
    assert any("lora_B" in k for k in changed)  # the adapters did learn
    if objective == "flowrl":
        assert head and head <= changed  # the head is trained in full, not frozen by PEFT
        frozen_copy = {k for k in before if "log_z_head" in k and "original_module" in k}
        assert not frozen_copy & changed


def test_lora_section_rejects_unknown_keys_and_bad_values(tiny_dir, tmp_path):
    from tiltlab.llm.train.cli import lora_config

    with pytest.raises(
        ValueError, match=r"unknown keys \['rank'\] in `lora:`; valid keys: alpha, dropout, r, target_modules"
    ):
        RunConfig(model="m", lora={"rank": 4})
    with pytest.raises(ValueError, match="lora.r must be a positive integer"):
        lora_config(RunConfig(model="m", lora={"r": 0}))
