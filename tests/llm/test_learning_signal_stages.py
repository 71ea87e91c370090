"""The vacuous-run guard where it runs: Stage 1's manifest, Stage 2's regressor.json and the
trainers' ``signal.json`` record (and warn about) a run without signal, and record nothing when
one reward differs."""

from __future__ import annotations

import json
import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("pyarrow")

from tiltlab.llm.learning_signal import VacuousRunWarning  # noqa: E402
from tiltlab.llm.stage1 import MANIFEST, Stage1Config, load_stage1, run_stage1  # noqa: E402

pytestmark = pytest.mark.llm

M = 4


def _positional_reward(paid):
    """A TRL-signature reward paying 1 to the completions at the flat positions in ``paid``."""

    def reward(prompts, completions, completion_ids=None, **kwargs):
        return [1.0 if i in paid else 0.0 for i in range(len(completions))]

    reward.__qualname__ = f"paid_{sorted(paid)}"
    return reward


def _stage1(tiny_dir, rows, out, paid, **kw):
    cfg = Stage1Config(
        proposal=str(tiny_dir),
        reference=str(tiny_dir),
        dataset="inline",
        out_dir=str(out),
        M=M,
        max_new_tokens=3,
        seed=3,
        device="cpu",
        **kw,
    )
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        summary = run_stage1(cfg, rows=rows, reward_fn=_positional_reward(paid), progress=False)
    vac = [str(x.message) for x in w if issubclass(x.category, VacuousRunWarning)]
    return summary, json.loads((out / MANIFEST).read_text()), vac


@pytest.fixture(scope="module")
def rows(math_rows):
    return [{"id": r["id"], "prompt": r["prompt"]} for r in math_rows[:3]]


def test_stage1_records_equal_rewards_and_uniform_ess(tiny_dir, rows, tmp_path):
    # proposal = reference at T = 1 and every reward 0: every log-weight is log pi_ref - log q ~ 0
    summary, man, vac = _stage1(tiny_dir, rows, tmp_path / "zero", paid=set())
    kinds = [f["kind"] for f in man["signal"]]
    assert kinds == ["equal_rewards", "ess_uniform"] and summary["signal_warnings"] == kinds
    assert man["signal"][0]["observed"] == {"n": 3 * M, "value": 0.0, "scope": f"dataset (3 prompts x {M} samples)"}
    assert vac == [f["message"] for f in man["signal"]]  # one warning line per recorded finding
    _, labels = load_stage1(tmp_path / "zero")
    assert min(labels.column("ess").to_pylist()) >= (1 - 1e-6) * M  # what the finding claims, read back


def test_stage1_one_differing_reward_records_nothing(tiny_dir, rows, tmp_path):
    # one paid sample (prompt 0): the dataset has signal, and prompt 0's weights differ (ESS < M)
    summary, man, vac = _stage1(tiny_dir, rows, tmp_path / "one", paid={0})
    assert man["signal"] == [] and summary["signal_warnings"] == [] and vac == []
    _, labels = load_stage1(tmp_path / "one")
    assert labels.column("ess").to_pylist()[0] < M - 0.5


def test_stage1_records_collapsed_ess(tiny_dir, rows, tmp_path):
    # one paid sample per prompt at beta = 40: that sample carries each prompt's label (ESS ~ 1)
    _, man, vac = _stage1(tiny_dir, rows, tmp_path / "collapsed", paid={0, M, 2 * M}, beta=40.0, temperature=1.2)
    assert [f["kind"] for f in man["signal"]] == ["ess_collapsed"] and len(vac) == 1
    assert man["signal"][0]["observed"]["max_ess"] <= 1.05
    # the same rewards at beta = 1 leave several samples in play: nothing to record
    _, man, vac = _stage1(tiny_dir, rows, tmp_path / "beta1", paid={0, M, 2 * M}, temperature=1.2)
    assert man["signal"] == [] and vac == []
