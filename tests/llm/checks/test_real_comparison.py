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
    assert seen[0][0] == "/base" and seen[1] == ("/m/disa-3/policy", seen[0][1])


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
def _fake_experiment(monkeypatch, tmp_path, lift: dict[str, float], frozen=None, n_seeds=5, jobs=1):
    """Run both checks with Stage 1, training and evaluation replaced by fakes: each (arm, seed) gets
    its own per-prompt correct counts and answers; ``frozen``: an (arm, seed index) that did not train."""
    rows = _rows(4, 4)
    seeds = pool.seeds_for(0, n_seeds)
    calls = {"task": 0, "runs": [], "cores": set()}

    def fake_task(root, model_dir, seed):
        calls["task"] += 1
        from tiltlab.llm.prepare.run import write_rows

        write_rows(rows, root / "heldout.jsonl")
        return {"n_labelled": 320, "n_kept": 120, "n_train": 72, "n_heldout": 8, "mean_pass_all": 0.2,
                "mean_pass_train": 0.4, "stage1_dir": "s1", "train": "t", "heldout": str(root / "heldout.jsonl")}  # fmt: skip

    def fake_one_run(arm, task, root, seed, steps, core, start=None):
        calls["runs"].append((arm, seed))
        calls["cores"].add(core)
        i = seeds.index(seed)
        up = lift.get(arm, 0.0)
        correct = [min(8, max(0, round(8 * (0.3 + up) + (p + i) % 3 - 1))) for p in range(len(rows))]
        answers = [
            [3.0] * c if r["answer_format"] == "plain" else [2.0 * (1 + (j % (1 + int(up * 10) % 4))) for j in range(c)]
            for r, c in zip(rows, correct)
        ]
        out = {"arm": arm, "seed": seed, "eval": {"correct": correct, "answers": answers}}
        if arm != "base":
            out.update(trained=frozen != (arm, i), train_s=2.0, train_numbers={"steps": float(steps), "step_time": 3.0})
        return out

    patch_everywhere(monkeypatch, models, "resolve_model", lambda name, progress=True: str(tmp_path))
    monkeypatch.setattr("safetensors.torch.load_file", lambda path: {"w": 0})
    monkeypatch.setattr(C, "make_task", fake_task)
    monkeypatch.setattr(C, "one_run", fake_one_run)
    C.comparison_raw.cache_clear()
    try:
        with pool.seed_jobs(jobs):
            primary = C.real_model_comparison.__wrapped__(0, n_seeds=n_seeds, steps=2)
            secondary = C.real_model_vs_kl_grpo.__wrapped__(0, n_seeds=n_seeds, steps=2)
    finally:
        C.comparison_raw.cache_clear()
    return primary, secondary, calls, seeds


def test_both_checks_read_one_experiment_and_record_every_run(monkeypatch, tmp_path):
    lift = {"disa": 0.25, "flowrl": 0.05, "grpo_kl": 0.1, "grpo": 0.4}
    p, s, calls, seeds = _fake_experiment(monkeypatch, tmp_path, lift)
    assert calls["task"] == 1 and len(calls["runs"]) == 5 * 5  # base + 4 arms, 5 seeds, run once for both checks
    assert sorted(calls["runs"]) == sorted((a, x) for a in ("base", *C.ARMS) for x in seeds)
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
