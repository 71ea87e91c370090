"""Every config passes ``tiltlab llm train --config X --dry-run`` and builds the Stage-1 / Stage-2 /
eval command configs of its sections.

Keys that other parts of issue 14 add to the schema (``stage1.max_model_len`` ...,
``trl.dynamic_sampling``) may not be known to this checkout's :class:`Stage1Config` /
:class:`TiltGRPOConfig` yet: only those agreed names (:data:`PENDING`) are dropped from a temporary
copy, and only while the receiving dataclass lacks them; any other unknown key fails.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

from tiltlab.llm.base.run_config import STAGE1_KEYS  # noqa: E402

CONFIG_FILES = sorted((Path(__file__).resolve().parents[3] / "configs").glob("*.yaml"))


def _fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _pending() -> dict[str, set[str]]:
    """section -> agreed new keys the schema of this checkout does not accept yet."""
    from tiltlab.llm.disa.stage1 import Stage1Config
    from tiltlab.llm.train.online import TiltGRPOConfig

    return {
        "stage1": set(STAGE1_KEYS) - _fields(Stage1Config),
        "trl": {"dynamic_sampling"} - _fields(TiltGRPOConfig),
    }


def _schema_copy(path: Path, tmp_path: Path) -> Path:
    data = yaml.safe_load(path.read_text())
    for section, keys in _pending().items():
        for k in keys & set(data.get(section) or {}):
            del data[section][k]
    out = tmp_path / path.name
    out.write_text(yaml.safe_dump(data))
    return out


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: p.stem)
def test_train_dry_run(path, tmp_path, capsys):
    import json

    from tiltlab.cli import main

    cfg = _schema_copy(path, tmp_path)
    assert main(["llm", "train", "--config", str(cfg), "--dry-run"]) == 0
    printed = json.loads(capsys.readouterr().out)
    data = yaml.safe_load(path.read_text())
    assert printed["model"] == data["model"] and printed["objective"] == data["objective"]
    for section in ("lora", "validation"):  # new sections survive validation unchanged
        assert printed[section] == (data.get(section) or {})
    # the trainer config itself (its cross-field checks: batch divisibility, clip ranges ...), CPU switches aside
    from tiltlab.llm.train.config import load_run_config

    rc = load_run_config(cfg)
    if rc.objective != "none":
        kw = rc.trainer_kwargs()
        kw.update(bf16=False, use_cpu=True, report_to="none", output_dir=str(tmp_path / "out"))
        if rc.kind == "online":
            from tiltlab.llm.train.online import TiltGRPOConfig

            args = TiltGRPOConfig(**{**kw, "use_vllm": False})
            assert args.generation_batch_size % args.num_generations == 0
        else:
            from tiltlab.llm.train.offline import OfflineConfig

            OfflineConfig(**kw)


def _section_config(cls, path: Path, section: str, translate=None):
    from tiltlab.dataclass_cli import add_dataclass_args
    from tiltlab.llm.base.config_args import config_from_args

    p = argparse.ArgumentParser()
    add_dataclass_args(p, cls, config_section=section)
    return config_from_args(cls, p.parse_args(["--config", str(path)]), section=section, translate=translate)


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: p.stem)
def test_stage_and_eval_sections_build(path, tmp_path):
    from tiltlab.llm.disa.stage1 import Stage1Config
    from tiltlab.llm.disa.stage2.config import Stage2Config
    from tiltlab.llm.eval.config import EvalConfig, eval_from_run_config

    data = yaml.safe_load(path.read_text())
    cfg = _schema_copy(path, tmp_path)
    assert data.get("eval"), f"{path.name}: no eval section"
    ev = _section_config(EvalConfig, cfg, "eval", eval_from_run_config)
    assert ev.engine == "vllm", f"{path.name}: eval must run on vLLM at paper scale"
    assert ev.k == data["eval"]["k"] and ev.temperature == data["eval"]["temperature"]
    if data.get("stage1"):
        s1 = _section_config(Stage1Config, cfg, "stage1")
        assert s1.proposal == data["stage1"]["proposal"] and s1.engine == "vllm"
        assert s1.reference == data["model"], "Stage 1 labels log Z under the trained model's pi_ref"
        levels = data.get("tilt_beta_levels")  # a named level (the paper configs) or the number itself
        tilt = levels[data["tilt_beta"]] if levels else data["tilt_beta"]
        assert isinstance(tilt, float) and s1.tilt_beta == tilt, "Stage-1 tilt = the trainer's tilt"
    if data.get("stage2"):
        s2 = _section_config(Stage2Config, cfg, "stage2")
        assert s2.labels == data["stage1"]["out_dir"] == data["disa"]["stage1_dir"]


def test_pending_keys_are_only_the_agreed_names():
    """A typo in a new key is not masked by the pending list: the configs use only the agreed names."""
    from tiltlab.llm.disa.stage1 import Stage1Config
    from tiltlab.llm.train.online import TiltGRPOConfig

    s1_ok = _fields(Stage1Config) | set(STAGE1_KEYS)
    trl_ok_extra = {"dynamic_sampling"}
    for path in CONFIG_FILES:
        data = yaml.safe_load(path.read_text())
        assert set(data.get("stage1") or {}) <= s1_ok, path.name
        if data.get("kind", "online") == "online":
            extra = set(data.get("trl") or {}) - _fields(TiltGRPOConfig)
            assert extra <= trl_ok_extra, (path.name, extra)


def test_dry_run_rejects_unknown_sections_keys(tmp_path):
    from tiltlab.llm.train.config import load_run_config

    src = CONFIG_FILES[0]
    for bad in ("lora.rank=8", "validation.every=5", "paced.embedding=live"):
        with pytest.raises(ValueError, match="unknown keys"):
            load_run_config(src, [bad])
    with pytest.raises(ValueError, match="exactly one"):
        load_run_config(src, ["validation.dataset=a.jsonl", "validation.holdout_fraction=0.1"])


def test_sft_lora_configs_read_a_prompt_completion_dataset():
    """The SFT-LoRA baselines train on `prepare sft` output (prompt/completion rows), not on the
    Stage-1 directory, and carry a LoRA section."""
    for name in ("sft_lora_qwen3_4b.yaml", "sft_lora_qwen2.5_7b.yaml"):
        data = yaml.safe_load((CONFIG_FILES[0].parent / name).read_text())
        assert data["dataset"].endswith(".jsonl") and "stage1" not in data["dataset"]
        assert data["lora"]["r"] > 0 and data["lora"]["target_modules"]


def test_fpa_batch_matches_the_accelerate_processes():
    """FPA Table 3 batch 64 = per_device x accumulation x the accelerate config's processes."""
    for path in CONFIG_FILES:
        if not path.name.startswith("fpa_"):
            continue
        data = yaml.safe_load(path.read_text())
        acc = yaml.safe_load((CONFIG_FILES[0].parents[1] / data["accelerate"]).read_text())
        t = data["trl"]
        assert t["per_device_train_batch_size"] * t["gradient_accumulation_steps"] * acc["num_processes"] == 64


@pytest.mark.parametrize(
    "manifest,refused",
    [
        ({"tilt_beta": 15.0, "reward_transform": "identity", "logprob_scale": "sum"}, None),
        ({"tilt_beta": 5.0, "reward_transform": "identity", "logprob_scale": "sum"}, "tilt_beta"),
        ({"tilt_beta": 15.0, "reward_transform": "identity", "logprob_scale": "mean"}, "logprob_scale"),
    ],
)
def test_dry_run_checks_disa_labels_against_the_stage1_manifest(tmp_path, capsys, manifest, refused):
    """``--dry-run`` runs the trainer's label check where Stage 1's manifest exists: a tilt or log-prob scale the
    labels were not made with exits 2 in one line naming it (as the run would, after loading the models); the
    matching manifest passes."""
    import json

    from tiltlab.cli import main

    s1 = tmp_path / "stage1"
    s1.mkdir()
    (s1 / "manifest.json").write_text(json.dumps(manifest))
    src = Path(__file__).resolve().parents[3] / "configs" / "disa_qwen3_4b.yaml"
    cfg = _schema_copy(src, tmp_path)
    rc = main(["llm", "train", "--config", str(cfg), "--dry-run", "--set", f"disa.stage1_dir={s1}"])
    err = capsys.readouterr().err
    if refused is None:
        assert rc == 0 and "valid" in err
    else:
        line = next(ln for ln in err.splitlines() if "error" in ln)
        assert rc == 2 and refused in line and "Traceback" not in err


def test_dry_run_notes_a_stage1_dir_without_its_manifest_yet(tmp_path, capsys):
    from tiltlab.cli import main

    s1 = tmp_path / "stage1"
    s1.mkdir()
    src = Path(__file__).resolve().parents[3] / "configs" / "disa_qwen3_4b.yaml"
    cfg = _schema_copy(src, tmp_path)
    assert main(["llm", "train", "--config", str(cfg), "--dry-run", "--set", f"disa.stage1_dir={s1}"]) == 0
    assert "has no manifest.json yet" in capsys.readouterr().err
