"""Symbolic (sympy) checks of every proposition of the papers (see docs/papers.md).

One module per paper (:mod:`tiltlab.theory.disa`, :mod:`tiltlab.theory.paced`, :mod:`tiltlab.theory.lad`,
:mod:`tiltlab.theory.fpa`; DISA's results beyond its paper in :mod:`tiltlab.theory.disa_beyond`); each proposition is a function ``check_xxx(...) -> CheckResult``
that *builds* the statement in sympy and decides it. Every such function takes the
candidate (a formula, a coefficient, a variant name) as an argument, so a test can feed
a deliberately wrong variant and see it rejected. :mod:`tiltlab.theory.checks` registers the
correct variants with the claims registry (``layer="theory"``); ``python -m tiltlab.theory``
runs them and prints one line per claim.
"""

if __name__ != "tiltlab.theory":  # imported by its bare folder name (the repo root is on sys.path)
    raise ImportError(f"import this package as tiltlab.theory, not as {__name__!r}")

__all__ = ["disa", "fpa", "lad", "paced"]
