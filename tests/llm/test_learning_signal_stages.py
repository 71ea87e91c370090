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


N_PROMPTS = 5


@pytest.fixture(scope="module")
def rows(math_rows):
    return [{"id": r["id"], "prompt": r["prompt"]} for r in math_rows[:N_PROMPTS]]


@pytest.fixture(scope="module")
def zero_stage1(tiny_dir, rows, tmp_path_factory):
    """proposal = reference at T = 1 and every reward 0: every log-weight is log pi_ref - log q ~ 0."""
    out = tmp_path_factory.mktemp("s1_zero")
    return (out, *_stage1(tiny_dir, rows, out, paid=set()))


@pytest.fixture(scope="module")
def graded_stage1(tiny_dir, rows, tmp_path_factory):
    """Prompt i has i paid samples (0..4 of M = 4): every label differs from every other."""
    out = tmp_path_factory.mktemp("s1_graded")
    paid = {i * M + j for i in range(N_PROMPTS) for j in range(i)}
    return (out, *_stage1(tiny_dir, rows, out, paid=paid))


def test_stage1_records_equal_rewards_and_uniform_ess(zero_stage1):
    out, summary, man, vac = zero_stage1
    kinds = [f["kind"] for f in man["signal"]]
    assert kinds == ["equal_rewards", "ess_uniform"] and summary["signal_warnings"] == kinds
    scope = f"dataset ({N_PROMPTS} prompts x {M} samples)"
    assert man["signal"][0]["observed"] == {"n": N_PROMPTS * M, "value": 0.0, "scope": scope}
    assert vac == [f["message"] for f in man["signal"]]  # one warning line per recorded finding
    _, labels = load_stage1(out)
    assert min(labels.column("ess").to_pylist()) >= (1 - 1e-6) * M  # what the finding claims, read back


def test_stage1_one_differing_reward_records_nothing(tiny_dir, rows, tmp_path):
    # one paid sample (prompt 0): the dataset has signal, and prompt 0's weights differ (ESS < M)
    summary, man, vac = _stage1(tiny_dir, rows, tmp_path / "one", paid={0})
    assert man["signal"] == [] and summary["signal_warnings"] == [] and vac == []
    _, labels = load_stage1(tmp_path / "one")
    assert labels.column("ess").to_pylist()[0] < M - 0.5


def test_stage1_graded_rewards_record_nothing(graded_stage1):
    _, summary, man, vac = graded_stage1
    assert man["signal"] == [] and summary["signal_warnings"] == [] and vac == []


def test_stage1_records_collapsed_ess(tiny_dir, rows, tmp_path):
    # one paid sample per prompt at beta = 40: that sample carries each prompt's label (ESS ~ 1)
    paid = {i * M for i in range(N_PROMPTS)}
    _, man, vac = _stage1(tiny_dir, rows, tmp_path / "collapsed", paid=paid, beta=40.0, temperature=1.2)
    assert [f["kind"] for f in man["signal"]] == ["ess_collapsed"] and len(vac) == 1
    assert man["signal"][0]["observed"]["max_ess"] <= 1.05
    # the same rewards at beta = 1 leave several samples in play: nothing to record
    _, man, vac = _stage1(tiny_dir, rows, tmp_path / "beta1", paid=paid, temperature=1.2)
    assert man["signal"] == [] and vac == []


def _stage2(stage1_dir, out):
    from tiltlab.llm.stage2 import CONFIG_FILE, Stage2Config, run_stage2

    cfg = Stage2Config(labels=str(stage1_dir), out_dir=str(out), epochs=3, val_fraction=0.4, device="cpu", hidden=8)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        metrics = run_stage2(cfg, progress=False)
    vac = [str(x.message) for x in w if issubclass(x.category, VacuousRunWarning)]
    return metrics, json.loads((out / CONFIG_FILE).read_text()), vac


def test_stage2_records_constant_labels(zero_stage1, tmp_path):
    metrics, config, vac = _stage2(zero_stage1[0], tmp_path)
    assert [f["kind"] for f in config["signal"]] == ["constant_targets"] and len(vac) == 1
    assert config["signal"][0]["observed"]["what"] == "finite log_z labels"
    assert config["signal"][0]["observed"]["n"] == N_PROMPTS
    assert vac[0] == config["signal"][0]["message"] and "tiltlab llm prepare select" in vac[0]
    assert metrics["label_std"] < 1e-4  # the recorded metrics agree: labels are rounding noise around 0


def test_stage2_graded_labels_record_nothing(graded_stage1, tmp_path):
    metrics, config, vac = _stage2(graded_stage1[0], tmp_path)
    assert config["signal"] == [] and vac == []
    assert metrics["val_r2"] == metrics["val_r2"]  # defined (not NaN): the validation labels differ


def test_stage2_constant_validation_split_alone_is_recorded():
    from tiltlab.llm.stage2 import _signal_record

    y = torch.tensor([0.0, 1.0, 2.0, 2.0, 2.0])
    with pytest.warns(VacuousRunWarning, match="all 3 validation log_z labels"):
        rec = _signal_record(y, torch.tensor([2, 3, 4]), "log_z")
    assert [r["observed"]["what"] for r in rec] == ["validation log_z labels"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _signal_record(y, torch.tensor([1, 2, 3]), "log_z") == []  # one differing validation label
