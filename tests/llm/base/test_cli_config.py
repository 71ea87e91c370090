"""``tiltlab llm stage1|stage2|eval --config FILE --set k=v``: every run config of configs/ builds the
command's config dataclass, and the precedence default < file < --set < flag holds."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

pytest.importorskip("yaml")

from tiltlab.dataclass_cli import add_dataclass_args
from tiltlab.llm.base.config_args import config_from_args

CONFIGS = sorted((Path(__file__).resolve().parents[3] / "configs").glob("*.yaml"))


def _commands():
    from tiltlab.llm.disa.stage1 import Stage1Config
    from tiltlab.llm.disa.stage2.config import Stage2Config
    from tiltlab.llm.eval.config import EvalConfig, eval_from_run_config

    return {"stage1": (Stage1Config, None), "stage2": (Stage2Config, None), "eval": (EvalConfig, eval_from_run_config)}


def _parse(cls, section, argv):
    p = argparse.ArgumentParser()
    add_dataclass_args(p, cls, config_section=section)
    return p.parse_args(argv)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_config_section_builds_its_command_config(path):
    import yaml

    data = yaml.safe_load(path.read_text())
    built = 0
    for section, (cls, translate) in _commands().items():
        if not data.get(section):
            continue
        cfg = config_from_args(cls, _parse(cls, section, ["--config", str(path)]), section=section, translate=translate)
        assert isinstance(cfg, cls)
        built += 1
    assert built >= 1, f"{path.name} has no stage1/stage2/eval section"


def test_precedence_default_file_set_flag(tmp_path):
    from tiltlab.llm.disa.stage2.config import Stage2Config

    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text("model: tiny\nstage2:\n  labels: L\n  out_dir: O\n  hidden: 32\n  epochs: 7\n")
    args = _parse(Stage2Config, "stage2", ["--config", str(cfg_file), "--set", "stage2.epochs=9", "--lr", "0.5"])
    cfg = config_from_args(Stage2Config, args, section="stage2")
    assert (cfg.labels, cfg.hidden, cfg.epochs, cfg.lr, cfg.n_layers) == ("L", 32, 9, 0.5, 2)


def test_missing_required_and_unknown_keys_are_clear(tmp_path):
    from tiltlab.llm.disa.stage2.config import Stage2Config

    with pytest.raises(ValueError, match="--labels"):
        config_from_args(Stage2Config, _parse(Stage2Config, "stage2", ["--out-dir", "x"]), section="stage2")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: tiny\nstage2:\n  labels: L\n  out_dir: O\n  hiden: 3\n")
    with pytest.raises(ValueError, match="hiden"):
        config_from_args(Stage2Config, _parse(Stage2Config, "stage2", ["--config", str(bad)]), section="stage2")


def test_eval_section_maps_benchmarks_and_trained_model():
    path = next(p for p in CONFIGS if p.stem == "disa_qwen3_4b")
    cls, translate = _commands()["eval"]
    cfg = config_from_args(
        cls, _parse(cls, "eval", ["--config", str(path), "--set", "eval.k=4"]), section="eval", translate=translate
    )
    assert "math500" in cfg.datasets and cfg.k == 4 and cfg.model == "runs/disa_qwen3_4b"


def test_a_yaml_syntax_error_is_one_phrase_with_its_place():
    """The YAML parser's own problem phrase plus its line and column (1-based), nothing else: the whole
    multi-line parser message in its place would bury the place of the mistake."""
    import yaml

    from tiltlab.llm.base.config_args import _yaml_problem

    try:
        yaml.safe_load("a: [1, 2\nb: 3\n")
    except yaml.YAMLError as exc:
        err = exc
    mark = err.problem_mark
    assert _yaml_problem(err) == f"{err.problem} at line {mark.line + 1}, column {mark.column + 1}"
    assert "\n" not in _yaml_problem(err) and str(err) != err.problem
