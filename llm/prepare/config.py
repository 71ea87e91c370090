"""``tiltlab llm prepare``'s settings: :class:`SelectConfig` (``prepare select``) and :class:`FpaConfig`
(``prepare fpa``), one field = one flag, checked when built."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FpaConfig", "SelectConfig"]


@dataclass
class SelectConfig:
    """``tiltlab llm prepare select``: keep the prompts with learning signal under pi_ref."""

    stage1: str
    """Stage-1 output directory of a run with proposal = reference at T = 1, top-p 1, top-k 0 (pi_ref's own samples)."""
    out: str
    """Selected training rows (.jsonl/.parquet)."""
    min_pass: float = 0.1
    """Smallest pi_ref pass rate kept (a prompt pi_ref never solves gives no signal)."""
    max_pass: float = 0.9
    """Largest pi_ref pass rate kept (a prompt pi_ref always solves gives no signal either)."""
    heldout_fraction: float = 0.0
    """Share of the selected prompts written to ``heldout_out`` instead (a seeded random split)."""
    heldout_out: str | None = None
    """Held-out rows file (required when heldout_fraction > 0)."""
    seed: int = 0
    """Seed of the held-out split."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_pass <= self.max_pass <= 1.0:
            raise ValueError(f"need 0 <= min_pass <= max_pass <= 1, got {self.min_pass} and {self.max_pass}")
        if not 0.0 <= self.heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction must lie in [0, 1), got {self.heldout_fraction}")
        if (self.heldout_fraction > 0) != (self.heldout_out is not None):
            raise ValueError("heldout_out and heldout_fraction > 0 go together")


@dataclass
class FpaConfig:
    """FPA's offline data generation (FPA App. B.1)."""

    model: str
    """pi_ref, the model that samples the completions."""
    dataset: str
    """Prompt rows with ``answer`` (e.g. the output of ``prepare math``)."""
    out: str
    """Training rows file (.jsonl/.parquet); the held-out rows go to ``<stem>.val<suffix>``."""
    k: int = 8
    """Samples per prompt (K = 8)."""
    temperature: float = 0.7
    """Sampling temperature (T = 0.7)."""
    top_p: float = 1.0
    max_new_tokens: int = 2048
    """Max generation length 2,048 (FPA Table 3)."""
    seed: int = 42
    """Constant seed 42 (sampling and the held-out split)."""
    holdout_fraction: float = 0.05
    """Share of the kept prompts held out for validation (0.05 in the paper)."""
    reward: str = "math"
    engine: str = "vllm"
    """Rollout engine: vllm | hf."""
    chat_template: bool = False
    """FPA's prompt is used as plain text (a base model); True renders it with the chat template."""
    gpu_memory_utilization: float = 0.9
    tensor_parallel_size: int = 1
    batch_size: int = 256
    """Prompts per generation call."""
    limit: int | None = None

    def __post_init__(self) -> None:
        if self.k < 2:
            raise ValueError("k must be >= 2 (prompts whose samples all agree are dropped)")
        if not 0.0 <= self.holdout_fraction < 1.0:
            raise ValueError(f"holdout_fraction must lie in [0, 1), got {self.holdout_fraction}")
