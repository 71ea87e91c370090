"""Evaluation: ``k`` samples per prompt per benchmark -> Mean@k, pass@k, distinct-n, optional LLM-judge diversity.

Estimators come from :mod:`objectives.metrics` (one home for the math, ``docs/math.md`` §6):

* Mean@k = mean over prompts of ``mean_at_k(correct_i)`` (the average accuracy of the k samples);
* pass@k' = mean over prompts of the unbiased ``pass_at_k(n=k, c_i, k')`` = ``1 - C(k-c, k')/C(k, k')``
  (Chen et al. 2021), for every ``k' <= k`` in ``pass_ks``;
* distinct-n = mean over prompts of ``distinct_n(texts of its k samples, n)`` (unique / total
  whitespace n-grams within a prompt's group);
* judge = the DISA App. D.5 / FlowRL diversity judge (Likert 1-5) from any OpenAI-compatible
  ``/v1/chat/completions`` endpoint; mean and std over prompts (DISA Table 3 convention).

Generation goes through the :mod:`llm.base.rollout` engine interface
(``engine.generate(prompts, n, sampling) -> list[RolloutGroup]``); any object whose
``generate(prompts, n)`` returns one list of strings per prompt also works. Rewards are TRL-signature
functions (:mod:`llm.base.rewards`); a sample is *correct* when its reward is > 0.5 (binary verifiers).
"""

from __future__ import annotations

import inspect
import json
import math
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tiltlab.files import atomic_path, write_json, write_text
from tiltlab.llm.base.data import load_prompts
from tiltlab.llm.base.prompts import format_prompt
from tiltlab.llm.base.rewards import resolve_reward
from tiltlab.llm.base.rollout import SamplingConfig, make_engine
from tiltlab.llm.eval.config import EvalConfig
from tiltlab.llm.eval.judge import JudgeConfig, judge_diversity
from tiltlab.objectives.metrics import distinct_n, mean_at_k, pass_at_k
from tiltlab.progress import progress as progress_bar

__all__ = [
    "DatasetResult",
    "evaluate",
    "results_table",
    "run_eval",
    "save_results",
]


@dataclass
class DatasetResult:
    """Metrics of one dataset; ``per_prompt`` holds ids, rewards, c (correct count) and the texts."""

    name: str
    n_prompts: int
    k: int
    mean_at_k: float
    mean_at_k_se: float
    pass_at: dict[int, float]
    distinct: dict[int, float]
    mean_completion_tokens: float | None
    finished_frac: float | None
    judge_mean: float | None = None
    judge_std: float | None = None  # population std over per-prompt scores (DISA Table 3: "empirical std")
    judge_n: int = 0
    per_prompt: list[dict] = field(default_factory=list, repr=False)

    def summary(self) -> dict:
        d = asdict(self)
        d.pop("per_prompt")
        return d


def _generate(engine, prompts: list[str], k: int, sampling) -> tuple[list[list[str]], list | None, list | None]:
    """(texts [P][k], completion ids or None, finished flags or None) from either engine protocol."""
    params = inspect.signature(engine.generate).parameters
    if "sampling" in params:
        out = engine.generate(prompts, n=k, sampling=sampling)
    else:
        out = engine.generate(prompts, k)
    if len(out) != len(prompts):
        raise RuntimeError(f"engine returned {len(out)} groups for {len(prompts)} prompts")
    texts, ids, fin = [], [], []
    for g in out:
        if hasattr(g, "texts"):
            texts.append(list(g.texts))
            ids.append([list(c) for c in g.completion_ids])
            fin.append(list(g.finished) if getattr(g, "finished", None) else None)
        else:
            texts.append([str(t) for t in g])
            ids.append(None)
            fin.append(None)
        if len(texts[-1]) != k:
            raise RuntimeError(f"engine returned {len(texts[-1])} completions for a prompt, expected {k}")
    return texts, (ids if all(i is not None for i in ids) else None), (fin if all(f is not None for f in fin) else None)


def evaluate(
    engine,
    datasets: dict[str, Sequence[dict]],
    k: int,
    sampling=None,
    pass_ks: Sequence[int] = (1,),
    distinct_ns: Sequence[int] = (1, 2),
    reward_fn: str | Callable = "auto",
    chat_template: bool = True,
    judge: JudgeConfig | None = None,
    judge_datasets: Sequence[str] | None = None,
    progress: bool = True,
    chat_template_kwargs: dict | None = None,
) -> dict[str, DatasetResult]:
    """Evaluate ``engine`` on ``{name: rows}``; returns ``{name: DatasetResult}``.

    Args:
        engine: an :class:`llm.base.rollout.RolloutEngine` (``generate(prompts, n, sampling)``) or any object
            with ``generate(prompts, n) -> list[list[str]]``.
        datasets: rows with ``id``, ``prompt`` and ``answer`` or ``tests`` (:mod:`llm.base.data`).
        k: samples per prompt; ``pass_ks`` larger than ``k`` are dropped, with a line on stderr saying so
            (unless ``progress`` is False).
        sampling: an :class:`llm.base.rollout.SamplingConfig` (default: temperature 1, no truncation).
        chat_template_kwargs: passed to the chat template (:func:`llm.base.prompts.format_prompt`), e.g.
            ``{"enable_thinking": False}``: the prompt training conditioned on.
    """

    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if sampling is None:
        sampling = SamplingConfig()
    ks = sorted({int(x) for x in pass_ks if x <= k})
    dropped = sorted({int(x) for x in pass_ks if x > k})
    if dropped and progress:
        names = ", ".join(f"pass@{kk}" for kk in dropped)
        them = "it" if len(dropped) == 1 else "them"
        print(
            f"[eval] {names} not reported: the unbiased pass@k' estimate needs k' <= k samples per prompt, "
            f"and k = {k} (set k to {dropped[-1]} or more to report {them})",
            file=sys.stderr,
            flush=True,
        )

    fn = resolve_reward(reward_fn)
    tok = getattr(engine, "tokenizer", None)
    mode = None if progress else "off"
    results: dict[str, DatasetResult] = {}
    outer = progress_bar(len(datasets), desc="eval", unit="dataset", mode=mode)
    for d, (name, rows) in enumerate(datasets.items()):
        rows = list(rows)
        if not rows:
            raise ValueError(f"dataset {name!r} is empty")
        outer.update(0, postfix=name)
        outer.write(f"[eval] {name} ({d + 1}/{len(datasets)}): sampling {len(rows)} prompts x {k}")
        prompts = [
            format_prompt(tok, r["prompt"], chat_template, chat_template_kwargs=chat_template_kwargs) for r in rows
        ]
        texts, ids, fin = _generate(engine, prompts, k, sampling)
        cols = {c: [r.get(c) for r in rows for _ in range(k)] for c in {c for r in rows for c in r} if c != "prompt"}
        rewards = _score(fn, prompts, texts, ids, cols, k, desc=f"scoring {name}", mode=mode)
        if len(rewards) != len(rows) * k or any(r is None for r in rewards):
            raise ValueError(
                f"{name}: the reward function returned None or a wrong number of rewards "
                "(does every row have an answer or tests?)"
            )
        per_prompt, mean_scores = [], []
        pass_sums = {kk: 0.0 for kk in ks}
        dist_sums = {n: 0.0 for n in distinct_ns}
        for i, r in enumerate(rows):
            rw = [float(x) for x in rewards[i * k : (i + 1) * k]]
            correct = [x > 0.5 for x in rw]
            c = sum(correct)
            mean_scores.append(mean_at_k(correct))
            for kk in ks:
                pass_sums[kk] += pass_at_k(k, c, kk)
            for n in distinct_ns:
                dist_sums[n] += distinct_n(texts[i], n)
            per_prompt.append({"id": r["id"], "rewards": rw, "c": c, "completions": texts[i]})
        P = len(rows)
        se = statistics.stdev(mean_scores) / math.sqrt(P) if P > 1 else float("nan")
        n_tok = [len(c) for g in ids for c in g] if ids is not None else None
        res = DatasetResult(
            name=name,
            n_prompts=P,
            k=k,
            mean_at_k=sum(mean_scores) / P,
            mean_at_k_se=se,
            pass_at={kk: v / P for kk, v in pass_sums.items()},
            distinct={n: v / P for n, v in dist_sums.items()},
            mean_completion_tokens=(sum(n_tok) / len(n_tok)) if n_tok else None,
            finished_frac=(sum(sum(f) for f in fin) / (P * k)) if fin is not None else None,
            per_prompt=per_prompt,
        )
        if judge is not None and (judge_datasets is None or name in judge_datasets):
            problems = [r.get("problem_text") or r["prompt"] for r in rows]
            scores = judge_diversity(problems, texts, judge, progress=progress)
            valid = [s for s in scores if s is not None]
            for pp, s in zip(per_prompt, scores):
                pp["judge"] = s
            res.judge_n = len(valid)
            res.judge_mean = sum(valid) / len(valid) if valid else None
            res.judge_std = statistics.pstdev(valid) if len(valid) > 1 else (0.0 if valid else None)
        results[name] = res
        outer.update(1, postfix=f"{name}: Mean@{k} {100 * res.mean_at_k:.1f}")
    outer.close()
    return results


def _score(fn, prompts: list[str], texts, ids, cols: dict, k: int, desc: str, mode: str | None, chunk: int = 16):
    """The reward of every completion, ``chunk`` prompts (``chunk * k`` completions) per call so that
    a slow verifier (the code sandbox) reports progress; each completion's reward depends on its own
    row only (TRL's reward signature is per completion), so the chunking changes no value."""

    rewards: list = []
    with progress_bar(len(prompts), desc=desc, unit="prompt", mode=mode) as bar:
        for s in range(0, len(prompts), chunk):
            e = min(s + chunk, len(prompts))
            part = fn(
                [p for p in prompts[s:e] for _ in range(k)],
                [t for g in texts[s:e] for t in g],
                [c for g in ids[s:e] for c in g] if ids is not None else None,
                **{c: v[s * k : e * k] for c, v in cols.items()},
            )
            if len(part) != (e - s) * k:
                raise ValueError(
                    f"{desc}: the reward function returned {len(part)} rewards for {(e - s) * k} completions"
                )
            rewards.extend(part)
            bar.update(e - s)
    return rewards


def results_table(results: dict[str, DatasetResult]) -> str:
    """A Markdown table: one row per dataset (Mean@k ± s.e., pass@k', distinct-n, judge)."""
    if not results:
        return "(no results)"
    first = next(iter(results.values()))
    ks = sorted({kk for r in results.values() for kk in r.pass_at})
    ns = sorted({n for r in results.values() for n in r.distinct})
    head = ["dataset", "prompts", f"Mean@{first.k}"] + [f"pass@{kk}" for kk in ks] + [f"distinct-{n}" for n in ns]
    has_judge = any(r.judge_mean is not None for r in results.values())
    if has_judge:
        head.append("judge (1-5)")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results.values():
        se = "" if math.isnan(r.mean_at_k_se) else f" ± {100 * r.mean_at_k_se:.1f}"
        cells = [r.name, str(r.n_prompts), f"{100 * r.mean_at_k:.1f}{se}"]
        cells += [f"{100 * r.pass_at[kk]:.1f}" if kk in r.pass_at else "-" for kk in ks]
        cells += [f"{r.distinct[n]:.3f}" if n in r.distinct else "-" for n in ns]
        if has_judge:
            cells.append("-" if r.judge_mean is None else f"{r.judge_mean:.2f} ± {r.judge_std:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def save_results(results: dict[str, DatasetResult], out_dir: str | Path, config: dict | None = None) -> Path:
    """Write ``results.json`` (summaries + config), ``results.md`` (table) and ``samples.jsonl`` (per prompt),
    each atomically."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    payload = {"config": config or {}, "results": {n: r.summary() for n, r in results.items()}}
    write_json(out / "results.json", payload, indent=2, default=str, newline=False)
    write_text(out / "results.md", results_table(results) + "\n")
    with atomic_path(out / "samples.jsonl") as tmp, open(tmp, "w", encoding="utf-8") as f:
        for n, r in results.items():
            for pp in r.per_prompt:
                f.write(json.dumps({"dataset": n, **pp}, ensure_ascii=False) + "\n")
    return out


def run_eval(cfg: EvalConfig, engine=None) -> dict[str, DatasetResult]:
    """Load the model (unless ``engine`` is given) and datasets of ``cfg``, evaluate, print and save."""

    data = {name: load_prompts(name, data_dir=cfg.data_dir, limit=cfg.limit, seed=cfg.seed) for name in cfg.datasets}
    own_engine = engine is None
    if engine is None:
        engine = make_engine(
            cfg.engine, cfg.model, dtype=cfg.dtype, device=cfg.device, batch_size=cfg.batch_size, show_progress=True
        )
    sampling = SamplingConfig(
        temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed
    )
    judge = JudgeConfig(base_url=cfg.judge_base_url, model=cfg.judge_model) if cfg.judge else None
    try:
        results = evaluate(
            engine,
            data,
            cfg.k,
            sampling,
            pass_ks=cfg.pass_ks,
            distinct_ns=cfg.distinct_ns,
            reward_fn=cfg.reward,
            chat_template=cfg.chat_template,
            chat_template_kwargs=cfg.chat_template_kwargs,
            judge=judge,
            judge_datasets=cfg.judge_datasets,
        )
    finally:
        close = getattr(engine, "close", None)
        if own_engine and callable(close):
            close()  # a vLLM engine's worker processes end here, not at interpreter exit
    if cfg.out_dir:
        save_results(results, cfg.out_dir, config=asdict(cfg))
    return results
