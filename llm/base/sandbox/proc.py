"""Process plumbing shared by the candidate's runs and the judge server: environment, pipes, memory files."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys


def _env(home: str) -> dict:
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": home,
        "LANG": "C.UTF-8",
        "TMPDIR": home,
        # one BLAS/OpenMP thread: keeps numeric libraries inside RLIMIT_AS and the CPU budget
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def _read_memfd(fd: int, cap: int) -> tuple[str, bool]:
    size = os.fstat(fd).st_size
    data = os.pread(fd, cap, 0)
    return data.decode("utf-8", errors="replace"), size >= cap


def _write_all(fd: int, data: bytes) -> None:
    with contextlib.suppress(OSError):
        with os.fdopen(fd, "wb", closefd=True) as f:
            f.write(data)
        return
    with contextlib.suppress(OSError):
        os.close(fd)


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _site_dirs(python: str) -> list[str] | None:
    """The site-packages directories of ``python`` when it is this interpreter (it then starts with
    ``-S`` and gets them on ``sys.path`` directly: processing every ``.pth`` file of a large
    environment costs more CPU than the rest of a run), else None (a normal start)."""
    if os.path.realpath(python) != os.path.realpath(sys.executable):
        return None
    return [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")]
