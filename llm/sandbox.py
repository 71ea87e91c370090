"""Run untrusted Python (model-written code) in an OS-isolated process, and judge it from outside.

Two entry points:

* :func:`run_python` runs one program and reports how it ended (``status`` from the exit status,
  the signal or the limit that stopped it; output is never searched). A program decides its own
  exit status, so ``run_python(...).passed`` says "it exited 0", nothing more.
* :func:`run_judged` is what the code reward uses. The candidate's code runs in the sandbox as a
  *server*; the tests run in a separate *judge* process that the candidate's code does not share.
  The judge reaches the candidate's top-level functions and classes through proxies: each call is
  one request over a pipe, its arguments and result cross as tagged JSON, by value for the
  builtin and stdlib types that compare by value (exact types, never subclasses: see ``_CODEC``
  and docs/code-reward.md), so they compare in the judge as in one process; any other object
  stays in the sandbox and the judge holds an opaque handle that compares equal only to itself.
  In-place changes a call makes to its mutable arguments are sent back and applied to the
  judge's objects. The verdict is the judge's exit status plus one byte on a pipe only the judge
  holds. So exiting early, exit hooks, patching the server loop, objects whose ``__eq__`` always
  returns True and reading the tests from disk (they are never in the sandbox) cannot produce a
  pass. Stdio programs run once per case in a child of the server, as ``python solution.py < input``
  would (``sys.argv == [SCRIPT]``; at the end the non-daemon threads finish, the ``atexit`` hooks
  run and the streams are flushed, as the interpreter does at exit); fd 1 is a pipe read up to
  ``max_reply_mb``; the judge compares the captured text.

What the judge's tests can do with the candidate's objects, and the limits of that:

* call a top-level function or class, read attributes, call methods, iterate (lazily: the
  iterator stays in the sandbox and ``next()`` asks it for one item), ``len()``, ``[]``, ``in``,
  ``str()`` and truth value (each computed in the sandbox), binary arithmetic and bitwise operators (the candidate's own, in the sandbox; comparisons
  are not asked); two handles are equal when they are handles of the same object (an enum member);
  an ``IntEnum`` member crosses as a member of an ``IntEnum`` of that name and members;
  instances of a plain class the judge's own code defines (the prompt's ``TreeNode``) cross by value
  and are rebuilt from the judge's class of that name (sharing and cycles kept);
* the candidate cannot write the judge's namespace: dunder names and names of builtins are never
  proxied (except the task's ``entry_point``, always the candidate's), ``__builtins__`` is the judge's; every allowlisted stdlib module (:data:`JUDGE_MODULES`)
  whose attributes the tests read is the judge's own module, imported or not (MBPP tests call ``math.isclose``
  without importing it); helpers a HumanEval prompt defines are defined by the judge
  (:func:`llm.rewards.code_job` puts them in the tests);
* a candidate's exception crosses as the builtin exception of the same name if there is one
  (``ValueError``), else as ``RuntimeError``; those that steer control flow (:data:`NO_CROSS`:
  ``StopIteration``, ``SystemExit``, ...) always as ``RuntimeError``;
* limits: nesting depth :data:`WIRE_DEPTH`, one reply ``max_reply_mb``; ints of any size;
* false negatives by design: tests that pass a callable (a lambda) to the candidate, or read a
  candidate's module-level constant, fail; comparisons are Python's own between plain values
  (``1 == 1.0 == True``), which gives the candidate nothing that ``return 1`` would not.

The judge runs on the host as the caller, with ``python -I -B -S`` (this environment's site
directories on ``sys.path``), the address-space and CPU rlimits of the config, ``RLIMIT_FSIZE = 0``
and a temporary working directory: the tests are the dataset's (trusted); what comes from the
candidate reaches it only as decoded JSON, rebuilt from validated names into plain values.

Isolation of the candidate (:func:`isolation_report` says which level runs here):

* ``bwrap`` (when ``bubblewrap`` works): new PID, network, IPC, UTS (and cgroup) namespaces, a
  root file system holding only read-only ``/usr`` and the interpreter's prefixes (so numpy etc.
  of the current environment import), private ``/proc``, minimal ``/dev``, size-capped tmpfs
  ``/tmp`` (the working directory; an interpreter installed under ``/tmp``, e.g. a virtualenv in
  ``/tmp/ci/venv``, is bound read-only at its own path there, so ``/tmp`` then lists its top
  directory) and ``/dev/shm``; no host file is written. As root, bwrap runs
  privileged and the bootstrap switches to an unprivileged uid of its own per run
  (``uid_base + 256 * (pid % 4096) + slot``, so that several trainer processes on one machine,
  e.g. one per GPU rank, do not share uids; slots rotate and a slot whose uid still has a process
  on the machine is skipped) before the candidate's code runs; as an ordinary user, bwrap creates a
  user namespace (the candidate is uid 65534 there) and forbids nested user namespaces. Every
  process of the run dies with the namespace's init when the run ends.
* ``namespaces`` (no bwrap; ``unshare`` works): network + PID namespaces, a host temporary working
  directory removed afterwards, and, as root, the ``nobody`` uid when the interpreter is usable by
  it (else the system ``python3`` without the environment's packages).
* ``process``: a separate process group with rlimits only.

On every level: a seccomp filter (:func:`seccomp_program`) answering with ``EPERM`` the system
calls of the channels a run could leave for the next or share with a concurrent run
(:data:`SECCOMP_DENIED`, :data:`SECCOMP_DENIED_ARGS`: the kernel keyrings, page-cache residency
probes and resets, file locks and notification, ptrace and other processes' memory, nested user
namespaces), and a second one (:func:`seccomp_budget_program`) that keeps the candidate's code in one
process with no memory outside its address space, so that ``memory_mb`` bounds the run; rlimits
(soft = hard; ``RLIMIT_CPU`` hard one second above soft so ``SIGXCPU`` comes first) for CPU,
address space, file size (stdout/stderr are size-capped anonymous memory files), processes (not
enforced by the kernel for uid 0), open files and core size; a time limit of wall time less the
time the run's processes waited for a CPU, and a plain wall-clock cap, enforced by ``SIGKILL``
of the process group; ``python -I -B`` with a scrubbed environment; stdin from ``/dev/null``;
and a PEP 578 audit hook (process creation, signals, sockets, writes outside the working
directory; ``ctypes`` too below the bwrap level, where numpy needs it) as defense in depth only:
the candidate can switch it off through the bootstrap's globals, and the hostile corpus in
``tests/llm/hostile`` does so to show that the OS layers hold without it.
"""

from __future__ import annotations

import array
import contextlib
import functools
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = [
    "JUDGE_MODULES",
    "NO_CROSS",
    "SECCOMP_BUDGET_DENIED",
    "SECCOMP_BUDGET_DENIED_ARGS",
    "SECCOMP_DENIED",
    "SECCOMP_DENIED_ARGS",
    "WIRE_DEPTH",
    "SandboxConfig",
    "SandboxResult",
    "SandboxWarning",
    "isolation_report",
    "run_judged",
    "run_many",
    "run_many_judged",
    "run_python",
    "seccomp_budget_program",
    "seccomp_program",
]

RC_MEMORY = 211
"""Exit status of the bootstrap when the program raised ``MemoryError`` (RLIMIT_AS)."""
RC_BLOCKED = 212
"""Exit status of the bootstrap when an uncaught exception followed an audit-hook block."""
SCRIPT = "solution.py"
"""``sys.argv[0]`` of the candidate's program (``sys.argv == [SCRIPT]``, as ``python solution.py`` gives)."""


class SandboxWarning(RuntimeWarning):
    """An isolation layer is unavailable on this OS / privilege level."""


@dataclass(frozen=True)
class SandboxConfig:
    """Limits for one sandboxed run."""

    timeout_s: float = 10.0
    """Time limit (seconds) of wall time *less the time the run's processes waited for a CPU* (their
    ``schedstat`` run delay), so that a loaded machine does not time out correct programs; every process
    of the run is SIGKILLed when it is exceeded."""
    cpu_s: int | None = None
    """RLIMIT_CPU in seconds, per process (candidate and judge); ``None`` = int(timeout_s) + 2."""
    max_wall_s: float | None = None
    """Plain wall-clock limit whatever the load; ``None`` = 6 * timeout_s."""
    memory_mb: int = 1024
    """The memory of a run, MiB: the candidate's code runs in one process (new processes, memory files and
    SysV shared memory are refused by :func:`seccomp_budget_program`; threads share the process's address
    space) whose RLIMIT_AS (virtual address space) is ``memory_mb``. The judge has the same RLIMIT_AS."""
    max_file_mb: float = 16.0
    """Largest file the program may write (RLIMIT_FSIZE), MiB."""
    max_output_bytes: int = 1 << 20
    """Cap on stdout and on stderr (each) of the run; reaching it is ``output_limit``."""
    max_reply_mb: float = 32.0
    """Cap on one reply of the candidate to the judge (a result, or one stdio case's output), MiB."""
    disk_mb: int = 64
    """Size of the private tmpfs ``/tmp`` (and of ``/dev/shm``) under bwrap, MiB."""
    nproc: int = 64
    """RLIMIT_NPROC (only effective when the child is not uid 0)."""
    nofile: int = 64
    """RLIMIT_NOFILE."""
    backend: str = "auto"
    """``auto`` (bwrap if it works, else ``namespaces``/``process``), ``bwrap`` (required) or ``legacy``."""
    uid_base: int = 0x70000000
    """As root under bwrap, the ``k``-th concurrent run of process ``pid`` uses uid/gid
    ``uid_base + 256 * (pid % 4096) + k`` (at most 256 concurrent runs per process)."""
    isolate_network: bool = True
    """Legacy backend: use a network namespace when available."""
    isolate_pids: bool = True
    """Legacy backend: use a PID namespace when available."""
    drop_privileges: bool = True
    """When running as root, run user code as an unprivileged uid."""
    block_processes: bool = True
    """Audit-hook block on process creation (turn off only to test the layers underneath it)."""
    audit_hook: bool = True
    """Install the audit hook at all (turn off only to test the OS layers underneath it)."""
    python: str | None = None
    """Interpreter; ``None`` = ``sys.executable`` (legacy backend as root: the system python3 if needed)."""
    judge_server: bool = True
    """Start each judge by forking a judge server started once per process (imports and the compiled
    judge shared, saving an interpreter start per run), instead of a new interpreter per run. The judge's
    program, limits and descriptors are the same either way."""

    def __post_init__(self):
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.memory_mb < 64:
            raise ValueError(f"memory_mb must be >= 64 (the interpreter needs it), got {self.memory_mb}")
        if self.max_wall_s is not None and not self.max_wall_s >= self.timeout_s:
            raise ValueError(f"max_wall_s must be >= timeout_s ({self.timeout_s}), got {self.max_wall_s}")
        if not self.max_reply_mb > 0:
            raise ValueError(f"max_reply_mb must be > 0, got {self.max_reply_mb}")
        if self.max_output_bytes < 1 or self.max_file_mb <= 0 or self.nproc < 1 or self.nofile < 8:
            raise ValueError("max_output_bytes, max_file_mb, nproc must be positive and nofile >= 8")
        if not 0 < self.uid_base <= 0xFFFFFFFE - (1 << 20):
            raise ValueError(f"uid_base must leave room for 2**20 uids below 2**32 - 1, got {self.uid_base}")
        if self.disk_mb < 1:
            raise ValueError(f"disk_mb must be >= 1, got {self.disk_mb}")
        if self.backend not in ("auto", "bwrap", "legacy"):
            raise ValueError(f"backend must be auto, bwrap or legacy, got {self.backend!r}")


@dataclass
class SandboxResult:
    """Outcome of one run.

    ``status``: ok | failed (the judge's tests failed) | error | timeout | memory | output_limit |
    killed | blocked. ``verdict`` is the judge's verdict for :func:`run_judged` (None for
    :func:`run_python`). ``isolation`` names the level that ran.
    """

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float
    isolation: dict = field(default_factory=dict)
    verdict: bool | None = None
    judge_stderr: str = ""

    @property
    def passed(self) -> bool:
        if self.verdict is not None:
            return self.verdict
        return self.status == "ok" and self.returncode == 0

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------------------------------------
# the wire format shared by the candidate's server and the judge (stdlib only, exact types)
# ---------------------------------------------------------------------------------------------

WIRE_DEPTH = 10_000
"""Deepest nesting of a value that crosses between the candidate and the judge."""
_RECURSION = 2 * WIRE_DEPTH + 2_000  # two Python frames per level (function + comprehension), plus room

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

JUDGE_MODULES = frozenset((
    "array", "bisect", "cmath", "collections", "copy", "datetime", "decimal", "fractions", "functools", "heapq",
    "itertools", "json", "math", "operator", "random", "re", "statistics", "string", "sys", "typing",
    "collections.abc", "os.path",
))  # fmt: skip
"""Stdlib modules the judge binds for the tests: under the name the candidate imported one as, and
under its own name wherever the tests use that name without defining it (MBPP tests call
``math.isclose`` with no import); a candidate's object of that name never reaches the tests."""

NO_CROSS = ("StopIteration", "StopAsyncIteration", "GeneratorExit", "KeyboardInterrupt", "SystemExit")
"""Exceptions of the candidate that would steer the tests' control flow; they reach the tests as ``RuntimeError``."""

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


class _ServedJudge:
    """A judge forked by the judge server; the subset of :class:`subprocess.Popen` that
    :func:`run_judged` uses (``pid``, ``poll``, ``wait``, ``returncode``) and ``pidfd``."""

    def __init__(self, pid: int, pidfd: int, sock: socket.socket):
        self.pid, self.pidfd, self.sock = pid, pidfd, sock
        self.returncode: int | None = None

    def _got(self, data: bytes) -> None:
        if data:
            self.returncode = int(data)
        else:  # the server went away before reporting: the judge may still run
            self.kill()
            self.returncode = -signal.SIGKILL

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                self._got(self.sock.recv(64, socket.MSG_DONTWAIT))
            except BlockingIOError:
                return None
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.sock.settimeout(timeout)
            try:
                self._got(self.sock.recv(64))
            except TimeoutError:
                raise subprocess.TimeoutExpired("judge", timeout) from None
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        """SIGKILL through the pidfd: never another process, even after the judge was reaped."""
        with contextlib.suppress(ProcessLookupError, OSError):
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.pidfd)
        self.sock.close()


def _served_judge(fds: tuple[int, int, int, int, int]) -> _ServedJudge | None:
    """A judge from the judge server, or None (with a one-time warning) when the server cannot give
    one twice in a row: the caller then starts the judge as its own interpreter."""
    for attempt in (0, 1):
        try:
            return _JudgeServer.get().spawn(fds)
        except OSError as e:
            _JudgeServer.drop()
            if attempt:
                _warn_once(
                    "judge-server",
                    f"sandbox: the judge server failed ({e}); starting each judge as its own interpreter",
                )
    return None


def _kill_judge(judge) -> None:
    if isinstance(judge, _ServedJudge):
        judge.kill()
    else:
        _kill_group(judge)


class _JudgeServer:
    """The process-wide judge server (:data:`_ZYGOTE`), started on first use and again after it
    died or this process forked; :meth:`spawn` returns a :class:`_ServedJudge`."""

    _lock = threading.Lock()
    _current: _JudgeServer | None = None

    def __init__(self):
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        br, bw = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-B", "-S", "-c", _ZYGOTE, str(theirs.fileno()), str(br)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd="/",
                env=_env(tempfile.gettempdir()),
                start_new_session=True,
                pass_fds=(theirs.fileno(), br),
            )
        except BaseException:
            mine.close()
            os.close(bw)
            raise
        finally:
            theirs.close()
            os.close(br)
        boot = {"body": _JUDGE_BODY, "site": _site_dirs(sys.executable), "preload": sorted(JUDGE_MODULES)}
        _write_all(bw, json.dumps(boot).encode())
        self.ctl, self.owner = mine, os.getpid()

    @classmethod
    def get(cls) -> _JudgeServer:
        with cls._lock:
            cur = cls._current
            if cur is None or cur.owner != os.getpid() or cur.proc.poll() is not None:
                cls._current = cur = cls()
            return cur

    @classmethod
    def drop(cls) -> None:
        """Forget the current server (it failed); the next :meth:`get` starts a new one."""
        with cls._lock:
            cur, cls._current = cls._current, None
        if cur is not None and cur.owner == os.getpid():
            cur.ctl.close()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                cur.proc.kill()
            cur.proc.wait()

    def spawn(self, fds: tuple[int, int, int, int, int]) -> _ServedJudge:
        """Ask for one judge with ``(cfg pipe, wfd, rfd, vfd, stderr)``; the caller then writes the
        judge's ``cfg`` (with ``cwd`` and ``env``) into the pipe. Raises ``OSError`` when the server
        cannot start a judge."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            try:
                self.ctl.sendmsg(
                    [b"j"],
                    [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [theirs.fileno(), *fds]))],
                )
            finally:
                theirs.close()
            msg, anc, _, _ = mine.recvmsg(256, socket.CMSG_SPACE(array.array("i").itemsize))
            pidfd = [
                fd
                for lv, ty, data in anc
                if lv == socket.SOL_SOCKET and ty == socket.SCM_RIGHTS
                for fd in array.array("i", data[: len(data) - len(data) % 4])
            ]
            if not msg or len(pidfd) != 1:
                for fd in pidfd:
                    os.close(fd)
                raise OSError("the judge server did not start a judge")
            return _ServedJudge(int(json.loads(msg)["pid"]), pidfd[0], mine)
        except BaseException:
            mine.close()
            raise


# ---------------------------------------------------------------------------------------------
# probing what this OS allows (cached)
# ---------------------------------------------------------------------------------------------

_warned: set[str] = set()
_probe_lock = threading.Lock()


def _warn_once(key: str, msg: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(msg, SandboxWarning, stacklevel=3)


@functools.cache
def _unshare_prefix(net: bool, pids: bool) -> tuple[str, ...] | None:
    """The working ``unshare`` prefix for the requested namespaces, or None."""
    exe = shutil.which("unshare")
    if exe is None or not (net or pids):
        return None
    flags = (["-n"] if net else []) + (["-p", "-f", "--kill-child"] if pids else [])
    for extra in ([], ["-r"]):
        cmd = [exe, *extra, *flags, "--"]
        try:
            r = subprocess.run([*cmd, "/bin/sh", "-c", "exit 0"], capture_output=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if r.returncode == 0:
            return tuple(cmd)
    return None


def _nobody() -> tuple[int, int] | None:
    try:
        import grp
        import pwd

        uid = pwd.getpwnam("nobody").pw_uid
        try:
            gid = grp.getgrnam("nogroup").gr_gid
        except KeyError:
            gid = pwd.getpwnam("nobody").pw_gid
        return uid, gid
    except (KeyError, ImportError):
        return None


@functools.cache
def _usable_as(python: str, uid: int, gid: int) -> bool:
    """Can ``python`` start and import common stdlib modules after setuid(uid)?"""

    def drop():
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)

    try:
        r = subprocess.run(
            [python, "-I", "-B", "-c", "import json, math, re, collections, itertools, functools"],
            preexec_fn=drop,
            capture_output=True,
            timeout=20,
            cwd="/",
            env={"PATH": "/usr/bin:/bin"},
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def _bind_roots(python: str) -> list[str]:
    """Host directories the interpreter needs (its prefixes), outside ``/usr``, without nesting."""
    real = os.path.realpath(python)
    cands = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, os.path.dirname(os.path.dirname(real))}
    cands |= {os.path.dirname(os.path.dirname(os.path.abspath(python)))}
    roots = sorted({os.path.realpath(c) for c in cands} | {os.path.abspath(c) for c in cands})
    out: list[str] = []
    for r in roots:
        if r in ("/", "/usr") or r.startswith("/usr/") or not os.path.isdir(r):
            continue
        if any(r == o or r.startswith(o + "/") for o in out):
            continue
        out.append(r)
    return out


def _bwrap_args(python: str, root: bool, disk_mb: int) -> list[str]:
    exe = shutil.which("bwrap")
    if exe is None:
        return []
    if root:  # privileged bwrap; the bootstrap drops to the run's own uid
        ns = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    else:  # unprivileged: a user namespace, uid 65534 inside, no nested user namespaces
        ns = ["--unshare-all", "--unshare-user", "--disable-userns", "--uid", "65534", "--gid", "65534"]
    args = [exe, *ns, "--die-with-parent", "--new-session", "--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    # the private /proc, /dev and tmpfs /tmp come before the interpreter's prefixes: bwrap mounts in argument
    # order, and a tmpfs mounted after them would hide a prefix under /tmp (a virtualenv in /tmp/...)
    size = str(int(disk_mb) << 20)
    args += ["--proc", "/proc", "--dev", "/dev", "--size", size, "--perms", "1777", "--tmpfs", "/dev/shm"]
    args += ["--size", size, "--perms", "1777", "--tmpfs", "/tmp"]
    made: set[str] = {"/tmp", "/dev", "/proc"}
    for r in _bind_roots(python):
        parts = Path(r).parts[1:-1]
        for i in range(len(parts)):
            d = "/" + "/".join(parts[: i + 1])
            if d not in made:
                made.add(d)
                args += ["--perms", "0755", "--dir", d]
        args += ["--ro-bind", r, r]
    args += ["--chdir", "/tmp", "--clearenv"]
    return args


@functools.cache
def _bwrap_works(python: str, root: bool) -> bool:
    args = _bwrap_args(python, root, 1)
    if not args:
        return False
    try:
        r = subprocess.run([*args, "--", python, "-I", "-B", "-c", "import json"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def _plan(cfg: SandboxConfig) -> dict:
    """Decide the isolation level, interpreter, privilege drop and namespaces for ``cfg`` (cached probes)."""
    is_root = os.geteuid() == 0
    python = cfg.python or sys.executable
    with _probe_lock:
        if cfg.backend != "legacy" and _bwrap_works(python, is_root):
            return {
                "level": "bwrap",
                "prefix": [],
                "net_ns": True,
                "pid_ns": True,
                "python": python,
                "ids": "slot" if is_root and cfg.drop_privileges else None,
                "root_parent": is_root,
            }
        if cfg.backend == "bwrap":
            raise RuntimeError("sandbox: backend='bwrap' but bubblewrap is missing or does not work here")
        if cfg.backend == "auto":
            _warn_once(
                "bwrap",
                "sandbox: bubblewrap (bwrap) is unavailable or does not work here; falling back to "
                "unshare + rlimits (install it: apt-get install -y bubblewrap)",
            )
        prefix = _unshare_prefix(cfg.isolate_network, cfg.isolate_pids)
        if prefix is None and cfg.isolate_pids:  # maybe only the network namespace works
            prefix = _unshare_prefix(cfg.isolate_network, False)
        net_ns = prefix is not None and "-n" in prefix
        pid_ns = prefix is not None and "-p" in prefix
        if cfg.isolate_network and not net_ns:
            _warn_once(
                "net",
                "sandbox: network namespaces are unavailable (unshare -n failed); "
                "falling back to the in-process socket audit hook only",
            )
        ids = None
        if cfg.drop_privileges and is_root:
            nb = _nobody()
            if nb is None:
                _warn_once("nobody", "sandbox: running as root and no 'nobody' user; user code runs as root")
            else:
                candidates = [python] if cfg.python else [sys.executable, shutil.which("python3", path="/usr/bin:/bin")]
                for cand in candidates:
                    if cand and _usable_as(cand, *nb):
                        python, ids = cand, nb
                        break
                if ids is not None and python != sys.executable and not cfg.python:
                    _warn_once(
                        "syspython",
                        f"sandbox: the current interpreter is not usable by 'nobody'; user code "
                        f"runs with {python} (packages installed only in the current environment, "
                        "e.g. numpy, are unavailable there; install bubblewrap to keep them)",
                    )
                if ids is None:
                    _warn_once("drop", "sandbox: no interpreter usable by 'nobody'; user code runs as root")
    return {
        "level": "namespaces" if prefix else "process",
        "prefix": list(prefix) if prefix else [],
        "net_ns": net_ns,
        "pid_ns": pid_ns,
        "python": python,
        "ids": ids,
        "root_parent": is_root,
    }


def isolation_report(cfg: SandboxConfig | None = None) -> dict:
    """What isolation the sandbox gets here: level, namespaces, privilege drop, interpreter."""
    cfg = cfg or SandboxConfig()
    p = _plan(cfg)
    dropped = p["ids"] is not None or (p["level"] == "bwrap" and not p["root_parent"])
    return {
        "level": p["level"],
        "network_namespace": p["net_ns"],
        "pid_namespace": p["pid_ns"],
        "mount_namespace": p["level"] == "bwrap",
        "private_tmp": p["level"] == "bwrap",
        "unshare_prefix": " ".join(p["prefix"]),
        "parent_is_root": p["root_parent"],
        "runs_as_uid": (
            "uid_base + 256 * (pid % 4096) + slot"
            if p["ids"] == "slot"
            else (p["ids"][0] if p["ids"] else (65534 if p["level"] == "bwrap" else os.geteuid()))
        ),
        "privileges_dropped": dropped,
        "rlimit_nproc_effective": p["ids"] is not None or not p["root_parent"],
        "python": p["python"],
        "audit_hook": cfg.audit_hook,
    }


# ---------------------------------------------------------------------------------------------
# running
# ---------------------------------------------------------------------------------------------

_slots_lock = threading.Lock()
_slots_busy: set[int] = set()
_slot_next = [0]


def _uid_alive(uid: int) -> bool:
    """Does any process of ``uid`` exist on this machine (a previous run's, still being torn down)?"""
    for e in os.scandir("/proc"):
        if e.name.isdigit():
            with contextlib.suppress(OSError):
                if e.stat().st_uid == uid:
                    return True
    return False


@contextlib.contextmanager
def _uid_slot(uid_of=None):
    """A slot number no other run of this process holds (one uid per concurrent run).

    Slots rotate (a slot is reused only after the 255 others), and with ``uid_of`` a slot whose uid
    still has a process anywhere on the machine is skipped: nothing of one run (its processes, and
    with them anything charged to the uid) is there when the next run gets that uid.
    """
    with _slots_lock:
        for i in range(256):
            k = (_slot_next[0] + i) % 256
            if k in _slots_busy or (uid_of is not None and _uid_alive(uid_of(k))):
                continue
            _slots_busy.add(k)
            _slot_next[0] = (k + 1) % 256
            break
        else:
            raise RuntimeError("sandbox: no free uid slot (256 runs of this process at once, or their uids still busy)")
    try:
        yield k
    finally:
        with _slots_lock:
            _slots_busy.discard(k)


# System calls per architecture (audit arch, numbers by name) that the seccomp filter refuses in part or whole.
_SYSCALLS: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (0xC000003E, {
        "add_key": 248, "request_key": 249, "keyctl": 250, "mincore": 27, "madvise": 28, "clone": 56,
        "fcntl": 72, "flock": 73, "ptrace": 101, "readahead": 187, "io_setup": 206, "fadvise64": 221,
        "inotify_init": 253, "inotify_add_watch": 254, "unshare": 272, "inotify_init1": 294, "setns": 308,
        "process_vm_readv": 310, "process_vm_writev": 311, "preadv2": 327, "pwritev2": 328,
        "io_uring_setup": 425, "clone3": 435, "pidfd_getfd": 438, "cachestat": 451,
        "fork": 57, "vfork": 58, "memfd_create": 319, "shmget": 29,
    }),
    "aarch64": (0xC00000B7, {
        "add_key": 217, "request_key": 218, "keyctl": 219, "mincore": 232, "madvise": 233, "clone": 220,
        "fcntl": 25, "flock": 32, "ptrace": 117, "readahead": 213, "io_setup": 0, "fadvise64": 223,
        "inotify_add_watch": 27, "unshare": 97, "inotify_init1": 26, "setns": 268,
        "process_vm_readv": 270, "process_vm_writev": 271, "preadv2": 286, "pwritev2": 287,
        "io_uring_setup": 425, "clone3": 435, "pidfd_getfd": 438, "cachestat": 451,
        "memfd_create": 279, "shmget": 194,
    }),
}  # fmt: skip

SECCOMP_DENIED = (
    # the kernel keyrings: keys outlive a run (user and session keyrings; the session keyring is the trainer's)
    "add_key", "request_key", "keyctl",
    # page-cache residency probes and resets (a channel between runs and between concurrent candidates
    # through the page cache of shared files such as /usr's); io_setup / io_uring_setup would reach the
    # same operations (RWF_NOWAIT reads, fadvise, madvise) past this filter
    "mincore", "readahead", "fadvise64", "cachestat", "io_setup", "io_uring_setup",
    # whole-file locks and file-access notification on shared files
    "flock", "inotify_init", "inotify_init1", "inotify_add_watch",
    # other processes' memory and files, other namespaces
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "setns",
)  # fmt: skip
"""System calls the seccomp filter answers with ``EPERM`` whatever their arguments."""

SECCOMP_DENIED_ARGS = {
    "preadv2": (5, "mask", 0x8),  # RWF_NOWAIT: a read that fails unless the data is cached (a residency probe)
    "pwritev2": (5, "mask", 0x8),
    "madvise": (2, "in", (20, 21)),  # MADV_COLD, MADV_PAGEOUT: evict (file) pages from the page cache
    # F_GETLK, F_SETLK, F_SETLKW, F_OFD_GETLK, F_OFD_SETLK, F_OFD_SETLKW, F_SETLEASE, F_NOTIFY
    "fcntl": (1, "in", (5, 6, 7, 36, 37, 38, 1024, 1026)),
    "unshare": (0, "mask", 0x10000000),  # CLONE_NEWUSER: no nested user namespaces
    "clone": (0, "mask", 0x10000000),
}  # fmt: skip
"""System calls the filter answers with ``EPERM`` for some arguments: ``name: (argument index, "mask", bits)``
(refused when the argument has any of ``bits``) or ``(index, "in", values)``; the low 32 bits of the argument
are read, as the kernel reads these (``int`` / ``unsigned int``) arguments. ``clone3`` (whose flags are in
memory the filter cannot read) is answered with ``ENOSYS``, so the C library falls back to ``clone``."""


SECCOMP_BUDGET_DENIED = ("fork", "vfork", "memfd_create", "shmget")
"""System calls the second filter answers with ``EPERM`` once the candidate's code is about to run: with
``clone`` without ``CLONE_THREAD`` (a new process; threads stay), they are the ways to hold memory outside
the one process whose ``RLIMIT_AS`` is ``memory_mb`` (a child's address space, a memory file, a SysV
shared-memory segment, which outlives its detach)."""

SECCOMP_BUDGET_DENIED_ARGS = {"clone": (0, "unmasked", 0x10000)}  # no CLONE_THREAD: a new process
"""``(index, "unmasked", bits)``: refused when the argument has none of ``bits``."""


@functools.cache
def seccomp_program(machine: str | None = None, budget: bool = False) -> bytes | None:
    """Classic-BPF seccomp filter: ``EPERM`` for :data:`SECCOMP_DENIED`, for the arguments of
    :data:`SECCOMP_DENIED_ARGS` and for every x32 / foreign-ABI call; ``ENOSYS`` for ``clone3``.
    With ``budget``, the rules of :func:`seccomp_budget_program` too (one filter where the process that
    starts is the one that runs the candidate's code: every mode but stdio's server).

    ``None`` on an architecture this module has no system-call numbers for.
    """
    rules = list(SECCOMP_DENIED_ARGS.items())
    if budget:
        return _filter(
            machine, SECCOMP_DENIED + SECCOMP_BUDGET_DENIED, rules + list(SECCOMP_BUDGET_DENIED_ARGS.items())
        )
    return _filter(machine, SECCOMP_DENIED, rules)


@functools.cache
def seccomp_budget_program(machine: str | None = None) -> bytes | None:
    """The filter that keeps the candidate's code in one process: ``EPERM`` for :data:`SECCOMP_BUDGET_DENIED`
    and :data:`SECCOMP_BUDGET_DENIED_ARGS`, so that ``memory_mb`` (the process's ``RLIMIT_AS``) bounds the
    memory of the run. The bootstrap installs it in a stdio case's child after the server's fork (in the
    other modes :func:`seccomp_program` with ``budget`` holds its rules). ``None`` as for :func:`seccomp_program`."""
    return _filter(machine, SECCOMP_BUDGET_DENIED, list(SECCOMP_BUDGET_DENIED_ARGS.items()), enosys=())


def _filter(machine: str | None, denied, rules: list, enosys: tuple = ("clone3",)) -> bytes | None:
    "The classic-BPF program: ``denied`` names, ``rules`` ``[(name, (index, kind, what)), ...]``, ``enosys`` names."
    import errno
    import platform
    import struct

    spec = _SYSCALLS.get(machine or platform.machine())
    if spec is None:
        return None
    arch, nrs = spec
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    # instructions (code, jt, jf, k); a jump target is an offset or a label ("deny", "enosys", "args:<name>")
    prog: list[tuple[int, int | str, int | str, int]] = [(ld, 0, 0, 4), (jeq, 0, "deny", arch), (ld, 0, 0, 0)]
    if arch == 0xC000003E:
        prog.append((jge, "deny", 0, 0x40000000))  # x32 system calls
    prog += [(jeq, "deny", 0, nrs[n]) for n in denied if n in nrs]
    prog += [(jeq, "enosys", 0, nrs[n]) for n in enosys]
    by_name: dict[str, list] = {}
    for n, rule in rules:
        by_name.setdefault(n, []).append(rule)
    prog += [(jeq, "args:" + n, 0, nrs[n]) for n in by_name]
    allow = (ret, 0, 0, 0x7FFF0000)  # SECCOMP_RET_ALLOW
    prog.append(allow)
    labels: dict[str, int] = {}
    for n, rs in by_name.items():
        labels["args:" + n] = len(prog)
        for idx, kind, what in rs:  # each rule may refuse; past them all, the call is allowed
            prog.append((ld, 0, 0, 16 + 8 * idx))  # the low word of args[idx] (little-endian)
            if kind == "mask":
                prog.append((jset, "deny", 0, what))
            elif kind == "unmasked":
                prog.append((jset, 0, "deny", what))
            else:
                prog += [(jeq, "deny", 0, v) for v in what]
        prog.append(allow)
    labels["deny"] = len(prog)
    prog.append((ret, 0, 0, 0x00050000 | errno.EPERM))  # SECCOMP_RET_ERRNO
    labels["enosys"] = len(prog)
    prog.append((ret, 0, 0, 0x00050000 | errno.ENOSYS))
    out = b""
    for pc, (code, jt, jf, k) in enumerate(prog):
        jt, jf = (labels[j] - pc - 1 if isinstance(j, str) else j for j in (jt, jf))
        if not (0 <= jt <= 255 and 0 <= jf <= 255):
            raise AssertionError("seccomp_program: a jump too far for classic BPF")
        out += struct.pack("=HBBI", code, jt, jf, k)
    return out


def _env(home: str) -> dict:
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": home,
        "LANG": "C.UTF-8",
        "TMPDIR": home,
        # one BLAS/OpenMP thread: keeps numeric libraries inside RLIMIT_AS and the CPU budget
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def _read_memfd(fd: int, cap: int) -> tuple[str, bool]:
    size = os.fstat(fd).st_size
    data = os.pread(fd, cap, 0)
    return data.decode("utf-8", errors="replace"), size >= cap


def _write_all(fd: int, data: bytes) -> None:
    with contextlib.suppress(OSError):
        with os.fdopen(fd, "wb", closefd=True) as f:
            f.write(data)
        return
    with contextlib.suppress(OSError):
        os.close(fd)


#: Seconds a candidate whose judge gave up may take to exit on its own before it is killed (bounded by the run's
#: own time limit): long enough for bwrap to reap a process that already ended, short for one that did not.
_EXIT_GRACE_S = 1.0


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _status_from_rc(rc: int | None, timed_out: bool, over: bool) -> str:
    if timed_out:
        return "timeout"
    if over or rc in (-signal.SIGXFSZ, 128 + signal.SIGXFSZ):
        return "output_limit"
    if rc in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
        return "timeout"
    if rc in (-signal.SIGKILL, 128 + signal.SIGKILL):
        return "killed"
    if rc == RC_MEMORY:
        return "memory"
    if rc == RC_BLOCKED:
        return "blocked"
    return "ok" if rc == 0 else "error"


# ---------------------------------------------------------------------------------------------
# the clock: wall time that does not count the time a run's processes waited for a CPU
# ---------------------------------------------------------------------------------------------


def _tree(roots: list[int]) -> list[int]:
    """``roots`` and all their descendants (from the parent pids in ``/proc/<pid>/stat``)."""
    kids: dict[int, list[int]] = {}
    for e in os.scandir("/proc"):
        if e.name.isdigit():
            try:
                with open(f"/proc/{e.name}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            kids.setdefault(ppid, []).append(int(e.name))
    out, todo = [], list(roots)
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, ()))
    return out


def _run_delays(pids: list[int]) -> dict[int, tuple[int, int]]:
    """Per thread of ``pids``: (nanoseconds on a CPU, nanoseconds runnable but waiting for one) (``schedstat``)."""
    out = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                    cpu, delay = f.read().split()[:2]
                out[int(tid)] = (int(cpu), int(delay))
            except (OSError, ValueError, IndexError):
                continue
    return out


class _RunDeadline:
    """The limit of one run: ``timeout_s`` of wall time, not counting the time its processes sat
    runnable without a CPU (a loaded machine), and never more than ``max_wall_s`` of plain wall time.

    The clock always advances by at least the CPU time the run itself used, so a run that keeps
    many of its own threads or processes runnable (a fork bomb) cannot stretch its limit by
    starving itself."""

    def __init__(self, timeout_s: float, max_wall_s: float):
        self.t0 = self.last = time.monotonic()
        self.timeout, self.cap = timeout_s, max_wall_s
        self.starved = 0.0
        self.seen: dict[int, tuple[int, int]] = {}

    def sample(self, roots: list[int]) -> None:
        stats = _run_delays(_tree(roots))
        now = time.monotonic()
        dt = now - self.last
        ran = sum(max(0, c - self.seen.get(t, (0, 0))[0]) for t, (c, _) in stats.items()) / 1e9
        waited = sum(max(0, d - self.seen.get(t, (0, 0))[1]) for t, (_, d) in stats.items()) / 1e9
        self.seen.update(stats)
        self.starved += max(0.0, min(waited, dt, dt - ran))
        self.last = now

    def left(self) -> float:
        now = time.monotonic()
        return min(self.timeout - (now - self.t0 - self.starved), self.cap - (now - self.t0))


def _wait(
    proc: subprocess.Popen | _ServedJudge, clock: _RunDeadline, roots: list[int], drain: int | None = None, sink=None
) -> bool:
    """Wait for ``proc`` to exit within ``clock``; True if the clock ran out first (``proc`` is still running).

    ``drain``: a pipe read into ``sink`` (a bytearray, last 16 KiB kept) meanwhile.
    """
    try:
        pidfd = os.dup(proc.pidfd) if isinstance(proc, _ServedJudge) else os.pidfd_open(proc.pid)
    except (OSError, AttributeError):
        pidfd = None
    try:
        while True:
            left = clock.left()
            if left <= 0:
                return proc.poll() is None
            step = min(left, 0.5)
            if pidfd is None:
                try:
                    proc.wait(timeout=step)
                    return False
                except subprocess.TimeoutExpired:
                    pass
            else:
                fds = [pidfd] + ([drain] if drain is not None else [])
                ready, _, _ = select.select(fds, [], [], step)
                if drain is not None and drain in ready:
                    chunk = os.read(drain, 65536)
                    if chunk and sink is not None:
                        sink += chunk
                        del sink[:-16384]
                    elif not chunk:
                        drain = None
                if pidfd in ready:
                    return False
                if ready:
                    continue
            clock.sample(roots)
    finally:
        if pidfd is not None:
            os.close(pidfd)


class _Candidate:
    """One candidate process under the planned isolation; ``fds`` are passed through unchanged."""

    def __init__(self, code: str, cfg: SandboxConfig, mode: str, fds: dict, slot: int | None):
        self.cfg = cfg
        self.plan = _plan(cfg)
        self.work = None
        plan = self.plan
        uid = gid = None
        if plan["level"] == "bwrap":
            cwd = "/tmp"
            if plan["ids"] == "slot":
                uid = gid = _slot_uid(cfg, slot)
        else:
            self.work = tempfile.mkdtemp(prefix="tiltlab-sbx-")
            cwd = self.work
            if plan["ids"]:
                uid, gid = plan["ids"]
                os.chown(self.work, uid, gid)
        # the process that starts runs the candidate's code, except stdio's server (it forks one child per case,
        # which installs the budget filter itself)
        filt = seccomp_program(budget=mode != "stdio")
        boot = {
            "cwd": cwd,
            "program": code,
            "mode": mode,
            "cpu_s": _cpu_s(cfg),
            "fsize": int(max(cfg.max_file_mb * (1 << 20), cfg.max_output_bytes)),
            "nofile": cfg.nofile,
            "nproc": cfg.nproc,
            "as_bytes": int(cfg.memory_mb) << 20,
            "uid": uid,
            "gid": gid,
            "block_processes": cfg.block_processes,
            "audit_hook": cfg.audit_hook,
            # under bwrap the OS is the boundary and ctypes stays usable (numpy needs it)
            "block_ctypes": plan["level"] != "bwrap",
            # bwrap installs the filter itself (--seccomp); below it the bootstrap does
            "seccomp": filt.hex() if filt is not None and plan["level"] != "bwrap" else "",
            "budget_seccomp": (seccomp_budget_program() or b"").hex() if mode == "stdio" else "",
            "max_reply": _reply_cap(cfg),
            "recursion": _RECURSION,
            **fds,
        }
        rb, wb = os.pipe()
        keep = [rb]
        self.out = os.memfd_create("tiltlab-sbx-stdout")
        self.err = os.memfd_create("tiltlab-sbx-stderr")
        site = _site_dirs(plan["python"])
        boot["site"] = site
        cmd = [plan["python"], "-I", "-B", *(["-S"] if site is not None else []), "-c", _BOOT, str(rb)]
        env = _env(cwd)
        if plan["level"] == "bwrap":
            pre = _bwrap_args(plan["python"], plan["root_parent"], cfg.disk_mb)
            if filt is not None:
                sr, sw = os.pipe()
                os.write(sw, filt)  # a few hundred bytes: far below the pipe buffer
                os.close(sw)
                keep.append(sr)
                pre += ["--seccomp", str(sr)]
            for k, v in env.items():
                pre += ["--setenv", k, v]
            cmd = [*pre, "--", *cmd]
        else:
            if plan["pid_ns"]:
                # keep the interpreter off PID 1 (PID 1 ignores default-action signals such as SIGXCPU)
                cmd = ["/bin/sh", "-c", '"$@"; exit $?', "sh", *cmd]
            cmd = plan["prefix"] + cmd
        self.t0 = time.monotonic()
        try:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=self.out,
                stderr=self.err,
                cwd=cwd if self.work else "/",
                env=env,
                start_new_session=True,
                pass_fds=(*keep, *fds.values()),
            )
        except BaseException:
            os.close(wb)
            for fd in (self.out, self.err):
                os.close(fd)
            if self.work:
                shutil.rmtree(self.work, ignore_errors=True)
            raise
        finally:
            for fd in keep:
                os.close(fd)
        _write_all(wb, json.dumps(boot).encode())

    def finish(self, rc: int | None, timed_out: bool) -> SandboxResult:
        cap = self.cfg.max_output_bytes
        stdout, over_out = _read_memfd(self.out, cap)
        stderr, over_err = _read_memfd(self.err, cap)
        status = _status_from_rc(rc, timed_out, over_out or over_err)
        iso = {
            "level": self.plan["level"],
            "network_namespace": self.plan["net_ns"],
            "pid_namespace": self.plan["pid_ns"],
            "privileges_dropped": self.plan["ids"] is not None
            or (self.plan["level"] == "bwrap" and not self.plan["root_parent"]),
            "seccomp": seccomp_program() is not None,
        }
        return SandboxResult(status, rc, stdout, stderr, time.monotonic() - self.t0, iso)

    def close(self) -> None:
        if self.proc.poll() is None:
            _kill_group(self.proc)
            self.proc.wait()
        _kill_group(self.proc)  # anything the program left in its session
        for fd in (self.out, self.err):
            with contextlib.suppress(OSError):
                os.close(fd)
        if self.work:
            shutil.rmtree(self.work, ignore_errors=True)


def _site_dirs(python: str) -> list[str] | None:
    """The site-packages directories of ``python`` when it is this interpreter (it then starts with
    ``-S`` and gets them on ``sys.path`` directly: processing every ``.pth`` file of a large
    environment costs more CPU than the rest of a run), else None (a normal start)."""
    if os.path.realpath(python) != os.path.realpath(sys.executable):
        return None
    return [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")]


def _slot_uid(cfg: SandboxConfig, slot: int | None) -> int:
    if not 0 <= int(slot or 0) < 256:
        raise RuntimeError("sandbox: at most 256 concurrent runs per process")
    return cfg.uid_base + 256 * (os.getpid() % 4096) + int(slot or 0)


def _cpu_s(cfg: SandboxConfig) -> int:
    return int(cfg.cpu_s if cfg.cpu_s is not None else int(cfg.timeout_s) + 2)


def _reply_cap(cfg: SandboxConfig) -> int:
    return int(cfg.max_reply_mb * (1 << 20))


def _max_wall(cfg: SandboxConfig) -> float:
    return cfg.max_wall_s if cfg.max_wall_s is not None else 6.0 * cfg.timeout_s


def _slot_for(cfg: SandboxConfig):
    """The uid-slot context of one run: slots whose uid still has a process are skipped when the
    sandbox switches to a uid of its own (as root under bwrap)."""
    plan = _plan(cfg)
    return _uid_slot((lambda k: _slot_uid(cfg, k)) if plan["ids"] == "slot" else None)


def _config(config: SandboxConfig | None, overrides: dict) -> SandboxConfig:
    cfg = config or SandboxConfig()
    return SandboxConfig(**{**asdict(cfg), **overrides}) if overrides else cfg


def run_python(code: str, config: SandboxConfig | None = None, **overrides) -> SandboxResult:
    """Run ``code`` (Python source) as ``__main__``; keyword overrides update ``config``'s fields."""
    if not isinstance(code, str):
        raise ValueError(f"code must be a str, got {type(code).__name__}")
    cfg = _config(config, overrides)
    with _slot_for(cfg) as slot:
        cand = _Candidate(code, cfg, "run", {}, slot)
        try:
            timed_out = _wait(cand.proc, _RunDeadline(cfg.timeout_s, _max_wall(cfg)), [cand.proc.pid])
            if timed_out:
                _kill_group(cand.proc)
            rc = cand.proc.wait()
            _kill_group(cand.proc)  # reap anything the program left behind in its group
            return cand.finish(rc, timed_out)
        finally:
            cand.close()


def run_judged(
    code: str,
    tests: str,
    config: SandboxConfig | None = None,
    stdio: bool = False,
    entry_point: str | None = None,
    **overrides,
):
    """Run ``code`` in the sandbox and ``tests`` in a separate judge process; ``passed`` is the judge's verdict.

    ``tests`` is Python source. It sees every top-level callable the candidate's code defines
    (functions, classes; names of builtins and dunder names excepted) as a proxy, and
    ``__stdio__(input) -> str``, which runs the candidate's code as ``__main__`` with ``input`` on
    stdin (``stdio=True``: the code is not run at load time). ``entry_point`` names the candidate's
    function the task asks for: the tests reach that name in the candidate's code even when a builtin
    has it (``def pow(...)``), and a candidate that does not define it fails. The verdict is True iff
    the tests ran to the end with no failed assertion, no error and no broken exchange with the candidate.
    """
    if not isinstance(code, str) or not isinstance(tests, str):
        raise ValueError("code and tests must be str")
    if entry_point is not None and not (entry_point.isidentifier() and not entry_point.startswith("__")):
        raise ValueError(f"entry_point must be an identifier that is not a dunder name, got {entry_point!r}")
    cfg = _config(config, overrides)
    req_r, req_w = os.pipe()  # judge -> candidate
    rep_r, rep_w = os.pipe()  # candidate -> judge
    ver_r, ver_w = os.pipe()  # judge -> parent only
    jb_r, jb_w = os.pipe()
    err_r, err_w = os.pipe()  # the judge's stderr
    judge = cand = None
    try:
        with _slot_for(cfg) as slot:
            cand = _Candidate(code, cfg, "stdio" if stdio else "module", {"rfd": req_r, "wfd": rep_w}, slot)
            os.close(req_r)
            os.close(rep_w)
            req_r = rep_w = -1
            with tempfile.TemporaryDirectory(prefix="tiltlab-judge-") as jdir:
                jcfg = {
                    "tests": tests,
                    "as_bytes": int(cfg.memory_mb) << 20,
                    "cpu_s": _cpu_s(cfg),
                    "max_reply": _reply_cap(cfg),
                    "recursion": _RECURSION,
                    "site": _site_dirs(sys.executable),
                    "modules": sorted(JUDGE_MODULES),
                    "no_cross": list(NO_CROSS),
                    "entry": entry_point,
                }
                payload = {**jcfg, "cwd": jdir, "env": _env(jdir)}
                if cfg.judge_server:
                    judge = _served_judge((jb_r, req_w, rep_r, ver_w, err_w))
                if judge is None:
                    payload = {**jcfg, "wfd": req_w, "rfd": rep_r, "vfd": ver_w}
                    judge = subprocess.Popen(
                        [sys.executable, "-I", "-B", "-S", "-c", _JUDGE, str(jb_r)],
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=err_w,
                        cwd=jdir,
                        env=_env(jdir),
                        start_new_session=True,
                        pass_fds=(jb_r, req_w, rep_r, ver_w),
                    )
                for fd in (jb_r, req_w, rep_r, ver_w, err_w):
                    os.close(fd)
                jb_r = req_w = rep_r = ver_w = err_w = -1
                _write_all(jb_w, json.dumps(payload).encode())
                jb_w = -1
                clock = _RunDeadline(cfg.timeout_s, _max_wall(cfg))
                clock.t0 = clock.last = cand.t0
                jerr = bytearray()
                timed_out = _wait(judge, clock, [judge.pid, cand.proc.pid], drain=err_r, sink=jerr)
                if timed_out:
                    _kill_judge(judge)
                judge.wait()
                with contextlib.suppress(OSError):
                    while chunk := os.read(err_r, 65536):
                        jerr += chunk
                        del jerr[:-16384]
                verdict = False
                if not timed_out and judge.returncode == 0:
                    verdict = os.read(ver_r, 1) == b"1"
                if not timed_out and judge.returncode != 0:
                    # The judge gave up, typically because the candidate's process is going away (its pipes
                    # closed: a syntax error, an exit). Let it finish exiting, so its own exit status is
                    # recorded (a syntax error is "error") rather than the SIGKILL below; a served judge
                    # answers fast enough to get here while bwrap is still reaping the candidate.
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        cand.proc.wait(timeout=min(_EXIT_GRACE_S, max(0.0, clock.left())))
                _kill_group(cand.proc)
                rc = cand.proc.wait()
                res = cand.finish(rc if rc is not None else None, timed_out)
                res.verdict = verdict
                res.judge_stderr = jerr.decode("utf-8", "replace")[-4000:]
                if verdict:
                    res.status = "ok"
                elif res.status in ("ok", "killed"):
                    res.status = "failed"
                return res
    finally:
        if judge is not None:
            if judge.poll() is None:
                _kill_judge(judge)
                judge.wait()
            if isinstance(judge, _ServedJudge):
                judge.close()
        if cand is not None:
            cand.close()
        for fd in (req_r, req_w, rep_r, rep_w, ver_r, ver_w, jb_r, jb_w, err_r, err_w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)


def _pool(fn, items, max_workers: int | None, progress: bool):
    if not items:
        return []
    workers = max_workers or max(1, min(len(items), os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futs = [pool.submit(fn, it) for it in items]
        if progress:
            from tqdm.auto import tqdm

            for f in tqdm(futs, desc="sandbox", total=len(futs)):
                f.result()
        return [f.result() for f in futs]


def run_many(
    codes: list[str], config: SandboxConfig | None = None, max_workers: int | None = None, progress: bool = False
) -> list[SandboxResult]:
    """:func:`run_python` on several programs concurrently (a thread per running sandbox); input order."""
    return _pool(lambda c: run_python(c, config), codes, max_workers, progress)


def run_many_judged(
    jobs: list[tuple[str, str, bool]] | list[tuple[str, str, bool, str | None]],
    config: SandboxConfig | None = None,
    max_workers: int | None = None,
    progress: bool = False,
) -> list[SandboxResult]:
    """:func:`run_judged` on ``(code, tests, stdio)`` or ``(code, tests, stdio, entry_point)`` jobs
    concurrently; results in input order.

    ``max_workers`` defaults to the number of CPUs.
    """
    return _pool(
        lambda j: run_judged(j[0], j[1], config, stdio=j[2], entry_point=j[3] if len(j) > 3 else None),
        jobs,
        max_workers,
        progress,
    )
