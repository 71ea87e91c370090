"""The HTML report rendered in a real headless browser (Chromium): every image decodes and every
in-page link lands on an element.

The report holds every declared claim and every registered check (outcomes made up from each
check's expected verdict, nothing is run) and two figures, so ids with dots, folded out-of-reach
claims and the table of contents are all exercised. A control page with one broken image and one
dangling link shows that the probe finds both.

Needs a Chromium binary (Debian: ``apt-get install -y chromium``); skipped with that reason when
none is found.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tiltlab.claims import registry
from tiltlab.claims.registry import CheckResult, Outcome
from tiltlab.paper_checks import catalog
from tiltlab.paper_checks.report import ReportInput, render_html

from .test_report import FakeFigure, _png

_BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

# Runs after load: images must be decoded with a non-zero width, and every href="#x" must name an
# element id. The result is written into the DOM, which --dump-dom prints.
_PROBE = """<script>
window.addEventListener("load", function () {
  var bad = [];
  document.querySelectorAll("img").forEach(function (im, i) {
    if (!im.complete || im.naturalWidth === 0) bad.push("img " + i + " " + (im.alt || ""));
  });
  var links = document.querySelectorAll('a[href^="#"]');
  links.forEach(function (a) {
    var id = decodeURIComponent(a.getAttribute("href").slice(1));
    if (!document.getElementById(id)) bad.push("link #" + id);
  });
  var out = document.createElement("pre");
  out.id = "probe-result";
  out.textContent = JSON.stringify({images: document.images.length, links: links.length, bad: bad});
  document.body.appendChild(out);
});
</script>"""


def _browser() -> str | None:
    return next((p for p in map(shutil.which, _BROWSERS) if p), None)


def _probe(page: Path, tmp_path: Path) -> dict:
    probed = tmp_path / f"probe-{page.name}"
    probed.write_text(page.read_text(encoding="utf-8").replace("</body>", _PROBE + "</body>"), encoding="utf-8")
    cmd = [
        _browser(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--virtual-time-budget=10000",
        "--dump-dom",
        probed.as_uri(),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    m = re.search(r'<pre id="probe-result">(.*?)</pre>', proc.stdout, re.S)
    assert m, f"the probe did not run (exit {proc.returncode}): {proc.stderr[-2000:]}"
    return json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))


pytestmark = pytest.mark.skipif(
    _browser() is None, reason="no Chromium binary on PATH (Debian: apt-get install -y chromium)"
)


def _full_report(tmp_path: Path) -> Path:
    catalog.discover()
    claims = registry.claims()
    outs = [
        Outcome(c, CheckResult(c.expected, f"made-up evidence for {c.key}", {"x": 1.0}, None), 0.0)
        for c in registry.checks()
    ]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([0, 1], [1, 0])
    real_png = tmp_path / "figures" / "fig98_line.png"
    real_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(real_png)
    plt.close(fig)
    some = sorted(claims)[:2]
    figs = [
        FakeFigure("fig98_line", "A line", "caption", real_png, tmp_path / "x.json", claims=[some[0]]),
        FakeFigure("fig99_dot", "A dot", "caption", _png(tmp_path / "figures" / "fig99_dot.png"), tmp_path / "y.json"),
    ]
    inp = ReportInput(claims=claims, outcomes=outs, figures=figs, env={"python": "3"}, out_dir=tmp_path)
    page = tmp_path / "report.html"
    page.write_text(render_html(inp), encoding="utf-8")
    return page


def test_report_has_no_broken_image_or_link_in_chromium(tmp_path):
    page = _full_report(tmp_path)
    res = _probe(page, tmp_path)
    assert res["bad"] == []
    assert res["images"] == 2
    n_claims = len(registry.claims())
    # the sidebar and the summary table each link every claim
    assert res["links"] >= 2 * n_claims


def test_probe_finds_a_broken_image_and_a_dangling_link(tmp_path):
    page = tmp_path / "control.html"
    page.write_text(
        '<!DOCTYPE html><html><body><p id="here">x</p><a href="#here">ok</a><a href="#nowhere">dangling</a>'
        '<img alt="broken" src="data:image/png;base64,AAAA"></body></html>',
        encoding="utf-8",
    )
    res = _probe(page, tmp_path)
    assert res["bad"] == ["img 0 broken", "link #nowhere"] and res["links"] == 2
