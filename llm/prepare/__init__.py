"""``tiltlab llm prepare``: datasets into the prompt JSONL the stages read (DAPO, DeepScaleR, DeepCoder,
MATH), selection by pass rate, SFT rows from Stage-1 samples, FPA's offline groups.

One module per concern: :mod:`~tiltlab.llm.prepare.config` (:class:`SelectConfig`, :class:`FpaConfig`),
:mod:`~tiltlab.llm.prepare.run` (the preparers, the selection and FPA's data generation) and
:mod:`~tiltlab.llm.prepare.cli` (the command, ``add_cli``).
"""
