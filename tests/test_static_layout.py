"""Static tools read the checkout itself: ``tiltlab/<pkg>`` is a relative symlink to the top-level
folder ``<pkg>/`` (the same mapping as setuptools' ``package-dir``), so import-linter, mypy and an
editor's pyright follow ``from tiltlab.objectives import tb`` without an installed copy.

The tools are run on the plain checkout (``PYTHONPATH`` = the repository root, which comes before
any installed ``tiltlab``); each run also shows it read the checkout's files. With ``CI=true`` a
missing tool fails the test instead of skipping it (``.ci/run`` installs them with the ``dev`` extra).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _require(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{module} is not installed (the [dev] extra); CI must run this test")
        pytest.skip(f"{module} is not installed (pip install -e '.[dev]')")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT)
    env.pop("MYPYPATH", None)
    return env


def test_each_subpackage_is_a_relative_symlink_matching_package_dir():
    mapping = PYPROJECT["tool"]["setuptools"]["package-dir"]
    subs = {k.split(".", 1)[1]: v for k, v in mapping.items() if k.startswith("tiltlab.")}
    assert subs, "package-dir maps no tiltlab subpackage"
    for name, folder in subs.items():
        link = ROOT / "tiltlab" / name
        assert link.is_symlink(), f"tiltlab/{name} is not a symlink"
        # relative, so a clone anywhere resolves it
        assert os.readlink(link) == f"../{folder}", (name, os.readlink(link))
        assert link.resolve() == (ROOT / folder).resolve()
    # every listed package is a folder with an __init__.py when read through tiltlab/
    for pkg in PYPROJECT["tool"]["setuptools"]["packages"]:
        init = ROOT.joinpath(*pkg.split(".")) / "__init__.py"
        assert init.is_file(), f"{pkg}: {init.relative_to(ROOT)} is missing"
    # and no other entry of tiltlab/ is a link (a stale link would shadow nothing, silently)
    links = {p.name for p in (ROOT / "tiltlab").iterdir() if p.is_symlink()}
    assert links == set(subs)


def test_git_stores_the_links_as_symlinks():
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout")
    out = subprocess.run(
        ["git", "ls-files", "-s", "--", "tiltlab"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    modes = {line.split("\t")[1]: line.split()[0] for line in out.splitlines()}
    names = PYPROJECT["tool"]["setuptools"]["package-dir"]
    for key in names:
        if key.startswith("tiltlab."):
            path = "tiltlab/" + key.split(".", 1)[1]
            assert modes.get(path) == "120000", f"{path} is not committed as a symlink ({modes.get(path)})"


def test_the_checkout_resolves_tiltlab_before_any_installed_copy():
    code = "import importlib.util as u; print(u.find_spec('tiltlab').origin); print(u.find_spec('tiltlab.objectives').origin)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=_env(), capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == [str(ROOT / "tiltlab" / "__init__.py"), str(ROOT / "tiltlab" / "objectives" / "__init__.py")]


def test_import_linter_passes_on_the_checkout():
    _require("importlinter")
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())",
            "--no-cache",
            "--config",
            str(ROOT / "pyproject.toml"),
        ],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    n = len(PYPROJECT["tool"]["importlinter"]["contracts"])
    assert f"Contracts: {n} kept, 0 broken." in run.stdout, run.stdout[-2000:]


def _mypy(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mypy", "-v", *args], cwd=ROOT, env=_env(), capture_output=True, text=True
    )


def _checked_sources(run: subprocess.CompletedProcess) -> list[str]:
    """The files mypy checked (``-v`` logs one ``Found source: BuildSource(path=...)`` per file)."""
    return [ln.split("path='", 1)[1].split("'", 1)[0] for ln in run.stderr.splitlines() if "Found source:" in ln]


def test_mypy_reads_the_checkout_with_no_site_packages(tmp_path):
    """mypy with site-packages switched off (no installed tiltlab can be read, and no torch: its
    imports are let through; python 3.11, pyproject's requires-python: ``typing.Unpack``) resolves every
    ``tiltlab.objectives`` import from the checkout."""
    _require("mypy")
    config = tmp_path / "mypy.toml"
    config.write_text(
        '[tool.mypy]\npython_version = "3.11"\nno_site_packages = true\n\n'
        '[[tool.mypy.overrides]]\nmodule = ["torch", "torch.*"]\nignore_missing_imports = true\n'
    )
    run = _mypy(["--config-file", str(config), "--cache-dir", str(tmp_path / "cache"), "-p", "tiltlab.objectives"])
    assert run.returncode == 0, run.stdout[-3000:]
    n_files = len(list((ROOT / "objectives").glob("*.py")))
    assert run.stdout.strip() == f"Success: no issues found in {n_files} source files", run.stdout[-2000:]
    sources = _checked_sources(run)
    assert len(sources) == n_files and all(p.startswith(f"{ROOT / 'tiltlab' / 'objectives'}/") for p in sources)


@pytest.mark.slow
def test_mypy_strict_passes_on_the_checkout():
    """What .ci/lint runs: ``mypy --strict -p tiltlab.objectives`` on the checkout (torch's stubs make
    a cold run ~1 min on 2 loaded cores; the cache under build/ is the one .ci/lint fills)."""
    _require("mypy")
    cache = ROOT / "build" / "mypy_cache"
    args = ["--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(cache), "--strict"]
    run = _mypy([*args, "-p", "tiltlab.objectives"])
    assert run.returncode == 0, run.stdout[-3000:]
    assert run.stdout.startswith("Success: no issues found"), run.stdout[-2000:]
    assert all(p.startswith(f"{ROOT / 'tiltlab' / 'objectives'}/") for p in _checked_sources(run))


def test_pyright_follows_the_layout():
    """An editor's view: pyright resolves ``tiltlab.objectives`` / ``tiltlab.sim`` in the checkout."""
    beside = Path(sys.executable).with_name("pyright")
    exe = shutil.which("pyright") or (str(beside) if beside.exists() else None)
    if exe is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("pyright is not installed (the [dev] extra); CI must run this test")
        pytest.skip("pyright is not installed (pip install -e '.[dev]')")
    probe = ROOT / "build" / "pyright_probe.py"  # build/ is git-ignored
    probe.parent.mkdir(exist_ok=True)
    probe.write_text(
        "from tiltlab.objectives import tb\nfrom tiltlab.sim import api\n\n"
        "reveal_type(tb.sequence_logprob)\nreveal_type(api)\n"
    )
    run = subprocess.run(
        [exe, "--pythonpath", sys.executable, str(probe)], cwd=ROOT, env=_env(), capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout[-3000:]
    assert '"tb.sequence_logprob" is "(token_logp: Tensor' in run.stdout, run.stdout[-2000:]
    assert 'Module("tiltlab.sim.api")' in run.stdout, run.stdout[-2000:]


@pytest.mark.slow
def test_wheel_holds_plain_files_and_works_alone(tmp_path):
    """``pip wheel .`` (what ``pip install .`` installs) builds from package-dir: every module and data
    file of every package as a plain file (no symlink), and the unpacked wheel imports and finds its
    claims with the checkout out of sight. Slow: pip builds in an isolated environment."""
    import zipfile

    # a clean copy (links kept as links): an in-tree build would reuse a stale build/lib
    src = tmp_path / "src"
    skip = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "results", "runs")
    shutil.copytree(ROOT, src, symlinks=True, ignore=skip)
    run = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(src)],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    (wheel,) = tmp_path.glob("tiltlab-*.whl")
    with zipfile.ZipFile(wheel) as z:
        infos = z.infolist()
        z.extractall(tmp_path / "site")
    names = {i.filename for i in infos}
    assert not [i.filename for i in infos if (i.external_attr >> 16) & 0o170000 == 0o120000], "symlink in the wheel"
    expected = set()
    for pkg in PYPROJECT["tool"]["setuptools"]["packages"]:
        folder = ROOT.joinpath(*pkg.split("."))
        expected |= {f"{pkg.replace('.', '/')}/{p.name}" for p in folder.glob("*.py")}
    expected |= {f"tiltlab/paper_checks/claims/{p.name}" for p in (ROOT / "paper_checks" / "claims").glob("*.toml")}
    assert expected - names == set()
    code = (
        "import tiltlab.objectives.tb, tiltlab.sim.api, tiltlab.claims.registry as r\n"
        "print(tiltlab.objectives.tb.__file__); r.load_claims(); print(len(r.claims()))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"))
    out = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(tmp_path / 'site')!r}); exec({code!r})"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    path, n_claims = out.stdout.split()
    assert path == str(tmp_path / "site" / "tiltlab" / "objectives" / "tb.py") and int(n_claims) > 0


def _architecture_layers() -> list[list[str]]:
    """The layer block of docs/architecture.md ("## Layers"): one layer per line, top first, modules split
    on ``|``; a line's parenthesised comment and comment-only lines are not part of it."""
    import re

    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = text.split("## Layers", 1)[1].split("```", 2)[1]
    layers = []
    for line in block.splitlines():
        line = re.sub(r"\(.*?\)", "", line).strip()
        if line:
            layers.append(sorted(m.strip() for m in line.split("|")))
    return layers


def test_docs_architecture_states_the_import_linter_layers():
    main = next(c for c in PYPROJECT["tool"]["importlinter"]["contracts"] if c["name"] == "tiltlab layers")
    want = [sorted(m.strip() for m in layer.split("|")) for layer in main["layers"]]
    assert _architecture_layers() == want


def test_docs_architecture_states_the_llm_stage_layers():
    """docs/architecture.md's "The LLM layer by stage" block is the llm contract's layer list, in order."""
    import re

    contract = next(
        c for c in PYPROJECT["tool"]["importlinter"]["contracts"] if c["name"] == "tiltlab.llm layers (by stage)"
    )
    assert contract["containers"] == ["tiltlab.llm"]
    want = [sorted(m.strip() for m in layer.split("|")) for layer in contract["layers"]]
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = text.split("## The LLM layer by stage", 1)[1].split("```", 2)[1]
    got = [sorted(m.strip() for m in re.sub(r"\(.*?\)", "", ln).split("|")) for ln in block.splitlines() if ln.strip()]
    assert got == want
    # every folder of llm/ that is a package is one of the layers (a new folder must be placed)
    folders = {p.name for p in (ROOT / "llm").iterdir() if (p / "__init__.py").is_file()}
    assert folders == {m for layer in want for m in layer} - {"cli"}
