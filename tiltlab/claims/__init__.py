"""The claims core: the registry of papers, claims and checks, the statistical rule that turns a check's
values into a verdict, the record of a run, the pre-registration of the llm rules, and the aggregation of a
claim's checks into one decision.

The bottom of the stack: it imports nothing of the project above ``tiltlab.files``,
``tiltlab.progress`` and ``tiltlab.hints``, so the check layers (``theory``, ``sim``, ``llm``) and the top layer
(``paper_checks``: the data checks, the report, the CLI) all build on it. Its data (the claim and paper
files, the pins, the pre-registration, the shipped records) lives in a folder the top layer passes in
(:func:`tiltlab.claims.paths.configure`, called when ``tiltlab.paper_checks`` is imported).
"""
