"""llm/base/sandbox/programs/judge.py through ``run_judged``: the judge's channel, what crosses (exact builtins,
subclasses, generators, instances, enums, handles) and the tests' namespace."""

import sys

import pytest

if not sys.platform.startswith("linux"):
    pytest.skip("the sandbox targets Linux (rlimits, namespaces)", allow_module_level=True)

from tests.llm.base.sandbox._helpers import FAST
from tiltlab.llm.base.sandbox import SandboxConfig, run_judged, run_many_judged

pytestmark = pytest.mark.filterwarnings("ignore::tiltlab.llm.base.sandbox.SandboxWarning")


# ---------------------------------------------------------------------------------------------
# run_judged: the judge's channel and the wire format
# ---------------------------------------------------------------------------------------------


def test_judged_pass_and_fail():
    assert run_judged("def f(x):\n    return 2 * x\n", "assert f(2) == 4", FAST).passed
    r = run_judged("def f(x):\n    return 0\n", "assert f(2) == 4", FAST)
    assert not r.passed and r.status == "failed" and "AssertionError" in r.judge_stderr


@pytest.mark.parametrize(
    "ret,test,ok",
    [
        ("[1, 2]", "assert f() == [1, 2]", True),
        ("[1, 2]", "assert f() == (1, 2)", False),  # list != tuple, as in Python
        ("(1, 'a', None, 2.5, b'x', 1j)", "assert f() == (1, 'a', None, 2.5, b'x', 1j)", True),
        ("{(1, 2): {3}, 'k': frozenset([4])}", "assert f() == {(1, 2): {3}, 'k': frozenset([4])}", True),
        ("True", "assert f() is True", True),
        ("type('I', (int,), {'__eq__': lambda s, o: True})(0)", "assert f() == 4", False),
        ("type('S', (str,), {})('4')", "assert f() == '4' and type(f()) is str", True),  # a subclass: its base value
        ("type('A', (), {'__eq__': lambda s, o: True})()", "assert f() == 4", False),
        # residual, by design: comparisons are Python's own between plain values (1 == 1.0 == True),
        # and the truth value of a non-plain result is its bool() computed in the sandbox, as in one
        # process; neither gives more than `return 1` / `return True` would
        ("1.0", "assert f() == 1", True),
        ("type('L', (), {'__len__': lambda s: 1})()", "assert f()", True),
        ("type('L', (), {'__len__': lambda s: 0})()", "assert f()", False),
        ("object()", "assert f()", True),
    ],
)
def test_judged_values_cross_as_exact_builtins(ret, test, ok):
    assert run_judged(f"def f():\n    return {ret}\n", test, FAST).passed is ok


# a subclass of each type that crosses by value, holding a value EQUAL to the plain one: it crosses as that
# base value, an exact instance of the base type (none of the subclass's methods cross); the last column is
# a test of its content. (Each liar of tests/llm/base/sandbox/test_trust.py holds a DIFFERENT value and earns 0.)
_SUB = "import collections, decimal, fractions\n"
_EXACT_TYPE_CASES = [
    ("type('L', (list,), {})([1, 2])", "[1, 2]", "assert list(f()) == [1, 2]"),
    ("type('T', (tuple,), {})((1, 2))", "(1, 2)", "assert tuple(f()) == (1, 2)"),
    ("type('D', (dict,), {})({'a': 1})", "{'a': 1}", "assert f()['a'] == 1"),
    ("type('S', (set,), {})({1, 2})", "{1, 2}", "assert sorted(f()) == [1, 2]"),
    ("type('FS', (frozenset,), {})({1, 2})", "frozenset({1, 2})", "assert len(f()) == 2"),
    ("type('I', (int,), {})(3)", "3", "assert f() is not None"),
    ("type('S', (str,), {})('ab')", "'ab'", "assert len(f()) == 2"),
    ("type('F', (float,), {})(1.5)", "1.5", "assert f() is not None"),
    ("type('B', (bytes,), {})(b'ab')", "b'ab'", "assert list(f()) == [97, 98]"),
    ("type('BA', (bytearray,), {})(b'ab')", "bytearray(b'ab')", "assert len(f()) == 2"),
    ("type('C', (complex,), {})(1j)", "1j", "assert f() is not None"),
    ("type('Q', (collections.Counter,), {})('aab')", "collections.Counter('aab')", "assert f()['a'] == 2"),
    (
        "type('O', (collections.OrderedDict,), {})([('a', 1)])",
        "collections.OrderedDict([('a', 1)])",
        "assert list(f()) == ['a']",
    ),
    (
        "type('DD', (collections.defaultdict,), {})(list, {'a': [1]})",
        "collections.defaultdict(list, {'a': [1]})",
        "assert f()['a'] == [1]",
    ),
    ("type('DQ', (collections.deque,), {})([1, 2])", "collections.deque([1, 2])", "assert list(f()) == [1, 2]"),
    ("type('FR', (fractions.Fraction,), {})(1, 3)", "fractions.Fraction(1, 3)", "assert f() is not None"),
    ("type('DE', (decimal.Decimal,), {})('1.5')", "decimal.Decimal('1.5')", "assert f() is not None"),
    # a namedtuple's subclass (bases (P,), not (tuple,)) is no namedtuple on the wire
    (
        "type('Q2', (collections.namedtuple('P', 'x y'),), {})(1, 2)",
        "(1, 2)",  # a namedtuple equals its plain tuple; two namedtuple() calls give two types
        "assert tuple(f()) == (1, 2)",
    ),
    # nested: the plain list crosses, the subclass inside it stays a handle
    ("[type('L', (list,), {})([1])]", "[[1]]", "assert len(f()) == 1 and list(f()[0]) == [1]", "[0]"),
]


@pytest.mark.parametrize("case", _EXACT_TYPE_CASES, ids=[c[0].split("'")[1] for c in _EXACT_TYPE_CASES])
def test_judged_subclass_crosses_as_its_base_value(case):
    ret, plain, usable, at = (*case, "")[:4]  # at: where the subclass sits in the value ("" = the value)
    code = f"{_SUB}def f():\n    return {ret}\n"
    tests = "import collections, decimal, fractions\n"
    # the plain builtin of that value crosses, compares equal and keeps its type; the subclass does neither
    same_type = f"assert type(f(){at}) is type(({plain}){at})"
    plain_code = f"{_SUB}def f():\n    return {plain}\n"
    assert run_judged(plain_code, tests + f"assert f() == {plain}\n" + same_type, FAST).passed
    r = run_judged(code, tests + f"assert f() == {plain}\n" + same_type, FAST)
    assert r.passed, r.judge_stderr[-500:]
    assert not run_judged(code, tests + f"assert type(f(){at}) is not type(({plain}){at})", FAST).passed
    r = run_judged(code, tests + usable, FAST)
    assert r.passed, r.judge_stderr


@pytest.mark.parametrize(
    "ret,test,ok",
    [
        ("True", "assert f() is True and type(f()) is bool", True),
        ("1", "assert f() is True", False),  # 1 == True, but 1 is not True: an int stays an int
        ("1", "assert type(f()) is int and f() == True", True),
        ("False", "assert type(f()) is bool and f() is False", True),
        ("0", "assert type(f()) is bool", False),
        ("True", "assert type(f()) is int", False),
        ("1.0", "assert type(f()) is float and f() == 1", True),
        ("1", "assert type(f()) is float", False),
        ("(1,)", "assert type(f()) is tuple and f() != [1]", True),
        ("{1: 2}", "assert type(f()) is dict", True),
        ("frozenset({1})", "assert type(f()) is frozenset and f() == {1}", True),
    ],
)
def test_judged_bool_int_float_and_containers_keep_their_exact_type(ret, test, ok):
    assert run_judged(f"def f():\n    return {ret}\n", test, FAST).passed is ok


def test_judged_handles_classes_generators_and_modules():
    code = (
        "import math\n"
        "class Acc:\n    def __init__(self):\n        self.n = 0\n"
        "    def add(self, k):\n        self.n += k\n        return self\n"
        "def gen(k):\n    yield from range(k)\n"
        "def area(r):\n    return math.pi * r * r\n"
        "def bad():\n    raise ValueError('no')\n"
    )
    tests = (
        "a = Acc()\na.add(2).add(3)\nassert a.n == 5\n"
        "assert list(gen(3)) == [0, 1, 2]\n"
        "assert math.isclose(area(1), 3.14159, rel_tol=1e-4)\n"  # the candidate's stdlib import is usable
        "try:\n    bad()\n    raise AssertionError('no raise')\nexcept ValueError:\n    pass\n"
    )
    r = run_judged(code, tests, FAST)
    assert r.passed, r.judge_stderr


def test_judged_candidate_cannot_shadow_builtins_or_forge_system_exit():
    code = "def abs(x):\n    return 0\ndef f(x):\n    raise SystemExit(0)\n"
    assert not run_judged(code, "assert abs(-3) == 0", FAST).passed  # builtins' abs, not the candidate's
    assert run_judged("import math as len\ndef f():\n    return [1]\n", "assert len(f()) == 1", FAST).passed
    assert not run_judged(code, "f(1)", FAST).passed
    # a broken exchange fails the run even when the tests swallow the error
    assert not run_judged(
        "import os\ndef f():\n    os._exit(0)\n", "try:\n    f()\nexcept BaseException:\n    pass", FAST
    ).passed


@pytest.mark.parametrize(
    "code,tests,ok",
    [
        # a correct answer to "pow(x, y): x times y" (HumanEval style): check(pow) must get the candidate's pow
        (
            "def pow(x, y):\n    return x * y\n",
            "def check(candidate):\n    assert candidate(2, 3) == 6\ncheck(pow)\n",
            True,
        ),
        # a wrong answer is not saved by the builtin of the same name
        ("def pow(x, y):\n    return 0\n", "assert pow(2, 3) == 8\n", False),
        # nor is a candidate that never defines the entry point
        ("def other():\n    pass\n", "assert pow(2, 3) == 8\n", False),
        ("def pow(x, y):\n    return x ** y\n", "assert pow(2, 3) == 8 and abs(-1) == 1\n", True),
    ],
)
def test_judged_entry_point_named_like_a_builtin_is_the_candidates(code, tests, ok):
    r = run_judged(code, tests, FAST, entry_point="pow")
    assert r.passed is ok, r.judge_stderr[-500:]


def test_judged_other_builtin_names_stay_the_judges():
    # only the named entry point is the candidate's: its other functions named like builtins are not reached
    code = "def pow(x, y):\n    return x ** y\ndef abs(x):\n    return 7\n"
    assert run_judged(code, "assert pow(2, 3) == 8 and abs(-1) == 1\n", FAST, entry_point="pow").passed
    with pytest.raises(ValueError, match="entry_point"):
        run_judged("", "", FAST, entry_point="__import__")


@pytest.mark.parametrize(
    "code,tests",
    [
        # an enum member: the same member compares equal on every call, another member does not
        (
            "import enum\nclass Color(enum.Enum):\n    RED = 1\n    GREEN = 2\ndef f():\n    return Color.GREEN\n",
            "assert f() == Color.GREEN and f() != Color.RED and f() in {Color.GREEN} and f().name == 'GREEN'",
        ),
        # str() and f-strings of a returned object, as the candidate's __str__ gives them
        (
            "class P:\n    def __str__(self):\n        return 'p!'\ndef f():\n    return P()\n",
            "assert f'{f()}' == str(f()) == 'p!'",
        ),
        # `in` over a returned object's items, compared by the judge
        (
            "class Bag:\n    def __iter__(self):\n        return iter([1, 3])\ndef f():\n    return Bag()\n",
            "assert 3 in f() and 4 not in f() and [3] not in f()",
        ),
        # repr() of a returned object is the candidate's __repr__; a truth value without __len__
        (
            "class P:\n    def __repr__(self):\n        return 'P(1)'\ndef f():\n    return P()\n",
            "assert repr(f()) == 'P(1)'",
        ),
        ("class E:\n    def __bool__(self):\n        return False\ndef f():\n    return E()\n", "assert not f()"),
    ],
)
def test_judged_protocols_of_returned_objects(code, tests):
    r = run_judged(code, tests, FAST)
    assert r.passed, r.judge_stderr[-500:]


def test_in_never_asks_the_candidates_contains():
    # `in` is the judge's own search over the object's items: a __contains__ that says yes to what the tests
    # hold is never asked, and an object that is not iterable is refused (a TypeError, as Python's fallback)
    liar = "class Bag:\n    def __contains__(self, x):\n        return True\n    def __iter__(self):\n        return iter([1])\n"
    r = run_judged(liar + "def f():\n    return Bag()\n", "assert 3 in f()", FAST)
    assert not r.passed and "AssertionError" in r.judge_stderr, r.judge_stderr[-500:]
    bag = "class Bag:\n    def __contains__(self, x):\n        return x == 3\ndef f():\n    return Bag()\n"
    r = run_judged(bag, "assert 3 in f()", FAST)
    assert not r.passed and "TypeError" in r.judge_stderr, r.judge_stderr[-500:]


# generators, as the datasets use them: a returned generator is consumed lazily, one item per exchange
_FIB = "def fib():\n    a, b = 0, 1\n    while True:\n        yield a\n        a, b = b, a + b\n"
_FIB_WRONG = "def fib():\n    a, b = 1, 1\n    while True:\n        yield a\n        a, b = b, a + b\n"


@pytest.mark.parametrize(
    "tests",
    [
        # an infinite generator consumed by the tests' islice: never listed whole
        "from itertools import islice\nassert list(islice(fib(), 6)) == [0, 1, 1, 2, 3, 5]\n",
        # next() on a returned generator, and a generator that keeps its state between next() calls
        "assert next(fib()) == 0\ng = fib()\nnext(g)\nnext(g)\nassert next(g) == 1 and next(g) == 2\n",
        # a for loop that breaks out of an infinite generator
        "out = []\nfor x in fib():\n    if x > 10:\n        break\n    out.append(x)\nassert out == [0, 1, 1, 2, 3, 5, 8]\n",
        # zip with a finite range stops the infinite generator
        "assert [x for _, x in zip(range(4), fib())] == [0, 1, 1, 2]\n",
    ],
)
def test_judged_returned_generator_is_consumed_lazily(tests):
    r = run_judged(_FIB, tests, FAST)
    assert r.passed, r.judge_stderr[-500:]
    assert not run_judged(_FIB_WRONG, tests, FAST).passed  # the wrong-answer twin earns nothing


def test_judged_finite_generator_ends_with_stop_iteration_and_errors_cross():
    code = "def gen(n):\n    yield from range(n)\n    if n == 9:\n        raise ValueError('nine')\n"
    tests = (
        "g = gen(1)\nassert next(g) == 0\ntry:\n    next(g)\n    raise AssertionError('no stop')\n"
        "except StopIteration:\n    pass\n"
        "assert next(gen(0), 'empty') == 'empty' and list(gen(3)) == [0, 1, 2] and sum(gen(4)) == 6\n"
        "try:\n    list(gen(9))\n    raise AssertionError('no raise')\nexcept ValueError:\n    pass\n"
    )
    r = run_judged(code, tests, FAST)
    assert r.passed, r.judge_stderr[-500:]


def test_judged_tests_that_list_an_infinite_generator_fail_within_the_time_limit():
    r = run_judged(_FIB, "assert list(fib())[:3] == [0, 1, 1]\n", SandboxConfig(timeout_s=1.0, memory_mb=256))
    assert not r.passed


@pytest.mark.parametrize(
    "code,ok",
    [
        ("def total(it):\n    return sum(it)\n", True),
        ("def total(it):\n    return sum(x for x in it if x % 2)\n", False),
        # the candidate may call next() on what it gets: it is an iterator, as the tests' generator was
        ("def total(it):\n    first = next(it)\n    return first + sum(it)\n", True),
    ],
)
def test_judged_generator_arguments_arrive_as_iterators(code, ok):
    tests = "assert total(x for x in range(5)) == 10\nassert total(map(int, '1234')) == 10\nassert total(iter([4, 6])) == 10\n"
    r = run_judged(code, tests, FAST)
    assert r.passed is ok, r.judge_stderr[-500:]


_NODE = "class Node:\n    def __init__(self, val, next=None):\n        self.val = val\n        self.next = next\n"


def test_judged_instances_of_a_class_both_sides_define_cross_by_value_with_sharing_and_cycles():
    code = _NODE + (
        "def cycle(n):\n    head = Node(0)\n    p = head\n    for i in range(1, n):\n        p.next = Node(i)\n"
        "        p = p.next\n    p.next = head\n    return head\n"
        "def has_cycle(head):\n    seen = set()\n    while head is not None:\n        if id(head) in seen:\n"
        "            return True\n        seen.add(id(head))\n        head = head.next\n    return False\n"
        "def same(a, b):\n    return a is b\n"
    )
    tests = _NODE + (
        "c = cycle(3)\nassert type(c) is Node and c.val == 0 and c.next.next.next is c\n"  # the judge's own Node
        "n = Node(1)\nn.next = n\nassert has_cycle(n) and not has_cycle(Node(1, Node(2)))\n"
        "t = Node(9)\nassert same(t, t) and not same(t, Node(9)) and same(a=t, b=t)\n"  # shared across arguments
    )
    r = run_judged(code, tests, FAST)
    assert r.passed, r.judge_stderr[-500:]


def test_judged_by_value_objects_are_rebuilt_from_the_judges_class_never_the_candidates():
    # the candidate's own Node says it equals anything; the judge rebuilds a Node of its own class
    code = (
        "class Node:\n    def __init__(self, val, next=None):\n        self.val = val\n        self.next = next\n"
        "    def __eq__(self, o):\n        return True\n    def __bool__(self):\n        return True\n"
        "def f():\n    return Node(5)\n"
    )
    tests = _NODE + "r = f()\nassert type(r) is Node and r.val == 5 and '__eq__' not in vars(r)\n"
    assert run_judged(code, tests, FAST).passed
    assert not run_judged(code, _NODE + "assert f() == Node(6)\n", FAST).passed
    # a class the judge does not define stays a handle, as before
    assert run_judged(code, "r = f()\nassert r.val == 5 and r == r\n", FAST).passed


_INT_ENUM = "import enum\nclass P(enum.IntEnum):\n    LOW = 1\n    HIGH = 2\n"
_VEC = "class V:\n    def __init__(self, x):\n        self.x = x\n    def __add__(self, o):\n        return V(self.x + (o.x if isinstance(o, V) else o))\n    __radd__ = __add__\n"
_DC_STR = "from dataclasses import dataclass\n@dataclass\nclass Pt:\n    x: int\n    y: int\n"


@pytest.mark.parametrize(
    "code,tests,ok",
    [
        # an IntEnum result is an int of its class: == an int, arithmetic, order, .name, the same member again
        (
            _INT_ENUM + "def f():\n    return P.HIGH\n",
            "assert f() == 2 and f() + 1 == 3 and f() > P.LOW and f().name == 'HIGH' and f() is P.HIGH\n",
            True,
        ),
        (_INT_ENUM + "def f():\n    return P.LOW\n", "assert f() == 2\n", False),
        # an IntEnum whose __eq__ says True arrives with int's ==
        (
            _INT_ENUM.replace(
                "    HIGH = 2\n",
                "    HIGH = 2\n    def __eq__(self, o):\n        return True\n    __hash__ = int.__hash__\n",
            )
            + "def f():\n    return P.LOW\n",
            "assert f() == 2\n",
            False,
        ),
        # no operator of a returned object runs (its __add__ included): by design, a false negative
        (_VEC + "def f(x):\n    return V(x)\n", "assert (f(1) + f(2)).x == 3\n", False),
        (_VEC + "def f(x):\n    return V(x)\n", "assert sum([f(1), f(2)]).x == 3\n", False),
        # its methods, called by name, are the candidate's (the task's API)
        (_VEC + "def f(x):\n    return V(x)\n", "assert f(1).x == 1 and f(2).x == 2\n", True),
        # str() of a returned dataclass with its own __str__
        (
            _DC_STR + "    def __str__(self):\n        return f'({self.x}, {self.y})'\ndef f():\n    return Pt(1, 2)\n",
            "assert str(f()) == '(1, 2)' and f'{f()}' == '(1, 2)'\n",
            True,
        ),
        (
            _DC_STR + "    def __str__(self):\n        return f'({self.y}, {self.x})'\ndef f():\n    return Pt(1, 2)\n",
            "assert str(f()) == '(1, 2)'\n",
            False,
        ),
        # the truth value of a re.Match (and None for no match)
        (
            "import re\ndef f(s):\n    return re.match(r'a+', s)\n",
            "assert f('aab') and not f('b') and f('aab').group() == 'aa'\n",
            True,
        ),
        ("import re\ndef f(s):\n    return re.search(r'b', s)\n", "assert f('aab') and not f('b')\n", False),
    ],
)
def test_judged_dataset_idioms_on_returned_objects(code, tests, ok):
    r = run_judged(code, tests, FAST)
    assert r.passed is ok, r.judge_stderr[-500:]


_STR_ENUM = "import enum\nclass C(enum.StrEnum):\n    RED = 'red'\n    BLUE = 'blue'\n"
_INT_FLAG = "import enum\nclass P(enum.IntFlag):\n    R = 4\n    W = 2\n    X = 1\n"
_FLAG = "import enum\nclass Perm(enum.Flag):\n    R = 4\n    W = 2\n    X = 1\n"
_COLOR = "import enum\nclass Color(enum.Enum):\n    RED = 1\n    GREEN = 2\n"


@pytest.mark.parametrize(
    "code,tests,ok",
    [
        # a StrEnum result equals its str, keeps .name, and is the same member again (no class in the tests)
        (
            _STR_ENUM + "def f():\n    return C.RED\n",
            "assert f() == 'red' and f().name == 'RED' and f() is f()\n",
            True,
        ),
        (_STR_ENUM + "def f():\n    return C.BLUE\n", "assert f() == 'red'\n", False),
        # an IntFlag combination equals its int
        (_INT_FLAG + "def f():\n    return P.R | P.W\n", "assert f() == 6 and f() & 4\n", True),
        (_INT_FLAG + "def f():\n    return P.R\n", "assert f() == 6\n", False),
        # a Flag combination of a class the prompt defines on both sides: the tests' own member
        (
            _FLAG + "def f():\n    return Perm.R | Perm.W\n",
            _FLAG + "assert f() == Perm.R | Perm.W and type(f()) is Perm\n",
            True,
        ),
        (_FLAG + "def f():\n    return Perm.R\n", _FLAG + "assert f() == Perm.R | Perm.W\n", False),
        # an Enum member the tests pass arrives as the candidate's own member of that class
        (
            _COLOR + "def f(c):\n    return {Color.RED: 'stop', Color.GREEN: 'go'}[c]\n",
            _COLOR + "assert f(Color.GREEN) == 'go'\n",
            True,
        ),
        (
            _COLOR + "def f(c):\n    return {Color.RED: 'go', Color.GREEN: 'stop'}[c]\n",
            _COLOR + "assert f(Color.GREEN) == 'go'\n",
            False,
        ),
        (_COLOR + "def f():\n    return Color.GREEN\n", _COLOR + "assert f() is Color.GREEN\n", True),
        # an Enum the tests do not define stays a handle: its own methods, run in the sandbox
        (
            _COLOR + "    def go(self):\n        return self is Color.GREEN\ndef f():\n    return Color.GREEN\n",
            "assert f().go() and f() == Color.GREEN and f() != Color.RED\n",
            True,
        ),
    ],
)
def test_judged_enum_members_cross(code, tests, ok):
    r = run_judged(code, tests, FAST)
    assert r.passed is ok, r.judge_stderr[-500:]


def test_judged_generators_nested_in_arguments_arrive_as_iterators():
    code = "def f(xs):\n    return [sum(g) for g in xs]\n"
    assert run_judged(code, "assert f([(x for x in range(3)), iter([5, 6])]) == [3, 11]\n", FAST).passed
    assert run_judged("def f(t):\n    return sum(t[0])\n", "assert f(((x for x in range(4)),)) == 6\n", FAST).passed
    assert not run_judged(code, "assert f([(x for x in range(3))]) == [4]\n", FAST).passed


def test_judged_handles_of_different_objects_stay_unequal():
    # an object whose __eq__ says True is still not equal to a handle of another object, nor to a value
    code = "class T:\n    def __eq__(self, o):\n        return True\n    __hash__ = object.__hash__\ndef f():\n    return T()\n"
    assert not run_judged(code, "assert f() == f()", FAST).passed
    assert not run_judged(code, "assert f() == 1", FAST).passed
    assert run_judged(code, "x = f()\nassert x == x and x != f() and str(x).startswith('<')", FAST).passed


def test_judged_timeout_and_many():
    r = run_judged("def f():\n    while True:\n        pass\n", "f()", FAST)
    assert r.status == "timeout" and not r.passed
    res = run_many_judged([(f"def f():\n    return {i}\n", f"assert f() == {i % 2}", False) for i in range(4)], FAST)
    assert [r.passed for r in res] == [True, True, False, False]


def test_judged_namespace_rules():
    shadow = "def f(x):\n    return 0\nclass math:\n    @staticmethod\n    def isclose(*a, **k):\n        return True\n"
    stop = "def f():\n    raise StopIteration\n"
    jobs = [
        ("def copy(x):\n    return [x]\n", "assert copy(1) == [1]\n", False),  # a function named like a module
        (shadow, "assert math.isclose(f(1), 2)\n", False),  # the tests' math is the judge's
        ("def f(r):\n    return 2.0 * r\n", "assert math.isclose(f(1), 2)\n", False),  # unimported math
        (stop, "assert all(map(lambda _: f(), [1]))\n", False),
        (stop, "try:\n    f()\nexcept RuntimeError as e:\n    assert 'StopIteration' in str(e)\n", False),
        ("def f():\n    raise KeyError('k')\n", "try:\n    f()\nexcept KeyError:\n    pass\n", False),
    ]
    got = [r.passed for r in run_many_judged(jobs, FAST)]
    assert got == [True, False, True, False, True, True]
