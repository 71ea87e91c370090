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
- :func:`write_bytes`, :func:`write_text`, :func:`write_json`, :func:`write_parquet` on top of it;
- :func:`staging_dir`: the same for a whole folder of outputs (a run writes into a temporary folder next to its
  output folder and moves the finished files into place), removing the staging folders earlier killed runs left.

``fsync=True`` also flushes the file to disk before the rename (data a resumable pipeline must not lose
on a power cut, e.g. Stage 1's outputs); the default skips it (caches, reports).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "atomic_path",
    "remove_folders_in_use",
    "remove_stale_staging_dirs",
    "removed_after",
    "staging_dir",
    "write_bytes",
    "write_json",
    "write_parquet",
    "write_text",
]


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


# ---------------------------------------------------------------- folders

#: The temporary folders this process is using (:func:`removed_after`): what :func:`remove_folders_in_use` removes
#: when the process must end at once, without running its ``finally`` blocks (:mod:`tiltlab.interrupts`).
_IN_USE: set[Path] = set()


@contextlib.contextmanager
def removed_after(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Remove the folder ``path`` when the ``with`` block ends, however it ends: also when the process must end
    at once inside the block, or while the folder is being removed (:func:`remove_folders_in_use`)."""
    path = Path(path)
    _IN_USE.add(path)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        _IN_USE.discard(path)


def remove_folders_in_use() -> None:
    """Remove every folder a :func:`removed_after` block holds now (errors ignored: the process is ending)."""
    for path in list(_IN_USE):
        shutil.rmtree(path, ignore_errors=True)


def _partial_prefix(out: Path) -> str:
    return f".{out.name}.partial-"


def _is_stale(path: Path, prefix: str) -> bool:
    """Whether the staging folder ``path`` belongs to no running process: its process id (the number after
    ``prefix``) names no process, or names this one and the folder is not in use; a name without one is an
    earlier version's."""
    m = re.match(r"(\d+)-", path.name[len(prefix) :])
    if m is None:
        return True
    pid = int(m.group(1))
    if pid == os.getpid():
        return not any(p.name == path.name and p.parent.resolve() == path.parent.resolve() for p in _IN_USE)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's process
        return False
    return False


def remove_stale_staging_dirs(out: str | os.PathLike[str]) -> list[Path]:
    """Remove the staging folders of ``out`` (:func:`staging_dir`) whose run is no longer running (it was killed
    before it could remove its own); returns them."""
    out = Path(out)
    prefix = _partial_prefix(out)
    stale = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(out.parent):
            path = Path(entry.path)
            if entry.name.startswith(prefix) and entry.is_dir(follow_symlinks=False) and _is_stale(path, prefix):
                shutil.rmtree(path, ignore_errors=True)
                stale.append(path)
    return stale


def _make_dirs(path: Path) -> list[Path]:
    """Create ``path`` with its missing parents; the folders made, innermost first."""
    made = []
    p = path
    while not p.exists() and p != p.parent:
        made.append(p)
        p = p.parent
    path.mkdir(parents=True, exist_ok=True)
    return made


def _remove_empty(folders: list[Path]) -> None:
    """Remove each of ``folders`` (innermost first) while it is empty."""
    for d in folders:
        if not d.exists():
            continue
        try:
            d.rmdir()
        except OSError:  # not empty: its parents are not empty either
            return


@contextlib.contextmanager
def staging_dir(out: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a new, empty folder ``.<name>.partial-<pid>-<random>`` next to the output folder ``out``, for a run
    that writes what goes into ``out`` there and moves the finished outputs into ``out`` at its end; the folder
    is removed when the block ends, however it ends, so an interrupted or failed run leaves ``out`` as it was.

    First the staging folders of ``out`` that earlier runs left (killed before they could remove their own) are
    removed (:func:`remove_stale_staging_dirs`). ``out`` when it did not exist, and the parents this made for the
    staging folder, are removed again when they are empty at the end: a failed run leaves no empty folder."""
    out = Path(out)
    existed = out.exists()
    made = _make_dirs(out.parent)
    remove_stale_staging_dirs(out)
    tmp = Path(tempfile.mkdtemp(prefix=f"{_partial_prefix(out)}{os.getpid()}-", dir=out.parent))
    try:
        with removed_after(tmp):
            yield tmp
    finally:
        _remove_empty(([] if existed else [out]) + made)
