"""Stage 1's run: shards sampled, scored, rewarded and weighted in order, each recorded in the manifest
as it finishes (:func:`run_stage1`)."""

from __future__ import annotations

import contextlib
import os
import sys
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

from tiltlab.files import write_parquet
from tiltlab.hints import hint
from tiltlab.llm.base.data import load_prompts
from tiltlab.llm.base.models import default_device
from tiltlab.llm.base.rewards import resolve_reward
from tiltlab.llm.disa.stage1.config import CRASH_ENV, MANIFEST, Stage1Config
from tiltlab.llm.disa.stage1.engines import (
    _hf_reference_logprobs,
    _loud_truncation_warning,
    _Models,
    _vllm_reference_logprobs,
)
from tiltlab.llm.disa.stage1.manifest import (
    _identity,
    _signal_record,
    _summary,
    atomic_write_json,
    load_stage1,
    read_manifest,
)
from tiltlab.progress import progress as progress_bar

# ---------------------------------------------------------------------------------------------
# data, prompts, rewards
# ---------------------------------------------------------------------------------------------


def _load_rows(dataset: str) -> list[dict]:

    return list(load_prompts(dataset))


def _crash_hook(shard_done: int, phase: str) -> None:
    spec = os.environ.get(CRASH_ENV)
    if not spec:
        return
    k, _, when = spec.partition(":")
    if int(k) == shard_done and (when or "after_manifest") == phase:
        sys.stderr.write(f"[{CRASH_ENV}] simulated crash after shard {shard_done} ({phase})\n")
        sys.stderr.flush()
        os._exit(86)


def run_stage1(
    cfg: Stage1Config,
    *,
    rows: list[dict] | None = None,
    reward_fn: Callable | None = None,
    progress: bool = True,
    engine=None,
    reference_engine=None,
) -> dict:
    """Run (or resume) Stage 1 and return a summary dict (also stored in the manifest).

    Args:
        cfg: the configuration.
        rows: programmatic prompt rows (``id``, ``prompt`` and reward fields) instead of
            ``cfg.dataset`` (which is then only recorded).
        reward_fn: programmatic reward with TRL's signature
            ``f(prompts, completions, completion_ids, **columns) -> list[float]`` (columns = the
            rows' other fields, one entry per completion) instead of ``cfg.reward``; its
            ``__qualname__`` is recorded.
        engine: a ready proposal :class:`~tiltlab.llm.base.rollout.RolloutEngine` of ``cfg.proposal``
            (e.g. one vLLM engine shared by several runs) instead of building one from ``cfg``.
        reference_engine: a ready :class:`~tiltlab.llm.base.rollout.VLLMEngine` of ``cfg.reference`` that
            scores pi_ref when ``reference_scoring`` resolves to a second engine (instead of starting one).
    """
    import torch

    from tiltlab.objectives import estimators as est

    if cfg.truncated_support:
        if not cfg.allow_truncated:
            bad = cfg.truncating()
            fixes = [hint("untruncated_top_k")] * (cfg.top_k > 0) + [hint("untruncated_top_p")] * (cfg.top_p < 1.0)
            raise ValueError(
                f"the sampler truncates the proposal's support ({' and '.join(bad)}), which breaks DISA's "
                "absolute-continuity condition (App. C.1) and biases log Z_hat low. Use "
                f"{' and '.join(fixes)}, or {hint('allow_truncated')}."
            )
        _loud_truncation_warning(cfg)

    # the inputs are checked before anything is written to out_dir
    rows = list(rows) if rows is not None else _load_rows(cfg.dataset)
    if cfg.max_prompts is not None:
        rows = rows[: cfg.max_prompts]
    if not rows:
        raise ValueError(f"no prompts to process: the dataset {cfg.dataset!r} has no rows")
    ids = [str(r["id"]) for r in rows]
    if len(set(ids)) != len(ids):
        raise ValueError("prompt ids must be unique within the dataset")
    reward = resolve_reward(reward_fn if reward_fn is not None else cfg.reward)
    out = Path(cfg.out_dir)
    reward_name = getattr(reward_fn, "__qualname__", repr(reward_fn)) if reward_fn is not None else cfg.reward

    n_shards = (len(rows) + cfg.prompts_per_shard - 1) // cfg.prompts_per_shard
    identity = _identity(cfg, reward_name, ids, rows, cfg.device or default_device())
    man_path = out / MANIFEST
    manifest = read_manifest(out) if man_path.exists() else None
    if manifest is not None:
        old = manifest.get("identity", {})
        diff = {k: (old.get(k), v) for k, v in identity.items() if old.get(k) != v}
        if diff and manifest.get("shards"):
            raise ValueError(
                f"{out} holds a Stage 1 run with a different configuration {diff} (recorded, requested); "
                "use another out_dir or the same settings to resume"
            )
        if diff:  # nothing was produced under the old settings: start afresh
            warnings.warn(f"{out}: replacing a Stage 1 manifest with no finished shard", RuntimeWarning, stacklevel=2)
            manifest = None
    if manifest is None:
        manifest = {
            "format": "tiltlab.stage1/1",
            "identity": identity,
            "shards": {},
            "complete": False,
            "config": asdict(cfg),
            "resumes": [],
        }
    else:  # a resume keeps the first run's config and records what else it changed
        changed = {k: v for k, v in asdict(cfg).items() if manifest.get("config", {}).get(k) != v}
        manifest.setdefault("resumes", []).append(changed)
    manifest.update(
        {
            "n_prompts": len(rows),
            "n_shards": n_shards,
            "tilt_beta": cfg.tilt_beta,
            "reward_transform": {**cfg.reward_transform(), "reward": reward_name},
            "truncated_support": cfg.truncated_support,
            # log w uses masked-SUM sequence log-probs (trajectory level); Stage 3 must use the same scale
            "logprob_scale": "sum",
            "label": "log_z = LSE_i(log w_i) - log M (DISA eq. 8); log_z_bias_corrected = log_z - delta_method_bias",
        }
    )

    todo = [k for k in range(n_shards) if str(k) not in manifest["shards"]]
    # every refusal (tokenizers, context lengths) happens here, before the first write
    clock = _PhaseTimer()
    with clock("setup"):
        models = (
            _Models(cfg, rows, engine=engine, show_progress=progress, reference_engine=reference_engine)
            if todo
            else None
        )
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob(".*.tmp-*"):  # temporaries of a run killed mid-write
        stale.unlink()
    if models is not None:
        manifest["reference_scoring"] = models.scoring_record  # this invocation's; each shard records its own
    atomic_write_json(man_path, manifest)
    pp = cfg.prompts_per_shard
    # the bar counts this invocation's prompts, so a resumed run's rate and ETA are its own
    resumed = f" (resumed: {n_shards - len(todo)}/{n_shards} shards done)" if len(todo) < n_shards else ""
    bar = progress_bar(
        sum(len(rows[k * pp : (k + 1) * pp]) for k in todo),
        desc=f"stage1{resumed}",
        unit="prompt",
        mode=None if progress else "off",
    )

    def finish(k: int, shard: dict, scored) -> None:
        """Weights, labels and the atomic writes of shard ``k`` (in shard order, in this thread)."""
        sl = slice(k * pp, (k + 1) * pp)
        if isinstance(scored, Future):  # scored by the reference engine while later shards were sampled
            with clock("score_wait"):
                scored, seconds = scored.result()
            clock.seconds["score"] = clock.seconds.get("score", 0.0) + seconds
        samples, labels = _run_shard(cfg, models, rows[sl], sl, k, reward, est, torch, clock, shard, scored)
        s_name, l_name = f"samples-{k:05d}.parquet", f"labels-{k:05d}.parquet"
        with clock("io"):
            write_parquet(out / s_name, samples, fsync=True)
            write_parquet(out / l_name, labels, fsync=True)
        _crash_hook(k + 1, "before_manifest")
        manifest["shards"][str(k)] = {
            "samples": s_name,
            "labels": l_name,
            "n_prompts": len(rows[sl]),
            "n_samples": samples.num_rows,
            "prompt_ids": ids[sl],
            "reference_scoring": {"path": models.scoring_record, **scored[1]},
        }
        atomic_write_json(man_path, manifest)
        bar.update(len(rows[sl]), postfix=f"shard {k + 1}/{n_shards} written")
        _crash_hook(k + 1, "after_manifest")

    # a second (reference) engine scores shard k in a worker thread while the proposal samples
    # shard k + 1; shards are still finished and written one by one, in order
    pool = ThreadPoolExecutor(1, thread_name_prefix="stage1-score") if models and models.ref_engine else None
    try:
        pending = None
        for k in todo:
            sl = slice(k * pp, (k + 1) * pp)
            clock.on_phase = lambda phase, k=k: bar.update(0, postfix=f"shard {k + 1}/{n_shards}: {phase}")
            shard = _sample_shard(cfg, models, rows[sl], sl, k, clock)
            if pool is None:
                with clock("score"):
                    scored = _score_reference(models, shard, cfg, torch)
                finish(k, shard, scored)
                continue
            future = pool.submit(_timed, _score_reference, models, shard, cfg, torch)
            if pending is not None:
                finish(*pending)
            pending = (k, shard, future)
        if pending is not None:
            finish(*pending)
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        if models is not None:
            models.close()
    bar.close()

    samples, lab = load_stage1(out)
    summary = _summary(lab, cfg)
    # vacuous-run guard: one warning line per condition, recorded in the manifest ([] = checked, none held)
    manifest["signal"] = _signal_record(samples, lab, cfg)
    summary["signal_warnings"] = [f["kind"] for f in manifest["signal"]]
    manifest["complete"] = True
    manifest["summary"] = summary
    manifest["seconds"] = clock.seconds  # this invocation's wall time per phase (see _PhaseTimer)
    atomic_write_json(man_path, manifest)
    return summary


class _PhaseTimer:
    """Wall seconds per phase of one invocation: setup (tokenizers, models, engines), sample (the
    proposal engine), score (pi_ref's scoring pass; with a reference engine it runs in a worker thread
    beside the next shard's sampling, and score_wait is the time the main thread waited for it),
    reward, weights (flat layout, log w, labels, tables), io."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.on_phase: Callable[[str], None] | None = None
        """Called with the phase's name as each phase starts (the progress reporter's postfix)."""

    @contextlib.contextmanager
    def __call__(self, phase: str):
        if self.on_phase is not None:
            self.on_phase(phase)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t0

    def total(self, *phases: str) -> float:
        return sum(self.seconds.get(p, 0.0) for p in phases)


def _sample_shard(
    cfg: Stage1Config, models: _Models, shard_rows: list[dict], sl: slice, k: int, clock: _PhaseTimer
) -> dict:
    """Sample shard ``k`` and lay its completions out flat (prompt-major): ``groups``, ``flat_p`` (pi_ref's
    prompt ids), ``flat_c`` (the completion ids pi_ref scores), ``flat_q`` (the proposal's), ``flat_fin``, ``texts``."""
    with clock("sample"):
        groups = models.engine.generate(models.q_prompt_ids[sl], cfg.M, cfg.sampling(k))
    with clock("weights"):
        M = cfg.M
        flat_p = [p for p in models.ref_prompt_ids[sl] for _ in range(M)]
        flat_q = [c for g in groups for c in g.completion_ids]
        flat_fin = [f for g in groups for f in (g.finished or [False] * M)]
        texts = [t for g in groups for t in g.texts]
        if models.retokenize:
            flat_c = [models.reference_completion(t, f) for t, f in zip(texts, flat_fin)]
            if models.ref_context is not None:
                for j, (p, c) in enumerate(zip(flat_p, flat_c)):
                    if len(p) + len(c) > models.ref_context:
                        raise ValueError(
                            f"prompt {shard_rows[j // M]['id']!r}: the re-tokenized completion ({len(c)} tokens) "
                            f"does not fit the reference's context {models.ref_context}; lower max_new_tokens"
                        )
        else:
            flat_c = flat_q
        if any(len(c) == 0 for c in flat_c):
            raise RuntimeError("the engine returned an empty completion (no sampled token to weight)")
    return {
        "groups": groups,
        "flat_p": flat_p,
        "flat_c": flat_c,
        "flat_q": flat_q,
        "flat_fin": flat_fin,
        "texts": texts,
    }


def _score_reference(models: _Models, shard: dict, cfg: Stage1Config, torch):
    """``(log pi_ref [N] float64 or None, facts for the manifest)`` of a sampled shard; None on the
    "sampler" path, where the sampled log-probs are pi_ref's."""
    if models.scoring == "sampler":
        return None, {}
    if models.scoring == "vllm":
        eng = models.ref_engine if models.ref_engine is not None else models.engine
        seq, n_rescored, n_cached = _vllm_reference_logprobs(eng, shard["flat_p"], shard["flat_c"], torch)
        return seq, {"rescored_without_prefix_cache": n_rescored, "tokens_read_from_prefix_cache": n_cached}
    return _hf_reference_logprobs(models, shard["flat_p"], shard["flat_c"], cfg.score_batch_size, torch), {}


def _timed(fn, *args):
    """``(fn(*args), wall seconds)``: the work of the scoring thread, timed there."""
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


def _run_shard(
    cfg: Stage1Config,
    models: _Models,
    shard_rows: list[dict],
    sl: slice,
    k: int,
    reward,
    est,
    torch,
    clock: _PhaseTimer,
    shard: dict,
    scored: tuple,
):
    import pyarrow as pa

    t_rest, inner0 = time.perf_counter(), clock.total("reward")
    groups, flat_c, flat_q, flat_fin, texts = (shard[n] for n in ("groups", "flat_c", "flat_q", "flat_fin", "texts"))
    P, M = len(groups), cfg.M
    ref_pids = models.ref_prompt_ids[sl]
    logp_q = torch.stack([g.seq_logprobs() for g in groups]).double()  # [P, M]
    seq = scored[0]
    # "sampler" path: proposal == reference at temperature 1, untruncated, so log q IS log pi_ref
    logp_ref = logp_q.clone() if seq is None else seq.detach().double().cpu().view(P, M)  # [P, M]
    cols = sorted({c for r in shard_rows for c in r} - {"prompt"})
    kwargs = {c: [r.get(c) for r in shard_rows for _ in range(M)] for c in cols}
    with clock("reward"):
        r_list = reward([r["prompt"] for r in shard_rows for _ in range(M)], texts, flat_c, **kwargs)
    if len(r_list) != P * M or any(v is None for v in r_list):
        raise ValueError("the reward function must return one number per completion (got None or a wrong count)")
    r_raw = torch.tensor(r_list, dtype=torch.float64).view(P, M)  # [P, M]
    if not torch.isfinite(r_raw).all():
        raise ValueError("the reward function returned a non-finite value")
    from tiltlab.objectives.transforms import affine_reward

    r_tilde = affine_reward(r_raw, cfg.reward_scale, cfg.reward_shift)  # the recorded fixed transform
    log_w = est.log_importance_weights(logp_ref, logp_q, cfg.tilt_beta * r_tilde)  # [P, M]

    lab = {
        "log_z": est.log_partition_lse(log_w),
        "log_z_bias_corrected": est.bias_corrected_log_partition(log_w) if M > 1 else torch.full((P,), float("nan")),
        "log_z_geomean": est.log_partition_geomean(log_w),
        "delta_bias": est.delta_method_bias(log_w),
        "ess": est.effective_sample_size(log_w),
        "max_weight": est.max_normalized_weight(log_w),
    }
    labels = pa.table(
        {
            "prompt_id": [str(r["id"]) for r in shard_rows],
            "prompt": [r["prompt"] for r in shard_rows],
            # the exact conditioning string of pi_ref the label belongs to (chat template applied)
            "prompt_text": models.prompt_texts[sl],
            "prompt_n_tokens": pa.array([len(p) for p in ref_pids], pa.int32()),
            "M": pa.array([M] * P, pa.int32()),
            **{name: pa.array(v.tolist(), pa.float64()) for name, v in lab.items()},
            "n_reward_bearing": pa.array((r_raw > 0).sum(-1).tolist(), pa.int32()),
            "mean_reward": pa.array(r_raw.mean(-1).tolist(), pa.float64()),
        }
    )
    scols = {
        "prompt_id": [str(r["id"]) for r in shard_rows for _ in range(M)],
        "sample_idx": pa.array([j for _ in range(P) for j in range(M)], pa.int32()),
        "completion": texts,
        "completion_ids": pa.array(flat_c, pa.list_(pa.int32())),
        "n_tokens": pa.array([len(c) for c in flat_c], pa.int32()),
        "finished": flat_fin,
        "logp_proposal": pa.array(logp_q.flatten().tolist(), pa.float64()),
        "logp_ref": pa.array(logp_ref.flatten().tolist(), pa.float64()),
        "reward_raw": pa.array(r_raw.flatten().tolist(), pa.float64()),
        "reward": pa.array(r_tilde.flatten().tolist(), pa.float64()),
        "log_w": pa.array(log_w.flatten().tolist(), pa.float64()),
    }
    if models.retokenize:
        scols["proposal_completion_ids"] = pa.array(flat_q, pa.list_(pa.int32()))
    out = pa.table(scols), labels
    rest = time.perf_counter() - t_rest - (clock.total("reward") - inner0)
    clock.seconds["weights"] = clock.seconds.get("weights", 0.0) + rest
    return out
