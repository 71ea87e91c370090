# The wire format shared by the candidate's server (boot.py) and the judge (judge.py): stdlib only, exact
# types. Not imported as a module at run time: each of the two programs runs this file's compiled code in its
# own globals (exec), so these functions share the program's globals, which each side sets
# (_OWN, _dcref, _objref, _DC_BY_REF, _ALL_ENUMS, _BYVAL, _ORIG, _DORIG, _EKEEP).
TYPE_CHECKING = False
if TYPE_CHECKING:  # what the program that runs the codec defines
    _OWN: dict = {}
    _DC_BY_REF = False

    def _dcref(v): ...

    def _objref(v): ...


import builtins as _bi
import sys as _sys

_BIG = 1 << 4096  # larger ints cross as hex: linear both ways, and free of int <-> str digit limits
_WORD = frozenset(
    (
        "False",
        "None",
        "True",
        "and",
        "as",
        "assert",
        "async",
        "await",
        "break",
        "class",
        "continue",
        "def",
        "del",
        "elif",
        "else",
        "except",
        "finally",
        "for",
        "from",
        "global",
        "if",
        "import",
        "in",
        "is",
        "lambda",
        "nonlocal",
        "not",
        "or",
        "pass",
        "raise",
        "return",
        "try",
        "while",
        "with",
        "yield",
    )
)
_FACTORIES = ("int", "float", "str", "bytes", "list", "dict", "set", "frozenset", "tuple", "bool", "complex")


def _ident(n):
    return type(n) is str and n.isidentifier() and n not in _WORD and not n.startswith("__") and n != "_tl_ref"


def _items(v, handle):
    return [[_enc(k, handle), _enc(x, handle)] for k, x in dict.items(v)]


def _enc(v, handle):
    t = type(v)
    if v is None or t is bool or t is float or t is str:
        return v
    if t is int:
        return v if -_BIG < v < _BIG else {"i": hex(v)}
    if t is list:
        return [_enc(x, handle) for x in v]
    if t is tuple:
        return {"t": [_enc(x, handle) for x in v]}
    if t is dict:
        return {"d": _items(v, handle)}
    if t is set or t is frozenset:
        return {("s" if t is set else "f"): [_enc(x, handle) for x in v]}
    if t is bytes or t is bytearray:
        return {("b" if t is bytes else "ba"): v.hex()}
    if t is complex:
        return {"c": [v.real, v.imag]}
    if t is range:
        return {"r": [_enc(v.start, handle), _enc(v.stop, handle), _enc(v.step, handle)]}
    mods = _sys.modules
    en = mods.get("enum")
    if en is not None and isinstance(v, en.Enum):
        e = _enc_enum(v, t, en, handle)
        if e is not None:
            return e
    col = mods.get("collections")
    if col is not None:
        if t is col.Counter:
            return {"C": _items(v, handle)}
        if t is col.OrderedDict:
            return {"O": _items(v, handle)}
        if t is col.defaultdict:
            f = v.default_factory
            name = next((n for n in _FACTORIES if f is getattr(_bi, n)), None)
            return {"D": [name, _items(v, handle)]}
        if t is col.deque:
            return {"q": [[_enc(x, handle) for x in v], v.maxlen]}
    if isinstance(v, tuple) and t.__bases__ == (tuple,) and type(getattr(t, "_fields", None)) is tuple:
        return {"N": [t.__name__, list(t._fields), [_enc(x, handle) for x in tuple.__iter__(v)]]}
    fr = mods.get("fractions")
    if fr is not None and t is fr.Fraction:
        return {"Q": [_enc(v.numerator, handle), _enc(v.denominator, handle)]}
    de = mods.get("decimal")
    if de is not None and t is de.Decimal:
        return {"M": str(v)}
    dt = mods.get("datetime")
    if dt is not None:
        if t is dt.timedelta:
            return {"td": [v.days, v.seconds, v.microseconds]}
        for kind in ("datetime", "date", "time"):
            if t is getattr(dt, kind):
                return {"dt": [kind, v.isoformat()]}
    np = mods.get("numpy")
    if np is not None:
        if isinstance(v, np.generic):  # numpy scalars cross as the Python scalar they hold
            return _enc(v.item(), handle)
        if t is np.ndarray and v.dtype.kind in "biufc":
            return {"nd": [v.dtype.str, list(v.shape), _enc(v.tolist(), handle)]}
    dc = mods.get("dataclasses")
    if dc is not None and not isinstance(v, type) and dc.is_dataclass(v):
        p = t.__dataclass_params__
        fs = [[f.name, bool(f.compare), _enc(getattr(v, f.name), handle)] for f in dc.fields(v)]
        return {"dc": [t.__name__, fs, [bool(p.eq), bool(p.order), bool(p.frozen)], _dcref(v)]}
    if t.__name__ in _BYVAL and type(t) is type:  # a class the judge defines (the prompt's TreeNode): by value
        return _enc_obj(v, handle)
    b = _base_value(v, t, mods)
    if b is not None:  # a subclass of a type that crosses by value: its base value, none of its methods
        return _enc(b, handle)
    return handle(v)


def _base_value(v, t, mods):
    "An instance of a subclass of a type that crosses by value, as an exact instance of the first such type in its\n"
    "MRO, read through that type's own methods (``type(v)``, never ``v.__class__``); None for any other object."
    col = mods.get("collections")
    if col is not None:
        if issubclass(t, col.Counter):
            return col.Counter(dict(dict.items(v)))
        if issubclass(t, col.OrderedDict):
            return col.OrderedDict(list(col.OrderedDict.items(v)))
        if issubclass(t, col.defaultdict):
            return col.defaultdict(col.defaultdict.default_factory.__get__(v), dict.items(v))
        if issubclass(t, col.deque):
            return col.deque(list(col.deque.__iter__(v)), col.deque.maxlen.__get__(v))
    for b, get in _BASES:
        if issubclass(t, b):
            return get(v)
    fr = mods.get("fractions")
    if fr is not None and issubclass(t, fr.Fraction):
        return fr.Fraction(fr.Fraction.numerator.fget(v), fr.Fraction.denominator.fget(v))
    de = mods.get("decimal")
    if de is not None and issubclass(t, de.Decimal):
        return de.Decimal(de.Decimal.__str__(v))
    dt = mods.get("datetime")
    if dt is not None:
        if issubclass(t, dt.timedelta):
            return dt.timedelta(
                dt.timedelta.days.__get__(v), dt.timedelta.seconds.__get__(v), dt.timedelta.microseconds.__get__(v)
            )
        for kind in (dt.datetime, dt.date, dt.time):
            if issubclass(t, kind):
                return kind.fromisoformat(kind.isoformat(v))
    return None


#: the builtin types whose subclasses cross as their base value, and how that value is read (the base's own methods)
_BASES = (
    (int, int.__index__),
    (float, float.__float__),
    (complex, lambda v: complex(complex.real.__get__(v), complex.imag.__get__(v))),
    (str, str.__str__),
    (bytes, lambda v: bytes(memoryview(v))),
    (bytearray, lambda v: bytearray(memoryview(v))),
    (list, list.copy),
    (tuple, lambda v: tuple.__getitem__(v, slice(None))),
    (dict, lambda v: dict(dict.items(v))),
    (set, lambda v: set(set.__iter__(v))),
    (frozenset, lambda v: frozenset(frozenset.__iter__(v))),
)


_BYVAL = frozenset()  # type: ignore[var-annotated]  # names of the classes whose instances cross by value (the judge's plain classes)
_ESEEN = None  # one value's objects already encoded: id -> key (sharing and cycles are kept)
_DSEEN = None  # one value's objects already rebuilt: key -> object
_EKEEP = None  # the judge, encoding a call's arguments: its objects in key order (key -> object)
_ORIG = None  # the sandbox, after a call: id -> key of the objects its arguments brought, sent as {"ok": key}
_DORIG = None  # the judge, reading what a call left: key -> its own object of that key (_EKEEP)


def _enc_obj(v, handle):
    "An instance of a plain class as its class name and attributes; an object met again is a reference."
    global _ESEEN
    if _ORIG is not None:
        k = _ORIG.get(id(v))
        if k is not None:  # an object the call's arguments brought: the caller's own object
            return {"ok": k}
    own = _ESEEN is None
    if own:
        _ESEEN = {}
    try:
        k = _ESEEN.get(id(v))
        if k is not None:
            return {"or": k}
        d = getattr(v, "__dict__", None) if type(v).__dictoffset__ != 0 else None
        if type(d) is not dict:
            return handle(v)
        k = _ESEEN[id(v)] = len(_ESEEN)
        if _EKEEP is not None:
            _EKEEP.append(v)
        attrs = [[n, _enc(x, handle)] for n, x in dict.items(d) if _ident(n)]
        return {"o": [type(v).__name__, k, _objref(v), attrs]}
    finally:
        if own:
            _ESEEN = None


def _whole(fn, *a):
    "Encode or decode one value: objects shared inside it (across a call's arguments too) stay shared."
    global _ESEEN, _DSEEN
    old = _ESEEN, _DSEEN
    _ESEEN, _DSEEN = {}, {}
    try:
        return fn(*a)
    finally:
        _ESEEN, _DSEEN = old


def _rebuildable(cls):
    "A plain class defined by this side's own top-level code (the judge's tests and prompt)."
    return (
        isinstance(cls, type)
        and type(cls) is type
        and cls.__module__ == _OWN.get("__name__")
        and cls.__new__ is object.__new__
        and cls.__dictoffset__ != 0
        and "__dataclass_fields__" not in cls.__dict__
    )


def _dec(x, remote):
    t = type(x)
    if x is None or t is bool or t is int or t is float or t is str:
        return x
    if t is list:
        return [_dec(i, remote) for i in x]
    if t is not dict or len(x) != 1:
        raise ValueError("sandbox: malformed value")
    ((k, v),) = x.items()
    if k == "t":
        return tuple([_dec(i, remote) for i in v])
    if k == "d":
        return {_dec(a, remote): _dec(b, remote) for a, b in v}
    if k == "s":
        return {_dec(i, remote) for i in v}
    if k == "f":
        return frozenset([_dec(i, remote) for i in v])
    if k == "b":
        return bytes.fromhex(v)
    if k == "ba":
        return bytearray.fromhex(v)
    if k == "c":
        return complex(float(v[0]), float(v[1]))
    if k == "i":
        if type(v) is not str:
            raise ValueError("sandbox: malformed value")
        return int(v, 16)
    if k == "r":
        return range(*[_dec(i, remote) for i in v])
    if k in ("C", "O", "D", "q"):
        import collections as col

        if k == "C":
            return col.Counter({_dec(a, remote): _dec(b, remote) for a, b in v})
        if k == "O":
            return col.OrderedDict([(_dec(a, remote), _dec(b, remote)) for a, b in v])
        if k == "q":
            if v[1] is not None and type(v[1]) is not int:
                raise ValueError("sandbox: malformed value")
            return col.deque([_dec(i, remote) for i in v[0]], v[1])
        f = getattr(_bi, v[0]) if v[0] in _FACTORIES else None
        return col.defaultdict(f, [(_dec(a, remote), _dec(b, remote)) for a, b in v[1]])
    if k == "N":
        name, fields, vals = v
        fields = tuple(fields)
        if not (
            _ident(name)
            and all(_ident(f) and not f.startswith("_") for f in fields)
            and len(set(fields)) == len(fields) == len(vals)
        ):
            raise ValueError("sandbox: malformed value")
        key = ("N", name, fields)
        cls = _CLASSES.get(key)
        if cls is None:
            import collections as col

            cls = _CLASSES[key] = col.namedtuple(name, fields)
        return cls(*[_dec(i, remote) for i in vals])
    if k == "Q":
        import fractions

        return fractions.Fraction(_dec(v[0], remote), _dec(v[1], remote))
    if k == "M":
        import decimal

        return decimal.Decimal(str(v))
    if k == "td":
        import datetime

        return datetime.timedelta(days=int(v[0]), seconds=int(v[1]), microseconds=int(v[2]))
    if k == "dt":
        import datetime

        if v[0] not in ("datetime", "date", "time"):
            raise ValueError("sandbox: malformed value")
        return getattr(datetime, v[0]).fromisoformat(str(v[1]))
    if k == "nd":
        import re as _re

        import numpy as np

        if type(v[0]) is not str or not _re.fullmatch(r"[<>|=][biufc][0-9]{1,2}", v[0]):
            raise ValueError("sandbox: malformed value")
        return np.array(_dec(v[2], remote), dtype=np.dtype(v[0])).reshape([int(n) for n in v[1]])
    if k == "dc":
        name, fields, flags, ref = v
        if ref is not None and _DC_BY_REF:  # the candidate gets its own object back
            return remote("h", ref)
        names = tuple(f[0] for f in fields)
        if not (_ident(name) and all(_ident(n) for n in names) and len(set(names)) == len(names) <= 256):
            raise ValueError("sandbox: malformed value")
        cls = _dataclass(name, tuple((f[0], bool(f[1])) for f in fields), tuple(bool(b) for b in flags))
        obj = object.__new__(cls)
        for f in fields:
            object.__setattr__(obj, f[0], _dec(f[2], remote))
        if ref is not None:
            try:
                object.__setattr__(obj, "_tl_ref", remote("h", ref))
            except AttributeError:  # a class with __slots__: no method fallback
                pass
        return obj
    if k in ("h", "n"):
        return remote(k, v)
    if k in ("o", "or"):
        return _dec_obj(k, v, remote)
    if k == "ok":  # the judge's own object that the call's arguments brought (never valid in the sandbox)
        if _DORIG is None or type(v) is not int or not 0 <= v < len(_DORIG):
            raise ValueError("sandbox: malformed value")
        return _DORIG[v]
    if k == "en":
        return _dec_enum(v, remote)
    if k == "it":  # an iterator the tests passed (a generator expression): its items, as an iterator again
        if t is not dict or type(v) is not list:
            raise ValueError("sandbox: malformed value")
        return iter([_dec(i, remote) for i in v])
    raise ValueError("sandbox: malformed value")


def _dec_obj(k, v, remote):
    "The same-named class of this side, with the attributes that crossed; a reference is an object met before."
    global _DSEEN
    if k == "or":
        if _DSEEN is None or type(v) is not int or v not in _DSEEN:
            raise ValueError("sandbox: malformed value")
        return _DSEEN[v]
    if type(v) is not list or len(v) != 4 or type(v[3]) is not list or type(v[1]) is not int:
        raise ValueError("sandbox: malformed value")
    name, key, ref, attrs = v
    cls = _OWN.get(name) if _ident(name) else None
    if not _rebuildable(cls):
        if ref is not None:  # not a class this side defines: the object stays where it is
            return remote("h", ref)
        raise TypeError(f"no class {name!r} here to rebuild a {name} in")
    own = _DSEEN is None
    if own:
        _DSEEN = {}
    try:
        obj = object.__new__(cls)
        d = obj.__dict__
        _DSEEN[key] = obj  # before the attributes: a cycle comes back to this object
        for a in attrs:
            if type(a) is not list or len(a) != 2 or not _ident(a[0]) or _shadows(cls, a[0]):
                raise ValueError("sandbox: malformed value")
            d[a[0]] = _dec(a[1], remote)
        return obj
    finally:
        if own:
            _DSEEN = None


def _shadows(cls, name):
    "Whether an instance attribute ``name`` would hide a method (or any descriptor) of this side's class ``cls``:\n"
    "such an attribute never crosses, so the tests always call the class's own methods, never the candidate's."
    for k in cls.__mro__:
        if name in k.__dict__:
            a = k.__dict__[name]
            return callable(a) or hasattr(type(a), "__get__")
    return False


_ENUM_KINDS = {"IntEnum": (int,), "StrEnum": (str,), "IntFlag": (int,), "Flag": (int,), "Enum": (int, str)}
_ENUM_BY_VALUE = ("IntEnum", "StrEnum", "IntFlag")  # kinds that compare as their int or str: always by value
_ALL_ENUMS = True  # the judge: every member it passes crosses by value (the sandbox: see _enc_enum)


def _enum_value(kind, x, depth=0):
    "A member value that crosses: an int (a str for StrEnum); for Enum, also a float, or a tuple of such values\n"
    "(``PLANET = (3.3e23, 2.4e6)``, the stdlib docs' Planet)."
    t = type(x)
    if t in _ENUM_KINDS[kind]:
        return True
    if kind != "Enum":
        return False
    return t is float or (t is tuple and depth < 4 and len(x) <= 64 and all(_enum_value(kind, i, depth + 1) for i in x))


def _enc_enum(v, t, en, handle):
    "A member of a direct subclass of IntEnum, StrEnum, IntFlag, Flag or Enum with int or str values, as its\n"
    "class (kind, name, members) and value; None (a handle) for any other enum, and in the sandbox for a Flag or\n"
    "Enum whose class the judge does not define (its methods are then the candidate's, called in the sandbox)."
    if len(t.__bases__) != 1:
        return None
    kind = t.__bases__[0].__name__
    if kind not in _ENUM_KINDS or getattr(en, kind, None) is not t.__bases__[0]:
        return None
    if not (_ALL_ENUMS or kind in _ENUM_BY_VALUE or t.__name__ in _BYVAL):
        return None
    ms = [[n, m._value_] for n, m in t.__members__.items()]
    if len(ms) > 4096 or not all(_ident(n) and not n.startswith("_") and _enum_value(kind, x) for n, x in ms):
        return None
    if not _enum_value(kind, v._value_):
        return None
    return {"en": [kind, t.__name__, [[n, _enc(x, handle)] for n, x in ms], _enc(v._value_, handle)]}


def _dec_enum(v, remote):
    "An enum member: of this side's own enum of that name, kind and value, else of one built from the members that crossed."
    import enum

    if type(v) is not list or len(v) != 4 or type(v[2]) is not list or len(v[2]) > 4096 or v[0] not in _ENUM_KINDS:
        raise ValueError("sandbox: malformed value")
    kind, name, ms, value = v
    ms = tuple((m[0], _dec(m[1], remote)) for m in ms if type(m) is list and len(m) == 2)
    value = _dec(value, remote)
    if not (
        _ident(name)
        and len(ms) == len(v[2])
        and _enum_value(kind, value)
        and all(_ident(n) and not n.startswith("_") and _enum_value(kind, x) for n, x in ms)
    ):
        raise ValueError("sandbox: malformed value")
    base = getattr(enum, kind)
    own = _OWN.get(name)
    if isinstance(own, type) and own.__bases__ == (base,) and own.__module__ == _OWN.get("__name__"):
        try:
            m = own(value)
        except ValueError:
            m = None
        if m is not None and type(m._value_) is type(value) and m._value_ == value:  # (a tuple: by its items)
            return m
    key = ("en", kind, name, ms)
    cls = _CLASSES.get(key)
    if cls is None:
        if len(_CLASSES) > 512:
            raise ValueError("sandbox: too many distinct classes")
        try:
            cls = base(name, list(ms))
        except (TypeError, ValueError):
            raise ValueError("sandbox: malformed value") from None
        _CLASSES[key] = cls
    try:
        return cls(value)
    except ValueError:
        raise ValueError("sandbox: malformed value") from None


_CLASSES = {}  # type: ignore[var-annotated]


def _dataclass(name, fields, flags):
    "A dataclass to hold a value that crossed: one of this side's own of that name and fields, else a new one."
    own = _OWN.get(name)
    if isinstance(own, type) and tuple(getattr(own, "__dataclass_fields__", ())) == tuple(f[0] for f in fields):
        return own
    key = ("dc", name, fields, flags)
    cls = _CLASSES.get(key)
    if cls is None:
        if len(_CLASSES) > 512:
            raise ValueError("sandbox: too many distinct classes")
        import dataclasses as dc

        def __getattr__(self, attr):  # methods (not fields) of the original object, through its handle
            ref = self.__dict__.get("_tl_ref")
            if ref is None or attr.startswith("__"):
                raise AttributeError(attr)
            return getattr(ref, attr)

        def __str__(self):  # the original object's str(), computed where it lives (a custom __str__)
            ref = self.__dict__.get("_tl_ref")
            return repr(self) if ref is None else str(ref)

        cls = _CLASSES[key] = dc.make_dataclass(
            name,
            [(n, object, dc.field(compare=c)) for n, c in fields],
            eq=flags[0],
            order=flags[0] and flags[1],
            frozen=flags[2],
            namespace={"__getattr__": __getattr__, "__str__": __str__},
        )
    return cls


def _walk(tree):
    "Every node of ``tree``, as ``ast.walk`` gives them (in another order), without importing ``ast``."
    import _ast

    todo = [tree]
    while todo:
        n = todo.pop()
        yield n
        for f in n._fields:
            v = getattr(n, f, None)
            if isinstance(v, _ast.AST):
                todo.append(v)
            elif isinstance(v, list):
                todo.extend(x for x in v if isinstance(x, _ast.AST))


_MUTABLE = (list, dict, set, bytearray)


def _sync(old, new):
    "Make the caller's argument ``old`` hold ``new`` (the state the callee left it in), in place."
    t = type(old)
    if t is not type(new):
        return
    if t is list:
        if len(old) == len(new):
            for i, n in enumerate(new):
                o = old[i]
                if type(o) is type(n) and isinstance(o, _MUTABLE) and o is not n:
                    _sync(o, n)
                else:
                    old[i] = n
        else:
            old[:] = new
    elif isinstance(old, dict):
        items = []
        for key, n in dict.items(new):
            o = dict.get(old, key, None)
            if o is not None and type(o) is type(n) and isinstance(o, _MUTABLE):
                _sync(o, n)
                n = o
            items.append((key, n))
        dict.clear(old)
        dict.update(old, items)
        if t.__module__ == "collections" and t.__name__ == "defaultdict":
            old.default_factory = new.default_factory
    elif t is set:
        old.clear()
        old.update(new)
    elif t is bytearray:
        old[:] = new
    elif t.__module__ == "collections" and t.__name__ == "deque":
        old.clear()
        old.extend(new)


_SCALAR = (int, float, complex, str, bytes, bool, type(None))


def _moved(o, was, orig):
    "Whether a call may have changed the object ``o`` (its attributes were ``was`` before it; ``orig``: the ids\n"
    "of the objects its arguments brought, whose own changes are judged on their own)."
    d = o.__dict__
    if dict.keys(d) != dict.keys(was):
        return True
    for n, x in dict.items(d):
        if x is not was[n] or not (type(x) in _SCALAR or id(x) in orig):
            return True  # rebound, or a value that may have changed inside (a list attribute)
    return False


def _restore(obj, items):
    "Give the caller's object ``obj`` the attributes ``(name, value, kept)`` the callee left its twin with, in\n"
    "place; ``kept``: the attribute still holds the object it held before the call (changed in place, not rebound)."
    d = obj.__dict__
    was = dict(d)
    d.clear()
    for n, x, kept in items:
        o = was.get(n)
        if kept and o is not None and o is not x and type(o) is type(x) and isinstance(o, _MUTABLE):
            _sync(o, x)  # a list attribute changed in place stays the caller's list
            x = o
        d[n] = x
