"""Fixtures for the paper_checks tests: the claims-core tests' own (``tests/claims/conftest.py``), the same
objects, so that a test here sees the same isolated registry, no shipped llm record (autouse) and
pre-registration repository as a test there."""

from __future__ import annotations

from tests.claims.conftest import (  # noqa: F401  (pytest finds fixtures by name in this module)
    PreregRepo,
    git,
    isolated_registry,
    need_git,
    no_shipped_llm_record,
    prereg_repo,
)
