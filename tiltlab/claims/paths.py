"""Where the claims' data lives.

The claim and paper TOML files, the pins, the pre-registration and the shipped records live with the
top-layer package that presents them, ``paper_checks/``; the claims core reads them and imports no code
there."""

from __future__ import annotations

from pathlib import Path

#: ``paper_checks/`` (resolved: the checkout's folder, not the ``tiltlab/paper_checks`` link to it).
DATA_DIR = (Path(__file__).resolve().parents[1] / "paper_checks").resolve()
