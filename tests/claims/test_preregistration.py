"""Pre-registration proven by git and file hashes (``tiltlab/claims/prereg.py``).

A row is strictly pre-registered when its check's entry in preregistration.toml (the sha256 of the
files that define its rule) was last changed at a commit that is a strict ancestor of the row's run
commit, and the hashes ``tiltlab check`` stamped at run time equal the registered ones. The git tests
build a real repository (init, register, commit, run): no mocks. Under CI a missing git fails.
"""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

from tests.paper_checks.test_records import LLM_CID, _check, _only_fake, _setup_llm
from tiltlab.claims import llm_record, prereg, registry
from tiltlab.claims import rows as record_rows
from tiltlab.cli import main
from tiltlab.paper_checks import catalog

from .conftest import git, need_git

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "paper_checks" / "records" / "llm.json"
SHA0 = "0" * 64


def _entry(name="x", extra="", files=f'"a.py" = "{SHA0}"\n'):
    return f'[[rule]]\ncheck = "{name}"\nseeds = 2\n{extra}[rule.files]\n{files}'


# --------------------------------------------------------------------------- the file itself


def test_every_llm_check_is_pre_registered_with_its_rule_files():
    catalog.discover()
    reg = prereg.preregistration()
    names = {c.name for c in registry.checks() if c.layer == "llm"}
    assert names <= set(reg), f"llm checks without a pre-registered rule: {sorted(names - set(reg))}"
    for name, entry in reg.items():
        assert entry["history"], name
        for path in entry["files"]:
            assert (ROOT / path).is_file(), f"{name}: registered rule file {path} does not exist"
    # the shared decision rule is part of every rule; each check's claim statements are registered
    assert all("tiltlab/claims/stats.py" in e["files"] for e in reg.values())
    tiny = reg["tiny_qwen3_enum"]["files"]
    assert {"llm/checks/enumerable.py", "llm/checks/paced.py", "llm/checks/rules.py"} <= set(tiny)
    assert "llm/checks/stage1_real.py" in reg["smollm2_135m_vllm"]["files"]


def test_the_registration_is_current_with_the_checkouts_rule_files():
    """Every registered hash is the sha256 of that file in this checkout: a rule file edited without a
    refreshed registration (``tiltlab report --preregister`` and a history note) fails here, before a run
    made at the new commit is refused as 'edited after registration'."""
    reg = prereg.preregistration()
    now = prereg.current_hashes(reg, ROOT)
    stale = [
        f"{name}: {path}"
        for name, entry in reg.items()
        for path, sha in entry["files"].items()
        if now[name][path] != sha
    ]
    assert not stale, (
        "rule files edited since their registration (refresh it: tiltlab report --preregister, with a history note): "
        + ", ".join(stale)
    )


def test_shared_runs_name_registered_llm_claims():
    catalog.discover()
    llm_claims = {c.claim_id for c in registry.checks() if c.layer == "llm"}
    runs = prereg.shared_runs()
    assert runs
    for run, claims in runs:
        assert set(claims) <= llm_claims, (run, sorted(set(claims) - llm_claims))


def test_a_malformed_entry_is_refused(tmp_path):
    bad = tmp_path / "p.toml"
    cases = [
        (_entry(extra='rule_commit = "abcdef0"\n'), "declares rule_commit"),
        ('[[rule]]\ncheck = "x"\nseeds = 0\n[rule.files]\n"a.py" = "' + SHA0 + '"\n', "seeds"),
        ('[[rule]]\ncheck = "x"\nseeds = 2\n', r"needs a \[rule.files\]"),
        (_entry(files='"a.py" = "abc"\n'), "a.py needs a sha256"),
        (_entry() + _entry(), "twice"),
        ('[[legacy]]\ncheck = "x"\nrun_commit = "abc"\nrule_commit = "abcdef0"\nreason = "r"\n', "legacy"),
        ('[[legacy]]\ncheck = "x"\nrun_commit = "abcdef0"\nrule_commit = "abcdef0"\n', "reason"),
    ]
    for text, msg in cases:
        bad.write_text(text, encoding="utf-8")
        with pytest.raises(ValueError, match=msg):
            prereg.preregistration(bad)
            prereg.legacy_runs(bad)
    bad.write_text('[[shared_run]]\nrun = "r"\nclaims = ["a"]\n', encoding="utf-8")
    with pytest.raises(ValueError, match="two claims"):
        prereg.shared_runs(bad)
    assert prereg.preregistration(tmp_path / "none.toml") == {} and prereg.legacy_runs(tmp_path / "n") == []


# --------------------------------------------------------------------------- in a real git repository


def _row(repo, check="tiny", commit=None, hashes=None):
    """A check row as `tiltlab check` stamps it: run commit (describe and full hash), rule hashes now."""
    sha = commit or git(repo.root, "rev-parse", "HEAD")
    if hashes is None:
        hashes = prereg.current_hashes([check], repo.root).get(check)
    row = {"claim": "zz.c", "layer": "llm", "check": check, "commit": sha[:12], "commit_sha": sha}
    return {**row, "rule_hashes": hashes} if hashes is not None else row


def test_registered_then_run_passes_and_hashes_are_compared(prereg_repo):
    repo = prereg_repo
    row = _row(repo)
    assert prereg.verify_row(row, repo.root) == repo.reg  # found with git, not declared
    assert prereg.registration_commit("tiny", repo.run, repo.root)[0] == repo.reg
    reg = prereg.preregistration(repo.root / prereg.PREREG_PATH)["tiny"]["files"]
    assert row["rule_hashes"] == reg  # the run-time hashes equal the registered ones, path for path
    assert reg["rules/tiny.py"] == prereg.file_sha256(repo.root / "rules/tiny.py")
    # describe output (no full hash) resolves too; an abbreviation of the run commit is enough
    assert prereg.verify_row({**row, "commit_sha": None}, repo.root) == repo.reg
    # a commit and a full hash of two different commits are refused (either could be the run's)
    with pytest.raises(
        ValueError, match=rf"its commit {repo.reg[:12]} and its full hash {repo.run[:12]} are different"
    ):
        prereg.verify_row({**row, "commit": repo.reg[:12]}, repo.root)
    # a tampered, missing or extra hash in the row is refused, naming the file
    who = "check tiny (zz.c)"
    for hashes, msg in (
        ({**row["rule_hashes"], "claims.toml": SHA0}, "claims.toml: the row's run-time sha256 000000000000 is not"),
        ({"rules/tiny.py": row["rule_hashes"]["rules/tiny.py"]}, "claims.toml is registered at"),
        ({**row["rule_hashes"], "other.py": SHA0}, "other.py was hashed at run time but is not registered"),
    ):
        with pytest.raises(ValueError, match=f"^{re.escape(who)}: {msg}"):
            prereg.verify_row({**row, "rule_hashes": hashes}, repo.root)
    with pytest.raises(ValueError, match="carries no run-time rule hashes"):
        prereg.verify_row({k: v for k, v in row.items() if k != "rule_hashes"}, repo.root)


def test_a_run_at_the_registration_commit_is_refused(prereg_repo):
    repo = prereg_repo
    row = _row(repo, commit=repo.reg)  # the same files, hashed at the registration commit itself
    with pytest.raises(ValueError) as exc:
        prereg.verify_row(row, repo.root)
    msg = str(exc.value)
    print(msg)
    assert msg == (
        f"check tiny (zz.c): registered in its run commit {repo.reg[:12]}, not strictly before it; "
        "commit the registration, then run"
    )
    # registering and running in one commit: the entry changes in the run commit itself
    repo.write("rules/tiny.py", "MARGIN = 0.05\n")
    repo.register("tiny")
    same = repo.commit("register and run together")
    with pytest.raises(ValueError, match=f"registered in its run commit {same[:12]}, not strictly"):
        prereg.verify_row(_row(repo), repo.root)
    # the history prose is not the rule: rewording it later does not move the registration
    path = repo.root / prereg.PREREG_PATH
    path.write_text(path.read_text().replace('history = "test"', 'history = "reworded"'), encoding="utf-8")
    repo.commit("reword the history")
    repo.commit("then run")
    assert prereg.verify_row(_row(repo), repo.root) == same


def test_a_rule_file_edited_after_registration_is_refused(prereg_repo):
    repo = prereg_repo
    old = prereg.file_sha256(repo.root / "rules/tiny.py")
    repo.write("rules/tiny.py", "MARGIN = 0.01  # loosened after registration\n")
    edited = repo.commit("edit the rule after registering it")
    new = prereg.file_sha256(repo.root / "rules/tiny.py")
    row = _row(repo)
    assert row["rule_hashes"]["rules/tiny.py"] == new != old
    with pytest.raises(ValueError) as exc:
        prereg.verify_row(row, repo.root)
    msg = str(exc.value)
    print(msg)
    assert msg == (
        f"check tiny (zz.c): rules/tiny.py changed after its registration at {repo.reg[:12]} "
        f"(sha256 {new[:12]} at run time, {old[:12]} registered)"
    )
    assert edited != repo.reg


def test_a_forged_row_carrying_the_registered_hashes_is_refused(prereg_repo):
    """The rule file is edited and committed after registration, then run; the results file's row
    carries the *registered* hashes copied in (what a forger writes) instead of the ones the run
    computed. The hashes are recomputed from ``git show <run>:<path>``, so the row is refused, naming
    the file, although the row agrees with the registration."""
    repo = prereg_repo
    registered = prereg.preregistration(repo.root / prereg.PREREG_PATH)["tiny"]["files"]
    repo.write("rules/tiny.py", "MARGIN = 0.5  # loosened after registration\n")
    run = repo.commit("loosen the margin, then run")
    forged = _row(repo, hashes=dict(registered))
    assert forged["rule_hashes"] == registered  # the row agrees with the registration ...
    with pytest.raises(ValueError) as exc:
        prereg.verify_row(forged, repo.root)
    msg = str(exc.value)
    print(msg)
    at_run = prereg.git_sha256(run, "rules/tiny.py", repo.root)
    assert at_run == prereg.file_sha256(repo.root / "rules/tiny.py") != registered["rules/tiny.py"]
    assert (
        msg
        == (  # ... but not with git
            f"check tiny (zz.c): rules/tiny.py: the row's run-time sha256 {registered['rules/tiny.py'][:12]} is not "
            f"the file's at its run commit {run[:12]} ({at_run[:12]}, git show): the row's hashes do not come from its commit"
        )
    )
    # the honest row of the same run (its own hashes) is refused as edited after registration
    with pytest.raises(ValueError, match="rules/tiny.py changed after its registration"):
        prereg.verify_row(_row(repo), repo.root)


def test_a_registration_must_hash_the_files_of_its_own_commit(prereg_repo):
    """A registration whose hash is not that of the file in the registration commit (the hash of
    content committed only later) is refused: the registration is judged from its commit too."""
    repo = prereg_repo
    repo.write("rules/tiny.py", "MARGIN = 0.3\n")
    repo.register("tiny")  # the hash of the new content ...
    path = repo.root / prereg.PREREG_PATH
    new_reg = path.read_text(encoding="utf-8")
    repo.write("rules/tiny.py", "MARGIN = 0.02\n")  # ... committed beside the old content
    reg = repo.commit("register a hash of uncommitted content")
    repo.write("rules/tiny.py", "MARGIN = 0.3\n")
    repo.commit("the content arrives after the registration, then run")
    assert path.read_text(encoding="utf-8") == new_reg
    with pytest.raises(ValueError) as exc:
        prereg.verify_row(_row(repo), repo.root)
    print(exc.value)
    assert str(exc.value).startswith("check tiny (zz.c): rules/tiny.py: registered sha256 ") and (
        f"at {reg[:12]} is not the file's at that commit" in str(exc.value)
    )


def test_a_rule_changed_and_changed_back_registers_at_the_change_back(prereg_repo):
    """The registration commit is the start of the newest run of commits with an unchanged entry,
    never an older commit with an equal entry: a rule changed and changed back in the run commit itself
    is registered in the run commit, and refused."""
    repo = prereg_repo
    path = repo.root / prereg.PREREG_PATH
    original = path.read_text(encoding="utf-8")
    repo.write("rules/tiny.py", "MARGIN = 0.9\n")
    repo.register("tiny")
    changed = repo.commit("change the rule")
    assert prereg.registration_commit("tiny", changed, repo.root)[0] == changed
    repo.write("rules/tiny.py", "MARGIN = 0.02\n")
    path.write_text(original, encoding="utf-8")
    back = repo.commit("change it back and run in the same commit")
    reg, entry = prereg.registration_commit("tiny", back, repo.root)
    assert reg == back != repo.reg  # the oldest equal entry (repo.reg) is not the registration
    assert entry == prereg.registration_commit("tiny", repo.run, repo.root)[1]
    with pytest.raises(ValueError, match=f"registered in its run commit {back[:12]}, not strictly before it"):
        prereg.verify_row(_row(repo), repo.root)
    later = repo.commit("a later run")
    assert prereg.verify_row(_row(repo), repo.root) == back != later


def test_a_missing_registration_is_refused(prereg_repo):
    repo = prereg_repo
    row = _row(repo, check="unregistered", hashes={"rules/tiny.py": SHA0})
    with pytest.raises(ValueError) as exc:
        prereg.verify_row(row, repo.root)
    assert str(exc.value) == (
        f"check unregistered (zz.c): no [[rule]] registration in {prereg.PREREG_PATH} at its run commit {repo.run[:12]}"
    )
    # a registration made after the run does not count: it is read at the run commit
    path = repo.root / prereg.PREREG_PATH
    path.write_text(path.read_text() + _entry("unregistered", files=f'"rules/tiny.py" = "{SHA0}"\n'), encoding="utf-8")
    repo.commit("register it after the run")
    with pytest.raises(ValueError, match="no \\[\\[rule\\]\\] registration"):
        prereg.verify_row(row, repo.root)


def test_a_dirty_or_unknown_commit_is_refused(prereg_repo):
    repo = prereg_repo
    for commit, msg in (
        (None, "the run's commit is unknown"),
        (f"{repo.run[:12]}-dirty", "ran on a modified checkout"),
        ("0123456789ab", "is not in this clone"),
    ):
        with pytest.raises(ValueError, match=msg):
            prereg.verify_row({**_row(repo), "commit": commit, "commit_sha": None}, repo.root)


# --------------------------------------------------------------------------- tiltlab check / --ship-llm


def test_check_stamps_the_full_commit_and_the_rule_hashes_and_ship_verifies_them(
    isolated_registry, prereg_repo, tmp_path, monkeypatch, capsys
):
    repo = prereg_repo
    _setup_llm(isolated_registry)
    _only_fake(monkeypatch, isolated_registry)
    run = tmp_path / "llm_run.json"
    assert _check("--layer", "llm", "--slow", "--out", str(run)) == 0
    rec = json.loads(run.read_text())
    (row,) = rec["checks"]
    assert rec["commit_sha"] == row["commit_sha"] == repo.run and row["commit"] == repo.run[:12]
    assert row["rule_hashes"] == prereg.current_hashes(["tiny"], repo.root)["tiny"]
    dest = tmp_path / "shipped.json"
    shipped = llm_record.ship_llm_record(run, dest, machine_desc="m")
    assert shipped["checks"][0]["rule_commit"] == repo.reg
    # the rule file edited (and committed) after registration, then run: refused, one line, nothing written
    repo.write("rules/tiny.py", "MARGIN = 0.5\n")
    repo.commit("loosen the margin")
    assert _check("--layer", "llm", "--slow", "--replace", "--out", str(run)) == 0
    dest.unlink()
    capsys.readouterr()
    assert main(["report", "--ship-llm", str(run), "--out", str(dest)]) == 2
    err = capsys.readouterr().err.strip()
    print(err)
    assert err.startswith(f"tiltlab report: error: --ship-llm {run}: check tiny ({LLM_CID}): rules/tiny.py changed")
    assert "\n" not in err and not dest.exists()
    # the --commit option is gone: provenance is the run's
    with pytest.raises(SystemExit):
        main(["report", "--ship-llm", str(run), "--commit", "abc1234"])


def test_ship_refuses_legacy_dirty_and_unregistered_runs(isolated_registry, prereg_repo, tmp_path, monkeypatch):
    repo = prereg_repo
    _setup_llm(isolated_registry)
    _only_fake(monkeypatch, isolated_registry)
    run, dest = tmp_path / "llm_run.json", tmp_path / "shipped.json"
    assert _check("--layer", "llm", "--slow", "--out", str(run)) == 0
    rec = json.loads(run.read_text())

    def ship(**row_changes):
        changed = {**rec, "checks": [{**rec["checks"][0], **row_changes}]}
        run.write_text(json.dumps(changed))
        return llm_record.ship_llm_record(run, dest, machine_desc="m")

    with pytest.raises(ValueError, match=r"check tiny \(.*\): ran on a modified checkout"):
        ship(commit=f"{repo.run[:12]}-dirty", commit_sha=None)
    with pytest.raises(ValueError, match="carries no run-time rule hashes"):
        ship(rule_hashes=None)
    # a run listed as legacy is never shipped, even when it would verify
    path = repo.root / prereg.PREREG_PATH
    legacy = f'\n[[legacy]]\ncheck = "tiny"\nrun_commit = "{repo.run[:12]}"\nrule_commit = "{repo.reg[:7]}"\n'
    path.write_text(path.read_text() + legacy + 'reason = "test"\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"listed as a \[\[legacy\]\] registration"):
        ship()
    assert not dest.exists()
    # a check with no registration: its rows carry no hashes and are refused
    isolated_registry.register_check(LLM_CID, layer="llm", name="unregistered", slow=True)(
        lambda s: registry.CheckResult(registry.Verdict.VERIFIED, "x")
    )
    _only_fake(monkeypatch, isolated_registry)
    path.write_text(path.read_text().split("\n[[legacy]]")[0], encoding="utf-8")  # a clean checkout again
    assert _check("--layer", "llm", "--slow", "--replace", "--out", str(run)) == 0
    assert "rule_hashes" not in {r["check"]: r for r in json.loads(run.read_text())["checks"]}["unregistered"]
    with pytest.raises(ValueError, match=r"check unregistered \(.*\): no \[\[rule\]\] registration in"):
        llm_record.ship_llm_record(run, dest, machine_desc="m")
    assert not dest.exists()


def _two_runs(reg, repo, tmp_path, monkeypatch):
    """One record of two llm runs at two commits: ``tiny`` at the run commit, then ``tiny2`` at a later
    commit merged into it. ``(record path, tiny's row, the later commit)``."""
    _setup_llm(reg)
    reg.register_check(LLM_CID, layer="llm", name="tiny2", slow=True)(
        lambda s: registry.CheckResult(registry.Verdict.VERIFIED, "x")
    )
    _only_fake(monkeypatch, reg)
    run = tmp_path / "llm_run.json"
    assert _check("--layer", "llm", "--check", "tiny", "--slow", "--out", str(run)) == 0
    first = json.loads(run.read_text())["checks"][0]
    later = repo.commit("a later run commit")
    assert _check("--layer", "llm", "--check", "tiny2", "--slow", "--out", str(run)) == 0  # merged into run
    return run, first, later


def test_ship_keeps_each_rows_own_provenance(isolated_registry, prereg_repo, tmp_path, monkeypatch):
    """Rows from different runs keep their own commit and time; the record's stamp fills only what a
    row does not say."""
    repo = prereg_repo
    run, first, later = _two_runs(isolated_registry, repo, tmp_path, monkeypatch)
    shipped = llm_record.ship_llm_record(run, tmp_path / "s.json", machine_desc="m")
    rows = {r["check"]: r for r in shipped["checks"]}
    assert (rows["tiny"]["commit_sha"], rows["tiny"]["run_at"]) == (repo.run, first["run_at"])
    assert rows["tiny2"]["commit_sha"] == later and shipped["commit_sha"] == later
    assert rows["tiny"]["rule_commit"] == rows["tiny2"]["rule_commit"] == repo.reg


def test_preregister_rewrites_only_the_hashes(prereg_repo, monkeypatch, capsys):
    repo = prereg_repo
    path = repo.root / prereg.PREREG_PATH
    before = path.read_text()
    repo.write("rules/tiny.py", "MARGIN = 0.03\n")
    monkeypatch.setattr(prereg, "PREREG_FILE", path)
    assert main(["report", "--preregister", "tiny2"]) == 0
    assert "tiny2: 1 file(s) changed" in capsys.readouterr().out
    after = path.read_text()
    new = prereg.file_sha256(repo.root / "rules/tiny.py")
    entries = prereg.preregistration(path)
    assert entries["tiny2"]["files"]["rules/tiny.py"] == new != entries["tiny"]["files"]["rules/tiny.py"]
    assert [a for a, b in zip(after.splitlines(), before.splitlines(), strict=True) if a != b] == [
        f'"rules/tiny.py" = "{new}"'
    ]  # one line changed; comments, history and order kept
    assert (
        main(["report", "--preregister"]) == 0 and prereg.preregistration(path)["tiny"]["files"]["rules/tiny.py"] == new
    )
    assert main(["report", "--preregister", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err.endswith(
            f"--preregister: check nope has no [[rule]] in {prereg.PREREG_PATH}; add one (check, seeds, "
            "history, [rule.files] paths) first"
        )
        and "\n" not in err
    )
    assert not list(path.parent.glob(".*.tmp*"))  # written atomically, no temporary left


# --------------------------------------------------------------------------- the shipped record


def _in_git_checkout() -> bool:
    need_git()
    ok = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--git-dir"], capture_output=True).returncode == 0
    if not ok:
        import os

        if os.environ.get("CI"):
            pytest.fail("CI runs on a git clone: the repository history is needed here")
        pytest.skip("not a git checkout")
    return ok


def test_every_shipped_row_is_strictly_pre_registered_or_legacy():
    """Each row of the shipped llm record is strictly pre-registered with matching hashes (its stamped
    ``rule_commit`` is the one git finds), or is listed as a ``[[legacy]]`` run; and the tiny-model
    rows ran with the registered seed count."""
    _in_git_checkout()
    rec = llm_record.load_llm_record(SHIPPED)
    assert rec is not None
    legacy, reg = prereg.legacy_runs(), prereg.preregistration()
    kinds = []
    for row in rec["checks"]:
        leg = prereg.legacy_for(row, legacy)
        if leg is None:
            assert prereg.verify_row(row, ROOT) == row.get("rule_commit"), record_rows.row_key(row)
            kinds.append("registered")
        else:
            assert leg["reason"].strip() and "rule_hashes" not in row, record_rows.row_key(row)
            kinds.append("legacy")
        if row["check"] == "tiny_qwen3_enum":
            assert row["numbers"]["seeds"] == reg[row["check"]]["seeds"], row["claim"]
    print({k: kinds.count(k) for k in set(kinds)})
    # every legacy entry names a shipped run (no stale marks)
    assert all(any(prereg.legacy_for(r, [leg]) for r in rec["checks"]) for leg in legacy)


def test_the_report_shows_legacy_beside_its_rows(monkeypatch):
    from tiltlab.paper_checks.report import llm_run_section

    # the llm record shipped before the neutral rule's re-run, with that day's [[legacy]] entries
    legacy_rec = Path(__file__).with_name("data") / "llm_legacy.json"
    monkeypatch.setattr(prereg, "PREREG_FILE", Path(__file__).with_name("data") / "preregistration_legacy.toml")
    rec = llm_record.load_llm_record(legacy_rec)
    assert rec is not None
    text = llm_run_section(rec)
    assert "| **legacy** 3dfabd9 -> 3dfabd9 |" in text
    assert "Legacy registrations" in text and "rule commit equals run commit" in text
    # REPORT.md / report.html: the provenance note of a recorded legacy row says so
    from tiltlab.paper_checks.report import ReportInput, _provenance_note

    catalog.discover()
    outs = record_rows.outcomes_from_rows(llm_record.recorded_llm_rows(path=legacy_rec)[0])
    notes = [_provenance_note(o, ReportInput(claims=registry.claims(), outcomes=outs, figures=[])) for o in outs]
    legacy_notes = [n for n in notes if "legacy pre-registration (not strictly pre-registered" in n]
    assert legacy_notes and len(legacy_notes) == sum(o.legacy for o in outs)


def test_docs_show_the_llm_run_section_as_generated_now():
    from tiltlab.paper_checks.report import llm_run_section

    text = llm_run_section(llm_record.load_llm_record(SHIPPED))
    doc = (ROOT / "docs" / "llm-checks.md").read_text(encoding="utf-8")
    assert text.strip() in doc  # docs/llm-checks.md shows the section as generated now


def test_shipped_summaries_state_the_rule_the_code_runs():
    """Each shipped row decided by the general llm rule states that rule in the words
    ``rules.rule_text`` gives now (per-seed for the tiny model, per-prompt for the Stage-1 real-model
    check, per-training-run for the real-model comparison): a rule edited after its run shows here, not silently in the report."""
    from tiltlab.llm.checks import rules

    rec = llm_record.load_llm_record(SHIPPED)
    assert rec is not None
    own_rule = {"smollm2_135m_colocate"}  # its own mapping (withdrawn 2026-11-28); only its legacy row can carry it
    judged = [r for r in rec["checks"] if r["check"] not in own_rule]
    legacy = {(e["check"], e["run_commit"][:7]) for e in prereg.legacy_runs()}
    for row in judged:
        if (row["check"], str(row["commit"])[:7]) in legacy:
            # run under the rule of its day (asymmetric; see preregistration.toml [[legacy]]): it must
            # state that rule, not the one the code runs now
            assert "rule: per-" in row["summary"] and rules.rule_text("per-seed") not in row["summary"], row["claim"]
            continue
        unit = {"smollm2_135m_vllm": "per-prompt", "smollm2_135m_comparison": "per-training-run"}.get(
            row["check"], "per-seed"
        )
        assert rules.rule_text(unit) in row["summary"], row["claim"]


def test_every_shipped_llm_row_is_a_registered_check(isolated_registry):
    """Each row of the shipped llm record names a check the registry declares (claim, layer and check
    name): a check renamed or registered under another name would leave its shipped row orphaned, and
    the report would show the claim as never run."""
    rec = llm_record.load_llm_record(SHIPPED)
    assert rec is not None and rec["checks"]
    keys = {c.key for c in isolated_registry.checks()}
    orphans = [record_rows.row_key(r) for r in rec["checks"] if record_rows.row_key(r) not in keys]
    assert orphans == []


def _clean_clone(tmp_path: Path) -> Path:
    """A clean git checkout holding this checkout's registration file (what set_llm_expectations reads)."""
    need_git()
    root = tmp_path / "clone"
    (root / "paper_checks").mkdir(parents=True)
    (root / prereg.PREREG_PATH).write_bytes((ROOT / prereg.PREREG_PATH).read_bytes())
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "registration")
    return root


def test_set_llm_expectations_follows_the_registry_and_leaves_the_run_alone(tmp_path):
    """`tiltlab report --set-llm-expectations`: rows get today's expected verdicts and items, ok flags and
    the registry hash; the run's verdicts, items, numbers and evidence are untouched; the expectations a
    row had go to its history; a row judged under re-specified items keeps its own; a dirty checkout is
    refused (the record must name the commit the expectations were set at)."""
    import copy

    root = _clean_clone(tmp_path)
    rec = llm_record.load_llm_record(SHIPPED)
    assert rec is not None
    tampered = copy.deepcopy(rec)
    row = tampered["checks"][0]
    row["expected"], row["expected_items"], row["ok"] = "refuted", {}, False
    tampered["registry_hash"] = "0" * 16
    other = tampered["checks"][1]
    other["verdict"] = "refuted" if other["verdict"] != "refuted" else "verified"  # a row that misses today's
    path = tmp_path / "llm.json"
    record_rows.write_json(path, tampered)
    out = llm_record.set_llm_expectations(path, root)
    assert out["registry_hash"] == llm_record.llm_registry_hash()
    head = git(root, "rev-parse", "HEAD")
    assert out["expectations_set_at"] == head[:12]
    assert out["checks"][0]["expectations_history"] == [
        {"until": head[:12], "expected": "refuted", "expected_items": {}}
    ]
    assert "expectations_history" not in out["checks"][2]  # unchanged expectations leave no entry
    respec = [r for r in out["checks"] if r.get("respecified")]
    assert sorted(r["claim"] for r in respec) == ["disa.table1.math_qwen2.5_7b", "disa.table1.math_qwen3_4b"]
    for r in respec:  # judged under the earlier items: its expectations and ok are the ones it was judged with
        before = next(b for b in tampered["checks"] if b["claim"] == r["claim"])
        assert (r["expected"], r["expected_items"], r["ok"]) == (before["expected"], before["expected_items"], True)
        assert r["respecified"]["before"] == "d866a9000bcf"
    catalog.discover()
    chk = {c.key: c for c in registry.checks()}[record_rows.row_key(row)]
    got = out["checks"][0]
    assert got["expected"] == chk.expected.value and got["expected_items"] == dict(chk.expected_items)
    assert got["ok"] is True and out["checks"][1]["ok"] is False and out["summary"]["failures"] == 1
    for a, b in zip(out["checks"], tampered["checks"]):
        assert {k: a[k] for k in ("verdict", "items", "numbers", "evidence")} == {
            k: b[k] for k in ("verdict", "items", "numbers", "evidence")
        }
    assert llm_record.load_llm_record(path) == out  # written
    tampered["checks"].append({**row, "claim": "no.such.claim"})
    record_rows.write_json(path, tampered)
    with pytest.raises(ValueError, match="not registered"):
        llm_record.set_llm_expectations(path, root)
    (root / "notes.txt").write_text("an uncommitted change\n", encoding="utf-8")
    git(root, "add", "notes.txt")
    with pytest.raises(ValueError, match=r"the checkout is [0-9a-f]{12}-dirty; commit the expectations first"):
        llm_record.set_llm_expectations(path, root)


def test_one_seed_is_a_registration_and_an_empty_file_table_is_not(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text(_entry().replace("seeds = 2", "seeds = 1"), encoding="utf-8")
    assert prereg.preregistration(path)["x"]["seeds"] == 1
    path.write_text('[[rule]]\ncheck = "x"\nseeds = 2\n[rule.files]\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"needs a \[rule.files\] table"):
        prereg.preregistration(path)


def test_set_llm_expectations_compares_items_as_well_as_verdicts_and_a_missing_item_is_a_change(tmp_path):
    """A row is ok only when its verdict *and* every expected item are today's expectations: the right
    verdict with one item flipped is not ok, nor is the right verdict with an expected item missing from
    what the result reports (a missing item is a change, never a match)."""
    import copy

    root = _clean_clone(tmp_path)
    catalog.discover()
    rec = llm_record.load_llm_record(SHIPPED)
    assert rec is not None
    respecs = prereg.respecifications(root / prereg.PREREG_PATH)
    idx = [i for i, r in enumerate(rec["checks"]) if r["ok"] and record_rows.respecification_of(r, respecs) is None]
    assert len(idx) >= 3, "the shipped record needs three ok, not re-specified rows for this test"
    flipped, missing, same = idx[:3]
    tampered = copy.deepcopy(rec)
    name = next(iter(tampered["checks"][flipped]["expected_items"]))
    tampered["checks"][flipped]["items"][name] = not tampered["checks"][flipped]["items"][name]
    gone = next(iter(tampered["checks"][missing]["expected_items"]))
    del tampered["checks"][missing]["items"][gone]
    path = tmp_path / "llm.json"
    record_rows.write_json(path, tampered)
    out = llm_record.set_llm_expectations(path, root)
    assert [out["checks"][i]["verdict"] for i in (flipped, missing)] == [
        rec["checks"][i]["verdict"] for i in (flipped, missing)
    ]  # the verdicts are still today's expected ones ...
    assert out["checks"][flipped]["ok"] is False  # ... but an item is not
    assert out["checks"][missing]["ok"] is False  # ... and a missing item is not a match
    assert out["checks"][same]["ok"] is True
    assert out["summary"]["failures"] == sum(not r["ok"] for r in rec["checks"]) + 2


def test_each_shipped_rows_provenance_is_its_commits_own(prereg_repo):
    """Every provenance field of the shipped record is checked against git: a row's ``commit_sha`` is
    the full hash of its own ``commit`` (never the record's when the two differ), its ``rule_commit`` is a
    commit that is an ancestor of its run commit, and the record's own pair agrees too."""
    need_git()
    rec = llm_record.load_llm_record(SHIPPED)
    assert rec is not None

    def full(commit: str) -> str:
        out = subprocess.run(
            ["git", "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        assert out.returncode == 0, f"{commit} is not a commit of this clone"
        return out.stdout.strip()

    assert full(rec["commit"]) == rec["commit_sha"]
    commits = set()
    for r in rec["checks"]:
        assert full(r["commit"]) == r["commit_sha"], (r["check"], r["claim"])
        reg = full(r["rule_commit"])
        assert reg != r["commit_sha"]
        anc = subprocess.run(["git", "merge-base", "--is-ancestor", reg, r["commit_sha"]], cwd=ROOT)
        assert anc.returncode == 0, (r["check"], r["claim"])
        commits.add(r["commit"])
    assert len(commits) > 1, "the shipped rows come from more than one run commit (a row's own commit is kept)"


def test_ship_never_gives_a_row_with_its_own_commit_the_records_full_hash(
    isolated_registry, prereg_repo, tmp_path, monkeypatch
):
    """A row that names its own commit but no full hash ships with its own commit's full hash resolved
    from git, never with the record's (which belongs to another commit)."""
    repo = prereg_repo
    run, _, later = _two_runs(isolated_registry, repo, tmp_path, monkeypatch)
    rec = json.loads(run.read_text())
    for r in rec["checks"]:
        if r["check"] == "tiny":
            r.pop("commit_sha")  # an older row: its commit, abbreviated, and no full hash
    assert rec["commit_sha"] == later
    run.write_text(json.dumps(rec), encoding="utf-8")
    shipped = llm_record.ship_llm_record(run, tmp_path / "s.json", machine_desc="m")
    rows = {r["check"]: r for r in shipped["checks"]}
    assert rows["tiny"]["commit"] == repo.run[:12]
    assert rows["tiny"]["commit_sha"] == repo.run != later
    assert rows["tiny2"]["commit_sha"] == later
    # the shipped record has the layout of the one in the repository, field for field
    real = llm_record.load_llm_record(SHIPPED)
    assert real is not None
    assert list(shipped) == [k for k in real if k != "expectations_set_at"]  # set later, by its own command
    assert list(shipped["summary"]) == list(real["summary"])
    assert shipped["summary"]["checks"] == shipped["summary"]["run"] == len(shipped["checks"]) == 2
    assert [c["claim"] for c in shipped["claims"]] == [LLM_CID]


def test_a_malformed_registration_is_named_by_its_file():
    with pytest.raises(ValueError, match=r"^preregistration.toml: a \[\[rule\]\] needs check and seeds"):
        prereg.parse_preregistration({"rule": [{"check": "x", "seeds": 0, "files": {}}]})
    with pytest.raises(ValueError, match=r"^other.toml: "):
        prereg.parse_preregistration({"rule": [{"check": "x", "seeds": 0, "files": {}}]}, "other.toml")


def test_preregister_refuses_a_path_line_it_cannot_rewrite_and_rewrites_the_others(tmp_path):
    """A registered path written in a layout the line scan does not rewrite (a TOML literal key) would
    keep its old hash while the command reports success: refused, naming the path; the same entry with
    the documented layout is rewritten to the file's hash."""
    (tmp_path / "a.py").write_text("A = 1\n", encoding="utf-8")
    now = prereg.file_sha256(tmp_path / "a.py")
    text, changed = prereg.preregister_text(_entry(), ["x"], tmp_path)
    assert changed == [("x", "a.py")] and prereg.parse_preregistration(tomllib.loads(text))["x"]["files"] == {
        "a.py": now
    }
    with pytest.raises(ValueError, match=r"--preregister: a.py of check x was not rewritten \(keep one path"):
        prereg.preregister_text(_entry(files=f"'a.py' = \"{SHA0}\"\n"), ["x"], tmp_path)


def test_a_legacy_entry_names_one_check_at_one_run_commit():
    legacy = [{"check": "a", "run_commit": "0123456789ab", "rule_commit": "fedcba987654", "reason": "r"}]
    assert prereg.legacy_for({"check": "a", "commit": "0123456789ab"}, legacy) == legacy[0]
    assert prereg.legacy_for({"check": "a", "commit_sha": "0123456789ab" + "0" * 28}, legacy) == legacy[0]
    assert prereg.legacy_for({"check": "a", "commit": "0123456"}, legacy) == legacy[0]  # abbreviated either way
    assert prereg.legacy_for({"check": "b", "commit": "0123456789ab"}, legacy) is None  # another check
    assert prereg.legacy_for({"check": "a", "commit": "1123456789ab"}, legacy) is None  # another run
    assert prereg.legacy_for({"check": "a"}, legacy) is None  # no commit
