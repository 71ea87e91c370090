"""Scale-out that is exercised on one CPU machine (gloo):

* **Two nodes on loopback.** Two ``accelerate launch --num_machines 2 --machine_rank {0,1}
  --main_process_ip 127.0.0.1`` launchers of one process each, for DISA (an online TB objective)
  and the offline trainer (FPA), three plain-SGD steps: both ranks end with the same parameters and
  losses, and these equal a one-process run on the same global batch (8 rows per step). DISA
  decodes greedily here (``TILTLAB_TEST_GREEDY``): with sampling each process draws from its own
  generator and one process samples other completions than two; its frozen ``log_z`` column gives
  even an all-equal group a nonzero loss.
  Tolerance: the one- and two-process runs differ only in summation order (the gradient all-reduce
  of two halves vs one sum over eight rows, and padding of a two-prompt vs a one-prompt batch), fp32
  rounding ~1e-7 relative per step; parameter deltas are ~1e-1 (DISA) and ~1e-4 (FPA), so ``atol``
  1e-6 on the parameters and ``rel`` 1e-5 on the losses would catch a missing or doubled reduction
  (off by ~the delta) by orders of magnitude.
* **A stop that keeps the work, 2 processes.** ``accelerate launch`` of ``tiltlab llm train`` gets a
  signal during optimizer step 2 of 4 (sent by rank 0's reward function): every rank stops at the
  end of step 2 with one checkpoint, holding both ranks' state, and rank 0 prints the resume line.
  By default the signal (SIGINT) goes to rank 0 alone, so rank 1 stops only through the
  all-reduced flag; ``slow``: a SIGTERM to the launcher (forwarded to both ranks), and ``--resume
  latest`` under the launcher ends bit for bit where a run without the signal ends.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.patching import patch_everywhere

pytest.importorskip("accelerate")
pytest.importorskip("trl")

ROOT = Path(__file__).resolve().parents[3]
WORKER = ROOT / "tests" / "llm" / "train" / "_accelerate_worker.py"
LAUNCH = [sys.executable, "-m", "accelerate.commands.launch"]
CPU_CONFIG = str(ROOT / "configs" / "accelerate" / "cpu_gloo_2proc.yaml")
ATOL = 1e-6  # see the module docstring


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra) -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", **extra)


def _two_nodes(script_args: list[str], env: dict, timeout: int = 600) -> None:
    """One launcher per "node" (``--machine_rank`` 0 and 1, one process each) on 127.0.0.1."""
    port = _free_port()
    procs = [
        subprocess.Popen(
            [
                *LAUNCH,
                "--config_file",
                CPU_CONFIG,
                "--num_machines",
                "2",
                "--machine_rank",
                str(rank),
                "--num_processes",
                "2",
                "--main_process_ip",
                "127.0.0.1",
                "--main_process_port",
                str(port),
                *script_args,
            ],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for rank, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"node {rank}:\n{out[-4000:]}"


@pytest.fixture(scope="module")
def untied_dir(tmp_path_factory):
    from tiltlab.llm.base.models import build_tiny

    out = tmp_path_factory.mktemp("tiny_untied")
    build_tiny(out_dir=out, seed=0, tie_word_embeddings=False)
    return out


def _run_worker(untied_dir, out: Path, trainer: str, nodes: int) -> list[dict]:
    out.mkdir()
    env = _env(PYTHONPATH=str(ROOT), TILTLAB_TEST_GREEDY="1")
    args = [str(WORKER), str(untied_dir), str(out), trainer, "ddp", "3"]
    if nodes == 1:
        res = subprocess.run([sys.executable, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stderr[-4000:]
    else:
        _two_nodes(args, env)
    return [torch.load(out / f"rank{i}.pt") for i in range(nodes)]


@pytest.mark.parametrize("trainer", ["disa", "offline"])
def test_two_nodes_on_loopback_agree_with_one_process(trainer, untied_dir, tmp_path):
    (single,) = _run_worker(untied_dir, tmp_path / "one", trainer, nodes=1)
    r0, r1 = _run_worker(untied_dir, tmp_path / "two", trainer, nodes=2)
    assert r0["world"] == r1["world"] == 2 and single["world"] == 1
    assert r0["model_type"] == "DistributedDataParallel"
    for k, v in r0["state"].items():  # the two nodes hold the same model after every step
        assert torch.equal(v, r1["state"][k]), f"nodes disagree on {k}"
    assert len(r0["losses"]) == 3 and r0["losses"] == r1["losses"]
    assert r0["losses"] == pytest.approx(single["losses"], rel=1e-5)
    deltas = {k: single["state"][k] - single["init"][k] for k in single["state"]}
    assert max(float(d.abs().max()) for d in deltas.values()) > 100 * ATOL  # the steps moved the parameters
    for k, d in deltas.items():
        torch.testing.assert_close(
            r0["state"][k] - r0["init"][k], d, rtol=0.0, atol=ATOL, msg=lambda m, k=k: f"{k}: {m}"
        )


# ---- SIGTERM to the launcher


def _stop_cfg(untied_dir, tmp_path: Path, out: Path) -> Path:
    from tests.llm.train.test_resume import SIGNAL_REWARD, _online_cfg

    (tmp_path / "tilt_signal_reward.py").write_text(SIGNAL_REWARD)
    cfg = _online_cfg(
        untied_dir,
        tmp_path,
        "flowrl",
        "tilt_signal_reward:parity_then_signal",
        per_device_train_batch_size=4,  # x 2 processes: the global batch of test_resume's runs
        save_steps=100,  # no scheduled checkpoint before the end: checkpoint-2 can only be the stop's
        ddp_backend="gloo",
    )
    import yaml

    path = tmp_path / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump({**cfg, "output_dir": str(out)}))
    return path


def _launch_train(cfg: Path, tmp_path: Path, *extra: str, **env) -> subprocess.CompletedProcess:
    cmd = [*LAUNCH, "--config_file", CPU_CONFIG, "--num_processes", "2", "--main_process_port", str(_free_port())]
    cmd += ["-m", "tiltlab.cli", "llm", "train", "--config", str(cfg), *extra]
    env = _env(PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]), **env)
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)


def _assert_stopped_at_2(run: Path, out: str, sig: str) -> None:
    lines = [ln for ln in out.splitlines() if "continue with:" in ln]
    assert len(lines) == 1, out[-4000:]  # rank 0 only
    assert f"stopped by {sig} at step 2 of 4" in lines[0] and lines[0].rstrip().endswith("(under the same launcher)")
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-2"]
    assert not (run / "model.safetensors").exists()
    # both ranks' objective state is in the checkpoint: each rank reached the save at the same step
    assert sorted(p.name for p in (run / "checkpoint-2").glob("tiltlab_state_*.pt")) == [
        "tiltlab_state_0.pt",
        "tiltlab_state_1.pt",
    ]


def test_a_signal_to_one_rank_stops_both_at_the_same_step(untied_dir, tmp_path):
    """SIGINT to rank 0 only (not through the launcher): rank 1 saw no signal and must stop at the
    same step boundary (the all-reduced flag); without that it would wait in the next step's
    collectives for a rank that has left, and fail. Everything exits 0."""
    stopped = tmp_path / "stopped"
    res = _launch_train(
        _stop_cfg(untied_dir, tmp_path, stopped), tmp_path, TILTLAB_TEST_SIGNAL="SIGINT", TILTLAB_TEST_SIGNAL_AT="2"
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert out.count("SIGINT received: stopping at the end of this optimizer step") == 1  # rank 0 alone
    _assert_stopped_at_2(stopped, out, "SIGINT")


@pytest.mark.slow
def test_sigterm_to_the_launcher_stops_every_rank_and_resumes_bit_identically(untied_dir, tmp_path):
    from safetensors.torch import load_file

    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    res = _launch_train(_stop_cfg(untied_dir, tmp_path, straight), tmp_path)
    assert res.returncode == 0, res.stderr[-4000:]
    cfg = _stop_cfg(untied_dir, tmp_path, stopped)
    res = _launch_train(
        cfg, tmp_path, TILTLAB_TEST_SIGNAL="SIGTERM", TILTLAB_TEST_SIGNAL_AT="2", TILTLAB_TEST_SIGNAL_PARENT="1"
    )
    out = res.stdout + res.stderr
    # torchrun's agent forwards the signal to the ranks, waits for them, then re-raises it: the
    # launcher's own status is 1 (SignalException); each rank's is 0 and the agent saw no failure
    assert "Received 15 death signal" in out, out[-4000:]
    assert "ChildFailedError" not in out and "Traceback" not in out.split("Received 15 death signal")[0]
    assert out.count("SIGTERM received: stopping at the end of this optimizer step") == 2  # both ranks
    _assert_stopped_at_2(stopped, out, "SIGTERM")
    res = _launch_train(cfg, tmp_path, "--resume", "latest")
    assert res.returncode == 0, res.stderr[-4000:]
    assert "resuming from " + str(stopped / "checkpoint-2") in res.stdout
    a, b = (load_file(str(d / "model.safetensors")) for d in (straight, stopped))
    assert any(k.startswith("log_z_head.") for k in a) and a.keys() == b.keys()
    assert not [k for k in a if not torch.equal(a[k], b[k])]
    la, lb = (
        {
            h["step"]: h["loss"]
            for h in json.loads((d / "checkpoint-4" / "trainer_state.json").read_text())["log_history"]
            if "loss" in h
        }
        for d in (straight, stopped)
    )
    assert sorted(la) == [1, 2, 3, 4] and la == lb


def test_the_stop_flag_is_reduced_on_the_processs_device(monkeypatch):
    """Under several processes the stop flag is all-reduced from the device accelerate gives this process (NCCL
    reduces only accelerator tensors): a device other than the CPU default, so that dropping it would show;
    one process (or no process group) reduces nothing."""
    import types

    import accelerate.state
    import torch.distributed as dist

    from tiltlab.llm.train import stop as stop_mod

    class Reduced(Exception):
        pass

    seen = []

    def all_reduce(t, op):
        seen.append((t.device.type, t.shape, op))
        raise Reduced

    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    patch_everywhere(
        monkeypatch, accelerate.state, "PartialState", lambda: types.SimpleNamespace(device=torch.device("meta"))
    )
    cb = stop_mod.GracefulStop(signals=())
    with pytest.raises(Reduced):
        cb._any_rank_signalled()
    assert seen == [("meta", torch.Size([1]), dist.ReduceOp.MAX)]
    monkeypatch.setattr(dist, "get_world_size", lambda: 1)
    assert cb._any_rank_signalled() is False and len(seen) == 1
