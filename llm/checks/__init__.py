"""Checks of the ``llm`` layer (``layer="llm"``, all ``slow``): claims decided by training a small
real transformer on an enumerable task with exact ``pi``, ``pi*``, ``log Z`` and TV.

Importing this package registers its checks with ``tiltlab.claims.registry``; the shared task and
its exact quantities are :mod:`tiltlab.llm.experiments.task` (its warm-up, training loop and seed pool beside it), the checks :mod:`tiltlab.llm.checks.enumerable` and :mod:`tiltlab.llm.checks.paced`
(:mod:`tiltlab.llm.checks.computed` judges numbers their memoized runs already compute);
:mod:`tiltlab.llm.checks.stage1_real` runs Stage 1 on a real pretrained model (SmolLM2-135M-Instruct, vLLM);
:mod:`tiltlab.llm.checks.real_training` holds what training it with ``tiltlab llm train`` (TRL + colocated
vLLM) needs; :mod:`tiltlab.llm.checks.real_comparison` is the long check that trains it with DISA, FlowRL
and a same-optimum GRPO, training runs as units.
See ``docs/llm-checks.md``.
"""

from __future__ import annotations

from tiltlab.llm.checks import computed, enumerable, paced, real_comparison, real_training, stage1_real

__all__ = ["computed", "enumerable", "paced", "real_comparison", "real_training", "stage1_real"]
