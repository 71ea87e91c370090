"""The one prompt formatter: the text (and token ids) a model is conditioned on for a dataset row.

DISA's Stage-1 labels ``log Z_hat(x)`` are the log-partition of ``pi_ref(.|x)`` for the exact
conditioning string ``x``; Stage 2 embeds it, Stage 3 trains on it and evaluation samples from it.
Stage 1 (:mod:`tiltlab.llm.disa.stage1`), Stage 2 (:mod:`tiltlab.llm.disa.stage2`), evaluation
(:mod:`tiltlab.llm.eval.run`) and the online training dataset (:mod:`tiltlab.llm.train.cli`)
therefore all format prompts here:

* chat models: the prompt is one user turn (optionally after a system turn), rendered by the
  tokenizer's chat template with ``add_generation_prompt=True`` -- the rendering TRL's
  ``GRPOTrainer`` applies to a conversational ``prompt`` column;
* ``chat_template=False``: the raw prompt string.

The text is tokenized without added special tokens (the chat template writes its own).
Import-light: nothing heavy is imported (the tokenizer is passed in).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "check_chat_template_kwargs",
    "format_prompt",
    "prompt_messages",
    "prompt_text",
    "prompt_token_ids",
    "training_prompt",
]


def prompt_messages(prompt: str, system: str | None = None) -> list[dict[str, str]]:
    """TRL's conversational form of a prompt: ``[{"role": "system", ...}?, {"role": "user", ...}]``."""
    if not isinstance(prompt, str):
        raise TypeError(f"prompt must be a string, got {type(prompt).__name__}")
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]


def prompt_text(prompt: Any) -> str:
    """The user text of a prompt entry: the string itself, or the last message's content."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict) and "content" in prompt[-1]:
        return str(prompt[-1]["content"])
    raise ValueError(f"a prompt is a string or a list of chat messages, got {prompt!r:.80}")


def format_prompt(
    tokenizer,
    prompt: str,
    chat_template: bool = True,
    *,
    system: str | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> str:
    """The text the model is conditioned on: the chat-templated user turn, or the raw prompt.

    ``chat_template_kwargs`` are passed to ``apply_chat_template`` (as TRL's
    ``GRPOConfig.chat_template_kwargs``, e.g. ``{"enable_thinking": False}`` for Qwen3).
    """
    if not chat_template:
        if system or chat_template_kwargs:
            raise ValueError("system / chat_template_kwargs need chat_template=True")
        return prompt
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ValueError("chat_template=True but the tokenizer has no chat template; use chat_template=False")
    return tokenizer.apply_chat_template(
        prompt_messages(prompt, system), tokenize=False, add_generation_prompt=True, **(chat_template_kwargs or {})
    )


def prompt_token_ids(
    tokenizer,
    prompt: str,
    chat_template: bool = True,
    *,
    system: str | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """Token ids of :func:`format_prompt` (no special tokens added: the template writes its own)."""
    text = format_prompt(tokenizer, prompt, chat_template, system=system, chat_template_kwargs=chat_template_kwargs)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def training_prompt(prompt: str, chat_template: bool = True, system: str | None = None) -> list[dict] | str:
    """The ``prompt`` entry of a TRL training dataset that TRL renders into :func:`format_prompt`'s
    text: the conversational form for chat models, the raw string otherwise."""
    if not chat_template:
        if system:
            raise ValueError("a system prompt needs chat_template=True")
        return prompt
    return prompt_messages(prompt, system)


def check_chat_template_kwargs(kwargs: Any, chat_template: bool) -> None:
    """One-line ``ValueError`` unless ``kwargs`` is None or a mapping used with the chat template (the
    check Stage 1 and eval share)."""
    if kwargs is None:
        return
    if not isinstance(kwargs, dict):
        raise ValueError(f"chat_template_kwargs must be a mapping, e.g. {{enable_thinking: false}}, got {kwargs!r}")
    if not chat_template:
        raise ValueError("chat_template_kwargs need chat_template=True")
