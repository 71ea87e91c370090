"""The run-config pre-check of ``tiltlab llm train`` (:mod:`tiltlab.llm.train.precheck`): keys, values and
option combinations are refused before torch / TRL / vLLM are imported (checked in a fresh interpreter by
``sys.modules``, not by the clock), with a close match for a mistyped name; each check has a good and a bad
value; the generated TRL field table is the installed classes' fields exactly; and ``--dry-run`` refuses what
the run refuses before training."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[3]
HEAVY = ("torch", "trl", "vllm", "transformers")

BASE = """\
kind: online
objective: disa
model: tiny
dataset: synthetic:qa:4:1
reward: math
output_dir: {out}
trl:
  learning_rate: 1.0e-5
  use_cpu: true  # the real runs below stop before training, on a machine without a GPU
  report_to: none
"""


@pytest.fixture
def config(tmp_path) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(BASE.format(out=tmp_path / "out"))
    return path


def _manifest(tmp_path, **settings) -> Path:
    s1 = tmp_path / "stage1"
    s1.mkdir(exist_ok=True)
    rec = {"tilt_beta": 15.0, "reward_transform": "identity", "logprob_scale": "sum", **settings}
    (s1 / "manifest.json").write_text(json.dumps(rec))
    return s1


#: (the --set / --objective arguments, what the one-line error must say); each refused before the imports
BAD_CASES = [
    (["--set", "trl.lerning_rate=1"], "did you mean 'learning_rate'?"),
    (["--set", "trl.loss_type=sapo_typo"], "did you mean 'sapo'?"),
    (["--objective", "dsia"], "did you mean 'disa'?"),
    (["--set", "outptu_dir=/tmp/x"], "did you mean 'output_dir'?"),
    (["--set", "disa.stage1_dri=/tmp/x"], "did you mean 'stage1_dir'?"),
    (["--set", "stage2.epohcs=3"], "did you mean 'epochs'?"),
    (["--set", "trl.learning_rate=abc"], "trl.learning_rate: expected a number, got 'abc'"),
    (["--set", "trl.reward_transform=afine"], "did you mean 'affine'?"),
    (["--set", "trl.disa_label=colum"], "did you mean 'column'?"),
    (["--set", "trl.beta=0.1"], "no KL-to-reference term"),
    (["--set", "trl.loss_type=grpo"], "implements loss_type in (none"),
    (
        [
            "--set",
            "validation.holdout_fraction=0.5",
            "--set",
            "validation.every_steps=2",
            "--set",
            "validation.metric=acuracy",
        ],
        "did you mean 'accuracy'?",
    ),
    (["--set", "lora.r=0"], "lora.r must be a positive integer"),
    (["--set", "reward=mth"], "unknown reward 'mth'"),
]


def _run_fresh(code: str) -> dict:
    """Run ``code`` in a fresh interpreter with this checkout first on the path; its last stdout line is JSON."""
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_bad_configs_are_refused_before_torch_trl_and_vllm_load(config, tmp_path):
    """``tiltlab llm train`` on each bad config: exit 2 with the one-line error (and its close match), and at
    that moment none of torch, trl, vllm, transformers has been imported; then the same for a Stage-1 manifest
    whose tilt the run's differs from."""
    s1 = _manifest(tmp_path, tilt_beta=5.0)
    cases = [*BAD_CASES, (["--set", f"disa.stage1_dir={s1}"], "tilt_beta")]
    res = _run_fresh(
        f"""
        import contextlib, io, json, sys
        from tiltlab.cli import main
        out = []
        for extra, _ in {cases!r}:
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                rc = main(["llm", "train", "--config", {str(config)!r}, *extra])
            out.append({{"rc": rc, "err": err.getvalue(), "heavy": [m for m in {HEAVY!r} if m in sys.modules]}})
        print(json.dumps(out))
        """
    )
    for (extra, words), r in zip(cases, res, strict=True):
        assert r["rc"] == 2, (extra, r)
        assert words in r["err"] and "Traceback" not in r["err"], (extra, r["err"])
        assert len(r["err"].strip().splitlines()) == 1, (extra, r["err"])
        assert r["heavy"] == [], (extra, r["heavy"])


def test_valid_configs_pass_the_precheck_without_the_heavy_imports(config, tmp_path):
    """The pre-check passes a valid config (the DISA one with a matching Stage-1 manifest, and every shipped
    config) and imports none of torch / trl / vllm / transformers doing so."""
    s1 = _manifest(tmp_path)
    configs = [str(p) for p in sorted((ROOT / "configs").glob("*.yaml"))]
    res = _run_fresh(
        f"""
        import json, sys
        from tiltlab.llm.train.config import load_run_config
        from tiltlab.llm.train.precheck import precheck
        sets = [f"disa.stage1_dir={s1}"]
        precheck(load_run_config({str(config)!r}, sets), sets)
        for path in {configs!r}:
            precheck(load_run_config(path))
        print(json.dumps({{"heavy": [m for m in {HEAVY!r} if m in sys.modules], "n": len({configs!r})}}))
        """
    )
    assert res["heavy"] == [] and res["n"] >= 30


def _pre(path, *overrides):
    from tiltlab.llm.train.config import load_run_config
    from tiltlab.llm.train.precheck import precheck

    return precheck(load_run_config(path, list(overrides)), list(overrides))


@pytest.mark.parametrize(
    "good,bad,words",
    [
        (["trl.learning_rate=2e-6"], ["trl.lerning_rate=2e-6"], "did you mean 'learning_rate'"),
        (["trl.per_device_train_batch_size=4"], ["trl.per_device_train_batch_size=2.5"], "expected an integer"),
        (["trl.use_vllm=true"], ["trl.use_vllm=maybe"], "expected true or false"),
        (["trl.logging_steps=5"], ["trl.logging_steps=[1]"], "expected a number"),
        (
            ["objective=grpo", "trl.loss_type=dr_grpo"],
            ["objective=grpo", "trl.loss_type=dr_grop"],
            "did you mean 'dr_grpo'",
        ),
        (["objective=cispo", "trl.epsilon_high=5"], ["objective=cispo"], "caps the importance ratio at epsilon_high"),
        (["objective=flowrl", "trl.beta=0"], ["objective=flowrl", "trl.beta=0.04"], "no KL-to-reference term"),
        (
            ["objective=grpo", "trl.beta=0.04"],
            ["objective=gspo", "trl.importance_sampling_level=token"],
            "uses importance_sampling_level",
        ),
        (
            ["objective=grpo", "trl.kl_estimator=k1"],
            ["objective=disa", "trl.kl_estimator=k1"],
            "options of objective='grpo'",
        ),
        (["trl.reward_scale=2"], ["trl.reward_scale=0"], "reward_scale"),
        (["trl.logprob_scale=mean"], ["trl.logprob_scale=sume"], "logprob_scale must be one of"),
        (["trl.health_patience=2"], ["trl.health_patience=0"], "health_patience must be >= 1"),
        (
            ["flowrl.log_z_hidden=64", "objective=flowrl"],
            ["flowrl.log_z_hidden=x", "objective=flowrl"],
            "flowrl.log_z_hidden",
        ),
        (["stage1.M=8"], ["stage1.MM=8"], "did you mean 'M'"),
        (["lora.r=8"], ["lora.r=8", "lora.dropout=1.0"], "lora.dropout"),
        (
            ["validation.holdout_fraction=0.5", "validation.every_steps=2"],
            ["validation.holdout_fraction=0.5", "validation.every_steps=0"],
            "every_steps must be a positive integer",
        ),
        (
            ["validation.holdout_fraction=0.5", "validation.every_steps=2", "validation.metric=accuracy"],
            ["validation.holdout_fraction=0.5", "validation.every_steps=2", "validation.metric=acuracy"],
            "did you mean 'accuracy'",
        ),
        (["lora.r=8"], ["lora.r=0"], "lora.r must be a positive integer"),
        (["lora.r=8", "lora.alpha=16"], ["lora.r=8", "lora.alpha=0"], "lora.alpha > 0"),
        (
            ["objective=cispo", "trl.epsilon_high=5", "trl.importance_sampling_level=token"],
            ["objective=cispo", "trl.epsilon_high=5", "trl.importance_sampling_level=sequence"],
            "uses importance_sampling_level='token'",
        ),
        (
            ["objective=sapo", "trl.importance_sampling_level=token"],
            ["objective=sapo", "trl.importance_sampling_level=sequence"],
            "uses importance_sampling_level='token'",
        ),
        (["trl.entropy_coef=0"], ["trl.entropy_coef=0.01"], "do not implement TRL's ['entropy_coef']"),
        (
            ["trl.use_adaptive_entropy=false"],
            ["trl.use_adaptive_entropy=true"],
            "do not implement TRL's ['entropy_coef']",
        ),
    ],
)
def test_each_check_passes_a_good_value_and_refuses_a_bad_one(config, good, bad, words):
    _pre(config, *good)
    with pytest.raises(ValueError) as e:
        _pre(config, *bad)
    assert words in str(e.value)


def test_an_unknown_key_names_the_set_it_came_from(config):
    """The ``--set`` that brought the mistyped key is named, not the first ``--set`` of the command line; a key
    from the file itself names none."""
    with pytest.raises(ValueError) as e:
        _pre(config, "trl.learning_rate=2e-6", "trl.lerning_rate=1")
    assert str(e.value).startswith("--set trl.lerning_rate=1: ")
    config.write_text(config.read_text() + "  lerning_rate: 1\n")
    with pytest.raises(ValueError) as e:
        _pre(config, "trl.learning_rate=2e-6")
    assert not str(e.value).startswith("--set") and "did you mean 'learning_rate'" in str(e.value)


@pytest.mark.parametrize(
    "objective,sets,level",
    [
        ("grpo", [], "token"),
        ("gspo", [], "sequence"),
        ("luspo", [], "sequence"),
        ("cispo", ["trl.epsilon_high=5"], "token"),
        ("disa", [], "token"),  # no importance ratio of TRL's: TRL's default
    ],
)
def test_the_importance_sampling_level_resolves_to_the_objectives_own(config, objective, sets, level):
    assert _pre(config, f"objective={objective}", *sets).importance_sampling_level == level


def test_a_stage1_dir_without_a_manifest_is_noted_not_refused(config, tmp_path):
    from tiltlab.llm.train.config import load_run_config
    from tiltlab.llm.train.precheck import check_labels, precheck

    s1 = tmp_path / "stage1_pending"
    s1.mkdir()
    sets = [f"disa.stage1_dir={s1}"]
    cfg = load_run_config(config, sets)
    notes: list[str] = []
    args = precheck(cfg, sets, notes)
    assert len(notes) == 1 and "has no manifest.json yet" in notes[0]
    assert check_labels(cfg, args) is None  # no notes list: nothing to note, nothing refused


def _inputs(objective, **kw):
    """A resolved trainer config's fields that :func:`check_trainer_inputs` reads (PACED's groups whole)."""
    fields = {"num_generations": 4, "per_device_train_batch_size": 4, "steps_per_generation": 1}
    fields |= {"paced_select_from": "learned", "disa_label": "predictor"}
    return SimpleNamespace(objective=objective, **{**fields, **kw})


@pytest.mark.parametrize(
    "args,columns,has_fn,refused",
    [
        (_inputs("paced", paced_select_from="disa"), (), False, "paced_select_from='disa' needs log_z_fn"),
        (_inputs("paced", paced_select_from="disa"), ("prompt", "log_z"), False, None),
        (_inputs("paced", paced_select_from="disa"), (), True, None),
        (_inputs("paced"), ("prompt",), False, None),
        (_inputs("paced", paced_select_from="disa", disa_label="column"), ("prompt",), True, "needs a 'log_z' column"),
        (_inputs("paced", disa_label="column"), ("prompt",), False, None),
        (_inputs("disa"), ("prompt",), False, "objective='disa' needs log_z_fn"),
        (_inputs("disa"), ("prompt",), True, None),
        (_inputs("disa"), ("prompt", "log_z"), False, None),
        (_inputs("grpo"), ("prompt",), False, None),
    ],
)
def test_the_trainer_inputs_need_a_source_of_frozen_log_z_only_where_it_is_read(args, columns, has_fn, refused):
    from tiltlab.llm.train.online_rules import check_trainer_inputs

    if refused is None:
        check_trainer_inputs(args, columns, has_fn)
        return
    with pytest.raises(ValueError) as e:
        check_trainer_inputs(args, columns, has_fn)
    assert refused in str(e.value)


@pytest.mark.parametrize(
    "settings,refused",
    [
        ({}, None),
        ({"tilt_beta": 5.0}, "tilt_beta"),
        ({"logprob_scale": "mean"}, "logprob_scale"),
        ({"reward_transform": "group_norm"}, "reward_transform"),
    ],
)
def test_the_stage1_label_check_runs_in_the_precheck(config, tmp_path, settings, refused):
    s1 = _manifest(tmp_path, **settings)
    if refused is None:
        _pre(config, f"disa.stage1_dir={s1}")
        return
    with pytest.raises(ValueError) as e:
        _pre(config, f"disa.stage1_dir={s1}")
    assert refused in str(e.value)
    # the override the trainer honours is honoured here too
    _pre(config, f"disa.stage1_dir={s1}", "disa.allow_label_mismatch=true", "disa.mismatch_reason=tested")


@pytest.mark.parametrize("kind", ["online", "offline"])
def test_the_generated_field_table_is_the_trainer_configs_fields(kind):
    """The committed table (names, annotations, defaults) equals the installed classes' fields when the installed
    TRL / transformers are the versions it was made with; otherwise the pre-check reads the classes themselves.
    A change of TiltGRPOConfig / OfflineConfig fails here until ``python3 -m tiltlab.llm.train.trl_fields``."""
    pytest.importorskip("trl")
    from tiltlab.llm.train import trl_fields

    live = trl_fields.live_fields(kind)
    if trl_fields.installed_versions() == trl_fields.VERSIONS:
        assert trl_fields.FIELDS[kind] == live, "regenerate: python3 -m tiltlab.llm.train.trl_fields"
        assert list(trl_fields.FIELDS[kind]) == list(live)
    assert trl_fields.trainer_fields(kind) == live


def test_the_table_falls_back_to_the_classes_under_another_version(monkeypatch):
    pytest.importorskip("trl")
    from tiltlab.llm.train import trl_fields

    monkeypatch.setattr(trl_fields, "VERSIONS", {"trl": "0.0.0", "transformers": "0.0.0"})
    monkeypatch.setattr(trl_fields, "FIELDS", {"online": {}, "offline": {}})
    assert "learning_rate" in trl_fields.trainer_fields("online")


def test_the_tables_trl_version_is_inside_the_pyproject_pin():
    import re

    from tiltlab.llm.train.trl_fields import VERSIONS

    lo, hi = re.search(r'"trl>=([0-9.]+),<([0-9.]+)"', (ROOT / "pyproject.toml").read_text()).groups()

    def v(s):
        return tuple(int(x) for x in s.split("."))

    assert v(lo) <= v(VERSIONS["trl"]) < v(hi)


# --- --dry-run refuses what the run refuses before training -------------------------------------------------


def _train(config, *args) -> tuple[int, str]:
    import contextlib
    import io

    from tiltlab.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["llm", "train", "--config", str(config), *args])
    return rc, err.getvalue()


@pytest.mark.parametrize(
    "sets,words",
    [
        # build_trainer: a predictor is needed (no log_z column in the data) and there is none
        ([], "needs disa.stage2_dir"),
        # _validation: the held-out share leaves no training rows
        (["disa.label=column", "validation.holdout_fraction=0.9", "validation.every_steps=1"], "leaves no training rows"),
        # TRL's check with the validation settings in the trainer kwargs
        (
            ["objective=grpo", "trl.num_generations=4", "trl.per_device_train_batch_size=4",
             "trl.per_device_eval_batch_size=3", "validation.holdout_fraction=0.5", "validation.every_steps=1"],
            "divisible by the number of generations",
        ),
    ],
)  # fmt: skip
def test_dry_run_refuses_what_the_run_refuses(config, tmp_path, sets, words, monkeypatch):
    """Each combination is refused by the run before it trains (the real command, no --dry-run: the error comes
    before any model is loaded) and by ``--dry-run``, in the same words."""
    pytest.importorskip("trl")
    monkeypatch.setenv("MASTER_PORT", "29999")  # the run would pick one for itself
    args = [a for s in sets for a in ("--set", s)]
    rc, err = _train(config, *args, "--dry-run")
    assert rc == 2 and words in err, err
    rc_run, err_run = _train(config, *args)
    assert rc_run == 2 and words in err_run, err_run
    assert err.strip().splitlines()[-1] == err_run.strip().splitlines()[-1]


def test_dry_run_refuses_a_log_z_column_that_is_not_there_and_a_missing_resume(config, tmp_path):
    pytest.importorskip("trl")
    rc, err = _train(config, "--set", "disa.label=column", "--dry-run")
    assert rc == 2 and "needs a 'log_z' column" in err
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": "1", "log_z": 0.5}) + "\n" for i in range(4)))
    rc, err = _train(config, "--set", "disa.label=column", "--set", f"dataset={rows}", "--dry-run")
    assert rc == 0, err
    rc, err = _train(
        config,
        "--set",
        "disa.label=column",
        "--set",
        f"dataset={rows}",
        "--dry-run",
        "--resume",
        str(tmp_path / "nope"),
    )
    assert rc == 2 and "is not a directory" in err
