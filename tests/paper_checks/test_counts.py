"""One count everywhere: the claims and checks of a record (:mod:`tiltlab.claims.counts`) are what
``tiltlab check`` prints, what ``check --list`` lists beforehand, what ``tiltlab reproduce`` prints, what
the report and README's generated results show; each pinned against a count written out by hand. A
claim whose checks did not run (only slow ones, without ``--slow``) is counted, as unchecked, never
dropped from the total."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tiltlab.claims import counts, llm_record, registry
from tiltlab.claims.registry import CheckResult, Outcome, Verdict
from tiltlab.cli import main
from tiltlab.paper_checks import catalog
from tiltlab.paper_checks import report as P

ROOT = Path(__file__).resolve().parents[2]

# --------------------------------------------------------------------------- the definitions


def test_selection_scope_against_the_cases_written_out():
    declared = ["a.x", "a.y", "ab.z", "b.z"]
    assert counts.selection_scope({}, declared) == set(declared)
    assert counts.selection_scope(None, declared) == set(declared)
    assert counts.selection_scope({"reproduce": True, "quick": True}, declared) == set(declared)
    assert counts.selection_scope({"only": "a.", "slow": False}, declared) == {"a.x", "a.y"}
    assert counts.selection_scope({"only": "a"}, declared) == {"a.x", "a.y", "ab.z"}
    assert counts.selection_scope({"only": "a", "layer": "sim"}, declared) == set()
    assert counts.selection_scope({"check": "c"}, declared) == set()


def test_a_merged_record_counts_the_claims_of_every_run():
    declared = ["a.x", "a.y", "b.z"]
    rec = {"selection": {"only": "b"}, "history": [{"selection": {"only": "a"}}, {"selection": {"only": "b"}}]}
    assert counts.record_scope(rec, declared) == {"a.x", "a.y", "b.z"}
    assert counts.record_scope({"selection": {"only": "b"}}, declared) == {"b.z"}
    assert counts.claims_counted({"b.z"}, ["a.x", "b.z"]) == ["a.x", "b.z"]


def _outcome(claim_id: str, verdict: Verdict, name: str = "c") -> Outcome:
    check = registry.Check(claim_id=claim_id, layer="sim", name=name, fn=lambda s: None, expected=verdict)
    return Outcome(check, CheckResult(verdict, "x"), 0.0)


def test_claim_rows_give_the_claims_without_a_row_as_unchecked(isolated_registry):
    outs = [_outcome("a.x", Verdict.VERIFIED), _outcome("a.x", Verdict.REFUTED, "d")]
    rows = counts.record_claim_rows(outs, {"a.x", "a.y"})
    assert rows == [
        {"claim": "a.x", "verdict": "refuted", "decided_by": ["sim"], "checks": ["c", "d"]},
        {"claim": "a.y", "verdict": "unchecked", "decided_by": [], "checks": []},
    ]


# --------------------------------------------------------------------------- every command, one fake registry

PREFIX = "zz_cnt"


def _declare(reg):
    """Three claims under ``zz_cnt``: one with a fast check, one whose only check is slow, one without any."""
    for cid in ("fast", "slow", "none"):
        reg.declare_claim(f"{PREFIX}.{cid}", "DISA", "Sec. 0", f"the {cid} claim", kind="empirical")
    reg.register_check(f"{PREFIX}.fast", layer="sim", expected=Verdict.VERIFIED, name="quick_one")(
        lambda s: CheckResult(Verdict.VERIFIED, "holds", {"x": 1.0})
    )
    reg.register_check(f"{PREFIX}.slow", layer="sim", expected=Verdict.REFUTED, name="slow_one", slow=True)(
        lambda s: CheckResult(Verdict.REFUTED, "fails", {"x": 2.0})
    )


def _summary(printed: str) -> tuple[int, int]:
    """The counts of the last counts line printed."""
    found = re.findall(r"(\d+) checks \(.*?\) of (\d+) claims", printed)
    assert found, printed
    return int(found[-1][0]), int(found[-1][1])


def _list_summary(printed: str) -> tuple[int, int]:
    m = re.search(r"^(\d+) checks of (\d+) claims: ", printed, re.MULTILINE)
    assert m, printed
    return int(m.group(1)), int(m.group(2))


@pytest.mark.parametrize(("slow", "n_checks", "unchecked"), [([], 1, 2), (["--slow"], 2, 1)], ids=["fast", "slow"])
def test_check_list_check_record_readme_and_report_agree(
    isolated_registry, tmp_path, capsys, slow, n_checks, unchecked
):
    _declare(isolated_registry)
    naive_claims = sum(cid.startswith(PREFIX) for cid in isolated_registry.claims())
    assert naive_claims == 3
    base = ["check", "--only", PREFIX, *slow, "--jobs", "1"]

    assert main([*base, "--list"]) == 0
    listed = capsys.readouterr().out
    assert _list_summary(listed) == (n_checks, naive_claims)
    assert {ln.split()[0] for ln in listed.splitlines()[1:-1]} == {f"{PREFIX}.{c}" for c in ("fast", "slow", "none")}

    out = tmp_path / "claims.json"
    assert main([*base, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert _summary(printed) == (n_checks, naive_claims)
    assert f"unchecked {unchecked}" in printed
    if not slow:
        (row,) = [ln for ln in printed.splitlines() if ln.startswith(f"{PREFIX}.slow ")]
        assert "not run: its checks are slow; add --slow" in row
    rec = json.loads(out.read_text())
    assert len(rec["checks"]) == n_checks and len(rec["claims"]) == naive_claims
    assert sum(r["verdict"] == "unchecked" for r in rec["claims"]) == unchecked
    n = counts.record_counts(rec)
    assert (n.n_checks, n.n_claims, n.claims["unchecked"]) == (n_checks, naive_claims, unchecked)
    assert n.not_run == (() if slow else (f"{PREFIX}.slow",))

    section = P.results_section(rec, None)
    assert f"{n_checks} checks of {naive_claims} claims" in section
    (all_row,) = [ln for ln in section.splitlines() if ln.startswith("| **all** |")]
    assert int(all_row.rstrip(" |").rsplit("|", 1)[1]) == naive_claims
    assert ("`zz_cnt.slow`" in section) is (not slow)
    assert "From the record of `tiltlab check --only zz_cnt" in section

    report_rows = P.claim_rows(P.report_input_from_record(rec, tmp_path))
    assert len(report_rows) == naive_claims
    assert sum(r["status"] == "unchecked" for r in report_rows) == unchecked


def test_a_partial_run_merged_into_a_full_one_keeps_counting_every_claim(isolated_registry, tmp_path, capsys):
    """A record made by a run of a prefix, then merged with a run of another: it counts the claims of both."""
    _declare(isolated_registry)
    isolated_registry.declare_claim("zz_cnu.other", "DISA", "Sec. 1", "another claim", kind="empirical")
    out = tmp_path / "claims.json"
    assert main(["check", "--only", PREFIX, "--jobs", "1", "--out", str(out)]) == 0
    assert main(["check", "--only", "zz_cnu", "--jobs", "1", "--out", str(out)]) == 0  # nothing to run there
    printed = capsys.readouterr().out
    assert _summary(printed) == (1, 4)
    assert len(json.loads(out.read_text())["claims"]) == 4


def _report_totals(md: str) -> tuple[int, int]:
    """``(checks, claims)`` of REPORT.md: the layer table's totals and the paper table's ``all`` row."""
    claims = [ln for ln in md.splitlines() if ln.startswith("| **all** |")]
    layer_rows = [ln for ln in md.split("Checks by layer:", 1)[1].split("\n\n", 2)[1].splitlines()[2:]]
    checks = sum(int(ln.rstrip(" |").rsplit("|", 1)[1]) for ln in layer_rows)
    return checks, int(claims[0].rstrip(" |").rsplit("|", 1)[1])


def test_reproduce_prints_what_its_record_and_report_count(isolated_registry, tmp_path, monkeypatch, capsys):
    from tiltlab.paper_checks import cli as pcli

    _declare(isolated_registry)
    monkeypatch.setattr(
        pcli.runner,
        "_select",
        lambda *a, **k: [c for c in isolated_registry.checks() if c.claim_id.startswith(PREFIX) and not c.slow],
    )
    monkeypatch.setattr(pcli.reproduce, "make_figures", lambda out_dir, quick, seed, progress=True: ([], {}))
    out = tmp_path / "out"
    assert main(["reproduce", "--quick", "--jobs", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    declared = len(isolated_registry.claims())  # a reproduce run speaks for every declared claim
    assert _summary(printed) == (1, declared)
    rec = json.loads((out / "claims.json").read_text())
    assert len(rec["claims"]) == declared
    assert _report_totals((out / "REPORT.md").read_text()) == (1, declared)


# --------------------------------------------------------------------------- the real registry


def test_check_and_check_list_agree_on_the_real_registry(monkeypatch, tmp_path, capsys):
    """``tiltlab check`` (its checks stubbed: each returns its expected verdict) and ``--list`` count the same
    checks and claims as a count written out by hand: every declared claim; every fast theory, sim and data
    check plus every row of the shipped llm record."""
    from tiltlab.paper_checks.cli import runner

    catalog.discover()
    if catalog.SKIPPED_MODULES:
        pytest.fail(f"check modules skipped: {catalog.SKIPPED_MODULES}")
    monkeypatch.setattr(llm_record, "LLM_RECORD", ROOT / "paper_checks" / "records" / "llm.json")
    shipped = json.loads(llm_record.LLM_RECORD.read_text())["checks"]
    fast = [c for c in registry.checks() if not (c.slow or c.long) and c.layer not in registry.OPT_IN_LAYERS]
    naive = (len(fast) + len(shipped), len(registry.claims()))

    assert main(["check", "--list"]) == 0
    assert _list_summary(capsys.readouterr().out) == naive

    def stub(chks, seed, progress=True, jobs=1):
        return [Outcome(c, CheckResult(c.expected, "stub"), 0.0) for c in chks]

    monkeypatch.setattr(runner, "_run", stub)
    out = tmp_path / "claims.json"
    main(["check", "--out", str(out)])
    assert _summary(capsys.readouterr().out) == naive
    rec = json.loads(out.read_text())
    assert (len(rec["checks"]), len(rec["claims"])) == naive


def test_readme_results_add_up():
    """README's generated results: the checks and claims its first line states are the sums of its two
    lists and of the table's ``all`` row, and it names the command whose record it came from."""
    body = P.section_text((ROOT / "README.md").read_text(encoding="utf-8"), "results")
    m = re.search(r"From the record of `(tiltlab [a-z]+)[^`]*`.*?: (\d+) checks of (\d+) claims", body)
    assert m, body
    command, n_checks, n_claims = m.group(1), int(m.group(2)), int(m.group(3))
    assert command in ("tiltlab check", "tiltlab reproduce")
    per_claim = re.search(r"\*\*per claim\*\*.*?\): (.*);", body).group(1)
    per_check = re.search(r"\*\*per check\*\*: (.*)\.", body).group(1)
    assert sum(int(x.split()[0]) for x in per_claim.split(", ")) == n_claims
    assert sum(int(x.split()[0]) for x in per_check.split(", ")) == n_checks
    (all_row,) = [ln for ln in body.splitlines() if ln.startswith("| **all** |")]
    assert int(all_row.rstrip(" |").rsplit("|", 1)[1]) == n_claims == len(registry.claims())
    prose = (ROOT / "README.md").read_text(encoding="utf-8").split(P.DOCS_BEGIN.format(name="results"))[0]
    assert "from a `tiltlab reproduce` record" not in prose  # the section itself names its command
