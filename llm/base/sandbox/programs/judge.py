# The judge's program, given ``cfg`` (its limits, the tests, the pipes to the candidate) and ``_CODEC`` (codec.py
# compiled) by what runs it: judge_main.py (the judge as its own interpreter) or the judge server
# (judge_server.py, which forks it). It runs the tests against proxies of the candidate's names.
TYPE_CHECKING = False
if TYPE_CHECKING:  # defined by judge_main.py or judge_server.py
    cfg: dict = {}
    _CODEC = compile("", "codec.py", "exec")
import _ast  # _ast, not ast: the judge starts once per reward (ast costs ~10 ms)
import builtins
import json
import os
import resource
import sys

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
_broken = []  # type: ignore[var-annotated]
_JUDGE_MODULES = frozenset(cfg["modules"])
_NO_CROSS = frozenset(cfg["no_cross"])
_DC_BY_REF = False
from binascii import Error as _B64Error
from binascii import a2b_base64 as _a2b


class SandboxGone(BaseException):
    "The candidate's process stopped answering (exited, was killed or sent garbage)."


# the codec: its definitions in this program's globals (static checkers read the import)
if TYPE_CHECKING:
    from .codec import (
        _ENUM_KINDS,
        _dec,
        _enc,
        _enc_obj,
        _ident,
        _rebuildable,
        _restore,
        _shadows,
        _sync,
        _walk,
        _whole,
    )
else:
    exec(_CODEC, globals())
del _CODEC, TYPE_CHECKING
_codec_enc = _enc
_SKEY: list = []  # non-empty while a set's items are encoded alone, for their order


def _enc(v, handle):  # type: ignore[no-redef]  # the codec's, with sets in an order free of the hash secret
    "The codec's encoding; a set's items in the order of their encodings, never this process's hash order."
    t = type(v)
    if t is not set and t is not frozenset:
        return _codec_enc(v, handle)
    tag = "s" if t is set else "f"
    if all(type(x) is str for x in v):
        return {tag: sorted(v)}
    global _ESEEN, _EKEEP
    outer = _ESEEN, _EKEEP
    again = []

    def alone(y):  # an iterator is consumed once, by the encoding that is sent
        if isinstance(y, _Iterator):
            again.append(True)
            return {"it": None}
        return handle(y)

    items = []
    for x in v:  # each item encoded alone (a function of its value only), then ordered by that encoding
        del again[:]
        _ESEEN, _EKEEP = {}, None
        _SKEY.append(True)
        try:
            e = _enc(x, alone)
            pure = not _ESEEN and not again
        finally:
            _ESEEN, _EKEEP = outer
            _SKEY.pop()
        items.append((json.dumps(e, sort_keys=True), x, e if pure or _SKEY else None))
    items.sort(key=lambda i: i[0])
    # an item holding objects by value (their keys count in encoding order) is encoded again, in place
    return {tag: [e if e is not None else _enc(x, handle) for _k, x, e in items]}


def _read():
    line = _rs.readline(_cap * 4 // 3 + 4096 + 2)  # a stdio case's output (at most _cap bytes) crosses as base64
    if not line.endswith(b"\n"):
        _broken.append("no reply")
        raise SandboxGone("candidate process gone")
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        _broken.append("bad reply")
        raise SandboxGone("malformed reply") from None


def _builtin_exc(name):
    "The builtin exception class a candidate's exception of this name (or with it in its MRO) crosses as, else None."
    t = getattr(builtins, name, None) if type(name) is str and name not in _NO_CROSS else None
    if (
        isinstance(t, type)
        and issubclass(t, Exception)
        and t.__module__ == "builtins"
        and not issubclass(t, (StopIteration, StopAsyncIteration))
    ):
        return t
    return None


def _decides(names, own):
    "The first name of an MRO's names that decides what an exception crosses as: one of ``own`` (the candidate's\n"
    "top-level exception classes) or a builtin name (StopIteration's subclass is decided by StopIteration); None."
    for n in names[:64]:
        if type(n) is str and (n in own or hasattr(builtins, n) or n in _NO_CROSS):
            return n
    return None


def _exc(name, msg, mro=()):
    "The exception a candidate's exception crosses as: the judge's class of the first of the candidate's top-level\n"
    "exception classes in its MRO, or the builtin exception the first builtin name there gives, else RuntimeError."
    n = _decides([name, *(mro if type(mro) is list else ())], _EXC)
    t = _EXC[n] if n in _EXC else _builtin_exc(n)
    if t is not None:
        try:
            return t(msg)
        except Exception:
            pass
    return RuntimeError(f"{name}: {msg}")


_EXC = {}  # type: ignore[var-annotated]  # name -> the judge's class for a candidate's top-level exception class


def _exc_classes(excs):
    "The judge's own exception class for each of the candidate's top-level exception classes (``except TheirError``):\n"
    "named as the candidate's, derived from the judge's class of its first base that is one, else from the first\n"
    "builtin exception of its MRO that may cross (RuntimeError for StopIteration, SystemExit... and BaseException)."

    def build(name, seen):
        if name in _EXC:
            return _EXC[name]
        n = _decides([b for b in excs[name][1:64] if type(b) is str and b not in seen], excs)
        base = build(n, seen | {n}) if n in excs else _builtin_exc(n)
        cls = _EXC[name] = type(name, (base or RuntimeError,), {"__module__": "__main__"})
        return cls

    for name in list(excs)[:256]:
        build(name, {name})
    return _EXC


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
                if _shadows(type(keep[k]), a[0]):  # a method of the judge's class is never replaced
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
    req["cls"] = [
        n
        for n, c in _OWN.items()
        if type(n) is str and getattr(c, "__name__", None) == n and (_rebuildable(c) or _own_enum(c))
    ]  # the classes whose instances the candidate sends by value
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
        elif req["op"] == "stdio" and "e" not in msg:
            return _a2b(msg["o"]).decode("utf-8", "replace")
        elif "e" not in msg:
            if msg.get("stop") is True and req["op"] == "next":
                raise StopIteration
            return _whole(_dec, msg["v"], _Remote)
    except (KeyError, ValueError, TypeError, IndexError, RecursionError, AttributeError, _B64Error):
        _broken.append("bad reply")
        raise SandboxGone("malformed reply") from None
    e = msg["e"]
    raise _exc(e[0], e[1], e[2] if len(e) > 2 else ()) if type(e) is list and 2 <= len(e) <= 3 else _exc("?", "?")


def _own_enum(c):
    "An enum class of a kind that crosses (a Flag or an Enum among them) defined by the judge's own code."
    return (
        isinstance(c, type)
        and c.__module__ == _OWN.get("__name__")
        and len(c.__bases__) == 1
        and c.__bases__[0].__module__ == "enum"
        and c.__bases__[0].__name__ in _ENUM_KINDS
    )


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

    def __contains__(self, item):  # over the object's items, compared here: the candidate's __contains__ is never asked
        for x in self:
            if x is item or x == item:
                return True
        return False

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

    def __repr__(self):  # the candidate's repr(): a str value, as a method returning one
        if _broken:
            return f"<candidate object {self._ref}>"
        return _rpc({"op": "repr", "obj": self._ref})

    # No operator of the candidate's object runs: a handle takes no arithmetic, bitwise or unary operator, no
    # ordering and no numeric conversion (Python raises TypeError), and ``==`` is identity. The candidate's code
    # never receives a value of the tests except as the arguments of a call (or an index) the tests write.


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
    _excs = _hello.get("excs")
    _excs = {
        n: m
        for n, m in (_excs.items() if type(_excs) is dict else ())
        if _ident(n) and not hasattr(builtins, n) and type(m) is list and m and m[0] == n
    }
    for _n in _hello["names"]:
        if type(_n) is str and _n.isidentifier() and not _n.startswith("__") and not hasattr(builtins, _n):
            g[_n] = _Remote("n", _n)  # type: ignore[assignment]
    for _n, _c in _exc_classes(_excs).items():
        g[_n] = _c  # type: ignore[assignment]  # the tests' ``except TheirError`` catches what crosses as it
    _mods = _hello.get("modules")
    for _n, _m in _mods.items() if type(_mods) is dict else ():
        if (
            type(_n) is str
            and _n.isidentifier()
            and not _n.startswith("__")
            and not hasattr(builtins, _n)
            and type(_m) is str
            and _m in _JUDGE_MODULES
        ):
            g[_n] = __import__(_m, fromlist=["_"])  # type: ignore[assignment]
    # what the candidate's names can never shadow: the builtins, and the stdlib modules the tests name
    g["__builtins__"] = builtins  # type: ignore[assignment]
    for _n in _module_names(_tree):
        if _n in _JUDGE_MODULES:
            g[_n] = __import__(_n)  # type: ignore[assignment]
    _entry = cfg["entry"]
    if type(_entry) is str and _entry.isidentifier() and not _entry.startswith("__"):
        g[_entry] = _Remote("n", _entry)  # type: ignore[assignment]  # the task's function is the candidate's, even named like a builtin
    g["__stdio__"] = lambda text: _rpc({"op": "stdio", "input": str(text)})  # type: ignore[assignment]
    _OWN = g
    exec(compile(_tree, "<tests>", "exec"), g)  # type: ignore[call-overload]
    _ok = not _broken
except BaseException as e:
    import traceback

    traceback.print_exception(e, limit=3)
os.write(_vfd, b"1" if _ok else b"0")
os._exit(0 if _ok else 1)
