"""DISA Stage 2: amortise the Stage-1 labels with a small prompt regressor.

:mod:`~tiltlab.llm.disa.stage2.run` holds :class:`Stage2Config`, the embedding of the prompts, the fit,
:class:`LogZPredictor`, the annotation of a dataset and the command ``tiltlab llm stage2`` (``add_cli``).
"""
