"""The ten toy figures, one module each.

Each module ``sim.figures.<name>`` defines ``make(out_dir: Path, quick: bool, seed: int) -> FigureRecord``:
it writes ``<out_dir>/<id>.png``, the same figure as a vector ``<out_dir>/<id>.pdf`` and ``<out_dir>/<id>.json``
(the data behind the plot), and returns the record. :func:`make_all` runs them in order; ``tiltlab figures``
and ``tiltlab reproduce`` call it.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

#: (figure id, module name) in report order. The id is the file stem of the PNG / JSON.
FIGURES: tuple[tuple[str, str], ...] = (
    ("fig01_lad_bandit", "fig01_lad_bandit"),
    ("fig02_m_study", "fig02_m_study"),
    ("fig03_beta_sensitivity", "fig03_beta_sensitivity"),
    ("fig04_proposal_strength", "fig04_proposal_strength"),
    ("fig05_bias_landscape", "fig05_bias_landscape"),
    ("fig06_envelope", "fig06_envelope"),
    ("fig07_where_logz_matters", "fig07_where_logz_matters"),
    ("fig08_paced", "fig08_paced"),
    ("fig09_fpa_entanglement", "fig09_fpa_entanglement"),
    ("fig10_lad_divergences", "fig10_lad_divergences"),
)


@dataclass
class FigureRecord:
    """What one figure module returns.

    Attributes:
        id: figure id (file stem).
        title: short title.
        caption: what it shows, naming the paper figure it reproduces (short paper name + figure/section).
        png: path of the PNG written (the PDF is :attr:`pdf`, next to it).
        data: path of the JSON with the numbers behind the plot.
        claims: claim ids this figure illustrates.
        findings: one-line statements of what the figure shows (numbers included).
        numbers: claim id -> that claim's numbers exactly as its check reports them (``CheckResult.numbers``),
            computed by the same ``tiltlab.sim.experiments`` function with the same settings. Claims whose
            check is slow are reported in full mode only.
        seconds: time taken (filled by :func:`make_all`).
    """

    id: str
    title: str
    caption: str
    png: Path
    data: Path
    claims: list[str] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    numbers: dict[str, dict] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def pdf(self) -> Path:
        """The vector copy of the figure, written next to the PNG."""
        return Path(self.png).with_suffix(".pdf")

    def to_json(self) -> dict:
        d = asdict(self)
        d["png"] = str(self.png)
        d["data"] = str(self.data)
        return d


def make_all(
    out_dir: Path,
    quick: bool = False,
    seed: int = 0,
    only: list[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[FigureRecord]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    records = []
    for fig_id, mod_name in FIGURES:
        if only and not any(fig_id.startswith(o) or o in fig_id for o in only):
            continue
        if progress is not None:
            progress(fig_id)
        mod = importlib.import_module(f"tiltlab.sim.figures.{mod_name}")
        t0 = time.perf_counter()
        rec = mod.make(out_dir, quick=quick, seed=seed)
        rec.seconds = time.perf_counter() - t0
        records.append(rec)
    return records
