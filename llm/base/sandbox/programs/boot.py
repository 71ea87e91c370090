# The candidate's bootstrap, run by path: python -I -B [-S] <this file> <fd>, under the planned isolation. It
# reads its config (with the host's constants, sandbox.config) and the candidate's program from <fd>, sets its
# limits, then runs the program ("run"), or serves the judge's requests ("module", "stdio") with the codec
# (codec.py, beside this file, compiled before the privileges drop and run in this program's globals).
import json
import os
import resource
import sys

_f = os.fdopen(int(sys.argv[1]), "rb")
cfg = json.loads(_f.read())
_f.close()
RC_MEMORY, RC_BLOCKED, SCRIPT = cfg.pop("rc_memory"), cfg.pop("rc_blocked"), cfg.pop("script")
if cfg["mode"] != "run":  # the codec serves the judge's requests: compiled here, before the privileges drop
    _CODEC_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "codec.py")
    with open(_CODEC_PATH, encoding="utf-8") as _cf:
        _CODEC = compile(_cf.read(), _CODEC_PATH, "exec")  # run at the codec block below
    del _cf, _CODEC_PATH
del _f
sys.argv = [SCRIPT]  # what a program run as ``python solution.py`` (no arguments) sees
if cfg["site"] is not None:  # started with -S: the environment's packages without the .pth processing
    import site as _site

    sys.path.extend(cfg["site"])
    _site.setquit()
    _site.setcopyright()
    _site.sethelper()
    del _site
os.chdir(cfg["cwd"])


def _lim(name, v):
    resource.setrlimit(getattr(resource, name), (v, v))  # noqa: F821 (called before the `del resource` below)


_lim("RLIMIT_CORE", 0)
resource.setrlimit(resource.RLIMIT_CPU, (cfg["cpu_s"], cfg["cpu_s"] + 1))  # SIGXCPU first, SIGKILL 1 s later
_lim("RLIMIT_FSIZE", cfg["fsize"])
_lim("RLIMIT_NOFILE", cfg["nofile"])
if cfg["init_as"]:  # bwrap's init (pid 1, the parent) carries the run's limits, with its share of the budget
    for _r, _v in (("RLIMIT_AS", cfg["init_as"]), ("RLIMIT_CORE", 0), ("RLIMIT_NOFILE", cfg["nofile"])):
        resource.prlimit(1, getattr(resource, _r), (_v, _v))
    resource.prlimit(1, resource.RLIMIT_CPU, (cfg["cpu_s"], cfg["cpu_s"] + 1))
    resource.prlimit(1, resource.RLIMIT_FSIZE, (cfg["fsize"], cfg["fsize"]))
if cfg["uid"] is not None:
    os.setgroups([])
    os.setgid(cfg["gid"])
    os.setuid(cfg["uid"])
if cfg["seccomp"]:  # below the bwrap level the bootstrap installs the filter itself
    import ctypes
    import struct

    _libc = ctypes.CDLL(None, use_errno=True)
    _prog = bytes.fromhex(cfg["seccomp"])
    _buf = ctypes.create_string_buffer(_prog)
    _fprog = struct.pack("HxxxxxxQ", len(_prog) // 8, ctypes.addressof(_buf))
    if _libc.prctl(38, 1, 0, 0, 0) != 0 or _libc.prctl(22, 2, ctypes.c_char_p(_fprog), 0, 0) != 0:
        os._exit(213)
    del ctypes, struct, _libc, _prog, _buf, _fprog
_lim("RLIMIT_NPROC", cfg["nproc"])
# the hard limit is above the soft one in stdio's server only: its case children lower theirs (_budget)
resource.setrlimit(resource.RLIMIT_AS, (cfg["as_bytes"], cfg["as_hard"]))


def _budget():
    "The second filter (one process, no memory files): before the candidate's code runs."


if cfg["budget_seccomp"]:  # ctypes is set up here, before the audit hook that may block it
    import ctypes as _ct
    import struct as _st

    _bl = _ct.CDLL(None, use_errno=True)
    _bprog = bytes.fromhex(cfg["budget_seccomp"])
    _bbuf = _ct.create_string_buffer(_bprog, len(_bprog))
    _bf = _ct.create_string_buffer(_st.pack("HxxxxxxQ", len(_bprog) // 8, _ct.addressof(_bbuf)), 16)
    _bnnp, _bset, _bas = _bl.prctl, _bl.prctl, _bl.setrlimit
    _brl = (_ct.c_ulong * 2)(cfg["case_as_bytes"], cfg["case_as_bytes"])  # struct rlimit

    def _budget():
        "The case's share of the budget (RLIMIT_AS, 9) and the second filter: before the candidate's code runs."
        if _bas(9, _brl) != 0 or _bnnp(38, 1, 0, 0, 0) != 0 or _bset(22, 2, _bf, 0, 0) != 0:
            os._exit(213)

    del _st
src = cfg.pop("program")
_ROOT = os.path.realpath(cfg["cwd"])
_PROC = frozenset(
    (
        "os.fork",
        "os.forkpty",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "os.system",
        "subprocess.Popen",
        "os.kill",
        "os.killpg",
        "pty.spawn",
        "os.startfile",
    )
)
_NET = frozenset(
    (
        "socket.__new__",
        "socket.connect",
        "socket.bind",
        "socket.getaddrinfo",
        "socket.gethostbyname",
        "socket.gethostbyaddr",
        "socket.sendto",
        "socket.sendmsg",
        "socket.socketpair",
    )
)
_FFI = frozenset(
    (
        "ctypes.dlopen",
        "ctypes.dlsym",
        "ctypes.cdata",
        "ctypes.addressof",
        "ctypes.call_function",
        "ctypes.string_at",
        "ctypes.wstring_at",
        "resource.setrlimit",
        "resource.prlimit",
        "sys.remote_exec",
    )
)
_MUT = frozenset(
    (
        "os.remove",
        "os.rmdir",
        "os.mkdir",
        "os.chmod",
        "os.chown",
        "os.truncate",
        "os.utime",
        "os.link",
        "os.symlink",
        "os.rename",
        "shutil.rmtree",
        "shutil.copyfile",
        "shutil.copymode",
        "shutil.copystat",
        "shutil.move",
        "os.chflags",
        "os.lchflags",
        "os.setxattr",
        "os.removexattr",
        "os.mkfifo",
        "os.mknod",
    )
)
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
            isinstance(flags, int) and flags & _WFLAGS
        )
        if writing and not _inside(path):
            _deny(f"write outside the working directory blocked: {path!r}")
    elif event in _MUT:
        for a in args[:2]:
            if isinstance(a, (str, bytes, os.PathLike)) and not _inside(a):
                _deny(f"{event} outside the working directory blocked")
    elif event in _NET:
        _deny(f"network blocked ({event})")
    elif event == "resource.setrlimit" and args and args[0] == _RLIMIT_STACK:
        pass  # the stack limit (a deep-recursion idiom): the hard limits and RLIMIT_AS still bound the run
    elif event in _FFI and (_BLOCK_FFI or not event.startswith("ctypes.")):
        _deny(f"{event} blocked")
    elif _BLOCK_PROC and event in _PROC and not (_FORKING[0] and event == "os.fork"):
        _deny(f"process creation/signals blocked ({event})")


if cfg["audit_hook"]:
    sys.addaudithook(_hook)
_RLIMIT_STACK = resource.RLIMIT_STACK
del json, resource
import traceback as _tb

_MODE = cfg["mode"]
_FILE = os.path.join(cfg["cwd"], SCRIPT)  # the program's __file__, as ``python solution.py`` sets it (no file there)


def _module(name):
    "A fresh module of this name in sys.modules, its globals the program's (dataclasses and pickle look it up)."
    m = type(sys)(name)
    m.__dict__.update({"__builtins__": __builtins__, "__file__": _FILE})
    sys.modules[name] = m
    return m.__dict__


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
        os._exit(RC_MEMORY)
    os._exit(RC_BLOCKED if _BLOCKED[0] else 1)


try:
    code = compile(src, "<program>", "exec")
except BaseException as e:
    _died(e)
del src
if _MODE == "run":
    g = _module("__main__")
    del cfg
    _budget()
    try:
        exec(code, g)
    except SystemExit:
        raise
    except BaseException as e:
        _died(e)
    sys.exit(0)
# the codec: its definitions in this program's globals (static checkers read the import)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from .codec import (
        _ALL_ENUMS,
        _BYVAL,
        _DSEEN,
        _dec,
        _enc,
        _ident,
        _moved,
        _whole,
    )
else:
    exec(_CODEC, globals())
del _CODEC, TYPE_CHECKING
import atexit
import io as _io  # noqa: F401 (unused, kept as it was)
import json as _json

_rq = os.fdopen(cfg["rfd"], "rb")
_rs = os.fdopen(cfg["wfd"], "wb")
_cap = cfg["max_reply"]
from binascii import b2a_base64 as _b64

_RLIM = cfg["recursion"]
_table = {}  # type: ignore[var-annotated]
_DC_BY_REF = True
_ALL_ENUMS = False


def _handle(v):
    _table[id(v)] = v
    return {"h": id(v)}


def _dcref(v):
    return _handle(v)["h"]


_objref = _dcref


def _mro_names(t):
    return [c.__name__ for c in t.__mro__][:64]


def _err(e):
    "An exception as it crosses: its class name, its message and the names of its MRO (the judge picks the class)."
    return [type(e).__name__, str(e)[:500], _mro_names(type(e))]


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


g = _module("solution") if _MODE == "module" else {"__name__": "__main__", "__builtins__": __builtins__}
_OWN = g
if _MODE == "module":
    _budget()
    try:
        exec(code, g)
        _send(
            {
                "names": sorted(k for k, v in g.items() if callable(v) and not k.startswith("__")),
                "excs": {
                    k: _mro_names(v)
                    for k, v in g.items()
                    if isinstance(v, type) and issubclass(v, BaseException) and v.__name__ == k
                },
                "modules": {k: v.__name__ for k, v in g.items() if type(v) is type(os) and not k.startswith("__")},
            }
        )
    except MemoryError as e:
        _died(e)
    except BaseException as e:
        _send({"e": _err(e)})
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
        sys.stdin = sys.__stdin__ = open(0, "r", closefd=False)  # type: ignore[misc]  # noqa: UP015
        sys.stdout = sys.__stdout__ = open(1, "w", closefd=False)  # type: ignore[misc]
        main = _module("__main__")
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
    data = b"".join(chunks)  # the output's bytes (the cap is on them, not on an encoding of them)
    del chunks[:]
    return data


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
        w = [
            [k, [[n, _enc(x, _handle), x is was[k].get(n)] for n, x in dict.items(o.__dict__) if _ident(n)]]
            for k, o in crossed.items()
            if _moved(o, was[k], _ORIG)
        ]
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
    out: dict = {}
    try:
        req = _wire(_json.loads, line)
        op = req["op"]
        _BYVAL = frozenset(n for n in req.get("cls", ()) if type(n) is str)
        if op == "stdio":  # the output as base64: a 32 MiB output of any bytes fits a reply of 4/3 of that
            out["o"] = _b64(_stdio(req["input"]), newline=False)
        else:
            obj = _dec(req["obj"], _remote)
            if op == "call":
                sent, ksent = req["args"], req["kwargs"]["d"]
                # crossed: key -> the objects the arguments brought (the judge's plain classes), kept to send
                # back in place what the call changed in them
                args, kwargs, crossed = _wire(
                    _whole, lambda: (_dec(sent, _remote), _dec(req["kwargs"], _remote), _DSEEN)
                )
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
            elif op == "repr":
                res = repr(obj)
            elif op == "bool":
                res = bool(obj)
            elif op == "getitem":
                res = obj[_wire(_dec, req["key"], _remote)]
            else:
                raise ValueError("unknown op")
        if op == "iter":
            out["v"] = _handle(res)
        elif op not in ("call", "stdio"):
            out["v"] = _wire(_whole, _enc, res, _handle)
    except MemoryError as e:
        _died(e)
    except BaseException as e:
        out.pop("v", None)
        out["e"] = _err(e)
    if type(out.get("o")) is bytes:  # written as is: base64 needs no JSON escapes, and no copy of it is made
        _rs.write(b'{"o": "')
        _rs.write(out.pop("o"))
        _rs.write(b'"}\n')
        _rs.flush()
        continue
    _send(out)
os._exit(0)
