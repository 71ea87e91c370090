"""Shared fixtures for tests/llm (built locally; no hub access).

Fixture names (all session-scoped unless noted):

* ``tiny_dir``        -> pathlib.Path of a directory holding the tiny Qwen3 model + tokenizer written with
                        ``save_pretrained`` (load it with ``llm.base.models.load_model(tiny_dir)`` /
                        ``load_tokenizer(tiny_dir)``, or pass ``str(tiny_dir)`` to an engine).
* ``tiny_model``      -> the ``Qwen3ForCausalLM`` (fp32, CPU, eval mode) reloaded from ``tiny_dir``.
                        Shared across tests: do NOT train it in place (``copy.deepcopy`` it first).
* ``tiny_tokenizer``  -> the ``PreTrainedTokenizerFast`` reloaded from ``tiny_dir`` (padding_side="left").
* ``math_rows``       -> list[dict] of 12 synthetic arithmetic rows (id, prompt, answer, difficulty, task).
* ``code_rows``       -> list[dict] of 5 synthetic function-writing rows (id, prompt, tests, entry_point, solution).

All fixtures skip the requesting test when ``transformers`` is not installed (the data fixtures
need nothing). Seed 0 everywhere.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    pytest.importorskip("transformers")
    from tiltlab.llm.base.models import build_tiny

    out = tmp_path_factory.mktemp("tiny_qwen3")
    build_tiny(out_dir=out, seed=0)
    return out


@pytest.fixture(scope="session")
def tiny_model(tiny_dir):
    from tiltlab.llm.base.models import load_model

    return load_model(tiny_dir, device="cpu")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_dir):
    from tiltlab.llm.base.models import load_tokenizer

    return load_tokenizer(tiny_dir)


@pytest.fixture(scope="session")
def math_rows():
    from tiltlab.llm.base.tasks import arithmetic_tasks

    return arithmetic_tasks(12, seed=0)


@pytest.fixture(scope="session")
def code_rows():
    from tiltlab.llm.base.tasks import function_tasks

    return function_tasks(5, seed=0)
