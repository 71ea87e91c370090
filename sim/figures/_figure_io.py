"""The figure modules' shared input/output: JSON-safe copies, writing each figure's PNG + PDF + JSON files
(atomically), and the plain-text-to-mathtext labels."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from tiltlab.files import atomic_path, write_json

__all__ = ["clean", "mathtext", "plt", "save", "steps_label"]


def clean(obj: Any) -> Any:
    """JSON-safe copy: tensors -> lists, non-finite floats -> strings."""
    if hasattr(obj, "tolist"):
        obj = obj.tolist()
    if isinstance(obj, dict):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    return obj


def save(fig, out_dir: Path, fig_id: str, data: dict, caption: str, numbers: dict | None = None) -> tuple[Path, Path]:
    """Write ``<fig_id>.png`` (raster, for the HTML report), ``<fig_id>.pdf`` (vector, for a paper) and
    ``<fig_id>.json`` (the caption, the plotted ``data`` and, under ``claim_numbers``, each claim's numbers as
    its check reports them). Returns ``(png, json)``; the PDF is ``png.with_suffix(".pdf")``.

    The PDF embeds its fonts as TrueType (``pdf.fonttype`` 42, what journals' submission checks ask for)
    and carries no creation date, so the same figure gives the same file."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    png, pdf, js = out_dir / f"{fig_id}.png", out_dir / f"{fig_id}.pdf", out_dir / f"{fig_id}.json"
    try:
        with atomic_path(png) as tmp:
            fig.savefig(tmp, dpi=110, bbox_inches="tight")
        with atomic_path(pdf) as tmp, plt.rc_context({"pdf.fonttype": 42}):
            fig.savefig(tmp, bbox_inches="tight", metadata={"CreationDate": None})
    finally:
        plt.close(fig)
    write_json(js, clean({"caption": caption, "claim_numbers": numbers or {}, **data}), indent=1, newline=False)
    return png, js


# plain-text symbols in experiment labels -> matplotlib mathtext (labels stay plain in the JSON)
_MATH = (
    ("π_old", r"$\pi_{\mathrm{old}}$"),
    ("π_ref", r"$\pi_{\mathrm{ref}}$"),
    ("π_0", r"$\pi_0$"),
    ("π*", r"$\pi^*$"),
    ("log Z", r"$\log Z$"),
    ("·Â", r"$\cdot\hat{A}$"),
    ("A/η", r"$A/\eta$"),
    ("p_old", r"$p_{\mathrm{old}}$"),
    ("p_ref", r"$p_{\mathrm{ref}}$"),
)


def mathtext(label: str) -> str:
    """A plot label with its plain-text symbols (``π_old``, ``log Z``, ...) set as mathtext."""
    for a, b in _MATH:
        label = label.replace(a, b)
    return label


def steps_label(inner: int) -> str:
    """``1 step/batch``, ``4 steps/batch``."""
    return f"{inner} step{'s' if inner != 1 else ''}/batch"
