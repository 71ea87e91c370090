"""llm.base.sandbox's rule for what crosses (docs/code-reward.md, "What crosses and what runs where"), through the code
reward, against the whole operator table: no verdict is decided by a liar's methods.

A *liar* holds a WRONG value and overrides every comparison, operator and conversion to answer what a check wants
(the expected value, 4). Two families:

* a subclass of a type that crosses by value (``float``, ``int``, ``str``, ``list``, ``dict``...): it crosses as
  its base value, read through the base type's own methods, so each check sees the wrong value and fails;
* a plain object (no such base; one whose ``__class__`` claims to be ``float`` too): it stays in the candidate's
  process as a handle, and every operator that would hand the candidate a value of the tests (binary, reflected,
  ordering, ``in``) or answer for a number (unary, ``abs``, ``float``, ``int``, ``round``...) is refused or
  computed by the judge; ``==`` is identity.

Every check is one a real task's tests could use: the honest program (the plain right value) is paid by each,
so a check that the liar fails is a check of the rule, not a check that nothing passes.
"""

import sys
import warnings

import pytest

if not sys.platform.startswith("linux"):
    pytest.skip("the sandbox targets Linux", allow_module_level=True)

from tiltlab.llm.base.rewards import resolve_reward

pytestmark = pytest.mark.filterwarnings("ignore::tiltlab.llm.base.sandbox.SandboxWarning")

#: a number liar's overrides: every comparison, operator and conversion answers as the expected 4 would
_NUM = """
    def __eq__(s, o): return True
    def __ne__(s, o): return False
    def __hash__(s): return hash(4)
    def __lt__(s, o): return o != 4
    def __le__(s, o): return True
    def __gt__(s, o): return o != 4
    def __ge__(s, o): return True
    def __abs__(s): return 4
    def __neg__(s): return -4
    def __pos__(s): return 4
    def __invert__(s): return -5
    def __float__(s): return 4.0
    def __int__(s): return 4
    def __index__(s): return 4
    def __complex__(s): return 4 + 0j
    def __round__(s, n=None): return 4
    def __trunc__(s): return 4
    def __floor__(s): return 4
    def __ceil__(s): return 4
    def __bool__(s): return True
    def __repr__(s): return '4'
    def __str__(s): return '4'
    def __format__(s, spec): return format(4.0, spec)
    def __add__(s, o): return 4 + o
    __radd__ = __add__
    def __sub__(s, o): return 4 - o
    def __rsub__(s, o): return o - 4
    def __mul__(s, o): return 4 * o
    __rmul__ = __mul__
    def __truediv__(s, o): return 4 / o
    def __rtruediv__(s, o): return o / 4
    def __floordiv__(s, o): return 4 // o
    def __rfloordiv__(s, o): return o // 4
    def __mod__(s, o): return 4 % o
    def __rmod__(s, o): return o % 4
    def __pow__(s, o, m=None): return 4 ** o
    def __rpow__(s, o): return o ** 4
    def __divmod__(s, o): return divmod(4, o)
    def __and__(s, o): return 4 & o
    __rand__ = __and__
    def __or__(s, o): return 4 | o
    __ror__ = __or__
    def __xor__(s, o): return 4 ^ o
    __rxor__ = __xor__
    def __lshift__(s, o): return 4 << o
    def __rshift__(s, o): return 4 >> o
"""
#: a container's or a string's liar: it answers as the right value ``{right}`` would, holding another
_SEQ = """
    def __eq__(s, o): return True
    def __ne__(s, o): return False
    def __hash__(s): return hash({right})
    def __lt__(s, o): return False
    def __le__(s, o): return True
    def __gt__(s, o): return False
    def __ge__(s, o): return True
    def __contains__(s, o): return True
    def __len__(s): return len({right})
    def __bool__(s): return True
    def __iter__(s): return iter({right})
    def __getitem__(s, k): return {right}[k]
    def __repr__(s): return repr({right})
    def __str__(s): return str({right})
    def __add__(s, o): return {right} + o
    def __radd__(s, o): return o + {right}
    def __mul__(s, o): return {right} * o
    def __or__(s, o): return {right} | o
    def __and__(s, o): return {right} & o
    def __sub__(s, o): return {right} - o
    def __mod__(s, o): return {right} % o
    def startswith(s, *a): return {right}.startswith(*a)
    def upper(s): return {right}.upper()
    def get(s, *a): return {right}.get(*a)
    def keys(s): return {right}.keys()
    def items(s): return {right}.items()
    def count(s, x): return {right}.count(x)
    def index(s, x): return {right}.index(x)
"""
#: base -> (the liar's wrong base value, the right value, the liar's overrides)
BASES = {
    "float": ("3.0", "4.0", _NUM),
    "int": ("3", "4", _NUM),
    "str": ("'zzz'", "'ab'", _SEQ.replace("{right}", "'ab'")),
    "list": ("[9]", "[1, 2]", _SEQ.replace("{right}", "[1, 2]")),
    "tuple": ("(9,)", "(1, 2)", _SEQ.replace("{right}", "(1, 2)")),
    "dict": ("{'z': 9, 'y': 8}", "{'a': 1}", _SEQ.replace("{right}", "{'a': 1}")),
    "set": ("{9}", "{1, 2}", _SEQ.replace("{right}", "{1, 2}")),
    "collections.Counter": (
        "{'z': 9, 'y': 8, 'x': 7}",
        "collections.Counter('aab')",
        _SEQ.replace("{right}", "collections.Counter('aab')"),
    ),
}
_NUM_CHECKS = [
    # comparisons, and what uses them
    "f(2) == 4",
    "4 == f(2)",
    "not f(2) != 4",
    "4 <= f(2) <= 4",
    "f(2) > 3.5",
    "min(f(2), 4) == 4",
    "max(f(2), 5) == 5 and max(4, f(2)) == 4 and sorted([5, f(2)])[0] == 4",
    "sorted([f(2), 4]) == [4, 4]",
    "f(2) in (4,)",
    "f(2) in {4}",
    "{f(2)} == {4}",
    "[f(2)] == [4]",
    "{'k': f(2)} == {'k': 4}",
    "math.isclose(f(2), 4)",
    "hash(f(2)) == hash(4) and f(2) == 4",
    # binary and reflected operators
    "abs(f(2) - 4) < 1e-9",
    "abs(4 - f(2)) < 1e-9",
    "f(2) + 1 == 5",
    "1 + f(2) == 5",
    "sum([f(2), 1]) == 5",
    "f(2) * 2 == 8",
    "2 * f(2) == 8",
    "f(2) / 4 == 1",
    "4 / f(2) == 1",
    "f(2) // 4 == 1",
    "9 // f(2) == 2",
    "f(2) % 3 == 1",
    "9 % f(2) == 1",
    "f(2) ** 2 == 16",
    "2 ** f(2) == 16",
    "divmod(f(2), 3) == (1, 1)",
    "pow(f(2), 2) == 16",
    # unary operators and numeric conversions
    "-f(2) == -4",
    "+f(2) == 4",
    "abs(f(2)) == 4",
    "float(f(2)) == 4",
    "int(f(2)) == 4",
    "complex(f(2)) == 4",
    "round(f(2)) == 4",
    "math.trunc(f(2)) == 4 and math.floor(f(2)) == 4 and math.ceil(f(2)) == 4",
    "math.sqrt(f(2)) == 2",
    # conversions to text
    "str(f(2)) in ('4', '4.0')",
    "repr(f(2)) in ('4', '4.0')",
    "f'{f(2)}' in ('4', '4.0')",
    "format(f(2), '.1f') == '4.0'",
    "'%.1f' % f(2) == '4.0'",
    # dunder names are no attributes of a handle, and no method of a crossed value is the candidate's
    "f(2).__abs__() == 4",
    "f(2).__float__() == 4",
    "f(2).__eq__(4) is True",
]
_INT_CHECKS = [
    "f(2) & 4 == 4",
    "f(2) | 4 == 4",
    "f(2) ^ 4 == 0",
    "f(2) << 1 == 8",
    "f(2) >> 2 == 1",
    "~f(2) == -5",
    "[0, 1, 2, 3, 4][f(2)] == 4",
    "range(10)[f(2)] == 4",
    "bin(f(2)) == '0b100'",
    "hex(f(2)) == '0x4'",
]


def _seq_checks(right: str) -> list[str]:
    "The checks a container's or a string's liar must fail (each passes for the right value)."
    checks = [
        f"f(2) == {right}",
        f"{right} == f(2)",
        f"not f(2) != {right}",
        f"f(2) in [{right}]",
        f"[f(2)] == [{right}]",
        f"(f(2),) == ({right},)",
        f"len(f(2)) == len({right})",
        f"bool(f(2)) and len(f(2)) == len({right})",
        f"list(f(2)) == list({right})",
        f"sorted(f(2)) == sorted({right})",
        f"[*f(2)] == [*{right}]",
        f"str(f(2)) == str({right})",
        f"repr(f(2)) == repr({right})",
        f"f'{{f(2)}}' == str({right})",
        f"hash(f(2)) == hash({right}) if isinstance({right}, (str, tuple)) else f(2) == {right}",
        f"f(2).__eq__({right}) is True",
        f"all(x in f(2) for x in {right})",
    ]
    if ("{" not in right and "Counter" not in right) or right.startswith("{1"):  # ordered (a set: by inclusion)
        checks.append(f"{right} <= f(2) <= {right}")
    return checks


CHECKS = {
    "float": _NUM_CHECKS,
    "int": _NUM_CHECKS + _INT_CHECKS,
    "str": [
        *_seq_checks("'ab'"),
        "'a' in f(2)",
        "f(2).startswith('a')",
        "f(2).upper() == 'AB'",
        "f(2)[0] == 'a'",
        "f(2) + 'c' == 'abc'",
        "'c' + f(2) == 'cab'",
        "f(2) * 2 == 'abab'",
        "f(2).count('a') == 1",
        "'%s' % f(2) == 'ab'",
        "{f(2): 1} == {'ab': 1}",
    ],
    "list": [
        *_seq_checks("[1, 2]"),
        "1 in f(2) and 2 in f(2)",
        "f(2)[0] == 1 and f(2)[-1] == 2",
        "f(2) + [3] == [1, 2, 3]",
        "[0] + f(2) == [0, 1, 2]",
        "f(2) * 2 == [1, 2, 1, 2]",
        "sum(f(2)) == 3",
        "f(2).index(2) == 1",
        "set(f(2)) - {1, 2} == set() and len(set(f(2))) == 2",
    ],
    "tuple": [*_seq_checks("(1, 2)"), "f(2)[1] == 2", "f(2) + (3,) == (1, 2, 3)", "{f(2): 1} == {(1, 2): 1}"],
    "dict": [
        *_seq_checks("{'a': 1}"),
        "'a' in f(2)",
        "f(2)['a'] == 1",
        "f(2).get('a') == 1",
        "dict(f(2)) == {'a': 1}",
        "list(f(2).keys()) == ['a']",
        "list(f(2).items()) == [('a', 1)]",
        "f(2) | {} == {'a': 1}",
    ],
    "set": [
        *_seq_checks("{1, 2}"),
        "1 in f(2)",
        "f(2) | {3} == {1, 2, 3}",
        "f(2) & {1} == {1}",
        "f(2) - {1} == {2}",
        "frozenset(f(2)) == {1, 2}",
    ],
    "collections.Counter": [
        *_seq_checks("collections.Counter('aab')"),
        "f(2)['a'] == 2",
        "f(2).get('a') == 2",
        "f(2) == {'a': 2, 'b': 1}",
        "dict(f(2)) == {'a': 2, 'b': 1}",
    ],
}

_reward = resolve_reward("code")


def _batch(liar: str, honest: str, checks: list[str], prelude: str = "") -> list[tuple[str, float, float]]:
    """(check, the liar's reward, the honest program's reward) for ``assert <check>``, in one batch.

    The liar runs once per check (each check decides its own reward); the honest program once with every
    check (it must pass them all), and once per check only when that run fails, to name the failing ones."""
    head = f"import collections, math\n{prelude}"
    tests = [f"{head}assert {c}\n" for c in checks]
    codes = [f"```python\n{liar}```" for _ in checks] + [f"```python\n{honest}```"]
    every = head + "".join(f"assert {c}\n" for c in checks)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = _reward(None, codes, tests=[*tests, every], entry_point=["f"] * len(codes))
        n = len(checks)
        fair = [got[n]] * n
        if got[n] != 1.0:
            fair = _reward(None, [f"```python\n{honest}```"] * n, tests=tests, entry_point=["f"] * n)
    return [(c, got[i], fair[i]) for i, c in enumerate(checks)]


def _wrong(rows):
    return [r for r in rows if r[1:] != (0.0, 1.0)]


@pytest.mark.parametrize("base", list(CHECKS))
def test_a_lying_subclass_of_a_type_that_crosses_by_value_is_never_paid(base):
    bad, good, body = BASES[base]
    liar = f"import collections\nclass _L({base}):\n{body}\ndef f(x):\n    return _L({bad})\n"
    honest = f"import collections\ndef f(x):\n    return {good}\n"
    rows = _batch(liar, honest, CHECKS[base])
    assert not _wrong(rows), _wrong(rows)  # (check, liar's reward, honest reward) where it is not (0.0, 1.0)


#: a plain object (no base that crosses), and one whose __class__ says float: handles, both
PLAIN_LIARS = {
    "plain object": "class _L:\n{body}\ndef f(x):\n    return _L()\n",
    "__class__ says float": "class _L:\n    __class__ = property(lambda s: float)\n{body}\ndef f(x):\n    return _L()\n",
    # a float subclass's instance whose __class__ is then set to the liar's (CPython allows it only between
    # compatible layouts, so it stays a float subclass with the liar's methods, or the liar itself)
    "__class__ reassigned": (
        "class _L(float):\n{body}\nclass _P:\n{body}\ndef f(x):\n    o = _L(3.0)\n    try:\n"
        "        o.__class__ = _P\n    except TypeError:\n        o = _P()\n    return o\n"
    ),
}
#: what a handle of a plain object refuses or computes in the judge: a liar's every answer is ignored. Not here,
#: by the rule: str/repr/format(''), bool, len and iteration of a plain object ARE its own (there is no other
#: value to lie about; tests/llm/base/sandbox/programs/test_judge.py::test_judged_protocols_of_returned_objects)
_HANDLE_CHECKS = [c for c in _NUM_CHECKS if not c.startswith(("str(", "repr(", "f'", "'%.1f'"))] + [
    "f(2) in [4] and 4 in [f(2)]",
]


@pytest.mark.parametrize("name", list(PLAIN_LIARS))
def test_a_lying_plain_object_is_never_paid(name):
    liar = PLAIN_LIARS[name].replace(
        "{body}", _NUM + "    def __contains__(s, o): return True\n    def __iter__(s): return iter(())\n"
    )
    rows = _batch(liar, "def f(x):\n    return 4\n", _HANDLE_CHECKS)
    # `in` on the object: the judge searches its items (none), the liar's __contains__ is not asked
    rows += _batch(liar, "def f(x):\n    return [4]\n", ["4 in f(2)", "not 5 in f(2) and 4 in f(2)"])
    assert not _wrong(rows), _wrong(rows)


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


_NODE = (
    "class Node:\n    def __init__(self, val):\n        self.val = val\n"
    "    def equals(self, other):\n        return self.val == other.val\n"
)
#: the prompt's class crosses by value; an instance attribute that shadows its method would make the tests
#: call the candidate's function: (liar, honest, tests)
SHADOWS = {
    "a returned instance": (
        "def f(x):\n    n = Node(0)\n    n.equals = lambda other: True\n    return n\n",
        "def f(x):\n    return Node(x)\n",
        "assert f(1).equals(Node(1))\n",
    ),
    "an argument changed in place": (
        "def f(n):\n    n.equals = lambda other: True\n",
        "def f(n):\n    n.val = 1\n",
        "n = Node(0)\nf(n)\nassert n.equals(Node(1))\n",
    ),
    "a neighbour of a returned instance": (
        "def f(x):\n    n = Node(x)\n    n.next = Node(0)\n    n.next.equals = lambda other: True\n    return n\n",
        "def f(x):\n    n = Node(x)\n    n.next = Node(x)\n    return n\n",
        "assert f(1).next.equals(Node(1))\n",
    ),
}


@pytest.mark.parametrize("name", list(SHADOWS))
def test_an_attribute_that_shadows_a_method_of_the_prompts_class_never_crosses(name):
    liar, honest, tests = SHADOWS[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = _reward(
            None,
            [f"```python\n{liar}```", f"```python\n{honest}```"],
            tests=[tests] * 2,
            entry_point=["f"] * 2,
            code_prefix=[_NODE + "def f(x):\n    pass\n"] * 2,
        )
    assert got == [0.0, 1.0], (name, [r.judge_stderr[-300:] for r in _reward.last_results])
