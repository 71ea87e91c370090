"""DISA against FlowRL and a same-optimum GRPO on a real pretrained model; the training run is the unit.

SmolLM2-135M-Instruct, ``tiltlab llm train`` with colocated vLLM on CPU, as users run it. A *long*
check (:attr:`~tiltlab.claims.registry.Check.long`): about two hours on 2 cores, outside the
llm layer's run (``tiltlab check --layer llm --long --check smollm2_135m_comparison``).

1. **Task.** :data:`N_QA` plain-answer questions (``synthetic:qa``) and :data:`N_MULTI` questions
   with several correct answers (``synthetic:multi``: "Name a prime number between 10 and 18",
   answers 11, 13, 17), where matching ``pi_ref e^{beta r} / Z`` keeps ``pi_ref``'s
   spread over the correct answers and maximising reward need not. Stage 1 with ``q = pi_ref``
   (:data:`SELECT_M` samples, vLLM) labels each prompt (``log Z_hat``) and gives its pass rate; the
   prompts with pass rate in ``[MIN_PASS, MAX_PASS]`` are kept and split, per task kind, into
   :data:`N_HELDOUT` held-out prompts (half of each kind) and the training prompts (seeded by the check seed).
2. **Arms** (:data:`ARMS`), each trained :data:`N_SEEDS` times (training seed ``s``; every arm sees the
   same prompt order at the same ``s``), :data:`STEPS` steps of :data:`PROMPTS_PER_STEP` prompts x
   :data:`G` completions, learning rate :data:`LR`, ``beta`` = :data:`BETA` for all three tilted arms:

   * ``disa``: trajectory balance with the frozen Stage-1 label (the ``log_z`` column);
   * ``flowrl``: the same residual with FlowRL's learned log-Z head: *TB with a learned log Z*, FlowRL's
     loss and head but not FlowRL's coded recipe (which length-normalises the log-probs and trains on
     group-normalised rewards x 15); here sequence sums, the raw 0/1 reward and beta = 2, as DISA's arm
     (:data:`ARM_LABELS`; the item names keep the identifier ``flowrl``);
   * ``grpo_kl``: GRPO with the sequence-level KL penalty ``(1 / beta) log(pi / pi_ref)`` in the
     reward (``kl_in_reward``), unscaled group advantages and a constant normaliser (``dr_grpo``):
     its expected gradient is that of ``E[r] - KL(pi || pi_ref) / beta``, whose optimum is the same
     ``pi_ref e^{beta r} / Z`` the other two fit (tested exactly on a bandit and a token tree);
   * ``grpo``: TRL's GRPO defaults, no KL (context: the reward maximiser).
3. **Evaluation.** The untrained model and every trained one sample :data:`EVAL_K` completions per
   held-out prompt at T = 1 on a fresh vLLM engine; within a training seed every model uses the same
   sampling seed (common random numbers). Per run: Mean@8 (mean accuracy), pass@8 (share of prompts
   with a correct sample) and coverage (over the multi-answer prompts: ``exp`` of the entropy of the
   correct answers drawn, 0 when none is correct).

Statistics: the unit is the training run; the items are per-seed paired differences of run means
under the one rule (:func:`tiltlab.llm.checks.rules.judge`), each declared in the claim registry.
The primary claim (``disa.llm.real_model_training``, the decoupling claim) is DISA minus FlowRL on
Mean@8; the secondary claim (``disa.llm.real_model_vs_kl_grpo``) is DISA minus GRPO+KL on Mean@8,
coverage and pass@8 (one Holm family). Both checks read one memoized experiment. Every per-run and
per-prompt value is kept in the evidence. All of it is fixed here and in the claim files before the
run that decides it (``paper_checks/preregistration.toml``).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import functools
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from tqdm.auto import tqdm

from tiltlab.claims import stats
from tiltlab.claims.registry import CheckResult, Verdict, register_check
from tiltlab.llm.base.coverage import correct_entropy_exp
from tiltlab.llm.base.data import load_prompts
from tiltlab.llm.base.models import resolve_model
from tiltlab.llm.base.prompts import format_prompt
from tiltlab.llm.base.rewards import math_reward, plain_answer
from tiltlab.llm.base.rollout import SamplingConfig, VLLMEngine
from tiltlab.llm.base.tasks import answer_format_of_id, multi_answer_tasks, qa_tasks
from tiltlab.llm.disa.logz_head import policy_only_dir
from tiltlab.llm.disa.stage1 import Stage1Config, atomic_write_json, run_stage1
from tiltlab.llm.experiments import pool as seed_pool  # ("pool" is a local name)
from tiltlab.llm.prepare.config import SelectConfig
from tiltlab.llm.prepare.run import select_by_pass_rate, write_rows

from . import rules
from .real_training import step_times, trained_items, weights_moved
from .real_training import train_config as base_config

ALIAS = "smollm2-135m"
ARMS = ("disa", "flowrl", "grpo_kl", "grpo")
ARM_LABELS = {
    "base": "untrained model",
    "disa": "DISA (TB, frozen Stage-1 label)",
    "flowrl": "TB with a learned log Z (FlowRL's loss and head at DISA's settings, not FlowRL's recipe)",
    "grpo_kl": "GRPO + KL/beta in the reward",
    "grpo": "GRPO (TRL defaults, no KL)",
}
"""What each arm is, as the report and the summary name it (an arm is what its label says)."""
N_SEEDS = 5
BETA = 2.0
KL_COEF = 1.0 / BETA
N_QA = 160
QA_LEVELS = (1, 2, 3)
N_MULTI = 140
SELECT_M = 8
MIN_PASS, MAX_PASS = 0.125, 0.875
N_HELDOUT = 48
NEW_TOKENS = 16
PROMPTS_PER_STEP = 4
G = 4
STEPS = 12
"""Sized from a 3-step profile (2026-11-28, one core of a 2-core AMD EPYC, the other busy): 48.8 s per
step for GRPO+KL, 60.3 s for FlowRL, about 250-290 s per 3-step run with start-up and evaluation; 20
runs two at a time at 12 steps, Stage 1 on 300 prompts and the base evaluations come to about 2.4 h."""
LR = 1e-4
"""Twice the withdrawn check's 5e-5: its 12 steps moved no weight by more than 3.3e-4."""
EVAL_K = 8
MAX_MODEL_LEN = 512
KV_CACHE_BYTES = 64 << 20
EVAL_KV_CACHE_BYTES = 256 << 20
MARGIN_ACC = 0.02
"""Smallest Mean@8 / pass@8 difference of interest (accuracy units)."""
MARGIN_COVERAGE = 0.1
"""Smallest coverage difference of interest (effective number of correct answers)."""
PRIMARY = ("disa_minus_flowrl_mean8",)
SECONDARY = ("disa_minus_grpo_kl_mean8", "disa_minus_grpo_kl_coverage", "disa_minus_grpo_kl_pass8")
CHECK_NAME = "smollm2_135m_comparison"


# ---------------------------------------------------------------- task
def candidate_rows(seed: int) -> list[dict]:
    """The candidate prompts: :data:`N_QA` ``synthetic:qa`` rows at :data:`QA_LEVELS` and
    :data:`N_MULTI` ``synthetic:multi`` rows, both seeded by ``seed``."""

    return [*qa_tasks(N_QA, list(QA_LEVELS), seed=seed), *multi_answer_tasks(N_MULTI, seed=seed)]


def split_heldout(rows: Sequence[dict], n_heldout: int, seed: int) -> tuple[list[dict], list[dict]]:
    """``(train, heldout)``: ``n_heldout / 2`` held-out rows of each task kind (``task`` column),
    drawn with ``random.Random(seed)``; the rest, in their input order, train. Raises when a kind has
    fewer than ``n_heldout / 2 + 1`` rows (a held-out set of another size is not the registered one)."""
    if n_heldout <= 0 or n_heldout % 2:
        raise ValueError(f"n_heldout must be a positive even number, got {n_heldout}")
    kinds = sorted({str(r["task"]) for r in rows})
    if len(kinds) != 2:
        raise ValueError(f"expected two task kinds (qa and multi-answer), got {kinds}")
    rng = random.Random(f"heldout-{seed}")
    held_ids: set[str] = set()
    for k in kinds:
        ids = [str(r["id"]) for r in rows if str(r["task"]) == k]
        if len(ids) < n_heldout // 2 + 1:
            raise ValueError(
                f"only {len(ids)} selected {k} prompts: {n_heldout // 2} held out and at least one to train "
                "needed (raise N_QA / N_MULTI)"
            )
        held_ids.update(rng.sample(ids, n_heldout // 2))
    held = [r for r in rows if str(r["id"]) in held_ids]
    train = [r for r in rows if str(r["id"]) not in held_ids]
    return train, held


def make_task(root: Path, model_dir: str, seed: int) -> dict:
    """Stage 1 (``q = pi_ref``) on the candidates, the pass-rate selection and the held-out split:
    ``train.jsonl`` / ``heldout.jsonl`` under ``root`` and the selection summary."""

    rows = candidate_rows(seed)
    cand = root / "candidates.jsonl"
    write_rows(rows, cand)
    cfg = Stage1Config(
        proposal=model_dir,
        reference=model_dir,
        dataset=str(cand),
        out_dir=str(root / "stage1"),
        M=SELECT_M,
        tilt_beta=BETA,
        reward="math",
        max_new_tokens=NEW_TOKENS,
        seed=seed,
        engine="vllm",
        dtype="fp32",
        device="cpu",
        max_model_len=MAX_MODEL_LEN,
        prompts_per_shard=len(rows),
    )
    engine = VLLMEngine(
        model_dir, dtype="fp32", seed=seed, max_model_len=MAX_MODEL_LEN, kv_cache_memory_bytes=EVAL_KV_CACHE_BYTES
    )
    try:
        run_stage1(cfg, progress=False, engine=engine)
    finally:
        engine.close()
    sel = SelectConfig(stage1=cfg.out_dir, out=str(root / "selected.jsonl"), min_pass=MIN_PASS, max_pass=MAX_PASS)
    summary = select_by_pass_rate(sel)
    train, held = split_heldout(load_prompts(sel.out), N_HELDOUT, seed)
    write_rows(train, root / "train.jsonl")
    write_rows(held, root / "heldout.jsonl")
    return {
        **summary,
        "stage1_dir": cfg.out_dir,
        "train": str(root / "train.jsonl"),
        "heldout": str(root / "heldout.jsonl"),
        "n_train": len(train),
        "n_heldout": len(held),
    }


# ---------------------------------------------------------------- one run
def train_config(arm: str, task: dict, out: Path, seed: int, steps: int) -> dict:
    """The ``tiltlab llm train`` config of one run of ``arm``."""

    if arm not in ARMS:
        raise ValueError(f"arm must be one of {', '.join(ARMS)}, got {arm!r}")
    cfg = base_config("grpo" if arm == "grpo_kl" else arm, task, out, seed, steps)
    trl = cfg["trl"]
    trl.update(
        learning_rate=LR,
        per_device_train_batch_size=PROMPTS_PER_STEP * G,
        num_generations=G,
        max_completion_length=NEW_TOKENS,
        vllm_kv_cache_memory_bytes=KV_CACHE_BYTES,
        vllm_max_model_length=MAX_MODEL_LEN,
    )
    if arm in ("disa", "flowrl"):
        cfg["tilt_beta"] = BETA
    if arm == "grpo_kl":  # E[r] - KL(pi || pi_ref) / beta: the tilted target is its optimum
        trl.update(beta=KL_COEF, kl_in_reward=True, scale_rewards="none", loss_type="dr_grpo")
    return cfg


def graded_answers(row: dict, texts: Sequence[str]) -> list[float | None]:
    """Per completion, the answer the training reward pays (``math_reward`` on the row's ``answer`` and
    ``answer_format``): the number it gives (:func:`tiltlab.llm.base.rewards.plain_answer`) where it is paid,
    None where it is not."""

    n = len(texts)
    paid = math_reward(
        [row["prompt"]] * n, list(texts), answer=[row["answer"]] * n, answer_format=[row.get("answer_format")] * n
    )
    return [plain_answer(row["prompt"], t) if p == 1.0 else None for p, t in zip(paid, texts)]


def evaluate(model_dir: str, rows: Sequence[dict], seed: int, k: int = EVAL_K) -> dict[str, list]:
    """Per held-out prompt: the number of correct samples of ``k`` (T = 1, sampling seed ``seed``)
    and the correct answers drawn (the parsed numbers, in sample order). ``{"correct": [P],
    "answers": [P lists]}``."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    texts = [format_prompt(tok, r["prompt"], True) for r in rows]
    engine = VLLMEngine(
        model_dir, dtype="fp32", seed=seed, max_model_len=MAX_MODEL_LEN, kv_cache_memory_bytes=EVAL_KV_CACHE_BYTES
    )
    try:
        groups = engine.generate(texts, k, SamplingConfig(temperature=1.0, max_new_tokens=NEW_TOKENS, seed=seed))
    finally:
        engine.close()
    correct, answers = [], []
    for r, g in zip(rows, groups):
        got = graded_answers(r, g.texts)  # the paid answer of each sample, None where not paid
        correct.append(sum(a is not None for a in got))
        answers.append([a for a in got if a is not None])
    return {"correct": correct, "answers": answers}


def run_metrics(ev: dict[str, list], rows: Sequence[dict], k: int = EVAL_K) -> dict[str, float]:
    """A run's Mean@k, pass@k (all held-out prompts) and coverage (the multi-answer prompts: mean
    ``exp`` entropy of the correct answers drawn) from :func:`evaluate`'s per-prompt values."""

    n = len(rows)
    if len(ev["correct"]) != n or len(ev["answers"]) != n:
        raise ValueError(f"{len(ev['correct'])} evaluated prompts for {n} held-out rows")
    multi = [i for i, r in enumerate(rows) if r.get("answer_format") == "set"]
    if not multi:
        raise ValueError("no multi-answer prompt among the held-out rows: coverage is undefined")
    return {
        "mean8": sum(c / k for c in ev["correct"]) / n,
        "pass8": sum(c > 0 for c in ev["correct"]) / n,
        "coverage": sum(correct_entropy_exp(ev["answers"][i]) for i in multi) / len(multi),
    }


def _python(args: list[str], core: int | None) -> subprocess.CompletedProcess:
    """``python ARGS`` with one torch thread, vLLM bound to ``core`` (None: vLLM's own binding)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(seed_pool.CHECK_THREADS)}
    if core is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(core)
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True)


def train_in_process(name: str, cfg: dict, root: Path, core: int | None) -> tuple[str, list[dict]]:
    """One ``tiltlab llm train`` process (vLLM colocated, bound to ``core``); ``(model dir, log history)``."""

    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    res = _python(["-m", "tiltlab.cli", "llm", "train", "--config", str(path)], core)
    if res.returncode != 0:
        raise RuntimeError(f"`tiltlab llm train` ({name}) failed:\n{res.stderr[-3000:]}")
    out = Path(cfg["output_dir"])
    return str(out), json.loads((out / "trainer_state.json").read_text())["log_history"]


_EVAL_MAIN = "import sys; from tiltlab.llm.checks.real_comparison import main; sys.exit(main(sys.argv[1:]))"
"""The evaluation worker's entry (``-c``, not ``-m``: run as ``__main__`` the module would register its
checks a second time beside the package's import of it)."""


def eval_in_process(model_dir: str, heldout: str, seed: int, out: Path, core: int | None) -> dict[str, list]:
    """:func:`evaluate` in its own process (a fresh vLLM engine bound to ``core``); the result is
    read back from ``out``."""
    res = _python(["-c", _EVAL_MAIN, "eval", model_dir, heldout, str(seed), str(out)], core)
    if res.returncode != 0:
        raise RuntimeError(f"evaluation of {model_dir} (seed {seed}) failed:\n{res.stderr[-3000:]}")
    return json.loads(out.read_text())


def one_run(
    arm: str, task: dict, root: Path, seed: int, steps: int, core: int | None, start: dict | None = None
) -> dict[str, Any]:
    """Train ``arm`` at training seed ``seed`` (``arm == "base"``: no training) and evaluate it on the
    held-out prompts with the seed's evaluation seed. Returns the raw per-prompt values and the
    run's training log numbers. ``start``: the untrained weights (for "the weights moved")."""

    eval_seed = seed * 100 + 99
    out: dict[str, Any] = {"arm": arm, "seed": seed}
    model = task["model_dir"]
    if arm != "base":
        t0 = time.perf_counter()
        cfg = train_config(arm, task, root / f"{arm}-{seed}", seed, steps)
        model, history = train_in_process(f"{arm}-{seed}", cfg, root, core)
        if start is None:
            raise ValueError("one_run needs the untrained weights (start) to tell whether a run trained")
        ok, tn = trained_items(history, weights_moved(start, model))
        out.update(trained=ok, train_numbers={**tn, **step_times(history)}, train_s=time.perf_counter() - t0)
        model = str(policy_only_dir(model))  # FlowRL's saved policy carries its head, which vLLM cannot load
    out["eval"] = eval_in_process(model, task["heldout"], eval_seed, root / f"eval-{arm}-{seed}.json", core)
    return out


# ---------------------------------------------------------------- the experiment
@functools.cache
def comparison_raw(seed: int, n_seeds: int = N_SEEDS, steps: int = STEPS, jobs: int | None = None) -> dict[str, Any]:
    """Run the whole experiment once per (seed, size): the task, then the untrained model and every
    arm at every training seed, ``jobs`` runs at a time (default: the check runner's seed jobs), each
    on its own core. Returns the held-out rows, the task summary and every run's raw values."""
    from safetensors.torch import load_file

    jobs = seed_pool.get_jobs() if jobs is None else jobs  # the runner's --jobs (seed_pool.set_jobs)
    model_dir = str(resolve_model(ALIAS))  # one-line error naming the pip command when not installed
    start = load_file(str(Path(model_dir) / "model.safetensors"))
    with tempfile.TemporaryDirectory(prefix="tiltlab-real-comparison-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        task = {**make_task(root, model_dir, seed), "model_dir": model_dir}
        task_s = time.perf_counter() - t0
        held = load_prompts(task["heldout"])
        seeds = seed_pool.seeds_for(seed, n_seeds)
        todo = [("base", s) for s in seeds] + [(a, s) for s in seeds for a in ARMS]
        runs: dict[tuple[str, int], dict] = {}
        cores = list(range(jobs)) if jobs > 1 else [None]
        free = list(cores)

        bar = tqdm(total=len(todo), desc="llm check real comparison", unit="run", leave=False)
        with cf.ThreadPoolExecutor(max_workers=len(cores)) as pool:
            pending: dict[cf.Future, tuple[tuple[str, int], int | None]] = {}
            queue = list(todo)
            while queue or pending:
                while queue and free:
                    key, core = queue.pop(0), free.pop(0)
                    fut = pool.submit(one_run, key[0], task, root, key[1], steps, core, start)
                    pending[fut] = (key, core)
                done, _ = cf.wait(list(pending), return_when=cf.FIRST_COMPLETED)
                for fut in done:
                    key, core = pending.pop(fut)
                    free.append(core)
                    runs[key] = fut.result()  # a failed run raises here, naming its arm and seed
                    bar.update(1)
        bar.close()
    summary = {k: task[k] for k in ("n_labelled", "n_kept", "n_train", "n_heldout", "mean_pass_all", "mean_pass_train")}
    return {"held": held, "task": summary, "task_s": task_s, "seeds": list(seeds), "runs": runs, "steps": steps}


def per_run_metrics(raw: dict[str, Any]) -> dict[str, dict[int, dict[str, float]]]:
    """``{arm: {seed: {"mean8", "pass8", "coverage"}}}`` for the base model and every arm, computed from
    the values the record keeps (:func:`raw_values`, :func:`recorded_metrics`): the verdict and a
    re-judge of the record (:func:`rederive`) take the same path."""
    m = recorded_metrics(raw_values(raw))
    return {arm: {s: m[arm][s] for s in raw["seeds"]} for arm in ("base", *ARMS)}


def recorded_metrics(values: Mapping[str, Any]) -> dict[str, dict[int, dict[str, float]]]:
    """Every recorded run's metrics (:func:`run_metrics`) from :func:`raw_values`' per-prompt values:
    correct counts -> Mean@8 and pass@8, correct answers of the multi-answer prompts -> coverage (the
    prompts' answer formats as recorded, or, in a record that kept only the ids, from the ids,
    :func:`tiltlab.llm.base.tasks.answer_format_of_id`)."""

    ids = [str(i) for i in values["heldout_ids"]]
    formats = values.get("answer_formats") or [answer_format_of_id(i) for i in ids]
    if len(formats) != len(ids):
        raise ValueError(f"{len(formats)} answer formats for {len(ids)} held-out prompts")
    rows = [{"id": i, "answer_format": f} for i, f in zip(ids, formats)]
    out: dict[str, dict[int, dict[str, float]]] = {}
    for run in values["runs"]:
        ev = {"correct": list(run["correct"]), "answers": [list(a) for a in run["answers"]]}
        out.setdefault(str(run["arm"]), {})[int(run["seed"])] = run_metrics(ev, rows)
    return out


def rederive(values: Mapping[str, Any], names: Sequence[str]) -> tuple[dict[str, tuple[float, ...]], dict[str, float]]:
    """The record's re-derivation (:mod:`tiltlab.claims.rejudge`): from the per-prompt values of every
    run, the items ``names`` (per training run paired differences, :func:`items_for`) and each run's
    reported metrics ``<arm>_s<seed>_<metric>``; the training seeds are those of the base runs."""
    m = recorded_metrics(values)
    seeds = sorted(m["base"])
    items = {it.name: it.values for it in items_for(m, seeds, names)}
    reported = {f"{arm}_s{s}_{k}": v for arm, by_seed in m.items() for s, ms in by_seed.items() for k, v in ms.items()}
    return items, reported


def paired(
    m: dict[str, dict[int, dict[str, float]]], a: str, b: str, metric: str, seeds: Sequence[int]
) -> tuple[float, ...]:
    """Per training seed, ``metric`` of arm ``a`` minus that of arm ``b`` (the paired unit)."""
    return tuple(m[a][s][metric] - m[b][s][metric] for s in seeds)


def items_for(
    m: dict[str, dict[int, dict[str, float]]], seeds: Sequence[int], names: Sequence[str]
) -> list[rules.Item]:
    """The registered items ``names`` (``disa_minus_<arm>_<metric>``) as paired per-seed differences."""
    margins = {"mean8": MARGIN_ACC, "pass8": MARGIN_ACC, "coverage": MARGIN_COVERAGE}
    out = []
    for name in names:
        rest = name.removeprefix("disa_minus_")
        arm, metric = rest.rsplit("_", 1)
        out.append(rules.Item(name, paired(m, "disa", arm, metric, seeds), margin=margins[metric]))
    return out


def ran_flags(raw: dict[str, Any], m: dict[str, dict[int, dict[str, float]]]) -> dict[str, bool]:
    """ "It ran": every training run trained (:func:`trained_items`), and every training run's held-out
    Mean@8 left its untrained model's (same training seed, same evaluation seed): a run whose evaluation
    did not move did not change the model where the check looks."""
    runs = raw["runs"]
    trained = all(runs[(a, s)]["trained"] for a in ARMS for s in raw["seeds"])
    moved = all(m[a][s]["mean8"] != m["base"][s]["mean8"] for a in ARMS for s in raw["seeds"])
    return {"ran_all_trained": trained, "ran_accuracy_moved": moved}


def numbers(raw: dict[str, Any], m: dict[str, dict[int, dict[str, float]]]) -> dict[str, float]:
    """Every arm's per-seed metrics and their 95% intervals over runs, the arms against the base
    model and plain GRPO (reported, not judged), the task summary and the step profile."""
    seeds = raw["seeds"]
    nums: dict[str, float] = {f"task_{k}": float(v) for k, v in raw["task"].items()}
    nums.update(task_s=raw["task_s"], steps=float(raw["steps"]), n_heldout_prompts=float(len(raw["held"])))
    for arm in ("base", *ARMS):
        for metric in ("mean8", "pass8", "coverage"):
            vals = [m[arm][s][metric] for s in seeds]
            nums.update({f"{arm}_s{s}_{metric}": v for s, v in zip(seeds, vals)})
            nums.update(stats.ci_numbers(f"{arm}_{metric}", vals))
    for a, b in [(x, "base") for x in ARMS] + [("disa", "grpo"), ("flowrl", "grpo_kl")]:
        for metric in ("mean8", "pass8", "coverage"):
            nums.update(stats.ci_numbers(f"{a}_minus_{b}_{metric}", paired(m, a, b, metric, seeds)))
    for arm in ARMS:
        for s in seeds:
            run = raw["runs"][(arm, s)]
            nums[f"{arm}_s{s}_train_s"] = run["train_s"]
            nums.update({f"{arm}_s{s}_{k}": v for k, v in run["train_numbers"].items()})
    return nums


def raw_values(raw: dict[str, Any]) -> dict[str, Any]:
    """The per-prompt values of every run (the held-out prompt ids and answer formats in order), for the
    record: what :func:`recorded_metrics` re-derives every run's metrics from."""
    return {
        "heldout_ids": [str(r["id"]) for r in raw["held"]],
        "answer_formats": [str(r.get("answer_format")) for r in raw["held"]],
        "runs": [
            {"arm": a, "seed": s, "correct": r["eval"]["correct"], "answers": r["eval"]["answers"]}
            for (a, s), r in sorted(raw["runs"].items(), key=lambda kv: (kv[0][1], kv[0][0]))
        ],
    }


def _result(raw: dict[str, Any], names: Sequence[str], what: str) -> CheckResult:
    m = per_run_metrics(raw)
    seeds = raw["seeds"]
    items = items_for(m, seeds, names)
    verdict, rnums, flags, j = rules.judge(items, ran_flags(raw, m), unit="training run")
    nums = {**numbers(raw, m), **rnums}
    evidence = {**j.evidence(), "raw": raw_values(raw)}
    arms = ", ".join(
        f"{a} ({ARM_LABELS[a]}) Mean@8 {stats.fmt_ci([m[a][s]['mean8'] for s in seeds])} pass@8 "
        f"{stats.fmt_ci([m[a][s]['pass8'] for s in seeds])} coverage {stats.fmt_ci([m[a][s]['coverage'] for s in seeds])}"
        for a in ("base", *ARMS)
    )
    return CheckResult(
        verdict,
        f"{what}: SmolLM2-135M-Instruct, TRL + colocated vLLM on CPU; {int(nums['task_n_train'])} train / "
        f"{len(raw['held'])} held-out prompts (qa and multi-answer, pi_ref pass rate in [{MIN_PASS:g}, {MAX_PASS:g}]); "
        f"beta={BETA:g}, GRPO+KL: KL(pi||pi_ref)/beta in the reward; {raw['steps']} steps x {PROMPTS_PER_STEP}x{G}, "
        f"lr {LR:g}, {len(seeds)} training runs per arm; per arm (95% t-CIs over runs): {arms}; items: "
        f"{rules.describe(j)}; {rules.rule_text('per-training-run')}",
        nums,
        items=flags,
        evidence=evidence,
    )


EXPECTED_PRIMARY_ITEMS: dict[str, bool] = {
    "disa_minus_flowrl_mean8_against": False,
    "disa_minus_flowrl_mean8_supports": False,
    "ran_accuracy_moved": True,
    "ran_all_trained": True,
}
EXPECTED_SECONDARY_ITEMS: dict[str, bool] = {
    "disa_minus_grpo_kl_coverage_against": False,
    "disa_minus_grpo_kl_coverage_supports": False,
    "disa_minus_grpo_kl_mean8_against": False,
    "disa_minus_grpo_kl_mean8_supports": False,
    "disa_minus_grpo_kl_pass8_against": False,
    "disa_minus_grpo_kl_pass8_supports": False,
    "ran_accuracy_moved": True,
    "ran_all_trained": True,
}
"""Set from the first full run at 50cb439c1348 (regression markers, not the rule: the rule was registered before it)."""


@register_check(
    "disa.llm.real_model_training",
    layer="llm",
    expected=Verdict.INCONCLUSIVE,
    long=True,
    name=CHECK_NAME,
    expected_items=EXPECTED_PRIMARY_ITEMS,
    rederive=rederive,
)
@seed_pool.fixed_threads
def real_model_comparison(seed: int, n_seeds: int = N_SEEDS, steps: int = STEPS) -> CheckResult:
    return _result(comparison_raw(seed, n_seeds, steps), PRIMARY, "DISA minus TB with a learned log Z (primary)")


@register_check(
    "disa.llm.real_model_vs_kl_grpo",
    layer="llm",
    expected=Verdict.INCONCLUSIVE,
    long=True,
    name=CHECK_NAME,
    expected_items=EXPECTED_SECONDARY_ITEMS,
    rederive=rederive,
)
@seed_pool.fixed_threads
def real_model_vs_kl_grpo(seed: int, n_seeds: int = N_SEEDS, steps: int = STEPS) -> CheckResult:
    return _result(comparison_raw(seed, n_seeds, steps), SECONDARY, "DISA minus GRPO+KL (secondary)")


def main(argv: Sequence[str] | None = None) -> int:
    """``eval MODEL HELDOUT SEED OUT``: one evaluation in its own process (:func:`eval_in_process`
    runs it through :data:`_EVAL_MAIN`)."""
    p = argparse.ArgumentParser(prog="real_comparison")
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("eval", help="evaluate one model on the held-out prompts")
    e.add_argument("model")
    e.add_argument("heldout")
    e.add_argument("seed", type=int)
    e.add_argument("out")
    a = p.parse_args(argv)

    atomic_write_json(Path(a.out), evaluate(a.model, load_prompts(a.heldout), a.seed))
    return 0
