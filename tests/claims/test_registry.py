"""Registry behaviour and the ``tiltlab check`` exit status (on fake registered checks)."""

from __future__ import annotations

import json
import math
import tomllib

import pytest

from tiltlab.claims import registry
from tiltlab.claims.registry import CheckResult, Verdict, claims_dir
from tiltlab.cli import main

KINDS = {"proposition", "empirical", "beyond", "open", "typo"}


def _fake_claim(reg, cid="zz_fake.claim"):
    return reg.declare_claim(cid, "DISA", "Sec. 0", "a fake claim for the tests", kind="empirical")


def test_duplicate_claim_with_different_content_is_an_error(isolated_registry):
    reg = isolated_registry
    _fake_claim(reg)
    _fake_claim(reg)  # identical re-declaration is harmless
    with pytest.raises(ValueError, match="declared twice"):
        reg.declare_claim("zz_fake.claim", "DISA", "Sec. 0", "a different statement")


def test_claim_of_an_unknown_paper_is_rejected(isolated_registry):
    with pytest.raises(ValueError, match=r"unknown paper 'disa_paper.txt'; known papers: DISA, "):
        isolated_registry.declare_claim("zz_fake.claim", "disa_paper.txt", "§0", "a statement")


def test_unknown_paper_in_a_claim_file_names_the_file(isolated_registry, tmp_path):
    (tmp_path / "bad.toml").write_text(
        '[[claim]]\nid = "zz_fake.c"\npaper = "NoSuchPaper"\nsection = "§1"\nstatement = "s"\n', encoding="utf-8"
    )
    with pytest.raises(ValueError, match=r"bad.toml: claim 'zz_fake.c' names unknown paper 'NoSuchPaper'"):
        isolated_registry.load_claims(tmp_path)


def test_paper_index_is_well_formed(isolated_registry):
    """papers.toml: the five papers (and DISA's listing page) with title, authors, source and the
    places the project cites; every paper some claim names, and no paper without a claim."""
    papers = isolated_registry.papers()
    assert list(papers)[:1] == ["DISA"] and {"DISA", "FlowRL", "PACED-RL", "LAD", "FPA"} <= set(papers)
    for p in papers.values():
        assert p.title and p.authors and p.source and p.about, p.short
        assert p.cites and all(ref and what for ref, what in p.cites), p.short
    assert {c.paper for c in isolated_registry.claims().values()} == set(papers)


def test_claim_citation_uses_the_short_name():
    registry.load_claims()
    assert registry.cite(registry.get_claim("disa.prop3i.exact_fixed_point")) == "DISA §2.2, App. C.3, Prop. 3(i)"


def test_check_for_undeclared_claim_fails_validation(isolated_registry):
    reg = isolated_registry
    reg.register_check("zz_fake.undeclared", layer="sim")(lambda seed: CheckResult(Verdict.VERIFIED, "x"))
    with pytest.raises(ValueError, match="zz_fake.undeclared"):
        reg.validate()


def test_unknown_layer_is_rejected(isolated_registry):
    with pytest.raises(ValueError, match="unknown layer"):
        isolated_registry.register_check("zz_fake.claim", layer="gpu")


def test_a_raising_check_is_reported_as_error(isolated_registry):
    reg = isolated_registry
    _fake_claim(reg)

    def boom(seed: int) -> CheckResult:
        raise RuntimeError("kaboom")

    reg.register_check("zz_fake.claim", layer="sim", name="boom")(boom)
    (chk,) = [c for c in reg.checks() if c.claim_id == "zz_fake.claim"]
    out = reg.run_one(chk, seed=3)
    assert out.result is None and out.verdict == "error" and not out.ok
    assert "kaboom" in out.error
    rec = out.to_row(3)
    assert rec["verdict"] == "error" and rec["reproducer"].endswith("--check boom --seed 3")


def test_a_check_returning_the_wrong_type_is_an_error(isolated_registry):
    reg = isolated_registry
    _fake_claim(reg)
    reg.register_check("zz_fake.claim", layer="sim", name="wrong")(lambda seed: "verified")
    (chk,) = [c for c in reg.checks() if c.claim_id == "zz_fake.claim"]
    out = reg.run_one(chk)
    assert out.verdict == "error" and "not CheckResult" in out.error


def _register_fake(reg, returns: Verdict, expected: Verdict):
    _fake_claim(reg)

    def fake(seed: int) -> CheckResult:
        return CheckResult(returns, f"fake evidence seed={seed}", numbers={"x": 1.5})

    reg.register_check("zz_fake.claim", layer="sim", expected=expected, name="fake")(fake)


def test_check_exits_zero_when_verdict_is_as_expected(isolated_registry, tmp_path, capsys):
    # a refuted claim that stays refuted is green
    _register_fake(isolated_registry, Verdict.REFUTED, Verdict.REFUTED)
    out = tmp_path / "claims.json"
    assert main(["check", "--only", "zz_fake", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "zz_fake.claim" in text and "refuted" in text and "reproduce:" not in text
    rec = json.loads(out.read_text())
    assert rec["summary"]["failures"] == 0 and rec["checks"][0]["numbers"] == {"x": 1.5}
    assert rec["checks"][0]["seconds"] >= 0


def test_check_exits_nonzero_with_reproducer_when_verdict_changes(isolated_registry, tmp_path, capsys):
    _register_fake(isolated_registry, Verdict.PARTLY, Verdict.VERIFIED)
    rc = main(["check", "--only", "zz_fake", "--seed", "7", "--out", str(tmp_path / "c.json")])
    assert rc == 1
    text = capsys.readouterr().out
    assert "returned partly, expected verified" in text
    assert "reproduce: tiltlab check --only zz_fake.claim --layer sim --check fake --seed 7" in text
    # the reproducer selects exactly that check
    assert (
        main(
            [
                "check",
                "--only",
                "zz_fake.claim",
                "--layer",
                "sim",
                "--check",
                "fake",
                "--seed",
                "7",
                "--json",
                "--out",
                str(tmp_path / "d.json"),
            ]
        )
        == 1
    )
    rec = json.loads(capsys.readouterr().out)
    assert [c["check"] for c in rec["checks"]] == ["fake"] and rec["seed"] == 7


def test_crashing_check_makes_check_fail(isolated_registry, tmp_path, capsys):
    reg = isolated_registry
    _fake_claim(reg)

    def boom(seed):
        raise ZeroDivisionError("nope")

    reg.register_check("zz_fake.claim", layer="theory", name="boom")(boom)
    assert main(["check", "--only", "zz_fake", "--out", str(tmp_path / "c.json")]) == 1
    assert "crashed: ZeroDivisionError: nope" in capsys.readouterr().out


def test_only_accepts_a_layer_name(isolated_registry, tmp_path, capsys):
    assert main(["check", "--only", "data", "--json", "--out", str(tmp_path / "c.json")]) == 0
    rec = json.loads(capsys.readouterr().out)
    assert rec["checks"] and {c["layer"] for c in rec["checks"]} == {"data"}
    assert rec["unchecked"] == []  # unchecked claims are listed only for unfiltered / prefix runs


def test_prefix_run_lists_unchecked_claims(isolated_registry, tmp_path, capsys):
    _fake_claim(isolated_registry, "zz_fake.lonely")
    assert main(["check", "--only", "zz_fake", "--json", "--out", str(tmp_path / "c.json")]) == 0
    rec = json.loads(capsys.readouterr().out)
    assert [u["claim"] for u in rec["unchecked"]] == ["zz_fake.lonely"]


def test_claim_files_are_well_formed():
    """Every claim row: unique id across files, known paper file, known kind; LLM-scale rows
    record the paper's numbers and a ``tiltlab llm`` command."""
    papers = registry.papers()
    seen: dict[str, str] = {}
    empirical: dict[str, int] = {}
    for path in sorted(claims_dir().glob("*.toml")):
        rows = tomllib.loads(path.read_text(encoding="utf-8")).get("claim", [])
        for row in rows:
            cid = row["id"]
            assert cid not in seen, f"{cid} declared in {seen.get(cid)} and {path.name}"
            seen[cid] = path.name
            assert row["paper"] in papers, f"{cid}: unknown paper {row['paper']}"
            assert row.get("kind", "proposition") in KINDS, cid
            assert row["section"] and row["statement"], cid
            if row.get("llm_command"):
                assert row["llm_command"].startswith("tiltlab llm "), cid
                assert row.get("paper_numbers"), f"{cid}: llm_command without paper_numbers"
            if row.get("kind") == "empirical" and row.get("paper_numbers"):
                empirical[row["paper"]] = empirical.get(row["paper"], 0) + 1
    # every paper with tables has its numbers registered (the listing page and FlowRL, whose
    # numbers are not among the sources, have none)
    assert set(papers) - {"DISA-listing", "FlowRL"} <= set(empirical), empirical


def test_downstream_project_claims_and_checks(isolated_registry, tmp_path, monkeypatch, capsys):
    """``tiltlab check --claims DIR --module NAME``: another project's claims and checks run
    through the same registry, table and exit status."""
    (tmp_path / "myclaims").mkdir()
    (tmp_path / "myclaims" / "mine.toml").write_text(
        '[[paper]]\nshort = "MyProj"\ntitle = "My project"\n\n'
        '[[claim]]\nid = "myproj.loss_is_finite"\npaper = "MyProj"\nsection = "eq. (5)"\n'
        'statement = "our TB loss is finite"\nkind = "beyond"\n',
        encoding="utf-8",
    )
    (tmp_path / "zz_myproj_checks.py").write_text(
        "from tiltlab.paper_checks import register_check, CheckResult, Verdict\n"
        "@register_check('myproj.loss_is_finite', layer='sim', expected=Verdict.VERIFIED)\n"
        "def finite(seed):\n    return CheckResult(Verdict.VERIFIED, 'loss=0.5', {'loss': 0.5})\n",
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", list(__import__("sys").path))
    monkeypatch.delitem(__import__("sys").modules, "zz_myproj_checks", raising=False)
    rc = main(
        [
            "check",
            "--claims",
            "myclaims",
            "--module",
            "zz_myproj_checks",
            "--only",
            "myproj",
            "--json",
            "--out",
            "c.json",
        ]
    )
    assert rc == 0
    rec = json.loads(capsys.readouterr().out)
    assert [(c["claim"], c["verdict"]) for c in rec["checks"]] == [("myproj.loss_is_finite", "verified")]
    assert main(["check", "--claims", "nowhere", "--out", "c.json"]) == 2
    __import__("sys").modules.pop("zz_myproj_checks", None)


def test_parallel_run_matches_serial(isolated_registry, tmp_path, capsys):
    """--jobs 2 (forked workers) gives the same records, in the same order, as --jobs 1;
    fake checks registered in this process are visible to the workers."""
    _register_fake(isolated_registry, Verdict.PARTLY, Verdict.PARTLY)
    recs = []
    for jobs in ("1", "2"):
        assert main(["check", "--only", "zz_fake", "--jobs", jobs, "--json", "--out", str(tmp_path / "c.json")]) == 0
        recs.append(json.loads(capsys.readouterr().out))
    strip = lambda r: [(c["claim"], c["check"], c["verdict"], c["summary"], c["numbers"]) for c in r["checks"]]
    assert strip(recs[0]) == strip(recs[1]) != []
    for jobs in ("1", "2"):
        assert main(["check", "--only", "data", "--jobs", jobs, "--json", "--out", str(tmp_path / "d.json")]) == 0
        recs.append(json.loads(capsys.readouterr().out))
    assert strip(recs[2]) == strip(recs[3]) and len(recs[2]["checks"]) >= 60


def test_a_checks_row_carries_every_field_from_its_check_claim_and_result(isolated_registry):
    """``Outcome.to_json``: the row's fields, each from its source (what the record, the report and
    --rejudge read), on a result with every field away from its default."""
    reg = isolated_registry
    claim = _fake_claim(reg)
    res = CheckResult(Verdict.PARTLY, "one line", {"x": 1.5}, figure="fig99", items={"a_supports": True})
    reg.register_check("zz_fake.claim", layer="sim", name="full", expected=Verdict.PARTLY)(lambda s: res)
    (chk,) = [c for c in reg.checks() if c.claim_id == "zz_fake.claim"]
    row = reg.run_one(chk, seed=2).to_row(2)
    assert set(row) == {
        "claim", "paper", "section", "cite", "statement", "layer", "check", "expected", "verdict", "ok",
        "summary", "numbers", "figure", "items", "evidence", "expected_items", "seconds", "error", "reproducer",
    }  # fmt: skip
    assert (row["claim"], row["paper"], row["section"], row["statement"]) == (
        "zz_fake.claim", "DISA", "Sec. 0", claim.statement,
    )  # fmt: skip
    assert (row["layer"], row["check"], row["expected"], row["verdict"]) == ("sim", "full", "partly", "partly")
    assert (row["summary"], row["numbers"], row["figure"], row["items"]) == (
        "one line", {"x": 1.5}, "fig99", {"a_supports": True},
    )  # fmt: skip
    assert row["ok"] is True and row["expected_items"] == {}  # the expected verdict; no expected items to compare
    assert row["evidence"] is None and row["error"] is None and row["reproducer"].endswith("--check full --seed 2")
    assert row["cite"] == registry.cite(claim)


@pytest.mark.parametrize("margin", [-0.1, math.nan, math.inf, True, "0.1"])
def test_an_item_declaration_needs_a_finite_margin_of_at_least_zero(margin):
    with pytest.raises(ValueError, match="margin must be a finite number >= 0"):
        registry.ItemSpec("sim", "x", "effect", margin)


def test_an_item_declaration_with_margin_zero_or_more_is_kept_as_a_float():
    assert registry.ItemSpec("sim", "x", "direction", 0).margin == 0.0
    assert isinstance(registry.ItemSpec("sim", "x", "effect", 1).margin, float)


def test_a_paper_keeps_its_source_and_about_and_registry_records_are_frozen(isolated_registry):
    import dataclasses

    p = isolated_registry.declare_paper("ZZP", "A title", "A. Author 2026", source="zzp.pdf", about="what it is")
    assert (p.source, p.about) == ("zzp.pdf", "what it is")
    assert isolated_registry.papers()["ZZP"] == p
    spec = registry.ItemSpec("sim", "x", "effect", 0.1)
    for obj in (p, spec, _fake_claim(isolated_registry)):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, dataclasses.fields(obj)[0].name, "changed")


def test_a_check_runs_at_seed_0_unless_told_and_has_no_rederivation_unless_registered(isolated_registry):
    reg = isolated_registry
    _fake_claim(reg)
    seen = []

    def chk(seed: int) -> CheckResult:
        seen.append(seed)
        return CheckResult(Verdict.VERIFIED, "x")

    reg.register_check("zz_fake.claim", layer="sim", name="seeded")(chk)
    (c,) = [c for c in reg.checks() if c.claim_id == "zz_fake.claim"]
    assert c.rederive is None
    reg.run_one(c)
    reg.run_one(c, seed=4)
    assert seen == [0, 4]


def test_a_paper_declared_twice_must_say_the_same_and_its_short_name_has_no_spaces(isolated_registry):
    reg = isolated_registry
    p = reg.declare_paper("ZZQ", "A title", "A. Author 2026")
    assert reg.declare_paper("ZZQ", "A title", "A. Author 2026") == p  # the same declaration again is fine
    with pytest.raises(ValueError, match="paper 'ZZQ' declared twice with different content"):
        reg.declare_paper("ZZQ", "Another title", "A. Author 2026")
    for bad in (" ZZR", "ZZR ", " ", ""):
        with pytest.raises(ValueError, match="paper short name must be a non-empty name without surrounding"):
            reg.declare_paper(bad, "A title")


def test_a_claim_declares_each_item_once_per_layer(isolated_registry):
    item = {"layer": "sim", "name": "x", "kind": "effect", "margin": 0.1}
    with pytest.raises(ValueError, match=r"claim zz_twice.c: an item is declared twice"):
        isolated_registry.declare_claim(
            "zz_twice.c", "DISA", "Sec. 0", "s", kind="empirical", items=[item, {**item, "margin": 0.2}]
        )
    c = isolated_registry.declare_claim(
        "zz_twice.d", "DISA", "Sec. 0", "s", kind="empirical", items=[item, {**item, "layer": "llm"}]
    )
    assert set(c.items_for("sim")) == set(c.items_for("llm")) == {"x"}
