"""``tiltlab report --format csv|latex|md`` (the per-claim table, parsed back from each format), the
key numbers with their intervals, LLM-scale commands rendered as lists, and the generated README
sections (``tiltlab report --docs``), which must agree with the registry."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest

from tiltlab.claims import llm_record, prereg
from tiltlab.claims import rows as record_rows
from tiltlab.claims.registry import CheckResult, Verdict
from tiltlab.cli import main
from tiltlab.paper_checks import catalog
from tiltlab.paper_checks import report as P

CID = "zz_fake.export"
NASTY = r"§3 & Tab. 2 | 50% $x_1$ {a}~^\ end"  # every character LaTeX, Markdown or CSV must escape


def _setup(reg):
    reg.declare_claim(CID, "DISA", NASTY, "a claim with an awkward section", kind="empirical")
    reg.declare_claim("zz_fake.other", "FlowRL", "§1", "another claim", kind="proposition")
    reg.register_check(CID, layer="sim", expected=Verdict.PARTLY, name="ci")(
        lambda s: CheckResult(
            Verdict.PARTLY, "one of two", {"gap": 0.25, "gap_lo": -0.5, "gap_hi": 1.0, "n": 5, "a_ratio": 2.0}
        )
    )
    reg.register_check("zz_fake.other", layer="theory", name="sym")(
        lambda s: CheckResult(Verdict.VERIFIED, "holds", {"err": 1e-12})
    )


def _record(tmp_path, reg) -> Path:
    _setup(reg)
    out = tmp_path / "claims.json"
    assert main(["check", "--only", "zz_fake", "--jobs", "1", "--out", str(out)]) == 0
    return out


def _parse_md(text: str) -> list[dict[str, str]]:
    lines = text.strip().splitlines()
    cells = [[c.strip() for c in re.split(r"(?<!\\)\|", ln.strip())[1:-1]] for ln in lines]
    head, body = cells[0], cells[2:]

    def unescape(c):
        return re.sub(r"\\(.)", r"\1", c)

    return [dict(zip(head, map(unescape, row), strict=True)) for row in body]


_LATEX_WORDS = {r"\textbackslash{}": "\\", r"\textasciitilde{}": "~", r"\textasciicircum{}": "^"}


def _parse_latex(text: str) -> list[dict[str, str]]:
    rows = [ln for ln in text.splitlines() if ln.endswith(r" \\")]

    def unescape(c):
        return re.sub(
            r"\\textbackslash\{\}|\\textasciitilde\{\}|\\textasciicircum\{\}|\\([&%$#_{}])",
            lambda m: _LATEX_WORDS.get(m.group(0), m.group(1)),
            c,
        )

    cells = [[unescape(c) for c in re.split(r"(?<!\\) & ", ln[: -len(r" \\")])] for ln in rows]
    return [dict(zip(cells[0], row, strict=True)) for row in cells[1:]]


def _parse_csv(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


@pytest.mark.parametrize(("fmt", "parse"), [("csv", _parse_csv), ("md", _parse_md), ("latex", _parse_latex)])
def test_each_format_parses_back_to_the_per_claim_table(isolated_registry, tmp_path, capsys, fmt, parse):
    rec_path = _record(tmp_path, isolated_registry)
    rec = json.loads(rec_path.read_text())
    capsys.readouterr()
    assert main(["report", "--record", str(rec_path), "--format", fmt]) == 0
    rows = parse(capsys.readouterr().out)
    by_id = {r["claim"]: r for r in rows}
    assert list(rows[0]) == list(P.TABLE_COLUMNS)
    assert len(rows) == len(isolated_registry.claims())  # every declared claim, checked or not
    want = {
        "claim": CID,
        "paper": "DISA",
        "section": NASTY,
        "verdict": "partly",
        "decided_by": "sim",
        # CI first, then the rest in name order, 4 at most
        "key_numbers": "ci: gap 0.25 [-0.5, 1]; a_ratio 2; n 5",
        "commit": rec["commit"],
        "source": "run",
    }
    assert by_id[CID] == want
    assert by_id["zz_fake.other"]["verdict"] == "verified" and by_id["zz_fake.other"]["key_numbers"] == "sym: err 1e-12"
    # the same file through --out
    dest = tmp_path / f"table.{fmt}"
    assert main(["report", "--record", str(rec_path), "--format", fmt, "--out", str(dest)]) == 0
    assert parse(dest.read_text()) == rows


def test_export_merges_the_shipped_llm_record_and_names_its_commit(
    isolated_registry, prereg_repo, tmp_path, monkeypatch, capsys
):
    reg = isolated_registry
    rec_path = _record(tmp_path, reg)
    reg.declare_claim("zz_fake.llm", "DISA", "§9", "an llm-decided claim", kind="empirical")
    reg.register_check("zz_fake.llm", layer="llm", name="tiny", slow=True)(
        lambda s: CheckResult(Verdict.VERIFIED, "ok", {"d": 0.3, "d_lo": 0.1, "d_hi": 0.5})
    )
    run = tmp_path / "llm.json"
    keep = {k: c for k, c in reg._CHECKS.items() if c.layer != "llm" or c.claim_id.startswith("zz_fake")}
    for k in set(reg._CHECKS) - set(keep):
        del reg._CHECKS[k]
    assert main(["check", "--layer", "llm", "--slow", "--jobs", "1", "--out", str(run)]) == 0
    shipped = tmp_path / "shipped.json"
    llm_record.ship_llm_record(run, shipped, machine_desc="box")  # the commit is the run's: prereg_repo's HEAD
    monkeypatch.setattr(llm_record, "LLM_RECORD", shipped)
    capsys.readouterr()
    assert main(["report", "--record", str(rec_path), "--format", "csv"]) == 0
    row = {r["claim"]: r for r in _parse_csv(capsys.readouterr().out)}["zz_fake.llm"]
    assert (row["verdict"], row["commit"], row["source"], row["key_numbers"]) == (
        "verified",
        prereg_repo.run[:12],
        "recorded",
        "tiny: d 0.3 [0.1, 0.5]",
    )


def test_report_without_a_record_is_one_line(tmp_path, capsys):
    assert main(["report", "--record", str(tmp_path / "none.json"), "--format", "csv"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err
        == f"tiltlab report: error: --record {tmp_path / 'none.json'}: no such file; run `tiltlab reproduce` (or `tiltlab check`) first"
    )


def test_key_numbers_against_a_naive_listing():
    nums = {"b": 1.5, "a": 0.5, "a_lo": 0.25, "a_hi": 0.75, "z_lo": 3.0, "c": 2, "d": 4}
    # "a" has a CI; z_lo has no z: a plain number; the rest in name order
    assert P.key_numbers(nums, limit=10) == "a 0.5 [0.25, 0.75]; b 1.5; c 2; d 4; z_lo 3"
    assert P.key_numbers(nums, limit=2) == "a 0.5 [0.25, 0.75]; b 1.5"
    assert P.key_numbers({}) == ""
    # half an interval is no interval: both ends are listed as plain numbers
    assert P.key_numbers({"a": 1, "a_lo": 0, "b": 2, "b_hi": 3}) == "a 1; a_lo 0; b 2; b_hi 3"


def test_the_table_takes_the_numbers_of_the_deciding_check_only(isolated_registry):
    reg = isolated_registry
    reg.declare_claim("zz_fake.two", "DISA", "§2", "two sim checks disagree", kind="empirical")
    reg.register_check("zz_fake.two", layer="sim", name="holds")(lambda s: CheckResult(Verdict.VERIFIED, "", {"u": 1}))
    reg.register_check("zz_fake.two", layer="sim", name="breaks", expected=Verdict.REFUTED)(
        lambda s: CheckResult(Verdict.REFUTED, "", {"v": 2})
    )
    reg.register_check("zz_fake.two", layer="data", name="other", expected=Verdict.REFUTED)(
        lambda s: CheckResult(Verdict.REFUTED, "", {"w": 3})
    )
    outs = [reg.run_one(c) for c in reg.select("zz_fake.two")]
    (row,) = [r for r in P.claim_table(reg.claims(), outs, "c1") if r["claim"] == "zz_fake.two"]
    assert (row["verdict"], row["decided_by"], row["key_numbers"]) == (
        "refuted",
        "sim, data",
        "breaks: v 2; other: w 3",
    )
    assert row["commit"] == "c1" and row["source"] == "run"


def test_llm_scale_commands_render_as_lists(isolated_registry, tmp_path):
    reg = isolated_registry
    chain = "tiltlab llm train --config a.yaml && tiltlab llm eval --config a.yaml && tiltlab llm eval --config b.yaml"
    reg.declare_claim("zz_fake.chain", "DISA", "§5", "a table", kind="empirical", llm_command=chain)
    reg.declare_claim("zz_fake.single", "DISA", "§6", "a table", kind="empirical", llm_command="tiltlab llm eval")
    inp = P.ReportInput(claims={k: reg.claims()[k] for k in ("zz_fake.chain", "zz_fake.single")}, outcomes=[])
    md, html = P.render_markdown(inp), P.render_html(inp)
    assert "- LLM-scale commands, in order (3):\n  1. `tiltlab llm train --config a.yaml`\n" in md
    assert "  3. `tiltlab llm eval --config b.yaml`" in md and "&&" not in md
    assert "- LLM-scale command: `tiltlab llm eval`" in md
    assert "<ol><li><code>tiltlab llm train --config a.yaml</code></li>" in html and "&amp;&amp;" not in html
    assert P.command_list(chain) == chain.split(" && ")


# --------------------------------------------------------------------------- generated docs

_README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_counts_agree_with_the_registry():
    """README's generated results section must be regenerated (`tiltlab report --docs`) whenever the
    registry's claims or checks change."""

    text = _README.read_text(encoding="utf-8")
    body = P.section_text(text, "results")
    assert body is not None, "README.md lost its generated results section"
    sentence = P.registry_sentence()
    if catalog.SKIPPED_MODULES:
        pytest.fail(f"check modules skipped, cannot compare the llm count: {catalog.SKIPPED_MODULES}")
    assert sentence in body, f"README.md is stale: regenerate with `tiltlab report --docs` ({sentence})"
    # the verdict table covers every declared claim
    (all_row,) = [ln for ln in body.splitlines() if ln.startswith("| **all** |")]
    assert int(all_row.rstrip(" |").rsplit("|", 1)[1]) == P.registry_counts()["claims"]
    assert P.section_text(text, "timings") is not None


def test_docs_sections_are_replaced_between_their_markers(isolated_registry, tmp_path, monkeypatch, capsys):
    rec_path = _record(tmp_path, isolated_registry)
    readme = tmp_path / "README.md"
    begin, end = P.DOCS_BEGIN.format(name="results"), P.DOCS_END.format(name="results")
    tb, te = P.DOCS_BEGIN.format(name="timings"), P.DOCS_END.format(name="timings")
    readme.write_text(f"intro\n{begin}\nold numbers\n{end}\nmiddle\n{tb}\nold\n{te}\nend\n")
    assert main(["report", "--record", str(rec_path), "--docs", "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("intro\n") and "\nmiddle\n" in text and text.endswith("end\n") and "old" not in text
    body = P.section_text(text, "results")
    assert P.registry_sentence() in body
    rec = json.loads(rec_path.read_text())
    assert rec["commit"] in body and "CPUs, load" in body
    timings = P.section_text(text, "timings")
    assert "`tiltlab check`" in timings and str(rec["runtime"]["wall_s"]) in timings
    # a README without the markers: one line, nothing written
    bare = tmp_path / "BARE.md"
    bare.write_text("no markers\n")
    capsys.readouterr()
    assert main(["report", "--record", str(rec_path), "--docs", "--readme", str(bare)]) == 2
    assert "has no generated section 'results'" in capsys.readouterr().err
    assert bare.read_text() == "no markers\n"


# --------------------------------------------------------------------------- the shipped llm record

_SHIPPED = llm_record.llm_record_path()


def test_the_shipped_llm_record_matches_the_registry():
    """Fails when the llm part of the registry (claims, checks, expected verdicts and items) changed
    after the shipped record was made: regenerate it with llm_record.LLM_RECORD_COMMAND."""
    from tiltlab.claims import registry

    catalog.discover()
    if "tiltlab.llm.checks" in catalog.SKIPPED_MODULES:
        pytest.fail(f"the llm check module did not load: {catalog.SKIPPED_MODULES['tiltlab.llm.checks']}")
    assert _SHIPPED.is_file(), f"no shipped llm record at {_SHIPPED}; make it with `{llm_record.LLM_RECORD_COMMAND}`"
    shipped = llm_record.load_llm_record(_SHIPPED)
    assert shipped is not None
    legacy = {(e["check"], e["run_commit"][:7]) for e in prereg.legacy_runs()}
    all_legacy = all((r["check"], str(r["commit"])[:7]) in legacy for r in shipped["checks"])
    if not all_legacy:
        assert shipped["registry_hash"] == llm_record.llm_registry_hash(), (
            f"the shipped llm record lags the registry; regenerate it: `{llm_record.LLM_RECORD_COMMAND}`"
        )
    # else: a record run before the neutral rule and strict pre-registration (every row a [[legacy]] entry
    # of preregistration.toml, marked legacy in the report) lags the registry by definition until its re-run;
    # no new record can be shipped that way (ship_llm_record refuses legacy rows)
    want = {c.key for c in registry.checks() if c.layer == "llm" and not c.long}  # long checks: rows of their own
    longs = {c.key for c in registry.checks() if c.layer == "llm" and c.long}
    got = {record_rows.row_key(r) for r in shipped["checks"]}
    if all_legacy:  # checks registered after the legacy run have no row until the re-run; no row is orphaned
        assert got <= want, sorted(got - want)
    else:  # every layer check, plus the long checks that were run and shipped; a row of no registered check fails
        assert got - longs == want, (sorted(want - got), sorted(got - longs - want))
    for key in ("commit", "date", "machine", "run_seconds"):
        assert shipped[key], key
    # a row run at another commit is a long check's own run: it carries its own date and command
    for r in shipped["checks"]:
        if r["commit"] == shipped["commit"]:
            assert r["run_at"] == shipped["date"], r["claim"]
        else:
            assert record_rows.row_key(r) in longs and r["run_at"] != shipped["date"], (r["claim"], r["commit"])
            assert "--long" in r["command"].split() and f"--check {r['check']}" in r["command"], r["command"]
