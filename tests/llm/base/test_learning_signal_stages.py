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

from tiltlab.llm.base.learning_signal import VacuousRunWarning  # noqa: E402
from tiltlab.llm.disa.stage1 import MANIFEST, Stage1Config, load_stage1, run_stage1  # noqa: E402

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
    assert all(x.filename == __file__ for x in w if issubclass(x.category, VacuousRunWarning))  # at the caller
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
    _, man, vac = _stage1(tiny_dir, rows, tmp_path / "collapsed", paid=paid, tilt_beta=40.0, temperature=1.2)
    assert [f["kind"] for f in man["signal"]] == ["ess_collapsed"] and len(vac) == 1
    assert man["signal"][0]["observed"]["max_ess"] <= 1.05
    # the same rewards at beta = 1 leave several samples in play: nothing to record
    _, man, vac = _stage1(tiny_dir, rows, tmp_path / "beta1", paid=paid, temperature=1.2)
    assert man["signal"] == [] and vac == []


def _stage2(stage1_dir, out):
    from tiltlab.llm.disa.stage2.config import CONFIG_FILE, Stage2Config
    from tiltlab.llm.disa.stage2.run import run_stage2

    cfg = Stage2Config(labels=str(stage1_dir), out_dir=str(out), epochs=3, val_fraction=0.4, device="cpu", hidden=8)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        metrics = run_stage2(cfg, progress=False)
    vac = [str(x.message) for x in w if issubclass(x.category, VacuousRunWarning)]
    assert all(x.filename == __file__ for x in w if issubclass(x.category, VacuousRunWarning))  # at the caller
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
    from tiltlab.llm.disa.stage2.run import _signal_record

    y = torch.tensor([0.0, 1.0, 2.0, 2.0, 2.0])
    with pytest.warns(VacuousRunWarning, match="all 3 validation log_z labels"):
        rec = _signal_record(y, torch.tensor([2, 3, 4]), "log_z")
    assert [r["observed"]["what"] for r in rec] == ["validation log_z labels"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _signal_record(y, torch.tensor([1, 2, 3]), "log_z") == []  # one differing validation label


# ---------------------------------------------------------------------------------------------
# training: <output_dir>/signal.json
# ---------------------------------------------------------------------------------------------


def _zero_reward(prompts, completions, completion_ids, **kw):
    return [0.0] * len(completions)


def _online(tiny_dir, out, math_rows, reward, objective="grpo", **kw):
    pytest.importorskip("trl")
    from datasets import Dataset

    from tests.llm.train._tiny_trainer import online_args
    from tiltlab.llm.base.models import load_model, load_tokenizer
    from tiltlab.llm.train.online import TiltGRPOTrainer

    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": r["prompt"]}]} for r in math_rows[:4]])
    return TiltGRPOTrainer(
        model=load_model(tiny_dir, device="cpu"),
        reward_funcs=reward,
        args=online_args(out, objective, **{"max_steps": 2, **kw}),
        train_dataset=ds,
        processing_class=load_tokenizer(tiny_dir),
    )


def _train(tr, **kw):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        tr.train(**kw)
    return [str(x.message) for x in w if issubclass(x.category, VacuousRunWarning)]


def _train_where(tr, **kw):
    """(message, file the warning points at) of each vacuous-run warning of ``tr.train()``."""
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        tr.train(**kw)
    return [(str(x.message), x.filename) for x in w if issubclass(x.category, VacuousRunWarning)]


@pytest.mark.parametrize("objective", ["grpo", "flowrl"])
def test_training_without_signal_records_zero_steps_and_equal_batches(objective, tiny_dir, tmp_path, math_rows):
    from tiltlab.llm.train.signal_guard import read_signal_record

    tr = _online(tiny_dir, tmp_path / objective, math_rows, _zero_reward, objective)
    before = {k: v.detach().clone() for k, v in tr.model.named_parameters()}
    vac = _train_where(tr)
    # the observation, pinned: loss and gradient exactly 0, weights bit-identical
    assert all(torch.equal(v, before[k]) for k, v in tr.model.named_parameters())
    rec = read_signal_record(str(tmp_path / objective))
    assert rec["optimizer_steps_observed"] == 2 and rec["zero_update_steps"] == [1, 2]
    assert rec["generation_batches_observed"] == 2 and rec["equal_reward_steps"] == [1, 2]
    assert [(f["kind"], f["observed"]["n"]) for f in rec["findings"]] == [("zero_update", 2), ("equal_rewards", 2)]
    assert rec["findings"][0]["message"].startswith("train: all 2 optimizer steps had loss and gradient exactly 0")
    # one line at the first occurrence of each condition, one per run-level finding at the end
    assert len(vac) == 4 and all("\n" not in m for m, _ in vac)
    assert sum("step 1: loss and gradient are exactly 0" in m for m, _ in vac) == 1
    assert [m for m, _ in vac if m in {f["message"] for f in rec["findings"]}] == [
        f["message"] for f in rec["findings"]
    ]
    assert all(where == __file__ for m, where in vac if m in {f["message"] for f in rec["findings"]})


def test_training_with_signal_records_nothing(tiny_dir, tmp_path, math_rows):
    from tests.llm.train._tiny_trainer import parity_reward
    from tiltlab.llm.train.signal_guard import read_signal_record

    tr = _online(tiny_dir, tmp_path, math_rows, parity_reward)
    assert _train(tr) == []
    rec = read_signal_record(str(tmp_path))
    assert rec["findings"] == [] and rec["zero_update_steps"] == [] and rec["equal_reward_steps"] == []
    assert rec["optimizer_steps_observed"] == 2 and rec["generation_batches_observed"] == 2


def test_a_resumed_run_keeps_the_record_before_its_checkpoint_and_redoes_the_rest(tiny_dir, tmp_path, math_rows):
    from tests.llm.train._tiny_trainer import parity_reward
    from tiltlab.llm.train.signal_guard import read_signal_record

    kw = dict(save_strategy="steps", save_steps=1)
    _train(_online(tiny_dir, tmp_path, math_rows, _zero_reward, **kw))
    assert read_signal_record(str(tmp_path))["zero_update_steps"] == [1, 2]
    # continue from checkpoint-1 with a reward that has signal: step 1 stays recorded, step 2 is redone
    vac = _train(
        _online(tiny_dir, tmp_path, math_rows, parity_reward, **kw),
        resume_from_checkpoint=str(tmp_path / "checkpoint-1"),
    )
    rec = read_signal_record(str(tmp_path))
    assert rec["zero_update_steps"] == [1] and rec["equal_reward_steps"] == [1]
    assert rec["optimizer_steps_observed"] == 2 and rec["generation_batches_observed"] == 2
    assert [f["observed"]["n"] for f in rec["findings"]] == [1, 1] and len(vac) == 2  # the run-level lines only
    assert "1 of the 2 optimizer steps" in rec["findings"][0]["message"]


def test_offline_dataset_of_equal_rewards_is_recorded(tiny_dir, tmp_path, math_rows):
    from datasets import Dataset

    from tiltlab.llm.base.models import load_model, load_tokenizer
    from tiltlab.llm.train.offline import OfflineCollator, OfflineConfig, OfflineTrainer, prepare_offline_rows
    from tiltlab.llm.train.signal_guard import read_signal_record

    def trainer(rewards, out):
        rows = [
            {"prompt": r["prompt"], "completion": f"\\boxed{{{r['answer']}}}", "reward": x}
            for r, x in zip(math_rows[:4], rewards)
        ]
        args = OfflineConfig(
            output_dir=str(out),
            objective="offrl",
            per_device_train_batch_size=4,
            max_steps=1,
            learning_rate=1e-2,
            report_to="none",
            use_cpu=True,
            save_strategy="no",
            disable_tqdm=True,
        )
        ds = Dataset.from_list(prepare_offline_rows(rows, "offrl"))
        tok = load_tokenizer(tiny_dir, padding_side="right")
        return OfflineTrainer(
            model=load_model(tiny_dir, device="cpu"), args=args, train_dataset=ds, data_collator=OfflineCollator(tok)
        )

    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        tr = trainer([1.0] * 4, tmp_path / "equal")
    assert [str(x.message) for x in w if issubclass(x.category, VacuousRunWarning)] == [
        "train: all 4 rewards of the training dataset equal 1: no learning signal (constant labels, zero advantages, "
        "zero TB residual gradients); select prompts with a Stage-1 pass rate strictly between 0 and 1 "
        "(`tiltlab llm prepare select`), or use an easier task / more new tokens"
    ]
    _train(tr)
    rec = read_signal_record(str(tmp_path / "equal"))
    assert [f["kind"] for f in rec["findings"]] == ["equal_rewards"] and rec["optimizer_steps_observed"] == 1
    assert rec["zero_update_steps"] == []  # Off-RL with r = 1 everywhere still moves the weights (SFT-like)
    # one differing reward: nothing
    tr = trainer([1.0, 1.0, 0.0, 1.0], tmp_path / "mixed")
    assert _train(tr) == [] and read_signal_record(str(tmp_path / "mixed"))["findings"] == []
