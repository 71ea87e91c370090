"""The programs the sandbox runs (the candidate's bootstrap, the judge, the judge server), as source text."""

from __future__ import annotations

from .config import RC_BLOCKED, RC_MEMORY, SCRIPT

# ---------------------------------------------------------------------------------------------
# the wire format shared by the candidate's server and the judge (stdlib only, exact types)
# ---------------------------------------------------------------------------------------------

_CODEC = r"""
import builtins as _bi, sys as _sys
_BIG = 1 << 4096  # larger ints cross as hex: linear both ways, and free of int <-> str digit limits
_WORD = frozenset(("False", "None", "True", "and", "as", "assert", "async", "await", "break", "class",
    "continue", "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while", "with", "yield"))
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
    return handle(v)
_BYVAL = frozenset()  # names of the classes whose instances cross by value (the judge's plain classes)
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
    return (isinstance(cls, type) and type(cls) is type and cls.__module__ == _OWN.get("__name__")
            and cls.__new__ is object.__new__ and cls.__dictoffset__ != 0 and "__dataclass_fields__" not in cls.__dict__)
def _dec(x, remote):
    t = type(x)
    if x is None or t is bool or t is int or t is float or t is str:
        return x
    if t is list:
        return [_dec(i, remote) for i in x]
    if t is not dict or len(x) != 1:
        raise ValueError("sandbox: malformed value")
    (k, v), = x.items()
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
        if not (_ident(name) and all(_ident(f) and not f.startswith("_") for f in fields)
                and len(set(fields)) == len(fields) == len(vals)):
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
            if type(a) is not list or len(a) != 2 or not _ident(a[0]):
                raise ValueError("sandbox: malformed value")
            d[a[0]] = _dec(a[1], remote)
        return obj
    finally:
        if own:
            _DSEEN = None
_ENUM_KINDS = {"IntEnum": (int,), "StrEnum": (str,), "IntFlag": (int,), "Flag": (int,), "Enum": (int, str)}
_ENUM_BY_VALUE = ("IntEnum", "StrEnum", "IntFlag")  # kinds that compare as their int or str: always by value
_ALL_ENUMS = True  # the judge: every member it passes crosses by value (the sandbox: see _enc_enum)
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
    types = _ENUM_KINDS[kind]
    ms = [[n, m._value_] for n, m in t.__members__.items()]
    if len(ms) > 4096 or not all(_ident(n) and not n.startswith("_") and type(x) in types for n, x in ms):
        return None
    if type(v._value_) not in types:
        return None
    return {"en": [kind, t.__name__, [[n, _enc(x, handle)] for n, x in ms], _enc(v._value_, handle)]}
def _dec_enum(v, remote):
    "An enum member: of this side's own enum of that name, kind and value, else of one built from the members that crossed."
    import enum
    if type(v) is not list or len(v) != 4 or type(v[2]) is not list or len(v[2]) > 4096 or v[0] not in _ENUM_KINDS:
        raise ValueError("sandbox: malformed value")
    kind, name, ms, value = v
    types = _ENUM_KINDS[kind]
    ms = tuple((m[0], _dec(m[1], remote)) for m in ms if type(m) is list and len(m) == 2)
    value = _dec(value, remote)
    if not (_ident(name) and len(ms) == len(v[2]) and type(value) in types
            and all(_ident(n) and not n.startswith("_") and type(x) in types for n, x in ms)):
        raise ValueError("sandbox: malformed value")
    base = getattr(enum, kind)
    own = _OWN.get(name)
    if isinstance(own, type) and own.__bases__ == (base,) and own.__module__ == _OWN.get("__name__"):
        try:
            m = own(value)
        except ValueError:
            m = None
        if m is not None and type(m._value_) is type(value) and m._value_ == value:
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
_CLASSES = {}
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
            name, [(n, object, dc.field(compare=c)) for n, c in fields],
            eq=flags[0], order=flags[0] and flags[1], frozen=flags[2],
            namespace={"__getattr__": __getattr__, "__str__": __str__})
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
"""

# ---------------------------------------------------------------------------------------------
# candidate bootstrap: python -I -B -c _BOOT <fd>; reads its config and the program from <fd>
# ---------------------------------------------------------------------------------------------

_BOOT = (
    r"""
import json, os, resource, sys
_f = os.fdopen(int(sys.argv[1]), "rb")
cfg = json.loads(_f.read())
_f.close()
sys.argv = [@SCRIPT@]  # what a program run as ``python solution.py`` (no arguments) sees
if cfg["site"] is not None:  # started with -S: the environment's packages without the .pth processing
    import site as _site
    sys.path.extend(cfg["site"])
    _site.setquit()
    _site.setcopyright()
    _site.sethelper()
    del _site
os.chdir(cfg["cwd"])
def _lim(name, v):
    resource.setrlimit(getattr(resource, name), (v, v))
_lim("RLIMIT_CORE", 0)
resource.setrlimit(resource.RLIMIT_CPU, (cfg["cpu_s"], cfg["cpu_s"] + 1))  # SIGXCPU first, SIGKILL 1 s later
_lim("RLIMIT_FSIZE", cfg["fsize"])
_lim("RLIMIT_NOFILE", cfg["nofile"])
if cfg["uid"] is not None:
    os.setgroups([])
    os.setgid(cfg["gid"])
    os.setuid(cfg["uid"])
if cfg["seccomp"]:  # below the bwrap level the bootstrap installs the filter itself
    import ctypes, struct
    _libc = ctypes.CDLL(None, use_errno=True)
    _prog = bytes.fromhex(cfg["seccomp"])
    _buf = ctypes.create_string_buffer(_prog)
    _fprog = struct.pack("HxxxxxxQ", len(_prog) // 8, ctypes.addressof(_buf))
    if _libc.prctl(38, 1, 0, 0, 0) != 0 or _libc.prctl(22, 2, ctypes.c_char_p(_fprog), 0, 0) != 0:
        os._exit(213)
    del ctypes, struct, _libc, _prog, _buf, _fprog
_lim("RLIMIT_NPROC", cfg["nproc"])
_lim("RLIMIT_AS", cfg["as_bytes"])
def _budget():
    "The second filter (one process, no memory files): before the candidate's code runs."
if cfg["budget_seccomp"]:  # ctypes is set up here, before the audit hook that may block it
    import ctypes as _ct, struct as _st
    _bl = _ct.CDLL(None, use_errno=True)
    _bprog = bytes.fromhex(cfg["budget_seccomp"])
    _bbuf = _ct.create_string_buffer(_bprog, len(_bprog))
    _bf = _ct.create_string_buffer(_st.pack("HxxxxxxQ", len(_bprog) // 8, _ct.addressof(_bbuf)), 16)
    _bnnp, _bset = _bl.prctl, _bl.prctl
    def _budget():
        "The second filter (one process, no memory files): before the candidate's code runs."
        if _bnnp(38, 1, 0, 0, 0) != 0 or _bset(22, 2, _bf, 0, 0) != 0:
            os._exit(213)
    del _st
src = cfg.pop("program")
_ROOT = os.path.realpath(cfg["cwd"])
_PROC = frozenset(("os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system",
                   "subprocess.Popen", "os.kill", "os.killpg", "pty.spawn", "os.startfile"))
_NET = frozenset(("socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo",
                  "socket.gethostbyname", "socket.gethostbyaddr", "socket.sendto", "socket.sendmsg",
                  "socket.socketpair"))
_FFI = frozenset(("ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "ctypes.addressof",
                  "ctypes.call_function", "ctypes.string_at", "ctypes.wstring_at", "resource.setrlimit",
                  "resource.prlimit", "sys.remote_exec"))
_MUT = frozenset(("os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate",
                  "os.utime", "os.link", "os.symlink", "os.rename", "shutil.rmtree", "shutil.copyfile",
                  "shutil.copymode", "shutil.copystat", "shutil.move", "os.chflags", "os.lchflags",
                  "os.setxattr", "os.removexattr", "os.mkfifo", "os.mknod"))
_WFLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_BLOCK_PROC = cfg["block_processes"]
_BLOCK_FFI = cfg["block_ctypes"]
_BLOCKED = [False]
_FORKING = [False]  # the server forks one child per stdio case
_fspath, _realpath, _join, _sep = os.fspath, os.path.realpath, os.path.join, os.sep
def _inside(p):
    if isinstance(p, int):
        return True
    try:
        p = _fspath(p)
        if isinstance(p, bytes):
            p = p.decode("utf-8", "surrogateescape")
        r = _realpath(_join(_ROOT, p))
    except Exception:
        return False
    return r == _ROOT or r.startswith(_ROOT + _sep)
def _deny(msg):
    _BLOCKED[0] = True
    raise PermissionError("sandbox: " + msg)
def _hook(event, args):
    if event == "open":
        path, mode, flags = (tuple(args) + (None, None, None))[:3]
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & _WFLAGS)
        if writing and not _inside(path):
            _deny(f"write outside the working directory blocked: {path!r}")
    elif event in _MUT:
        for a in args[:2]:
            if isinstance(a, (str, bytes, os.PathLike)) and not _inside(a):
                _deny(f"{event} outside the working directory blocked")
    elif event in _NET:
        _deny(f"network blocked ({event})")
    elif event in _FFI and (_BLOCK_FFI or not event.startswith("ctypes.")):
        _deny(f"{event} blocked")
    elif _BLOCK_PROC and event in _PROC and not (_FORKING[0] and event == "os.fork"):
        _deny(f"process creation/signals blocked ({event})")
if cfg["audit_hook"]:
    sys.addaudithook(_hook)
del json, resource
import traceback as _tb
_MODE = cfg["mode"]
def _died(e):
    if not isinstance(e, MemoryError):
        try:
            _tb.print_exception(e)
        except BaseException:
            pass
    for _s in (sys.stdout, sys.stderr):
        try:
            _s.flush()
        except BaseException:
            pass
    if isinstance(e, MemoryError):
        os._exit(@RC_MEMORY@)
    os._exit(@RC_BLOCKED@ if _BLOCKED[0] else 1)
try:
    code = compile(src, "<program>", "exec")
except BaseException as e:
    _died(e)
del src
if _MODE == "run":
    g = {"__name__": "__main__", "__builtins__": __builtins__}
    del cfg
    _budget()
    try:
        exec(code, g)
    except SystemExit:
        raise
    except BaseException as e:
        _died(e)
    sys.exit(0)
""".replace("@RC_MEMORY@", str(RC_MEMORY))
    .replace("@RC_BLOCKED@", str(RC_BLOCKED))
    .replace("@SCRIPT@", repr(SCRIPT))
    + _CODEC
    + r"""
import atexit, io as _io, json as _json
_rq = os.fdopen(cfg["rfd"], "rb")
_rs = os.fdopen(cfg["wfd"], "wb")
_cap = cfg["max_reply"]
_RLIM = cfg["recursion"]
_table = {}
_DC_BY_REF = True
_ALL_ENUMS = False
def _handle(v):
    _table[id(v)] = v
    return {"h": id(v)}
def _dcref(v):
    return _handle(v)["h"]
_objref = _dcref
import operator as _operator
_BINOPS = {n: n + "_" if n in ("and", "or") else n for n in (
    "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or", "xor", "lshift", "rshift")}
def _wire(fn, *a):
    "The codec with room for deep values (the candidate's own recursion limit is restored after)."
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, _RLIM))
    try:
        return fn(*a)
    finally:
        sys.setrecursionlimit(old)
def _send(msg):
    try:
        data = _wire(_json.dumps, msg).encode()
    except (TypeError, ValueError, RecursionError) as e:
        data = _json.dumps({"e": [type(e).__name__, "reply not serializable"]}).encode()
    if len(data) > _cap:
        data = _json.dumps({"e": ["OverflowError", "reply too large"]}).encode()
    _rs.write(data + b"\n")
    _rs.flush()
g = {"__name__": "__main__" if _MODE == "stdio" else "solution", "__builtins__": __builtins__}
_OWN = g
if _MODE == "module":
    _budget()
    try:
        exec(code, g)
        _send({
            "names": sorted(k for k, v in g.items() if callable(v) and not k.startswith("__")),
            "modules": {k: v.__name__ for k, v in g.items() if type(v) is type(os) and not k.startswith("__")},
        })
    except MemoryError as e:
        _died(e)
    except BaseException as e:
        _send({"e": [type(e).__name__, str(e)[:500]]})
        _died(e)
else:
    _send({"names": []})
def _join_threads():
    th = sys.modules.get("threading")
    while th is not None:
        left = [t for t in th.enumerate() if t is not th.current_thread() and not t.daemon and t.is_alive()]
        if not left:
            return
        for t in left:
            t.join()
def _exit_status(e):
    "The interpreter's exit status for an uncaught SystemExit (a code that is not an int is printed, status 1)."
    c = e.code
    if c is None:
        return 0
    if isinstance(c, int):
        return 0 if int.__eq__(c, 0) else 1
    try:
        print(c, file=sys.stderr)
    except BaseException:
        pass
    return 1
def _finalize(main, rc):
    "What the interpreter does at exit, in its order: threads, exit hooks, the std streams, __main__'s objects."
    import gc
    _join_threads()  # non-daemon threads finish first
    atexit._run_exitfuncs()  # the exit hooks; an exception in one is printed and ignored, as at exit
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except BaseException:
            rc = rc or 120  # the interpreter's status when flushing stdout fails at exit
    main.clear()  # the teardown of __main__: file objects left open are closed (and flushed)
    gc.collect()
    for s in (sys.__stdout__, sys.__stderr__):
        try:
            s.flush()
        except BaseException:
            pass
    return rc
def _case(fin, fout):
    "The child of one stdio case: run the program as ``python solution.py < input`` would, then exit."
    rc = 1
    try:
        os.dup2(fin, 0)
        os.dup2(fout, 1)
        for fd in (fin, fout, cfg["rfd"], cfg["wfd"]):
            os.close(fd)
        atexit._clear()  # only the program's own exit hooks run
        sys.stdin = sys.__stdin__ = open(0, "r", closefd=False)
        sys.stdout = sys.__stdout__ = open(1, "w", closefd=False)
        main = {"__name__": "__main__", "__builtins__": __builtins__}
        _budget()
        rc = 0
        try:
            exec(code, main)
        except SystemExit as e:  # as the interpreter: None and the int 0 exit 0; 0.0, "" or "0" exit 1
            rc = _exit_status(e)
        except BaseException as e:
            rc = 1
            try:
                _tb.print_exception(e)
            except BaseException:
                pass
        rc = _finalize(main, rc)
    except BaseException:
        rc = rc or 1
    finally:
        os._exit(rc)
def _stdio(text):
    "Run the program as __main__ in a child process with ``text`` on fd 0; its fd 1 output (a pipe: no file limit)."
    fin = os.memfd_create("stdin")
    os.write(fin, text.encode())
    os.lseek(fin, 0, 0)
    rout, wout = os.pipe()
    _FORKING[0] = True
    try:
        pid = os.fork()
    finally:
        _FORKING[0] = False
    if pid == 0:
        os.close(rout)
        _case(fin, wout)
    os.close(fin)
    os.close(wout)
    chunks, size = [], 0
    try:
        while size <= _cap:  # until the program and anything that inherited its stdout closed it
            chunk = os.read(rout, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(rout)  # past the cap the program's next write fails (EPIPE) and it ends
        _, st = os.waitpid(pid, 0)
    if size > _cap:
        raise OverflowError("output too large")
    if os.waitstatus_to_exitcode(st) != 0:
        raise RuntimeError(f"the program failed (exit status {os.waitstatus_to_exitcode(st)})")
    return b"".join(chunks).decode("utf-8", "replace")
def _remote(kind, v):
    return g[v] if kind == "n" else _table[v]
def _mutable(a):
    return isinstance(a, (list, dict, set, bytearray)) or type(a).__name__ == "deque"
def _changed(args, sent):
    "Arguments the call changed in place, as [[position, value], ...] for the judge to apply."
    out = []
    for i, a in enumerate(args):
        if _mutable(a):
            e = _enc(a, _handle)
            if e != sent[i]:
                out.append([i, e])
    return out
def _after(args, sent, kwargs, ksent, crossed, was, res, done):
    "What a call left, in one encoding (an object in two of its parts arrives as one): the objects of its\n"
    "arguments whose attributes may have changed, the arguments changed in place, and the result."
    global _ORIG
    _ORIG = {id(o): k for k, o in crossed.items()}
    try:
        out = {}
        w = [[k, [[n, _enc(x, _handle), x is was[k].get(n)] for n, x in dict.items(o.__dict__) if _ident(n)]]
             for k, o in crossed.items() if _moved(o, was[k], _ORIG)]
        m = _changed(args, sent)
        mk = _changed([kwargs[k] for k, _ in ksent], [v for _, v in ksent])
        if w:
            out["w"] = w
        if m:
            out["m"] = m
        if mk:
            out["mk"] = [[ksent[i][0], e] for i, e in mk]
        if done:
            out["v"] = _enc(res, _handle)
        return out
    finally:
        _ORIG = None
while True:
    line = _rq.readline()
    if not line:
        break
    out = {}
    try:
        req = _wire(_json.loads, line)
        op = req["op"]
        _BYVAL = frozenset(n for n in req.get("cls", ()) if type(n) is str)
        if op == "stdio":
            res = _stdio(req["input"])
        else:
            obj = _dec(req["obj"], _remote)
            if op == "call":
                sent, ksent = req["args"], req["kwargs"]["d"]
                # crossed: key -> the objects the arguments brought (the judge's plain classes), kept to send
                # back in place what the call changed in them
                args, kwargs, crossed = _wire(
                    _whole, lambda: (_dec(sent, _remote), _dec(req["kwargs"], _remote), _DSEEN))
                was = {k: dict(o.__dict__) for k, o in crossed.items()}
                res, done = None, False
                try:
                    res = obj(*args, **kwargs)
                    done = True
                finally:
                    out.update(_wire(_whole, _after, args, sent, kwargs, ksent, crossed, was, res, done))
            elif op == "getattr":
                res = getattr(obj, req["name"])
            elif op == "iter":  # the iterator stays here: the judge asks for one item at a time
                res = iter(obj)
            elif op == "next":
                try:
                    res = next(obj)
                except StopIteration:  # the iterator ended (not a function's StopIteration: see NO_CROSS)
                    out["stop"] = True
                    res = None
            elif op == "len":
                res = len(obj)
            elif op == "str":
                res = str(obj)
            elif op == "bool":
                res = bool(obj)
            elif op == "contains":
                res = _wire(_dec, req["key"], _remote) in obj
            elif op == "getitem":
                res = obj[_wire(_dec, req["key"], _remote)]
            elif op == "binop":
                f = getattr(_operator, _BINOPS[req["name"]])
                other = _wire(_dec, req["key"], _remote)
                res = f(other, obj) if req["r"] is True else f(obj, other)
            else:
                raise ValueError("unknown op")
        if op == "iter":
            out["v"] = _handle(res)
        elif op != "call":
            out["v"] = _wire(_whole, _enc, res, _handle)
    except MemoryError as e:
        _died(e)
    except BaseException as e:
        out.pop("v", None)
        out["e"] = [type(e).__name__, str(e)[:500]]
    _send(out)
os._exit(0)
"""
)

# ---------------------------------------------------------------------------------------------
# judge: python -I -B -c _JUDGE <fd>; runs the tests against proxies of the candidate's names
# ---------------------------------------------------------------------------------------------
_JUDGE_HEAD = r"""
import json, os, sys
_f = os.fdopen(int(sys.argv[1]), "rb")
cfg = json.loads(_f.read())
_f.close()
del _f
"""
"""The judge started as its own interpreter (``python -c _JUDGE <fd>``): its configuration from a pipe."""

_JUDGE_BODY = (
    r"""
import _ast, builtins, json, os, resource, sys  # _ast, not ast: the judge starts once per reward (ast costs ~10 ms)
if cfg["site"] is not None:
    import site as _site
    sys.path.extend(cfg["site"])
    _site.setquit()
    _site.sethelper()
for _n, _v in (("RLIMIT_AS", cfg["as_bytes"]), ("RLIMIT_CORE", 0), ("RLIMIT_FSIZE", 0)):
    resource.setrlimit(getattr(resource, _n), (_v, _v))
resource.setrlimit(resource.RLIMIT_CPU, (cfg["cpu_s"], cfg["cpu_s"] + 1))
sys.setrecursionlimit(max(sys.getrecursionlimit(), cfg["recursion"]))  # deep values compare as in one process
_vfd = cfg["vfd"]
_rq = os.fdopen(cfg["wfd"], "wb")
_rs = os.fdopen(cfg["rfd"], "rb")
_cap = cfg["max_reply"]
_broken = []
_JUDGE_MODULES = frozenset(cfg["modules"])
_NO_CROSS = frozenset(cfg["no_cross"])
_DC_BY_REF = False
class SandboxGone(BaseException):
    "The candidate's process stopped answering (exited, was killed or sent garbage)."
"""
    + _CODEC
    + r"""
def _read():
    line = _rs.readline(_cap + 2)
    if not line.endswith(b"\n"):
        _broken.append("no reply")
        raise SandboxGone("candidate process gone")
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        _broken.append("bad reply")
        raise SandboxGone("malformed reply") from None
def _exc(name, msg):
    t = getattr(builtins, name, None) if type(name) is str and name not in _NO_CROSS else None
    if isinstance(t, type) and issubclass(t, Exception) and t.__module__ == "builtins" \
            and not issubclass(t, (StopIteration, StopAsyncIteration)):
        try:
            return t(msg)
        except Exception:
            pass
    return RuntimeError(f"{name}: {msg}")
def _landed(msg, args, kwargs, keep):
    "Apply what a call left to the judge's objects (one decoding: an object in two parts arrives as one); its result."
    global _DORIG
    _DORIG = keep
    try:
        w = []
        for k, attrs in msg.get("w", ()):  # objects of the arguments whose attributes the call changed
            if type(k) is not int or not 0 <= k < len(keep) or type(attrs) is not list:
                raise ValueError("sandbox: malformed value")
            items = []
            for a in attrs:
                if type(a) is not list or len(a) != 3 or not _ident(a[0]) or type(a[2]) is not bool:
                    raise ValueError("sandbox: malformed value")
                items.append((a[0], _dec(a[1], _Remote), a[2]))
            w.append((keep[k], items))
        m = [(args[i], _dec(v, _Remote)) for i, v in msg.get("m", ())]  # arguments changed in place
        m += [(kwargs[k], _dec(v, _Remote)) for k, v in msg.get("mk", ())]
        res = _dec(msg["v"], _Remote) if "e" not in msg else None
    finally:
        _DORIG = None
    for obj, items in w:
        _restore(obj, items)
    for old, new in m:
        _sync(old, new)
    return res
def _rpc(req, args=(), kwargs=None, keep=()):
    if _broken:
        raise SandboxGone("candidate process gone")
    req["cls"] = [n for n, c in _OWN.items() if type(n) is str and getattr(c, "__name__", None) == n
                  and (_rebuildable(c) or _own_enum(c))]  # the classes whose instances the candidate sends by value
    try:
        _rq.write(json.dumps(req).encode() + b"\n")
        _rq.flush()
    except OSError:
        _broken.append("send failed")
        raise SandboxGone("candidate process gone") from None
    msg = _read()
    if type(msg) is not dict:
        _broken.append("bad reply")
        raise SandboxGone("malformed reply")
    try:
        if req["op"] == "call":
            res = _whole(_landed, msg, args, kwargs, keep)
            if "e" not in msg:
                return res
        elif "e" not in msg:
            if msg.get("stop") is True and req["op"] == "next":
                raise StopIteration
            return _whole(_dec, msg["v"], _Remote)
    except (KeyError, ValueError, TypeError, IndexError, RecursionError, AttributeError):
        _broken.append("bad reply")
        raise SandboxGone("malformed reply") from None
    e = msg["e"]
    raise _exc(e[0], e[1]) if type(e) is list and len(e) == 2 else _exc("?", "?")
def _own_enum(c):
    "An enum class of a kind that crosses (a Flag or an Enum among them) defined by the judge's own code."
    return (isinstance(c, type) and c.__module__ == _OWN.get("__name__") and len(c.__bases__) == 1
            and c.__bases__[0].__module__ == "enum" and c.__bases__[0].__name__ in _ENUM_KINDS)
def _call_args(args, kwargs):
    "A call's arguments in one encoding, and its objects that cross by value in key order (what comes back)."
    global _EKEEP
    _EKEEP = keep = []
    try:
        return _enc(list(args), _arg), _enc(kwargs, _arg), keep
    finally:
        _EKEEP = None
def _arg(v):
    if type(v) is _Remote:
        return v._ref
    t = type(v)
    if _rebuildable(t) and _OWN.get(t.__name__) is t:  # an instance of the prompt's or the tests' class: by value
        return _enc_obj(v, _arg)
    if isinstance(v, _Iterator):  # the tests' own generator or iterator (judge code): its items cross, in order
        return {"it": [_enc(x, _arg) for x in v]}
    raise TypeError(f"a {type(v).__name__} cannot be passed to the candidate's code")
def _dcref(v):
    r = getattr(v, "__dict__", {}).get("_tl_ref")
    return r._ref.get("h") if type(r) is _Remote else None
def _objref(v):
    return None
from collections.abc import Iterator as _Iterator
class _Remote:
    "An object that lives in the candidate's process; equal only to a handle of that same object (an enum member)."
    __slots__ = ("_ref",)
    def __eq__(self, other):  # identity in the sandbox (the table keeps every handed-out object alive)
        return self._ref == other._ref if type(other) is _Remote else NotImplemented
    def __hash__(self):
        return hash(tuple(self._ref.items()))
    def __str__(self):  # the candidate's str(): a str value, as a method returning one
        return _rpc({"op": "str", "obj": self._ref})
    def __bool__(self):
        return _rpc({"op": "bool", "obj": self._ref})
    def __contains__(self, item):
        return _rpc({"op": "contains", "obj": self._ref, "key": _enc(item, _arg)})
    def __init__(self, kind, v):
        object.__setattr__(self, "_ref", {kind: v})
    def __call__(self, *args, **kwargs):
        a, k, keep = _whole(_call_args, args, kwargs)
        req = {"op": "call", "obj": self._ref, "args": a, "kwargs": k}
        return _rpc(req, args, kwargs, keep)
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _rpc({"op": "getattr", "obj": self._ref, "name": name})
    def __iter__(self):  # the candidate's iterator, left in the sandbox; each item is one exchange
        return _rpc({"op": "iter", "obj": self._ref})
    def __next__(self):
        return _rpc({"op": "next", "obj": self._ref})
    def __len__(self):
        return _rpc({"op": "len", "obj": self._ref})
    def __getitem__(self, key):
        return _rpc({"op": "getitem", "obj": self._ref, "key": _enc(key, _arg)})
    def __repr__(self):
        return f"<candidate object {self._ref}>"
def _binop(name, reflected):
    def op(self, other):  # the candidate's own operator, computed in the sandbox; ==, < and friends are not asked
        return _rpc({"op": "binop", "obj": self._ref, "name": name, "r": reflected, "key": _enc(other, _arg)})
    return op
for _n in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or", "xor", "lshift", "rshift"):
    setattr(_Remote, f"__{_n}__", _binop(_n, False))
    setattr(_Remote, f"__r{_n}__", _binop(_n, True))
def _module_names(tree):
    "Names whose attributes the tests read (``math`` in ``math.isclose``); the tests' own bindings win at run time."
    return {n.value.id for n in _walk(tree) if isinstance(n, _ast.Attribute) and isinstance(n.value, _ast.Name)}
_ok = False
try:
    _tree = compile(cfg["tests"], "<tests>", "exec", _ast.PyCF_ONLY_AST)  # ast.parse
    _hello = _read()
    if type(_hello) is not dict or type(_hello.get("names")) is not list:
        raise SandboxGone("the candidate's code did not load")
    g = {"__name__": "__main__"}
    for _n in _hello["names"]:
        if type(_n) is str and _n.isidentifier() and not _n.startswith("__") and not hasattr(builtins, _n):
            g[_n] = _Remote("n", _n)
    _mods = _hello.get("modules")
    for _n, _m in (_mods.items() if type(_mods) is dict else ()):
        if type(_n) is str and _n.isidentifier() and not _n.startswith("__") and not hasattr(builtins, _n) \
                and type(_m) is str and _m in _JUDGE_MODULES:
            g[_n] = __import__(_m, fromlist=["_"])
    # what the candidate's names can never shadow: the builtins, and the stdlib modules the tests name
    g["__builtins__"] = builtins
    for _n in _module_names(_tree):
        if _n in _JUDGE_MODULES:
            g[_n] = __import__(_n)
    _entry = cfg["entry"]
    if type(_entry) is str and _entry.isidentifier() and not _entry.startswith("__"):
        g[_entry] = _Remote("n", _entry)  # the task's function is the candidate's, even named like a builtin
    g["__stdio__"] = lambda text: _rpc({"op": "stdio", "input": str(text)})
    _OWN = g
    exec(compile(_tree, "<tests>", "exec"), g)
    _ok = not _broken
except BaseException as e:
    import traceback
    traceback.print_exception(e, limit=3)
os.write(_vfd, b"1" if _ok else b"0")
os._exit(0 if _ok else 1)
"""
)
"""The judge's program, given ``cfg`` (its limits, the tests, the pipes to the candidate)."""

_JUDGE = _JUDGE_HEAD + _JUDGE_BODY

# ---------------------------------------------------------------------------------------------
# the judge server: one interpreter started once, forking a fresh judge per run
# ---------------------------------------------------------------------------------------------

_ZYGOTE = r"""# tiltlab judge server
import _ast, array, builtins, json, os, resource, selectors, socket, sys, traceback
_ctl = socket.socket(fileno=int(sys.argv[1]))
_f = os.fdopen(int(sys.argv[2]), "rb")
_boot = json.loads(_f.read())
_f.close()
if _boot["site"] is not None:
    import site as _site
    sys.path.extend(_boot["site"])
    _site.setquit()
    _site.sethelper()
for _m in _boot["preload"]:  # what each judge would import anyway, imported once (random reseeds at fork)
    try:
        __import__(_m)
    except ImportError:
        pass
_code = compile(_boot["body"], "<judge>", "exec")
_null = os.open(os.devnull, os.O_RDWR)
_sel = selectors.DefaultSelector()
_sel.register(_ctl, selectors.EVENT_READ)
_live = {}  # pidfd -> (pid, the run's reply socket)
_FDS = socket.CMSG_SPACE(8 * array.array("i").itemsize)
def _judge(fds):
    "In the forked child: the judge's process as a new interpreter would have it, then the judge's program."
    reply, cfd, wfd, rfd, vfd, efd = fds
    os.setsid()
    os.dup2(_null, 0)
    os.dup2(_null, 1)
    os.dup2(efd, 2)
    keep = {0, 1, 2, cfd, wfd, rfd, vfd}
    for _n in os.listdir("/proc/self/fd"):  # the server's socket and every other run's descriptors
        if int(_n) not in keep:
            try:
                os.close(int(_n))
            except OSError:
                pass
    with os.fdopen(cfd, "rb") as f:  # the run writes it once the judge exists (the tests may be large)
        cfg = json.loads(f.read())
    os.chdir(cfg.pop("cwd"))
    os.environ.clear()
    os.environ.update(cfg.pop("env"))
    cfg.update(wfd=wfd, rfd=rfd, vfd=vfd, site=None)
    main = type(sys)("__main__")
    main.__dict__.update(__builtins__=builtins, cfg=cfg)
    sys.modules["__main__"] = main
    exec(_code, main.__dict__)  # ends in os._exit
def _spawn():
    msg, anc, _fl, _ad = _ctl.recvmsg(16, _FDS)
    if not msg:
        sys.exit(0)  # the parent closed its end: it is gone
    fds = []
    for _lv, _ty, data in anc:
        if _lv == socket.SOL_SOCKET and _ty == socket.SCM_RIGHTS:
            fds.extend(array.array("i", data[: len(data) - len(data) % 4]))
    if len(fds) != 6:
        for fd in fds:
            os.close(fd)
        return
    reply = socket.socket(fileno=fds[0])
    pid = os.fork()
    if pid == 0:
        try:
            _judge(fds)
        except BaseException:
            traceback.print_exc()
        os._exit(1)
    for fd in fds[1:]:
        os.close(fd)
    pfd = os.pidfd_open(pid)
    try:
        reply.sendmsg([json.dumps({"pid": pid}).encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [pfd]))])
    except OSError:  # the run that asked is gone: so is its judge
        os.kill(pid, 9)
    _live[pfd] = (pid, reply)
    _sel.register(pfd, selectors.EVENT_READ)
def _reaped(pfd):
    pid, reply = _live.pop(pfd)
    _sel.unregister(pfd)
    os.close(pfd)
    _p, status = os.waitpid(pid, 0)
    try:
        reply.send(str(os.waitstatus_to_exitcode(status)).encode())
    except OSError:
        pass
    reply.close()
while True:
    for _key, _ev in _sel.select():
        if _key.fileobj is _ctl:
            _spawn()
        else:
            _reaped(_key.fileobj)
"""
"""The judge server's program (``python -c _ZYGOTE <socket> <boot fd>``): imports, path set-up and the
compiled judge once; per request (six descriptors over a Unix socket: the
run's reply socket, the pipe its ``cfg`` comes through, the pipes to and from the candidate, the verdict
pipe, stderr) a ``fork`` whose
child is the judge; the reply socket gets the judge's pid and a pidfd, then its exit status."""
