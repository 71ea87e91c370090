"""One prompt formatter and one reward resolver: Stage 1 labels, the Stage-2 predictor, the
online trainer and evaluation condition the model on the same token ids for a dataset row."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from tiltlab.llm.base.prompts import format_prompt, prompt_messages, prompt_text, prompt_token_ids, training_prompt


def _zero_reward(prompts, completions, completion_ids=None, **kw):
    return [0.0] * len(completions)


def test_prompt_is_identical_in_stage1_stage2_training_and_evaluation(
    tiny_dir, tiny_model, tiny_tokenizer, math_rows, tmp_path, monkeypatch
):
    pytest.importorskip("trl")
    import torch

    from tiltlab.llm.base.models import load_model
    from tiltlab.llm.base.rollout import HFEngine, SamplingConfig
    from tiltlab.llm.disa.stage1 import Stage1Config, run_stage1
    from tiltlab.llm.disa.stage2 import run as stage2
    from tiltlab.llm.eval.run import evaluate
    from tiltlab.llm.train.cli import online_dataset
    from tiltlab.llm.train.online import TiltGRPOConfig, TiltGRPOTrainer

    row = dict(math_rows[0])
    seen: list[list[int]] = []
    generate = HFEngine.generate

    def spy(self, prompts, n, sampling):
        groups = generate(self, prompts, n, sampling)
        seen.extend(list(g.prompt_ids) for g in groups)
        return groups

    monkeypatch.setattr(HFEngine, "generate", spy)

    # Stage 1: the ids the proposal samples from (and the reference scores)
    cfg = Stage1Config(
        proposal=str(tiny_dir),
        reference=str(tiny_dir),
        dataset="inline",
        out_dir=str(tmp_path / "s1"),
        M=2,
        tilt_beta=1.0,
        max_new_tokens=2,
        device="cpu",
    )
    run_stage1(cfg, rows=[row], reward_fn=_zero_reward, progress=False)
    stage1_ids = seen.pop()

    # evaluation
    engine = HFEngine(tiny_model, tiny_tokenizer, batch_size=4)
    evaluate(
        engine,
        {"d": [row]},
        k=1,
        sampling=SamplingConfig(max_new_tokens=2),
        reward_fn=_zero_reward,
        chat_template=True,
        progress=False,
    )
    eval_ids = seen.pop()

    # training: the online dataset's prompt as TRL tokenizes it
    args = TiltGRPOConfig(
        output_dir=str(tmp_path / "tr"),
        objective="grpo",
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=2,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        remove_unused_columns=False,
        disable_tqdm=True,
    )
    ds = online_dataset([row])
    model = load_model(tiny_dir, device="cpu")  # not the shared fixture: the trainer may configure it
    trainer = TiltGRPOTrainer(
        model=model, reward_funcs=_zero_reward, args=args, train_dataset=ds, processing_class=tiny_tokenizer
    )
    train_ids = list(trainer._tokenize_prompts([ds[0]["prompt"]])[0][0])

    # Stage 2: the text the log Z predictor embeds for the trained prompt entry
    texts: list[str] = []

    def fake_embed(model, tokenizer, batch, batch_size=16, progress=False):
        texts.extend(batch)
        return torch.zeros(len(batch))

    monkeypatch.setattr(stage2, "embed_prompts", fake_embed)
    stage2.LogZPredictor(torch.nn.Identity(), None, tiny_tokenizer, chat_template=cfg.chat_template)([ds[0]["prompt"]])
    stage2_ids = list(tiny_tokenizer(texts[0], add_special_tokens=False)["input_ids"])

    want = prompt_token_ids(tiny_tokenizer, row["prompt"], chat_template=True)
    assert stage1_ids == eval_ids == train_ids == stage2_ids == want
    raw = list(tiny_tokenizer(row["prompt"], add_special_tokens=False)["input_ids"])
    assert want != raw and len(want) > len(raw)  # the chat template was applied


def test_format_prompt_forms_and_errors(tiny_tokenizer):
    tok = tiny_tokenizer
    assert format_prompt(tok, "1+1=", chat_template=False) == "1+1="
    chat = format_prompt(tok, "1+1=", system="be brief")
    assert chat == tok.apply_chat_template(
        prompt_messages("1+1=", "be brief"), tokenize=False, add_generation_prompt=True
    )
    assert "be brief" in chat and "1+1=" in chat
    assert training_prompt("1+1=") == [{"role": "user", "content": "1+1="}]
    assert training_prompt("1+1=", chat_template=False) == "1+1="
    assert prompt_text(training_prompt("1+1=", system="s")) == "1+1=" == prompt_text("1+1=")
    with pytest.raises(ValueError, match="no chat template"):
        format_prompt(None, "x")
    with pytest.raises(ValueError, match="chat_template=True"):
        format_prompt(tok, "x", chat_template=False, system="s")
    with pytest.raises(TypeError, match="string"):
        prompt_messages(["x"])
    with pytest.raises(ValueError, match="chat messages"):
        prompt_text(3)


def test_one_reward_resolver():
    from tiltlab.llm.base import rewards
    from tiltlab.llm.base.rewards import resolve_reward

    assert resolve_reward("math") is rewards.math_reward
    assert resolve_reward("code") is rewards.code_reward
    assert resolve_reward("auto") is rewards.verifiable_reward
    assert resolve_reward("tiltlab.llm.base.rewards:math_reward") is rewards.math_reward
    assert resolve_reward(_zero_reward) is _zero_reward
    with pytest.raises(ValueError, match="unknown reward 'maths'"):
        resolve_reward("maths")
    with pytest.raises(ValueError, match="has no function"):
        resolve_reward("tiltlab.llm.base.rewards:nope")
