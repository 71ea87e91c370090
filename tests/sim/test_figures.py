"""Quick versions of all ten figures run, write PNG + PDF + JSON, and state their findings; the CLI filter
and its progress report; and the layout fixes: no legend sits on data, "never reached" has no height, an
axis does not run past its data, the series of a panel can be told apart."""

from __future__ import annotations

import importlib
import itertools
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from tiltlab.sim.figures import FIGURES, FigureRecord

FIG_IDS = [fid for fid, _ in FIGURES]


def test_all_ten_figures_are_registered():
    assert len(FIG_IDS) == 10 and len(set(FIG_IDS)) == 10
    for fid, mod in FIGURES:
        assert importlib.util.find_spec(f"tiltlab.sim.figures.{mod}") is not None, fid


@pytest.fixture(scope="module")
def quick_figures(tmp_path_factory):
    """Each quick figure made once: ``fig_id -> (record, matplotlib Figure)``. The Figure is caught on its
    way into ``_figure_io.save``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    import tiltlab.sim.figures._figure_io as common

    out = tmp_path_factory.mktemp("quick_figures")
    made: dict[str, tuple] = {}
    caught: list = []
    real_save = common.save

    def catching_save(fig, *a, **kw):
        caught.append(fig)
        return real_save(fig, *a, **kw)

    for fid, name in FIGURES:
        mod = importlib.import_module(f"tiltlab.sim.figures.{name}")
        patched = [m for m in (common, mod) if getattr(m, "save", None) is real_save]
        for m in patched:
            m.save = catching_save
        try:
            caught.clear()
            rec = mod.make(out, quick=True, seed=0)
        finally:
            for m in patched:
                m.save = real_save
        assert len(caught) == 1, fid
        fig = caught[0]
        FigureCanvasAgg(fig)  # save() closed it: a canvas again, drawn so that legends have their final place
        fig.canvas.draw()
        made[fid] = (rec, fig)
    return made


def _assert_valid_pdf(path):
    raw = path.read_bytes()
    assert raw.startswith(b"%PDF-1.") and raw.rstrip().endswith(b"%%EOF"), path
    assert len(re.findall(rb"/Type\s*/Page\b(?!s)", raw)) == 1, path  # one page: the whole figure
    assert re.search(rb"startxref\s+(\d+)", raw), path
    xref = int(re.search(rb"startxref\s+(\d+)", raw).group(1))
    assert raw[xref : xref + 4] == b"xref", path  # the cross-reference table is where the trailer says
    assert len(raw) > 10_000, path  # vector drawing of a plot, not an empty page


def _assert_paper_ready_pdf(path):
    """Fonts embedded as TrueType (no Type 3 bitmaps-in-disguise) and no creation date (same figure, same file)."""
    raw = path.read_bytes()
    assert b"/Subtype /Type3" not in raw and b"/FontFile2" in raw, path
    assert b"/CreationDate" not in raw, path


@pytest.mark.parametrize("fig_id", FIG_IDS)
def test_quick_figure(quick_figures, fig_id):
    rec, _ = quick_figures[fig_id]
    assert isinstance(rec, FigureRecord) and rec.id == fig_id
    assert rec.png.exists() and rec.png.stat().st_size > 10_000  # a real plot, not an empty canvas
    assert rec.png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert rec.pdf == rec.png.with_suffix(".pdf")
    _assert_valid_pdf(rec.pdf)
    _assert_paper_ready_pdf(rec.pdf)
    data = json.loads(rec.data.read_text())
    assert data["caption"] == rec.caption
    # names the paper it reproduces by its short name, never by a file name
    assert any(name in rec.caption for name in ("DISA", "FlowRL", "PACED-RL", "LAD", "FPA")), rec.caption
    assert ".txt" not in rec.caption
    assert rec.findings and all(any(ch.isdigit() for ch in f) for f in rec.findings)  # findings carry numbers
    assert not [f for f in rec.findings if f.rstrip().endswith(":")], fig_id  # no heading posing as an empty finding
    assert rec.claims


def test_pdf_validator_rejects_broken_files(tmp_path):
    """The PDF check above can fail: a truncated file and a PNG renamed .pdf are refused."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot(np.arange(200), np.sin(np.arange(200)))
    ax.scatter(np.arange(200), np.cos(np.arange(200)))
    good = tmp_path / "good.pdf"
    fig.savefig(good)
    fig.savefig(tmp_path / "fake.pdf", format="png")
    plt.close(fig)
    _assert_valid_pdf(good)
    (tmp_path / "cut.pdf").write_bytes(good.read_bytes()[: len(good.read_bytes()) // 2])
    for bad in ("cut.pdf", "fake.pdf"):
        with pytest.raises(AssertionError):
            _assert_valid_pdf(tmp_path / bad)


# ------------------------------------------------------------------ layout: legends off the data


def _display_points(artist, step: float = 2.0) -> np.ndarray:
    """Points (display pixels) an artist covers: a line's path densified to one point every ``step``
    pixels (a segment that crosses a box with no vertex inside it counts), a scatter's markers, a bar's
    four corners and centre."""
    from matplotlib.collections import PathCollection
    from matplotlib.lines import Line2D
    from matplotlib.patches import Rectangle

    if isinstance(artist, Line2D):
        xy = artist.get_transform().transform(np.asarray(artist.get_xydata(), float))
        xy = xy[np.isfinite(xy).all(1)]
        if artist.get_linestyle() in ("None", "none", "", " ") or len(xy) < 2:
            return xy
        pts = [xy[:1]]
        for a, b in itertools.pairwise(xy):
            n = max(2, int(np.hypot(*(b - a)) / step) + 1)
            pts.append(a + (b - a) * np.linspace(0, 1, n)[1:, None])
        return np.concatenate(pts)
    if isinstance(artist, PathCollection):
        return artist.get_offset_transform().transform(np.asarray(artist.get_offsets(), float))
    if isinstance(artist, Rectangle):
        c = artist.get_transform().transform(np.array([[0, 0], [0, 1], [1, 0], [1, 1], [0.5, 0.5]], float))
        return c
    return np.empty((0, 2))


def _covered_by_legend(fig, ax) -> list[str]:
    """Data drawn in ``ax`` (and in any twin axes at the same place) that lies under ``ax``'s legend:
    one entry per artist, naming it; empty when the legend hides nothing."""
    from matplotlib.collections import PathCollection
    from matplotlib.lines import Line2D
    from matplotlib.patches import Rectangle

    renderer = fig.canvas.get_renderer()
    box = ax.get_legend().get_window_extent(renderer)
    where = ax.get_position().bounds
    hits = []
    for a in fig.axes:
        if not np.allclose(a.get_position().bounds, where):
            continue
        artists = [*a.lines, *a.collections, *[p for p in a.patches if isinstance(p, Rectangle)]]
        for art in artists:
            if not isinstance(art, (Line2D, PathCollection, Rectangle)):
                continue
            pts = _display_points(art)
            inside = (pts[:, 0] > box.x0) & (pts[:, 0] < box.x1) & (pts[:, 1] > box.y0) & (pts[:, 1] < box.y1)
            if inside.any():
                hits.append(f"{type(art).__name__} {art.get_label()!r}: {int(inside.sum())} point(s)")
    return hits


#: (figure, panel index in fig.axes) whose legend the issue found on the data
LEGEND_PANELS = [
    ("fig03_beta_sensitivity", 3),  # (d)
    ("fig05_bias_landscape", 1),  # (b), with its twin axis
    ("fig06_envelope", 0),  # (a)
    ("fig08_paced", 2),  # (c)
    ("fig09_fpa_entanglement", 4),  # (e)
]


@pytest.mark.parametrize("fig_id,panel", LEGEND_PANELS)
def test_legend_hides_no_data(quick_figures, fig_id, panel):
    _, fig = quick_figures[fig_id]
    ax = fig.axes[panel]
    assert ax.get_legend() is not None
    assert _covered_by_legend(fig, ax) == [], fig_id


def test_legend_check_sees_a_covered_point():
    """The check above can fail: a legend placed on a line and on a point is reported."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4, 3))
    ax.plot([0, 1], [0, 1], label="diagonal")  # crosses the centre: no vertex inside the legend
    ax.scatter([0.5], [0.5], label="centre point")
    ax.plot([0, 1], [0.02, 0.02], label="floor")
    ax.legend(loc="center")
    fig.canvas.draw()
    hits = _covered_by_legend(fig, ax)
    plt.close(fig)
    assert any("diagonal" in h for h in hits) and any("centre point" in h for h in hits)
    assert not any("floor" in h for h in hits)


# ------------------------------------------------------------------ the other layout fixes


def test_fig03_training_panel_spans_its_own_betas(quick_figures):
    rec, fig = quick_figures["fig03_beta_sensitivity"]
    betas = np.asarray(json.loads(rec.data.read_text())["training"]["beta"], float)
    lo, hi = fig.axes[3].get_xlim()
    # 1.3x margin on a log axis: the x-axis ends within one margin of the last trained beta
    assert betas.max() <= hi <= betas.max() * 1.3 * (1 + 1e-9)
    assert betas.min() / 1.3 * (1 - 1e-9) <= lo <= betas.min()
    label_betas = np.asarray(json.loads(rec.data.read_text())["label"]["beta"], float)
    assert label_betas.max() > betas.max()  # (a-c) do go further: the narrowing is real


def test_fig04_has_no_rounding_axis(quick_figures):
    rec, fig = quick_figures["fig04_proposal_strength"]
    assert len(fig.axes) == 4  # no twin axis of float64 rounding
    dev = max(abs(float(r) - 1) for row in json.loads(rec.data.read_text())["tilt"]["mean_ratio"] for r in row)
    assert dev < 1e-12  # what the note states: E[Z_8] = Z up to rounding
    notes = [t.get_text() for t in fig.axes[0].texts]
    assert any(f"{dev:.0e}" in t and "rounding" in t for t in notes), notes


def test_fig08_never_reached_has_no_height(quick_figures):
    from matplotlib.patches import Rectangle

    rec, fig = quick_figures["fig08_paced"]
    d = json.loads(rec.data.read_text())
    taus = list(d["tau_sweep"])
    steps = [d["tau_sweep"][t]["steps_to_target"] for t in taus]
    never = [i for i, s in enumerate(steps) if not (isinstance(s, (int, float)) and math.isfinite(s))]
    reached = [i for i in range(len(taus)) if i not in never]
    assert never and reached  # seed 0 has both kinds, so both branches are exercised
    ax = fig.axes[2]
    bars = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_height() > 0]
    assert sorted(round(b.get_x() + b.get_width() / 2) for b in bars) == reached
    assert [b.get_height() for b in sorted(bars, key=lambda b: b.get_x())] == [steps[i] for i in reached]
    markers = [ln for ln in ax.lines if ln.get_marker() not in ("None", None, "")]
    assert len(markers) == 1
    xs, ys = markers[0].get_xdata(), markers[0].get_ydata()
    run_len = next(ln for ln in ax.lines if ln.get_linestyle() == "--").get_ydata()[0]
    assert list(xs) == never and all(y == run_len for y in ys)


def test_fig09_weight_series_are_distinct(quick_figures):
    _, fig = quick_figures["fig09_fpa_entanglement"]
    lines = fig.axes[4].lines
    assert len(lines) == 4
    look = [(ln.get_color(), ln.get_linestyle(), ln.get_marker(), str(ln.get_markerfacecolor())) for ln in lines]
    for i in range(4):
        for j in range(i + 1, 4):
            same_method = look[i][0] == look[j][0]
            if same_method:  # correct vs incorrect of one method: line style and marker fill differ
                assert look[i][1] != look[j][1] and look[i][3] != look[j][3], (look[i], look[j])
            else:  # the two methods: colour and marker shape differ
                assert look[i][2] != look[j][2], (look[i], look[j])
    assert len({lk[0] for lk in look}) == 2 and len({lk[1] for lk in look}) == 2


# ------------------------------------------------------------------ the command


def test_cli_figures_only(tmp_path, monkeypatch, capsys):
    from tiltlab.cli import main

    monkeypatch.setenv("TILTLAB_PROGRESS", "lines")
    monkeypatch.setenv("TILTLAB_PROGRESS_INTERVAL", "0")
    assert main(["figures", "--quick", "--only", "fig08", "fig5", "--out", str(tmp_path)]) == 0
    index = json.loads((tmp_path / "index.json").read_text())
    assert [f["id"] for f in index["figures"]] == ["fig05_bias_landscape", "fig08_paced"]  # report order
    for f in index["figures"]:
        assert f["pdf"] == str(tmp_path / f"{f['id']}.pdf")
        _assert_valid_pdf(tmp_path / f"{f['id']}.pdf")
    out, err = capsys.readouterr()
    lines = err.splitlines()
    # one line per finished figure, the running count with its ETA, and the closing line
    assert re.fullmatch(r"\[figures\] fig05_bias_landscape: \d+\.\d s", lines[0]), lines
    assert (
        lines[1].startswith("figures: 1/2 figure (50%)") and "ETA" in lines[1] and "[fig05_bias_landscape]" in lines[1]
    )
    assert re.fullmatch(r"\[figures\] fig08_paced: \d+\.\d s", lines[2]), lines
    assert lines[-1].startswith("figures: 2/2 figure (100%)"), lines
    assert "fig08_paced.pdf" in out and "2 figure(s) in" in out
    assert main(["figures", "--only", "fig99_nope", "--out", str(tmp_path)]) == 2


def test_cli_figures_quiet_progress(tmp_path, monkeypatch, capsys):
    from tiltlab.cli import main

    monkeypatch.setenv("TILTLAB_PROGRESS", "off")
    assert main(["figures", "--quick", "--only", "fig06", "--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert err == "" and "1 figure(s) in" in out


# ------------------------------------------------------------------ results are never silently replaced


def _fake_make_all(fail_on: str | None = None):
    """A stand-in for ``make_all`` that writes the three files of a figure (cheap), or raises on ``fail_on``."""
    from tiltlab.sim.figures import FigureRecord

    def make_all(out_dir, quick=False, seed=0, only=None, progress=None):
        (fid,) = only
        if fid == fail_on:
            raise RuntimeError(f"{fid} broke")
        out_dir = Path(out_dir)
        for ext in ("png", "pdf", "json"):
            (out_dir / f"{fid}.{ext}").write_text(f"{fid} quick={quick} seed={seed}")
        return [FigureRecord(fid, fid, "c", out_dir / f"{fid}.png", out_dir / f"{fid}.json", seconds=0.5)]

    return make_all


def test_figures_only_merges_into_the_index_and_keeps_other_figures(tmp_path, monkeypatch, capsys):
    import tiltlab.sim.figures as simfig
    from tiltlab.cli import main

    monkeypatch.setenv("TILTLAB_PROGRESS", "off")
    monkeypatch.setattr(simfig, "make_all", _fake_make_all())
    assert main(["figures", "--out", str(tmp_path), "--seed", "3"]) == 0
    full = json.loads((tmp_path / "index.json").read_text())
    assert len(full["figures"]) == 10 and full["quick"] is False
    assert main(["figures", "--only", "fig05", "--out", str(tmp_path), "--seed", "7"]) == 0
    index = json.loads((tmp_path / "index.json").read_text())
    ids = [f["id"] for f in index["figures"]]
    assert ids == [f["id"] for f in full["figures"]]  # nothing dropped, report order kept
    by_id = {f["id"]: f for f in index["figures"]}
    assert by_id["fig05_bias_landscape"]["seed"] == 7
    assert by_id["fig01_lad_bandit"] == full["figures"][0]  # untouched entry, its own seed and time
    assert (tmp_path / "fig05_bias_landscape.png").read_text() == "fig05_bias_landscape quick=False seed=7"
    assert (tmp_path / "fig01_lad_bandit.png").read_text() == "fig01_lad_bandit quick=False seed=3"
    assert "9 earlier figure(s) kept" in capsys.readouterr().out
    assert not [p for p in tmp_path.parent.iterdir() if p.name.startswith(f".{tmp_path.name}.partial-")]


def test_figures_quick_never_replaces_full_figures(tmp_path, monkeypatch, capsys):
    import tiltlab.sim.figures as simfig
    from tiltlab.cli import main

    monkeypatch.setenv("TILTLAB_PROGRESS", "off")
    monkeypatch.setattr(simfig, "make_all", _fake_make_all())
    out = tmp_path / "figs"
    assert main(["figures", "--only", "fig01", "fig02", "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert main(["figures", "--quick", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds full-mode figures (fig01_lad_bandit, fig02_m_study)" in err[0]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    # the default folder of --quick is its own: results/quick/figures
    monkeypatch.chdir(tmp_path)
    assert main(["figures", "--quick", "--only", "fig03"]) == 0
    quick = json.loads((tmp_path / "results/quick/figures/index.json").read_text())
    assert [(f["id"], f["quick"]) for f in quick["figures"]] == [("fig03_beta_sensitivity", True)]
    # a folder holding both modes says so
    assert main(["figures", "--quick", "--only", "fig04", "--out", str(tmp_path / "results/quick/figures")]) == 0
    assert main(["figures", "--only", "fig05", "--out", str(tmp_path / "mixed")]) == 0
    assert main(["figures", "--only", "fig06", "--quick", "--out", str(tmp_path / "q2")]) == 0
    from tiltlab.sim.cli import _merge_index

    mixed = _merge_index(
        {"figures": [{"id": "a", "quick": False, "seconds": 1.0}]},
        [{"id": "b", "quick": True, "seconds": 2.0}],
        ["a", "b"],
    )
    assert mixed["quick"] == "mixed" and mixed["seconds"] == 3.0


def test_an_interrupted_figures_run_leaves_the_earlier_outputs(tmp_path, monkeypatch):
    import tiltlab.sim.figures as simfig
    from tiltlab.cli import main

    monkeypatch.setenv("TILTLAB_PROGRESS", "off")
    monkeypatch.setattr(simfig, "make_all", _fake_make_all())
    out = tmp_path / "figs"
    assert main(["figures", "--only", "fig01", "fig02", "--out", str(out), "--seed", "1"]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    monkeypatch.setattr(simfig, "make_all", _fake_make_all(fail_on="fig02_m_study"))
    assert main(["figures", "--only", "fig01", "fig02", "--out", str(out), "--seed", "2"]) == 1
    after = {p.name: p.read_bytes() for p in out.iterdir()}
    # fig01 was complete, but nothing moves into place before every figure is: the folder is the earlier one
    assert after == before
    assert before["fig01_lad_bandit.png"] == b"fig01_lad_bandit quick=False seed=1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["figs"]  # no partial folder left
    # a failed first run into a new folder leaves no folder at all
    assert main(["figures", "--only", "fig01", "fig02", "--out", str(tmp_path / "new" / "figs")]) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["figs"]


def test_figures_refuses_an_index_it_did_not_write(tmp_path, capsys):
    from tiltlab.cli import main

    (tmp_path / "index.json").write_text("[1, 2]")
    assert main(["figures", "--quick", "--only", "fig06", "--out", str(tmp_path)]) == 2
    assert "is not a figures index" in capsys.readouterr().err


# ------------------------------------------------------------------ fig01 and fig09 (c): comparable scales, honest spread


def test_fig01_panels_share_one_y_scale_and_show_each_seed(quick_figures):
    rec, fig = quick_figures["fig01_lad_bandit"]
    data = json.loads(rec.data.read_text())
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.axison]
    assert len(panels) == len(data["methods"]) == 8
    assert len({ax.get_ylim() for ax in panels}) == 1 and all(ax.get_yscale() == "log" for ax in panels)
    _, hi = panels[0].get_ylim()
    for ax, (label, m) in zip(panels, data["methods"].items()):
        seeds = np.asarray(m["policy_seeds"], float)
        assert seeds.shape == (data["base"]["seeds"], len(data["P_A"]))
        assert hi > seeds.max() and hi > np.asarray(data["P_A"], float).max()
        # each seed's largest arm is marked where it is, not where the mean puts it
        (marks,) = [ln for ln in ax.lines if ln.get_marker() == "v"]
        assert list(marks.get_xdata()) == list(seeds.argmax(1)), label
        assert np.allclose(marks.get_ydata(), seeds.max(1)), label
        assert m["max_pi_seeds"] == pytest.approx(list(seeds.max(1)))
        assert all(f"(arm {a})" in ax.get_title() for a in seeds.argmax(1)), ax.get_title()


def test_fig01_titles_name_seeds_that_collapse_onto_different_arms():
    """Two seeds at max pi 0.96 on arms 12 and 37: the title names both (their mean, ~0.5 per arm, would not)."""
    from tiltlab.sim.figures.fig01_lad_bandit import seed_maxima

    assert seed_maxima({"max_pi_seeds": [0.96, 0.95], "argmax_seeds": [12, 37]}) == (
        "max $\\pi$ per seed 0.96 (arm 12), 0.95 (arm 37)"
    )
    many = seed_maxima({"max_pi_seeds": [0.9, 0.95, 0.2, 0.3], "argmax_seeds": [1, 2, 2, 2]})
    assert many == "max $\\pi$ per seed 0.20-0.95 on 2 arm(s)"


def test_fig09_bands_are_one_standard_error_of_the_seed_mean(quick_figures):
    from matplotlib.collections import PolyCollection

    from tiltlab.sim.experiments import fpa_entanglement as fe

    _, fig = quick_figures["fig09_fpa_entanglement"]
    runs = fe.run_all(fe.CLAIM_CONFIG, 0)
    assert len(runs["offrl"]["step"]) >= 10  # more than the five time points of the first version
    for panel, key in ((0, "corr"), (1, "inc"), (2, "acc")):
        bands = [c for c in fig.axes[panel].collections if isinstance(c, PolyCollection)]
        assert len(bands) == 2, panel
        for band, k in zip(bands, ("offrl", "fpa2")):
            v = np.asarray(runs[k][key], float)  # [time, seed]
            n = v.shape[1]
            mean = [sum(row) / n for row in v]
            se = [math.sqrt(sum((x - m) ** 2 for x in row) / (n - 1) / n) for row, m in zip(v, mean)]
            ys = band.get_paths()[0].vertices[:, 1]
            assert min(ys) == pytest.approx(min(m - s for m, s in zip(mean, se)), rel=1e-9, abs=1e-12)
            assert max(ys) == pytest.approx(max(m + s for m, s in zip(mean, se)), rel=1e-9, abs=1e-12)
            assert sum(2 * x for x in se) < 0.6 * float((v.max(1) - v.min(1)).sum())  # far narrower than min-max
