"""``tiltlab llm eval``: Mean@k / pass@k of a model on the benchmarks, with an optional LLM judge of
diversity.

One module per concern: :mod:`~tiltlab.llm.eval.config` (:class:`EvalConfig` and the translation of a run
config's ``eval:`` section), :mod:`~tiltlab.llm.eval.run` (generation, scoring, the metrics, the saved results:
:func:`evaluate`, :func:`run_eval`), :mod:`~tiltlab.llm.eval.judge` (the HTTP diversity judge and its prompt)
and :mod:`~tiltlab.llm.eval.cli` (the command, ``add_cli``).
"""
