"""A user's mistakes on the command line: each ends in one line on stderr that says what is wrong
and what to do, exit 2 (bad input) or 1 (a failed run), no traceback, and nothing half-written.
``--debug`` brings the traceback back. The long commands end by naming their output folder."""

from __future__ import annotations

import json

import pytest

from tests.patching import patch_everywhere
from tiltlab.cli import main


def _one_line_error(capsys, prefix: str) -> str:
    """The single stderr line (asserted single, traceback-free, starting with ``prefix``)."""
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith(prefix), lines[0]
    return lines[0]


# --------------------------------------------------------------------------- tiltlab sim / figures


def test_sim_unknown_env(capsys):
    assert main(["sim", "--env", "nosuchenv"]) == 2
    line = _one_line_error(capsys, "tiltlab sim: error: unknown --env 'nosuchenv'")
    assert "multiprompt" in line  # the choices are named


def test_sim_unwritable_out_is_refused_before_the_run(capsys, tmp_path, monkeypatch):
    import tiltlab.sim.api as api

    monkeypatch.setattr(api, "run", lambda cfg, env=None: pytest.fail("the run started"))
    (tmp_path / "a_file").write_text("x")
    assert main(["sim", "--steps", "1", "--out", str(tmp_path / "a_file" / "r.json")]) == 2
    _one_line_error(capsys, f"tiltlab sim: error: cannot write --out {tmp_path / 'a_file' / 'r.json'}")


def test_a_failed_run_exits_1_and_debug_shows_the_traceback(capsys, monkeypatch):
    import tiltlab.sim.api as api

    def boom(cfg, env=None):
        raise RuntimeError("boom")

    monkeypatch.setattr(api, "run", boom)
    assert main(["sim", "--steps", "1"]) == 1
    line = _one_line_error(capsys, "tiltlab sim: error: RuntimeError: boom")
    assert "--debug" in line
    with pytest.raises(RuntimeError, match="boom"):
        main(["sim", "--steps", "1", "--debug"])


def test_debug_reraises_a_usage_error():
    with pytest.raises(ValueError, match="nosuchenv"):
        main(["--debug", "sim", "--env", "nosuchenv"])


def test_parse_error_is_one_line(capsys):
    assert _exit_code(lambda: main(["check", "--jobs", "two"])) == 2
    _one_line_error(capsys, "tiltlab check: error: argument --jobs: expected a whole number >= 1, got 'two'")


def _exit_code(fn) -> int:
    with pytest.raises(SystemExit) as exc:
        fn()
    return exc.value.code


def test_figures_only_fig1_means_fig01_not_fig10(monkeypatch, tmp_path, capsys):
    import tiltlab.sim.figures as simfig

    asked = {}

    def fake_make_all(out_dir, quick=False, seed=0, only=None, progress=None):
        asked["only"] = only
        return []

    monkeypatch.setattr(simfig, "make_all", fake_make_all)
    assert main(["figures", "--only", "fig1", "--out", str(tmp_path)]) == 0
    assert asked["only"] == ["fig01_lad_bandit"]
    assert main(["figures", "--only", "fig10", "--out", str(tmp_path)]) == 0
    assert asked["only"] == ["fig10_lad_divergences"]
    capsys.readouterr()


def test_figures_ambiguous_prefix_lists_the_matches(capsys, tmp_path):
    assert main(["figures", "--only", "fig0", "--out", str(tmp_path)]) == 2
    line = _one_line_error(capsys, "tiltlab figures: error: figure 'fig0' is ambiguous")
    assert "fig01_lad_bandit" in line and "fig09_fpa_entanglement" in line
    assert not (tmp_path / "index.json").exists()


def test_figures_unknown_id(capsys, tmp_path):
    assert main(["figures", "--only", "fig99_nope", "--out", str(tmp_path)]) == 2
    _one_line_error(capsys, "tiltlab figures: error: unknown figure 'fig99_nope'")


# --------------------------------------------------------------------------- tiltlab llm


def _needs(module: str):
    try:
        __import__(module)
    except ImportError as exc:
        pytest.skip(f"{module} is not importable ({exc})")


def test_train_without_config(capsys):
    assert _exit_code(lambda: main(["llm", "train"])) == 2
    _one_line_error(capsys, "tiltlab llm train: error: the following arguments are required: --config")


def test_train_missing_config(capsys, tmp_path):
    assert main(["llm", "train", "--config", str(tmp_path / "nosuch.yaml")]) == 2
    line = _one_line_error(capsys, "tiltlab llm train: error: config ")
    assert "does not exist" in line and "--config" in line


def _config(tmp_path, **kw) -> str:
    import yaml

    data = {
        "kind": "online",
        "objective": "grpo",
        "model": "tiny",
        "dataset": "synthetic:math:4:1",
        "output_dir": str(tmp_path / "out"),
        "trl": {"max_steps": 1, "use_cpu": True, "report_to": "none"},
        **kw,
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_train_unknown_objective(capsys, tmp_path):
    _needs("trl")
    assert main(["llm", "train", "--config", _config(tmp_path), "--objective", "nosuch", "--dry-run"]) == 2
    line = _one_line_error(capsys, "tiltlab llm train: error: objective 'nosuch'")
    assert "grpo" in line  # the choices are named


def test_train_objective_flag_overrides_the_config(capsys, tmp_path):
    _needs("trl")
    assert main(["llm", "train", "--config", _config(tmp_path), "--objective", "flowrl", "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["objective"] == "flowrl"


def test_train_empty_online_dataset_writes_no_model(capsys, tmp_path):
    _needs("trl")
    (tmp_path / "empty.jsonl").write_text("")
    cfg = _config(tmp_path, dataset=str(tmp_path / "empty.jsonl"))
    assert main(["llm", "train", "--config", cfg]) == 2
    line = _one_line_error(capsys, "tiltlab llm train: error: dataset ")
    assert "has no rows" in line
    assert not (tmp_path / "out").exists()


def test_stage1_missing_data_file_writes_nothing(capsys, tmp_path):
    _needs("transformers")
    out = tmp_path / "s1"
    argv = ["llm", "stage1", "--proposal", "tiny", "--reference", "tiny", "--dataset", str(tmp_path / "nosuch.jsonl")]
    assert main([*argv, "--out-dir", str(out)]) == 2
    line = _one_line_error(capsys, "tiltlab llm stage1: error: dataset path ")
    assert "does not exist" in line
    assert not out.exists()


def test_stage1_broken_yaml(capsys, tmp_path):
    (tmp_path / "broken.yaml").write_text("stage1:\n  M: [8\n  tilt_beta: 1.0\n")
    assert main(["llm", "stage1", "--config", str(tmp_path / "broken.yaml")]) == 2
    line = _one_line_error(capsys, "tiltlab llm stage1: error: ")
    assert "not valid YAML" in line and "line 3" in line


def test_set_value_that_is_not_yaml(capsys, tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("model: tiny\nstage2:\n  labels: L\n  out_dir: O\n")
    assert main(["llm", "stage2", "--config", str(cfg), "--set", "stage2.epochs=[3"]) == 2
    _one_line_error(capsys, "tiltlab llm stage2: error: --set stage2.epochs=[3: the value is not valid YAML")


def test_stage2_before_stage1(capsys, tmp_path):
    out = tmp_path / "s2"
    assert main(["llm", "stage2", "--labels", str(tmp_path / "s1"), "--out-dir", str(out)]) == 2
    line = _one_line_error(capsys, "tiltlab llm stage2: error: no Stage 1 output in ")
    assert "run `tiltlab llm stage1" in line
    assert not out.exists()


def test_eval_missing_local_model(capsys, tmp_path):
    missing = str(tmp_path / "no" / "such" / "model")
    assert main(["llm", "eval", "--model", missing, "--datasets", "synthetic:math:2", "--k", "1"]) == 2
    line = _one_line_error(capsys, f"tiltlab llm eval: error: model '{missing}' does not exist")
    assert "Repo id" not in line


def test_eval_benchmark_not_on_disk_names_the_flag(capsys, tmp_path):
    argv = ["llm", "eval", "--model", "tiny", "--datasets", "aime24", "--data-dir", str(tmp_path), "--k", "1"]
    assert main(argv) == 2
    line = _one_line_error(capsys, "tiltlab llm eval: error: benchmark 'aime24' not found")
    assert "--data-dir" in line and "data_dir=" not in line


def test_eval_untrained_run_of_a_config(capsys, tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"model: tiny\nobjective: grpo\noutput_dir: {tmp_path / 'never_trained'}\neval:\n  k: 1\n")
    assert main(["llm", "eval", "--config", str(cfg)]) == 2
    line = _one_line_error(capsys, "tiltlab llm eval: error: the trained model ")
    assert "tiltlab llm train --config" in line


def test_demo_bad_threads(capsys, tmp_path):
    assert main(["llm", "demo", "--threads", "0", "--out-dir", str(tmp_path / "d")]) == 2
    _one_line_error(capsys, "tiltlab llm demo: error: --threads must be >= 1, got 0")
    assert not (tmp_path / "d").exists()


# --------------------------------------------------------------------------- close matches, config keys and types


@pytest.mark.parametrize(
    ("argv", "prog", "rest", "hint"),
    [
        (["check", "--onyl", "x"], "tiltlab check", "--onyl x", "--only"),
        (["check", "--onyl", "json"], "tiltlab check", "--onyl json", "--only"),  # a value is not a flag
        (["reproduce", "--qick"], "tiltlab reproduce", "--qick", "--quick"),
        (["figures", "--qiuck"], "tiltlab figures", "--qiuck", "--quick"),
        (["sim", "--stpes", "3"], "tiltlab sim", "--stpes 3", "--steps"),
        (["llm", "eval", "--modle", "x"], "tiltlab llm eval", "--modle x", "--model"),
        (["llm", "stage2", "--epohcs=1000000"], "tiltlab llm stage2", "--epohcs=1000000", "--epochs"),
    ],
)
def test_mistyped_flag_names_the_close_match_under_its_subcommand(capsys, argv, prog, rest, hint):
    assert _exit_code(lambda: main(argv)) == 2
    line = _one_line_error(capsys, f"{prog}: error: ")
    assert line == f"{prog}: error: unrecognized arguments: {rest} (did you mean {hint}?)"


def test_several_mistyped_flags_and_one_with_no_close_match(capsys):
    assert _exit_code(lambda: main(["check", "--onyl", "x", "--jbos", "2", "--xyzzy"])) == 2
    line = _one_line_error(capsys, "tiltlab check: error: unrecognized arguments: --onyl x --jbos 2 --xyzzy")
    assert line.endswith("(did you mean --only for --onyl, --jobs for --jbos?)"), line
    assert _exit_code(lambda: main(["check", "--xyzzy"])) == 2
    assert _one_line_error(capsys, "tiltlab check: error: ") == "tiltlab check: error: unrecognized arguments: --xyzzy"


def test_mistyped_commands_name_the_close_match(capsys):
    assert _exit_code(lambda: main(["chek"])) == 2
    line = _one_line_error(capsys, "tiltlab: error: unknown command 'chek' (did you mean 'check'?)")
    assert "choose from check, reproduce" in line
    assert _exit_code(lambda: main(["llm", "evl"])) == 2
    line = _one_line_error(capsys, "tiltlab llm: error: argument COMMAND: invalid choice: 'evl' (did you mean 'eval'?)")
    assert "'stage1'" in line  # the choices are still listed
    assert _exit_code(lambda: main(["check", "--layer", "thoery"])) == 2
    _one_line_error(capsys, "tiltlab check: error: argument --layer: invalid choice: 'thoery' (did you mean 'theory'?)")
    assert _exit_code(lambda: main(["zzzzzz"])) == 2
    line = _one_line_error(capsys, "tiltlab: error: unknown command 'zzzzzz' (choose from")
    assert "did you mean" not in line


def _run_yaml(tmp_path, text: str) -> str:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return str(path)


def test_set_unknown_top_level_key_lists_the_valid_keys(capsys, tmp_path):
    cfg = _run_yaml(tmp_path, "model: tiny\nstage2:\n  labels: L\n  out_dir: O\n")
    assert main(["llm", "stage2", "--config", cfg, "--set", "nosuch.key=1"]) == 2
    line = _one_line_error(
        capsys, "tiltlab llm stage2: error: --set nosuch.key=1: unknown keys ['nosuch'] in the run config"
    )
    assert "did you mean" not in line
    valid = line.split("valid keys: ", 1)[1].split(", ")
    assert {"model", "tilt_beta", "stage1", "stage2", "trl", "output_dir"} <= set(valid) and valid == sorted(valid)
    assert main(["llm", "stage2", "--config", cfg, "--set", "objectve=grpo"]) == 2
    line = _one_line_error(capsys, "tiltlab llm stage2: error: --set objectve=grpo: unknown keys ['objectve']")
    assert "(did you mean 'objective'?)" in line


def test_unknown_key_in_the_file_names_the_file(capsys, tmp_path):
    cfg = _run_yaml(tmp_path, "model: tiny\ntilt_bta: 1\nstage2:\n  labels: L\n  out_dir: O\n")
    assert main(["llm", "stage2", "--config", cfg]) == 2
    _one_line_error(
        capsys,
        f"tiltlab llm stage2: error: {cfg}: unknown keys ['tilt_bta'] in the run config (did you mean 'tilt_beta'?)",
    )


def test_set_unknown_section_key_names_the_close_match(capsys, tmp_path):
    cfg = _run_yaml(tmp_path, "model: tiny\nstage2:\n  labels: L\n  out_dir: O\n")
    assert main(["llm", "stage2", "--config", cfg, "--set", "stage2.epohcs=3"]) == 2
    line = _one_line_error(
        capsys,
        "tiltlab llm stage2: error: --set stage2.epohcs=3: unknown keys ['epohcs'] in `stage2:` (Stage2Config) "
        "(did you mean 'epochs'?); valid keys: ",
    )
    assert "epochs" in line.split("valid keys: ")[1].split(", ") and "labels" in line


@pytest.mark.parametrize(
    ("yaml_text", "setting", "message"),
    [
        ("model: tiny\n", "tilt_beta=abc", "tilt_beta: expected a number, got 'abc'"),
        (
            "model: tiny\ntilt_beta_levels: {low: 0.5, high: 2.0}\n",
            "tilt_beta=abc",
            "tilt_beta: expected a number or a name in tilt_beta_levels (high, low), got 'abc'",
        ),
        ("model: tiny\n", "lr_scale=fast", "lr_scale: expected a number, got 'fast'"),
        ("model: tiny\n", "log_kl_old=3", "log_kl_old: expected true or false, got 3"),
        ("model: tiny\n", "stage2=5", "stage2: expected a mapping, got 5"),
        ("model: tiny\n", "stage2.epochs=abc", "stage2.epochs: expected an integer, got 'abc'"),
        ("model: tiny\n", "stage2.epochs=2.5", "stage2.epochs: expected an integer, got 2.5"),
        ("model: tiny\n", "stage2.lr=[1]", "stage2.lr: expected a number, got [1]"),
        ("model: tiny\n", "stage2.device=3", "stage2.device: expected a string or null, got 3"),
    ],
)
def test_set_type_errors_name_the_expected_type(capsys, tmp_path, yaml_text, setting, message):
    cfg = _run_yaml(tmp_path, yaml_text)
    out = tmp_path / "s2"
    argv = ["llm", "stage2", "--config", cfg, "--labels", "L", "--out-dir", str(out), "--set", setting]
    assert main(argv) == 2
    assert _one_line_error(capsys, "tiltlab llm stage2: error: ") == f"tiltlab llm stage2: error: {message}"
    assert not out.exists()


# --------------------------------------------------------------------------- where the outputs went


def test_long_llm_commands_print_their_output_dir(monkeypatch, tmp_path, capsys):
    """demo, stage1 and eval end with the folder their outputs went to (the runs are stubbed)."""
    import tiltlab.llm.demo as demo
    import tiltlab.llm.disa.stage1 as stage1
    import tiltlab.llm.eval.cli as evaluate  # where _cli_main looks run_eval and results_table up

    out = tmp_path / "d"
    monkeypatch.setattr(demo, "run_demo", lambda cfg: {"timings": {"total": 1.0}, "figure": str(out / "curves.png")})
    assert main(["llm", "demo", "--quick", "--out-dir", str(out)]) == 0
    assert f"outputs in {out}/" in capsys.readouterr().out.splitlines()[-1]

    monkeypatch.setattr(stage1.cli, "run_stage1", lambda cfg, progress=True: {"prompts": 0})
    argv = ["llm", "stage1", "--proposal", "tiny", "--reference", "tiny", "--dataset", "synthetic:math:2"]
    assert main([*argv, "--out-dir", str(tmp_path / "s1")]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"labels and samples written to {tmp_path / 's1'}"

    monkeypatch.setattr(evaluate, "run_eval", lambda cfg: {})
    monkeypatch.setattr(evaluate, "results_table", lambda results: "| table |")
    argv = ["llm", "eval", "--model", "tiny", "--datasets", "synthetic:math:2", "--k", "1"]
    assert main([*argv, "--out-dir", str(tmp_path / "ev")]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith(f"results written to {tmp_path / 'ev'}")


# --------------------------------------------------------------------------- tiltlab llm train --dry-run
# The dry run checks what the run would before any model is loaded: the trainer config's own checks,
# the reward, the LoRA section. A config the run would refuse is refused here with the same one line.


@pytest.fixture
def no_model_loads(monkeypatch):
    """A dry run that loads a model (or a tokenizer) fails the test."""
    import tiltlab.llm.base.models as models

    def refuse(*a, **k):
        raise AssertionError("a dry run loaded a model")

    patch_everywhere(monkeypatch, models, "load_model", refuse)
    patch_everywhere(monkeypatch, models, "load_tokenizer", refuse)


def test_the_no_model_loads_guard_reaches_the_trainer_builder(no_model_loads):
    """The guard is not vacuous: `tiltlab llm train` builds its trainer with the names it imported at its
    top, and those are the refusing ones (a patch of the models module alone would not reach them)."""
    import tiltlab.llm.train.cli as train_cli

    with pytest.raises(AssertionError, match="loaded a model"):
        train_cli.load_model("tiny")
    with pytest.raises(AssertionError, match="loaded a model"):
        train_cli.load_tokenizer("tiny")


@pytest.mark.parametrize(
    "override, says",
    [
        ("trl.loss_type=bogus", "implements loss_type in"),  # a TRL loss type the objective does not implement
        ("trl.loss_type=dr_gpro", "trl.loss_type='dr_gpro' (did you mean 'dr_grpo'?): objective='grpo' implements"),
        ("trl.per_device_train_batch_size=3", "must be divisible"),  # TRL's batch divisibility
        ("trl.kl_estimator=k9", "kl_estimator must be k1 | k2 | k3"),  # a tiltlab field's own check
        ("trl.kl_in_reward=true", "kl_in_reward applies beta"),  # a cross-field check (TRL's beta is 0)
        ("reward=nosuch_reward", "reward"),  # a reward that does not resolve
        ("lora.r=0", "lora.r must be a positive integer"),  # the LoRA section
    ],
    ids=["loss_type", "loss_type_typo", "batch", "kl_estimator", "kl_in_reward", "reward", "lora"],
)
def test_train_dry_run_refuses_what_the_run_would(capsys, tmp_path, no_model_loads, override, says):
    _needs("trl")
    cfg = _config(tmp_path, trl={"max_steps": 1, "use_cpu": True, "report_to": "none", "num_generations": 2})
    assert main(["llm", "train", "--config", cfg, "--set", "trl.num_generations=2", "--dry-run"]) == 0
    capsys.readouterr()
    assert main(["llm", "train", "--config", cfg, "--set", override, "--dry-run"]) == 2
    line = _one_line_error(capsys, "tiltlab llm train: error: ")
    assert says in line, line
    assert not (tmp_path / "out").exists()


def test_train_dry_run_checks_the_offline_trainer_config(capsys, tmp_path, no_model_loads):
    _needs("trl")
    cfg = _config(tmp_path, kind="offline", objective="dpo", dataset=str(tmp_path / "pairs.jsonl"))
    assert main(["llm", "train", "--config", cfg, "--dry-run"]) == 0  # a file made later: noted
    assert "is not on this machine" in capsys.readouterr().err
    (tmp_path / "pairs.jsonl").write_text("")  # an empty one is refused, as the run refuses it
    assert main(["llm", "train", "--config", cfg, "--dry-run"]) == 2
    assert "has no rows" in _one_line_error(capsys, "tiltlab llm train: error: ")
    (tmp_path / "pairs.jsonl").unlink()
    assert main(["llm", "train", "--config", cfg, "--set", "trl.apo_beta1=0", "--dry-run"]) == 2
    assert "apo_beta1 must be > 0" in _one_line_error(capsys, "tiltlab llm train: error: ")


def test_train_dry_run_notes_what_it_cannot_check_here(capsys, tmp_path, no_model_loads):
    """Machine switches (bf16) and absent local files are named on stderr; the run is still valid."""
    _needs("trl")
    here = tmp_path / "prompts.jsonl"
    here.write_text('{"prompt": "1+1?", "answer": "2"}\n')
    absent = tmp_path / "nosuch.jsonl"
    for dataset, noted in ((str(absent), True), (str(here), False), ("synthetic:math:4:1", False)):
        cfg = _config(tmp_path, dataset=dataset, trl={"max_steps": 1, "bf16": True, "report_to": "none"})
        assert main(["llm", "train", "--config", cfg, "--dry-run"]) == 0
        err = capsys.readouterr().err
        assert "not checked on this machine: {'bf16': True}" in err, err
        assert (f"dataset {str(absent)!r} is not on this machine" in err) is noted, err
        assert err.rstrip().endswith("the trainer config, the data on this machine, the reward and LoRA are valid")
