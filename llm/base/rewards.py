"""Verifiable rewards with TRL's reward-function signature.

Every reward here is ``f(prompts, completions, completion_ids=None, **kwargs) -> list[float | None]``
(TRL ``GRPOTrainer`` convention): ``kwargs`` carry the dataset columns, one
entry per completion (``answer`` for math, ``tests`` and optionally ``entry_point`` for code).
``completions`` may be plain strings or conversational (``[{"role": "assistant", "content": ...}]``).
``None`` means "this reward does not apply to this row" (TRL ignores it when summing rewards).

* :func:`math_reward`: 1.0 iff the LAST ``\\boxed{...}`` of the completion is mathematically equal to
  the gold answer under ``math-verify`` (``parse`` + ``verify``), else 0.0 (no box -> 0.0).
* :func:`code_reward`: 1.0 iff the row's tests, run in a judge process separate from the
  completion's code (which runs in the OS-isolated :mod:`llm.base.sandbox`), pass; else 0.0.
* :func:`verifiable_reward`: per row, math if the row has an ``answer``, code if it has ``tests``.

:func:`resolve_reward` turns a reward name (``math`` | ``code`` | ``auto`` | ``package.module:function``)
into the function; Stage 1, training and evaluation all resolve ``--reward`` through it.
"""

from __future__ import annotations

import ast
import importlib
import math
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from .sandbox import SandboxConfig, isolation_report, run_many_judged

__all__ = [
    "ANSWER_FORMATS",
    "REWARDS",
    "CodeJob",
    "code_job",
    "code_reward",
    "completion_text",
    "extract_boxed",
    "extract_code",
    "gold_numbers",
    "join_code",
    "make_code_reward",
    "math_equal",
    "math_reward",
    "plain_answer",
    "plain_number_correct",
    "prompt_parts",
    "resolve_reward",
    "set_number_correct",
    "verifiable_reward",
]

ANSWER_FORMATS = (None, "boxed", "plain", "set")
"""Values of the optional ``answer_format`` dataset column read by :func:`math_reward`."""
REWARDS: dict[str, str] = {"auto": "verifiable_reward", "math": "math_reward", "code": "code_reward"}
"""Reward names -> functions of this module."""


def resolve_reward(name: str | Callable) -> Callable:
    """A TRL-signature reward ``f(prompts, completions, completion_ids, **columns) -> list[float | None]``
    from a name of :data:`REWARDS` or ``package.module:function`` (a callable is returned as is)."""
    if callable(name):
        return name
    if not isinstance(name, str):
        raise TypeError(f"reward must be a name or a callable, got {type(name).__name__}")
    if ":" in name:
        mod, _, fn = name.partition(":")
        try:
            return getattr(importlib.import_module(mod), fn)
        except AttributeError:
            raise ValueError(f"reward {name!r}: module {mod!r} has no function {fn!r}") from None
    if name not in REWARDS:
        raise ValueError(f"unknown reward {name!r}; use one of {sorted(REWARDS)} or 'package.module:function'")
    return globals()[REWARDS[name]]


def completion_text(completion: Any) -> str:
    """Text of a completion: a str, or the content of the last message of a conversational completion."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict) and "content" in completion:
        return str(completion["content"])
    if isinstance(completion, (list, tuple)) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    raise ValueError(f"completion must be a str or a list of chat messages, got {type(completion).__name__}")


_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")


def extract_boxed(text: str) -> str | None:
    """Content of the LAST ``\\boxed{...}`` (or ``\\fbox{...}``) with balanced braces, or None."""
    last = None
    for m in _BOX_RE.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            last = text[m.end() : i - 1]
    return last


def _timeouts() -> int | None:
    # math-verify's timeouts use signal.alarm, which only works in the main thread
    return 5 if threading.current_thread() is threading.main_thread() else None


def math_equal(pred: str, gold: str) -> bool:
    """``math-verify`` equivalence of a predicted answer string and a gold answer string (no ``\\boxed`` needed)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    t = _timeouts()
    cfg = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    gold_p = parse("\\boxed{" + gold + "}", extraction_config=cfg, parsing_timeout=t)
    pred_p = parse("\\boxed{" + pred + "}", extraction_config=cfg, parsing_timeout=t)
    if not gold_p or not pred_p:
        return _norm(pred) == _norm(gold)
    return bool(verify(gold_p, pred_p, timeout_seconds=t))


def _norm(s: str) -> str:
    return re.sub(r"\s+", "", s).strip("$.").lower()


def _column(kwargs: dict, name: str, n: int, required: bool) -> list | None:
    col = kwargs.get(name)
    if col is None:
        if required:
            raise ValueError(f"reward needs the dataset column {name!r} in kwargs (got columns {sorted(kwargs)})")
        return None
    if isinstance(col, (str, bytes)) or not isinstance(col, Sequence):
        col = [col] * n
    if len(col) != n:
        raise ValueError(f"column {name!r} has {len(col)} entries for {n} completions")
    return list(col)


def math_reward(
    prompts, completions, completion_ids=None, *, require_boxed: bool = True, **kwargs
) -> list[float | None]:
    """1.0 iff the last boxed answer equals ``answer`` (math-verify), 0.0 otherwise; None where answer is None.

    With ``require_boxed=False`` an unboxed completion is parsed by math-verify's default extraction
    (last LaTeX / plain expression) instead of scoring 0. Rows whose ``answer_format`` column is
    ``"plain"`` (datasets that ask for just a number, e.g. ``synthetic:qa``) are graded by
    :func:`plain_number_correct` instead, and rows whose ``answer_format`` is ``"set"`` (questions with
    several right answers, ``answer`` = the space-separated correct numbers, e.g. ``synthetic:multi``) by
    :func:`set_number_correct`.
    """
    n = len(completions)
    answers = _column(kwargs, "answer", n, required=True)
    formats = _column(kwargs, "answer_format", n, required=False) or [None] * n
    if prompts is not None and len(prompts) != n:
        raise ValueError(f"{len(prompts)} prompts for {n} completions")
    plist = list(prompts) if prompts is not None else [""] * n  # no prompt: no number is the question's
    out: list[float | None] = []
    for prompt, comp, gold, fmt in zip(plist, completions, answers, formats):
        if fmt not in ANSWER_FORMATS:
            raise ValueError(f"answer_format must be one of {ANSWER_FORMATS[1:]} (or missing), got {fmt!r}")
        if gold is None:
            out.append(None)
            continue
        text = completion_text(comp)
        if fmt == "plain":
            out.append(float(plain_number_correct(_prompt_text(prompt), text, str(gold))))
            continue
        if fmt == "set":
            out.append(float(set_number_correct(_prompt_text(prompt), text, str(gold))))
            continue
        boxed = extract_boxed(text)
        if boxed is None:
            if require_boxed:
                out.append(0.0)
                continue
            from math_verify import parse, verify

            t = _timeouts()
            pred_p = parse(text, parsing_timeout=t)
            gold_p = parse("\\boxed{" + str(gold) + "}", parsing_timeout=t)
            out.append(float(bool(pred_p) and bool(gold_p) and verify(gold_p, pred_p, timeout_seconds=t)))
            continue
        out.append(float(math_equal(boxed, str(gold))))
    return out


math_reward.__name__ = "math_reward"

_NUMBER_RE = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\w])")


def _numbers(text: str) -> list[float]:
    return [float(m.group(0).replace(",", "")) for m in _NUMBER_RE.finditer(text)]


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, (list, tuple)):
        return " ".join(str(m.get("content", "")) for m in prompt if isinstance(m, dict))
    return str(prompt)


def plain_answer(prompt: str, text: str) -> float | None:
    """The number a just-the-number completion answers: the LAST number of ``text``, provided every other
    number of ``text`` is that number or a number of the prompt; else None (no number, or a second
    candidate: "35, 36, 37", "36. No, 37"). ``1,234`` and ``37.0`` are read as numbers, ``-37`` is not
    ``37``; "23 + 14 = 37" answers 37 to "What is 23 + 14?"."""
    nums = _numbers(text)
    if not nums:
        return None
    allowed = set(_numbers(prompt)) | {nums[-1]}
    return nums[-1] if all(v in allowed for v in nums) else None


def plain_number_correct(prompt: str, text: str, gold: str) -> bool:
    """A just-the-number answer: :func:`plain_answer` of ``text`` equals ``gold`` numerically, i.e. the
    LAST number of ``text`` is ``gold`` and every other number of ``text`` is ``gold`` or a number of the
    prompt ("23 + 14 = 37" restates the question; "35, 36, 37" lists candidates and is not paid, nor is a
    self-correction "36. No, 37")."""
    try:
        want = float(str(gold).replace(",", ""))
    except ValueError:
        raise ValueError(f"answer_format 'plain' needs a numeric answer, got {gold!r}") from None
    return plain_answer(prompt, text) == want


def set_number_correct(prompt: str, text: str, gold_set: str) -> bool:
    """A just-the-number answer to a question with several right answers: :func:`plain_answer` of
    ``text`` is one of the numbers of ``gold_set`` (see :func:`gold_numbers`). Naming one of them is paid;
    listing candidates ("14, 21, 28") is not, even when every one of them is right."""
    return plain_answer(prompt, text) in gold_numbers(gold_set)


def gold_numbers(gold_set: str) -> frozenset[float]:
    """The numbers of an ``answer_format = "set"`` answer, written as finite numbers separated by
    whitespace and nothing else (no commas: "14,21" would be a thousands separator to :func:`plain_answer`):
    ``"14 21 28"`` -> ``{14.0, 21.0, 28.0}``."""
    try:
        nums = frozenset(float(p) for p in str(gold_set).split())
    except ValueError:
        nums = frozenset()
    if not nums or not all(math.isfinite(v) for v in nums):
        raise ValueError(f"answer_format 'set' needs finite numbers separated by spaces, got {gold_set!r}")
    return nums


_FENCE_OPEN = re.compile(r"[ \t]*(`{3,})[ \t]*([^`\s]*)[^`]*")
_PYTHON_LABELS = ("python", "py", "python3")


def extract_code(text: str) -> str:
    """The code of a completion, by the rule of docs/code-reward.md.

    Line endings ``\\r\\n`` and ``\\r`` are read as ``\\n``. A block opens at a line of three or more
    backticks and an optional label (its first word), and closes at the next line of at least as many
    backticks (alone, or ending a line of code: ``return x`````); a block still open at the end of the
    text (cut off at the token limit) runs to the end. The code is the last
    block labelled ``python``, ``py`` or ``python3`` (any case); if there is none, the last unlabeled
    block; if there is neither (no fence, or only blocks of other labels such as ``text``), the whole text.
    """
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    python: str | None = None
    plain: str | None = None
    i = 0
    while i < len(lines):
        m = _FENCE_OPEN.fullmatch(lines[i])
        if m is None:
            i += 1
            continue
        ticks, label = len(m.group(1)), m.group(2).lower()
        close = re.compile(r"(.*?)`{" + str(ticks) + r",}[ \t]*")
        j, last = i + 1, None
        while j < len(lines):
            c = close.fullmatch(lines[j])
            if c is not None:
                last = c.group(1)  # the code before a closing fence at the end of a line ("return x```")
                break
            j += 1
        if j == len(lines):  # never closed (cut off at the token limit): the rest of the text, as it is
            body = "\n".join(lines[i + 1 :])
        else:
            body = "".join(ln + "\n" for ln in lines[i + 1 : j] + ([last] if last and last.strip() else []))
        if label in _PYTHON_LABELS:
            python = body
        elif not label:
            plain = body
        i = j + 1
    if python is not None:
        return python
    return plain if plain is not None else text


_STDIO_JUDGE = """
import json
_SPEC = json.loads({spec!r})
for _i, _c in enumerate(_SPEC["cases"]):
    if __stdio__(_c["input"]).split() != str(_c["output"]).split():
        raise AssertionError(f"stdio case {{_i}}: wrong output")
"""

_FUNCTIONAL_JUDGE = """
import json
_SPEC = json.loads({spec!r})
_name = _SPEC.get("func_name") or {entry!r}
for _i, _c in enumerate(_SPEC["cases"]):
    _args = [json.loads(_l) for _l in _c["input"].split("\\n") if _l.strip()]
    _f = getattr(Solution(), _name) if "Solution" in globals() else globals()[_name]
    if json.loads(json.dumps(_f(*_args))) != json.loads(_c["output"]):
        raise AssertionError(f"functional case {{_i}}: wrong result")
"""

_FUNCTIONAL_PRELUDE = (
    "from typing import *\nimport bisect, collections, functools, heapq, itertools, math, re, "
    "string\nfrom collections import *\nfrom functools import *\nfrom itertools import *\n"
)


class CodeJob(NamedTuple):
    """What the sandbox runs for one completion: the candidate's ``code``, the judge's ``tests``
    (Python source run in a separate process, see :func:`llm.base.sandbox.run_judged`), and whether the
    code is a stdio program; ``entry_point``, the name the tests must reach in the candidate's code even
    when a builtin has that name (``def pow(...)``)."""

    code: str
    tests: str
    stdio: bool
    entry_point: str | None = None


_FUTURE_RE = re.compile(r"^from[ \t]+__future__[ \t]+import[ \t]+[^\n]*\n?", re.MULTILINE)


def join_code(*parts: str) -> str:
    """Concatenate Python sources, with every ``from __future__ import ...`` line moved to the front
    (where Python requires it): a prelude or prefix never turns a leading future import into a SyntaxError."""
    futures: list[str] = []
    body: list[str] = []
    for part in parts:
        if not part:
            continue
        futures += [m.group(0).rstrip("\n") + "\n" for m in _FUTURE_RE.finditer(part)]
        rest = _FUTURE_RE.sub("", part)
        if rest:
            body.append(rest if rest.endswith("\n") else rest + "\n")
    return "".join(dict.fromkeys(futures)) + "".join(body)


def prompt_parts(prefix: str, entry_point: str | None) -> tuple[str, str]:
    """``(imports, support)`` of a HumanEval-style prompt: its import statements, and all its
    module-level code except the definition of ``entry_point`` (imports, helper functions such as
    HumanEval/38's ``encode_cyclic``, constants), as source.

    A prompt that does not parse yields its unindented import lines for both.
    """

    try:
        tree = ast.parse(prefix)
    except SyntaxError:
        imports = "".join(ln + "\n" for ln in prefix.splitlines() if re.match(r"(import|from)\s+\S", ln))
        return imports, imports
    lines = prefix.splitlines(keepends=True)
    imports, support = [], []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == entry_point:
            continue
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        src = "".join(lines[first - 1 : node.end_lineno])
        src = src if src.endswith("\n") else src + "\n"
        support.append(src)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imports.append(src)
    return "".join(imports), "".join(support)


def code_job(
    code: str, tests: str, entry_point: str | None = None, test_type: str | None = None, code_prefix: str | None = None
) -> CodeJob:
    """The sandbox job for one completion.

    * ``test_type="assert"`` (default): ``tests`` run in the judge against the candidate's
      top-level functions and classes; HumanEval-style tests defining ``check(candidate)`` get
      ``check(entry_point)`` appended. With ``code_prefix`` (HumanEval's prompt: imports, helpers,
      the signature and docstring): a ``code`` lacking ``def <entry_point>`` gets the whole prefix
      prepended (a base model's continuation of the signature); a ``code`` that defines it gets
      the prefix's imports and helpers prepended (``from typing import List`` stays). Either way the
      prefix's helpers also run in the judge, before the tests, so the tests call the prompt's
      ``encode_cyclic`` / ``poly``, never a redefinition by the candidate.
    * ``"stdio"``: ``tests`` is JSON ``{"cases": [{"input", "output"}]}``; the code runs once per
      case (a fresh child process each) with the input on file descriptor 0 / ``sys.stdin``; its
      stdout, after its non-daemon threads finished, is compared to the expected output token by
      token (whitespace-split) in the judge.
    * ``"functional"`` (LiveCodeBench LeetCode-style): JSON ``{"cases": [...], "func_name"}``; each
      input line is one JSON argument of ``Solution().<func_name>`` (or a top-level function); the
      result is compared after a JSON round trip, in the judge. The code gets a prelude of the usual
      imports (after its own ``from __future__`` imports).
    """
    test_type = test_type or "assert"
    if test_type == "assert":
        support = ""
        if code_prefix and entry_point:
            _, support = prompt_parts(code_prefix, entry_point)
            if re.search(rf"def\s+{re.escape(entry_point)}\s*\(", code):
                code = join_code(support, code)
            else:
                code = join_code(code_prefix + ("" if code_prefix.endswith("\n") else "\n") + code)
        judge = join_code(support, tests.rstrip() + "\n")
        if entry_point and re.search(r"^def check\(", tests, re.MULTILINE):
            judge += f"\ncheck({entry_point})\n"
        # LeetCodeDataset's entry point is an expression (``Solution().maxDepth``): the tests call it, and
        # only a bare name is bound to the candidate's in the judge
        name = entry_point if entry_point and entry_point.isidentifier() and not entry_point.startswith("__") else None
        return CodeJob(code, judge, False, name)
    if test_type == "stdio":
        return CodeJob(code, _STDIO_JUDGE.format(spec=tests), True)
    if test_type == "functional":
        return CodeJob(
            join_code(_FUNCTIONAL_PRELUDE, code), _FUNCTIONAL_JUDGE.format(spec=tests, entry=entry_point), False
        )
    raise ValueError(f"unknown test_type {test_type!r}; use assert, stdio or functional")


def make_code_reward(config=None, max_workers: int | None = None, name: str = "code_reward"):
    """A TRL reward function judging code in :mod:`llm.base.sandbox` with ``config`` (a ``SandboxConfig``).

    1.0 iff the judge process's tests pass against the candidate's code (see
    :func:`llm.base.sandbox.run_judged`), else 0.0. After each call ``reward.last_results`` holds the
    per-row :class:`llm.base.sandbox.SandboxResult` (None for rows without tests); each names the
    isolation level that ran in ``result.isolation["level"]``; ``reward.isolation()`` reports the
    level this machine gives.
    """

    cfg = config or SandboxConfig(timeout_s=10.0)

    def reward(prompts, completions, completion_ids=None, **kwargs) -> list[float | None]:

        n = len(completions)
        tests = _column(kwargs, "tests", n, required=True)
        entry = _column(kwargs, "entry_point", n, required=False) or [None] * n
        ttype = _column(kwargs, "test_type", n, required=False) or [None] * n
        prefix = _column(kwargs, "code_prefix", n, required=False) or [None] * n
        idx, jobs = [], []
        for i, (comp, t) in enumerate(zip(completions, tests)):
            if t is None:
                continue
            idx.append(i)
            jobs.append(code_job(extract_code(completion_text(comp)), str(t), entry[i], ttype[i], prefix[i]))
        out: list[float | None] = [None] * n
        results: list = [None] * n
        for i, res in zip(idx, run_many_judged(jobs, cfg, max_workers=max_workers)):
            out[i] = 1.0 if res.passed else 0.0
            results[i] = res
        reward.last_results = results
        return out

    reward.__name__ = name
    reward.last_results = []
    reward.isolation = lambda: isolation_report(cfg)
    return reward


def code_reward(prompts, completions, completion_ids=None, **kwargs) -> list[float | None]:
    """Default-config sandboxed code reward (10 s wall clock per program); see :func:`make_code_reward`.

    ``code_reward.last_results`` holds the last call's per-row sandbox results (with the isolation
    level that ran); ``code_reward.isolation()`` reports the level this machine gives.
    """
    out = _default_code_reward(prompts, completions, completion_ids, **kwargs)
    code_reward.last_results = _default_code_reward.last_results
    return out


_default_code_reward = make_code_reward()
code_reward.last_results = []
code_reward.isolation = _default_code_reward.isolation


def verifiable_reward(prompts, completions, completion_ids=None, **kwargs) -> list[float]:
    """Per row: :func:`math_reward` if ``answer`` is set, else :func:`code_reward` if ``tests`` is set; 0.0 if neither."""
    n = len(completions)
    answers = _column(kwargs, "answer", n, required=False) or [None] * n
    tests = _column(kwargs, "tests", n, required=False) or [None] * n
    rest = {k: v for k, v in kwargs.items() if k not in ("answer", "tests", "answer_format")}
    m = math_reward(prompts, completions, answer=answers, answer_format=kwargs.get("answer_format"))
    code_mask = [a is None and t is not None for a, t in zip(answers, tests)]
    c = (
        code_reward(prompts, completions, tests=[t if cm else None for t, cm in zip(tests, code_mask)], **rest)
        if any(code_mask)
        else [None] * n
    )
    return [mv if mv is not None else (cv if cv is not None else 0.0) for mv, cv in zip(m, c)]
