# The judge server, run by path: python -I -B -S <this file> <socket> <boot fd>. Imports, path set-up and the
# judge's program (judge.py) and codec (codec.py), both beside this file, compiled once; per request (six
# descriptors over a Unix socket: the run's reply socket, the pipe its ``cfg`` comes through, the pipes to and
# from the candidate, the verdict pipe, stderr) a ``fork`` whose child is the judge; the reply socket gets the
# judge's pid and a pidfd, then its exit status. A message ``q`` retires the server: it takes no more requests
# and exits once its last judge is reaped. When the parent's end closes (the parent is gone, maybe killed with
# runs in flight) every live judge is killed through its pidfd, then the server exits. (tests/llm/base/hostile/
# corpus.py tells the server's process apart by this file's name on its command line.)
import _ast  # noqa: F401 (imported once here for every judge the server forks)
import array
import builtins
import json
import os
import resource  # noqa: F401 (as _ast)
import selectors
import signal
import socket
import sys
import traceback

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


def _compiled(name):
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
    with open(path, encoding="utf-8") as f:
        return compile(f.read(), path, "exec")


_code = _compiled("judge.py")
_codec = _compiled("codec.py")
_null = os.open(os.devnull, os.O_RDWR)
_sel = selectors.DefaultSelector()
_sel.register(_ctl, selectors.EVENT_READ)
_live = {}  # type: ignore[var-annotated]  # pidfd -> (pid, the run's reply socket)
_FDS = socket.CMSG_SPACE(8 * array.array("i").itemsize)


def _judge(fds):
    "In the forked child: the judge's process as a new interpreter would have it, then the judge's program."
    reply, cfd, wfd, rfd, vfd, efd = fds  # noqa: RUF059 (reply: kept open by the server)
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
    main.__dict__.update(__builtins__=builtins, cfg=cfg, _CODEC=_codec)
    sys.modules["__main__"] = main
    exec(_code, main.__dict__)  # ends in os._exit


def _ended():
    "The parent closed its end: it is gone (killed, perhaps with runs in flight). So are its judges."
    for _pfd in list(_live):
        try:
            signal.pidfd_send_signal(_pfd, signal.SIGKILL)
        except OSError:
            pass
    for _pfd in list(_live):
        _reaped(_pfd)
    sys.exit(0)


def _spawn():
    msg, anc, _fl, _ad = _ctl.recvmsg(16, _FDS)
    if not msg:
        _ended()
    if msg == b"q":  # retired (a fresh server with a new hash secret takes the next runs): exit once drained
        _draining.append(True)
        for fd in (fd for _lv, _ty, data in anc for fd in array.array("i", data[: len(data) - len(data) % 4])):
            os.close(fd)
        if not _live:
            sys.exit(0)
        return
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
        reply.sendmsg(
            [json.dumps({"pid": pid}).encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [pfd]))]
        )
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
    if _draining and not _live:
        sys.exit(0)


_draining = []  # type: ignore[var-annotated]
while True:
    for _key, _ev in _sel.select():
        if _key.fileobj is _ctl:
            _spawn()
        else:
            _reaped(_key.fileobj)
