"""Provenance of a record's rows: when, where and from which commit each number came.

Every check row of a record carries its *provenance* (:data:`tiltlab.claims.registry.PROVENANCE_FIELDS`):
when it ran (``run_at``), the command and its mode (``mode``: ``full`` / ``quick`` for ``tiltlab
reproduce``, ``check`` for ``tiltlab check``; ``slow``: whether slow checks were part of that run), the git
``commit`` (``git describe``, :func:`git_commit`) and ``commit_sha`` (the full hash, :func:`git_sha`), both
taken by ``tiltlab check``, never passed by hand, the ``seed``, and ``source``: ``run`` (measured by that
command) or ``recorded`` (taken from the shipped llm record, :mod:`tiltlab.claims.llm_record`, not re-run).
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tiltlab.claims.registry import PROVENANCE_FIELDS

__all__ = [
    "PROVENANCE_FIELDS",
    "cpu_model",
    "git_commit",
    "git_sha",
    "machine",
    "now_utc",
    "provenance_line",
    "stamp_rows",
]

#: The checkout holding the code (whose commit a run records).
_REPO = Path(__file__).resolve().parents[2]


def now_utc() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def git_commit(root: Path | None = None) -> str | None:
    """``git describe --always --dirty --abbrev=12`` of the checkout holding the code (None outside git)."""
    root = _REPO if root is None else root
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "describe", "--always", "--dirty", "--abbrev=12"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    text = out.stdout.strip()
    return text if out.returncode == 0 and text else None


def git_sha(root: Path | None = None) -> str | None:
    """``git rev-parse HEAD``: the full hash of the checked-out commit (None outside git), recorded
    beside :func:`git_commit` so that ancestry can be tested (``git merge-base --is-ancestor``)."""
    root = _REPO if root is None else root
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--verify", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    text = out.stdout.strip()
    return text if out.returncode == 0 and len(text) >= 40 else None


def machine() -> dict[str, Any]:
    """The machine a run used: platform, CPU model, CPU count, the 1-minute load average (None where
    unknown), and torch's CPU kernel path (``get_cpu_capability``, where torch is loaded: the pins are
    judged on whatever path a machine takes)."""
    try:
        load: float | None = round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        load = None
    out = {
        "platform": f"{platform.system()} {platform.machine()}",
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "load": load,
        "python": platform.python_version(),
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch"] = torch.__version__
        out["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    return out


def cpu_model() -> str | None:
    """The CPU's model name (``/proc/cpuinfo``; ``platform.processor()`` elsewhere; None if unknown)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def stamp_rows(rows: Sequence[dict[str, Any]], prov: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The rows with ``prov`` (the run's provenance) written onto each."""
    return [{**row, **prov} for row in rows]


def provenance_line(prov: Mapping[str, Any]) -> str:
    """``recorded 2026-11-24 19:10 UTC, commit abc123, `tiltlab check --layer llm --slow``` (one line)."""
    what = "recorded (not re-run)" if prov.get("source") == "recorded" else "from an earlier run"
    parts = [what]
    if prov.get("run_at"):
        parts.append(str(prov["run_at"]).replace("T", " ").replace("+00:00", " UTC"))
    if prov.get("mode"):
        parts.append(f"mode {prov['mode']}" + (" with slow checks" if prov.get("slow") else ""))
    parts.append(f"commit {prov.get('commit') or 'unknown'}")
    if prov.get("command"):
        parts.append(f"`{prov['command']}`")
    return ", ".join(parts)
