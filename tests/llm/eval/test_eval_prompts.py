"""Prompts agree everywhere: ``tiltlab llm eval`` conditions on the token ids training (and Stage 1)
conditions on, for a Qwen3 chat template with ``enable_thinking: false``; a run config's
``trl.chat_template_kwargs`` flows into its ``eval:`` section."""

from __future__ import annotations

import argparse
import importlib.resources
import json
from pathlib import Path

import pytest

pytest.importorskip("yaml")

from tiltlab.dataclass_cli import add_dataclass_args
from tiltlab.llm.base.config_args import config_from_args
from tiltlab.llm.eval.config import EvalConfig, eval_from_run_config

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
NO_THINK = {"enable_thinking": False}

# Qwen3's own template ends a generation prompt with an empty think block when enable_thinking is
# false; this is that branch alone, used when the installed TRL ships no copy of the full template
QWEN3_MINIMAL = (
    "{%- for message in messages %}{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)


def _qwen3_template() -> str:
    """Qwen3's chat template as TRL ships it (``trl/chat_templates/qwen3.jinja``), else the minimal one."""
    try:
        path = importlib.resources.files("trl") / "chat_templates" / "qwen3.jinja"
        text = path.read_text(encoding="utf-8")
    except (ModuleNotFoundError, FileNotFoundError):
        text = QWEN3_MINIMAL
    assert "enable_thinking" in text
    return text


def _parse(argv):
    p = argparse.ArgumentParser()
    add_dataclass_args(p, EvalConfig, config_section="eval")
    return p.parse_args(argv)


def _eval_cfg(path, *argv) -> EvalConfig:
    return config_from_args(
        EvalConfig, _parse(["--config", str(path), *argv]), section="eval", translate=eval_from_run_config
    )


def test_eval_conditions_on_the_training_prompt_ids_of_a_qwen3_config(tiny_dir, math_rows, tmp_path):
    pytest.importorskip("trl")
    from tests.llm.train._tiny_trainer import online_args
    from tiltlab.llm.base.models import load_model, load_tokenizer
    from tiltlab.llm.base.prompts import prompt_token_ids
    from tiltlab.llm.base.rollout import HFEngine, SamplingConfig
    from tiltlab.llm.eval.run import evaluate
    from tiltlab.llm.train.cli import online_dataset
    from tiltlab.llm.train.online import TiltGRPOTrainer

    tok = load_tokenizer(tiny_dir)
    tok.chat_template = _qwen3_template()
    model = load_model(tiny_dir, device="cpu")
    rows = math_rows[:3]

    class Recording(HFEngine):
        def _encode(self, prompts):
            texts, ids = super()._encode(prompts)
            self.seen = ids
            return texts, ids

    engine = Recording(model, tok, batch_size=8)

    def eval_ids(**kw):
        evaluate(
            engine,
            {"math": rows},
            1,
            SamplingConfig(max_new_tokens=2, seed=0),
            pass_ks=(1,),
            distinct_ns=(1,),
            reward_fn="math",
            progress=False,
            **kw,
        )
        return engine.seen

    # training: TRL renders the dataset's conversational prompts with GRPOConfig.chat_template_kwargs
    ds = online_dataset(rows)
    trainer = TiltGRPOTrainer(
        model=model,
        reward_funcs=lambda prompts, completions, **kw: [0.0] * len(completions),
        args=online_args(tmp_path, "grpo", max_steps=1, chat_template_kwargs=dict(NO_THINK)),
        train_dataset=ds,
        processing_class=tok,
    )
    train_ids = [list(x) for x in trainer._tokenize_prompts([r["prompt"] for r in ds])[0]]
    no_think = eval_ids(chat_template_kwargs=dict(NO_THINK))
    assert no_think == train_ids
    # Stage 1 / Stage 2 format through the same function with stage1.chat_template_kwargs
    assert no_think == [prompt_token_ids(tok, r["prompt"], True, chat_template_kwargs=NO_THINK) for r in rows]
    assert all(tok.decode(ids).endswith("<think>\n\n</think>\n\n") for ids in no_think)
    # the argument matters: without it eval would condition on another prompt (Qwen3's thinking turn)
    thinking = eval_ids()
    assert all(a != b for a, b in zip(thinking, train_ids))
    assert all(len(b) > len(a) and b[: len(a)] == a for a, b in zip(thinking, train_ids))


def _write(tmp_path, text) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


RUN = """model: tiny
objective: grpo
output_dir: {out}
trl:
  chat_template_kwargs:
    enable_thinking: false
eval:
  benchmarks: [synthetic:math:4]
  k: 2
"""


def test_run_config_chat_template_kwargs_flow_into_eval(tmp_path):
    path = _write(tmp_path, RUN.format(out=tmp_path / "run"))
    assert _eval_cfg(path).chat_template_kwargs == NO_THINK  # from trl: the prompt training used
    # the eval section's own value, --set and the flag take precedence, in that order
    assert _eval_cfg(path, "--set", "eval.chat_template_kwargs={enable_thinking: true}").chat_template_kwargs == {
        "enable_thinking": True
    }
    flag = _eval_cfg(path, "--chat-template-kwargs", '{"enable_thinking": true, "x": 1}')
    assert flag.chat_template_kwargs == {"enable_thinking": True, "x": 1}
    # a raw-prompt evaluation takes no template arguments, inherited or not
    raw = _eval_cfg(path, "--set", "eval.chat_template=false")
    assert raw.chat_template is False and raw.chat_template_kwargs is None
    # a run without them evaluates without them
    trl_block = "trl:\n  chat_template_kwargs:\n    enable_thinking: false\n"
    plain = _write(tmp_path, RUN.format(out=tmp_path / "run").replace(trl_block, ""))
    assert _eval_cfg(plain).chat_template_kwargs is None


def test_eval_chat_template_kwargs_bad_values_are_one_line_errors():
    with pytest.raises(ValueError, match="chat_template_kwargs must be a mapping"):
        EvalConfig(chat_template_kwargs=["enable_thinking"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="chat_template_kwargs need chat_template=True"):
        EvalConfig(chat_template=False, chat_template_kwargs=dict(NO_THINK))
    with pytest.raises(SystemExit):  # argparse: "--chat-template-kwargs: expected a JSON object"
        _parse(["--chat-template-kwargs", "[1]"])


def test_qwen3_configs_evaluate_every_row_on_the_training_prompt():
    """Every online run config of a model resolves the same eval chat-template arguments, and a
    trained row's are its training's: the base-model rows of a results table condition on the same
    prompt as the trained rows."""
    import yaml

    by_model: dict[str, set] = {}
    n = 0
    for path in sorted(CONFIGS.glob("*qwen3*.yaml")):
        data = yaml.safe_load(path.read_text())
        if data.get("kind", "online") != "online" or not data.get("eval"):
            continue
        kw = _eval_cfg(path).chat_template_kwargs
        train_kw = (data.get("trl") or {}).get("chat_template_kwargs")
        if data.get("objective") != "none":
            assert kw == train_kw, path.name
        by_model.setdefault(data["model"], set()).add(repr(kw))
        n += 1
    assert n >= 10 and by_model and all(v == {repr(NO_THINK)} for v in by_model.values()), by_model


def test_run_eval_renders_prompts_with_the_config_chat_template_kwargs(tiny_dir, tmp_path):
    from tiltlab.llm.base.models import load_tokenizer
    from tiltlab.llm.eval.run import run_eval

    tok = load_tokenizer(tiny_dir)
    tok.chat_template = _qwen3_template()

    class Echo:
        """generate(prompts, n) -> n copies of "0" per prompt; keeps the prompt strings it was given."""

        tokenizer = tok

        def generate(self, prompts, n):
            self.seen = list(prompts)
            return [["0"] * n for _ in prompts]

    for kw, thinking in ((dict(NO_THINK), False), (None, True)):
        engine = Echo()
        cfg = EvalConfig(
            datasets=["synthetic:math:3"],
            k=2,
            pass_ks=[1],
            distinct_ns=[1],
            chat_template_kwargs=kw,
            out_dir=str(tmp_path / str(thinking)),
        )
        run_eval(cfg, engine=engine)
        assert len(engine.seen) == 3
        assert all(p.endswith("<|im_start|>assistant\n") == thinking for p in engine.seen)
        assert all(p.endswith("<think>\n\n</think>\n\n") != thinking for p in engine.seen)
        saved = json.loads((tmp_path / str(thinking) / "results.json").read_text())["config"]
        assert saved["chat_template_kwargs"] == kw  # the record names the prompt format it evaluated
