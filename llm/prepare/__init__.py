"""``tiltlab llm prepare``: datasets into the prompt JSONL the stages read (DAPO, DeepScaleR, DeepCoder,
MATH), selection by pass rate, SFT rows from Stage-1 samples, FPA's offline groups.

:mod:`~tiltlab.llm.prepare.run` holds the configs, the pipelines and the command (``add_cli``).
"""
