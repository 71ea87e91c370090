"""Fixtures for the paper_checks tests: a registry snapshot restored after each test."""

from __future__ import annotations

import pytest

from tiltlab.paper_checks import registry


@pytest.fixture
def isolated_registry():
    """Load the real papers, claims and checks, then restore the registry exactly after the test
    (fake papers, claims and checks registered by the test disappear)."""
    registry.discover()
    papers, claims, checks = dict(registry._PAPERS), dict(registry._CLAIMS), dict(registry._CHECKS)
    loaded = set(registry._LOADED)
    try:
        yield registry
    finally:
        registry._PAPERS.clear()
        registry._PAPERS.update(papers)
        registry._CLAIMS.clear()
        registry._CLAIMS.update(claims)
        registry._CHECKS.clear()
        registry._CHECKS.update(checks)
        registry._LOADED.clear()
        registry._LOADED.update(loaded)


@pytest.fixture(autouse=True)
def no_shipped_llm_record(tmp_path_factory):
    """Tests see no shipped llm record unless they set one (``record.LLM_RECORD``); the test of the
    real shipped record reads it by its path. (Restored by hand, not with ``monkeypatch``, so the
    tests' own ``monkeypatch`` is still undone before :func:`isolated_registry` restores the registry.)"""
    from tiltlab.paper_checks import record

    real = record.LLM_RECORD
    record.LLM_RECORD = tmp_path_factory.mktemp("no_llm_record") / "llm.json"
    try:
        yield
    finally:
        record.LLM_RECORD = real
