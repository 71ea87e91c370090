"""``tiltlab llm prepare SOURCE --input FILE --out FILE``: the papers' training sets from local files.

Nothing is downloaded: each preparer reads the published file format (Parquet or JSON/JSONL, as
:func:`tiltlab.llm.base.data.read_table` does) from a path and writes rows in the prompt-dataset schema
of :mod:`tiltlab.llm.base.data` (``id``, ``prompt``, ``answer`` | ``tests`` ...), atomically.

* ``dapo``       DAPO-Math-17k (``BytedTsinghua-SIA/DAPO-Math-17k``: ``prompt`` = chat messages whose
  user turn wraps the problem in DAPO's "Answer: $Answer" instruction, ``reward_model.ground_truth``;
  or the processed ``open-r1/DAPO-Math-17k-Processed``: ``prompt`` string + ``solution``). DAPO's
  instruction asks for a last line "Answer: X" while :func:`tiltlab.llm.base.rewards.math_reward` grades the
  last ``\\boxed{}``: the instruction is REWRITTEN to :data:`tiltlab.llm.base.data.DEFAULT_MATH_INSTRUCTION`
  so that prompt and reward agree. The original file repeats each prompt; rows are deduplicated.
* ``deepscaler`` DeepScaleR-Preview (``agentica-org/DeepScaleR-Preview-Dataset``: ``problem``,
  ``answer``, ``solution``; JSON list or Parquet).
* ``deepcoder``  DeepCoder-Preview (``agentica-org/DeepCoder-Preview-Dataset``: ``problem``, ``tests``
  = a JSON string, either a list of ``{input, output, testtype|type}`` cases or TACO's
  ``{inputs, outputs[, fn_name]}``; ``metadata`` may carry ``func_name``). Stdin/stdout cases become
  ``test_type: stdio``, LeetCode-style ones ``functional`` (the sandboxed code reward's formats).
* ``math``       the MATH train set for FPA's offline data (``problem``, ``solution`` with the
  gold answer in its last ``\\boxed{}``), with FPA's prompt (FPA App. B.5, Figure 7).
* ``sft``        the SFT-LoRA baseline's corpus (DISA App. D.4) from a Stage-1 directory: the
  proposal samples with reward > 0 that finished (complete solutions), as
  ``prompt, completion, reward`` rows.
* ``select``     a task with learning signal (DAPO's dynamic-sampling filter, applied offline): the
  prompts of a Stage-1 run with ``q = pi_ref`` (same model, T = 1, untruncated) whose ``pi_ref`` pass
  rate (the Stage-1 ``mean_reward`` of their M samples) lies in ``[min_pass, max_pass]``, the rest of
  each row as the dataset gave it plus ``ref_pass_rate`` and the Stage-1 label ``log_z``, split into a
  train file and an optional held-out file.
* ``fpa``        FPA's offline dataset (FPA App. B.1): ``K`` samples per prompt from the model at
  temperature ``T`` (rollout engine :func:`tiltlab.llm.base.rollout.make_engine`), graded by the
  reward; prompts whose samples are all correct or all wrong are dropped; a held-out fraction of
  the prompts goes to a validation file.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tiltlab.files import atomic_path
from tiltlab.llm.base.data import (
    DEFAULT_CODE_INSTRUCTION,
    DEFAULT_MATH_INSTRUCTION,
    load_prompts,
    read_table,
    save_prompts,
)
from tiltlab.llm.base.prompts import format_prompt
from tiltlab.llm.base.rewards import extract_boxed, resolve_reward
from tiltlab.llm.base.rollout import SamplingConfig, derive_seed, make_engine
from tiltlab.llm.disa.stage1 import load_stage1, read_manifest
from tiltlab.llm.prepare.config import FpaConfig, SelectConfig

__all__ = [
    "FPA_PROMPT",
    "build_fpa_offline",
    "dapo_problem",
    "fpa_rows_from_groups",
    "prepare_dapo",
    "prepare_deepcoder",
    "prepare_deepscaler",
    "prepare_math",
    "select_by_pass_rate",
    "sft_rows_from_stage1",
    "write_rows",
]

FPA_PROMPT = (
    "Solve this math problem step by step. At the end, make sure to finish the calculation and state the "
    "answer exactly once in the following format: The final answer is \\boxed{{X}}, where X is your final "
    "answer. Q:{question} A:"
)
"""FPA App. B.5 (Figure 7), used for training data generation and evaluation."""

_DAPO_RE = re.compile(
    r"^\s*Solve the following math problem step by step\..*?where \$Answer is the answer to the problem\.\s*"
    r"(?P<problem>.*?)\s*Remember to put your answer on its own line after \"Answer:\"\.?\s*$",
    re.DOTALL,
)


def write_rows(rows: Sequence[dict], path: str | Path) -> Path:
    """Write ``rows`` as JSON lines (``.jsonl``) or Parquet (``.parquet``) atomically (a temporary file
    renamed into place: an interrupted run leaves no half-written file)."""

    p = Path(path)
    if p.suffix not in (".jsonl", ".json", ".parquet"):
        raise ValueError(f"output must end in .jsonl or .parquet, got {str(p)!r}")
    with atomic_path(p) as tmp:  # keeps the suffix, which save_prompts reads the format from
        save_prompts(rows, tmp)
    return p


def _read(path: str | Path) -> list[dict]:

    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"input {str(p)!r} does not exist (give the local copy of the published file)")
    return read_table(p)


def _user_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, (list, tuple)):
        users = [m.get("content", "") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        if users:
            return str(users[-1])
    raise ValueError(f"a prompt must be a string or chat messages with a user turn, got {type(prompt).__name__}")


def _as_dict(v: Any) -> dict:
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except json.JSONDecodeError:
            return {}
    return v if isinstance(v, dict) else {}


def dapo_problem(text: str) -> str:
    """The bare problem of a DAPO-Math-17k user turn (DAPO's "Answer:" instruction removed);
    text without DAPO's wrapper is returned stripped."""
    m = _DAPO_RE.match(text)
    return (m.group("problem") if m else text).strip()


def prepare_dapo(path: str | Path, instruction: str | None = None) -> list[dict]:
    """DAPO-Math-17k rows ``{id, prompt, answer, source}``; the prompt ends with the boxed instruction."""

    instr = instruction or DEFAULT_MATH_INSTRUCTION
    out, seen = [], set()
    for i, r in enumerate(_read(path)):
        if "prompt" not in r:
            raise ValueError(f"{path}: row {i} has no 'prompt' column; columns: {sorted(r)}")
        problem = dapo_problem(_user_text(r["prompt"]))
        gold = _as_dict(r.get("reward_model")).get("ground_truth")
        if gold is None:
            gold = r.get("solution", r.get("answer"))
        if gold is None:
            raise ValueError(f"{path}: row {i} has no reward_model.ground_truth / solution / answer")
        if problem in seen:
            continue
        seen.add(problem)
        idx = _as_dict(r.get("extra_info")).get("index")
        out.append(
            {
                "id": str(idx) if idx is not None else f"dapo-{len(out)}",
                "prompt": f"{problem}\n{instr}",
                "answer": str(gold).strip(),
                "source": "dapo_math_17k",
            }
        )
    if not out:
        raise ValueError(f"{path}: no rows")
    return out


def prepare_deepscaler(path: str | Path, instruction: str | None = None) -> list[dict]:
    """DeepScaleR rows ``{id, prompt, answer, source}`` (problem + the boxed instruction)."""

    instr = instruction or DEFAULT_MATH_INSTRUCTION
    out = []
    for i, r in enumerate(_read(path)):
        if r.get("problem") is None or r.get("answer") is None:
            raise ValueError(f"{path}: row {i} needs 'problem' and 'answer'; columns: {sorted(r)}")
        out.append(
            {
                "id": f"deepscaler-{i}",
                "prompt": f"{str(r['problem']).strip()}\n{instr}",
                "answer": str(r["answer"]).strip(),
                "source": "deepscaler",
            }
        )
    if not out:
        raise ValueError(f"{path}: no rows")
    return out


def _deepcoder_tests(tests: Any, meta: dict) -> tuple[str, str, str | None] | None:
    """``(test_type, tests JSON, func_name)`` or None when the format is not supported."""
    if isinstance(tests, str):
        tests = json.loads(tests)
    if isinstance(tests, dict) and "inputs" in tests:  # TACO: {inputs, outputs[, fn_name]}
        fn = tests.get("fn_name")
        cases = [
            {"input": i if isinstance(i, str) else "\n".join(json.dumps(a) for a in i), "output": o}
            for i, o in zip(tests["inputs"], tests["outputs"])
        ]
        if fn:
            cases = [
                {"input": c["input"], "output": o if isinstance(o, str) else json.dumps(o[0] if len(o) == 1 else o)}
                for c, o in zip(cases, tests["outputs"])
            ]
            return "functional", json.dumps({"cases": cases, "func_name": fn}), fn
        return "stdio", json.dumps({"cases": cases}), None
    if isinstance(tests, list) and tests and all(isinstance(c, dict) for c in tests):
        kind = str(tests[0].get("testtype") or tests[0].get("type") or "stdin")
        cases = [{"input": c["input"], "output": c["output"]} for c in tests]
        if kind == "functional":
            fn = (tests[0].get("metadata") or {}).get("func_name") or meta.get("func_name")
            if not fn:
                return None
            return "functional", json.dumps({"cases": cases, "func_name": fn}), fn
        if kind in ("stdin", "stdin_stdout", "stdio"):
            return "stdio", json.dumps({"cases": cases}), None
    return None


def prepare_deepcoder(path: str | Path) -> tuple[list[dict], int]:
    """DeepCoder rows ``{id, prompt, tests, test_type[, entry_point], source}`` and the number of rows
    skipped for an unsupported test format."""

    out, skipped = [], 0
    for i, r in enumerate(_read(path)):
        if r.get("problem") is None or r.get("tests") is None:
            raise ValueError(f"{path}: row {i} needs 'problem' and 'tests'; columns: {sorted(r)}")
        meta = _as_dict(r.get("metadata"))
        parsed = _deepcoder_tests(r["tests"], meta)
        if parsed is None:
            skipped += 1
            continue
        test_type, tests, fn = parsed
        q = str(r["problem"]).strip()
        if test_type == "stdio":
            prompt = f"{q}\n\nRead the input from stdin and write the answer to stdout. {DEFAULT_CODE_INSTRUCTION}"
        else:
            starter = r.get("starter_code") or meta.get("starter_code") or ""
            prompt = f"{q}\n\nComplete this starter code:\n```python\n{starter}\n```\n{DEFAULT_CODE_INSTRUCTION}"
        row = {"id": f"deepcoder-{i}", "prompt": prompt, "tests": tests, "test_type": test_type, "source": "deepcoder"}
        if fn:
            row["entry_point"] = fn
        out.append(row)
    if not out:
        raise ValueError(f"{path}: no row with a supported test format ({skipped} skipped)")
    return out, skipped


def prepare_math(path: str | Path) -> list[dict]:
    """MATH train rows ``{id, prompt, answer, level, type}`` with FPA's prompt (App. B.5)."""

    out = []
    for i, r in enumerate(_read(path)):
        problem = r.get("problem")
        gold = r.get("answer")
        if gold is None and r.get("solution") is not None:
            gold = extract_boxed(str(r["solution"]))
        if problem is None or gold is None:
            raise ValueError(f"{path}: row {i} needs 'problem' and an 'answer' or a boxed 'solution'")
        out.append(
            {
                "id": str(r.get("unique_id") or f"math-{i}"),
                "prompt": FPA_PROMPT.format(question=str(problem).strip()),
                "answer": str(gold).strip(),
                **{k: r[k] for k in ("level", "type") if k in r},
            }
        )
    return out


def sft_rows_from_stage1(stage1_dir: str | Path, require_finished: bool = True) -> list[dict]:
    """``prompt, completion, reward, prompt_id`` rows: the Stage-1 proposal samples with raw reward > 0
    (DISA App. D.4), finished ones only unless ``require_finished=False``."""
    import pyarrow.parquet as pq

    d = Path(stage1_dir)
    labels = sorted(d.glob("labels-*.parquet"))
    samples = sorted(d.glob("samples-*.parquet"))
    if not labels or not samples:
        raise FileNotFoundError(
            f"{str(d)!r} has no Stage-1 labels-*/samples-*.parquet shards (run `tiltlab llm stage1`)"
        )
    prompts: dict[str, str] = {}
    for f in labels:
        t = pq.read_table(f, columns=["prompt_id", "prompt"]).to_pylist()
        prompts.update({r["prompt_id"]: r["prompt"] for r in t})
    out = []
    for f in samples:
        for r in pq.read_table(f, columns=["prompt_id", "completion", "reward_raw", "finished"]).to_pylist():
            if r["reward_raw"] > 0 and (r["finished"] or not require_finished):
                out.append(
                    {
                        "prompt_id": r["prompt_id"],
                        "prompt": prompts[r["prompt_id"]],
                        "completion": r["completion"],
                        "reward": 1.0,
                    }
                )
    if not out:
        raise ValueError(f"{str(d)!r}: no finished Stage-1 sample with reward > 0; nothing to fine-tune on")
    return out


def select_by_pass_rate(cfg: SelectConfig, rows: Sequence[dict] | None = None) -> dict[str, Any]:
    """Write the rows of the Stage-1 dataset whose pi_ref pass rate lies in ``[min_pass, max_pass]``
    (columns ``ref_pass_rate`` and ``log_z`` added) to ``cfg.out`` (and a seeded held-out share to
    ``cfg.heldout_out``); returns a summary with the pass rates before and after selection.

    Each kept row's ``log_z`` is its Stage-1 label (``log Z_hat_M`` at the run's ``beta``: with
    ``q = pi_ref`` it is ``log mean_j exp(beta r~_j)``), which DISA Stage 3 reads with
    ``disa_label: column`` (give ``disa.stage1_dir`` too, so the trainer checks beta and the reward
    transform against the manifest).

    ``rows``: the dataset rows when Stage 1 ran on programmatic rows; by default the manifest's
    ``dataset`` is loaded again (:func:`tiltlab.llm.base.data.load_prompts`). The Stage-1 run must sample
    ``pi_ref`` itself (the same model as proposal and reference, temperature 1, no truncation):
    otherwise ``mean_reward`` is a pass rate of the proposal, not of ``pi_ref``, and it is refused."""

    man = read_manifest(cfg.stage1)
    c = man["config"]
    if c["proposal"] != c["reference"] or c["temperature"] != 1.0 or c["top_p"] != 1.0 or c["top_k"] != 0:
        raise ValueError(
            f"{cfg.stage1}: select needs pi_ref's own samples (proposal = reference, temperature 1, top_p 1, "
            f"top_k 0); this run has proposal {c['proposal']!r}, reference {c['reference']!r}, temperature "
            f"{c['temperature']}, top_p {c['top_p']}, top_k {c['top_k']}"
        )
    _, labels = load_stage1(cfg.stage1)
    rate = dict(zip(labels.column("prompt_id").to_pylist(), labels.column("mean_reward").to_pylist()))
    log_z = dict(zip(labels.column("prompt_id").to_pylist(), labels.column("log_z").to_pylist()))
    if rows is None:
        rows = load_prompts(c["dataset"], limit=c.get("max_prompts"))
    by_id = {str(r["id"]): r for r in rows}
    missing = [pid for pid in rate if pid not in by_id]
    if missing:
        raise ValueError(
            f"{cfg.stage1}: {len(missing)} labelled prompt ids are not in the dataset (first: {missing[0]!r})"
        )
    kept = [
        {**by_id[pid], "ref_pass_rate": float(p), "log_z": float(log_z[pid])}
        for pid, p in rate.items()
        if cfg.min_pass <= p <= cfg.max_pass
    ]
    if not kept:
        raise ValueError(
            f"{cfg.stage1}: no prompt has a pi_ref pass rate in [{cfg.min_pass}, {cfg.max_pass}] "
            f"({len(rate)} prompts, mean pass rate {sum(rate.values()) / len(rate):.3f}): the task has no signal "
            "for this model; use easier prompts or more samples per prompt (M)"
        )
    order = list(range(len(kept)))
    random.Random(f"select-{cfg.seed}").shuffle(order)
    n_held = round(cfg.heldout_fraction * len(kept))
    held_idx = set(order[:n_held])
    train = [r for i, r in enumerate(kept) if i not in held_idx]
    held = [r for i, r in enumerate(kept) if i in held_idx]
    if not train:
        raise ValueError(f"heldout_fraction {cfg.heldout_fraction} leaves no training prompt of {len(kept)}")
    write_rows(train, cfg.out)
    if cfg.heldout_out is not None:
        write_rows(held, cfg.heldout_out)

    def mean(rs):
        return sum(r["ref_pass_rate"] for r in rs) / len(rs) if rs else float("nan")

    return {
        "n_labelled": len(rate),
        "mean_pass_all": sum(rate.values()) / len(rate),
        "n_kept": len(kept),
        "n_train": len(train),
        "n_heldout": len(held),
        "mean_pass_train": mean(train),
        "mean_pass_heldout": mean(held),
        "M": c["M"],
    }


def fpa_rows_from_groups(
    rows: Sequence[dict], texts: Sequence[Sequence[str]], rewards: Sequence[float], holdout_fraction: float, seed: int
) -> tuple[list[dict], list[dict], dict[str, int]]:
    """``(train, val, counts)``: one ``prompt, completion, reward, prompt_id, answer`` row per sample;
    prompts whose samples are all correct or all wrong are dropped (FPA App. B.1, after DAPO); the
    kept prompts are shuffled with ``seed`` and ``round(holdout_fraction * n)`` go to ``val``."""
    k = len(texts[0]) if texts else 0
    if len(rewards) != len(rows) * k or any(len(t) != k for t in texts):
        raise ValueError("one reward per sample and the same number of samples per prompt are required")
    kept: list[list[dict]] = []
    n_all_right = n_all_wrong = 0
    for i, (r, ts) in enumerate(zip(rows, texts)):
        rs = [float(v) for v in rewards[i * k : (i + 1) * k]]
        if all(v > 0 for v in rs):
            n_all_right += 1
            continue
        if not any(v > 0 for v in rs):
            n_all_wrong += 1
            continue
        kept.append(
            [
                {
                    "prompt_id": str(r["id"]),
                    "prompt": r["prompt"],
                    "completion": t,
                    "reward": v,
                    "answer": r.get("answer"),
                }
                for t, v in zip(ts, rs)
            ]
        )
    order = list(range(len(kept)))
    random.Random(seed).shuffle(order)
    n_val = round(holdout_fraction * len(kept))
    val_idx = set(order[:n_val])
    train = [x for j, g in enumerate(kept) if j not in val_idx for x in g]
    val = [x for j, g in enumerate(kept) if j in val_idx for x in g]
    counts = {
        "prompts": len(rows),
        "kept": len(kept),
        "all_correct": n_all_right,
        "all_wrong": n_all_wrong,
        "val_prompts": n_val,
    }
    return train, val, counts


def build_fpa_offline(cfg: FpaConfig, engine=None) -> dict[str, Any]:
    """Generate, grade, filter and split (FPA App. B.1); writes ``cfg.out`` and its ``.val`` file.
    ``engine``: a :class:`tiltlab.llm.base.rollout.RolloutEngine` (default: ``make_engine(cfg.engine, cfg.model)``)."""
    from tqdm.auto import tqdm

    rows = load_prompts(cfg.dataset, limit=cfg.limit)
    if not rows:
        raise ValueError(f"{cfg.dataset}: no prompts")
    if engine is None:
        extra = {}
        if cfg.engine == "vllm":
            extra = {
                "gpu_memory_utilization": cfg.gpu_memory_utilization,
                "tensor_parallel_size": cfg.tensor_parallel_size,
            }
        engine = make_engine(cfg.engine, cfg.model, **extra)
    reward = resolve_reward(cfg.reward)
    texts: list[list[str]] = []
    rewards: list[float] = []
    for b in tqdm(range(0, len(rows), cfg.batch_size), desc="fpa data", unit="batch"):
        batch = rows[b : b + cfg.batch_size]
        prompts = [format_prompt(engine.tokenizer, r["prompt"], chat_template=cfg.chat_template) for r in batch]
        sampling = SamplingConfig(
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            max_new_tokens=cfg.max_new_tokens,
            seed=derive_seed("fpa", cfg.seed, b),
        )
        groups = engine.generate(prompts, cfg.k, sampling)
        flat_rows = [r for r in batch for _ in range(cfg.k)]
        cols = sorted({c for r in batch for c in r} - {"prompt"})
        kw = {c: [r.get(c) for r in flat_rows] for c in cols}
        comp = [t for g in groups for t in g.texts]
        got = reward([r["prompt"] for r in flat_rows], comp, [c for g in groups for c in g.completion_ids], **kw)
        if any(v is None for v in got):
            raise ValueError("the reward returned None (a prompt without an answer?)")
        texts.extend(list(g.texts) for g in groups)
        rewards.extend(float(v) for v in got)
    train, val, counts = fpa_rows_from_groups(rows, texts, rewards, cfg.holdout_fraction, cfg.seed)
    if not train:
        raise ValueError(f"no prompt with both correct and wrong samples ({counts}); nothing to write")
    out = Path(cfg.out)
    write_rows(train, out)
    val_path = out.with_name(f"{out.stem}.val{out.suffix}")
    if val:
        write_rows(val, val_path)
    return {**counts, "train_rows": len(train), "val_rows": len(val), "out": str(out), "val": str(val_path)}
