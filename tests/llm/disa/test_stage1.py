"""DISA Stage 1: labels against exact log Z, resumption after a crash, truncation refusal."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("pyarrow")

from tiltlab.llm.base.prompts import format_prompt  # noqa: E402
from tiltlab.llm.disa.stage1 import CRASH_ENV, MANIFEST, Stage1Config, load_stage1, run_stage1  # noqa: E402

pytestmark = pytest.mark.llm

RARE = set(range(40, 52))  # 12 rare token ids that carry reward 1 (plus the mode, see below)


def token_reward(prompts, completions, completion_ids=None, rewarded=frozenset(RARE), **kwargs):
    """Reward 1 iff the completion's first token is in ``rewarded`` (TRL signature)."""
    return [1.0 if ids and ids[0] in rewarded else 0.0 for ids in completion_ids]


@pytest.fixture(scope="module")
def peaked_dir(tiny_model, tiny_tokenizer, tmp_path_factory):
    """The tiny model with its final-norm gain x4: a peaked next-token distribution (mode ~0.3),
    so temperature visibly changes q and a raw-vs-processed log-prob mix-up is detectable."""
    import copy

    m = copy.deepcopy(tiny_model)
    with torch.no_grad():
        m.model.norm.weight.mul_(4.0)
    out = tmp_path_factory.mktemp("peaked")
    m.save_pretrained(out)
    tiny_tokenizer.save_pretrained(out)
    return out


def _exact(model, tok, prompt, beta, temperature, rewarded):
    """Exact log Z, Var_q(w)/Z^2 and the wrong limit log E_q[exp(beta r)] (what raw, temperature-1
    proposal log-probs would converge to), by enumerating the one-token completion space (float64)."""
    ids = torch.tensor([tok(format_prompt(tok, prompt, True), add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        z = model(input_ids=ids).logits[0, -1].double()
    logp_ref = torch.log_softmax(z, -1)
    logq = torch.log_softmax(z / temperature, -1)
    r = torch.zeros_like(z)
    r[sorted(rewarded)] = 1.0
    log_z = torch.logsumexp(logp_ref + beta * r, -1)
    log_w = logp_ref + beta * r - logq
    rel_var = float(torch.exp(torch.logsumexp(logq + 2 * log_w, -1) - 2 * log_z)) - 1.0  # E_q[w^2]/Z^2 - 1
    wrong = float(torch.logsumexp(logq + beta * r, -1))
    return float(log_z), rel_var, wrong


def test_labels_converge_to_exact_log_z(peaked_dir, math_rows, tmp_path):
    """One-token completions: the LSE label -> exact log Z, within k*sigma/sqrt(M) + |bias|."""
    _check_convergence(peaked_dir, math_rows, tmp_path, engine="hf", device="cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")  # before the fixtures are built
def test_labels_converge_with_vllm_engine(peaked_dir, math_rows, tmp_path):
    """The same exact check with the proposal sampled by vLLM (processed log-probs) on a GPU."""
    pytest.importorskip("vllm")
    _check_convergence(peaked_dir, math_rows, tmp_path, engine="vllm", device="cuda")


def _check_convergence(peaked_dir, math_rows, tmp_path, engine, device):
    from functools import partial

    from tiltlab.llm.base.models import load_model, load_tokenizer

    model, tok = load_model(peaked_dir, device="cpu"), load_tokenizer(peaked_dir)
    beta, temp = 3.0, 0.7
    rows = [{"id": r["id"], "prompt": r["prompt"]} for r in math_rows[:3]]
    ids0 = torch.tensor([tok(format_prompt(tok, rows[0]["prompt"], True), add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        mode = int(model(input_ids=ids0).logits[0, -1].argmax())
    rewarded = frozenset(RARE | {mode})
    reward = partial(token_reward, rewarded=rewarded)
    reward.__qualname__ = "token_reward"
    exact = [_exact(model, tok, r["prompt"], beta, temp, rewarded) for r in rows]
    errs = {}
    for m in (16, 256, 2048):
        cfg = Stage1Config(
            proposal=str(peaked_dir),
            reference=str(peaked_dir),
            dataset="inline",
            out_dir=str(tmp_path / f"m{m}"),
            M=m,
            tilt_beta=beta,
            temperature=temp,
            max_new_tokens=1,
            seed=7,
            prompts_per_shard=2,
            gen_batch_size=1024,
            score_batch_size=1024,
            device=device,
            engine=engine,
            dtype="fp32",
            gpu_memory_utilization=0.3,
        )
        run_stage1(cfg, rows=rows, reward_fn=reward, progress=False)
        samples, labels = load_stage1(cfg.out_dir)
        assert samples.num_rows == m * len(rows)
        assert set(samples.column("n_tokens").to_pylist()) == {1}
        lab = {p: v for p, v in zip(labels.column("prompt_id").to_pylist(), labels.column("log_z").to_pylist())}
        errs[m] = []
        for r, (log_z, rel_var, wrong) in zip(rows, exact):
            sd = math.sqrt(rel_var / m)  # delta-method sd of log Z_hat_M
            bias = rel_var / (2 * m)  # |E[log Z_hat_M] - log Z| to second order
            err = lab[r["id"]] - log_z
            assert abs(err) < 4 * sd + bias, (m, r["id"], err, sd)  # 4 sigma, fixed seed
            errs[m].append(abs(err))
            if m == 2048:  # the check discriminates: raw (unprocessed) proposal log-probs would fail it
                assert abs(wrong - log_z) > 8 * sd + bias
    assert max(errs[2048]) < 0.1 and sum(errs[2048]) < sum(errs[16])


def test_label_columns_follow_estimators(tiny_dir, math_rows, tmp_path):
    """Stored labels are the objectives.estimators functions of the stored log-weights."""
    from tiltlab.objectives import estimators as est

    rows = [{"id": r["id"], "prompt": r["prompt"]} for r in math_rows[:2]]
    cfg = Stage1Config(
        proposal=str(tiny_dir),
        reference=str(tiny_dir),
        dataset="inline",
        out_dir=str(tmp_path),
        M=5,
        tilt_beta=2.0,
        temperature=1.3,
        max_new_tokens=6,
        seed=1,
        device="cpu",
        reward_scale=2.0,
        reward_shift=-0.5,
    )
    run_stage1(cfg, rows=rows, reward_fn=token_reward, progress=False)
    samples, labels = load_stage1(tmp_path)
    s = samples.to_pydict()
    lw = torch.tensor(s["log_w"], dtype=torch.float64).view(2, 5)
    ref = torch.tensor(s["logp_ref"], dtype=torch.float64)
    q = torch.tensor(s["logp_proposal"], dtype=torch.float64)
    r = torch.tensor(s["reward"], dtype=torch.float64)
    assert torch.allclose(torch.tensor(s["reward"]), 2.0 * torch.tensor(s["reward_raw"]) - 0.5)
    assert torch.allclose(lw.flatten(), ref + 2.0 * r - q)
    lab = labels.to_pydict()
    assert torch.allclose(torch.tensor(lab["log_z"], dtype=torch.float64), est.log_partition_lse(lw))
    assert torch.allclose(torch.tensor(lab["ess"], dtype=torch.float64), est.effective_sample_size(lw))
    assert torch.allclose(
        torch.tensor(lab["log_z_bias_corrected"], dtype=torch.float64), est.bias_corrected_log_partition(lw)
    )
    man = json.loads((tmp_path / MANIFEST).read_text())
    assert man["tilt_beta"] == 2.0 and man["reward_transform"]["a"] == 2.0 and man["reward_transform"]["c"] == -0.5
    assert man["complete"] and not man["truncated_support"]
    # proposal log-probs are those of the (temperature 1.3) sampling distribution, not pi_ref's
    assert not torch.allclose(ref, q, atol=1e-3)


def test_truncated_sampler_refused_then_warned(tiny_dir, math_rows, tmp_path):
    rows = [{"id": r["id"], "prompt": r["prompt"]} for r in math_rows[:1]]
    kw = dict(proposal=str(tiny_dir), reference=str(tiny_dir), dataset="inline", M=2, max_new_tokens=2, device="cpu")
    with pytest.raises(ValueError, match="absolute-continuity"):
        run_stage1(Stage1Config(out_dir=str(tmp_path / "a"), top_k=20, **kw), rows=rows, reward_fn=token_reward)
    with pytest.raises(ValueError, match="absolute-continuity"):
        run_stage1(Stage1Config(out_dir=str(tmp_path / "b"), top_p=0.9, **kw), rows=rows, reward_fn=token_reward)
    with pytest.warns(RuntimeWarning, match="biased LOW"):
        run_stage1(
            Stage1Config(out_dir=str(tmp_path / "c"), top_k=20, allow_truncated=True, **kw),
            rows=rows,
            reward_fn=token_reward,
            progress=False,
        )
    assert json.loads((tmp_path / "c" / MANIFEST).read_text())["truncated_support"] is True


def test_config_validation():
    base = dict(proposal="p", reference="r", dataset="d", out_dir="o")
    for bad in (dict(M=0), dict(tilt_beta=0.0), dict(reward_scale=-1.0), dict(temperature=0.0), dict(engine="x")):
        with pytest.raises(ValueError):
            Stage1Config(**base, **bad)


def _write_jsonl(path: Path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_killed_run_resumes_without_loss_or_duplicates(tiny_dir, math_rows, tmp_path):
    """`tiltlab llm stage1` in a subprocess hard-exits (os._exit, as abrupt as SIGKILL) twice:
    once after shard 2's Parquet files are written but before the manifest records them, once
    right after shard 3 is recorded. Resuming then yields exactly the (prompt_id, sample_idx)
    set, and the same rows, as an uninterrupted run."""
    data = tmp_path / "prompts.jsonl"
    _write_jsonl(data, math_rows[:9])
    out = tmp_path / "run"
    argv = [
        sys.executable,
        "-m",
        "tiltlab.cli",
        "llm",
        "stage1",
        "--proposal",
        str(tiny_dir),
        "--reference",
        str(tiny_dir),
        "--dataset",
        str(data),
        "--out-dir",
        str(out),
        "--M",
        "3",
        "--max-new-tokens",
        "4",
        "--prompts-per-shard",
        "2",
        "--temperature",
        "1.1",
        "--device",
        "cpu",
        "--quiet",
        "--reward",
        "math",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

    proc = subprocess.run(
        argv, env={**env, CRASH_ENV: "2:before_manifest"}, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 86, proc.stderr[-2000:]
    man = json.loads((out / MANIFEST).read_text())
    assert list(man["shards"]) == ["0"] and not man["complete"]
    assert (out / "samples-00001.parquet").exists()  # written but unrecorded: ignored, then redone
    assert load_stage1(out)[0].num_rows == 2 * 3

    proc = subprocess.run(argv, env={**env, CRASH_ENV: "3:after_manifest"}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 86, proc.stderr[-2000:]
    man = json.loads((out / MANIFEST).read_text())
    assert sorted(man["shards"], key=int) == ["0", "1", "2"] and not man["complete"]
    first = load_stage1(out)[0].to_pydict()

    cfg = Stage1Config(
        proposal=str(tiny_dir),
        reference=str(tiny_dir),
        dataset=str(data),
        out_dir=str(out),
        M=3,
        max_new_tokens=4,
        prompts_per_shard=2,
        temperature=1.1,
        device="cpu",
        reward="math",
    )
    run_stage1(cfg, progress=False)  # resume in-process
    samples, labels = load_stage1(out)
    keys = list(zip(samples.column("prompt_id").to_pylist(), samples.column("sample_idx").to_pylist()))
    expected = {(r["id"], j) for r in math_rows[:9] for j in range(3)}
    assert len(keys) == len(expected) and set(keys) == expected
    assert sorted(labels.column("prompt_id").to_pylist()) == sorted(r["id"] for r in math_rows[:9])
    assert json.loads((out / MANIFEST).read_text())["complete"]
    assert not list(out.glob(".*tmp*"))
    # rows written before the crash are untouched, and an uninterrupted run gives the same samples
    after = samples.to_pydict()
    n0 = len(first["prompt_id"])
    assert after["completion_ids"][:n0] == first["completion_ids"] and after["log_w"][:n0] == first["log_w"]
    fresh = Stage1Config(**{**cfg.__dict__, "out_dir": str(tmp_path / "fresh")})
    run_stage1(fresh, progress=False)
    ref = load_stage1(fresh.out_dir)[0].to_pydict()
    assert ref["completion_ids"] == after["completion_ids"]
    # Same samples; the log-weights come from float32 forward passes in another process whose batch
    # composition can differ (a resumed run scores fewer rows per batch), so matmul reduction order can
    # move |log w| ~ 10 by a few float32 ulps (eps 1.2e-7 relative): allow 1e-5 relative.
    assert all(abs(a - b) <= 1e-5 * max(1.0, abs(b)) for a, b in zip(ref["log_w"], after["log_w"]))


def test_resume_refuses_changed_config(tiny_dir, math_rows, tmp_path):
    rows = [{"id": r["id"], "prompt": r["prompt"]} for r in math_rows[:1]]
    kw = dict(
        proposal=str(tiny_dir),
        reference=str(tiny_dir),
        dataset="inline",
        out_dir=str(tmp_path),
        M=2,
        max_new_tokens=2,
        device="cpu",
    )
    run_stage1(Stage1Config(**kw), rows=rows, reward_fn=token_reward, progress=False)
    with pytest.raises(ValueError, match="different configuration"):
        run_stage1(Stage1Config(tilt_beta=2.0, **kw), rows=rows, reward_fn=token_reward, progress=False)


def test_cli_flags_map_to_config_fields():
    """`tiltlab llm stage1` flags are the Stage1Config fields, help = the field docstrings."""
    from tiltlab.cli import build_parser
    from tiltlab.dataclass_cli import field_docs
    from tiltlab.llm.base.config_args import config_from_args

    parser = build_parser("llm")
    args = parser.parse_args(
        [
            "llm",
            "stage1",
            "--proposal",
            "q",
            "--reference",
            "r",
            "--dataset",
            "d",
            "--out-dir",
            "o",
            "--M",
            "16",
            "--tilt-beta",
            "5",
            "--top-k",
            "3",
            "--allow-truncated",
            "--no-chat-template",
            "--max-prompts",
            "7",
        ]
    )
    cfg = config_from_args(Stage1Config, args, section="stage1")
    assert (cfg.M, cfg.tilt_beta, cfg.top_k, cfg.allow_truncated, cfg.chat_template, cfg.max_prompts) == (
        16,
        5.0,
        3,
        True,
        False,
        7,
    )
    assert cfg.temperature == 1.0 and cfg.engine == "hf"  # defaults come from the dataclass
    docs = field_docs(Stage1Config)
    assert set(docs) == {f for f in Stage1Config.__dataclass_fields__}  # every field documented
    from tiltlab.llm.disa.stage2.config import Stage2Config

    sub = parser.parse_args(["llm", "stage2", "--labels", "l", "--out-dir", "o", "--no-chat-template"])
    s2 = config_from_args(Stage2Config, sub, section="stage2")
    assert s2.chat_template is False and s2.target == "log_z"
    # required values may come from --config, so a missing one is reported when the config is built
    with pytest.raises(ValueError, match="--reference"):
        config_from_args(Stage1Config, parser.parse_args(["llm", "stage1", "--proposal", "q"]), section="stage1")


def test_distinct_proposal_logprobs_and_tokenizer_check(tiny_model, tiny_tokenizer, tiny_dir, math_rows, tmp_path):
    """q != pi_ref: logp_proposal is q's (processed) log-prob and logp_ref is pi_ref's, by teacher forcing."""
    import copy

    from tiltlab.llm.base.scoring import score_completions

    q = copy.deepcopy(tiny_model)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in q.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    q_dir = tmp_path / "q"
    q.save_pretrained(q_dir)
    tiny_tokenizer.save_pretrained(q_dir)
    rows = [{"id": r["id"], "prompt": r["prompt"]} for r in math_rows[:2]]
    cfg = Stage1Config(
        proposal=str(q_dir),
        reference=str(tiny_dir),
        dataset="inline",
        out_dir=str(tmp_path / "o"),
        M=3,
        max_new_tokens=4,
        device="cpu",
    )
    run_stage1(cfg, rows=rows, reward_fn=token_reward, progress=False)
    s = load_stage1(cfg.out_dir)[0].to_pydict()
    pids = [
        tiny_tokenizer(format_prompt(tiny_tokenizer, r["prompt"], True), add_special_tokens=False)["input_ids"]
        for r in rows
        for _ in range(3)
    ]
    for model, col in ((q, "logp_proposal"), (tiny_model, "logp_ref")):
        sc = score_completions(model, pids, s["completion_ids"], pad_token_id=tiny_tokenizer.pad_token_id)
        # fp32, <= 4 tokens: KV-cache sampling vs full teacher forcing agree to ~1e-5
        assert torch.allclose(sc.seq_logprobs.double(), torch.tensor(s[col], dtype=torch.float64), atol=1e-4)
    assert not torch.allclose(torch.tensor(s["logp_proposal"]), torch.tensor(s["logp_ref"]), atol=1e-2)
    bad = Stage1Config(
        proposal="tiny:1",
        reference=str(tiny_dir),
        dataset="inline",
        out_dir=str(tmp_path / "b"),
        M=2,
        max_new_tokens=2,
        device="cpu",
    )
    with pytest.raises(ValueError, match="tokenizers differ"):
        run_stage1(bad, rows=rows, reward_fn=token_reward, progress=False)
