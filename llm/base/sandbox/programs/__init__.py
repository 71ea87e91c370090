"""The programs the sandbox runs, each a file beside this one that an interpreter runs by path.

- ``boot.py``: the candidate's bootstrap, ``python -I -B [-S] boot.py <fd>`` under the planned isolation
  (bwrap binds this folder read-only at the same path). Its config, the host's constants of
  :mod:`..config` included, and the candidate's program come from ``<fd>``.
- ``judge_main.py``: the judge started as its own interpreter, ``python -I -B -S judge_main.py <fd>``; it
  runs ``judge.py`` (the judge's program) with the configuration read from ``<fd>``.
- ``judge_server.py``: ``python -I -B -S judge_server.py <socket> <boot fd>``, started once per process; it
  compiles ``judge.py`` once and forks a judge per run (see :mod:`..server`).
- ``codec.py``: the wire format of both sides. It is not imported: ``boot.py`` and the two judge launchers
  compile it, and the program runs that code in its own globals where its codec block stands, so the codec's
  functions share the program's globals as one program's would. ``from .codec import ...`` under
  ``TYPE_CHECKING`` is there for ruff and mypy, which read these files as the package they are.

``-I`` keeps this folder off ``sys.path``: a program finds its neighbours through its own ``__file__``.
"""

from __future__ import annotations

from pathlib import Path

DIR = Path(__file__).resolve().parent
"""The folder of the program files (bound read-only into the bwrap sandbox when no bound prefix holds it)."""

BOOT = str(DIR / "boot.py")
"""The candidate's bootstrap."""

JUDGE = str(DIR / "judge_main.py")
"""The judge started as its own interpreter."""

JUDGE_SERVER = str(DIR / "judge_server.py")
"""The judge server."""
