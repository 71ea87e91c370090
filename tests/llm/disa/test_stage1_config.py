"""Stage 1 at paper scale (issue 14): tokenizer choice, context limits, chat-template arguments,
resume identity and nothing half-written on failure -- on the tiny model, CPU, hf engine."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("pyarrow")

from tiltlab.llm.base.prompts import format_prompt  # noqa: E402
from tiltlab.llm.disa.stage1 import MANIFEST, Stage1Config, load_stage1, run_stage1  # noqa: E402

pytestmark = pytest.mark.llm


def first_token_reward(prompts, completions, completion_ids=None, **kwargs):
    return [float(len(ids) % 2) for ids in completion_ids]


def _cfg(tiny_dir, out, **kw):
    base = dict(
        proposal=str(tiny_dir),
        reference=str(tiny_dir),
        dataset="inline",
        out_dir=str(out),
        M=2,
        max_new_tokens=3,
        device="cpu",
    )
    return Stage1Config(**{**base, **kw})


def _rows(math_rows, n=2):
    return [{"id": r["id"], "prompt": r["prompt"]} for r in math_rows[:n]]


def _run(cfg, rows, **kw):
    return run_stage1(cfg, rows=rows, reward_fn=first_token_reward, progress=False, **kw)


@pytest.mark.parametrize(
    "change", [dict(gen_batch_size=3), dict(dtype="bf16"), dict(temperature=0.9), dict(seed=5)], ids=str
)
def test_resume_refuses_changed_generation_settings(tiny_dir, math_rows, tmp_path, change):
    """gen_batch_size changes the hf engine's sample streams (its seed mixes in the batch index),
    dtype changes every log-prob: a resumed run with either would mix two distributions."""
    rows = _rows(math_rows, 3)
    _run(_cfg(tiny_dir, tmp_path, prompts_per_shard=1, max_prompts=2), rows)  # shards 0-1 done, shard 2 left
    before = (tmp_path / MANIFEST).read_text()
    with pytest.raises(ValueError, match="different configuration"):
        _run(_cfg(tiny_dir, tmp_path, prompts_per_shard=1, max_prompts=2, **change), rows)
    assert (tmp_path / MANIFEST).read_text() == before  # the refusal wrote nothing


def test_resume_keeps_first_config_and_records_changes(tiny_dir, math_rows, tmp_path):
    rows = _rows(math_rows)
    _run(_cfg(tiny_dir, tmp_path, score_batch_size=16), rows)
    _run(_cfg(tiny_dir, tmp_path, score_batch_size=3), rows)  # scoring batch: same samples, allowed
    man = json.loads((tmp_path / MANIFEST).read_text())
    assert man["config"]["score_batch_size"] == 16
    assert man["resumes"] == [{"score_batch_size": 3}]


def test_tokenizer_mismatch_leaves_nothing_behind(tiny_dir, math_rows, tmp_path):
    """A refused run writes no manifest, so a corrected run in the same out_dir is not blocked."""
    rows = _rows(math_rows)
    with pytest.raises(ValueError, match="tokenizers differ.*retokenize"):
        _run(_cfg(tiny_dir, tmp_path, proposal="tiny:1"), rows)
    assert not (tmp_path / MANIFEST).exists()
    _run(_cfg(tiny_dir, tmp_path), rows)  # the corrected run (another proposal) proceeds
    assert json.loads((tmp_path / MANIFEST).read_text())["complete"]


def test_manifest_without_finished_shard_does_not_block(tiny_dir, math_rows, tmp_path):
    """A manifest left by a run that died before its first shard (e.g. an OOM while loading) is replaced."""
    rows = _rows(math_rows)
    stale = {"format": "tiltlab.stage1/1", "identity": {"proposal": "other"}, "shards": {}, "complete": False}
    (tmp_path / MANIFEST).write_text(json.dumps(stale))
    with pytest.warns(RuntimeWarning, match="no finished shard"):
        _run(_cfg(tiny_dir, tmp_path), rows)
    man = json.loads((tmp_path / MANIFEST).read_text())
    assert man["complete"] and man["identity"]["proposal"] == str(tiny_dir)


def test_prompt_longer_than_context_is_refused(tiny_dir, tiny_tokenizer, math_rows, tmp_path):
    """The tiny model has 1,024 positions: a ~1,100-token prompt is refused before sampling, and so
    is a short prompt that does not fit an explicit max_model_len."""
    long_prompt = " ".join(str(i % 10) for i in range(1100))  # digits are single tokens
    assert len(tiny_tokenizer(long_prompt)["input_ids"]) > 1024
    rows = [*_rows(math_rows), {"id": "long", "prompt": long_prompt}]
    with pytest.raises(ValueError, match=r"'long' \(\d+ tokens\) > 1024 \(context\) - 3 \(max_new_tokens\)"):
        _run(_cfg(tiny_dir, tmp_path), rows)
    assert not (tmp_path / MANIFEST).exists()
    n_short = len(tiny_tokenizer(format_prompt(tiny_tokenizer, rows[0]["prompt"]))["input_ids"])
    with pytest.raises(ValueError, match="context"):
        _run(_cfg(tiny_dir, tmp_path, max_model_len=n_short + 2), rows[:1])  # needs n_short + 3
    _run(_cfg(tiny_dir, tmp_path, max_model_len=n_short + 3), rows[:1])  # fits exactly
    with pytest.raises(ValueError, match="exceeds .*max_position_embeddings=1024"):
        _run(_cfg(tiny_dir, tmp_path / "b", max_model_len=2048), rows[:1])


def test_chat_template_kwargs_format_the_scored_prompt(tiny_model, tiny_tokenizer, math_rows, tmp_path):
    """enable_thinking=False reaches the chat template: the recorded conditioning string carries the
    template's branch, and logp_ref is pi_ref's log-prob given exactly that prompt."""
    import copy

    from tiltlab.llm.base.scoring import score_completions

    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template += "{% if enable_thinking is defined and not enable_thinking %}7 7 7{% endif %}"
    d = tmp_path / "model"
    tiny_model.save_pretrained(d)
    tok.save_pretrained(d)
    rows = _rows(math_rows)
    kw = {"enable_thinking": False}
    _run(_cfg(d, tmp_path / "a", chat_template_kwargs=kw), rows)
    _run(_cfg(d, tmp_path / "b"), rows)
    la, lb = (load_stage1(tmp_path / x)[1].to_pydict() for x in "ab")
    assert all(t.endswith("7 7 7") for t in la["prompt_text"])
    assert not any(t.endswith("7 7 7") for t in lb["prompt_text"])
    assert all(a > b for a, b in zip(la["prompt_n_tokens"], lb["prompt_n_tokens"]))
    s = load_stage1(tmp_path / "a")[0].to_pydict()
    pids = [tok(format_prompt(tok, r["prompt"], chat_template_kwargs=kw))["input_ids"] for r in rows for _ in "ab"]
    sc = score_completions(tiny_model, pids, s["completion_ids"], pad_token_id=tok.pad_token_id)
    assert torch.allclose(sc.seq_logprobs.double(), torch.tensor(s["logp_ref"], dtype=torch.float64), atol=1e-4)
    with pytest.raises(ValueError, match="different configuration"):  # part of the resume identity
        _run(_cfg(d, tmp_path / "a", chat_template_kwargs={"enable_thinking": True}), rows)


def test_retokenize_scores_the_text_under_the_reference(tiny_dir, tiny_model, tiny_tokenizer, math_rows, tmp_path):
    """Different tokenizers with tokenizer='retokenize': q samples from its own formatting, logp_proposal
    is q's processed log-prob of its own tokens, completion_ids are pi_ref's tokens of the same text
    (+ eos when q stopped) and logp_ref is pi_ref's teacher-forced log-prob of them."""
    from tiltlab.llm.base.models import load_model_and_tokenizer
    from tiltlab.llm.base.rollout import processed_logprobs
    from tiltlab.llm.base.scoring import score_completions

    q_model, q_tok = load_model_and_tokenizer("tiny:1", device="cpu")
    assert q_tok.get_vocab() != tiny_tokenizer.get_vocab()
    rows = _rows(math_rows)
    temp = 1.3
    cfg = _cfg(tiny_dir, tmp_path, proposal="tiny:1", tokenizer="retokenize", M=3, max_new_tokens=5, temperature=temp)
    _run(cfg, rows)
    s = load_stage1(tmp_path)[0].to_pydict()
    for text, fin, ids in zip(s["completion"], s["finished"], s["completion_ids"]):
        assert ids == tiny_tokenizer(text, add_special_tokens=False)["input_ids"] + (
            [tiny_tokenizer.eos_token_id] if fin else []
        )
    ref_p = [tiny_tokenizer(format_prompt(tiny_tokenizer, r["prompt"]))["input_ids"] for r in rows for _ in range(3)]
    sc = score_completions(tiny_model, ref_p, s["completion_ids"], pad_token_id=tiny_tokenizer.pad_token_id)
    assert torch.allclose(sc.seq_logprobs.double(), torch.tensor(s["logp_ref"], dtype=torch.float64), atol=1e-4)
    q_p = [q_tok(format_prompt(q_tok, r["prompt"]))["input_ids"] for r in rows for _ in range(3)]
    for p, c, lq in zip(q_p, s["proposal_completion_ids"], s["logp_proposal"]):
        with torch.no_grad():
            logits = q_model(input_ids=torch.tensor([p + c])).logits[0, len(p) - 1 : -1]
        tf = processed_logprobs(logits, temperature=temp).gather(-1, torch.tensor(c)[:, None]).sum()
        assert abs(float(tf) - lq) < 1e-4


def test_new_fields_validate_and_come_from_yaml_and_flags(tmp_path):
    from tiltlab.cli import build_parser
    from tiltlab.llm.base.config_args import config_from_args

    base = dict(proposal="p", reference="r", dataset="d", out_dir="o")
    for bad, msg in (
        (dict(quantization="fp8"), "vLLM"),
        (dict(tensor_parallel_size=8), "vLLM"),
        (dict(tokenizer="qwen"), "tokenizer must be one of"),
        (dict(max_model_len=512), "max_model_len"),
        (dict(engine="vllm", gpu_memory_utilization=1.5), "gpu_memory_utilization"),
        (dict(chat_template_kwargs={"enable_thinking": False}, chat_template=False), "chat_template=True"),
    ):
        with pytest.raises(ValueError, match=msg):
            Stage1Config(**base, **bad)
    section = {
        "proposal": "Qwen/Qwen3-235B-A22B-Instruct-2507",
        "reference": "Qwen/Qwen2.5-7B",
        "dataset": "d.jsonl",
        "out_dir": "o",
        "engine": "vllm",
        "tensor_parallel_size": 8,
        "max_model_len": 10240,
        "tokenizer": "retokenize",
        "quantization": "fp8",
        "chat_template_kwargs": {"enable_thinking": False},
        "gpu_memory_utilization": 0.6,
    }
    path = tmp_path / "run.yaml"
    import yaml

    path.write_text(yaml.safe_dump({"model": "Qwen/Qwen2.5-7B", "stage1": section}))
    parser = build_parser("llm")
    cfg = config_from_args(Stage1Config, parser.parse_args(["llm", "stage1", "--config", str(path)]), section="stage1")
    assert {k: getattr(cfg, k) for k in section} == section
    argv = ["llm", "stage1", "--config", str(path), "--chat-template-kwargs", '{"enable_thinking": true}']
    cfg = config_from_args(Stage1Config, parser.parse_args([*argv, "--max-model-len", "4096"]), section="stage1")
    assert cfg.chat_template_kwargs == {"enable_thinking": True} and cfg.max_model_len == 4096


def test_tokenizer_choice_selects_whose_chat_template(tiny_model, tiny_tokenizer, tiny_dir, math_rows, tmp_path):
    """Same vocabulary, different chat templates: tokenizer='proposal' formats with q's template,
    'reference' (the default) with pi_ref's; the choice is part of the resume identity."""
    import copy

    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template += "8 8"
    q_dir = tmp_path / "q"
    tiny_model.save_pretrained(q_dir)
    tok.save_pretrained(q_dir)
    rows = _rows(math_rows)
    _run(_cfg(tiny_dir, tmp_path / "p", proposal=str(q_dir), tokenizer="proposal"), rows)
    _run(_cfg(tiny_dir, tmp_path / "r", proposal=str(q_dir)), rows)
    assert all(t.endswith("8 8") for t in load_stage1(tmp_path / "p")[1].column("prompt_text").to_pylist())
    assert not any(t.endswith("8 8") for t in load_stage1(tmp_path / "r")[1].column("prompt_text").to_pylist())
    with pytest.raises(ValueError, match="different configuration"):
        _run(_cfg(tiny_dir, tmp_path / "p", proposal=str(q_dir)), rows)


@pytest.mark.parametrize("quiet", [False, True])
def test_the_stage1_command_shows_progress_unless_quiet(tmp_path, monkeypatch, capsys, quiet):
    """``tiltlab llm stage1`` hands ``progress=not --quiet`` to the run (the run itself is recorded, not
    executed: its progress bars are tested in tests/llm/eval/test_long_command_progress.py)."""
    from tiltlab.cli import main as cli_main
    from tiltlab.llm.disa import stage1

    seen = []
    monkeypatch.setattr(stage1.cli, "run_stage1", lambda cfg, progress=True: seen.append(progress) or {"ok": 1})
    argv = [
        "llm",
        "stage1",
        "--proposal",
        "p",
        "--reference",
        "p",
        "--dataset",
        "synthetic:math:2",
        "--out-dir",
        str(tmp_path),
    ]
    assert cli_main(argv + (["--quiet"] if quiet else [])) == 0
    assert seen == [not quiet]
