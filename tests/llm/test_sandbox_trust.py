"""llm.sandbox's value crossing, through the code reward: a candidate's subclass of a builtin that lies
(its ``__eq__`` says True, its ordering, ``__abs__``, ``__float__``, ``__round__``... give the expected
answer) is never paid for the lie.

Such a subclass does not cross to the judge as a value (``codec._enc`` sends exact builtin types only,
``tests/llm/test_sandbox.py::test_judged_subclass_with_an_equal_value_does_not_cross_as_the_builtin``); it stays
in the candidate's process and the judge holds a handle (``judge._Remote``) whose ``==`` is identity and which
has no ordering, ``abs``, ``float``, ``round`` or dunder attribute: none of the liar's methods runs in the
judge, and none of them decides a comparison. Each liar holds a WRONG base value, so it is paid only where one
of its overridden methods decided the check; the honest program (the plain right value) must be paid by every
check, so each check is one the tests of a real task could use.

Where the handle does ask the candidate (its operators ``+ - * / // % **`` through ``judge._binop``, ``in``,
``len()`` and method calls), the candidate's own method answers, computed in its process, and its answer is
believed: those checks are marked ``xfail(strict=True)``, so a fix shows as an XPASS that fails the run.
"""

import sys
import warnings

import pytest

if not sys.platform.startswith("linux"):
    pytest.skip("the sandbox targets Linux", allow_module_level=True)

from tiltlab.llm.rewards import resolve_reward

pytestmark = pytest.mark.filterwarnings("ignore::tiltlab.llm.sandbox.SandboxWarning")

#: the overrides of a number's liar: every comparison and conversion says "the expected answer" (4)
_NUM = """
    def __eq__(s, o): return True
    def __ne__(s, o): return False
    __hash__ = {base}.__hash__
    def __lt__(s, o): return True
    __le__ = __gt__ = __ge__ = __lt__
    def __abs__(s): return 4
    def __float__(s): return 4.0
    def __int__(s): return 4
    def __index__(s): return 4
    def __round__(s, n=None): return 4
    def __bool__(s): return True
    def __sub__(s, o): return 0
    __rsub__ = __sub__
    def __truediv__(s, o): return 1.0
    __rtruediv__ = __truediv__
    def __floordiv__(s, o): return 1
    __rfloordiv__ = __floordiv__
    def __mod__(s, o): return 0
    __rmod__ = __mod__
    def __pow__(s, o): return 1
    __rpow__ = __pow__
"""
#: the overrides of a container's or a string's liar (its length is the expected one's, ``{n}``)
_SEQ = """
    def __eq__(s, o): return True
    def __ne__(s, o): return False
    def __lt__(s, o): return True
    __le__ = __gt__ = __ge__ = __lt__
    def __contains__(s, o): return True
    def __len__(s): return {n}
    def __bool__(s): return True
    def startswith(s, *a): return True
    def get(s, *a): return 1
"""
#: base -> (the liar's wrong base value, the right value, the liar's overrides)
BASES = {
    "float": ("0.0", "4.0", _NUM.replace("{base}", "float")),
    "int": ("0", "4", _NUM.replace("{base}", "int")),
    "str": ("'zz'", "'ab'", _SEQ.replace("{n}", "2")),
    "list": ("[9]", "[1, 2]", _SEQ.replace("{n}", "2")),
    "dict": ("{}", "{'a': 1}", _SEQ.replace("{n}", "1")),
}
_NUM_CHECKS = [
    "f(2) == 4",
    "4 == f(2)",
    "not f(2) != 4",
    "4 <= f(2) <= 4",
    "max(f(2), 4) == 4",
    "sorted([f(2), 4]) == [4, 4]",
    "abs(f(2)) == 4",
    "math.isclose(f(2), 4)",
    "round(f(2)) == 4",
    "float(f(2)) == 4",
    "int(f(2)) == 4",
    "f(2) in (4,)",
    "{f(2)} == {4}",
    "[f(2)] == [4]",
    "{'k': f(2)} == {'k': 4}",
    "f(2).__abs__() == 4",  # a dunder name is no attribute of the handle: never the candidate's method
    "f(2).__float__() == 4",
]
#: base -> checks a liar must fail (the honest value passes each)
CHECKS = {
    "float": _NUM_CHECKS,
    "int": _NUM_CHECKS,
    "str": [
        "f(2) == 'ab'",
        "'ab' == f(2)",
        "not f(2) != 'ab'",
        "'ab' <= f(2) <= 'ab'",
        "f(2) in ['ab']",
        "[f(2)] == ['ab']",
        "{f(2): 1} == {'ab': 1}",
        "str(f(2)) == 'ab'",
        "f(2).__eq__('ab') is True",
    ],
    "list": [
        "f(2) == [1, 2]",
        "[1, 2] == f(2)",
        "not f(2) != [1, 2]",
        "[1, 2] <= f(2) <= [1, 2]",
        "f(2) in [[1, 2]]",
        "(f(2),) == ([1, 2],)",
        "list(f(2)) == [1, 2]",
        "set(f(2)) - {1, 2} == set()",
    ],
    "dict": [
        "f(2) == {'a': 1}",
        "{'a': 1} == f(2)",
        "not f(2) != {'a': 1}",
        "[f(2)] == [{'a': 1}]",
        "dict(f(2)) == {'a': 1}",
    ],
}
_ISSUE_54 = (
    "known: issue 54: the handle's operators (judge._binop) are the candidate's own __op__/__rop__, computed in its "
    "process, and the result is believed"
)
_PROTOCOL = (
    "known (reported with issue 54): `in`, len() and method calls on the handle are the candidate's own "
    "__contains__/__len__/methods, computed in its process, and their answers are believed"
)
#: base -> checks a liar IS paid on today
PAID = {
    "float": [
        ("abs(f(2) - 4) < 1e-9", _ISSUE_54),  # __sub__
        ("abs(4 - f(2)) < 1e-9", _ISSUE_54),  # __rsub__
        ("f(2) / 4 == 1", _ISSUE_54),  # __truediv__
        ("4 / f(2) == 1", _ISSUE_54),  # __rtruediv__
        ("f(2) // 4 == 1", _ISSUE_54),  # __floordiv__
        ("f(2) % 4 == 0", _ISSUE_54),  # __mod__
        ("f(2) ** 0 == 1", _ISSUE_54),  # __pow__
    ],
    "str": [("'a' in f(2)", _PROTOCOL), ("len(f(2)) == 2", _PROTOCOL), ("f(2).startswith('a')", _PROTOCOL)],
    "list": [("1 in f(2) and 2 in f(2)", _PROTOCOL), ("len(f(2)) == 2", _PROTOCOL)],
    "dict": [("'a' in f(2)", _PROTOCOL), ("f(2).get('a') == 1", _PROTOCOL)],
}
PAID["int"] = PAID["float"]

_reward = resolve_reward("code")


def _rewards(base: str, check: str) -> tuple[float, float]:
    """(the liar's reward, the honest program's reward) for the tests ``assert <check>``."""
    bad, good, body = BASES[base]
    liar = f"class _L({base}):\n{body}\ndef f(x):\n    return _L({bad})\n"
    honest = f"def f(x):\n    return {good}\n"
    tests = f"import math\nassert {check}\n"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = _reward(
            None, [f"```python\n{liar}```", f"```python\n{honest}```"], tests=[tests] * 2, entry_point=["f"] * 2
        )
    return got[0], got[1]


@pytest.mark.parametrize(("base", "check"), [(b, c) for b, cs in CHECKS.items() for c in cs])
def test_a_lying_subclass_of_a_builtin_is_not_paid(base, check):
    assert _rewards(base, check) == (0.0, 1.0), (base, check, [r.judge_stderr[-300:] for r in _reward.last_results])


@pytest.mark.parametrize(
    ("base", "check"),
    [pytest.param(b, c, marks=pytest.mark.xfail(strict=True, reason=why)) for b, cs in PAID.items() for c, why in cs],
)
def test_a_lying_subclass_is_not_paid_through_what_the_handle_asks_the_candidate(base, check):
    assert _rewards(base, check) == (0.0, 1.0)


#: values that DO cross by value, from the candidate's own class: each arrives as the judge's own kind of object
#: holding the base value (an enum member of a class rebuilt from its members, a namedtuple, a dataclass built
#: from its fields and flags), with none of the candidate's methods: (liar, honest, check[, the tests' prelude])
BY_VALUE = {
    "IntEnum member": (
        "import enum\nclass E(enum.IntEnum):\n    A = 0\n    B = 9\n"
        "    def __eq__(s, o): return True\n    __hash__ = int.__hash__\n"
        "    def __lt__(s, o): return True\n    __le__ = __gt__ = __ge__ = __lt__\n"
        "def f(x):\n    return E.A\n",
        "def f(x):\n    return 4\n",
        "f(2) == 4 and 4 <= f(2) <= 4",
    ),
    "namedtuple-like tuple": (  # its items cross from the tuple itself, not from its __iter__ / __getitem__
        "class P(tuple):\n    _fields = ('x', 'y')\n"
        "    def __eq__(s, o): return True\n    __hash__ = tuple.__hash__\n"
        "    def __iter__(s): return iter((1, 2))\n    def __getitem__(s, i): return (1, 2)[i]\n"
        "def f(x):\n    return P((9, 9))\n",
        "def f(x):\n    return (1, 2)\n",
        "f(2) == (1, 2) and tuple(f(2)) == (1, 2) and f(2)[0] == 1",
    ),
    "dataclass with its own __eq__": (  # dataclass(eq=True) keeps a class's own __eq__; the judge's copy does not
        "import dataclasses\n@dataclasses.dataclass\nclass P:\n    x: int\n"
        "    def __eq__(s, o): return True\n"
        "def f(x):\n    return P(0)\n",
        "import dataclasses\n@dataclasses.dataclass\nclass P:\n    x: int\ndef f(x):\n    return P(4)\n",
        # the tests' own dataclass of that name and fields: the value arrives as one of theirs
        "dataclasses.is_dataclass(f(2)) and f(2) == P(4)",
        "import dataclasses\n@dataclasses.dataclass\nclass P:\n    x: int\n",
    ),
}


@pytest.mark.parametrize("name", list(BY_VALUE))
def test_a_liar_that_crosses_by_value_arrives_with_its_value_and_none_of_its_methods(name):
    liar, honest, check, prelude = (*BY_VALUE[name], "")[:4]
    tests = f"{prelude}assert {check}\n"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = _reward(
            None, [f"```python\n{liar}```", f"```python\n{honest}```"], tests=[tests] * 2, entry_point=["f"] * 2
        )
    assert got == [0.0, 1.0], (name, [r.judge_stderr[-300:] for r in _reward.last_results])
