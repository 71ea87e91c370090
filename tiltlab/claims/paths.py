"""Where the claims' data lives: a folder the top layer passes in.

The claim and paper TOML files, the pins, the pre-registration and the shipped records live with the
package that presents them (``paper_checks/``, which calls :func:`configure` with its own folder when it
is imported); the claims core is told that folder, never reaches for it, and imports no code there."""

from __future__ import annotations

from pathlib import Path

__all__ = ["configure", "configured", "data_dir"]

_DATA_DIR: list[Path | None] = [None]


def configure(data_dir: Path | str) -> Path:
    """Make ``data_dir`` (resolved) the folder the claims core reads its data from; returns it."""
    path = Path(data_dir).resolve()
    if not path.is_dir():
        raise ValueError(f"claims data folder {path} does not exist; pass the folder holding claims/ and papers.toml")
    _DATA_DIR[0] = path
    return path


def configured() -> bool:
    """Whether a data folder was given (:func:`configure`)."""
    return _DATA_DIR[0] is not None


def data_dir() -> Path:
    """The data folder given to :func:`configure` (``paper_checks/`` once ``tiltlab.paper_checks`` is imported)."""
    path = _DATA_DIR[0]
    if path is None:
        raise RuntimeError(
            "the claims core has no data folder: import tiltlab.paper_checks (it passes its folder) "
            "or call tiltlab.claims.paths.configure(DIR) first"
        )
    return path
