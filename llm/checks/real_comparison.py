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
2. **Arms** (:data:`ARMS`), :data:`STEPS` steps of :data:`PROMPTS_PER_STEP` prompts x :data:`G`
   completions, ``beta`` = :data:`BETA` for all three tilted arms, each at its own tuned learning rate
   (the tuned design, 2026-12-04, issue 52; the first design trained every arm at one rate :data:`LR`):

   * **tuning**: the training prompts are split once more (:func:`split_heldout` with ``salt="tune"``) into
     :data:`N_TUNE` *tuning* prompts and the *fit* prompts; every arm trains on the fit prompts at every rate
     of :data:`TUNE_LRS` and every seed of :data:`TUNE_SEEDS` (10 tuning runs per arm, the same for all) and
     is evaluated on the tuning prompts; :func:`choose` takes, per arm, the rate with the highest mean
     tuning Mean@8 (ties: the smaller rate). No tuning run sees a held-out prompt.
   * **final runs**: every arm at its chosen rate, on the fit prompts, with fresh training seeds
     (:func:`final_plan`); the first :data:`N_PILOT` seeds are run first and :func:`n_final` sizes the rest
     from their spread: the fewest runs per arm (at most :data:`N_MAX`) with power :data:`POWER_TARGET` to
     find a true DISA - FlowRL Mean@8 of :data:`POWER_DELTA` under the rule (:func:`power`, the noncentral t).
   * **shards**: every run is stored as it finishes in :data:`STORE` with its commit, date and machine
     (:mod:`tiltlab.llm.experiments.shards`), so the experiment runs in several sittings
     (``python -m tiltlab.llm.checks.comparison_run run --phase tune --shard 0/3``); a stored run proves
     that its rule was registered strictly before it. The record keeps the tuning runs' values, and
     ``tiltlab report --rejudge`` re-derives the choice and the size as well as the items (:func:`rederive`).

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
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from scipy import stats as sps
from tqdm.auto import tqdm

from tiltlab.claims import stats
from tiltlab.claims.prereg import repo_root
from tiltlab.claims.registry import CheckResult, Verdict, register_check
from tiltlab.files import write_json
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
from tiltlab.llm.experiments import shards
from tiltlab.llm.experiments.shards import RunStore
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
"""The first design's training runs per arm (its shipped record); the tuned design sizes them (:func:`n_final`)."""
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
"""The first design's one learning rate for every arm (twice the withdrawn check's 5e-5); kept for its shipped
record. The tuned design chooses each arm's rate from :data:`TUNE_LRS` (:func:`choose`)."""
TUNE_LRS = (1e-6, 3e-6, 1e-5, 3e-5, 1e-4)
"""The tuning grid, the same for every arm (issue 52: FlowRL's code trains at 1e-6, GRPO recipes at 1e-6 to
3e-6, the first design collapsed the TB arms at 1e-4)."""
TUNE_SEEDS = (9000, 9001)
"""The tuning runs' training seeds, the same for every arm and disjoint from every final seed
(:func:`final_seeds`: below 100 x (check seed + 1)). Each arm gets ``len(TUNE_LRS) x len(TUNE_SEEDS)`` = 10
tuning runs. The log-prob scale is not tuned: DISA's frozen labels are sequence sums (a length-normalised
residual would not have them as its normaliser) and the FlowRL arm is, by its label, TB with a learned log Z at
DISA's settings."""
N_TUNE = 24
"""Tuning-split prompts (half of each task kind), drawn from the training prompts; the tuning runs train on the
rest (the *fit* prompts) and are evaluated on these; the final runs train on the same fit prompts and are
evaluated on the held-out prompts, which no tuning run sees."""
N_PILOT = 6
"""Final training seeds run first (the internal pilot, part of the final analysis): the power rule
(:func:`n_final`) sizes the rest from their spread."""
N_MAX = 40
"""The most final training runs per arm (when the power rule asks for more, the check runs this many and
reports the power it has)."""
POWER_DELTA = 0.05
"""The true DISA - FlowRL held-out Mean@8 the final runs are sized to detect."""
POWER_TARGET = 0.8
"""The power wanted at :data:`POWER_DELTA` for the primary item under the one rule (one-sided t-test of
``mean <= MARGIN_ACC`` at 0.025)."""
STORE = "paper_checks/records/real_comparison"
"""The run store (relative to the repository root): the task, and every tuning and final run with its commit,
date and machine (:mod:`tiltlab.llm.experiments.shards`); committed shard by shard."""
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


def split_heldout(
    rows: Sequence[dict], n_heldout: int, seed: int, salt: str = "heldout"
) -> tuple[list[dict], list[dict]]:
    """``(train, heldout)``: ``n_heldout / 2`` held-out rows of each task kind (``task`` column),
    drawn with ``random.Random(f"{salt}-{seed}")`` (``salt="tune"``: the tuning split of the training rows); the rest, in their input order, train. Raises when a kind has
    fewer than ``n_heldout / 2 + 1`` rows (a held-out set of another size is not the registered one)."""
    if n_heldout <= 0 or n_heldout % 2:
        raise ValueError(f"n_heldout must be a positive even number, got {n_heldout}")
    kinds = sorted({str(r["task"]) for r in rows})
    if len(kinds) != 2:
        raise ValueError(f"expected two task kinds (qa and multi-answer), got {kinds}")
    rng = random.Random(f"{salt}-{seed}")
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
def train_config(arm: str, task: dict, out: Path, seed: int, steps: int, lr: float = LR) -> dict:
    """The ``tiltlab llm train`` config of one run of ``arm`` at learning rate ``lr``."""

    if arm not in ARMS:
        raise ValueError(f"arm must be one of {', '.join(ARMS)}, got {arm!r}")
    cfg = base_config("grpo" if arm == "grpo_kl" else arm, task, out, seed, steps)
    trl = cfg["trl"]
    trl.update(
        learning_rate=lr,
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
    arm: str,
    task: dict,
    root: Path,
    seed: int,
    steps: int,
    core: int | None,
    start: dict | None = None,
    lr: float = LR,
    eval_on: str = "heldout",
) -> dict[str, Any]:
    """Train ``arm`` at training seed ``seed`` and learning rate ``lr`` (``arm == "base"``: no training) and
    evaluate it on the prompts ``task[eval_on]`` (``"heldout"``, or ``"tune"`` for a tuning run) with the
    seed's evaluation seed. Returns the raw per-prompt values and the run's training log numbers.
    ``start``: the untrained weights (for "the weights moved")."""

    eval_seed = seed * 100 + 99
    out: dict[str, Any] = {"arm": arm, "seed": seed}
    model = task["model_dir"]
    if arm != "base":
        t0 = time.perf_counter()
        name = f"{arm}-lr{lr:g}-{seed}"
        cfg = train_config(arm, task, root / name, seed, steps, lr=lr)
        model, history = train_in_process(name, cfg, root, core)
        if start is None:
            raise ValueError("one_run needs the untrained weights (start) to tell whether a run trained")
        ok, tn = trained_items(history, weights_moved(start, model))
        out.update(trained=ok, train_numbers={**tn, **step_times(history)}, train_s=time.perf_counter() - t0)
        model = str(policy_only_dir(model))  # FlowRL's saved policy carries its head, which vLLM cannot load
    tag = f"{arm}-{seed}" if arm == "base" else f"{arm}-lr{lr:g}-{seed}"
    out["eval"] = eval_in_process(model, task[eval_on], eval_seed, root / f"eval-{eval_on}-{tag}.json", core)
    return out


# ---------------------------------------------------------------- the protocol (tuning, choice, power)
def run_key(phase: str, arm: str, seed: int, lr: float | None = None) -> str:
    """The store key of one run: ``tune-disa-lr1e-05-s9000``, ``final-base-s3``."""
    if phase not in ("tune", "final"):
        raise ValueError(f"phase must be 'tune' or 'final', got {phase!r}")
    if arm == "base":
        return f"{phase}-base-s{seed}"
    if arm not in ARMS or lr is None:
        raise ValueError(f"a training run needs an arm of {', '.join(ARMS)} and a learning rate, got {arm!r}, {lr!r}")
    return f"{phase}-{arm}-lr{lr:g}-s{seed}"


def tuning_plan() -> list[tuple[str, str, int, float | None]]:
    """Every tuning run as ``(key, arm, seed, lr)``: the untrained model at each tuning seed (context), then
    each arm at each learning rate of :data:`TUNE_LRS` and each seed of :data:`TUNE_SEEDS`, interleaved
    (seed, then rate, then arm) so that any shard holds every arm about equally."""
    out: list[tuple[str, str, int, float | None]] = [(run_key("tune", "base", s), "base", s, None) for s in TUNE_SEEDS]
    for s in TUNE_SEEDS:
        for lr in TUNE_LRS:
            out += [(run_key("tune", a, s, lr), a, s, lr) for a in ARMS]
    return out


def final_plan(seed: int, choice: Mapping[str, float], n: int) -> list[tuple[str, str, int, float | None]]:
    """The final runs of ``n`` training seeds (:func:`pool.seeds_for`): per seed the untrained model and
    every arm at its chosen learning rate."""
    missing = [a for a in ARMS if a not in choice]
    if missing:
        raise ValueError(f"no chosen learning rate for {missing}")
    out: list[tuple[str, str, int, float | None]] = []
    for s in seed_pool.seeds_for(seed, n):
        if s in TUNE_SEEDS:
            raise ValueError(f"final seed {s} is a tuning seed: the final runs need fresh seeds")
        out.append((run_key("final", "base", s), "base", s, None))
        out += [(run_key("final", a, s, choice[a]), a, s, choice[a]) for a in ARMS]
    return out


def choose(tuning: Mapping[str, Mapping[float, Sequence[float]]]) -> dict[str, float]:
    """Per arm, the learning rate whose tuning runs reach the highest mean tuning-split Mean@8 (the mean
    over :data:`TUNE_SEEDS`); a tie goes to the smaller rate. ``tuning[arm][lr]``: the Mean@8 of each
    tuning seed, every arm with every rate of :data:`TUNE_LRS` and one value per tuning seed."""
    out = {}
    for arm in ARMS:
        by_lr = tuning.get(arm, {})
        if sorted(by_lr) != sorted(TUNE_LRS) or any(len(v) != len(TUNE_SEEDS) for v in by_lr.values()):
            raise ValueError(
                f"{arm}: the choice needs {len(TUNE_SEEDS)} tuning runs at each of {list(TUNE_LRS)}, got "
                f"{ {lr: len(v) for lr, v in sorted(by_lr.items())} }"
            )
        means = {lr: sum(v) / len(v) for lr, v in by_lr.items()}
        if not all(math.isfinite(m) for m in means.values()):
            raise ValueError(f"{arm}: a tuning Mean@8 is not finite: {means}")
        out[arm] = min(TUNE_LRS, key=lambda lr: (-means[lr], lr))
    return out


def power(n: int, sd: float, delta: float = POWER_DELTA, margin: float = MARGIN_ACC) -> float:
    """Power of the primary item's "supports" test (one-sided t-test over ``n`` paired runs of ``mean <=
    margin`` at :data:`rules.ALPHA` / 2) when the true difference is ``delta`` and the runs' sd is ``sd``
    (the noncentral t)."""
    if n < 2:
        raise ValueError(f"a paired t-test needs at least 2 runs, got {n}")
    if not (math.isfinite(sd) and sd >= 0):
        raise ValueError(f"sd must be finite and >= 0, got {sd}")
    if sd == 0:
        return 1.0 if delta > margin else 0.0
    crit = stats.t_quantile(1 - rules.ALPHA / 2, n - 1)
    return float(sps.nct.sf(crit, n - 1, (delta - margin) * math.sqrt(n) / sd))


def n_final(sd: float) -> tuple[int, float]:
    """``(n, power)``: the fewest final runs per arm, at least :data:`N_PILOT` and at most :data:`N_MAX`,
    with :func:`power` >= :data:`POWER_TARGET` at the measured ``sd`` (:data:`N_MAX` and its power when
    none is)."""
    for n in range(N_PILOT, N_MAX + 1):
        p = power(n, sd)
        if p >= POWER_TARGET:
            return n, p
    return N_MAX, power(N_MAX, sd)


def pilot_sd(m: Mapping[str, Mapping[int, Mapping[str, float]]], seeds: Sequence[int]) -> float:
    """The sample sd of the primary item's paired values (DISA - FlowRL Mean@8) over the pilot ``seeds``."""
    d = paired(m, "disa", "flowrl", "mean8", seeds)
    if len(d) < 2:
        raise ValueError(f"the pilot needs at least 2 seeds, got {len(d)}")
    mu = sum(d) / len(d)
    return math.sqrt(sum((x - mu) ** 2 for x in d) / (len(d) - 1))


def tuning_table(values: Mapping[str, Any]) -> dict[str, dict[float, list[float]]]:
    """``{arm: {lr: [Mean@8 per tuning seed, in TUNE_SEEDS order]}}`` (and ``base: {0.0: [...]}``) from the
    record's tuning runs (per-prompt correct counts on the tuning prompts)."""
    n = len(values["tune_ids"])
    by: dict[str, dict[float, dict[int, float]]] = {}
    for run in values["tuning"]:
        if len(run["correct"]) != n:
            raise ValueError(
                f"tuning run {run['arm']} lr {run.get('lr')} seed {run['seed']}: {len(run['correct'])} counts for {n} prompts"
            )
        mean8 = sum(c / EVAL_K for c in run["correct"]) / n
        lr = 0.0 if run["arm"] == "base" else float(run["lr"])
        cell = by.setdefault(str(run["arm"]), {}).setdefault(lr, {})
        if int(run["seed"]) in cell:
            raise ValueError(f"two tuning runs of {run['arm']} at lr {lr:g}, seed {run['seed']}")
        cell[int(run["seed"])] = mean8
    return {a: {lr: [c[s] for s in TUNE_SEEDS if s in c] for lr, c in sorted(d.items())} for a, d in by.items()}


# ---------------------------------------------------------------- the experiment, run shard by shard
def default_store() -> Path:
    """The store :func:`comparison_raw` and ``run`` use without ``--store``."""
    return shipped_store()


def shipped_store() -> Path:
    """The store in the checkout (:data:`STORE`): its runs ship, so each must have been registered before it."""
    return repo_root() / STORE


def must_verify(store: RunStore) -> bool:
    """Whether runs of ``store`` must prove their registration: those of the checkout's own store do."""
    return store.root.resolve() == shipped_store().resolve()


def ensure_task(store: RunStore, model_dir: str, seed: int) -> dict:
    """The store's task, made once (Stage 1, the pass-rate selection, the held-out split, then the tuning
    split of the training prompts) and kept under ``<store>/task`` with relative paths, so that every
    sitting on any machine trains and evaluates on the same prompts and labels. Paths come back absolute."""
    d = store.root / "task"
    meta = d / "task.json"
    if not meta.exists():
        store.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".task-", dir=store.root))
        try:
            t0 = time.perf_counter()
            made = make_task(tmp, model_dir, seed)
            fit, tune = split_heldout(load_prompts(made["train"]), N_TUNE, seed, salt="tune")
            write_rows(fit, tmp / "fit.jsonl")
            write_rows(tune, tmp / "tune.jsonl")
            summary = {
                k: made[k] for k in ("n_labelled", "n_kept", "n_train", "n_heldout", "mean_pass_all", "mean_pass_train")
            }
            rel = {"stage1_dir": "stage1", "train": "fit.jsonl", "tune": "tune.jsonl", "heldout": "heldout.jsonl"}
            info = {**summary, **rel, "n_fit": len(fit), "n_tune": len(tune), "seed": seed,
                    "task_s": time.perf_counter() - t0, **shards.provenance(CHECK_NAME)}  # fmt: skip
            write_json(tmp / "task.json", info, indent=1, sort_keys=True, fsync=True)
            os.replace(tmp, d)  # the task appears whole or not at all
        finally:
            if tmp.exists():
                shutil.rmtree(tmp)
    info = json.loads(meta.read_text(encoding="utf-8"))
    if info.get("seed") != seed:
        raise ValueError(f"the store {store.root} holds the task of check seed {info.get('seed')}, not {seed}")
    return {**info, **{k: str(d / info[k]) for k in ("stage1_dir", "train", "tune", "heldout")}, "model_dir": model_dir}


def run_missing(
    store: RunStore,
    plan: Sequence[tuple[str, str, int, float | None]],
    task: dict,
    steps: int,
    jobs: int,
    start: dict,
    *,
    verify: bool = True,
    max_runs: int | None = None,
    desc: str = "runs",
) -> list[str]:
    """Run the runs of ``plan`` that the store lacks, ``jobs`` at a time (each on its own core), and store
    each as it finishes with the provenance taken when it started; ``max_runs``: stop starting runs after
    that many. ``verify``: refuse to start unless this checkout's rule was registered strictly before its
    commit (:func:`tiltlab.llm.experiments.shards.verify_run`). Returns the keys stored."""
    todo = [p for p in plan if not store.has(p[0])][: max_runs if max_runs is not None else None]
    if not todo:
        return []
    prov = shards.provenance(CHECK_NAME)
    if verify:
        shards.verify_run({**prov, "key": "(this checkout)"}, "disa.llm.real_model_training")
    cores = list(range(jobs)) if jobs > 1 else [None]
    free, done_keys = list(cores), []
    bar = tqdm(total=len(todo), desc=f"llm check real comparison: {desc}", unit="run", leave=False)
    with tempfile.TemporaryDirectory(prefix="tiltlab-real-comparison-") as tmp, cf.ThreadPoolExecutor(len(cores)) as ex:
        pending: dict[cf.Future, tuple[tuple, int | None, dict]] = {}
        queue = list(todo)
        while queue or pending:
            while queue and free:
                item, core = queue.pop(0), free.pop(0)
                key, arm, seed, lr = item
                scratch = Path(tmp) / key
                scratch.mkdir()
                eval_on = "tune" if key.startswith("tune-") else "heldout"
                fut = ex.submit(one_run, arm, task, scratch, seed, steps, core, start, lr=lr or LR, eval_on=eval_on)
                pending[fut] = (item, core, shards.provenance(CHECK_NAME))
            finished, _ = cf.wait(list(pending), return_when=cf.FIRST_COMPLETED)
            for fut in finished:
                (key, arm, seed, lr), core, started = pending.pop(fut)
                free.append(core)
                res = fut.result()  # a failed run raises here, naming its arm and seed
                result = {"phase": key.split("-", 1)[0], "arm": arm, "seed": seed, "lr": lr, "steps": steps, **{
                    k: res[k] for k in ("eval", "trained", "train_numbers", "train_s") if k in res}}  # fmt: skip
                store.put(key, result, started)
                shutil.rmtree(Path(tmp) / key, ignore_errors=True)  # the trained weights (540 MB a run)
                done_keys.append(key)
                bar.update(1)
    bar.close()
    return done_keys


def _runs_of(store: RunStore, plan: Sequence[tuple], verify: bool) -> dict[str, dict]:
    runs = store.runs([p[0] for p in plan])
    if verify:
        for r in runs.values():
            shards.verify_run(r, "disa.llm.real_model_training")
    for key, arm, seed, lr in plan:
        r = runs[key]
        if (r.get("arm"), r.get("seed"), r.get("lr")) != (arm, seed, lr):
            raise ValueError(
                f"stored run {key!r} is {r.get('arm')} seed {r.get('seed')} lr {r.get('lr')}, not its key's"
            )
    return runs


def tuning_values(store: RunStore, task: dict, verify: bool) -> dict[str, Any]:
    """The record's tuning part: the tuning prompt ids and formats and every tuning run's per-prompt values."""
    tune = load_prompts(task["tune"])
    runs = _runs_of(store, tuning_plan(), verify)
    return {
        "tune_ids": [str(r["id"]) for r in tune],
        "tuning": [
            {
                "arm": r["arm"],
                "seed": r["seed"],
                "lr": r["lr"],
                "correct": r["eval"]["correct"],
                "answers": r["eval"]["answers"],
            }
            for r in runs.values()
        ],
    }


@functools.cache
def comparison_raw(
    seed: int,
    n_seeds: int | None = None,
    steps: int = STEPS,
    jobs: int | None = None,
    store: str | None = None,
    verify: bool | None = None,
) -> dict[str, Any]:
    """The whole experiment once per (seed, size, store): the task, the tuning runs, the choice, the pilot's
    final runs, the power rule's size (``n_seeds``: a fixed size instead), the other final runs; each run
    the store lacks is run, ``jobs`` at a time (default: the check runner's seed jobs), and stored as it
    finishes (a sitting that stops keeps what finished: ``python -m tiltlab.llm.checks.comparison_run run``
    runs one shard). ``verify`` (default: for the checkout's own store, :func:`must_verify`): every run's rule
    registered strictly before it."""
    from safetensors.torch import load_file

    jobs = seed_pool.get_jobs() if jobs is None else jobs  # the runner's --jobs (seed_pool.set_jobs)
    st = RunStore(default_store() if store is None else store)
    verify = must_verify(st) if verify is None else verify
    model_dir = str(resolve_model(ALIAS))  # one-line error naming the pip command when not installed
    start = load_file(str(Path(model_dir) / "model.safetensors"))
    task = ensure_task(st, model_dir, seed)
    run_missing(st, tuning_plan(), task, steps, jobs, start, verify=verify, desc="tuning")
    tv = tuning_values(st, task, verify)
    choice = choose(tuning_table(tv))
    n_pilot = N_PILOT if n_seeds is None else n_seeds
    pilot = final_plan(seed, choice, n_pilot)
    run_missing(st, pilot, task, steps, jobs, start, verify=verify, desc="final (pilot)")
    held = load_prompts(task["heldout"])
    rows = [{"id": str(r["id"]), "answer_format": r.get("answer_format")} for r in held]
    pm = {}
    for _, arm, s, _ in pilot:
        pm.setdefault(arm, {})[s] = run_metrics(st.get(run_key("final", arm, s, choice.get(arm)))["eval"], rows)
    n = n_pilot if n_seeds is not None else n_final(pilot_sd(pm, seed_pool.seeds_for(seed, n_pilot)))[0]
    plan = final_plan(seed, choice, n)
    run_missing(st, plan, task, steps, jobs, start, verify=verify, desc="final")
    final = _runs_of(st, plan, verify)
    runs = {(r["arm"], r["seed"]): r for r in final.values()}
    summary = {k: task[k] for k in ("n_labelled", "n_kept", "n_train", "n_heldout", "mean_pass_all", "mean_pass_train")}
    summary.update(n_fit=task["n_fit"], n_tune=task["n_tune"])
    return {"held": held, "task": summary, "task_s": task["task_s"], "seeds": list(seed_pool.seeds_for(seed, n)),
            "runs": runs, "steps": steps, "tuning": tv, "choice": choice, "sized": n_seeds is None}  # fmt: skip


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
    if "tuning" in values:
        reported.update(protocol_numbers(values, m, seeds))
    return items, reported


def protocol_numbers(
    values: Mapping[str, Any], m: Mapping[str, Mapping[int, Mapping[str, float]]], seeds: Sequence[int]
) -> dict[str, float]:
    """The tuned design's re-derivable numbers: every tuning cell's mean Mean@8, each arm's chosen rate
    (:func:`choose`), the pilot's sd and the size the power rule gives (:func:`n_final`) with its power.
    Raises when a final run was not trained at its arm's chosen rate, or a sized record does not hold the
    number of runs the rule gives."""
    table = tuning_table(values)
    choice = choose(table)
    nums: dict[str, float] = {}
    for arm, by_lr in table.items():
        for lr, v in by_lr.items():
            nums[f"tune_{arm}" + ("" if arm == "base" else f"_lr{lr:g}") + "_mean8"] = sum(v) / len(v)
    nums.update({f"{arm}_chosen_lr": lr for arm, lr in choice.items()})
    for run in values["runs"]:
        if run["arm"] != "base" and float(run["lr"]) != choice[run["arm"]]:
            raise ValueError(
                f"final run {run['arm']} seed {run['seed']} trained at lr {run['lr']:g}, not its chosen {choice[run['arm']]:g}"
            )
    n_pilot = min(N_PILOT, len(seeds))
    sd = pilot_sd(m, list(seeds)[:n_pilot])
    n, pw = n_final(sd)
    nums.update(pilot_sd=sd, power_rule_n=float(n), power_rule_power=pw, final_runs=float(len(seeds)))
    nums["power_at_final_runs"] = power(len(seeds), sd)
    if values.get("sized") and len(seeds) != n:
        raise ValueError(
            f"the record holds {len(seeds)} final runs per arm; the power rule gives {n} (pilot sd {sd:.4f})"
        )
    return nums


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
    if "tuning" in raw:
        nums.update(protocol_numbers(raw_values(raw), m, seeds))
    return nums


def raw_values(raw: dict[str, Any]) -> dict[str, Any]:
    """The per-prompt values of every run (the held-out prompt ids and answer formats in order), for the
    record: what :func:`recorded_metrics` re-derives every run's metrics from."""
    out = {
        "heldout_ids": [str(r["id"]) for r in raw["held"]],
        "answer_formats": [str(r.get("answer_format")) for r in raw["held"]],
        "runs": [
            {"arm": a, "seed": s, "correct": r["eval"]["correct"], "answers": r["eval"]["answers"]}
            | ({"lr": r["lr"]} if "tuning" in raw else {})
            for (a, s), r in sorted(raw["runs"].items(), key=lambda kv: (kv[0][1], kv[0][0]))
        ],
    }
    if "tuning" in raw:  # the tuned design: the tuning runs and the size rule re-derive too
        out.update(raw["tuning"], sized=raw["sized"])
    return out


def _lr_text(raw: dict[str, Any]) -> str:
    if "choice" not in raw:
        return f"lr {LR:g}"
    chosen = ", ".join(f"{a} {raw['choice'][a]:g}" for a in ARMS)
    return (
        f"lr chosen per arm from {{{', '.join(f'{x:g}' for x in TUNE_LRS)}}} by tuning-split Mean@8 "
        f"({len(TUNE_SEEDS)} runs per rate and arm on {raw['task']['n_tune']} tuning prompts): {chosen}"
    )


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
        f"{_lr_text(raw)}, {len(seeds)} training runs per arm; per arm (95% t-CIs over runs): {arms}; items: "
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
def real_model_comparison(seed: int, n_seeds: int | None = None, steps: int = STEPS) -> CheckResult:
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
def real_model_vs_kl_grpo(seed: int, n_seeds: int | None = None, steps: int = STEPS) -> CheckResult:
    return _result(comparison_raw(seed, n_seeds, steps), SECONDARY, "DISA minus GRPO+KL (secondary)")


def shard_plan(store: RunStore, phase: str, seed: int) -> list[tuple[str, str, int, float | None]]:
    """The plan a ``run --phase`` sitting draws its shard from: every tuning run; or, once all tuning runs
    are stored, the pilot's final runs until they are stored, then all final runs the power rule sizes."""
    if phase == "tune":
        return tuning_plan()
    missing = store.missing(p[0] for p in tuning_plan())
    if missing:
        raise ValueError(f"the final runs need every tuning run first: {len(missing)} missing (e.g. {missing[0]})")
    task = json.loads((store.root / "task" / "task.json").read_text(encoding="utf-8"))
    tv = tuning_values(store, {**task, "tune": str(store.root / "task" / task["tune"])}, verify=False)
    choice = choose(tuning_table(tv))
    pilot = final_plan(seed, choice, N_PILOT)
    if store.missing(p[0] for p in pilot):
        return pilot
    held = load_prompts(store.root / "task" / task["heldout"])
    rows = [{"id": str(r["id"]), "answer_format": r.get("answer_format")} for r in held]
    m: dict[str, dict[int, dict[str, float]]] = {}
    for key, arm, s, _ in pilot:
        m.setdefault(arm, {})[s] = run_metrics(store.get(key)["eval"], rows)
    return final_plan(seed, choice, n_final(pilot_sd(m, seed_pool.seeds_for(seed, N_PILOT)))[0])


def _shard(text: str) -> tuple[int, int]:
    i, sep, k = text.partition("/")
    try:
        index, of = int(i), int(k)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shard is I/K (shard I of K, from 0), got {text!r}") from None
    if not sep or of < 1 or not 0 <= index < of:
        raise argparse.ArgumentTypeError(f"--shard is I/K with 0 <= I < K, got {text!r}")
    return index, of


def main(argv: Sequence[str] | None = None) -> int:
    """``run --phase tune|final [--shard I/K]``: one sitting's shard of the experiment, each finished run
    stored with its commit, date and machine; ``status``: what the store holds; ``eval MODEL HELDOUT SEED
    OUT``: one evaluation in its own process (:func:`eval_in_process` runs it through :data:`_EVAL_MAIN`)."""
    p = argparse.ArgumentParser(prog="python -m tiltlab.llm.checks.comparison_run")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run one shard of the tuning or the final runs (each stored as it finishes)")
    r.add_argument("--phase", choices=("tune", "final"), required=True)
    r.add_argument("--shard", type=_shard, default=(0, 1), help="I/K: every K-th run of the phase from I (default 0/1)")
    r.add_argument("--max-runs", type=int, default=None, help="start at most this many runs (a sitting's budget)")
    r.add_argument("--jobs", type=int, default=2, help="runs at a time, each on its own core (default 2)")
    r.add_argument("--seed", type=int, default=0, help="the check seed (default 0)")
    r.add_argument("--store", default=None, help=f"the run store (default: {STORE} in the checkout)")
    st = sub.add_parser("status", help="how many runs of each phase the store holds")
    st.add_argument("--seed", type=int, default=0)
    st.add_argument("--store", default=None)
    e = sub.add_parser("eval", help="evaluate one model on the held-out prompts")
    e.add_argument("model")
    e.add_argument("heldout")
    e.add_argument("seed", type=int)
    e.add_argument("out")
    a = p.parse_args(argv)

    if a.cmd == "eval":
        atomic_write_json(Path(a.out), evaluate(a.model, load_prompts(a.heldout), a.seed))
        return 0
    store = RunStore(default_store() if a.store is None else a.store)
    if a.cmd == "status":
        tune = tuning_plan()
        print(f"tuning: {len(tune) - len(store.missing(k for k, *_ in tune))}/{len(tune)} runs stored")
        try:
            plan = shard_plan(store, "final", a.seed)
            print(f"final: {len(plan) - len(store.missing(k for k, *_ in plan))}/{len(plan)} runs stored")
        except (ValueError, FileNotFoundError) as err:
            print(f"final: not yet ({err})")
        return 0
    if a.max_runs is not None and a.max_runs < 1:
        p.error(f"--max-runs must be at least 1, got {a.max_runs}")
    from safetensors.torch import load_file

    model_dir = str(resolve_model(ALIAS))
    task = ensure_task(store, model_dir, a.seed)
    plan = shard_plan(store, a.phase, a.seed)
    keys = set(shards.shard_keys([k for k, *_ in plan], *a.shard))
    mine = [x for x in plan if x[0] in keys]
    start = load_file(str(Path(model_dir) / "model.safetensors"))
    done = run_missing(
        store, mine, task, STEPS, a.jobs, start, verify=must_verify(store), max_runs=a.max_runs, desc=a.phase
    )
    left = len(store.missing(k for k, *_ in mine))
    print(
        f"{a.phase} shard {a.shard[0]}/{a.shard[1]}: {len(done)} run(s) stored this sitting, {left} of its {len(mine)} left"
    )
    return 0
