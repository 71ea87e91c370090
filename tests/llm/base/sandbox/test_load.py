"""Correct programs are paid on a machine loaded with 4 CPU-bound processes per core.

The sandbox's time limit counts wall time less the time the run's processes waited for a CPU
(``SandboxConfig.timeout_s``), and the CPU limits are CPU time; so a correct program is not cut
off because other work starves it. Every correct control of the hostile corpus and the idioms
corpus, plus a batch of plain function tasks and of the ThreadPoolExecutor program that used to
time out under load, must be paid 1.0 while the load runs. No wall-clock assertion.
"""

import importlib.util
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

if not sys.platform.startswith("linux"):
    pytest.skip("the sandbox targets Linux", allow_module_level=True)

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::tiltlab.llm.base.sandbox.SandboxWarning")]

THREADPOOL = (
    "from concurrent.futures import ThreadPoolExecutor\n"
    "def f(x):\n    with ThreadPoolExecutor(max_workers=8) as ex:\n        return sum(ex.map(lambda v: v, [x, x]))\n"
)


def _corpus():
    spec = importlib.util.spec_from_file_location(
        "tiltlab_hostile_corpus", Path(__file__).resolve().parents[1] / "hostile" / "corpus.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_correct_programs_are_paid_under_4x_cpu_load():
    from tiltlab.llm.base.rewards import resolve_reward
    from tiltlab.llm.base.tasks import function_tasks

    corpus = _corpus()
    rows = [r for r in corpus.cases("/nonexistent", 1, "/nonexistent") if r["expected"] == 1.0]
    rows += [corpus._row(r, {}) for r in corpus.idioms()]
    rows += [
        {
            "completion": t["solution"],
            "tests": t["tests"],
            "test_type": "assert",
            "entry_point": "f",
            "code_prefix": None,
        }
        for t in function_tasks(16, seed=3)
    ]
    rows += [
        {
            "completion": THREADPOOL,
            "tests": corpus.TESTS,
            "test_type": "assert",
            "entry_point": "f",
            "code_prefix": None,
        }
    ] * 16
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True:\n    pass"], stdout=subprocess.DEVNULL)
        for _ in range(4 * (os.cpu_count() or 1))
    ]
    try:
        fn = resolve_reward("code")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = fn(
                None,
                [r["completion"] for r in rows],
                tests=[r["tests"] for r in rows],
                test_type=[r["test_type"] for r in rows],
                entry_point=[r["entry_point"] for r in rows],
                code_prefix=[r["code_prefix"] for r in rows],
            )
        results = list(fn.last_results)
    finally:
        for h in hogs:
            h.kill()
        for h in hogs:
            h.wait()
    failed = [
        (r.get("name", "task"), res.status, res.judge_stderr[-200:])
        for r, g, res in zip(rows, got, results)
        if g != 1.0
    ]
    assert failed == []
    assert len(rows) >= 60
