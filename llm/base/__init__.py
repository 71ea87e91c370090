"""The base of the LLM layer: what every stage uses.

Models and tokenizers (:mod:`~tiltlab.llm.base.models`), datasets and prompts (:mod:`~tiltlab.llm.base.data`,
:mod:`~tiltlab.llm.base.prompts`, :mod:`~tiltlab.llm.base.tasks`), rewards (:mod:`~tiltlab.llm.base.rewards`,
code run in :mod:`~tiltlab.llm.base.sandbox`), rollout engines (:mod:`~tiltlab.llm.base.rollout`), teacher-forced
scoring (:mod:`~tiltlab.llm.base.scoring`), the coverage statistic, the learning-signal findings, and the run
configuration's schema (:mod:`~tiltlab.llm.base.run_config`) with the commands' ``--config`` handling
(:mod:`~tiltlab.llm.base.config_args`). Nothing here imports a stage (DISA, training, evaluation, preparation).

Import-light: ``import tiltlab.llm.base`` imports no submodule.
"""
