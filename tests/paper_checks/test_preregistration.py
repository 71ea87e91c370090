"""Pre-registration: every llm rule names the commit that fixed it, before the run that decides it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tiltlab.paper_checks import record, registry

ROOT = Path(__file__).resolve().parents[2]


def test_every_llm_check_is_pre_registered():
    registry.discover()
    prereg = registry.preregistration()
    names = {c.name for c in registry.checks() if c.layer == "llm"}
    assert names <= set(prereg), f"llm checks without a pre-registered rule: {sorted(names - set(prereg))}"
    assert all(v["history"] for v in prereg.values())


def test_shared_runs_name_registered_llm_claims():
    registry.discover()
    llm_claims = {c.claim_id for c in registry.checks() if c.layer == "llm"}
    runs = registry.shared_runs()
    assert runs
    for run, claims in runs:
        assert set(claims) <= llm_claims, (run, sorted(set(claims) - llm_claims))


def test_a_malformed_entry_is_refused(tmp_path):
    bad = tmp_path / "p.toml"
    bad.write_text('[[rule]]\ncheck = "x"\nrule_commit = "abc"\nseeds = 3\n', encoding="utf-8")
    with pytest.raises(ValueError, match="rule_commit"):
        registry.preregistration(bad)
    bad.write_text('[[rule]]\ncheck = "x"\nrule_commit = "abcdef0"\nseeds = 0\n', encoding="utf-8")
    with pytest.raises(ValueError, match="seeds"):
        registry.preregistration(bad)
    twice = '[[rule]]\ncheck = "x"\nrule_commit = "abcdef0"\nseeds = 2\n'
    bad.write_text(twice * 2, encoding="utf-8")
    with pytest.raises(ValueError, match="twice"):
        registry.preregistration(bad)
    bad.write_text('[[shared_run]]\nrun = "r"\nclaims = ["a"]\n', encoding="utf-8")
    with pytest.raises(ValueError, match="two claims"):
        registry.shared_runs(bad)
    assert registry.preregistration(tmp_path / "none.toml") == {}


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False)


def test_rule_commits_precede_the_shipped_runs_and_seed_counts_match():
    """For every row of the shipped llm record: its check's rule commit is an ancestor of (or is)
    the commit that ran it, and the tiny-model rows ran with the registered seed count."""
    if shutil.which("git") is None or _git("rev-parse", "--git-dir").returncode != 0:
        if os.environ.get("CI"):
            pytest.fail("CI runs on a git clone: git and the repository history are needed here")
        pytest.skip("not a git checkout")
    rec = record.load_llm_record(ROOT / "paper_checks" / "records" / "llm.json")
    assert rec is not None
    prereg = registry.preregistration()
    for row in rec["checks"]:
        rule = prereg[row["check"]]
        run = row.get("commit") or rec["commit"]
        for c in (rule["rule_commit"], run):
            assert _git("cat-file", "-e", f"{c}^{{commit}}").returncode == 0, f"commit {c} is not in this clone"
        ok = _git("merge-base", "--is-ancestor", rule["rule_commit"], run).returncode == 0
        assert ok, f"{row['claim']}: rule commit {rule['rule_commit']} does not precede its run {run}"
        if row["check"] == "tiny_qwen3_enum":
            assert row["numbers"]["seeds"] == rule["seeds"], row["claim"]


def test_shipped_summaries_state_the_rule_the_code_runs():
    """Each shipped row decided by the general llm rule states that rule in the words
    ``rules.rule_text`` gives now (per-seed for the tiny model, per-prompt for the Stage-1 real-model
    check): a rule edited after its run shows here, not silently in the report."""
    from tiltlab.llm.checks import rules

    rec = record.load_llm_record(ROOT / "paper_checks" / "records" / "llm.json")
    assert rec is not None
    own_rule = {"smollm2_135m_colocate"}  # registered with its own mapping at d67392c (preregistration.toml)
    judged = [r for r in rec["checks"] if r["check"] not in own_rule]
    assert len(judged) == len(rec["checks"]) - 1
    for row in judged:
        unit = "per-prompt" if row["check"] == "smollm2_135m_vllm" else "per-seed"
        assert rules.rule_text(unit) in row["summary"], row["claim"]


def test_every_shipped_llm_row_is_a_registered_check(isolated_registry):
    """Each row of the shipped llm record names a check the registry declares (claim, layer and check
    name): a check renamed or registered under another name would leave its shipped row orphaned, and
    the report would show the claim as never run."""
    rec = record.load_llm_record(ROOT / "paper_checks" / "records" / "llm.json")
    assert rec is not None and rec["checks"]
    keys = {c.key for c in isolated_registry.checks()}
    orphans = [record.row_key(r) for r in rec["checks"] if record.row_key(r) not in keys]
    assert orphans == []
