"""The real-model training check (``disa.llm.real_model_training``): its pure parts against naive
computations, with the no-op and NaN runs that must not pass. The check itself trains SmolLM2 three
times per seed (``tiltlab check --layer llm --slow``); a two-step run of the whole pipeline is the
``slow`` test at the end."""

from __future__ import annotations

import importlib.metadata as md
import math

import pytest
import torch
from scipy import stats

from tiltlab.llm.checks import real_training as R
from tiltlab.llm.checks import task as T
from tiltlab.paper_checks.registry import Verdict

P = 12


def _hist(losses, grads, extra=None):
    return [{"loss": x, "grad_norm": g, "step": i + 1, **(extra or {})} for i, (x, g) in enumerate(zip(losses, grads))]


def test_t_quantile_is_exact_for_every_df():
    for df, want in ((1, 12.706), (9, 2.262), (10, 2.228), (47, 2.012), (200, 1.972)):
        assert T.t975(df) == pytest.approx(want, abs=5e-4)
    x = [0.3, -0.1, 0.5, 0.2, 0.0, 0.4, 0.1, 0.6, -0.2, 0.3, 0.25, 0.15]  # df = 11: the old table fell back to 1.96
    m, lo, hi = T.mean_ci(x)
    h = stats.t.ppf(0.975, len(x) - 1) * stats.tstd(x) / math.sqrt(len(x))
    assert (m, lo, hi) == pytest.approx((sum(x) / len(x), sum(x) / len(x) - h, sum(x) / len(x) + h), rel=1e-12)
    with pytest.raises(ValueError):
        T.t975(0)


def test_clustered_ci_averages_seeds_within_a_prompt():
    gen = torch.Generator().manual_seed(0)
    per_seed = [torch.rand(P, generator=gen, dtype=torch.float64) - 0.3 for _ in range(3)]
    naive = [sum(float(d[p]) for d in per_seed) / 3 for p in range(P)]  # one unit per prompt, not 3 x P
    assert R.clustered_ci(per_seed) == pytest.approx(T.mean_ci(naive), rel=1e-12)
    assert R.clustered_ci(per_seed) != pytest.approx(T.mean_ci(torch.cat(per_seed).tolist()))


def test_trained_items_fail_on_noop_nan_and_frozen_runs():
    ok, n = R.trained_items(_hist([0.9, 1.6, 0.7], [120.0, 240.0, 160.0]), moved=3e-4)
    assert ok and n["steps"] == 3 and n["max_abs_loss"] == 1.6 and n["max_grad_norm"] == 240.0
    # a run without signal: loss and gradient exactly 0 at every step, weights unchanged
    assert not R.trained_items(_hist([0.0, 0.0], [0.0, 0.0]), moved=0.0)[0]
    assert not R.trained_items(_hist([0.0, 0.0], [0.0, 0.0]), moved=1e-3)[0]  # moved, but no loss ever
    assert not R.trained_items(_hist([0.5, float("nan")], [1.0, 1.0]), moved=1e-3)[0]  # NaN loss
    assert not R.trained_items(_hist([0.5, 0.4], [1.0, float("inf")]), moved=1e-3)[0]  # inf gradient
    assert not R.trained_items(_hist([0.5, 0.4], [1.0, 2.0]), moved=0.0)[0]  # weights frozen
    assert not R.trained_items(_hist([0.5, 0.4], [0.0, 0.0]), moved=1e-3)[0]  # no gradient
    assert not R.trained_items([{"train_runtime": 3.0}], moved=1e-3)[0]  # no step logged
    # one step with a zero gradient (a batch whose groups all had equal rewards) does not undo the others
    assert R.trained_items(_hist([0.0, 0.4], [0.0, 2.0]), moved=1e-3)[0]


def test_step_times_are_means_over_logged_steps():
    h = [
        {"loss": 1.0, "step_time": 20.0, "time/vLLM.generate": 6.0, "time/sync_weights": 0.5},
        {"loss": 1.0, "step_time": 30.0, "time/vLLM.generate": 8.0},
        {"train_runtime": 99.0},
    ]
    assert R.step_times(h) == {"step_time": 25.0, "time/vLLM.generate": 7.0, "time/sync_weights": 0.25}


def _diffs(disa, flowrl, grpo, noise=0.02, seeds=2):
    gen = torch.Generator().manual_seed(1)

    def arm(mu):
        return [mu + noise * torch.randn(P, generator=gen, dtype=torch.float64) for _ in range(seeds)]

    return {"disa": arm(disa), "flowrl": arm(flowrl), "grpo": arm(grpo)}


ALL = {"disa": True, "flowrl": True, "grpo": True}


def test_decide_maps_each_outcome_of_the_rule():
    v, nums, items = R.decide(ALL, _diffs(0.20, 0.05, 0.05))
    assert v is Verdict.VERIFIED and items["disa_beats_base"] and items["disa_above_flowrl"]
    naive = [sum(float(d[p]) for d in _diffs(0.20, 0.05, 0.05)["disa"]) / 2 for p in range(P)]
    assert (nums["disa_minus_base"], nums["disa_minus_base_lo"], nums["disa_minus_base_hi"]) == pytest.approx(
        T.mean_ci(naive)
    )
    # DISA below FlowRL by more than the margin: refuted; below by less than the margin: inconclusive
    assert R.decide(ALL, _diffs(0.05, 0.20, 0.05))[0] is Verdict.REFUTED
    assert R.decide(ALL, _diffs(0.05, 0.05 + R.MARGIN / 2, 0.0, noise=0.001))[0] is Verdict.INCONCLUSIVE
    # DISA above the others but not above the base model: not verified
    assert R.decide(ALL, _diffs(0.0, -0.2, -0.2))[0] is Verdict.INCONCLUSIVE
    # the no-op run: nothing trained, nothing moved -> never verified or refuted, every "ran" item False
    v, _, items = R.decide(dict.fromkeys(ALL, False), {m: [torch.zeros(P)] * 2 for m in ALL})
    assert v is Verdict.INCONCLUSIVE
    assert not any(items[f"{m}_{k}"] for m in ALL for k in ("trained", "accuracy_moved", "beats_base"))
    # one objective did not train: a clear DISA win is not verified, a clear loss not refuted
    for one in ALL:
        assert R.decide({**ALL, one: False}, _diffs(0.20, 0.05, 0.05))[0] is Verdict.INCONCLUSIVE
        assert R.decide({**ALL, one: False}, _diffs(0.05, 0.20, 0.05))[0] is Verdict.INCONCLUSIVE


def test_decide_boundaries_are_strict(monkeypatch):
    """Lower bound exactly 0 is not "above"; upper bound exactly -MARGIN is not "below by the margin";
    one prompt moved by one sample in 16 is "moved"."""
    monkeypatch.setattr(R, "MARGIN", 0.25)  # a binary fraction: the mean of 12 copies is exactly -0.25
    zeros = [torch.zeros(P, dtype=torch.float64)] * 2
    at_margin = [torch.full((P,), R.MARGIN, dtype=torch.float64)] * 2  # DISA - FlowRL = 0 - MARGIN exactly
    v, nums, items = R.decide(ALL, {"disa": zeros, "flowrl": at_margin, "grpo": zeros})
    assert nums["disa_minus_grpo_lo"] == 0.0 and not items["disa_above_grpo"]
    assert nums["disa_minus_flowrl_hi"] == -R.MARGIN and not items["disa_below_flowrl_by_margin"]
    assert v is Verdict.INCONCLUSIVE and not items["disa_accuracy_moved"] and items["flowrl_accuracy_moved"]
    one = torch.zeros(P, dtype=torch.float64)
    one[3] = 1 / 16
    assert R.decide(ALL, {"disa": [one, zeros[0]], "flowrl": zeros, "grpo": zeros})[2]["disa_accuracy_moved"]


def test_decide_refuses_nan_or_missing_differences():
    d = _diffs(0.2, 0.05, 0.05)
    d["grpo"][1][3] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        R.decide(ALL, d)
    with pytest.raises(ValueError, match="missing"):
        R.decide(ALL, {**_diffs(0.2, 0.05, 0.05), "flowrl": []})


def test_train_configs_differ_only_where_the_objectives_do(tmp_path):
    task = {"train": "t.jsonl", "stage1_dir": "s1"}
    c = {m: R.train_config(m, task, tmp_path / m, seed=7, steps=5) for m in R.OBJECTIVES}
    assert c["disa"]["beta"] == c["flowrl"]["beta"] == R.BETA and "beta" not in c["grpo"]
    for m in ("disa", "flowrl"):  # same reward transform and residual: only the log Z source differs
        assert c[m]["trl"]["reward_transform"] == "affine" and c[m]["trl"]["length_normalize"] is False
    assert c["disa"]["trl"]["disa_label"] == "column" and c["disa"]["disa"] == {"stage1_dir": "s1"}
    shared = ("learning_rate", "num_generations", "max_completion_length", "max_steps", "seed", "temperature")
    for k in shared:
        assert c["disa"]["trl"][k] == c["flowrl"]["trl"][k] == c["grpo"]["trl"][k]
    assert c["grpo"]["trl"]["max_steps"] == 5 and c["grpo"]["trl"]["seed"] == 7
    assert c["grpo"]["trl"]["per_device_train_batch_size"] == R.PROMPTS_PER_STEP * R.G
    assert all(c[m]["trl"]["use_vllm"] and c[m]["trl"]["vllm_mode"] == "colocate" for m in R.OBJECTIVES)


@pytest.mark.slow
@pytest.mark.vllm
def test_whole_check_at_a_tiny_budget(monkeypatch):
    """The pipeline end to end (selection, 2 steps per objective, evaluation) on SmolLM2 + vLLM."""
    from tiltlab.llm.models import MODEL_ALIASES

    try:
        md.distribution(MODEL_ALIASES[R.ALIAS].distribution)
    except md.PackageNotFoundError:
        pytest.skip(f"needs `{MODEL_ALIASES[R.ALIAS].install}`")
    pytest.importorskip("vllm")
    monkeypatch.setattr(R, "N_CANDIDATES", 32)
    monkeypatch.setattr(R, "EVAL_K", 4)
    res = R.real_model_training(0, n_seeds=1, steps=2)
    assert res.verdict in set(Verdict)
    assert all(res.items[f"{m}_trained"] for m in R.OBJECTIVES), res.summary
    assert res.numbers["task_n_train"] >= 1 and 0.1 <= res.numbers["task_mean_pass_train"] <= 0.9
    for m in R.OBJECTIVES:
        assert res.numbers[f"{m}_s0_steps"] == 2 and res.numbers[f"{m}_step_time_mean"] > 0


def test_check_assembles_numbers_items_and_summary_from_its_parts(monkeypatch, tmp_path):
    """The check's bookkeeping with its engine-bound parts replaced by fakes: which accuracies are paired
    with which, per-seed "trained" items (one frozen seed makes the objective not trained), the times."""
    from tiltlab.llm.data import save_prompts

    held = [{"id": f"h{i}", "prompt": f"q{i}", "answer": "1", "answer_format": "plain"} for i in range(P)]
    save_prompts(held, tmp_path / "held.jsonl")
    task = {
        "n_labelled": 96, "n_kept": 2 * P, "n_train": P, "n_heldout": P, "mean_pass_all": 0.2,
        "mean_pass_train": 0.3, "mean_pass_heldout": 0.31, "stage1_dir": "s1", "train": "t", "heldout": str(tmp_path / "held.jsonl"),
    }  # fmt: skip
    base = torch.linspace(0.1, 0.5, P, dtype=torch.float64)
    lift = {"base": 0.0, "disa": 0.2, "flowrl": 0.05, "grpo": 0.1}
    seen = []

    def fake_eval(model_dir, rows, seed):
        seen.append((model_dir, seed))
        name = "base" if model_dir == "BASE" else model_dir.split("-")[0]
        return base + lift[name] + 0.001 * torch.arange(P) * (name != "base")

    def fake_train(m, task_, root, s, steps):
        frozen = m == "grpo" and s == 1
        hist = [{"loss": 0.0 if frozen else 0.5, "grad_norm": 0.0 if frozen else 3.0, "step_time": 10.0 + s,
                 "time/generate_and_score": 4.0, "time/vLLM.generate": 2.0, "reward": 0.25, "step": i + 1} for i in range(steps)]  # fmt: skip
        return f"{m}-{s}", hist

    monkeypatch.setattr("tiltlab.llm.models.resolve_model", lambda name, progress=True: "BASE")
    monkeypatch.setattr("safetensors.torch.load_file", lambda path: {"w": torch.zeros(2)})
    monkeypatch.setattr(R, "make_task", lambda root, model_dir, seed: task)
    monkeypatch.setattr(R, "heldout_accuracy", fake_eval)
    monkeypatch.setattr(R, "run_training", fake_train)
    monkeypatch.setattr(R, "weights_moved", lambda start, out: 0.0 if out == "grpo-1" else 1e-3)
    monkeypatch.setattr("tiltlab.llm.trainers.logz_head.policy_only_dir", lambda d: d)
    res = R.real_model_training.__wrapped__(0, n_seeds=2, steps=3)
    # every model evaluated with the same sampling seed; base once, each (objective, seed) once
    assert {s for _, s in seen} == {99} and next(d for d, _ in seen) == "BASE"
    assert sorted(d for d, _ in seen[1:]) == sorted(f"{m}-{s}" for m in R.OBJECTIVES for s in (0, 1))
    assert res.items["disa_trained"] and res.items["flowrl_trained"] and not res.items["grpo_trained"]
    assert res.verdict is Verdict.INCONCLUSIVE  # GRPO did not train on seed 1: no verdict either way
    assert res.numbers["acc_base"] == pytest.approx(float(base.mean()))
    want = float((lift["disa"] + 0.001 * torch.arange(P)).mean())
    assert res.numbers["disa_minus_base"] == pytest.approx(want)
    assert res.numbers["disa_minus_flowrl"] == pytest.approx(lift["disa"] - lift["flowrl"])
    assert res.numbers["disa_step_time_mean"] == pytest.approx(10.5)  # seeds 0 and 1: 10 and 11 s
    assert res.numbers["grpo_s1_max_abs_loss"] == 0.0 and res.numbers["disa_s0_steps"] == 3
    assert "grpo NO" in res.summary and "lower bound > 0" in res.summary


def test_each_seed_labels_its_prompts_with_its_own_stage1_stream(tmp_path):
    """The Stage-1 config of a seed's run carries that seed (and the check's constants): with one shared
    seed every run would draw the same Stage-1 samples and the runs would not be independent units."""
    rt = R
    cfgs = {s: rt._stage1_config("m", "d.jsonl", tmp_path / str(s), s) for s in (0, 3)}
    assert [cfgs[s].seed for s in (0, 3)] == [0, 3]
    for s, c in cfgs.items():
        assert (c.M, c.beta, c.max_new_tokens, c.max_model_len, c.prompts_per_shard) == (
            rt.SELECT_M,
            rt.BETA,
            rt.NEW_TOKENS,
            rt.MAX_MODEL_LEN,
            rt.N_CANDIDATES,
        )
        assert (c.engine, c.dtype, c.device, c.out_dir) == ("vllm", "fp32", "cpu", str(tmp_path / str(s)))


def test_heldout_accuracy_scores_each_prompts_own_samples(monkeypatch):
    """``heldout_accuracy`` on a recording engine: one prompt text per row, EVAL_K samples at T = 1 with
    the given seed, the engine closed, and each prompt's accuracy = the mean of the math reward of ITS
    samples against ITS answer (a loop over (prompt, sample) with the real reward)."""
    import transformers

    from tiltlab.llm.data import load_prompts
    from tiltlab.llm.rewards import math_reward

    rows = load_prompts("synthetic:qa:3")
    samples = [  # EVAL_K = 4 each: 3/4, 0/4 and 1/4 correct
        [rows[0]["answer"], rows[0]["answer"], "7", rows[0]["answer"]],
        ["no", rows[0]["answer"], "", "1"],
        [rows[2]["answer"], "x", "y", "z"],
    ]
    seen: dict = {}

    class Engine:
        def generate(self, texts, k, sampling):
            seen.update(texts=texts, k=k, temperature=sampling.temperature, seed=sampling.seed)
            return [type("G", (), {"texts": s})() for s in samples]

        def close(self):
            seen["closed"] = True

    monkeypatch.setattr(R, "EVAL_K", 4)
    monkeypatch.setattr(R, "_engine", lambda model_dir, seed: Engine())
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda d: "TOK")
    monkeypatch.setattr("tiltlab.llm.prompts.format_prompt", lambda tok, p, chat: f"<{tok}:{chat}>{p}")
    acc = R.heldout_accuracy("model-dir", rows, seed=5)
    assert seen == {
        "texts": [f"<TOK:True>{r['prompt']}" for r in rows], "k": 4, "temperature": 1.0, "seed": 5, "closed": True,
    }  # fmt: skip
    naive = [
        sum(math_reward([r["prompt"]], [t], answer=[r["answer"]], answer_format=[r["answer_format"]])[0] for t in s) / 4
        for r, s in zip(rows, samples)
    ]
    assert acc.dtype == torch.float64 and acc.tolist() == naive == [0.75, 0.0, 0.25]
