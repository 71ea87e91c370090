"""Each claim's simulator numbers, computed once.

A module here runs one experiment (an M study, a tau sweep, ...) and returns its numbers; the
claim check (``tiltlab.sim.checks``) judges them and the figure (``tiltlab.sim.figures``) plots
them, so a claim's numbers are identical in the check output, the figure and the report.
"""

if __name__ != "tiltlab.sim.experiments":  # imported by its bare folder name
    raise ImportError(f"import this package as tiltlab.sim.experiments, not as {__name__!r}")
