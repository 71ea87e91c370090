"""``tiltlab.files``: the one atomic writer (text, bytes, JSON, Parquet, and a temporary path for other writers)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from tiltlab import files


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_write_text_bytes_json_replace_the_file_and_leave_no_temporary(tmp_path):
    p = tmp_path / "a.txt"
    p.write_text("old")
    files.write_text(p, "new é\n")
    assert p.read_bytes() == "new é\n".encode()
    files.write_bytes(p, b"\x00\x01")
    assert p.read_bytes() == b"\x00\x01"
    j = tmp_path / "r.json"
    files.write_json(j, {"b": 1, "a": [1.5]})
    assert j.read_text() == '{\n "b": 1,\n "a": [\n  1.5\n ]\n}\n'
    files.write_json(j, {"b": 1, "a": 2}, indent=2, sort_keys=True, newline=False)
    assert j.read_text() == json.dumps({"a": 2, "b": 1}, indent=2)
    files.write_json(j, {"p": Path("x")}, default=str, indent=None)
    assert j.read_text() == '{"p": "x"}\n'
    assert _leftovers(tmp_path) == []


def test_a_failed_write_keeps_the_old_file_and_removes_the_temporary(tmp_path):
    p = tmp_path / "keep.json"
    files.write_json(p, {"v": 1})
    before = p.read_bytes()
    with pytest.raises(TypeError):
        files.write_json(p, {"v": object()})  # not serialisable: fails before anything is written
    with pytest.raises(RuntimeError, match="writer died"), files.atomic_path(p) as tmp:
        tmp.write_text('{"v": 2')  # half written, then the writer fails
        raise RuntimeError("writer died")
    assert p.read_bytes() == before
    assert _leftovers(tmp_path) == []


def test_atomic_path_keeps_the_suffix_creates_the_folder_and_follows_the_umask(tmp_path):
    target = tmp_path / "deep" / "er" / "rows.parquet"
    old = os.umask(0o027)
    try:
        with files.atomic_path(target) as tmp:
            assert tmp.parent == target.parent and tmp.suffix == ".parquet" and tmp.name.startswith(".rows.")
            assert tmp.exists() and tmp.stat().st_size == 0  # reserved, empty
            tmp.write_bytes(b"x")
            assert not target.exists()  # nothing at the target until the block ends
    finally:
        os.umask(old)
    assert target.read_bytes() == b"x"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640  # 0o666 & ~0o027, as a plain open() would give
    with pytest.raises(FileNotFoundError), files.atomic_path(tmp_path / "missing" / "f.txt", mkdir=False):
        pass


def test_two_temporaries_for_one_target_never_collide(tmp_path):
    target = tmp_path / "t.bin"
    with files.atomic_path(target) as a, files.atomic_path(target) as b:
        assert a != b
        a.write_bytes(b"a")
        b.write_bytes(b"b")
    assert target.read_bytes() == b"a"  # the outer block ends last and wins
    assert _leftovers(tmp_path) == []


def test_fsync_is_called_on_the_temporary_before_the_rename(tmp_path, monkeypatch):
    seen: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (seen.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (seen.append("replace"), real_replace(a, b))[1])
    files.write_text(tmp_path / "f.txt", "x", fsync=True)
    assert seen == ["fsync", "replace"]
    seen.clear()
    files.write_text(tmp_path / "f.txt", "y")
    assert seen == ["replace"]


def test_write_parquet_round_trips(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.table({"a": [1, 2], "b": ["x", "y"]})
    files.write_parquet(tmp_path / "t.parquet", table, fsync=True)
    assert pq.read_table(tmp_path / "t.parquet").equals(table)
    assert _leftovers(tmp_path) == []


def test_atomic_path_never_reuses_an_existing_file_as_its_temporary(tmp_path, monkeypatch):
    """The temporary name is reserved with an exclusive create: a file already there (another writer's
    temporary) is refused, not truncated."""
    monkeypatch.setattr(files.secrets, "token_hex", lambda n: "fixed")
    target = tmp_path / "t.txt"
    other = files._temporary_name(target)
    other.write_text("someone else's half-written file")
    with pytest.raises(FileExistsError), files.atomic_path(target):
        pass
    assert other.read_text() == "someone else's half-written file" and not target.exists()


# ---------------------------------------------------------------- staging folders


def test_staging_dir_is_removed_however_the_block_ends_and_leaves_no_empty_folder(tmp_path):
    out = tmp_path / "a" / "b" / "out"
    with pytest.raises(KeyboardInterrupt), files.staging_dir(out) as tmp:
        assert tmp.parent == out.parent and tmp.name.startswith(f".out.partial-{os.getpid()}-")
        (tmp / "half.txt").write_text("x")
        out.mkdir()  # made by the run, still empty when it fails
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []  # no staging folder, no empty out, nor the parents made for it
    existing = tmp_path / "kept"
    existing.mkdir()
    with pytest.raises(RuntimeError), files.staging_dir(existing) as tmp:
        raise RuntimeError
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]  # an empty folder that was there stays
    with files.staging_dir(out) as tmp:
        (tmp / "f.txt").write_text("done")
        out.mkdir()
        os.replace(tmp / "f.txt", out / "f.txt")
    assert [p.name for p in out.parent.iterdir()] == ["out"] and (out / "f.txt").read_text() == "done"


def test_remove_folders_in_use_removes_what_removed_after_holds(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    with files.removed_after(a):
        (a / "x").write_text("x")
        files.remove_folders_in_use()  # what the process ending at once does
        assert not a.exists() and b.exists()
    files.remove_folders_in_use()
    assert b.exists()  # never held
