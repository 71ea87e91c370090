"""DISA Stage 2 and the end-to-end Stage 1 -> Stage 2 -> predict_log_z path on the tiny model."""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from tiltlab.llm.base.prompts import format_prompt  # noqa: E402
from tiltlab.llm.disa.stage1 import Stage1Config, load_stage1, run_stage1  # noqa: E402
from tiltlab.llm.disa.stage2.config import CONFIG_FILE, REGRESSOR_FILE, Stage2Config  # noqa: E402
from tiltlab.llm.disa.stage2.run import (  # noqa: E402
    embed_prompts,
    load_log_z_predictor,
    predict_log_z,
    run_stage2,
)

pytestmark = pytest.mark.llm

BETA = 2.0


def easy_even_reward(prompts, completions, completion_ids=None, difficulty=None, **kwargs):
    """r = 1 iff the prompt is easy (difficulty <= 2) and the first completion token id is even.

    Then Z(x) = 1 + p_even(x) (e^beta - 1) on easy prompts and exactly 1 on hard ones: a label
    that depends on the prompt in a learnable way, with importance-sampling noise on top."""
    return [1.0 if d <= 2 and ids[0] % 2 == 0 else 0.0 for d, ids in zip(difficulty, completion_ids)]


@pytest.fixture(scope="module")
def stage1_dir(tiny_dir, tmp_path_factory):
    from tiltlab.llm.base.tasks import arithmetic_tasks

    rows = arithmetic_tasks(40, seed=3)
    out = tmp_path_factory.mktemp("s1")
    cfg = Stage1Config(
        proposal=str(tiny_dir),
        reference=str(tiny_dir),
        dataset="synthetic:math:40",
        out_dir=str(out),
        M=8,
        tilt_beta=BETA,
        temperature=1.2,
        max_new_tokens=2,
        prompts_per_shard=16,
        seed=0,
        gen_batch_size=320,
        score_batch_size=320,
        device="cpu",
    )
    run_stage1(cfg, rows=rows, reward_fn=easy_even_reward, progress=False)
    return out, rows


def test_stage1_to_stage2_to_predict_log_z(stage1_dir, tmp_path, tiny_model, tiny_tokenizer):
    from tiltlab.cli import main

    s1, rows = stage1_dir
    out = tmp_path / "s2"
    rc = main(
        [
            "llm",
            "stage2",
            "--labels",
            str(s1),
            "--out-dir",
            str(out),
            "--epochs",
            "150",
            "--hidden",
            "64",
            "--val-fraction",
            "0.25",
            "--device",
            "cpu",
            "--quiet",
        ]
    )
    assert rc == 0
    cfg = json.loads((out / CONFIG_FILE).read_text())
    assert (out / REGRESSOR_FILE).exists()
    assert (out / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert cfg["tilt_beta"] == BETA and cfg["target"] == "log_z" and cfg["chat_template"] is True
    assert cfg["regressor"]["in_dim"] == tiny_model.config.hidden_size
    m = cfg["metrics"]
    assert m["n_train"] == 30 and m["n_val"] == 10
    # labels: ~log(1 + (e^2 - 1)/2) = 1.43 on easy prompts, ~0 on hard ones, plus IS noise;
    # the regressor must explain most of the held-out variance
    assert m["val_r2"] > 0.6 and m["val_mse"] < 0.4 * m["baseline_val_mse"]

    _, labels = load_stage1(s1)
    lab = dict(zip(labels.column("prompt_id").to_pylist(), labels.column("log_z").to_pylist()))
    easy = [lab[r["id"]] for r in rows if r["difficulty"] <= 2]
    hard = [lab[r["id"]] for r in rows if r["difficulty"] > 2]
    # the labels carry the signal: exact log Z ~ 1.43 (easy) vs 0 (hard); with M = 8 an easy prompt
    # can still draw no even token (prob ~0.5^8), so compare means, not extremes
    assert sum(easy) / len(easy) - sum(hard) / len(hard) > 1.0 and max(abs(x) for x in hard) < 0.3

    pred = load_log_z_predictor(out, device="cpu")
    y = pred.predict_log_z([r["prompt"] for r in rows])
    assert y.shape == (len(rows),) and torch.isfinite(y).all()
    is_easy = torch.tensor([r["difficulty"] <= 2 for r in rows])
    assert float(y[is_easy].mean() - y[~is_easy].mean()) > 0.8  # exact gap ~1.4
    # the module-level API and a predictor sharing an already loaded model agree
    shared = load_log_z_predictor(out, model=tiny_model, tokenizer=tiny_tokenizer)
    chat = [[{"role": "user", "content": r["prompt"]}] for r in rows[:4]]
    assert torch.allclose(shared.predict_log_z(chat), y[:4], atol=1e-5)
    assert torch.allclose(predict_log_z([r["prompt"] for r in rows[:4]], shared), y[:4], atol=1e-5)


def test_stage2_embedding_cache_and_bias_corrected_target(stage1_dir, tmp_path):
    s1, _ = stage1_dir
    cfg = Stage2Config(
        labels=str(s1), out_dir=str(tmp_path), epochs=20, hidden=32, device="cpu", target="log_z_bias_corrected"
    )
    a = run_stage2(cfg, progress=False)
    b = run_stage2(cfg, progress=False)
    assert not a["embedding_cache_hit"] and b["embedding_cache_hit"]
    assert a["val_mse"] == b["val_mse"]  # cached features are the same features
    assert len(list((tmp_path / "embed_cache").glob("emb-*.safetensors"))) == 1
    _, labels = load_stage1(s1)
    bc = labels.column("log_z_bias_corrected").to_pylist()
    assert abs(a["label_mean"] - sum(bc) / len(bc)) < 1e-5


def test_stage2_hands_every_fit_option_to_the_regressor(stage1_dir, tmp_path, monkeypatch):
    # the Stage2Config fit fields away from their defaults reach fit_regressor (whose options are
    # checked against their formulas in tests/objectives/test_regressor_metrics.py)
    import tiltlab.objectives.regressor as reg

    seen = {}
    real = reg.fit_regressor

    def spy(feats, y, **kw):
        seen.update(kw)
        return real(feats, y, **kw)

    monkeypatch.setattr(reg, "fit_regressor", spy)
    s1, _ = stage1_dir
    cfg = Stage2Config(
        labels=str(s1),
        out_dir=str(tmp_path),
        device="cpu",
        val_fraction=0.3,
        epochs=3,
        lr=0.01,
        weight_decay=0.02,
        hidden=12,
        n_layers=3,
        fit_batch_size=8,
        seed=5,
    )
    out = run_stage2(cfg, progress=False)
    want = dict(val_fraction=0.3, epochs=3, lr=0.01, weight_decay=0.02, hidden=12, n_layers=3, batch_size=8, seed=5)
    assert {k: seen[k] for k in want} == want
    assert out["n_val"] == round(0.3 * (out["n_train"] + out["n_val"]))


def test_embeddings_are_mean_pooled_last_hidden(tiny_model, tiny_tokenizer):
    texts = [format_prompt(tiny_tokenizer, p, True) for p in ["1+1=", "Compute 12*7 - 3. Show work.", "9"]]
    e1 = embed_prompts(tiny_model, tiny_tokenizer, texts, batch_size=1)
    e3 = embed_prompts(tiny_model, tiny_tokenizer, texts, batch_size=3)
    assert torch.allclose(e1, e3, atol=1e-5)  # padding-invariant (fp32)
    for i, t in enumerate(texts):
        ids = torch.tensor([tiny_tokenizer(t, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            h = tiny_model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0]  # [L, H], after final norm
        assert torch.allclose(e1[i], h.mean(0), atol=1e-5)


def test_stage2_errors(tmp_path):
    with pytest.raises(ValueError):
        Stage2Config(labels="x", out_dir="y", target="nope")
    with pytest.raises(ValueError):
        Stage2Config(labels="x", out_dir="y", val_fraction=1.0)
    with pytest.raises(FileNotFoundError):
        run_stage2(Stage2Config(labels=str(tmp_path / "missing"), out_dir=str(tmp_path / "o")), progress=False)
    with pytest.raises(FileNotFoundError):
        load_log_z_predictor(tmp_path)
    assert math.isfinite(BETA)


THINK_TEMPLATE = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>"
    "{% if enable_thinking is defined and not enable_thinking %}[no thinking]{% endif %}{% endif %}"
)


def test_stage2_formats_prompts_with_stage1_chat_template_kwargs(tiny_dir, tmp_path, monkeypatch):
    # Stage 1 conditioned pi_ref on the template rendered with chat_template_kwargs (enable_thinking=False);
    # Stage 2 must embed those same strings (and the saved predictor must format new prompts the same way),
    # not the template's default rendering.
    import shutil

    from tiltlab.llm.base.models import load_tokenizer
    from tiltlab.llm.base.tasks import arithmetic_tasks
    from tiltlab.llm.disa.stage2 import run as stage2

    model_dir = tmp_path / "tiny_think"
    shutil.copytree(tiny_dir, model_dir)
    tok = load_tokenizer(model_dir)
    tok.chat_template = THINK_TEMPLATE
    tok.save_pretrained(model_dir)
    rows = arithmetic_tasks(6, seed=1)
    cfg = Stage1Config(
        proposal=str(model_dir),
        reference=str(model_dir),
        dataset="synthetic:math:6",
        out_dir=str(tmp_path / "s1"),
        M=2,
        tilt_beta=BETA,
        max_new_tokens=2,
        seed=0,
        device="cpu",
        chat_template_kwargs={"enable_thinking": False},
    )
    run_stage1(cfg, rows=rows, reward_fn=easy_even_reward, progress=False)
    _, labels = load_stage1(cfg.out_dir)
    stage1_text = dict(zip(labels.column("prompt").to_pylist(), labels.column("prompt_text").to_pylist()))
    assert all(t.endswith("<assistant>[no thinking]") for t in stage1_text.values())

    seen: list[list[str]] = []
    real_cached, real_embed = stage2.cached_embeddings, stage2.embed_prompts
    monkeypatch.setattr(
        stage2, "cached_embeddings", lambda m, t, texts, *a: seen.append(list(texts)) or real_cached(m, t, texts, *a)
    )
    run_stage2(Stage2Config(labels=cfg.out_dir, out_dir=str(tmp_path / "s2"), epochs=2, device="cpu"), progress=False)
    assert seen and seen[0] == [stage1_text[p] for p in labels.column("prompt").to_pylist()]

    monkeypatch.setattr(
        stage2, "embed_prompts", lambda m, t, texts, *a: seen.append(list(texts)) or real_embed(m, t, texts, *a)
    )
    pred = load_log_z_predictor(tmp_path / "s2", device="cpu")
    prompts = [r["prompt"] for r in rows[:3]]
    assert pred(prompts).shape == (3,)
    assert seen[-1] == [stage1_text[p] for p in prompts]
