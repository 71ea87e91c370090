"""Fixtures for the claims-core tests (tests/claims/) and, imported by tests/paper_checks/conftest.py, the
paper_checks tests: a registry snapshot restored after each test, no shipped llm record, a git repository
laid out for the pre-registration."""

from __future__ import annotations

import pytest

from tiltlab.claims import registry
from tiltlab.paper_checks import catalog


@pytest.fixture
def isolated_registry():
    """Load the real papers, claims and checks, then restore the registry exactly after the test
    (fake papers, claims and checks registered by the test disappear)."""
    catalog.discover()
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
    """Tests see no shipped llm record unless they set one (``llm_record.LLM_RECORD``); the test of the
    real shipped record reads it by its path. (Restored by hand, not with ``monkeypatch``, so the
    tests' own ``monkeypatch`` is still undone before :func:`isolated_registry` restores the registry.)"""
    from tiltlab.claims import llm_record

    real = llm_record.LLM_RECORD
    llm_record.LLM_RECORD = tmp_path_factory.mktemp("no_llm_record") / "llm.json"
    try:
        yield
    finally:
        llm_record.LLM_RECORD = real


def need_git() -> None:
    """Skip without git, except under CI (``CI`` set), where a missing git is a failure: CI runs on a
    git clone, so the pre-registration tests must run there."""
    import os
    import shutil

    if shutil.which("git") is None:
        if os.environ.get("CI"):
            pytest.fail("CI runs with git: the pre-registration tests need it")
        pytest.skip("git is not installed")


def git(root, *args: str) -> str:
    """``git -C root args`` with a throwaway identity; its stdout (stripped); a failure raises."""
    import subprocess

    cfg = ["-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c", "commit.gpgsign=false"]
    out = subprocess.run(["git", "-C", str(root), *cfg, *args], capture_output=True, text=True, check=True)
    return out.stdout.strip()


class PreregRepo:
    """A temporary git repository laid out like this one: rule files and a
    ``paper_checks/preregistration.toml``; :meth:`commit` commits everything, :meth:`register` writes
    the current hashes of the named checks' rule files (``tiltlab report --preregister``'s code)."""

    def __init__(self, root, files):
        from pathlib import Path

        self.root = Path(root)
        self.files = files  # check name -> rule file paths

    def write(self, rel: str, text: str) -> None:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")

    def commit(self, message: str) -> str:
        git(self.root, "add", "-A")
        git(self.root, "commit", "-q", "--allow-empty", "-m", message)
        return git(self.root, "rev-parse", "HEAD")

    def register(self, *checks: str) -> None:
        from tiltlab.claims import prereg

        blocks = []
        for name, paths in self.files.items():
            listed = "".join(f'"{p}" = ""\n' for p in paths)
            blocks.append(f'[[rule]]\ncheck = "{name}"\nseeds = 2\nhistory = "test"\n[rule.files]\n{listed}')
        path = self.root / prereg.PREREG_PATH
        text = path.read_text(encoding="utf-8") if path.exists() else "# test registrations\n\n" + "\n".join(blocks)
        new, _ = prereg.preregister_text(text, checks or None, self.root)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(new, encoding="utf-8")


@pytest.fixture
def prereg_repo(tmp_path, monkeypatch):
    """A :class:`PreregRepo` whose checks ``tiny`` and ``tiny2`` (the fake llm checks of the record
    tests) are registered at one commit (``repo.reg``) and left unchanged by a later commit
    (``repo.run``, HEAD): the code's checkout for ``provenance.git_commit`` / ``git_sha`` and for
    ``prereg`` while the test runs, so ``tiltlab check`` stamps and ``--ship-llm`` verifies in it."""
    from tiltlab.claims import prereg, provenance

    need_git()
    repo = PreregRepo(tmp_path / "repo", {"tiny": ["rules/tiny.py", "claims.toml"], "tiny2": ["rules/tiny.py"]})
    repo.root.mkdir()
    git(repo.root, "init", "-q")
    repo.write("rules/tiny.py", "MARGIN = 0.02\n")
    repo.write("claims.toml", '[[claim]]\nid = "zz"\n')
    repo.register()
    repo.reg = repo.commit("register the rules")
    repo.write("notes.txt", "an unrelated change\n")
    repo.run = repo.commit("the commit that runs")
    monkeypatch.setattr(provenance, "_REPO", repo.root)
    monkeypatch.setattr(prereg, "_REPO", repo.root)
    return repo
