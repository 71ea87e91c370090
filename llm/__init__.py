"""tiltlab.llm: the LLM layer (models, data, rewards, sandboxed code execution, rollouts, scoring, DISA stages, evaluation).

Import-light on purpose: ``import llm`` does not import torch/transformers; import the submodules
(``llm.base.models``, ``llm.base.data``, ``llm.base.rewards``, ``llm.base.sandbox``, ``llm.eval``, ...) where needed.
"""

if __name__ != "tiltlab.llm":  # imported by its bare folder name (the repo root is on sys.path)
    raise ImportError(f"import this package as tiltlab.llm, not as {__name__!r}")
