"""Report rendering on fake outcomes and figures, and the ``tiltlab reproduce`` glue."""

from __future__ import annotations

import base64
import json
import re
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tiltlab.claims import pinned
from tiltlab.claims.registry import Check, CheckResult, Claim, Outcome, Verdict
from tiltlab.cli import main
from tiltlab.paper_checks import cli as pcli
from tiltlab.paper_checks.report import ReportInput, claim_rows, render_html, render_markdown, write_report

P0, P2 = "DISA", "PACED-RL"


def _png(path: Path) -> Path:
    """A valid 1x1 PNG, written without matplotlib."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    raw = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
    raw += chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00")) + chunk(b"IEND", b"")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(raw)
    return path


@dataclass
class FakeFigure:
    id: str
    title: str
    caption: str
    png: Path
    data: Path
    claims: list = field(default_factory=list)
    findings: list = field(default_factory=list)
    seconds: float = 0.0


def _outcome(cid, layer, verdict, expected=None, summary="evidence", figure=None, error=None):
    chk = Check(cid, layer, f"chk_{layer}", Verdict(expected or verdict or "verified"), lambda s: None)
    if error:
        return Outcome(chk, None, 0.01, error)
    return Outcome(chk, CheckResult(Verdict(verdict), summary, {"n": 3, "err": 0.25}, figure), 0.01)


def _input(tmp_path: Path) -> ReportInput:
    claims = {
        "a.verified": Claim("a.verified", P0, "§1", "first statement: pi* | b < 0 | pi*"),
        "a.refuted": Claim("a.refuted", P0, "§2", "second statement", kind="empirical"),
        "b.partly": Claim(
            "b.partly",
            P2,
            "Table 9",
            "third statement",
            kind="empirical",
            llm_command="tiltlab llm train --config configs/x.yaml",
        ),
        "b.error": Claim("b.error", P2, "§4", "fourth statement"),
        "b.unchecked": Claim("b.unchecked", P2, "§5", "fifth statement"),
    }
    outs = [
        _outcome("a.verified", "theory", "verified", figure="fig99_demo"),
        _outcome("a.verified", "sim", "verified"),
        _outcome("a.refuted", "sim", "refuted", summary="the paper is wrong by 0.3"),
        _outcome("b.partly", "data", "partly", expected="out_of_reach", summary="half holds"),
        _outcome("b.error", "sim", None, expected="verified", error="Traceback ...\nValueError: broken input"),
    ]
    fig = FakeFigure(
        "fig99_demo",
        "Demo figure",
        "Shows the demo (DISA Fig. 9).",
        _png(tmp_path / "figures" / "fig99_demo.png"),
        tmp_path / "figures" / "fig99_demo.json",
        claims=["a.refuted"],
        findings=["the demo curve falls by 12%"],
    )
    return ReportInput(
        claims=claims,
        outcomes=outs,
        figures=[fig],
        missing_figures={"fig98_gone": "module tiltlab.sim.figures.fig98_gone is missing"},
        env={"python": "3.x", "torch": "2.x"},
        seed=5,
        out_dir=tmp_path,
        run_line="generated NOW; runtime 1.0 s",
    )


def test_claim_rows_status_and_figures(tmp_path):
    rows = {r["id"]: r for r in claim_rows(_input(tmp_path))}
    assert rows["a.verified"]["status"] == "verified" and rows["a.verified"]["figures"] == ["fig99_demo"]
    assert rows["a.refuted"]["figures"] == ["fig99_demo"]  # via FigureRecord.claims
    assert rows["b.error"]["status"] == "error" and rows["b.unchecked"]["status"] == "unchecked"
    assert [r["id"] for r in claim_rows(_input(tmp_path))][:2] == ["a.refuted", "a.verified"]  # paper order, then id


def test_markdown_has_summary_counts_findings_and_figure(tmp_path):
    md = render_markdown(_input(tmp_path))
    # columns: verified partly refuted inconclusive out_of_reach error unchecked total
    assert "| [DISA](#paper-DISA) | 1 | 0 | 1 | 0 | 0 | 0 | 0 | 2 |" in md
    assert "| [PACED-RL](#paper-PACED-RL) | 0 | 1 | 0 | 0 | 0 | 1 | 1 | 3 |" in md
    assert "| **all** | 1 | 1 | 1 | 0 | 0 | 1 | 1 | 5 |" in md
    assert "the paper is wrong by 0.3" in md and "the demo curve falls by 12%" in md
    assert "fig98_gone" in md and "ValueError: broken input" in md
    assert (
        "tiltlab check --only b.partly --layer data --check chk_data --seed 5" in md
    )  # reproducer of the changed verdict
    assert "![Demo figure](figures/fig99_demo.png)" in md and md.count("![Demo figure]") == 1
    assert "`tiltlab llm train --config configs/x.yaml`" in md
    assert "- seed: 5" in md and "torch: 2.x" in md
    assert "first statement: pi\\* \\| b &lt; 0 \\| pi\\*" in md  # no accidental emphasis, table break or HTML


def test_report_cites_short_names_and_docs_in_the_repository(tmp_path):
    """Claims are cited as "<paper> <section>"; the report sends readers to docs/ in the repository,
    never to a file outside it or to a hashed file name."""
    inp = _input(tmp_path)
    for text in (render_markdown(inp), render_html(inp)):
        assert "DISA §1" in text and "PACED-RL §4" in text
        assert "docs/math.md" in text and "docs/papers.md" in text
        assert "shared/" not in text and not re.search(r"_[0-9a-f]{16}\.txt", text)
    md = render_markdown(inp)
    assert "## DISA — DISA: Offline Importance Sampling for Distribution-Matching LLM-RL" in md


def test_html_is_self_contained_with_embedded_image(tmp_path):
    inp = _input(tmp_path)
    ht = render_html(inp)
    b64 = base64.b64encode(Path(inp.figures[0].png).read_bytes()).decode()
    assert f'src="data:image/png;base64,{b64}"' in ht
    assert ht.count("data:image/png;base64,") == 1  # embedded once, referenced afterwards
    assert 'href="#fig99_demo"' in ht
    assert "<script" not in ht and 'src="http' not in ht
    assert '<span class="v refuted">refuted</span>' in ht


def test_rendering_is_deterministic(tmp_path):
    a = _input(tmp_path)
    b = _input(tmp_path)
    b.outcomes = list(reversed(b.outcomes))
    b.claims = dict(reversed(list(b.claims.items())))
    assert render_markdown(a) == render_markdown(b) and render_html(a) == render_html(b)


def test_write_report(tmp_path):
    md, ht = write_report(_input(tmp_path))
    assert md.read_text().startswith("# tiltlab") and ht.read_text().startswith("<!DOCTYPE html>")


def test_reproduce_writes_everything_and_fails_on_missing_figure(isolated_registry, tmp_path, monkeypatch, capsys):
    reg = isolated_registry
    reg.declare_claim("zz_fake.repro", P0, "§0", "a fake claim", kind="empirical")
    reg.register_check("zz_fake.repro", layer="sim", expected="refuted", name="fake")(
        lambda seed: CheckResult(Verdict.REFUTED, f"fake seed={seed}", figure="fig99_demo")
    )
    calls = {}

    def fake_select(only, layer, name, include_slow):
        calls["slow"] = include_slow
        return [c for c in reg.checks() if c.claim_id == "zz_fake.repro"]

    def fake_figs(out_dir, quick, seed, progress=True):
        calls["figs"] = (Path(out_dir).name, Path(out_dir).parent.parent, quick, seed)
        fig = FakeFigure("fig99_demo", "Demo", "caption", _png(Path(out_dir) / "fig99_demo.png"), tmp_path / "x.json")
        return [fig], {"fig98_gone": "module tiltlab.sim.figures.fig98_gone is missing"}

    monkeypatch.setattr(pcli.runner, "_select", fake_select)
    monkeypatch.setattr(pcli.reproduce, "make_figures", fake_figs)
    out = tmp_path / "out"
    assert main(["reproduce", "--quick", "--seed", "4", "--jobs", "1", "--out", str(out)]) == 1  # a figure is missing
    # the figures go to a temporary folder next to --out (moved into place at the end)
    assert calls == {"slow": False, "figs": ("figures", tmp_path, True, 4)}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # the temporary folder is gone
    printed = capsys.readouterr().out
    assert "fig98_gone" in printed
    rec = json.loads((out / "claims.json").read_text())
    assert rec["checks"][0]["summary"] == "fake seed=4" and rec["figures_missing"] == {
        "fig98_gone": "module tiltlab.sim.figures.fig98_gone is missing"
    }
    assert "data:image/png;base64," in (out / "report.html").read_text()
    assert "fig98_gone" in (out / "REPORT.md").read_text()


def test_make_figures_reports_missing_modules(tmp_path, monkeypatch):
    """A figure module that does not exist is reported, and the others still run."""
    simfig = pytest.importorskip("tiltlab.sim.figures")
    monkeypatch.setattr(simfig, "FIGURES", (("fig97_absent", "fig97_absent_module"),))
    recs, problems = pcli.make_figures(tmp_path, quick=True, seed=0, progress=False)
    assert recs == [] and problems == {"fig97_absent": "module tiltlab.sim.figures.fig97_absent_module is missing"}


def test_background_figures_report_missing_modules(tmp_path, monkeypatch):
    """The process-pool path (figures while the checks run) reports like the serial one."""
    simfig = pytest.importorskip("tiltlab.sim.figures")
    monkeypatch.setattr(
        simfig, "FIGURES", (("fig97_absent", "fig97_absent_module"), ("fig96_absent", "fig96_absent_module"))
    )
    bg = pcli._start_figures_in_background(tmp_path, quick=True, seed=0, workers=1)
    if bg is None:
        pytest.skip("no fork start method on this platform")
    recs, problems = pcli._collect_figures(bg)
    assert recs == [] and sorted(problems) == ["fig96_absent", "fig97_absent"]


def _hrefs(page: str) -> list[str]:
    return re.findall(r'href="([^"]*)"', page)


def test_html_navigation_links_every_claim_and_folds_out_of_reach(tmp_path):
    inp = _input(tmp_path)
    inp.outcomes = [*inp.outcomes, _outcome("b.unchecked", "data", "out_of_reach", summary="needs GPUs")]
    ht = render_html(inp)
    assert '<nav id="toc">' in ht and 'href="#summary"' in ht and 'href="#environment"' in ht
    ids = set(re.findall(r'id="([^"]+)"', ht))
    for cid in inp.claims:
        # linked from the sidebar, the summary table, and the target exists
        assert ht.count(f'href="#claim-{cid}"') >= 2 and f"claim-{cid}" in ids, cid
    assert {"paper-DISA", "paper-PACED-RL", "summary", "findings", "environment", "fig99_demo"} <= ids
    assert all(h[1:] in ids for h in _hrefs(ht) if h.startswith("#")), "dangling in-page link"
    # the refuted finding links to its claim; the out-of-reach claim is folded, the others are not
    assert '<b><a href="#claim-a.refuted">a.refuted</a></b>' in ht
    assert '<details class="claim" id="claim-b.unchecked">' in ht
    assert ht.count("<details") == 1


def test_html_links_checks_to_source_and_citations_to_papers_md(tmp_path):
    """Inside the repository the report links each check to its file and line and each citation to
    docs/papers.md; outside it names ``path:line`` as text (a copied report carries no dead links)."""
    import inspect

    from tiltlab.paper_checks import report as rep

    inp = _input(tmp_path)
    line = inspect.getsourcelines(inp.outcomes[0].check.fn)[1]
    outside = render_html(inp)
    assert f"[source: tests/paper_checks/test_report.py:{line}]" in outside
    assert not [h for h in _hrefs(outside) if not h.startswith("#")]
    inp.out_dir = rep._REPO / "results"
    inside = render_html(inp)
    assert f'href="../tests/paper_checks/test_report.py#L{line}"' in inside
    assert '<i><a href="../docs/papers.md#disa">DISA §1</a></i>' in inside
    files = [h for h in _hrefs(inside) if not h.startswith("#")]
    assert files
    for h in files:
        path, _, frag = h.partition("#")
        target = (inp.out_dir / path).resolve()
        assert target.is_file(), h
        if frag.startswith("L"):
            assert int(frag[1:]) <= len(target.read_text().splitlines()), h
        elif frag:
            assert f"## {frag}".lower() in target.read_text().lower(), h


def test_figures_json_paths_are_relative(tmp_path):
    from tiltlab.paper_checks.report import figures_json

    inp = _input(tmp_path)
    rec = figures_json(inp.figures, tmp_path)
    assert rec[0]["png"] == "figures/fig99_demo.png" and rec[0]["data"] == "figures/fig99_demo.json"


def test_markdown_links_every_claim_and_no_link_dangles(tmp_path):
    """REPORT.md has a contents line, and every claim id of the summary's per-paper lists and of the
    findings links to an anchor that exists in the same file."""
    import re

    inp = _input(tmp_path)
    md = render_markdown(inp)
    anchors = set(re.findall(r'<a id="([^"]+)"></a>', md))
    targets = re.findall(r"\]\(#([^)]+)\)", md)
    assert targets, "no in-page links"
    assert not sorted(set(targets) - anchors), "dangling in-page links"
    for row in claim_rows(inp):
        cid = f"claim-{row['id']}"
        assert cid in anchors and targets.count(cid) >= 1, row["id"]
    assert md.index("Contents:") < md.index("## Summary")


def test_every_failed_pin_and_changed_item_reads_the_same_in_the_terminal_and_both_reports(tmp_path, capsys):
    """The terminal's FAIL line, REPORT.md and report.html give the same words for every failure (a report that
    says nothing while the terminal prints FAIL lines teaches users to ignore both), and the status line counts
    them."""
    import html as _html

    from tiltlab.paper_checks.report import FAILED_TITLE

    inp = _input(tmp_path)
    chk = Check("a.verified", "sim", "pinned", Verdict.VERIFIED, lambda s: None, expected_items=(("flag", True),))
    moved = Outcome(chk, CheckResult(Verdict.VERIFIED, "s", {"max_err": 3e-8, "v": 2.5, "w": 1.0}, None, {"flag": False}), 0.0)  # fmt: skip
    inp.outcomes.append(moved)
    pinned.set_pins({chk.key: {"max_err": (5e-9, 1e-8, "residual"), "v": (2.0, 0.1), "w": (1.0, 0.0), "gone": (1.0, 0.5)}})  # fmt: skip
    try:
        text = moved.failure
        assert text == (
            "verdict verified as expected, but items changed: flag expected True got False; 3 pinned number(s) "
            "moved: max_err 3e-08 above its bound 1e-08 (residual), v 2 +- 0.1 got 2.5, gone 1 +- 0.5 got missing"
        )
        md, page = render_markdown(inp), render_html(inp)
        pcli._print_failures(inp.outcomes, inp.seed)
        term = capsys.readouterr().out
    finally:
        pinned.set_pins(None)
    assert f"FAIL {chk.key}: {text}" in term and f"{FAILED_TITLE}: 3" in term
    assert text in md
    assert _html.escape(text) in page
    for out in (md, page):
        assert FAILED_TITLE in out and "Status: 3 of 6 checks failed" in out
    ok_inp = _input(tmp_path)
    ok_inp.outcomes[:] = [o for o in ok_inp.outcomes if o.ok]
    assert "Status: all 3 checks as expected" in render_markdown(ok_inp)
    assert "Status: all 3 checks as expected" in render_html(ok_inp)
