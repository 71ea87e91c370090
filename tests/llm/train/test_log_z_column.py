"""DISA's frozen log Z as a dataset column: `stage2-annotate` writes it from the Stage-2 predictor,
and the Stage-3 trainer with ``disa_label="column"`` reads it and holds no predictor (no second
model during training)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("trl")


@pytest.fixture(scope="module")
def predictor(tiny_dir):
    from tiltlab.llm.base.models import load_model, load_tokenizer
    from tiltlab.llm.disa.stage2.run import LogZPredictor
    from tiltlab.objectives.regressor import PartitionRegressor

    model = load_model(tiny_dir, device="cpu")
    torch.manual_seed(0)
    reg = PartitionRegressor(model.config.hidden_size, hidden=16)
    return LogZPredictor(reg, model, load_tokenizer(tiny_dir), chat_template=True, batch_size=4)


def test_annotate_writes_the_predictor_log_z_column(predictor, math_rows, tmp_path):
    from tiltlab.llm.base.data import load_prompts
    from tiltlab.llm.disa.stage2.run import annotate_log_z

    out = annotate_log_z(predictor, list(math_rows), tmp_path / "with_log_z.jsonl", batch_size=5, progress=False)
    rows = load_prompts(str(out))
    assert [r["prompt"] for r in rows] == [r["prompt"] for r in math_rows]
    want = predictor.predict_log_z([r["prompt"] for r in math_rows])
    got = torch.tensor([r["log_z"] for r in rows])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert want.std() > 0  # a real per-prompt prediction, not a constant
    assert not list(tmp_path.glob(".*tmp*"))  # no leftover temporary file
    with pytest.raises(ValueError, match="already has a 'log_z' column"):
        annotate_log_z(predictor, rows, tmp_path / "again.jsonl", progress=False)


def test_disa_column_label_trains_without_a_predictor(predictor, tiny_dir, math_rows, tmp_path):
    from datasets import Dataset

    from tiltlab.llm.base.models import load_model, load_tokenizer
    from tiltlab.llm.disa.stage2.run import annotate_log_z
    from tiltlab.llm.train.online import TiltGRPOTrainer

    path = annotate_log_z(predictor, list(math_rows), tmp_path / "d.jsonl", progress=False)
    raw = [json.loads(x) for x in path.read_text().splitlines()]
    ds = Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"], "log_z": r["log_z"]}
            for r in raw
        ]
    )

    def args(**kw):
        from tests.llm.train._tiny_trainer import disa_kwargs, online_args

        return online_args(
            tmp_path / "o", "disa", disa_label="column", max_completion_length=4, max_steps=1, **disa_kwargs(), **kw
        )

    def never(prompts):
        raise AssertionError("the predictor must not be called with disa_label='column'")

    seen = []

    class Spy(TiltGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            seen.append((out["log_z"].clone(), [r["log_z"] for r in inputs]))
            return out

    tr = Spy(
        model=load_model(tiny_dir, device="cpu"),
        reward_funcs=lambda prompts, completions, completion_ids, **kw: [float(i[0] % 2) for i in completion_ids],
        args=args(),
        train_dataset=ds,
        processing_class=load_tokenizer(tiny_dir),
        log_z_fn=never,
    )
    assert tr.log_z_fn is None
    tr.train()
    assert tr.state.global_step == 1 and seen
    for lz, col in seen:
        torch.testing.assert_close(lz.cpu(), torch.tensor(col, dtype=torch.float32))
    with pytest.raises(ValueError, match="stage2-annotate"):
        TiltGRPOTrainer(
            model=load_model(tiny_dir, device="cpu"),
            reward_funcs=lambda prompts, completions, **kw: [0.0] * len(prompts),
            args=args(),
            train_dataset=ds.remove_columns("log_z"),
            processing_class=load_tokenizer(tiny_dir),
        )


def test_disa_label_config_key():
    from tiltlab.llm.base.run_config import SECTION_KEYS
    from tiltlab.llm.train.online import TiltGRPOConfig

    assert SECTION_KEYS["disa"]["label"] == "disa_label"
    with pytest.raises(ValueError, match="disa_label"):
        TiltGRPOConfig(output_dir="x", use_cpu=True, disa_label="file")


def test_frozen_log_z_cache_follows_each_rows_own_prompt():
    """The DISA log Z cache (keyed by the prompt): rows in any order, repeated or new, get their own
    prompt's value, and the predictor is asked only for prompts it has not seen."""
    from tiltlab.llm.train.online import TiltGRPOTrainer

    value = {"a": 0.5, "b": -1.25, "c": 2.0, "d": 3.5}
    asked: list[list[str]] = []

    def log_z_fn(prompts):
        asked.append([p[0]["content"] for p in prompts])
        return torch.tensor([value[p[0]["content"]] for p in prompts])

    st = SimpleNamespace(log_z_fn=log_z_fn, _log_z_cache={})

    def rows(*names):
        return [{"prompt": [{"role": "user", "content": n}]} for n in names]

    for names in (("b", "b", "a", "a"), ("c", "a", "c", "b"), ("d", "c", "b", "a")):
        got = TiltGRPOTrainer._frozen_log_z(st, rows(*names))
        assert got.tolist() == [value[n] for n in names]
    assert [sorted(a) for a in asked] == [["a", "b"], ["c"], ["d"]]
