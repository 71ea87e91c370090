"""The LLM diversity judge of ``tiltlab llm eval`` (DISA App. D.5 / FlowRL, Likert 1-5): its prompt, the
endpoint's settings (:class:`JudgeConfig`), and the HTTP client of any OpenAI-compatible
``/v1/chat/completions`` endpoint (:func:`judge_diversity`)."""

from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from tiltlab.progress import track

__all__ = [
    "DISA_D5_JUDGE_TEXT",
    "JUDGE_SYSTEM_PROMPT",
    "JUDGE_USER_TEMPLATE",
    "JudgeConfig",
    "format_judge_messages",
    "judge_diversity",
    "parse_judge_score",
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

    if len(problems) != len(responses):
        raise ValueError(f"{len(problems)} problems but {len(responses)} response groups")
    cfg = (config or JudgeConfig()).resolved()
    scores = []
    pairs = list(zip(problems, responses))
    for p, rs in track(pairs, desc="judging", unit="prompt", mode=None if progress else "off"):
        scores.append(parse_judge_score(_post_chat(cfg, format_judge_messages(p, rs, cfg.max_response_chars))))
    return scores
