"""The training runs that the llm-layer checks (:mod:`tiltlab.llm.checks`) judge.

:mod:`~tiltlab.llm.experiments.task` is the shared enumerable task: a tiny real transformer whose
answers can be enumerated, so ``pi``, ``pi*``, ``log Z`` and TV are exact (prompts, split, reward, teacher-forced
answers). :mod:`~tiltlab.llm.experiments.warmup` warms the reference up on it (an exact SFT, cached per seed),
:mod:`~tiltlab.llm.experiments.training` is one online training run on it, and
:mod:`~tiltlab.llm.experiments.pool` the seeds of a check and the fork pool that runs them.
:mod:`~tiltlab.llm.experiments.tiny` holds the runs of the stage-3 comparisons on that task (the arms, their
losses, budgets and raw per-seed results). The checks
import these and turn their numbers into items and verdicts; nothing here imports a check.
"""
