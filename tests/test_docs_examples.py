"""The Python examples of docs/usage.md run as written: every ```python block, in order, in one namespace
(a later block may use an earlier one's names, as a reader would)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "usage.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)


def test_the_doc_has_its_examples():
    assert len(BLOCKS) >= 4  # the objectives, the registry, the catalog, the renamed knobs


def run_blocks(blocks: list[str], name: str) -> dict:
    """Run ``blocks`` in order in one namespace; an example that raises raises here."""
    namespace: dict = {}
    for i, block in enumerate(blocks):
        exec(compile(block, f"{name}[python block {i}]", "exec"), namespace)
    return namespace


def test_every_python_example_runs_in_order():
    ns = run_blocks(BLOCKS, DOC.name)
    assert "out" in ns and "batch" in ns  # the examples' own results exist


def test_a_broken_or_out_of_order_example_fails_the_runner():
    """The runner raises on an example that raises, and on one that uses a later block's name."""
    with pytest.raises(ZeroDivisionError):
        run_blocks(["x = 1", "1 / 0"], "broken")
    with pytest.raises(NameError):
        run_blocks(["y = x", "x = 1"], "out of order")
