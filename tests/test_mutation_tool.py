"""`.ci/mutate.py` finds the mutants its docstring lists, and only those (a mutation tool that misses an
operator class reports a kill rate for mutants it never made)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tool():
    spec = importlib.util.spec_from_file_location("mutate_tool", ROOT / ".ci" / "mutate.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["mutate_tool"] = mod
    spec.loader.exec_module(mod)
    return mod


SRC = '''\
def f(x, y, flag=True):
    """A docstring is never mutated: -1 == 0."""
    if x.recorded == y.derived and not flag:
        return -x.margin, x[-1], x[0]
    z = t.repeat_interleave(2)
    return any([x < y, x is None]), g(x, scale=2 * y)
'''


def test_every_operator_class_and_its_exact_rewrite(tmp_path):
    tool = _tool()
    path = tmp_path / "m.py"
    path.write_text(SRC, encoding="utf-8")
    got = {(m.op, m.before, m.after) for m in tool.find_mutants(path, tmp_path)}
    want = {
        ("selfcmp", "x.recorded == y.derived", "x.recorded == x.recorded"),
        ("selfcmp", "x.recorded == y.derived", "y.derived == y.derived"),
        ("compare", "x.recorded == y.derived", "x.recorded != y.derived"),
        ("sign", "-x.margin", "(x.margin)"),
        ("index", "-1", "0"),
        ("index", "0", "-1"),
        ("repeat", "t.repeat_interleave(2)", "t.repeat(2)"),
        ("any_all", "any([x < y, x is None])", "all([x < y, x is None])"),
        ("compare", "x < y", "x <= y"),
        ("compare", "x is None", "x is not None"),
        ("boolop", "x.recorded == y.derived and not flag", "x.recorded == y.derived or not flag"),
        ("not", "not flag", "(flag)"),
        ("kwarg", "g(x, scale=2 * y)", "g(x)"),
        ("arith", "2 * y", "(2 / y)"),
        ("const", "2", "4"),
        ("default", "True", "False"),
    }
    assert want <= got, sorted(want - got)
    # a literal on either side gets no self-comparison; the index -1 is no sign flip; docstrings stay
    assert not any(op == "selfcmp" and "None" in before for op, before, _ in got)
    assert not any(op == "sign" and before == "-1" for op, before, _ in got)
    assert not any("docstring" in before for _, before, _ in got)
    # each mutant applied changes exactly its own span
    for m in tool.find_mutants(path, tmp_path):
        out = tool.apply(SRC, m).splitlines()
        src = SRC.splitlines()
        (l0, c0), (l1, _) = m.start, m.end
        assert out[: l0 - 1] == src[: l0 - 1] and out[len(out) - (len(src) - l1) :] == src[l1:], m
        assert out[l0 - 1][:c0] == src[l0 - 1][:c0] and out[l0 - 1][c0:].startswith(m.after), m


def test_every_module_and_test_a_mutation_map_names_exists():
    """The mutation maps (.ci/mutation_*map.txt) name files of this checkout: a module moved or split without
    its map entry would leave its mutants untested (found at 65502a4: four modules that had become packages)."""
    root = ROOT
    missing = []
    for path in sorted((root / ".ci").glob("mutation_*map.txt")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if " | " not in line or line.startswith("#"):
                continue
            module, tests = line.split(" | ", 1)
            missing += [f"{path.name}: {p}" for p in (module, *tests.split()) if not (root / p).exists()]
    assert not missing, missing
