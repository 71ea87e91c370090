"""The real-model comparison (``llm/checks/real_comparison.py``, a long check): its bookkeeping against
naive computations (the held-out split, a run's Mean@8 / pass@8 / coverage, the per-seed pairing, the
"it ran" flags, the two checks read from one experiment), with the engine-bound parts (Stage 1,
training, evaluation) replaced by fakes; the whole pipeline on SmolLM2 at a tiny budget is the
``slow`` test at the end."""

from __future__ import annotations

import importlib.metadata as md
import math
import random

import pytest

from tests.patching import patch_everywhere
from tiltlab.claims import registry
from tiltlab.claims.registry import Verdict
from tiltlab.llm.base import models
from tiltlab.llm.checks import real_comparison as C
from tiltlab.llm.disa import logz_head
from tiltlab.llm.experiments import pool
from tiltlab.paper_checks import catalog


def _rows(n_qa: int, n_multi: int) -> list[dict]:
    qa = [{"id": f"q{i}", "prompt": f"What is {i} + 1?", "answer": str(i + 1), "answer_format": "plain",
           "task": "arithmetic_qa"} for i in range(n_qa)]  # fmt: skip
    multi = [{"id": f"m{i}", "prompt": f"Name an even number below {10 + i}.", "answer": "2 4 6 8",
              "answer_format": "set", "task": "multi_answer"} for i in range(n_multi)]  # fmt: skip
    return [*qa, *multi]


# ------------------------------------------------------------------ held-out split
def test_split_heldout_takes_half_of_each_kind_and_keeps_the_rest_in_order():
    rows = _rows(30, 26)
    train, held = C.split_heldout(rows, 20, seed=3)
    assert len(held) == 20 and sum(r["task"] == "multi_answer" for r in held) == 10
    ids = [r["id"] for r in rows]
    assert sorted(r["id"] for r in train + held) == sorted(ids) and not {r["id"] for r in train} & {
        r["id"] for r in held
    }
    assert [r["id"] for r in train] == [i for i in ids if i in {r["id"] for r in train}]  # input order kept
    assert C.split_heldout(rows, 20, seed=3) == (train, held)  # seeded
    assert C.split_heldout(rows, 20, seed=4)[1] != held  # another seed, another split
    # naive: the same draws from random.Random per kind, in sorted kind order
    rng = random.Random("heldout-3")
    want = set(rng.sample([r["id"] for r in rows if r["task"] == "arithmetic_qa"], 10))
    want |= set(rng.sample([r["id"] for r in rows if r["task"] == "multi_answer"], 10))
    assert {r["id"] for r in held} == want


@pytest.mark.parametrize(("n_qa", "n_multi", "n", "match"), [(10, 30, 20, "only 10 selected arithmetic_qa"),
                         (30, 30, 21, "even"), (30, 30, 0, "positive"), (30, 0, 20, "two task kinds")])  # fmt: skip
def test_split_heldout_refuses_what_is_not_the_registered_split(n_qa, n_multi, n, match):
    with pytest.raises(ValueError, match=match):
        C.split_heldout(_rows(n_qa, n_multi), n, seed=0)


# ------------------------------------------------------------------ one run's metrics
def test_run_metrics_against_a_naive_computation():
    rows = _rows(2, 3)
    ev = {
        "correct": [8, 1, 3, 0, 8],
        "answers": [[3.0] * 8, [2.0], [2.0, 2.0, 4.0], [], [2.0, 4.0, 6.0, 8.0, 2.0, 4.0, 6.0, 8.0]],
    }
    m = C.run_metrics(ev, rows)
    assert m["mean8"] == pytest.approx((8 + 1 + 3 + 0 + 8) / 8 / 5, rel=1e-15)
    assert m["pass8"] == pytest.approx(4 / 5, rel=1e-15)  # one correct sample of 8 passes
    h = -(2 / 3) * math.log(2 / 3) - (1 / 3) * math.log(1 / 3)  # answers 2, 2, 4
    assert m["coverage"] == pytest.approx((math.exp(h) + 0.0 + 4.0) / 3, rel=1e-12)  # qa rows never count
    with pytest.raises(ValueError, match="4 evaluated prompts for 5"):
        C.run_metrics({"correct": ev["correct"][:4], "answers": ev["answers"][:4]}, rows)
    with pytest.raises(ValueError, match="no multi-answer prompt"):
        C.run_metrics({"correct": [1, 2], "answers": [[3.0], [4.0, 4.0]]}, rows[:2])


def test_graded_answers_are_what_the_reward_pays():
    qa = {"prompt": "What is 23 + 14? Answer with just the number.", "answer": "37", "answer_format": "plain"}
    got = C.graded_answers(qa, ["37", "23 + 14 = 37", "36", "35, 36, 37", "The answer is 37."])
    assert got == [37.0, 37.0, None, None, 37.0]
    multi = {"prompt": "Name a number between 10 and 30 that is divisible by 7. Answer with just the number.",
             "answer": "14 21 28", "answer_format": "set"}  # fmt: skip
    assert C.graded_answers(multi, ["14", "21", "15", "14, 21, 28", "28", "It is 21."]) == [
        14.0,
        21.0,
        None,
        None,
        28.0,
        21.0,
    ]


def test_one_run_evaluates_every_model_of_a_seed_with_one_sampling_seed(monkeypatch, tmp_path):
    """Common random numbers: the base model and every arm at training seed ``s`` sample with the same
    evaluation seed; two training seeds sample with different ones. FlowRL's policy is evaluated without
    its head."""
    seen = []
    monkeypatch.setattr(
        C, "train_in_process", lambda name, cfg, root, core: (f"/m/{name}", [{"loss": 1.0, "grad_norm": 1.0}])
    )
    monkeypatch.setattr(C, "weights_moved", lambda start, model: 1e-3)
    patch_everywhere(monkeypatch, logz_head, "policy_only_dir", lambda d: d + "/policy")
    monkeypatch.setattr(
        C,
        "eval_in_process",
        lambda model, held, seed, out, core: seen.append((model, seed)) or {"correct": [], "answers": []},
    )
    task = {"model_dir": "/base", "heldout": "h", "train": "t", "stage1_dir": "s1"}
    for s in (3, 4):
        for arm in ("base", *C.ARMS):
            C.one_run(arm, task, tmp_path, s, 1, None, start={"w": 0})
    seeds = {}
    for model, seed in seen:
        seeds.setdefault(seed, []).append(model)
    assert len(seeds) == 2 and all(len(v) == 5 for v in seeds.values())
    assert seen[0][0] == "/base" and seen[1] == (f"/m/disa-lr{C.LR:g}-3/policy", seen[0][1])


# ------------------------------------------------------------------ pairing, items, "it ran"
SEEDS = [0, 1, 2, 3, 4]


def _metrics(shift: dict[str, float]) -> dict:
    """``{arm: {seed: metrics}}`` with every (arm, seed, metric) its own value."""
    return {
        a: {s: {"mean8": 0.3 + shift.get(a, 0.0) + 0.01 * s, "pass8": 0.5 + shift.get(a, 0.0) - 0.02 * s,
                "coverage": 1.5 + 3 * shift.get(a, 0.0) + 0.05 * s * s} for s in SEEDS}
        for a in ("base", *C.ARMS)
    }  # fmt: skip


def test_items_pair_disa_with_the_named_arm_at_each_seed():
    m = _metrics({"disa": 0.1, "flowrl": 0.02, "grpo_kl": 0.07, "grpo": 0.2})
    m["flowrl"][3]["mean8"] += 0.5  # one seed's own value: a mispairing would move it
    (primary,) = C.items_for(m, SEEDS, C.PRIMARY)
    assert primary.name == "disa_minus_flowrl_mean8" and primary.kind == "effect" and primary.margin == C.MARGIN_ACC
    assert primary.values == tuple(m["disa"][s]["mean8"] - m["flowrl"][s]["mean8"] for s in SEEDS)
    sec = {i.name: i for i in C.items_for(m, SEEDS, C.SECONDARY)}
    for metric, margin in (("mean8", C.MARGIN_ACC), ("coverage", C.MARGIN_COVERAGE), ("pass8", C.MARGIN_ACC)):
        it = sec[f"disa_minus_grpo_kl_{metric}"]
        assert it.margin == margin
        assert it.values == tuple(m["disa"][s][metric] - m["grpo_kl"][s][metric] for s in SEEDS)


def test_the_items_are_the_ones_the_registry_declares():
    catalog.discover()
    for cid, names in (("disa.llm.real_model_training", C.PRIMARY), ("disa.llm.real_model_vs_kl_grpo", C.SECONDARY)):
        declared = registry.get_claim(cid).items_for("llm")
        m = _metrics({})
        got = {i.name: (i.kind, i.margin) for i in C.items_for(m, SEEDS, names)}
        assert got == {n: (d.kind, d.margin) for n, d in declared.items()}, cid


def _raw(m: dict, trained=None) -> dict:
    """A ``comparison_raw`` result whose runs give the metrics ``m`` (evaluations built to match)."""
    rows = _rows(2, 2)
    runs = {}
    for a in ("base", *C.ARMS):
        for s in SEEDS:
            run = {"eval": _eval_with(m[a][s])}
            if a != "base":
                run.update(trained=(trained or {}).get((a, s), True), train_s=1.0, train_numbers={"steps": 2.0})
            runs[(a, s)] = run
    return {"held": rows, "seeds": SEEDS, "runs": runs, "steps": 2, "task": {"n_train": 5}, "task_s": 1.0}


def _eval_with(metrics: dict) -> dict:
    return {"_metrics": metrics}


@pytest.fixture
def metrics_from_eval(monkeypatch):
    monkeypatch.setattr(C, "run_metrics", lambda ev, rows, k=C.EVAL_K: ev["_metrics"])


@pytest.mark.parametrize("odd", [("disa", 0), ("flowrl", 2), ("grpo_kl", 4), ("grpo", 1)])
def test_ran_flags_need_every_run_trained(odd, metrics_from_eval):
    m = _metrics({"disa": 0.1, "flowrl": 0.02, "grpo_kl": 0.07, "grpo": 0.2})
    assert C.ran_flags(_raw(m), m) == {"ran_all_trained": True, "ran_accuracy_moved": True}
    assert C.ran_flags(_raw(m, {odd: False}), m)["ran_all_trained"] is False


@pytest.mark.parametrize("arm", C.ARMS)
def test_ran_flags_need_every_run_to_leave_its_base_model(arm, metrics_from_eval):
    """Every training run's held-out Mean@8 must differ from the untrained model's at its seed: one run
    of one arm that did not move is enough to make the run inconclusive (any-seed was too weak)."""
    m = _metrics({a: 0.05 for a in C.ARMS})
    for s in SEEDS:
        m[arm][s]["mean8"] = m["base"][s]["mean8"] + 1 / 384  # one held-out sample at each seed: moved
    assert C.ran_flags(_raw(m), m)["ran_accuracy_moved"] is True
    m[arm][SEEDS[2]]["mean8"] = m["base"][SEEDS[2]]["mean8"]  # one run of one arm did not move
    assert C.ran_flags(_raw(m), m)["ran_accuracy_moved"] is False
    for a in C.ARMS:  # ... whatever the other arms and seeds did
        for s in SEEDS:
            if (a, s) != (arm, SEEDS[2]):
                m[a][s]["mean8"] += 0.1
    assert C.ran_flags(_raw(m), m)["ran_accuracy_moved"] is False


# ------------------------------------------------------------------ the whole check, engines faked
BEST_LR = {"disa": 1e-5, "flowrl": 3e-6, "grpo_kl": 3e-5, "grpo": 1e-4}
"""The fake tuning optimum of each arm (every arm a different one, none the grid's first)."""


def _fake_experiment(monkeypatch, tmp_path, lift: dict[str, float], frozen=None, n_seeds=5, jobs=1, spread=1):
    """Run both checks with Stage 1, training and evaluation replaced by fakes, on a store in ``tmp_path``:
    each (arm, seed) gets its own per-prompt correct counts and answers; a tuning run's Mean@8 peaks at its
    arm's :data:`BEST_LR`, a final run gets its arm's ``lift`` only at that rate; ``frozen``: an (arm, seed
    index) that did not train; ``spread``: the per-seed swing of the counts; ``n_seeds=None``: sized by the
    power rule."""
    rows = _rows(4, 4)
    train = _rows(30, 30)
    for r in train:
        r["id"] = "t" + r["id"]
    seeds = pool.seeds_for(0, C.N_MAX)
    calls = {"task": 0, "runs": [], "cores": set()}

    def fake_task(root, model_dir, seed):
        calls["task"] += 1
        from tiltlab.llm.prepare.run import write_rows

        write_rows(rows, root / "heldout.jsonl")
        write_rows(train, root / "train.jsonl")
        (root / "stage1").mkdir()
        return {"n_labelled": 320, "n_kept": 120, "n_train": 60, "n_heldout": 8, "mean_pass_all": 0.2,
                "mean_pass_train": 0.4, "stage1_dir": str(root / "stage1"), "train": str(root / "train.jsonl"),
                "heldout": str(root / "heldout.jsonl")}  # fmt: skip

    def fake_one_run(arm, task, root, seed, steps, core, start=None, lr=C.LR, eval_on="heldout"):
        calls["runs"].append((eval_on, arm, seed, lr))
        calls["cores"].add(core)
        n = len(rows) if eval_on == "heldout" else C.N_TUNE
        if eval_on == "tune":
            up = 0.0 if arm == "base" else 0.3 - 0.3 * abs(math.log10(lr) - math.log10(BEST_LR[arm]))
            i = C.TUNE_SEEDS.index(seed)
        else:
            up = lift.get(arm, 0.0) if arm == "base" or lr == BEST_LR[arm] else -0.2
            i = seeds.index(seed)
        j = i * (1 + (arm == "disa") * (spread > 1))  # spread > 1: DISA's swing is not FlowRL's (sd > 0)
        correct = [
            min(8, max(0, round(8 * (0.3 + up) + spread * ((p + j) % 3 - 1) + (spread > 1) * (j % 2))))
            for p in range(n)
        ]
        fmts = ["plain"] * (n // 2) + ["set"] * (n - n // 2)
        answers = [
            [3.0] * c if f == "plain" else [2.0 * (1 + (j % (1 + int(up * 10) % 4))) for j in range(c)]
            for f, c in zip(fmts, correct)
        ]
        out = {"arm": arm, "seed": seed, "eval": {"correct": correct, "answers": answers}}
        if arm != "base":
            out.update(trained=frozen != (arm, i), train_s=2.0, train_numbers={"steps": float(steps), "step_time": 3.0})
        return out

    patch_everywhere(monkeypatch, models, "resolve_model", lambda name, progress=True: str(tmp_path))
    monkeypatch.setattr("safetensors.torch.load_file", lambda path: {"w": 0})
    monkeypatch.setattr(C, "make_task", fake_task)
    monkeypatch.setattr(C, "one_run", fake_one_run)
    store = tmp_path / f"store-{jobs}-{n_seeds}-{spread}-{frozen}"
    monkeypatch.setattr(C, "default_store", lambda: store)
    C.comparison_raw.cache_clear()
    try:
        with pool.seed_jobs(jobs):
            primary = C.real_model_comparison.__wrapped__(0, n_seeds=n_seeds, steps=2)
            secondary = C.real_model_vs_kl_grpo.__wrapped__(0, n_seeds=n_seeds, steps=2)
    finally:
        C.comparison_raw.cache_clear()
    n = len(primary.evidence["raw"]["runs"]) // 5
    return primary, secondary, calls, seeds[:n]


def test_both_checks_read_one_experiment_and_record_every_run(monkeypatch, tmp_path):
    lift = {"disa": 0.25, "flowrl": 0.05, "grpo_kl": 0.1, "grpo": 0.4}
    p, s, calls, seeds = _fake_experiment(monkeypatch, tmp_path, lift)
    final = [c for c in calls["runs"] if c[0] == "heldout"]
    assert calls["task"] == 1 and len(final) == 5 * 5  # base + 4 arms, 5 seeds, run once for both checks
    assert sorted((a, x) for _, a, x, _ in final) == sorted((a, x) for a in ("base", *C.ARMS) for x in seeds)
    assert all(lr == BEST_LR[a] for _, a, _, lr in final if a != "base")  # every arm at its own tuned rate
    for res, names in ((p, C.PRIMARY), (s, C.SECONDARY)):
        items = {i["name"]: i for i in res.evidence["items"]}
        assert set(items) == set(names)
        assert res.evidence["unit"] == "training run"
        raw = res.evidence["raw"]
        assert len(raw["runs"]) == 25 and raw["heldout_ids"] == [f"q{i}" for i in range(4)] + [
            f"m{i}" for i in range(4)
        ]
        assert all(len(r["correct"]) == 8 and len(r["answers"]) == 8 for r in raw["runs"])
    # per-seed numbers equal run_metrics on that run's raw values
    raw = {(r["arm"], r["seed"]): r for r in p.evidence["raw"]["runs"]}
    held = _rows(4, 4)
    for arm in ("base", *C.ARMS):
        for x in seeds:
            m = C.run_metrics({"correct": raw[(arm, x)]["correct"], "answers": raw[(arm, x)]["answers"]}, held)
            for k in ("mean8", "pass8", "coverage"):
                assert p.numbers[f"{arm}_s{x}_{k}"] == pytest.approx(m[k], rel=1e-15)
    d = [p.numbers[f"disa_s{x}_mean8"] - p.numbers[f"flowrl_s{x}_mean8"] for x in seeds]
    assert tuple(next(i for i in p.evidence["items"])["values"]) == pytest.approx(tuple(d), rel=1e-15)
    assert p.verdict is Verdict.VERIFIED and p.items["disa_minus_flowrl_mean8_supports"]
    assert s.numbers["disa_minus_grpo_kl_mean8"] > 0.02


def test_a_run_that_did_not_train_leaves_both_checks_inconclusive(monkeypatch, tmp_path):
    lift = {"disa": 0.25, "flowrl": 0.05, "grpo_kl": 0.1, "grpo": 0.4}
    p, s, *_ = _fake_experiment(monkeypatch, tmp_path, lift, frozen=("grpo", 3))
    assert not p.items["ran_all_trained"] and p.verdict is Verdict.INCONCLUSIVE
    assert s.verdict is Verdict.INCONCLUSIVE


def test_the_paper_losing_is_refuted_with_the_same_rule(monkeypatch, tmp_path):
    p, *_ = _fake_experiment(monkeypatch, tmp_path, {"disa": 0.05, "flowrl": 0.3, "grpo_kl": 0.1, "grpo": 0.2})
    assert p.verdict is Verdict.REFUTED and p.items["disa_minus_flowrl_mean8_against"]


def test_two_jobs_give_the_same_result_on_two_cores(monkeypatch, tmp_path):
    lift = {"disa": 0.25, "flowrl": 0.05, "grpo_kl": 0.1, "grpo": 0.4}
    p1, s1, c1, _ = _fake_experiment(monkeypatch, tmp_path, lift, jobs=1)
    p2, s2, c2, _ = _fake_experiment(monkeypatch, tmp_path, lift, jobs=2)
    assert c1["cores"] == {None} and c2["cores"] == {0, 1}
    timed = {"task_s"}  # wall time, the one number that may differ
    drop = lambda d: {k: v for k, v in d.items() if k not in timed}
    assert drop(p1.numbers) == drop(p2.numbers) and p1.evidence == p2.evidence and s1.evidence == s2.evidence


# ------------------------------------------------------------------ configs
def test_arm_configs_differ_only_where_the_arms_do(tmp_path):
    task = {"train": "t.jsonl", "stage1_dir": "s1"}
    c = {a: C.train_config(a, task, tmp_path / a, seed=7, steps=5) for a in C.ARMS}
    assert c["disa"]["tilt_beta"] == c["flowrl"]["tilt_beta"] == C.BETA
    assert c["grpo_kl"]["objective"] == c["grpo"]["objective"] == "grpo"
    kl = c["grpo_kl"]["trl"]
    assert kl["beta"] == C.KL_COEF == 1 / C.BETA and kl["kl_in_reward"] is True
    assert kl["scale_rewards"] == "none" and kl["loss_type"] == "dr_grpo"
    assert c["grpo"]["trl"]["beta"] == 0.0 and "kl_in_reward" not in c["grpo"]["trl"]
    shared = ("learning_rate", "num_generations", "max_completion_length", "max_steps", "seed", "temperature",
              "per_device_train_batch_size", "use_vllm", "vllm_mode")  # fmt: skip
    for k in shared:
        assert len({repr(c[a]["trl"][k]) for a in C.ARMS}) == 1, k
    assert c["disa"]["trl"]["learning_rate"] == C.LR and c["disa"]["trl"]["max_steps"] == 5
    with pytest.raises(ValueError, match="arm must be one of"):
        C.train_config("ppo", task, tmp_path, 0, 1)


@pytest.mark.slow
@pytest.mark.vllm
def test_whole_check_at_a_tiny_budget(monkeypatch):
    """Stage 1, selection, 1 step per arm and seed, evaluation: SmolLM2 + vLLM end to end."""
    from tiltlab.llm.base.models import MODEL_ALIASES

    try:
        md.distribution(MODEL_ALIASES[C.ALIAS].distribution)
    except md.PackageNotFoundError:
        pytest.skip(f"needs `{MODEL_ALIASES[C.ALIAS].install}`")
    pytest.importorskip("vllm")
    for k, v in (("N_QA", 24), ("N_MULTI", 24), ("N_HELDOUT", 4), ("EVAL_K", 2)):
        monkeypatch.setattr(C, k, v)
    C.comparison_raw.cache_clear()
    try:
        res = C.real_model_comparison(0, n_seeds=2, steps=1)
    finally:
        C.comparison_raw.cache_clear()
    assert res.verdict in set(Verdict) and res.items["ran_all_trained"], res.summary
    assert res.numbers["n_heldout_prompts"] == 4 and len(res.evidence["raw"]["runs"]) == 2 * 5


@pytest.mark.parametrize("arm", C.ARMS)
def test_each_arm_config_passes_the_trainers_own_validation(arm, tmp_path, capsys):
    """What the long run would launch: each arm's config through ``tiltlab llm train --dry-run`` and the
    trainer's config class (its cross-field checks: kl_in_reward with grpo and beta > 0, batch sizes)."""
    yaml = pytest.importorskip("yaml")
    import json

    from tiltlab.cli import main
    from tiltlab.llm.prepare.run import write_rows
    from tiltlab.llm.train.config import load_run_config
    from tiltlab.llm.train.online import TiltGRPOConfig

    rows = [{**r, "log_z": -1.0, "ref_pass_rate": 0.5} for r in _rows(3, 3)]
    write_rows(rows, tmp_path / "train.jsonl")
    s1 = tmp_path / "s1"
    task = {"train": str(tmp_path / "train.jsonl"), "stage1_dir": str(s1)}
    cfg = C.train_config(arm, task, tmp_path / "out", seed=0, steps=2)
    if arm == "disa":  # the Stage-1 manifest is checked by the run, not here: read the labels from the column
        cfg.pop("disa")
    path = tmp_path / f"{arm}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["llm", "train", "--config", str(path), "--dry-run"]) == 0, capsys.readouterr().err
    printed = json.loads(capsys.readouterr().out)
    assert printed["objective"] == cfg["objective"]
    kw = load_run_config(path).trainer_kwargs()
    kw.update(use_cpu=True, report_to="none", output_dir=str(tmp_path / "o"), use_vllm=False)
    args = TiltGRPOConfig(**kw)
    assert args.kl_in_reward is (arm == "grpo_kl") and args.beta == (C.KL_COEF if arm == "grpo_kl" else 0.0)


def test_the_evaluation_worker_starts_in_its_own_process(monkeypatch, tmp_path):
    """The command :func:`eval_in_process` builds reaches ``main`` (the module run with ``-m`` would
    register its checks twice and die before evaluating anything): run for real with ``--help``."""
    real, seen = C._python, {}

    def probe(args, core):
        seen["args"], seen["core"] = args, core
        res = real([*args[:2], "eval", "--help"], core)
        assert res.returncode == 0, res.stderr[-2000:]
        assert "heldout" in res.stdout and "seed" in res.stdout
        (tmp_path / "out.json").write_text('{"correct": [1], "answers": [[3.0]]}')
        return res

    monkeypatch.setattr(C, "_python", probe)
    got = C.eval_in_process("MODEL", "held.jsonl", 7, tmp_path / "out.json", core=1)
    assert got == {"correct": [1], "answers": [[3.0]]}
    assert seen["args"][2:] == ["eval", "MODEL", "held.jsonl", "7", str(tmp_path / "out.json")] and seen["core"] == 1


def test_python_binds_vllm_to_the_runs_core(monkeypatch):
    import subprocess

    seen = {}
    monkeypatch.setattr(subprocess, "run", lambda argv, env, capture_output, text: seen.update(argv=argv, env=env))
    C._python(["-c", "pass"], core=1)
    assert seen["env"]["VLLM_CPU_OMP_THREADS_BIND"] == "1" and seen["env"]["OMP_NUM_THREADS"] == str(pool.CHECK_THREADS)
    C._python(["-c", "pass"], core=None)
    assert seen["env"].get("VLLM_CPU_OMP_THREADS_BIND") == __import__("os").environ.get("VLLM_CPU_OMP_THREADS_BIND")


# ------------------------------------------------------------------ the record re-derives from its raw values
def test_the_record_of_a_run_re_derives_from_its_raw_values(monkeypatch, tmp_path):
    """The check's items and per-run metrics follow from the per-prompt values it records, through the
    re-derivation it registers (what ``tiltlab report --rejudge`` runs); one changed count is found."""
    import copy

    from tiltlab.claims import rejudge

    lift = {"disa": 0.25, "flowrl": 0.05, "grpo_kl": 0.1, "grpo": 0.4}
    p, s, _, seeds = _fake_experiment(monkeypatch, tmp_path, lift)
    catalog.discover()
    for res, cid in ((p, "disa.llm.real_model_training"), (s, "disa.llm.real_model_vs_kl_grpo")):
        chk = next(c for c in registry.checks() if c.claim_id == cid and c.name == C.CHECK_NAME)
        assert chk.rederive is C.rederive
        registry.check_evidence(chk, res)  # the run-time guard: its record would re-derive
        row = {"claim": cid, "layer": "llm", "check": C.CHECK_NAME, "verdict": res.verdict.value,
               "items": res.items, "numbers": res.numbers, "evidence": copy.deepcopy(res.evidence)}  # fmt: skip
        out = rejudge.rejudge_row(row, C.rederive)
        assert (out["status"], out["from"]) == ("same", "raw values"), out["differences"]
        assert res.evidence["raw"]["answer_formats"] == ["plain"] * 4 + ["set"] * 4
        run = next(r for r in row["evidence"]["raw"]["runs"] if r["arm"] == "disa" and r["seed"] == seeds[1])
        i = next(i for i, c in enumerate(run["correct"]) if 0 < c < 8)
        run["correct"][i] -= 1
        bad = rejudge.rejudge_row(row, C.rederive)
        assert [d.split(":")[0] for d in bad["differences"]][:2] == [
            f"evidence.items.{res.evidence['items'][0]['name']}.values[1]",
            f"numbers.disa_s{seeds[1]}_mean8",
        ]
        # a record that kept only the ids: these fake ids (q*, m*) are not the task's, so no format is guessed
        del row["evidence"]["raw"]["answer_formats"]
        out = rejudge.rejudge_row(row, C.rederive)
        assert out["differences"][0].startswith(
            "evidence.raw: recorded 'kept', re-derived \"not re-derivable (ValueError"
        )


def test_answer_format_of_id_is_what_the_task_makers_write():
    from tiltlab.llm.base.tasks import answer_format_of_id, multi_answer_tasks, qa_tasks

    rows = qa_tasks(40, difficulty=[1, 2, 3], seed=5) + multi_answer_tasks(40, seed=5)
    assert {r["answer_format"] for r in rows} == {"plain", "set"}
    assert all(answer_format_of_id(r["id"]) == r["answer_format"] for r in rows)
    with pytest.raises(ValueError, match="not one of"):
        answer_format_of_id("m1")


# ------------------------------------------------------------------ the tuned protocol (issue 52 item 3)
def _grid(f) -> dict:
    return {a: {lr: [f(a, lr, s) for s in C.TUNE_SEEDS] for lr in C.TUNE_LRS} for a in C.ARMS}


def test_choose_is_the_best_mean_over_tuning_seeds_with_ties_to_the_smaller_rate():
    rng = random.Random(5)
    for _ in range(200):
        g = _grid(lambda a, lr, s: rng.choice([0.1, 0.2, 0.3, 0.4]))
        got = C.choose(g)
        for a in C.ARMS:  # naive: sort by (mean desc, lr asc)
            best = sorted(C.TUNE_LRS, key=lambda lr: (-(g[a][lr][0] + g[a][lr][1]) / 2, lr))[0]
            assert got[a] == best
    g = _grid(lambda a, lr, s: 0.2)
    assert set(C.choose(g).values()) == {min(C.TUNE_LRS)}  # an all-way tie: the smallest rate
    g["disa"][1e-5] = [0.9, 0.0]  # mean 0.45 beats 0.2 although one seed is 0
    assert C.choose(g)["disa"] == 1e-5


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda g: g["flowrl"].pop(1e-4), "flowrl: the choice needs"),
        (lambda g: g["grpo"][1e-6].pop(), "grpo: the choice needs"),
        (lambda g: g.pop("grpo_kl"), "grpo_kl: the choice needs"),
        (lambda g: g["disa"][3e-6].__setitem__(0, math.nan), "not finite"),
    ],
)
def test_choose_refuses_an_incomplete_or_broken_grid(edit, match):
    g = _grid(lambda a, lr, s: 0.2)
    edit(g)
    with pytest.raises(ValueError, match=match):
        C.choose(g)


def test_every_arm_gets_the_same_tuning_runs_and_fresh_final_seeds():
    plan = C.tuning_plan()
    per_arm = {a: sorted((lr, s) for _, arm, s, lr in plan if arm == a) for a in C.ARMS}
    want = sorted((lr, s) for lr in C.TUNE_LRS for s in C.TUNE_SEEDS)
    assert all(v == want for v in per_arm.values()) and len(want) == 10
    assert sorted(s for _, a, s, _ in plan if a == "base") == sorted(C.TUNE_SEEDS)
    assert len({k for k, *_ in plan}) == len(plan) == 42
    final = C.final_plan(0, {a: 1e-5 for a in C.ARMS}, C.N_MAX)
    assert not {s for _, _, s, _ in final} & set(C.TUNE_SEEDS) and len(final) == 5 * C.N_MAX
    assert [k for k, a, s, _ in final[:5]] == ["final-base-s0", *(f"final-{a}-lr1e-05-s0" for a in C.ARMS)]
    with pytest.raises(ValueError, match="is a tuning seed"):
        C.final_plan(90, {a: 1e-5 for a in C.ARMS}, 1)
    with pytest.raises(ValueError, match="no chosen learning rate"):
        C.final_plan(0, {"disa": 1e-5}, 2)


def test_the_tuning_split_is_disjoint_from_the_held_out_prompts_and_keeps_the_rest():
    rows = _rows(30, 30)
    train, held = C.split_heldout(rows, 8, seed=0)
    fit, tune = C.split_heldout(train, C.N_TUNE, seed=0, salt="tune")
    ids = lambda rs: [r["id"] for r in rs]
    assert not set(ids(tune)) & set(ids(held)) and not set(ids(fit)) & set(ids(tune))
    assert sorted(ids(fit) + ids(tune)) == sorted(ids(train)) and len(tune) == C.N_TUNE
    assert sum(r["task"] == "multi_answer" for r in tune) == C.N_TUNE // 2
    assert ids(fit) == [i for i in ids(train) if i not in set(ids(tune))]  # the rest in input order
    # the salt matters: the tuning split is not the held-out split's draw again
    assert ids(C.split_heldout(train, C.N_TUNE, seed=0)[1]) != ids(tune)


def test_power_is_the_noncentral_t_and_matches_a_simulation():
    n, sd = 10, 0.05
    crit = C.stats.t_quantile(1 - C.rules.ALPHA / 2, n - 1)
    rng = random.Random(0)
    hits, sims = 0, 20000
    for _ in range(sims):
        d = [rng.gauss(C.POWER_DELTA, sd) for _ in range(n)]
        mu = sum(d) / n
        s = math.sqrt(sum((x - mu) ** 2 for x in d) / (n - 1))
        hits += (mu - C.MARGIN_ACC) / (s / math.sqrt(n)) > crit
    assert abs(C.power(n, sd) - hits / sims) < 4 * math.sqrt(0.25 / sims)  # 4 binomial sd
    assert C.power(20, sd) > C.power(10, sd) > C.power(10, 2 * sd)
    assert C.power(5, 0.0) == 1.0 and C.power(5, 0.0, delta=C.MARGIN_ACC) == 0.0
    for bad in (math.nan, -0.1):
        with pytest.raises(ValueError, match="sd must be"):
            C.power(5, bad)


def test_n_final_is_the_fewest_runs_with_the_power_or_the_cap():
    for sd in (0.01, 0.03, 0.05, 0.07):
        n, pw = C.n_final(sd)
        assert C.N_PILOT <= n <= C.N_MAX and pw == C.power(n, sd)
        if pw >= C.POWER_TARGET and n > C.N_PILOT:
            assert C.power(n - 1, sd) < C.POWER_TARGET
    assert C.n_final(1e-4)[0] == C.N_PILOT
    n, pw = C.n_final(0.2)
    assert n == C.N_MAX and pw < C.POWER_TARGET


def test_pilot_sd_is_the_sample_sd_of_the_paired_primary_values():
    m = _metrics({"disa": 0.1})
    m["disa"][2]["mean8"] += 0.07
    d = [m["disa"][s]["mean8"] - m["flowrl"][s]["mean8"] for s in SEEDS]
    mu = sum(d) / len(d)
    assert C.pilot_sd(m, SEEDS) == pytest.approx(math.sqrt(sum((x - mu) ** 2 for x in d) / 4), rel=1e-12)
    with pytest.raises(ValueError, match="at least 2"):
        C.pilot_sd(m, SEEDS[:1])


def test_a_sized_run_takes_the_power_rules_size_and_re_derives_it(monkeypatch, tmp_path):
    from tiltlab.claims import rejudge

    lift = {"disa": 0.25, "flowrl": 0.05, "grpo_kl": 0.1, "grpo": 0.4}
    p, _, _, seeds = _fake_experiment(monkeypatch, tmp_path, lift, n_seeds=None, spread=2)
    m = C.per_run_metrics({**_fake_raw_of(p), "seeds": seeds})
    sd = C.pilot_sd(m, seeds[: C.N_PILOT])
    assert len(seeds) == C.n_final(sd)[0] == p.numbers["power_rule_n"] and sd > 0
    assert p.numbers["pilot_sd"] == pytest.approx(sd, rel=1e-12)
    assert {a: p.numbers[f"{a}_chosen_lr"] for a in C.ARMS} == BEST_LR
    row = {"claim": "disa.llm.real_model_training", "layer": "llm", "check": C.CHECK_NAME, "verdict": p.verdict.value,
           "items": p.items, "numbers": p.numbers, "evidence": p.evidence}  # fmt: skip
    assert rejudge.rejudge_row(row, C.rederive)["status"] == "same"
    import copy

    bad = copy.deepcopy(row)  # one final run at a rate that was not chosen: the record does not re-derive
    next(r for r in bad["evidence"]["raw"]["runs"] if r["arm"] == "flowrl")["lr"] = 1e-4
    assert "not its chosen" in " ".join(rejudge.rejudge_row(bad, C.rederive)["differences"])
    bad = copy.deepcopy(row)  # a tuning count changed so another rate wins: the choice re-derives differently
    for r in bad["evidence"]["raw"]["tuning"]:
        if r["arm"] == "disa" and r["lr"] == 1e-6:
            r["correct"] = [8] * len(r["correct"])
    assert rejudge.rejudge_row(bad, C.rederive)["status"] != "same"


def _fake_raw_of(res) -> dict:
    """The per-run metrics input of :func:`C.per_run_metrics` rebuilt from a result's recorded values."""
    raw = res.evidence["raw"]
    held = [{"id": i, "answer_format": f} for i, f in zip(raw["heldout_ids"], raw["answer_formats"])]
    runs = {(r["arm"], r["seed"]): {"eval": {"correct": r["correct"], "answers": r["answers"]}} for r in raw["runs"]}
    return {"held": held, "runs": runs}


def test_shards_run_each_run_once_across_sittings_and_the_final_phase_waits(monkeypatch, tmp_path, capsys):
    """Three sittings of two tuning shards (one cut short by --max-runs) store each tuning run once; the
    final phase is refused before every tuning run is stored, then runs the pilot first."""
    _ = _fake_experiment(monkeypatch, tmp_path / "ref", {"disa": 0.25}, n_seeds=None)  # sets the fakes
    calls = []
    real = C.one_run
    monkeypatch.setattr(C, "one_run", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    store = tmp_path / "shards"
    argv = ["--store", str(store), "--jobs", "1"]
    assert C.main(["run", "--phase", "tune", "--shard", "0/2", "--max-runs", "5", *argv]) == 0
    assert "5 run(s) stored this sitting, 16 of its 21 left" in capsys.readouterr().out
    with pytest.raises(ValueError, match="the final runs need every tuning run first: 37 missing"):
        C.main(["run", "--phase", "final", *argv])
    assert C.main(["run", "--phase", "tune", "--shard", "1/2", *argv]) == 0
    assert C.main(["run", "--phase", "tune", "--shard", "0/2", *argv]) == 0
    assert len(calls) == 42 and len(set(C.RunStore(store).keys())) == 42
    C.main(["status", "--store", str(store)])
    assert "tuning: 42/42 runs stored" in capsys.readouterr().out
    assert C.main(["run", "--phase", "final", *argv]) == 0
    assert len(calls) == 42 + 5 * C.N_PILOT
    stored = C.RunStore(store).runs()
    assert all(r["commit_sha"] and r["machine"]["cpus"] and r["run_at"] for r in stored.values())
    assert {r["lr"] for r in stored.values() if r["phase"] == "final" and r["arm"] == "disa"} == {BEST_LR["disa"]}
    for bad in ("2/2", "x", "1"):
        with pytest.raises(SystemExit):
            C.main(["run", "--phase", "tune", "--shard", bad, *argv])


def test_the_sitting_entry_point_runs_as_a_module(tmp_path):
    """``python -m tiltlab.llm.checks.comparison_run status`` (the documented entry) starts and reads a store."""
    import subprocess
    import sys

    res = subprocess.run(
        [sys.executable, "-m", "tiltlab.llm.checks.comparison_run", "status", "--store", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.startswith("tuning: 0/42 runs stored\nfinal: not yet (the final runs need every tuning run first")


def test_the_documented_sitting_commands_run_as_written(monkeypatch, tmp_path, capsys):
    """docs/llm-checks.md's sitting commands, as written, through the entry's parser and its dispatch;
    the training runs themselves (hours) are recorded, not run; ``status`` reads the checkout's store."""
    import re
    import shlex
    from pathlib import Path

    text = (Path(__file__).resolve().parents[3] / "docs" / "llm-checks.md").read_text(encoding="utf-8")
    m = re.search(
        r"<!-- comparison-sittings:start -->\s*```bash\n(.*?)```\s*<!-- comparison-sittings:end -->", text, re.S
    )
    assert m, "docs/llm-checks.md lost its sitting commands"
    lines = [ln for ln in m.group(1).splitlines() if ln.strip()]
    prefix = ["python", "-m", "tiltlab.llm.checks.comparison_run"]
    seen = []
    patch_everywhere(monkeypatch, models, "resolve_model", lambda name, progress=True: str(tmp_path))
    monkeypatch.setattr("safetensors.torch.load_file", lambda path: {"w": 0})
    monkeypatch.setattr(C, "ensure_task", lambda store, model_dir, seed: {"seed": seed})
    plan = [(f"k{i}", "disa", i, 1e-5) for i in range(30)]
    monkeypatch.setattr(C, "shard_plan", lambda store, phase, seed: plan)
    monkeypatch.setattr(
        C, "run_missing", lambda st, mine, task, steps, jobs, start, **kw: seen.append((len(mine), jobs, kw)) or []
    )
    for ln in lines:
        argv = shlex.split(ln)
        assert argv[:3] == prefix, ln
        assert C.main(argv[3:]) == 0, ln
    out = capsys.readouterr().out
    assert re.search(r"^tuning: \d+/42 runs stored$", out, re.M)
    assert [(n, j, kw["max_runs"]) for n, j, kw in seen] == [(15, 2, None), (15, 2, 10), (30, 2, None)]
    assert all(kw["verify"] for *_, kw in seen)  # the checkout's own store: every run must prove its registration
