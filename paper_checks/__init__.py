"""Every claim of the five papers as data, each tied to executable checks and a verdict."""

from paper_checks.registry import (
    Check,
    CheckResult,
    Claim,
    Outcome,
    Verdict,
    checks,
    claims,
    declare_claim,
    discover,
    get_claim,
    register_check,
    run_checks,
)

__all__ = [
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
