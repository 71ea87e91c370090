"""The objectives' own knobs are declared once (``Spec.knobs`` in objectives/catalog.py): the TRL
trainer's, the offline trainer's and the simulator's config fields ``<objective>_<knob>``, a run
config's ``<objective>:`` section keys and their checks are derived from them; the old simulator names
are refused naming the new one."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import types

import pytest

from tiltlab.objectives import catalog, registry
from tiltlab.objectives.catalog import Option, Spec, check_knobs, knob_fields, section_keys
from tiltlab.objectives.lad import F_DIVERGENCES
from tiltlab.sim.config import RENAMED_FIELDS, SimConfig


def _configs():
    from tiltlab.llm.train.offline import OfflineConfig
    from tiltlab.llm.train.online.config import TiltGRPOConfig

    return {"online": TiltGRPOConfig, "offline": OfflineConfig, "sim": SimConfig}


def test_lad_divergence_names_are_the_loss_functions():
    assert tuple(F_DIVERGENCES) == catalog.LAD_DIVERGENCES


def _naive_fields(trainer: str) -> dict[str, object]:
    """The fields a trainer's config must have, written out from the table by hand-rolled loops."""
    out = {}
    for spec in catalog.SPECS.values():
        for knob in spec.knobs:
            where = knob.trainers if knob.trainers else spec.trainers
            if trainer in where:
                out[spec.name + "_" + knob.name] = knob.trainer_defaults.get(trainer, knob.default)
    return out


@pytest.mark.parametrize("trainer", ["online", "offline", "sim"])
def test_every_declared_knob_is_a_field_of_its_trainers_config_with_its_default(trainer):
    cls = _configs()[trainer]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    want = _naive_fields(trainer)
    assert want, trainer
    assert [o.name for o in knob_fields(trainer)] == list(want)
    for name, default in want.items():
        assert name in fields, (trainer, name)
        assert fields[name].default == default, (trainer, name)


def test_the_simulators_defaults_differ_where_declared():
    # away from the default: the simulator's toy-scale replay (32 / 16, off) is not the TRL trainer's (128 / 64, on)
    sim = {o.name: o.default for o in knob_fields("sim")}
    online = {o.name: o.default for o in knob_fields("online")}
    assert (sim["paced_replay_capacity"], sim["paced_replay_add"], sim["paced_replay"]) == (32, 16, False)
    assert (online["paced_replay_capacity"], online["paced_replay_add"], online["paced_replay"]) == (128, 64, True)
    assert "paced_replay_mode" in sim and "paced_replay_mode" not in online
    assert "lad_level" in online and "lad_level" not in sim


def test_run_config_sections_are_the_declared_knobs():
    from tiltlab.llm.base.run_config import SECTION_KEYS

    assert SECTION_KEYS["lad"] == {"eta": "lad_eta", "divergence": "lad_divergence", "level": "lad_level"}
    assert SECTION_KEYS["fpa"] == {"lam": "fpa_lam", "apply_to": "fpa_apply_to"}
    assert SECTION_KEYS["kto"] == {"beta": "kto_beta", "lambda_w": "kto_lambda_w", "lambda_l": "kto_lambda_l"}
    paced = {k: v for k, v in SECTION_KEYS["paced"].items() if not k.startswith("log_z")}
    assert paced == {k.name: "paced_" + k.name for k in catalog.SPECS["paced"].knobs if k.name != "replay_mode"}


def test_a_declared_objectives_knobs_are_derived_at_call_time():
    knob = Option("gain", float, 2.0, "a toy knob", trainer_defaults={"sim": 3.0})
    mode = Option("mode", str, "a", "a toy mode", ("a", "b"), trainers=frozenset({"online"}))
    spec = Spec("toyknob", "pg.grpo_loss", (), "pg", frozenset({"online", "sim"}), knobs=(knob, mode))
    with registry.registered(spec, lambda b, o: None):
        assert [(o.name, o.default) for o in knob_fields("online")][-2:] == [
            ("toyknob_gain", 2.0),
            ("toyknob_mode", "a"),
        ]
        assert [(o.name, o.default) for o in knob_fields("sim")][-1] == ("toyknob_gain", 3.0)
        assert section_keys("toyknob", "sim") == {"gain": "toyknob_gain"}

        cfg = types.SimpleNamespace(**{o.name: o.default for t in ("online", "sim") for o in knob_fields(t)})
        cfg.toyknob_mode = "b"
        check_knobs(cfg, "online")
        cfg.toyknob_mode = "c"
        with pytest.raises(ValueError, match=r"toyknob_mode must be one of \('a', 'b'\), got 'c'"):
            check_knobs(cfg, "online")
        check_knobs(cfg, "sim")  # the simulator has no toyknob_mode: not checked there
    assert "toyknob_gain" not in {o.name for o in knob_fields("online")}


def test_a_knob_for_an_unknown_trainer_is_refused():
    with pytest.raises(ValueError, match="unknown trainers"):
        Spec(
            "bad",
            "pg.grpo_loss",
            (),
            "pg",
            frozenset({"sim"}),
            knobs=(Option("x", int, 1, "", trainers=frozenset({"gpu"})),),
        )


@pytest.mark.parametrize(
    ("trainer", "field", "value"),
    [
        ("online", "lad_divergence", "kll"),
        ("online", "lad_level", "seq"),
        ("online", "paced_select_from", "oracle"),
        ("online", "paced_embeddings", "hidden"),
        ("offline", "fpa_apply_to", "some"),
        ("sim", "lad_divergence", "kll"),
        ("sim", "paced_replay_mode", "swap"),
    ],
)
def test_each_configs_choices_are_checked(trainer, field, value, tmp_path):
    cls = _configs()[trainer]
    kw = {} if trainer == "sim" else {"output_dir": str(tmp_path), "use_cpu": True, "report_to": []}
    with pytest.raises(ValueError, match=rf"^{field} must be one of .*, got {value!r}$"):
        cfg = cls(**kw, **{field: value})
        cfg.validate()  # SimConfig checks in validate(); the TRL configs at construction


@pytest.mark.parametrize(("old", "new"), sorted(RENAMED_FIELDS.items()))
def test_the_simulators_old_names_are_refused_naming_the_new(old, new):
    assert new in {f.name for f in dataclasses.fields(SimConfig)} and old not in {
        f.name for f in dataclasses.fields(SimConfig)
    }
    with pytest.raises(TypeError, match=rf"^SimConfig: '{old}' is now {new}$"):
        SimConfig(**{old: 1})


def test_the_simulators_old_flags_are_refused_naming_the_new():
    out = subprocess.run(
        [sys.executable, "-m", "tiltlab.cli", "sim", "--steps", "1", "--beta", "2"], capture_output=True, text=True
    )
    assert out.returncode == 2 and out.stderr.strip().splitlines()[-1].endswith("--beta is now --tilt-beta"), out.stderr


def test_knob_help_reaches_the_sim_cli():
    out = subprocess.run([sys.executable, "-m", "tiltlab.cli", "sim", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    assert "--lad-eta LAD_ETA LAD's temperature eta > 0" in text and "--tilt-beta TILT_BETA The tilt beta" in text
    assert "--beta" not in text.replace("--tilt-beta", "").replace("--dpo-beta", "")


#: every trainer's objective knobs and defaults, written out (the papers' values; the simulator's toy replay)
PINNED = {
    "online": {
        "lad_eta": 1.0,
        "lad_divergence": "js",
        "lad_level": "token",
        "paced_kl_coef": 1.0,
        "paced_tau": 0.5,
        "paced_pool_factor": 4,
        "paced_select_from": "learned",
        "paced_replay": True,
        "paced_replay_capacity": 128,
        "paced_replay_add": 64,
        "paced_replay_max": None,
        "paced_embeddings": "frozen_ref",
    },
    "offline": {
        "offrl_kl_tau": 0.0,
        "fpa_lam": 1.0,
        "fpa_apply_to": "all",
        "dpo_beta": 0.1,
        "rpo_alpha": 1.0,
        "kto_beta": 0.1,
        "kto_lambda_w": 1.0,
        "kto_lambda_l": 1.0,
        "apo_beta1": 0.5,
        "apo_beta2": 1e-3,
    },
    "sim": {
        "lad_eta": 1.0,
        "lad_divergence": "js",
        "paced_tau": 0.5,
        "paced_replay": False,
        "paced_replay_capacity": 32,
        "paced_replay_add": 16,
        "paced_replay_mode": "add",
        "offrl_kl_tau": 0.0,
        "fpa_lam": 1.0,
        "dpo_beta": 0.1,
    },
    "verl": {},  # the veRL plug-in takes LAD's eta and divergence as register_lad's arguments
}


@pytest.mark.parametrize("trainer", sorted(PINNED))
def test_the_declared_knobs_and_defaults_are_pinned(trainer):
    got = {o.name: o.default for o in knob_fields(trainer)}
    assert got == PINNED[trainer]
    assert all(type(got[k]) is type(v) for k, v in PINNED[trainer].items())


def test_the_simulators_rename_table_is_pinned():
    assert RENAMED_FIELDS == {
        "beta": "tilt_beta",
        "eta": "lad_eta",
        "divergence": "lad_divergence",
        "tau": "paced_tau",
        "replay": "paced_replay",
        "replay_capacity": "paced_replay_capacity",
        "replay_add": "paced_replay_add",
        "replay_mode": "paced_replay_mode",
        "fpa_lambda": "fpa_lam",
        "offline_kl_tau": "offrl_kl_tau",
    }


def test_the_common_renames_are_not_offered_where_they_do_not_apply():
    # SimConfig has no weight_eps: its refusal of 'eps' would name a knob it does not have
    with pytest.raises(TypeError, match="unexpected keyword argument 'eps'"):
        SimConfig(eps=0.1)
    with pytest.raises(TypeError, match=r"^TB: 'eps' is now weight_eps$"):
        catalog.renamed({"eps": 0.1}, "TB")
    catalog.renamed({"eps": 0.1}, "TB", common=False)


def test_the_tb_familys_knobs_and_defaults_are_pinned():
    assert {o.name: o.default for o in catalog.TB_OPTIONS} == {
        "tilt_beta": 15.0,
        "reward_scale": 1.0,
        "reward_shift": 0.0,
        "logprob_scale": None,
        "weight_clip": "max",
        "max_weight": 10.0,
        "weight_eps": 0.2,
        "weight_eps_high": None,
    }
