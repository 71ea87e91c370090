"""The suite's scheduling hint: the longest recorded files first, every test kept, each file in its order."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

import pytest

from tests.conftest import file_order

ROOT = Path(__file__).resolve().parents[1]


def test_longest_files_first_each_file_in_its_own_order():
    ids = ["a.py::t1", "a.py::t2", "b.py::t1", "c.py::t1", "c.py::t2", "d.py::t1"]
    order = [ids[i] for i in file_order(ids, {"c.py": 9.0, "b.py": 3.0, "a.py": 3.0})]
    # c (9 s), then a and b (3 s each: collection order), then d (unrecorded)
    assert order == ["c.py::t1", "c.py::t2", "a.py::t1", "a.py::t2", "b.py::t1", "d.py::t1"]
    assert [ids[i] for i in file_order(ids, {})] == ids  # no record: collection order
    ids2 = ["x.py::t[1]", "y.py::t", "x.py::t[2]"]  # a file's tests need not be adjacent: they stay in order
    assert [ids2[i] for i in file_order(ids2, {"y.py": 1.0})] == ["y.py::t", "x.py::t[1]", "x.py::t[2]"]


def _durations():
    spec = importlib.util.spec_from_file_location("ci_durations", ROOT / ".ci" / "durations.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_durations_per_file_from_a_junit_report(tmp_path):
    junit = tmp_path / "j.xml"
    junit.write_text(
        textwrap.dedent(
            """\
            <testsuites><testsuite name="pytest">
            <testcase classname="tests.a" name="t1" file="tests/a.py" time="1.25"/>
            <testcase classname="tests.b" name="t1" file="tests/b.py" time="4.0"/>
            <testcase classname="tests.a" name="t2" file="tests/a.py" time="0.5"><skipped/></testcase>
            </testsuite></testsuites>
            """
        )
    )
    mod = _durations()
    assert mod.file_seconds(junit) == {"tests/b.py": 4.0, "tests/a.py": 1.8}  # 1.25 + 0.5, rounded
    out = tmp_path / "d.json"
    assert mod.main([str(junit), "--out", str(out)]) == 0
    import json

    assert json.loads(out.read_text())["seconds"] == {"tests/b.py": 4.0, "tests/a.py": 1.8}
    (tmp_path / "no_file.xml").write_text('<testsuite><testcase classname="a" name="t" time="1"/></testsuite>')
    with pytest.raises(ValueError, match="junit_family=xunit1"):
        mod.file_seconds(tmp_path / "no_file.xml")
    assert mod.main([str(tmp_path / "missing.xml"), "--out", str(out)]) == 2


def test_the_record_names_files_of_this_suite():
    import json

    rec = ROOT / "tests" / "durations.json"
    seconds = json.loads(rec.read_text())["seconds"]
    assert seconds and all(v >= 0 for v in seconds.values())
    stale = [f for f in seconds if not (ROOT / f).is_file()]
    assert len(stale) <= len(seconds) // 10, f"tests/durations.json names files that are gone: {stale[:5]}"
