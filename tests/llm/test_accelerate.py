"""Two CPU processes (gloo) under `accelerate launch`: the online trainer runs two steps and both
ranks end with identical parameters (DDP all-reduced the same gradients), which also changed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("accelerate")
pytest.importorskip("trl")

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("objective", ["flowrl"])
def test_two_process_ranks_agree(objective, tiny_dir, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(ROOT / "configs" / "accelerate" / "cpu_gloo_2proc.yaml"),
        "--num_processes",
        "2",
        "--main_process_port",
        "29517",
        str(ROOT / "tests" / "llm" / "_accelerate_worker.py"),
        str(tiny_dir),
        str(tmp_path),
        objective,
    ]
    res = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-4000:]
    r0, r1 = (torch.load(tmp_path / f"rank{i}.pt") for i in (0, 1))
    assert r0["world"] == r1["world"] == 2
    assert r0["changed"] == len(r0["state"]) > 0  # every parameter (incl. the log Z head) moved
    assert any("log_z_head" in k for k in r0["state"])
    for k, v in r0["state"].items():
        assert torch.equal(v, r1["state"][k]), f"ranks disagree on {k}"
    assert len(r0["losses"]) == 2 and all(torch.isfinite(torch.tensor(x)) for x in r0["losses"])
