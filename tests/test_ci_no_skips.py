"""tests/conftest.py: under CI a skip for a missing install fails; the machine-condition skips stay skips."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CONFTEST = Path(__file__).with_name("conftest.py")

CASES = """
import pytest

pytest.importorskip("a_module_that_is_not_installed_anywhere")  # noqa
"""

TESTS = """
import pytest

def test_missing_engine():
    pytest.skip("needs vllm")

def test_machine_condition():
    pytest.skip("needs CUDA")

def test_runs():
    assert 1 + 1 == 2

@pytest.mark.xfail(reason="known", strict=True)
def test_xfail():
    assert False
"""


def _run(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text(CONFTEST.read_text())
    (tmp_path / "test_cases.py").write_text(TESTS)
    (tmp_path / "test_module_skip.py").write_text(CASES)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rA",
            "-p",
            "no:cacheprovider",
            "--continue-on-collection-errors",
            str(tmp_path),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_under_ci_a_missing_install_fails_and_a_machine_condition_skips(tmp_path):
    r = _run(tmp_path, "true")
    out = r.stdout
    assert r.returncode == 1, out
    assert "FAILED test_cases.py::test_missing_engine" in out
    assert "SKIPPED" in out and "needs CUDA" in out
    assert "PASSED test_cases.py::test_runs" in out
    assert "XFAIL test_cases.py::test_xfail" in out
    assert "ERROR test_module_skip.py" in out or "FAILED test_module_skip.py" in out  # the module-level skip
    assert "skipped under CI" in out
    assert "1 failed" in out and "1 error" in out


def test_outside_ci_skips_stay_skips(tmp_path):
    for ci in (None, "false", "0"):
        r = _run(tmp_path, ci)
        assert r.returncode == 0, r.stdout
        assert "skipped under CI" not in r.stdout
        assert "3 skipped" in r.stdout and "1 passed" in r.stdout and "1 xfailed" in r.stdout


def test_an_xdist_worker_computes_with_one_torch_thread():
    """tests/conftest.py's ``pytest_configure``: one torch thread in an xdist worker (one worker per core), the
    count left alone in a plain run."""
    import importlib.util
    from types import SimpleNamespace

    import torch

    spec = importlib.util.spec_from_file_location("suite_conftest", CONFTEST)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        mod.pytest_configure(SimpleNamespace())  # not a worker
        assert torch.get_num_threads() == 3
        mod.pytest_configure(SimpleNamespace(workerinput={"workerid": "gw0"}))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
