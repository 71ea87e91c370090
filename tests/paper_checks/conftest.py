"""Fixtures for the paper_checks tests: a registry snapshot restored after each test."""

from __future__ import annotations

import pytest

from tiltlab.paper_checks import registry


@pytest.fixture
def isolated_registry():
    """Load the real claims and checks, then restore the registry exactly after the test
    (fake claims/checks registered by the test disappear)."""
    registry.discover()
    claims, checks, loaded = dict(registry._CLAIMS), dict(registry._CHECKS), set(registry._LOADED)
    try:
        yield registry
    finally:
        registry._CLAIMS.clear()
        registry._CLAIMS.update(claims)
        registry._CHECKS.clear()
        registry._CHECKS.update(checks)
        registry._LOADED.clear()
        registry._LOADED.update(loaded)
