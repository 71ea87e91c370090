"""Stage-1 labels on a real pretrained model: SmolLM2-135M-Instruct (``--model smollm2-135m``).

The enumerable task (:mod:`tiltlab.llm.experiments.task`) has exact ``log Z``; a real instruct model
answering free text does not. What a real model adds is the thing the tiny task cannot show: how
spread the *sequence* log-weights ``log w = log pi_ref(y|x) + beta r - log q(y|x)`` of a proposal
are once completions are tens of tokens long, and what that does to the labels. So this check
runs DISA Stage 1 as users run it (:func:`tiltlab.llm.disa.stage1.run_stage1` on the vLLM proposal
engine, ``pi_ref`` scored by the same engine's prompt log-probs, labels written to Parquet) on
:data:`QUESTIONS`, short arithmetic questions the 135M model answers correctly some of the time:

* ``pi_ref``: SmolLM2-135M-Instruct at temperature 1 (its raw distribution);
* ``q``: the same model at temperature :data:`Q_TEMPERATURE` (a proposal that is not ``pi_ref``,
  like the paper's proposal sampled at its evaluation temperature) -- same tokenizer, full support;
* ``q`` truncated: the same with ``top_p =`` :data:`TRUNC_TOP_P` (log-probs of the truncated,
  renormalized sampler, as vLLM returns them);
* an independent estimate of ``log Z``: for a 0/1 reward ``Z = 1 + p_ref (e^beta - 1)``, with
  ``p_ref`` the pass rate of :data:`N_REF` samples of ``pi_ref`` (Stage 1 with ``q = pi_ref``).

The reward is the math verifier without the ``\\boxed`` requirement (the 135M model rarely
boxes). Units of the intervals are prompts: each prompt's numbers are averaged over its seeds
(the seeds of one prompt share its question, so they are not independent evidence).
"""

from __future__ import annotations

import math
import statistics
import tempfile
import warnings
from pathlib import Path

import torch

from tiltlab.claims import stats
from tiltlab.claims.registry import CheckResult, Verdict, register_check
from tiltlab.llm.base.models import resolve_model
from tiltlab.llm.base.rewards import math_reward
from tiltlab.llm.disa.stage1 import Stage1Config, load_stage1, run_stage1, vllm_proposal_engine
from tiltlab.llm.experiments import pool
from tiltlab.objectives.estimators import effective_sample_size, log_partition_lse, log_z_from_pass_rate

from . import rules

ALIAS = "smollm2-135m"
QUESTIONS: tuple[tuple[str, str], ...] = (
    ("2 + 3", "5"),
    ("4 + 5", "9"),
    ("7 + 8", "15"),
    ("6 + 9", "15"),
    ("12 + 9", "21"),
    ("23 + 14", "37"),
    ("45 + 37", "82"),
    ("58 + 67", "125"),
    ("10 - 4", "6"),
    ("15 - 7", "8"),
    ("92 - 35", "57"),
    ("3 times 4", "12"),
    ("6 times 7", "42"),
    ("9 times 8", "72"),
    ("12 times 11", "132"),
    ("100 + 200", "300"),
)
"""``(expression, answer)``; the prompt is "What is <expression>? Answer with just the number."."""
BETA = 2.0
Q_TEMPERATURE = 0.7
TRUNC_TOP_P = 0.9
M = 16
M_SMALL = 4
N_REF = 64
MAX_NEW_TOKENS = 48
N_SEEDS = 3
SPREAD_NATS = 1.0
ESS_FRACTION = 0.5
SPREAD_MARGIN = 0.25
"""Smallest effect of interest of sd(log w) - 1 nat (nats)."""
ESS_MARGIN = 0.05
"""Smallest effect of interest of 0.5 - ESS/M."""
MSE_MARGIN = 0.05
"""Smallest effect of interest of a squared-label-error difference (nats^2)."""
LABEL_MARGIN = 0.05
"""Smallest effect of interest of a label difference (nats)."""


def unboxed_math_reward(prompts, completions, completion_ids=None, **kwargs) -> list[float | None]:
    """:func:`tiltlab.llm.base.rewards.math_reward` with ``require_boxed=False``: an unboxed answer is
    parsed by math-verify's default extraction (the last expression) instead of scoring 0."""

    return math_reward(prompts, completions, completion_ids, require_boxed=False, **kwargs)


def question_rows(n: int | None = None) -> list[dict]:
    qs = QUESTIONS[:n] if n is not None else QUESTIONS
    return [
        {"id": f"arith-{i:02d}", "prompt": f"What is {e}? Answer with just the number.", "answer": a}
        for i, (e, a) in enumerate(qs)
    ]


def _config(model_dir: str, out: Path, seed: int, m: int, temperature: float, top_p: float, max_new_tokens: int):

    return Stage1Config(
        proposal=model_dir,
        reference=model_dir,
        dataset="tiltlab.llm.checks.stage1_real:QUESTIONS",
        out_dir=str(out),
        M=m,
        tilt_beta=BETA,
        temperature=temperature,
        top_p=top_p,
        allow_truncated=top_p < 1.0,
        max_new_tokens=max_new_tokens,
        seed=seed,
        engine="vllm",
        prompts_per_shard=len(QUESTIONS),
    )


def run_labels(engine, cfg, rows: list[dict]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run Stage 1 for ``cfg`` on ``engine``; ``(log_w [P, M], label [P], pass rate [P])`` read back
    from the Parquet files it wrote (rows in the order of ``rows``)."""

    with warnings.catch_warnings():  # the truncation warning: truncating is what is measured here
        warnings.simplefilter("ignore", RuntimeWarning)
        run_stage1(cfg, rows=rows, reward_fn=unboxed_math_reward, progress=False, engine=engine)
    samples, labels = load_stage1(cfg.out_dir)
    pos = {r["id"]: i for i, r in enumerate(rows)}
    log_w = torch.full((len(rows), cfg.M), math.nan, dtype=torch.float64)
    for pid, j, lw in zip(
        samples["prompt_id"].to_pylist(), samples["sample_idx"].to_pylist(), samples["log_w"].to_pylist()
    ):
        log_w[pos[pid], j] = lw
    label = torch.full((len(rows),), math.nan, dtype=torch.float64)
    passed = torch.full((len(rows),), math.nan, dtype=torch.float64)
    for pid, lz, mr in zip(
        labels["prompt_id"].to_pylist(), labels["log_z"].to_pylist(), labels["mean_reward"].to_pylist()
    ):
        label[pos[pid]], passed[pos[pid]] = lz, mr
    if torch.isnan(log_w).any() or torch.isnan(label).any():
        raise RuntimeError(f"Stage 1 output in {cfg.out_dir} misses samples or labels")
    if not torch.allclose(label, log_partition_lse(log_w), rtol=0, atol=1e-9):  # rows read back in order
        raise RuntimeError(f"Stage 1 labels in {cfg.out_dir} do not match their samples' log-weights")
    return log_w, label, passed


def unit_numbers(
    log_w: torch.Tensor, log_w_trunc: torch.Tensor, log_z_ref: torch.Tensor, m_small: int
) -> dict[str, list[float]]:
    """Per-prompt quantities of one seed. ``log_w``/``log_w_trunc``: ``[P, M]`` (full / truncated
    proposal); ``log_z_ref``: ``[P]`` the independent estimate. M-sample labels use all ``M``
    weights; ``m_small`` labels the ``M / m_small`` disjoint groups of ``m_small`` weights."""
    p, m = log_w.shape
    if m % m_small:
        raise ValueError(f"M={m} is not a multiple of m_small={m_small}")
    lab = log_partition_lse(log_w)  # [P]
    lab_small = log_partition_lse(log_w.view(p, m // m_small, m_small))  # [P, G]
    lab_trunc = log_partition_lse(log_w_trunc)
    err, err_small = lab - log_z_ref, lab_small - log_z_ref[:, None]
    return {
        "sd_log_w": log_w.std(-1).tolist(),
        "ess_fraction": (effective_sample_size(log_w) / m).tolist(),
        "sq_err_m": err.pow(2).tolist(),
        "sq_err_small": err_small.pow(2).mean(-1).tolist(),
        "mse_gain": (err_small.pow(2).mean(-1) - err.pow(2)).tolist(),
        "bias_m": err.tolist(),
        "bias_small": err_small.mean(-1).tolist(),
        "trunc_minus_full": (lab_trunc - lab).tolist(),
        "trunc_bias": (lab_trunc - log_z_ref).tolist(),
    }


def cluster_by_prompt(units: dict[str, list[float]], n_prompts: int, n_seeds: int) -> dict[str, list[float]]:
    """Prompt-clustered units: each prompt's numbers averaged over the seeds (``units[k]`` holds
    seed-major rows: seed 0's prompts, then seed 1's, ...). The seeds of one prompt are not
    independent evidence, so every interval has ``n_prompts - 1`` degrees of freedom."""
    out = {}
    for k, xs in units.items():
        if len(xs) != n_prompts * n_seeds:
            raise ValueError(f"{k}: {len(xs)} values for {n_prompts} prompts x {n_seeds} seeds")
        out[k] = [sum(xs[s * n_prompts + i] for s in range(n_seeds)) / n_seeds for i in range(n_prompts)]
    return out


def decide(units: dict[str, list[float]], passes: dict[str, list[float]], n_p: int, n_seeds: int):
    """The pre-registered rule on the per-(prompt, seed) numbers of :func:`unit_numbers`, clustered by prompt:
    ``(verdict, numbers, items, clustered, rule items, rule numbers)``."""
    clustered = cluster_by_prompt(units, n_p, n_seeds)
    nums: dict[str, float] = {}
    for k, xs in clustered.items():
        nums.update(stats.ci_numbers(k, xs))
    for k, xs in passes.items():
        nums[f"pass_rate_{k}"] = sum(xs) / len(xs)
    nums["median_sd_log_w"] = statistics.median(units["sd_log_w"])
    nums["n_prompts"] = n_p
    items = [
        rules.Item("log_w_spread", tuple(x - SPREAD_NATS for x in clustered["sd_log_w"]), margin=SPREAD_MARGIN),
        rules.Item("ess_below_half", tuple(ESS_FRACTION - x for x in clustered["ess_fraction"]), margin=ESS_MARGIN),
        # both hold in expectation by construction (more samples cannot raise an estimator's MSE; a
        # top-p proposal drops the tail mass from every label): reported, never judged
        rules.Item("m16_beats_m4", tuple(clustered["mse_gain"]), margin=MSE_MARGIN, kind="context"),
        rules.Item(
            "top_p_biases_low", tuple(-x for x in clustered["trunc_minus_full"]), margin=LABEL_MARGIN, kind="context"
        ),
    ]
    ran = {"ran_weights_vary": max(units["sd_log_w"]) > 0, "ran_labels_differ": max(map(abs, units["mse_gain"])) > 0}
    verdict, rnums, flags, j = rules.judge(items, ran, unit="prompt")
    nums.update(rnums)
    return verdict, nums, flags, clustered, j


@register_check(
    "disa.llm.stage1_real_model",
    layer="llm",
    expected=Verdict.VERIFIED,
    slow=True,
    name="smollm2_135m_vllm",
    expected_items={
        **{f"{k}_supports": True for k in ("log_w_spread", "ess_below_half")},
        **{f"{k}_against": False for k in ("log_w_spread", "ess_below_half")},
        "ran_weights_vary": True,
        "ran_labels_differ": True,
    },
)
@pool.fixed_threads
def stage1_real_model(
    seed: int,
    n_seeds: int = N_SEEDS,
    n_prompts: int | None = None,
    m: int = M,
    m_small: int = M_SMALL,
    n_ref: int = N_REF,
    max_new_tokens: int = MAX_NEW_TOKENS,
) -> CheckResult:

    model_dir = str(resolve_model(ALIAS))  # one-line error naming the pip command when not installed
    rows = question_rows(n_prompts)
    units: dict[str, list[float]] = {}
    passes: dict[str, list[float]] = {"ref": [], "q": [], "q_trunc": []}
    with tempfile.TemporaryDirectory(prefix="tiltlab-stage1-real-") as tmp:
        root = Path(tmp)
        engine = vllm_proposal_engine(_config(model_dir, root / "engine", seed, m, 1.0, 1.0, max_new_tokens))
        try:
            for s in pool.seeds_for(seed, n_seeds, "stage1_real_model"):

                def labels(name: str, mm: int, temperature: float, top_p: float, s: int = s):
                    cfg = _config(model_dir, root / f"{name}-{s}", s, mm, temperature, top_p, max_new_tokens)
                    return run_labels(engine, cfg, rows)

                _, _, p_ref = labels("ref", n_ref, 1.0, 1.0)
                log_w, _, p_q = labels("q", m, Q_TEMPERATURE, 1.0)
                log_w_tr, _, p_tr = labels("q_trunc", m, Q_TEMPERATURE, TRUNC_TOP_P)
                log_z_ref = log_z_from_pass_rate(p_ref, beta=BETA).double()
                for k, v in unit_numbers(log_w, log_w_tr, log_z_ref, m_small).items():
                    units.setdefault(k, []).extend(v)
                for k, v in (("ref", p_ref), ("q", p_q), ("q_trunc", p_tr)):
                    passes[k].extend(v.tolist())
        finally:
            engine.close()
    verdict, nums, flags, clustered, j = decide(units, passes, len(rows), n_seeds)
    return CheckResult(
        verdict,
        f"SmolLM2-135M-Instruct on vLLM, {len(rows)} arithmetic prompts x {n_seeds} seeds, beta={BETA:g}, "
        f"pi_ref = the model at T=1, q = the model at T={Q_TEMPERATURE:g}, M={m}; pass rates pi_ref {nums['pass_rate_ref']:.3f}, q "
        f"{nums['pass_rate_q']:.3f}, q top-p {TRUNC_TOP_P:g} {nums['pass_rate_q_trunc']:.3f}; sd(log w) median "
        f"{nums['median_sd_log_w']:.2f} nats; ESS/M {stats.fmt_ci(clustered['ess_fraction'])}; squared label error vs "
        f"log(1 + p_ref(e^beta - 1)) from {n_ref} pi_ref samples: M={m_small} {stats.fmt_ci(clustered['sq_err_small'])}, "
        f"M={m} {stats.fmt_ci(clustered['sq_err_m'])}; label bias M={m_small} "
        f"{stats.fmt_ci(clustered['bias_small'])}, M={m} {stats.fmt_ci(clustered['bias_m'])}; 95% t-CIs over prompts (each "
        f"prompt's seeds averaged: prompt-clustered); items: {rules.describe(j)}; {rules.rule_text('per-prompt')}",
        nums,
        items=flags,
        evidence=j.evidence(),
    )
