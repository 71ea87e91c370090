"""Every claim of the five papers as data, each tied to executable checks and a verdict."""

if __name__ != "tiltlab.paper_checks":  # imported by its bare folder name (the repo root is on sys.path)
    raise ImportError(f"import this package as tiltlab.paper_checks, not as {__name__!r}")

from pathlib import Path as _Path

from tiltlab.claims import paths as _paths
from tiltlab.claims.registry import (
    Check,
    CheckResult,
    Claim,
    Outcome,
    Verdict,
    checks,
    claims,
    declare_claim,
    get_claim,
    register_check,
)
from tiltlab.paper_checks.catalog import discover, run_checks

#: This folder (resolved: the checkout's ``paper_checks/``, not the ``tiltlab/paper_checks`` link): the claim and
#: paper files, the pins, the pre-registration and the shipped records, given to the claims core (which reads
#: none of them on import).
DATA_DIR = _paths.configure(_Path(__file__).resolve().parent)

__all__ = [
    "DATA_DIR",
    "Check",
    "CheckResult",
    "Claim",
    "Outcome",
    "Verdict",
    "checks",
    "claims",
    "declare_claim",
    "discover",
    "get_claim",
    "register_check",
    "run_checks",
]
