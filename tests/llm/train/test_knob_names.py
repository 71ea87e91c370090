"""One name per knob above the loss functions: the TB family's knobs (``catalog.TB_OPTIONS``) are
``TiltGRPOConfig``'s fields under the same names, defaults and help; a run config's objective sections take
the same names; the old spellings are refused in one line naming the new, from Python and from YAML."""

from __future__ import annotations

import dataclasses
import re

import pytest

from tiltlab.llm.base.run_config import SECTION_KEYS, RunConfig
from tiltlab.objectives.catalog import RENAMED, TB_OPTIONS


def test_run_config_sections_take_the_declared_tb_names():
    for section in ("flowrl", "disa", "vargrad"):
        assert {o.name for o in TB_OPTIONS if o.name != "tilt_beta"} <= set(SECTION_KEYS[section])
        assert not set(SECTION_KEYS[section]) & set(RENAMED)
    assert RunConfig(model="tiny", objective="disa", disa={"logprob_scale": "mean"}).disa == {"logprob_scale": "mean"}


@pytest.mark.parametrize("old", ["length_normalize", "eps"])
def test_run_config_refuses_an_old_knob_name_naming_the_new(old):
    with pytest.raises(ValueError, match=re.escape(f"`{old}` is now `{RENAMED[old]}`")) as e:
        RunConfig(model="tiny", objective="disa", disa={old: False})
    assert "\n" not in str(e.value)


def test_trl_config_fields_are_the_declared_knobs(tmp_path):
    pytest.importorskip("trl")
    from tiltlab.llm.train.online import TiltGRPOConfig

    fields = {f.name: f for f in dataclasses.fields(TiltGRPOConfig)}
    for o in TB_OPTIONS:
        assert fields[o.name].default == o.default and fields[o.name].metadata["help"] == o.doc
    kw = dict(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    assert TiltGRPOConfig(objective="flowrl", **kw).logprob_scale == "mean"
    assert TiltGRPOConfig(objective="disa", **kw).logprob_scale == "sum"
    assert TiltGRPOConfig(objective="flowrl", logprob_scale="sum", **kw).logprob_scale == "sum"
    with pytest.raises(TypeError, match="'length_normalize' is now logprob_scale"):
        TiltGRPOConfig(objective="disa", length_normalize=True, **kw)
    with pytest.raises(ValueError, match="weight_clip must be one of"):
        TiltGRPOConfig(objective="disa", weight_clip="none", **kw)
    with pytest.raises(ValueError, match="logprob_scale must be one of"):
        TiltGRPOConfig(objective="disa", logprob_scale="token", **kw)


def test_the_tb_knobs_defaults_are_the_documented_ones():
    """The declared defaults, pinned by value (they were TiltGRPOConfig's before the declaration moved):
    FlowRL's tilt 15 and its code's max-10 weight clip, the [0.8, 1.2] eps clip, no shift or scale."""
    got = {o.name: o.default for o in TB_OPTIONS}
    assert got == {
        "tilt_beta": 15.0,
        "reward_scale": 1.0,
        "reward_shift": 0.0,
        "logprob_scale": None,
        "weight_clip": "max",
        "max_weight": 10.0,
        "weight_eps": 0.2,
        "weight_eps_high": None,
    }


def test_the_trl_trainers_capability_tables_are_the_tagged_objectives():
    """The tables TiltGRPOConfig checks options against, derived from the tags, pinned against the lists they
    replaced (a tag dropped or added to the wrong entry changes what the trainer accepts)."""
    pytest.importorskip("trl")
    from tiltlab.llm.train.online import config

    assert config.grpo_family() == ("grpo", "gspo", "cispo", "sapo", "luspo", "vespo")
    assert config.bias_corrected_kl() == ("grpo", "cispo", "sapo", "luspo", "vespo")
    assert config.kl_in_reward() == ("grpo",)
    assert config.tb_family() == ("flowrl", "disa", "vargrad", "paced")
    assert config.needs_ref() == ("flowrl", "disa", "vargrad")
    assert {o: config.loss_types(o) for o in ("grpo", "gspo", "cispo", "luspo", "disa", "lad")} == {
        "grpo": ("dapo", "grpo", "bnpo", "dr_grpo"),
        "gspo": ("grpo",),
        "cispo": ("cispo",),
        "luspo": ("luspo",),
        "disa": (),
        "lad": (),
    }


def test_kl_in_reward_is_refused_for_an_objective_without_the_tag(tmp_path):
    pytest.importorskip("trl")
    from tiltlab.llm.train.online import TiltGRPOConfig

    kw = dict(output_dir=str(tmp_path), report_to="none", use_cpu=True, beta=0.1, kl_in_reward=True)
    assert TiltGRPOConfig(objective="grpo", **kw).kl_in_reward
    with pytest.raises(ValueError, match="kl_in_reward is implemented by objective in"):
        TiltGRPOConfig(objective="gspo", **kw)
    with pytest.raises(ValueError, match="set beta > 0"):
        TiltGRPOConfig(objective="grpo", **{**kw, "beta": 0.0})


# ---- the tilt: `tilt_beta` in YAML, the Stage-1 section and flag, the manifest and every config class


def _yaml(tmp_path, text):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "override", "says"),
    [
        ("model: tiny\nbeta: 2.0\n", [], "`beta` is now `tilt_beta`"),
        ("model: tiny\nbeta_levels: {low: 1.0}\n", [], "`beta_levels` is now `tilt_beta_levels`"),
        ("model: tiny\nstage1: {beta: 2.0}\n", [], "`stage1.beta` is now `stage1.tilt_beta`"),
        ("model: tiny\n", ["beta=2.0"], "`beta` is now `tilt_beta`"),
    ],
)
def test_the_old_tilt_keys_are_refused_naming_the_new_and_trls_beta(tmp_path, text, override, says):
    from tiltlab.llm.base.run_config import read_run_config

    with pytest.raises(ValueError, match=re.escape(says)) as e:
        read_run_config(_yaml(tmp_path, text), override)
    assert "TRL's KL coefficient is `trl.beta`" in str(e.value) and "\n" not in str(e.value)


def test_the_tilt_keys_reach_the_trainer_and_trls_beta_stays_trls(tmp_path):
    from tiltlab.llm.base.run_config import read_run_config

    text = "model: tiny\nobjective: disa\ntilt_beta: high\ntilt_beta_levels: {high: 7.5}\ntrl: {beta: 0.25}\n"
    cfg = read_run_config(_yaml(tmp_path, text))
    kw = cfg.trainer_kwargs()
    assert (cfg.tilt_beta, cfg.tilt_beta_value, kw["tilt_beta"], kw["beta"]) == ("high", 7.5, 7.5, 0.25)
    assert read_run_config(_yaml(tmp_path, "model: tiny\ntilt_beta: 3\n")).trainer_kwargs()["tilt_beta"] == 3.0
    assert "tilt_beta" not in read_run_config(_yaml(tmp_path, "model: tiny\n")).trainer_kwargs()


@pytest.mark.parametrize("cls_path", ["run_config.RunConfig", "stage1.Stage1Config", "demo.DemoConfig"])
def test_every_config_class_refuses_beta_naming_tilt_beta(cls_path):
    import importlib

    mod, _, name = cls_path.rpartition(".")
    where = {
        "run_config": "tiltlab.llm.base.run_config",
        "stage1": "tiltlab.llm.disa.stage1",
        "demo": "tiltlab.llm.demo",
    }
    cls = getattr(importlib.import_module(where[mod]), name)
    with pytest.raises(TypeError, match=re.escape(f"{name}: 'beta' is now tilt_beta")):
        cls(beta=2.0)


def test_stage1s_old_flag_is_refused_in_one_line(capsys):
    from tiltlab.cli import main

    argv = ["llm", "stage1", "--proposal", "p", "--reference", "r", "--dataset", "d", "--out-dir", "o"]
    with pytest.raises(SystemExit) as e:
        main([*argv, "--beta", "2"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("error: --beta is now --tilt-beta") and "\n" not in err


def test_a_stage1_manifest_with_the_old_key_reads_as_one_with_the_new():
    from tiltlab.llm.disa.labels import upgrade_manifest

    old = {"beta": 2.0, "identity": {"beta": 2.0, "M": 4}, "config": {"beta": 2.0}, "summary": {"beta": 2.0}, "x": 1}
    new = {
        "tilt_beta": 2.0,
        "identity": {"tilt_beta": 2.0, "M": 4},
        "config": {"tilt_beta": 2.0},
        "summary": {"tilt_beta": 2.0},
        "x": 1,
    }
    assert upgrade_manifest(old) == new and upgrade_manifest(new) == new
    assert old["identity"] == {"beta": 2.0, "M": 4}  # the caller's dict is not changed


@pytest.mark.parametrize("objective", ["disa", "flowrl", "vargrad"])
def test_trl_beta_on_a_tb_objective_is_refused_not_silently_changed(tmp_path, objective):
    """TRL's beta is its KL-to-reference coefficient; the TB losses have no KL term, so a nonzero beta would be
    ignored: refused in one line naming tilt_beta. beta = 0 (every TB config's value) is accepted, and a GRPO
    objective keeps its beta."""
    from tiltlab.llm.train.online import TiltGRPOConfig

    common = dict(output_dir=str(tmp_path), use_cpu=True, report_to="none", tilt_beta=2.0)
    with pytest.raises(ValueError, match=r"has no KL-to-reference term.*got 0.05\); the tilt is tilt_beta") as e:
        TiltGRPOConfig(objective=objective, beta=0.05, **common)
    assert "\n" not in str(e.value)
    assert TiltGRPOConfig(objective=objective, beta=0.0, **common).beta == 0.0
    assert TiltGRPOConfig(objective="grpo", beta=0.05, **common).beta == 0.05
