"""llm/base/sandbox/programs/codec.py: the wire codec, in this process (the same source runs in the candidate
and in the judge)."""

import sys

import pytest

if not sys.platform.startswith("linux"):
    pytest.skip("the sandbox targets Linux (rlimits, namespaces)", allow_module_level=True)

from tiltlab.llm.base import sandbox
from tiltlab.llm.base.sandbox import config, programs, runner

pytestmark = pytest.mark.filterwarnings("ignore::tiltlab.llm.base.sandbox.SandboxWarning")


# ---------------------------------------------------------------------------------------------
# the wire codec, in this process (the same source runs in the candidate and in the judge)
# ---------------------------------------------------------------------------------------------


def _codec(own=None, by_ref=False):
    ns = {"_dcref": lambda v: None, "_DC_BY_REF": by_ref, "_OWN": own or {}}
    path = programs.DIR / "codec.py"
    exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), ns)  # as the programs run it
    return ns


def _handle(v):
    raise TypeError(f"handle {type(v).__name__}")


def _roundtrip(v, ns=None):
    import json

    ns = ns or _codec()
    return ns["_dec"](json.loads(json.dumps(ns["_enc"](v, _handle))), lambda k, x: ("remote", k, x))


def test_codec_values_cross_as_their_own_types():
    import collections
    import dataclasses
    import datetime
    import decimal
    import fractions

    import numpy as np

    P = collections.namedtuple("P", "x y")
    dd = collections.defaultdict(list, {1: [2]})
    values = [
        10**5000,
        -(10**5000),
        2**4096 - 1,
        collections.Counter("aab"),
        collections.OrderedDict([("b", 1), ("a", 2)]),
        dd,
        collections.deque([1, 2], maxlen=3),
        P(1, [2]),
        fractions.Fraction(-3, 9),
        decimal.Decimal("1.10"),
        datetime.date(2024, 2, 29),
        datetime.datetime(2024, 1, 2, 3, 4, 5, 6),
        datetime.timedelta(days=-1, seconds=5),
        range(1, 10, 3),
        bytearray(b"ab"),
        complex(1.5, -2.0),
        (1, [2, (3,)], {4: frozenset({5})}),
        {1, 2},
    ]
    for v in values:
        back = _roundtrip(v)
        assert type(back) is type(v) or (type(v) is P and back._fields == ("x", "y")), (v, back)
        assert back == v, (v, back)
    assert _roundtrip(dd)[9] == [] and _roundtrip(collections.defaultdict(lambda: 0)).default_factory is None
    assert _roundtrip(collections.deque([1], maxlen=3)).maxlen == 3
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    back = _roundtrip(a)
    assert back.dtype == a.dtype and back.shape == (2, 3) and (back == a).all()
    assert type(_roundtrip(np.float32(1.5))) is float

    @dataclasses.dataclass(order=True)
    class Pt:
        x: int
        y: list = dataclasses.field(compare=False)

    ns = _codec()  # one judge: one class per (name, fields) for all its values
    back = _roundtrip(Pt(1, [2]), ns)
    assert back == _roundtrip(Pt(1, [3]), ns) and back != _roundtrip(Pt(2, [2]), ns) < _roundtrip(Pt(3, [2]), ns)
    assert back < _roundtrip(Pt(2, [2]), ns) and back != _roundtrip(Pt(1, [2]))  # another judge's class
    assert type(back).__name__ == "Pt" and back.y == [2]

    @dataclasses.dataclass
    class Plain:  # eq, no order
        x: int

    @dataclasses.dataclass(eq=False)
    class Ident:
        x: int

    assert _roundtrip(Plain(1), ns) == _roundtrip(Plain(1), ns) != _roundtrip(Plain(2), ns)
    with pytest.raises(TypeError):
        _roundtrip(Plain(1), ns) < _roundtrip(Plain(2), ns)  # noqa: B015
    assert _roundtrip(Ident(1), ns) != _roundtrip(Ident(1), ns)  # eq=False: identity, as in one process
    wide = dataclasses.make_dataclass("Wide", [f"f{i}" for i in range(256)])
    assert _roundtrip(wide(*range(256)), ns).f255 == 255
    # a class of the receiving side with that name and those fields is used as is
    assert type(_roundtrip(Pt(1, [2]), _codec(own={"Pt": Pt}))) is Pt


def test_codec_deep_values_and_unknown_objects():
    ns = _codec()
    deep = []
    for _ in range(sandbox.WIRE_DEPTH):
        deep = [deep]
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(config._RECURSION)
    try:
        assert _roundtrip(deep, ns) == deep
    finally:
        sys.setrecursionlimit(old)
    with pytest.raises(TypeError, match="handle object"):
        ns["_enc"](object(), _handle)
    # a subclass crosses as its base value, read through the base's own methods (never the subclass's)
    liar = type("I", (int,), {"__index__": lambda s: 9, "__int__": lambda s: 9, "__eq__": lambda s, o: True})(3)
    assert ns["_enc"](liar, _handle) == 3 and type(ns["_enc"](liar, _handle)) is int
    t = type("T", (tuple,), {"__iter__": lambda s: iter((9,)), "__getitem__": lambda s, i: 9})((1,))
    assert ns["_enc"](t, _handle) == {"t": [1]}  # a tuple subclass that is no namedtuple: a plain tuple
    assert ns["_enc"](type("L", (list,), {"__iter__": lambda s: iter([9])})([1, 2]), _handle) == [1, 2]
    assert ns["_enc"](type("S", (str,), {"__str__": lambda s: "x"})("ab"), _handle) == "ab"
    # the class is read from type(), never from __class__ (a property that claims to be float)
    with pytest.raises(TypeError, match="handle P"):
        ns["_enc"](type("P", (), {"__class__": property(lambda s: float), "__float__": lambda s: 4.0})(), _handle)
    with pytest.raises(TypeError, match="handle F"):
        ns["_enc"](type("F", (), {"_fields": ("a",)})(), _handle)  # _fields on a non-tuple


def test_codec_dataclass_by_reference_on_the_candidate_side():
    ns = _codec(by_ref=True)
    fields = [["x", True, 1]]
    assert ns["_dec"]({"dc": ["P", fields, [True, False, False], 7]}, lambda k, x: ("remote", k, x)) == (
        "remote",
        "h",
        7,
    )
    built = ns["_dec"]({"dc": ["P", fields, [True, False, False], None]}, lambda k, x: None)
    assert type(built).__name__ == "P" and built.x == 1


@pytest.mark.parametrize(
    "bad",
    [
        {"N": ["P", ["__class__"], [1]]},
        {"N": ["P", ["_x"], [1]]},
        {"N": ["P", ["a", "a"], [1, 2]]},
        {"N": ["class", ["a"], [1]]},
        {"dc": ["P", [["__eq__", True, 1]], [True, False, False], None]},
        {"dc": ["P", [["_tl_ref", True, 1]], [True, False, False], None]},
        {"dc": ["False", [["a", True, 1]], [True, False, False], None]},
        {"dc": ["P", [[f"f{i}", True, i] for i in range(257)], [True, False, False], None]},
        {"nd": ["|O8", [1], [1]]},
        {"dt": ["timezone", "x"]},
        {"zz": 1},
        {"t": [1], "d": []},
    ],
)
def test_codec_refuses_malformed_values(bad):
    with pytest.raises(ValueError, match="malformed"):
        _codec()["_dec"](bad, lambda k, x: None)


def test_codec_rebuilds_only_this_sides_own_plain_classes():
    node = type("Node", (), {"__module__": "__main__"})
    slotted = type("Slot", (), {"__module__": "__main__", "__slots__": ("val",)})
    ns = _codec({"__name__": "__main__", "Node": node, "Slot": slotted, "f": len})
    dec = ns["_dec"]
    n = dec({"o": ["Node", 0, None, [["val", 1], ["next", {"or": 0}]]]}, lambda k, x: None)
    assert type(n) is node and n.val == 1 and n.next is n  # a cycle stays a cycle
    remote = lambda k, x: ("remote", k, x)
    assert dec({"o": ["Other", 0, 7, []]}, remote) == ("remote", "h", 7)  # no class of its own: a handle
    for name in ("Other", "f", "Slot"):
        with pytest.raises(TypeError, match="no class"):
            dec({"o": [name, 0, None, []]}, remote)
    for bad in (
        {"o": ["Node", 0, None, [["__class__", 1]]]},
        {"o": ["Node", 0, None, [["_tl_ref", 1]]]},
        {"o": ["Node", "0", None, []]},
        {"or": 0},
        {"en": ["IntEnum", "P", [["_missing_", 1]], 1]},
        {"en": ["IntEnum", "P", [["A", 1.5]], 1.5]},
        {"en": ["IntEnum", "P", [["A", 1]], 2]},
        {"en": ["IntEnum", "P", [["A", True]], True]},
        {"en": ["IntEnum", "P", [["A", 1]], True]},  # a bool value that IntEnum would take for 1
        {"en": ["StrEnum", "P", [["A", 1]], 1]},
        {"en": ["IntEnum", "P", [["A", 1]], "1"]},
        {"en": ["EnumMeta", "P", [["A", 1]], 1]},
        {"en": ["Flag", "class", [["A", 1]], 1]},
        {"it": {"a": 1}},
    ):
        with pytest.raises(ValueError, match="malformed"):
            dec(bad, remote)
    m = dec({"en": ["IntEnum", "P", [["A", 1], ["B", 2]], 2]}, remote)
    assert m == 2 and m.name == "B" and type(m).__name__ == "P"
    m = dec({"en": ["StrEnum", "C", [["RED", "red"]], "red"]}, remote)
    assert m == "red" and m.name == "RED" and type(m).__name__ == "C"
    f = dec({"en": ["Flag", "F", [["R", 1], ["W", 2]], 3]}, remote)  # a combination of members, by value
    assert type(f).__name__ == "F" and f == type(f).R | type(f).W
    assert dec({"en": ["Flag", "F", [["R", 1], ["W", 2]], 1]}, remote) is type(f).R  # one class per members
    assert list(dec({"it": [1, {"t": [2]}]}, remote)) == [1, (2,)]


def test_sync_applies_in_place_changes():
    import collections

    sync = _codec()["_sync"]
    deep = [1]
    d = {"k": deep, "gone": 1}
    sync(d, {"k": [1, 2], "new": 3})
    assert d == {"k": [1, 2], "new": 3} and d["k"] is deep and deep == [1, 2]  # nested values changed in place
    inner = [1]
    old = [inner, {"k": [2]}, 3]
    sync(old, [[1, 9], {"k": [2, 8], "n": 1}, 4])
    assert old == [[1, 9], {"k": [2, 8], "n": 1}, 4] and inner == [1, 9]
    old = [1, 2, 3]
    sync(old, [3])
    assert old == [3]
    d = collections.defaultdict(int, {"a": 1})
    sync(d, collections.defaultdict(list, {"b": 2}))
    assert d == {"b": 2} and d.default_factory is list
    s, ba, q = {1}, bytearray(b"a"), collections.deque([1])
    sync(s, {2, 3})
    sync(ba, bytearray(b"xy"))
    sync(q, collections.deque([7, 8]))
    assert s == {2, 3} and ba == b"xy" and list(q) == [7, 8]
    t = [1]
    sync(t, (2,))  # a different type: left alone
    assert t == [1]


def test_walk_gives_the_nodes_ast_walk_gives():
    import ast
    import inspect

    walk = _codec()["_walk"]
    for src in (inspect.getsource(runner), "import math\nassert math.isclose(f(2), 4.0)\nx = [a.b for a in y if a]\n"):
        tree = ast.parse(src)
        got, want = list(walk(tree)), list(ast.walk(tree))
        assert len(got) == len(want) and {id(n) for n in got} == {id(n) for n in want}


def test_restore_gives_an_object_its_new_attributes_in_place():
    restore = _codec()["_restore"]
    node = type("Node", (), {})()
    items, other = [1], object()
    node.__dict__.update(val=1, items=items, gone=2)
    restore(node, [("val", 5, False), ("items", [1, 2], True), ("next", other, False)])
    assert node.__dict__ == {"val": 5, "items": [1, 2], "next": other}
    assert node.items is items and items == [1, 2]  # a list attribute changed in place stays the caller's list
    restore(node, [("items", [4], False)])  # rebound in the callee: a new list, the old one untouched
    assert node.__dict__ == {"items": [4]} and node.items is not items and items == [1, 2]
    restore(node, [("items", (3,), True)])  # a different type replaces it
    assert node.__dict__ == {"items": (3,)}


def test_only_objects_a_call_may_have_changed_are_sent_back():
    moved = _codec()["_moved"]
    node = type("Node", (), {})
    a, b = node(), node()
    items = [1]
    a.__dict__.update(val=1, name="x", next=b, f=1.5)
    was = dict(a.__dict__)
    assert not moved(a, was, {id(b)})  # same scalars, same crossed neighbour
    assert moved(a, was, set())  # a neighbour that did not cross may have changed inside
    a.val = 2
    assert moved(a, was, {id(b)})  # rebound
    a.val = 1
    a.items = items
    assert moved(a, was, {id(b)})  # a new attribute
    was = dict(a.__dict__)
    assert moved(a, was, {id(b)})  # a list attribute may have changed in place
    del a.items
    assert moved(a, was, {id(b)})  # an attribute removed


def test_objects_of_a_calls_arguments_come_back_as_the_callers_own():
    node = type("Node", (), {"__module__": "__main__"})
    judge = _codec({"__name__": "__main__", "Node": node})
    judge["_objref"] = lambda v: None  # as in the judge: its objects carry no sandbox reference
    a, b = node(), node()
    a.__dict__.update(val=1, next=b)
    b.__dict__.update(val=2, next=None)
    keep = []
    judge["_EKEEP"] = keep
    by_value = lambda v: judge["_enc_obj"](v, by_value)  # the judge's _arg for its own plain classes
    sent = judge["_whole"](judge["_enc"], [a, b], by_value)
    judge["_EKEEP"] = None
    assert keep == [a, b] and sent == [
        {"o": ["Node", 0, None, [["val", 1], ["next", {"o": ["Node", 1, None, [["val", 2], ["next", None]]]}]]]},
        {"or": 1},
    ]
    # the sandbox's side: the call's objects are sent back by their key, new objects by value
    twin_cls = type("Node", (), {"__module__": "solution"})  # the same definition, run in the sandbox
    cand = _codec({"__name__": "solution", "Node": twin_cls})
    cand["_BYVAL"], cand["_objref"] = frozenset({"Node"}), lambda v: None
    twin = cand["_whole"](cand["_dec"], sent, None)
    x, y = twin
    assert type(x) is twin_cls and x.next is y
    fresh = twin_cls()
    fresh.__dict__.update(val=7, next=x)
    cand["_ORIG"] = {id(x): 0, id(y): 1}
    assert cand["_whole"](cand["_enc"], [y, fresh], _handle) == [
        {"ok": 1},
        {"o": ["Node", 0, None, [["val", 7], ["next", {"ok": 0}]]]},
    ]
    cand["_ORIG"] = None
    # the judge maps the keys to its own objects; without a call's objects, or out of range, a key is malformed
    judge["_DORIG"] = keep
    got = judge["_whole"](judge["_dec"], [{"ok": 1}, {"o": ["Node", 0, None, [["val", 7], ["next", {"ok": 0}]]]}], None)
    assert got[0] is b and type(got[1]) is node and got[1].next is a and got[1] is not fresh
    for bad in ({"ok": 2}, {"ok": -1}, {"ok": "0"}, {"ok": True}):
        with pytest.raises(ValueError, match="malformed"):
            judge["_dec"](bad, None)
    judge["_DORIG"] = None
    with pytest.raises(ValueError, match="malformed"):
        judge["_dec"]({"ok": 0}, None)
