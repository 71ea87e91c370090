"""Training that says when it goes wrong: the residual diagnostics against a plain computation, the
health warnings' bounds (at the bound, over it, reset by a good step, once per kind, NaN counts as over),
and a real TRL run that logs them and writes ``results.json``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from tiltlab.llm.train.health import HealthBounds, HealthMonitor
from tiltlab.objectives.diagnostics import flip_stats, residual_stats


def _quantile(xs: list[float], q: float) -> float:
    """The linear-interpolation quantile (numpy's default, torch.quantile's) by hand."""
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (pos - lo) * (s[hi] - s[lo])


def test_residual_stats_equal_a_plain_computation():
    r = [0.7, -2.5, 0.1, 3.2, -0.4, 1.9, -1.1]
    got = residual_stats(torch.tensor(r))
    a = [abs(x) for x in r]
    assert got["residual/abs_p50"] == pytest.approx(_quantile(a, 0.5), abs=1e-6)
    assert got["residual/abs_p90"] == pytest.approx(_quantile(a, 0.9), abs=1e-6)
    assert got["residual/abs_max"] == pytest.approx(3.2, abs=1e-6)
    assert got["residual/pos_frac"] == pytest.approx(4 / 7)
    assert _quantile(a, 0.9) != pytest.approx(max(a))  # the p90 is not the max here (interpolated)


@pytest.mark.parametrize("bad", [[], [0.3, float("nan")], [float("inf")]])
def test_residual_stats_refuse_empty_and_non_finite(bad):
    with pytest.raises(ValueError, match="residual_stats"):
        residual_stats(torch.tensor(bad))


def test_flip_stats_equal_a_plain_loop():
    before = [0.5, -1.0, 2.0, 0.0, -0.3]
    after = [-0.2, -3.0, 1.5, 0.4, 0.3]
    got = flip_stats(torch.tensor(before), torch.tensor(after))
    flips = sum((b > 0) - (b < 0) != (a > 0) - (a < 0) for b, a in zip(before, after))
    assert flips == 3  # 0.5 -> -0.2, 0.0 -> 0.4, -0.3 -> 0.3
    assert got["residual/flip_frac"] == pytest.approx(flips / 5)
    mb, ma = sum(map(abs, before)) / 5, sum(map(abs, after)) / 5
    assert got["residual/after_abs_mean"] == pytest.approx(ma)
    assert got["residual/after_over_before"] == pytest.approx(ma / mb)
    same = flip_stats(torch.tensor(before), torch.tensor(before))
    assert same["residual/flip_frac"] == 0.0 and same["residual/after_over_before"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    "before,after", [([1.0, 2.0], [1.0]), ([], []), ([1.0, float("nan")], [1.0, 2.0]), ([1.0], [float("inf")])]
)
def test_flip_stats_refuse_mismatched_empty_and_non_finite(before, after):
    with pytest.raises(ValueError, match="flip_stats"):
        flip_stats(torch.tensor(before), torch.tensor(after))


def _monitor(**kw) -> HealthMonitor:
    m = HealthMonitor(HealthBounds(**kw))
    m._quiet = True
    return m


def _feed(m: HealthMonitor, key: str, values: list[float]) -> None:
    for i, v in enumerate(values, 1):
        m.observe(i, {"loss": 1.0, key: v})


@pytest.mark.parametrize("key,kind,factor", [("residual", "residual", 3.0), ("grad_norm", "grad_norm", 10.0)])
def test_a_bound_exceeded_for_patience_steps_warns_once(key, kind, factor):
    first = 2.0
    over = factor * first * 1.01
    m = _monitor(patience=3)
    _feed(m, key, [first, over, over, over, over, over])
    assert [(w["kind"], w["step"]) for w in m.warnings] == [(kind, 4)]  # the 3rd step over the bound, once
    assert f"{factor:g} x" in m.warnings[0]["message"]


@pytest.mark.parametrize("key", ["residual", "grad_norm"])
def test_no_warning_at_the_bound_or_when_a_good_step_interrupts(key):
    factor = 3.0 if key == "residual" else 10.0
    m = _monitor(patience=3)
    _feed(m, key, [1.0, factor, factor, factor, factor])  # at the bound: not over it
    assert m.warnings == []
    m = _monitor(patience=3)
    _feed(m, key, [1.0, 2 * factor, 2 * factor, 1.0, 2 * factor, 2 * factor])  # reset by the good step
    assert m.warnings == []


def test_patience_away_from_its_default():
    m = _monitor(patience=1, residual_factor=2.0)
    _feed(m, "residual", [1.0, 2.5])
    assert [w["step"] for w in m.warnings] == [2]


@pytest.mark.parametrize("key", ["residual", "grad_norm"])
def test_a_nan_value_counts_as_over_the_bound(key):
    m = _monitor(patience=2)
    _feed(m, key, [1.0, float("nan"), float("nan")])
    assert [w["kind"] for w in m.warnings] == [key]
    assert "nan" in m.warnings[0]["message"]


def test_overshoot_warns_on_sign_flips_or_a_growing_residual():
    m = _monitor(patience=2, flip_frac=0.5)
    for i, (f, r) in enumerate([(0.6, 0.9), (0.7, 0.8)], 1):
        m.observe(i, {"loss": 1.0, "residual/flip_frac": f, "residual/after_over_before": r})
    assert [w["kind"] for w in m.warnings] == ["overshoot"]
    m = _monitor(patience=2, flip_frac=0.5)
    for i, (f, r) in enumerate([(0.1, 1.2), (0.1, 1.3)], 1):
        m.observe(i, {"loss": 1.0, "residual/flip_frac": f, "residual/after_over_before": r})
    assert [w["kind"] for w in m.warnings] == ["overshoot"]
    m = _monitor(patience=2, flip_frac=0.5)  # at the bounds: healthy
    for i in (1, 2, 3):
        m.observe(i, {"loss": 1.0, "residual/flip_frac": 0.5, "residual/after_over_before": 1.0})
    assert m.warnings == []


def test_validation_below_the_start_warns_and_equal_does_not():
    m = _monitor(patience=2)
    for step, v in [(0, 0.30), (4, 0.25), (8, 0.20)]:
        m.observe_eval(step, {"eval_reward": v})
    assert [(w["kind"], w["step"]) for w in m.warnings] == [("validation", 8)]
    assert "0.3" in m.warnings[0]["message"]
    m = _monitor(patience=2)
    for step, v in [(0, 0.30), (4, 0.30), (8, 0.30), (12, 0.31)]:
        m.observe_eval(step, {"eval_reward": v})
    assert m.warnings == []
    m = _monitor(patience=1)  # no evaluation at step 0: no start to fall below
    for step, v in [(4, 0.30), (8, 0.10), (12, 0.05)]:
        m.observe_eval(step, {"eval_reward": v})
    assert m.warnings == []
    m = HealthMonitor(HealthBounds(patience=1), metric="eval_loss", greater_is_better=False)
    m._quiet = True
    for step, v in [(0, 1.0), (4, 1.2)]:  # a loss: higher is worse
        m.observe_eval(step, {"eval_loss": v})
    assert [w["kind"] for w in m.warnings] == ["validation"]


@pytest.mark.parametrize(
    "kw", [{"patience": 0}, {"residual_factor": 1.0}, {"grad_norm_factor": 0.5}, {"flip_frac": 1.0}]
)
def test_bounds_out_of_range_are_refused(kw):
    with pytest.raises(ValueError, match="health_"):
        HealthBounds(**kw)


def test_the_warning_is_one_line_on_stderr(capsys):
    m = HealthMonitor(HealthBounds(patience=1))
    _feed(m, "grad_norm", [1.0, 50.0])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("[train] warning (step 2): gradient norm")


def _disa_trainer(tmp_path, tiny_dir, math_rows, log_z_step: float, **overrides):
    """A DISA TiltGRPOTrainer on the tiny Qwen3 with a log_z column ``log_z_step * i`` (row i), the parity reward."""
    pytest.importorskip("trl")
    from datasets import Dataset

    from tests.llm.train._tiny_trainer import disa_kwargs, online_args, parity_reward
    from tiltlab.llm.base.models import load_model, load_tokenizer
    from tiltlab.llm.train.online import TiltGRPOTrainer

    rows = [
        {"prompt": [{"role": "user", "content": r["prompt"]}], "log_z": log_z_step * i} for i, r in enumerate(math_rows)
    ]
    return TiltGRPOTrainer(
        model=load_model(tiny_dir, device="cpu"),
        reward_funcs=parity_reward,
        args=online_args(tmp_path, "disa", **overrides, **disa_kwargs()),
        train_dataset=Dataset.from_list(rows),
        processing_class=load_tokenizer(tiny_dir),
    )


@pytest.mark.parametrize("flips", [True, False])
def test_a_real_run_logs_the_diagnostics_and_writes_results_json(tmp_path, tiny_dir, math_rows, flips):
    """The tiny Qwen3 on CPU, DISA with a log_z column, 3 steps: every step logs the residual quantiles, the
    sequence KL to pi_ref and (with ``log_residual_flips``, its default) the flip statistics; ``results.json``
    keeps them."""
    from tiltlab.llm.train.cli import write_results

    trainer = _disa_trainer(tmp_path, tiny_dir, math_rows, 0.1, max_steps=3, log_residual_flips=flips)
    trainer.train()
    steps = [h for h in trainer.state.log_history if "loss" in h]
    assert len(steps) == 3
    for h in steps:
        assert 0.0 <= h["residual/abs_p50"] <= h["residual/abs_p90"] <= h["residual/abs_max"]
        assert 0.0 <= h["residual/pos_frac"] <= 1.0 and math.isfinite(h["kl_ref_seq"])
        assert ("residual/flip_frac" in h) is flips and ("residual/after_over_before" in h) is flips
        assert ("time/residual_flips" in h) is flips
        # the generation-time log-prob passes (pi_ref here) are timed inside generate-and-score
        assert 0.0 < h["time/generation_logps"] <= h["time/generate_and_score"]
        if flips:
            assert 0.0 <= h["residual/flip_frac"] <= 1.0 and h["residual/after_abs_mean"] >= 0.0
            # the tiny model at lr 1e-2 moves: the batch's residuals after the step differ from before
            assert h["residual/after_over_before"] != 1.0
    rec = json.loads(Path(write_results(trainer, str(tmp_path))).read_text())
    assert [s["step"] for s in rec["steps"]] == [1, 2, 3]
    assert rec["steps"][0]["residual/abs_max"] == steps[0]["residual/abs_max"]
    assert rec["warnings"] == trainer.health.warnings and rec["objective"] == "disa"


def test_with_the_weights_unmoved_no_residual_flips_and_the_ratio_is_one(tmp_path, tiny_dir, math_rows):
    """learning_rate 0: the after-step residuals are the same batch's, in the same order, at the same weights
    (a pairing or a batch mix-up would show flips; a wrong ratio would not be 1)."""
    trainer = _disa_trainer(tmp_path, tiny_dir, math_rows, 0.3, max_steps=2, learning_rate=0.0)
    trainer.train()
    steps = [h for h in trainer.state.log_history if "loss" in h]
    assert len(steps) == 2
    for h in steps:
        assert h["residual/flip_frac"] == 0.0
        # the same float32 forward twice; 1e-5 covers a reduction order that may differ between the two passes
        assert h["residual/after_over_before"] == pytest.approx(1.0, abs=1e-5)
        assert h["residual/after_abs_mean"] == pytest.approx(h["residual"], rel=1e-5)


def _results(tmp_path, name="run-a"):
    run = tmp_path / name
    run.mkdir()
    rec = {
        "objective": "disa",
        "global_step": 2,
        "max_steps": 2,
        "steps": [
            {"step": 1, "loss": 0.5, "grad_norm": 12.0, "residual": 0.8, "residual/abs_max": 1.9, "reward": 0.25},
            {
                "step": 2,
                "loss": 83.4,
                "grad_norm": 1514.0,
                "residual": 9.1,
                "residual/abs_max": 20.5,
                "reward": 0.0,
                "residual/flip_frac": 0.75,
                "residual/after_over_before": 2.5,
            },
        ],
        "evals": [],
        "warnings": [{"step": 2, "kind": "grad_norm", "message": "gradient norm 1514 > 10 x its first step's 12"}],
    }
    (run / "results.json").write_text(json.dumps(rec))
    return run


def test_diagnose_prints_each_step_and_the_warnings_and_draws_a_png(tmp_path, capsys):
    from tiltlab.cli import main

    run = _results(tmp_path)
    png = tmp_path / "diag.png"
    assert main(["llm", "diagnose", str(run), "--out", str(png)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "run-a (disa, 2 of 2 steps)"
    head = out[1].split()
    assert head[:4] == ["step", "loss", "grad_norm", "residual"]
    row2 = dict(zip(head, out[3].split()))
    assert row2["loss"] == "83.4" and row2["grad_norm"] == "1.51e+03" and row2["flip_frac"] == "0.75"
    assert dict(zip(head, out[2].split()))["flip_frac"] == "-"  # not logged at step 1
    assert out[4] == "  warning (step 2, grad_norm): gradient norm 1514 > 10 x its first step's 12"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("content,msg", [(None, "no results.json"), ("{not json", "not JSON"), ("[]", "not a run's")])
def test_diagnose_refuses_what_is_not_a_results_file_in_one_line(tmp_path, capsys, content, msg):
    from tiltlab.cli import main

    run = tmp_path / "r"
    run.mkdir()
    if content is not None:
        (run / "results.json").write_text(content)
    assert main(["llm", "diagnose", str(run)]) != 0
    err = capsys.readouterr().err.strip()
    assert msg in err and "\n" not in err


def test_one_disa_step_equals_a_plain_computation_sign_scale_logprobs_and_grad_clip(tmp_path, tiny_dir, math_rows):
    """The DISA path end to end on the tiny model: one SGD step of TiltGRPOTrainer against a plain recomputation
    of the same batch: ``delta_b = log_z(x_b) + sum_t log pi(y_bt) - sum_t log pi_ref(y_bt) - beta r_b`` from a
    plain forward of the policy and of a frozen copy of the start (pi_ref), the reward recomputed from the
    completion (parity), log Z from the dataset column; ``L = mean_b delta_b^2``; the logged gradient norm is
    ``||grad L||`` before clipping, and the update is ``-lr * grad L * min(1, max_grad_norm / ||grad L||)``
    (clipping active: max_grad_norm is far below the norm; fp32, TRL's bf16 autocast off). Any error of sign, scale, anchor, log-prob sum or
    clip moves the update off the plain one."""
    pytest.importorskip("trl")
    import copy

    from datasets import Dataset

    from tests.llm.train._tiny_trainer import disa_kwargs, online_args, parity_reward
    from tiltlab.llm.base.models import load_model, load_tokenizer
    from tiltlab.llm.train.online import TiltGRPOTrainer

    rows = [
        {"prompt": [{"role": "user", "content": r["prompt"]}], "log_z": 0.2 + 0.1 * i} for i, r in enumerate(math_rows)
    ]
    log_z_of = {r["prompt"][0]["content"]: r["log_z"] for r in rows}
    lr, max_norm, beta = 20.0, 1e-3, 2.0  # updates ~1e-5: far above float32 rounding of the weights
    args = online_args(
        tmp_path, "disa", max_steps=1, optim="sgd", learning_rate=lr, max_grad_norm=max_norm,
        lr_scheduler_type="constant", log_residual_flips=False, bf16=False, **disa_kwargs(),
    )  # fmt: skip
    model = load_model(tiny_dir, device="cpu")
    start = copy.deepcopy(model).eval()
    tok = load_tokenizer(tiny_dir)
    trainer = TiltGRPOTrainer(
        model=model, reward_funcs=parity_reward, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok
    )
    seen: list[dict] = []
    inner = trainer._compute_loss

    def recording(m, inputs):
        seen.append({k: (v.detach().clone() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()})
        return inner(m, inputs)

    trainer._compute_loss = recording
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    trainer.train()
    (inputs,) = seen
    p_ids, p_mask = inputs["prompt_ids"], inputs["prompt_mask"]
    c_ids, c_mask = inputs["completion_ids"], inputs["completion_mask"].float()
    ids, am = torch.cat([p_ids, c_ids], 1), torch.cat([p_mask, inputs["completion_mask"]], 1)

    def seq_logp(m):
        logits = m(input_ids=ids, attention_mask=am).logits[:, p_ids.shape[1] - 1 : -1].float()
        tok_lp = torch.log_softmax(logits, -1).gather(-1, c_ids[..., None])[..., 0]
        return (tok_lp * c_mask).sum(1)

    texts = tok.batch_decode(p_ids, skip_special_tokens=True)
    log_z = torch.tensor([next(z for q, z in log_z_of.items() if q in t) for t in texts])
    reward = torch.tensor(
        [float(sum(int(i) for i, k in zip(row, msk) if k) % 2 == 0) for row, msk in zip(c_ids, c_mask)]
    )
    policy = copy.deepcopy(start).train()  # the policy before the step (start is a copy made before training)
    assert all(torch.equal(p, before[k]) for k, p in policy.named_parameters() if k in before)
    with torch.no_grad():
        ref = seq_logp(start)
    delta = log_z + seq_logp(policy) - ref - beta * reward
    loss = (delta**2).mean()
    loss.backward()
    grads = {k: p.grad for k, p in policy.named_parameters() if p.grad is not None}
    norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads.values()))
    logged = next(h for h in trainer.state.log_history if "loss" in h)
    # float32 gradients summed in another order than transformers' clip_grad_norm_: rounding ~1e-7 relative
    assert logged["grad_norm"] == pytest.approx(float(norm), rel=1e-5)
    assert float(norm) > 10 * max_norm  # the clip is active
    scale = lr * min(1.0, max_norm / float(norm))
    after = dict(trainer.model.named_parameters())
    moved = [k for k in grads if k in after]
    assert moved
    for k in moved:
        got, want = after[k].detach() - before[k], -scale * grads[k]
        # 1e-4 of the update, plus two float32 ulps of the weight (the rounding of w + update)
        bound = 1e-4 * want.abs() + 2.4e-7 * before[k].abs() + 1e-12
        assert bool(((got - want).abs() <= bound).all()), (k, float((got - want).abs().max()))


def test_the_kl_bound_warns_beyond_every_tilted_target_and_not_at_it():
    m = _monitor(patience=3, kl_bound=2.0)
    _feed(m, "kl_ref_seq", [0.0, 1.8, 2.1, 2.5, 3.0, 7.6])
    assert [(w["kind"], w["step"]) for w in m.warnings] == [("kl", 5)]
    m = _monitor(patience=2, kl_bound=2.0)
    _feed(m, "kl_ref_seq", [2.0, 2.0, 2.0, float("nan"), float("nan")])  # at the bound: no; NaN: over it
    assert [(w["kind"], w["step"]) for w in m.warnings] == [("kl", 5)]
    m = _monitor(patience=1)  # no bound (not a tilted objective): never
    _feed(m, "kl_ref_seq", [50.0, 80.0])
    assert m.warnings == []


def test_the_default_kl_bound_is_tilt_beta_times_the_reward_scale_for_tilted_objectives(tmp_path):
    from tiltlab.llm.train.health import bounds_of
    from tiltlab.llm.train.online import TiltGRPOConfig

    def cfg(**kw):
        return TiltGRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **kw)

    assert bounds_of(cfg(objective="disa", tilt_beta=2.5, reward_scale=0.8)).kl_bound == pytest.approx(2.0)
    assert bounds_of(cfg(objective="flowrl", tilt_beta=2.0, reward_transform="affine")).kl_bound == 2.0
    assert bounds_of(cfg(objective="flowrl", tilt_beta=2.0)).kl_bound is None  # group_norm: r~ is not in [0, 1]
    assert bounds_of(cfg(objective="grpo")).kl_bound is None
    assert bounds_of(cfg(objective="grpo", health_kl_bound=4.0)).kl_bound == 4.0  # an explicit bound is kept
    with pytest.raises(ValueError, match="health_kl_bound must be > 0"):
        cfg(objective="disa", tilt_beta=2.0, health_kl_bound=0.0)


@pytest.mark.parametrize("key", ["residual/flip_frac", "residual/after_over_before"])
def test_overshoot_is_judged_from_either_statistic_alone(key):
    """A logger that records only one of the two flip statistics still gets the overshoot warning."""
    m = _monitor(patience=2)
    for i in (1, 2):
        m.observe(i, {"loss": 1.0, key: 3.0 if key.endswith("before") else 0.9})
    assert [w["kind"] for w in m.warnings] == ["overshoot"]


def test_every_health_field_reaches_the_bounds_away_from_its_default(tmp_path):
    from tiltlab.llm.train.health import HealthBounds, bounds_of
    from tiltlab.llm.train.online import TiltGRPOConfig

    args = TiltGRPOConfig(
        output_dir=str(tmp_path), use_cpu=True, report_to="none", objective="disa", tilt_beta=2.0,
        health_patience=5, health_residual_factor=4.0, health_grad_norm_factor=20.0, health_flip_frac=0.3,
        health_kl_bound=0.5,
    )  # fmt: skip
    assert bounds_of(args) == HealthBounds(
        patience=5, residual_factor=4.0, grad_norm_factor=20.0, flip_frac=0.3, kl_bound=0.5
    )
    assert HealthBounds(kl_bound=0.5).kl_bound == 0.5  # any positive bound, below 1 too


def test_the_diagnostics_figure_names_each_run_and_each_panel(tmp_path, monkeypatch):
    """The PNG's content, read from the figure as it is saved: one panel per quantity with its title, a log scale
    where a series spans decades, every run in the legend, and "not logged" where no run has the quantity."""
    import matplotlib.figure

    from tiltlab.llm.train.diagnose import PANELS, plot, read_results

    saved = []
    real = matplotlib.figure.Figure.savefig

    def keep(fig, *a, **kw):
        saved.append(fig)
        return real(fig, *a, **kw)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    a, b = _results(tmp_path, "run-a"), _results(tmp_path, "run-b")
    plot([("run-a", read_results(a)), ("run-b", read_results(b))], tmp_path / "d.png")
    (fig,) = saved
    axes = fig.axes
    assert [ax.get_title() for ax in axes] == [t for _, t, _ in PANELS]
    assert [t.get_text() for t in axes[0].get_legend().get_texts()] == ["run-a", "run-b"]
    by_key = dict(zip([k for k, _, _ in PANELS], axes))
    assert by_key["grad_norm"].get_yscale() == "log" and by_key["reward"].get_yscale() == "linear"
    assert [t.get_text() for t in by_key["kl_ref_seq"].texts] == ["not logged"]  # no run logged it
    assert len(by_key["loss"].lines) == 2 and list(by_key["loss"].lines[0].get_ydata()) == [0.5, 83.4]


def test_a_panel_with_a_zero_or_negative_value_stays_linear(tmp_path, monkeypatch):
    """Log scale only where every run's every value is > 0 (a zero grad norm, e.g. a step without signal, keeps
    the panel linear)."""
    import matplotlib.figure

    from tiltlab.llm.train.diagnose import PANELS, plot, read_results

    saved = []
    real = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda f, *a, **kw: (saved.append(f), real(f, *a, **kw)))
    a = read_results(_results(tmp_path, "run-a"))
    b = read_results(_results(tmp_path, "run-b"))
    b["steps"][0]["grad_norm"] = 0.0
    plot([("run-a", a), ("run-b", b)], tmp_path / "d.png")
    by_key = dict(zip([k for k, _, _ in PANELS], saved[0].axes))
    assert by_key["grad_norm"].get_yscale() == "linear" and by_key["loss"].get_yscale() == "log"
