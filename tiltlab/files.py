"""Atomic file writes: a reader, or a run that dies while writing, sees the old file or the new one, never
half of one.

Every writer here writes a temporary file in the target's own folder (so the final step is a rename on one
file system), optionally ``fsync``s it, and moves it over the target with ``os.replace``; on any failure the
temporary file is removed and the target is left as it was. The temporary file is created with ``open(...,
"x")``, so it gets the permissions the process's umask gives a new file (as a plain ``open`` would), and its
name keeps the target's suffix, so writers that choose a format by suffix (``.parquet`` / ``.jsonl``, ``.png``)
pick the right one.

- :func:`atomic_path`: a context manager yielding the temporary path, for writers that take a path
  (``torch.save``, ``safetensors.torch.save_file``, ``fig.savefig``, ``pyarrow.parquet.write_table``);
- :func:`write_bytes`, :func:`write_text`, :func:`write_json`, :func:`write_parquet` on top of it.

``fsync=True`` also flushes the file to disk before the rename (data a resumable pipeline must not lose
on a power cut, e.g. Stage 1's outputs); the default skips it (caches, reports).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["atomic_path", "write_bytes", "write_json", "write_parquet", "write_text"]


def _temporary_name(path: Path) -> Path:
    return path.with_name(f".{path.stem}.tmp-{os.getpid()}-{secrets.token_hex(4)}{path.suffix}")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], *, fsync: bool = False, mkdir: bool = True) -> Iterator[Path]:
    """Yield a new, empty temporary file's path next to ``path``; when the block ends without an exception the
    file (which the block wrote) replaces ``path``, otherwise it is removed and ``path`` is untouched.

    ``mkdir``: create ``path``'s folder first. ``fsync``: flush the written file to disk before the rename."""
    path = Path(path)
    if mkdir:
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary_name(path)
    with open(tmp, "xb"):  # reserve the name (fails rather than overwrite); permissions follow the umask
        pass
    try:
        yield tmp
        if fsync:
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _write(path: str | os.PathLike[str], data: bytes, fsync: bool) -> None:
    with atomic_path(path, fsync=fsync) as tmp, open(tmp, "wb") as fh:
        fh.write(data)


def write_bytes(path: str | os.PathLike[str], data: bytes, *, fsync: bool = False) -> None:
    """Write ``data`` to ``path`` atomically."""
    _write(path, bytes(data), fsync)


def write_text(path: str | os.PathLike[str], text: str, *, fsync: bool = False) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    _write(path, text.encode("utf-8"), fsync)


def write_json(
    path: str | os.PathLike[str],
    obj: Any,
    *,
    indent: int | None = 1,
    sort_keys: bool = False,
    default: Callable[[Any], Any] | None = None,
    newline: bool = True,
    fsync: bool = False,
) -> None:
    """Write ``json.dumps(obj, indent=indent, sort_keys=sort_keys, default=default)`` (plus a final newline
    unless ``newline=False``) to ``path`` atomically."""
    text = json.dumps(obj, indent=indent, sort_keys=sort_keys, default=default)
    write_text(path, text + ("\n" if newline else ""), fsync=fsync)


def write_parquet(path: str | os.PathLike[str], table: Any, *, fsync: bool = False) -> None:
    """Write a ``pyarrow.Table`` to ``path`` atomically (``pyarrow.parquet.write_table``)."""
    import pyarrow.parquet as pq  # type: ignore[import-untyped]  # pyarrow ships no type information

    with atomic_path(path, fsync=fsync) as tmp:
        pq.write_table(table, tmp)
