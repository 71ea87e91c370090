"""`tiltlab llm train --resume`: N steps straight == N/2 steps + resume for N/2, bit for bit (final
parameters with torch.equal, logged losses), for every online objective and the offline trainer;
the objective's own state (PACED's replay buffer and RNG, TRL's buffered generation batch) travels
in the checkpoint; the learned log Z head is seeded."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

pytest.importorskip("trl")

from tiltlab.cli import main
from tiltlab.objectives.catalog import names

REWARD = "def parity(prompts, completions, completion_ids, **kw):\n    return [float(sum(ids) % 2 == 0) for ids in completion_ids]\n"


@pytest.fixture
def reward_module(tmp_path, monkeypatch):
    """A prompt-independent reward with signal for every loss (the math reward is 0 on the tiny model)."""
    (tmp_path / "tilt_resume_reward.py").write_text(REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "tilt_resume_reward:parity"


def _online_cfg(tiny_dir, tmp_path, objective, reward, **trl):
    rows = [{"prompt": f"Compute {i} + {i + 1}.", "answer": str(2 * i + 1), "log_z": 0.1 * i} for i in range(12)]
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = {
        "kind": "online",
        "objective": objective,
        "model": str(tiny_dir),
        "dataset": str(data),
        "reward": reward,
        "trl": {
            "per_device_train_batch_size": 8,
            "num_generations": 4,
            "max_completion_length": 6,
            "max_steps": 4,
            "learning_rate": 1e-2,
            "logging_steps": 1,
            "save_strategy": "steps",
            "save_steps": 2,
            "use_cpu": True,
            "report_to": "none",
            "disable_tqdm": True,
            "seed": 0,
            **trl,
        },
    }
    if objective == "cispo":  # CISPO's ratio cap has no usable default (TiltGRPOConfig refuses none)
        cfg["trl"]["epsilon_high"] = 5.0
    if objective == "disa":  # the dataset's log_z column stands in for the Stage-2 predictor
        cfg["tilt_beta"] = 2.0
        cfg["disa"] = {"reward_scale": 1.0}
        cfg["trl"]["disa_stage1_manifest"] = {"tilt_beta": 2.0, "reward_transform": "identity", "logprob_scale": "sum"}
    return cfg


def _offline_cfg(tiny_dir, tmp_path, objective):
    rows = []
    for i in range(4):
        for c, r in ((f"\\boxed{{{2 * i + 1}}}", 1.0), (f"\\boxed{{{2 * i}}}", 0.0)):
            rows.append({"prompt": f"Compute {i} + {i + 1}.", "completion": c, "reward": r})
    data = tmp_path / "offline.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {
        "kind": "offline",
        "objective": objective,
        "model": str(tiny_dir),
        "dataset": str(data),
        "trl": {
            "per_device_train_batch_size": 2,
            "max_steps": 4,
            "learning_rate": 1e-3,
            "logging_steps": 1,
            "save_strategy": "steps",
            "save_steps": 2,
            "use_cpu": True,
            "report_to": "none",
            "disable_tqdm": True,
            "seed": 0,
        },
    }


def _train(tmp_path, cfg: dict, out, *extra) -> None:
    import yaml

    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({**cfg, "output_dir": str(out)}))
    assert main(["llm", "train", "--config", str(path), *extra]) == 0


def _params(run_dir) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "model.safetensors"))


def _losses(ckpt) -> dict:
    hist = json.loads((ckpt / "trainer_state.json").read_text())["log_history"]
    return {h["step"]: h["loss"] for h in hist if "loss" in h}


def _assert_resume_identical(tmp_path, cfg, resume_at: int, *resume_args):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    _train(tmp_path, cfg, straight)
    resumed.mkdir()
    shutil.copytree(straight / f"checkpoint-{resume_at}", resumed / f"checkpoint-{resume_at}")
    _train(tmp_path, cfg, resumed, *(resume_args or ("--resume",)))
    a, b = _params(straight), _params(resumed)
    assert a.keys() == b.keys()
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f"parameters differ after resume: {differ[:5]}"
    la, lb = _losses(straight / "checkpoint-4"), _losses(resumed / "checkpoint-4")
    assert sorted(la) == sorted(lb) == [1, 2, 3, 4]
    assert la == lb
    if cfg.get("objective") == "paced":  # Z_phi (frozen_ref) lives outside the policy, in tiltlab's state
        ha, hb = (
            torch.load(d / "checkpoint-4" / "tiltlab_state_0.pt", weights_only=True)["paced"]["head"]
            for d in (straight, resumed)
        )
        assert ha.keys() == hb.keys() and len(ha) > 0
        assert all(torch.equal(ha[k], hb[k]) for k in ha), "PACED's Z_phi differs after resume"
    return a


#: TRL's other loss types hold no state of their own (no log Z head, no replay buffer): they resume through
#: the same path as grpo; cispo stands for the four (each one's loss is tested against TRL's trainer loss in
#: tests/llm/train/test_trainer_loss_types.py), which keeps four more real training runs out of the default test run
RESUMED = [o for o in names("online") if o not in ("sapo", "luspo", "vespo")]


@pytest.mark.parametrize("objective", RESUMED)
def test_online_resume_is_bit_identical(objective, tiny_dir, tmp_path, reward_module):
    params = _assert_resume_identical(tmp_path, _online_cfg(tiny_dir, tmp_path, objective, reward_module), 2)
    if objective == "flowrl":
        assert any(k.startswith("log_z_head.") for k in params)  # the head is saved and compared too
    if objective == "paced":  # PACED's Z_phi is an MLP on frozen pi_ref embeddings, not on the policy
        assert not any(k.startswith("log_z_head.") for k in params)


def test_paced_checkpoint_holds_replay_buffer_and_rng(tiny_dir, tmp_path, reward_module):
    cfg = _online_cfg(tiny_dir, tmp_path, "paced", reward_module, max_steps=2)
    _train(tmp_path, cfg, tmp_path / "run")
    state = torch.load(tmp_path / "run" / "checkpoint-2" / "tiltlab_state_0.pt", weights_only=True)
    assert len(state["paced"]["replay"]["items"]) > 0  # correct samples were buffered at steps 1-2
    assert state["paced"]["rng"][0] == 3  # random.Random.getstate() version tag


def test_resume_between_two_generations(tiny_dir, tmp_path, reward_module):
    """steps_per_generation=2: checkpoint-1 lies inside a generation; the resumed run reuses the
    buffered generation batch instead of sampling a new one. Resumes from an explicit DIR."""
    cfg = _online_cfg(tiny_dir, tmp_path, "grpo", reward_module, steps_per_generation=2, save_steps=1)
    _assert_resume_identical(tmp_path, cfg, 1, "--resume", str(tmp_path / "resumed" / "checkpoint-1"))


def test_trl_resume_from_checkpoint_is_honoured(tiny_dir, tmp_path, reward_module):
    """`--set trl.resume_from_checkpoint=latest` resumes like --resume (transformers never reads the field)."""
    cfg = _online_cfg(tiny_dir, tmp_path, "flowrl", reward_module)
    _assert_resume_identical(tmp_path, cfg, 2, "--set", "trl.resume_from_checkpoint=latest")


def test_resume_without_checkpoint_is_a_clear_error(tiny_dir, tmp_path, reward_module, capsys):
    import yaml

    path = tmp_path / "run.yaml"
    path.write_text(
        yaml.safe_dump({**_online_cfg(tiny_dir, tmp_path, "grpo", reward_module), "output_dir": str(tmp_path)})
    )
    assert main(["llm", "train", "--config", str(path), "--resume"]) == 2
    assert "no checkpoint-N directory" in capsys.readouterr().err
    assert main(["llm", "train", "--config", str(path), "--resume", str(tmp_path / "nowhere")]) == 2
    assert "is not a directory" in capsys.readouterr().err


@pytest.mark.parametrize("objective", ["offrl", "fpa", "dpo"])
def test_offline_resume_is_bit_identical(objective, tiny_dir, tmp_path):
    _assert_resume_identical(tmp_path, _offline_cfg(tiny_dir, tmp_path, objective), 2)


@pytest.mark.parametrize("objective", ["flowrl", "paced"])
def test_log_z_head_is_seeded(objective, tiny_dir, tmp_path):
    """Two trainers with the same seed get the same log Z head, whatever the global RNG held before."""
    from datasets import Dataset

    from tiltlab.llm.base.models import load_tokenizer
    from tiltlab.llm.disa.logz_head import get_log_z_head
    from tiltlab.llm.train.online import TiltGRPOConfig, TiltGRPOTrainer

    heads = []
    for prior in (1, 2):
        torch.manual_seed(prior)
        args = TiltGRPOConfig(
            output_dir=str(tmp_path / str(prior)),
            objective=objective,
            per_device_train_batch_size=4,
            num_generations=4,
            max_completion_length=4,
            use_cpu=True,
            report_to="none",
            seed=0,
        )
        tr = TiltGRPOTrainer(
            model=str(tiny_dir),
            reward_funcs=lambda completions, **kw: [0.0] * len(completions),
            args=args,
            train_dataset=Dataset.from_list([{"prompt": "1 + 1 ="}] * 4),
            processing_class=load_tokenizer(tiny_dir),
        )
        head = get_log_z_head(tr.model) if objective == "flowrl" else tr._paced_head  # PACED: Z_phi MLP
        heads.append({k: v.detach().clone() for k, v in head.state_dict().items()})
    assert heads[0].keys() == heads[1].keys()
    assert all(torch.equal(heads[0][k], heads[1][k]) for k in heads[0])


# ---- a stop that keeps the work: SIGTERM / SIGINT -> checkpoint at the step boundary -> --resume latest

SIGNAL_REWARD = (
    REWARD
    + '''

def parity_then_signal(prompts, completions, completion_ids, trainer_state=None, **kw):
    """The parity reward; during optimizer step TILTLAB_TEST_SIGNAL_AT, rank 0 sends TILTLAB_TEST_SIGNAL to
    itself, or to its launcher (the parent process) with TILTLAB_TEST_SIGNAL_PARENT=1."""
    import os
    import signal

    at = int(os.environ.get("TILTLAB_TEST_SIGNAL_AT", "0"))
    if at and trainer_state.global_step == at - 1 and os.environ.get("RANK", "0") == "0":
        to = os.getppid() if os.environ.get("TILTLAB_TEST_SIGNAL_PARENT") == "1" else os.getpid()
        os.kill(to, getattr(signal, os.environ["TILTLAB_TEST_SIGNAL"]))
    return parity(prompts, completions, completion_ids)
'''
)


@pytest.fixture
def signal_reward(tmp_path, monkeypatch):
    (tmp_path / "tilt_signal_reward.py").write_text(SIGNAL_REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "tilt_signal_reward:parity_then_signal"


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_signal_stops_with_a_checkpoint_that_resumes_bit_identically(
    sig, tiny_dir, tmp_path, signal_reward, monkeypatch, capsys
):
    """A signal during step 3 of 4: exit 0 at the end of step 3 with checkpoint-3 (not a multiple of
    save_steps=2, so it is the stop's), no final model, one line naming the resume command; `--resume
    latest` from it ends where a run without the signal ends, bit for bit (FlowRL: the log Z head too)."""
    import signal

    cfg = _online_cfg(tiny_dir, tmp_path, "flowrl", signal_reward)
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    _train(tmp_path, cfg, straight)
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    monkeypatch.setenv("TILTLAB_TEST_SIGNAL", sig)
    monkeypatch.setenv("TILTLAB_TEST_SIGNAL_AT", "3")
    capsys.readouterr()
    _train(tmp_path, cfg, stopped, "--set", "trl.logging_steps=1")  # an override the resume line must repeat
    out = capsys.readouterr().out
    assert {s: signal.getsignal(s) for s in before} == before  # the handlers are put back
    assert sorted(p.name for p in stopped.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-3"]
    assert not (stopped / "model.safetensors").exists()  # an unfinished run writes no final model
    lines = [ln for ln in out.splitlines() if "continue with:" in ln]
    assert len(lines) == 1, out[-2000:]
    assert f"stopped by {sig} at step 3 of 4" in lines[0]
    assert lines[0].endswith("--set trl.logging_steps=1 --resume latest") and str(stopped / "checkpoint-3") in lines[0]
    monkeypatch.delenv("TILTLAB_TEST_SIGNAL_AT")
    _train(tmp_path, cfg, stopped, "--resume", "latest")
    assert "resuming from " + str(stopped / "checkpoint-3") in capsys.readouterr().out
    a, b = _params(straight), _params(stopped)
    assert any(k.startswith("log_z_head.") for k in a)
    assert a.keys() == b.keys()
    assert not [k for k in a if not torch.equal(a[k], b[k])]
    assert _losses(straight / "checkpoint-4") == _losses(stopped / "checkpoint-4")


def test_stop_callback_stops_every_rank_when_any_rank_was_signalled(monkeypatch):
    """The flag is OR-ed over ranks: a rank that saw no signal stops with the one that did (the
    all-reduce is replaced by a stub giving the other rank's flag)."""
    from transformers import TrainerControl, TrainerState

    from tiltlab.llm.train import stop as stop_mod

    cb = stop_mod.GracefulStop(signals=())
    state, control = TrainerState(), TrainerControl()
    state.global_step = 5
    monkeypatch.setattr(stop_mod.GracefulStop, "_any_rank_signalled", lambda self: False)
    cb.on_step_end(None, state, control)
    assert not control.should_save and not control.should_training_stop and cb.stopped_by is None
    monkeypatch.setattr(stop_mod.GracefulStop, "_any_rank_signalled", lambda self: True)
    cb.on_step_end(None, state, control)
    assert control.should_save and control.should_training_stop
    assert cb.stopped_at == 5 and cb.stopped_by == "a signal on another rank"


def test_a_signal_in_the_last_step_finishes_the_run(tiny_dir, tmp_path, signal_reward, monkeypatch, capsys):
    """Stopped at the last step, the run is complete: the final model is written as without the
    signal, and no resume line is printed."""
    cfg = _online_cfg(tiny_dir, tmp_path, "grpo", signal_reward, max_steps=2, save_strategy="no")
    monkeypatch.setenv("TILTLAB_TEST_SIGNAL", "SIGTERM")
    monkeypatch.setenv("TILTLAB_TEST_SIGNAL_AT", "2")
    capsys.readouterr()
    _train(tmp_path, cfg, tmp_path / "run")
    out = capsys.readouterr().out
    assert "continue with:" not in out and "2 optimizer steps; model written" in out
    assert (tmp_path / "run" / "model.safetensors").exists()
    assert [p.name for p in (tmp_path / "run").glob("checkpoint-*")] == ["checkpoint-2"]  # the stop's checkpoint
