"""``tiltlab llm ...``: the LLM layer's commands.

Each subcommand lives in its own module that exposes ``add_cli(subparsers)``; this file only
lists them in :func:`subcommand_modules` (order = order in ``tiltlab llm --help``): a new command is a
module with an ``add_cli`` and one import and entry there. Modules listed here must be import-light (no
torch/transformers at import time): their handlers import the heavy stack lazily. Flags come
from the command's config dataclass (:mod:`tiltlab.dataclass_cli`, :mod:`tiltlab.llm.base.config_args`).

DISA Stages 1-2 on a real backbone (GPU; ``pip install 'tiltlab[llm,vllm]'``)::

    tiltlab llm stage1 --proposal Qwen/Qwen3-32B --reference Qwen/Qwen3-1.7B \
        --dataset prompts.jsonl --out-dir runs/disa/stage1 --M 8 --tilt-beta 1.0 --reward math \
        --engine vllm --temperature 1.0 --max-new-tokens 4096 --gpu-memory-utilization 0.6
    tiltlab llm stage2 --labels runs/disa/stage1 --out-dir runs/disa/stage2
    # Stage 3 reads: tiltlab.llm.disa.stage2.run.load_log_z_predictor("runs/disa/stage2").predict_log_z(prompts)

Both models must share one tokenizer (Qwen3 sizes do). An interrupted Stage 1 resumes when
rerun with the same flags.
"""

from __future__ import annotations

from types import ModuleType

from tiltlab.llm import demo
from tiltlab.llm.disa import stage1
from tiltlab.llm.disa.stage2 import cli as stage2
from tiltlab.llm.eval import cli as evaluate
from tiltlab.llm.prepare import cli as prepare
from tiltlab.llm.train import cli as trainers_cli


def subcommand_modules() -> tuple[ModuleType, ...]:
    """The modules whose ``add_cli(subparsers)`` adds one ``tiltlab llm`` command each (imported when
    ``tiltlab llm`` is parsed, not when ``tiltlab --help`` is)."""

    return (stage1, stage2, evaluate, trainers_cli, demo, prepare)


def register(subparsers) -> None:
    """Called by ``tiltlab.cli``: add ``tiltlab llm`` and its subcommands."""
    p = subparsers.add_parser(
        "llm",
        help="LLM layer: DISA stages 1-2, evaluation, training",
        description="LLM layer commands (see `tiltlab llm COMMAND --help`).",
    )
    sub = p.add_subparsers(dest="llm_command", metavar="COMMAND")
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
    for module in subcommand_modules():
        module.add_cli(sub)
