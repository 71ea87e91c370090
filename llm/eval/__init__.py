"""``tiltlab llm eval``: Mean@k / pass@k of a model on the benchmarks, with an optional LLM judge of
diversity.

:mod:`~tiltlab.llm.eval.run` holds the configs, generation and scoring, the HTTP diversity judge and the
command (``add_cli``).
"""
