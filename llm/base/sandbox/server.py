"""The judge server: one interpreter started once per process, forking a fresh judge per run."""

from __future__ import annotations

import array
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from typing import ClassVar

from .config import JUDGE_MODULES
from .probe import _warn_once
from .proc import _env, _kill_group, _site_dirs, _write_all
from .programs import JUDGE_SERVER


class _Retired(Exception):
    "The server was retired after :meth:`_JudgeServer.get` returned it: ask the next one."


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


#: A judge server forks at most this many judges, then a fresh one (a new interpreter: a new random str/bytes
#: hash secret) takes the next runs while the old one finishes its own. Every judge of one server shares its
#: hash secret, and with it the iteration order of its sets of str; see docs/code-reward.md ("The hash secret").
JUDGES_PER_SERVER = 64


def _served_judge(fds: tuple[int, int, int, int, int]) -> _ServedJudge | None:
    """A judge from the judge server, or None (with a one-time warning) when the server cannot give
    one twice in a row: the caller then starts the judge as its own interpreter."""
    for attempt in (0, 1):
        cur = None
        try:
            cur = _JudgeServer.get()
            while True:
                try:
                    return cur.spawn(fds)
                except _Retired:
                    cur = _JudgeServer.get()
        except OSError as e:
            _JudgeServer.drop(cur)
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
    """The process-wide judge server (``programs/judge_server.py``), started on first use and again after it
    died, after this process forked and after :data:`JUDGES_PER_SERVER` judges (the retired one drains and
    exits); :meth:`spawn` returns a :class:`_ServedJudge`."""

    _lock = threading.Lock()
    _current: _JudgeServer | None = None
    _retired: ClassVar[list[_JudgeServer]] = []  # still finishing their judges; their socket stays open until they exit

    def __init__(self):
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        br, bw = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-B", "-S", JUDGE_SERVER, str(theirs.fileno()), str(br)],
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
        boot = {"site": _site_dirs(sys.executable), "preload": sorted(JUDGE_MODULES)}
        _write_all(bw, json.dumps(boot).encode())
        self.ctl, self.owner = mine, os.getpid()
        self.judges = 0  # asked for so far
        self.retired = False
        self._send = threading.Lock()  # a request is one message; a retirement comes after every request sent

    @classmethod
    def get(cls) -> _JudgeServer:
        with cls._lock:
            cls._retired = [r for r in cls._retired if r.owner == os.getpid() and not r._exited()]
            cur = cls._current
            if cur is not None and cur.owner == os.getpid() and cur.judges >= JUDGES_PER_SERVER:
                cur._retire()
                cur = None
            if cur is None or cur.owner != os.getpid() or cur.proc.poll() is not None:
                cls._current = cur = cls()
            cur.judges += 1
            return cur

    def _retire(self) -> None:
        """Ask no more of this server: it exits once its last judge is reaped (kept until then)."""
        with self._send:
            self.retired = True
            with contextlib.suppress(OSError):
                self.ctl.send(b"q")
        type(self)._retired.append(self)

    def _exited(self) -> bool:
        if self.proc.poll() is None:
            return False
        self.ctl.close()
        return True

    @classmethod
    def drop(cls, cur: _JudgeServer | None = None) -> None:
        """Forget the current server (it failed; with ``cur``: only if it is still ``cur``); the next
        :meth:`get` starts a new one."""
        with cls._lock:
            if cur is None or cls._current is cur:
                cur, cls._current = cls._current, None
            else:
                cur = None
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
                with self._send:
                    if self.retired:  # retired between get() and here: the next server takes this run
                        raise _Retired
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
