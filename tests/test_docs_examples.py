"""The Python examples of docs/usage.md run as written: every ```python block, in order, in one namespace
(a later block may use an earlier one's names, as a reader would). The section on TRL scripts
(:data:`TRL_SECTION`) needs the [llm] extra and runs on its own, in a namespace of its own, as a reader copies it
into a script."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "usage.md"
TEXT = DOC.read_text(encoding="utf-8")
TRL_SECTION = "DISA / FlowRL / LAD in your TRL script"
"""The heading of the section whose examples train (TRL, transformers, datasets)."""


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.S)


def split_section(text: str, heading: str) -> tuple[str, str]:
    """``(the section under '## heading', the rest of text)``; the section ends at the next '## ' heading."""
    m = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    if m is None:
        return "", text
    return m.group(1), text[: m.start()] + text[m.end() :]


SECTION, REST = split_section(TEXT, TRL_SECTION)
BLOCKS = python_blocks(REST)
TRL_BLOCKS = python_blocks(SECTION)


def test_the_doc_has_its_examples():
    assert len(BLOCKS) == 5  # the objectives, the registry, the catalog, the knob table, the renamed knobs
    assert len(TRL_BLOCKS) == 9  # setup, FlowRL, TRL's beta, GRPO, Stage 1, Stage 2, Stage 3, its check, LAD


def test_the_trl_section_shows_the_python_api():
    """The section exists under its heading and its code uses each public entry a TRL user needs (deleting an
    example fails here, not only in the runner)."""
    assert f"\n## {TRL_SECTION}\n" in TEXT
    code = "\n".join(TRL_BLOCKS)
    for name in (
        "TiltGRPOConfig(",
        "TiltGRPOTrainer(",
        'objective="flowrl"',
        'objective="grpo"',
        'loss_type="dr_grpo"',
        'objective="disa"',
        'objective="lad"',
        "tilt_beta=",
        "run_stage1(",
        "run_stage2(",
        "load_log_z_predictor(",
        "read_manifest(",
        "log_z_fn=predictor.predict_log_z",
        "log_z_manifest=manifest",
        "trainer.state.global_step == 2",
    ):
        assert name in code, name
    # the doc of the LLM layer points to it
    assert "usage.md#disa--flowrl--lad-in-your-trl-script" in (DOC.parent / "llm.md").read_text(encoding="utf-8")


def test_the_section_splitter_finds_a_section_and_its_end():
    text = "# T\n## A\n```python\na = 1\n```\n## B\n```python\nb = 2\n```\n## C\nc\n"
    section, rest = split_section(text, "B")
    assert python_blocks(section) == ["b = 2\n"] and python_blocks(rest) == ["a = 1\n"] and "## C" in rest
    assert split_section(text, "missing") == ("", text)


def run_blocks(blocks: list[str], name: str) -> dict:
    """Run ``blocks`` in order in one namespace; an example that raises raises here."""
    namespace: dict = {}
    for i, block in enumerate(blocks):
        exec(compile(block, f"{name}[python block {i}]", "exec"), namespace)
    return namespace


def test_every_python_example_runs_in_order():
    ns = run_blocks(BLOCKS, DOC.name)
    assert "out" in ns and "batch" in ns  # the examples' own results exist


@pytest.mark.llm
def test_the_trl_section_runs_as_written():
    """FlowRL, GRPO (dr_grpo), DISA Stages 1-3 and LAD train two steps each on the tiny Qwen3 (the blocks'
    own asserts check the steps, Stage 2's log Z and the refused settings)."""
    for module in ("trl", "transformers", "datasets"):
        pytest.importorskip(module)
    ns = run_blocks(TRL_BLOCKS, f"{DOC.name} ({TRL_SECTION})")
    assert ns["args"].objective == "lad" and ns["trainer"].state.global_step == 2
    assert ns["summary"]["n_prompts"] == 16 and tuple(ns["log_z"].shape) == (16,)
    assert not Path(ns["tmp"].name).exists()  # the example cleans up after itself


def test_a_broken_or_out_of_order_example_fails_the_runner():
    """The runner raises on an example that raises, and on one that uses a later block's name."""
    with pytest.raises(ZeroDivisionError):
        run_blocks(["x = 1", "1 / 0"], "broken")
    with pytest.raises(NameError):
        run_blocks(["y = x", "x = 1"], "out of order")
