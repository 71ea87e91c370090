"""Run untrusted Python (model-written code + unit tests) in a separate, limited process.

Layers (each is applied when the OS allows it; :func:`isolation_report` says which are active):

1. **Separate process, own session/process group**, killed with ``SIGKILL`` on the wall-clock
   timeout and always reaped (``killpg``) after it ends.
2. **Linux namespaces** via ``unshare``: a new *network* namespace (only a downed loopback, so no
   network at all) and a new *PID* namespace (when its init dies the kernel kills every process
   left inside it). Tried as ``unshare -n -p -f --kill-child`` (root / CAP_SYS_ADMIN), then with
   ``-r`` (unprivileged user namespace). If neither works a :class:`SandboxWarning` is issued
   once and only the in-process socket block (layer 5) stands between the program and the network.
3. **Privilege drop**: when the parent runs as root the child switches to ``nobody:nogroup``
   before running user code (so file permissions apply and ``RLIMIT_NPROC`` is enforced — the
   kernel does not apply ``RLIMIT_NPROC`` to root). This needs an interpreter that ``nobody`` can
   execute; ``sys.executable`` is tried first, then the system ``python3``; if none works the
   child stays root and a warning is issued.
4. **rlimits** (soft = hard, so they cannot be raised; RLIMIT_CPU's hard limit is 1 s above the soft
   one so SIGXCPU arrives before SIGKILL): ``RLIMIT_CPU`` (CPU seconds),
   ``RLIMIT_AS`` (address space), ``RLIMIT_FSIZE`` (largest file, incl. stdout/stderr files),
   ``RLIMIT_NPROC``, ``RLIMIT_NOFILE``, ``RLIMIT_CORE = 0``.
5. **Audit hook** (PEP 578) installed before user code: blocks process creation (``os.fork``,
   ``os.exec*``, ``os.posix_spawn``, ``os.system``, ``subprocess.Popen``, ...), signals to other
   processes, socket creation/connection/DNS, ``ctypes`` and any write/delete/rename/chmod
   outside the working directory. This is defense in depth, NOT a security boundary on its own
   (CPython audit hooks can be bypassed by sufficiently clever code); layers 1–4 are the boundary.
6. **Empty temporary working directory** (removed afterwards), **scrubbed environment**
   (``PATH``, ``HOME`` = ``TMPDIR`` = the work dir, ``LANG``, one-thread BLAS/OpenMP variables; nothing
   else), ``python -I -B`` (isolated mode:
   ignores ``PYTHON*`` variables and user site-packages), stdin from ``/dev/null``.
7. **Output cap**: stdout/stderr go to files capped by ``RLIMIT_FSIZE``; at most
   ``max_output_bytes`` of each is read back, and hitting the cap is reported as ``output_limit``.

:func:`run_python` returns a :class:`SandboxResult`; ``result.passed`` is True only for a clean
exit 0 with no limit hit. :func:`run_many` runs several programs concurrently (threads, each
sandbox is its own process).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
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
    "SandboxConfig",
    "SandboxResult",
    "SandboxWarning",
    "isolation_report",
    "run_many",
    "run_python",
]


class SandboxWarning(RuntimeWarning):
    """An isolation layer is unavailable on this OS / privilege level."""


@dataclass(frozen=True)
class SandboxConfig:
    """Limits for one sandboxed run."""

    timeout_s: float = 10.0
    """Wall-clock limit (seconds); the whole process group is SIGKILLed when it is exceeded."""
    cpu_s: int | None = None
    """RLIMIT_CPU in seconds; ``None`` = int(timeout_s) + 2."""
    memory_mb: int = 1024
    """RLIMIT_AS (virtual address space) in MiB."""
    max_file_mb: float = 16.0
    """Largest file the program may write (RLIMIT_FSIZE), MiB."""
    max_output_bytes: int = 1 << 20
    """Cap on stdout and on stderr (each); reaching it is status ``output_limit``."""
    nproc: int = 64
    """RLIMIT_NPROC (only effective when the child is not root)."""
    nofile: int = 64
    """RLIMIT_NOFILE."""
    isolate_network: bool = True
    """Use a network namespace when available (the audit-hook socket block is always on)."""
    isolate_pids: bool = True
    """Use a PID namespace when available."""
    drop_privileges: bool = True
    """When running as root, run user code as ``nobody``."""
    block_processes: bool = True
    """Audit-hook block on process creation (turn off only to test the rlimit layer)."""
    audit_hook: bool = True
    """Install the audit hook at all (turn off only to test the OS layers underneath it)."""
    python: str | None = None
    """Interpreter; ``None`` = auto (sys.executable if usable after the privilege drop, else system python3)."""

    def __post_init__(self):
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.memory_mb < 64:
            raise ValueError(f"memory_mb must be >= 64 (the interpreter needs it), got {self.memory_mb}")
        if self.max_output_bytes < 1 or self.max_file_mb <= 0 or self.nproc < 1 or self.nofile < 8:
            raise ValueError("max_output_bytes, max_file_mb, nproc must be positive and nofile >= 8")


@dataclass
class SandboxResult:
    """Outcome of one run. ``status``: ok | error | timeout | memory | output_limit | killed | blocked."""

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float
    isolation: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.status == "ok" and self.returncode == 0

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------------------------------------
# child bootstrap (runs with python -I -B -c BOOT <config.json>); stdlib only
# ---------------------------------------------------------------------------------------------

_BOOT = r"""
import json, os, resource, sys
cfg = json.load(open(sys.argv[1]))
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
if cfg["nproc"] is not None:
    _lim("RLIMIT_NPROC", cfg["nproc"])
_lim("RLIMIT_AS", cfg["as_bytes"])
src = open(cfg["program"]).read()
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
def _hook(event, args):
    if event == "open":
        path, mode, flags = (tuple(args) + (None, None, None))[:3]
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & _WFLAGS)
        if writing and not _inside(path):
            raise PermissionError(f"sandbox: write outside the working directory blocked: {path!r}")
    elif event in _MUT:
        for a in args[:2]:
            if isinstance(a, (str, bytes, os.PathLike)) and not _inside(a):
                raise PermissionError(f"sandbox: {event} outside the working directory blocked")
    elif event in _NET:
        raise PermissionError(f"sandbox: network blocked ({event})")
    elif event in _FFI:
        raise PermissionError(f"sandbox: {event} blocked")
    elif _BLOCK_PROC and event in _PROC:
        raise PermissionError(f"sandbox: process creation/signals blocked ({event})")
if cfg["audit_hook"]:
    sys.addaudithook(_hook)
del json, resource
code = compile(src, "<program>", "exec")
g = {"__name__": "__main__", "__builtins__": __builtins__}
del src, cfg
exec(code, g)
"""


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


def _plan(cfg: SandboxConfig) -> dict:
    """Decide interpreter, privilege drop and namespaces for ``cfg`` (cached probes)."""
    with _probe_lock:
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
        python = cfg.python or sys.executable
        ids = None
        is_root = os.geteuid() == 0
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
                        f"runs with {python} (packages installed only in the current "
                        "environment, e.g. numpy, are unavailable there; pass python=... "
                        "or drop_privileges=False to change this)",
                    )
                if ids is None:
                    _warn_once(
                        "drop",
                        "sandbox: no interpreter usable by 'nobody'; user code runs as root "
                        "(RLIMIT_NPROC is not enforced for root; fork bombs are stopped only by "
                        "the audit hook and the process-group/PID-namespace kill)",
                    )
    return {
        "prefix": list(prefix) if prefix else [],
        "net_ns": net_ns,
        "pid_ns": pid_ns,
        "python": python,
        "ids": ids,
        "root_parent": is_root,
    }


def isolation_report(cfg: SandboxConfig | None = None) -> dict:
    """What isolation :func:`run_python` gets here: namespaces, privilege drop, interpreter, rlimits."""
    cfg = cfg or SandboxConfig()
    p = _plan(cfg)
    return {
        "network_namespace": p["net_ns"],
        "pid_namespace": p["pid_ns"],
        "unshare_prefix": " ".join(p["prefix"]),
        "parent_is_root": p["root_parent"],
        "runs_as_uid": p["ids"][0] if p["ids"] else os.geteuid(),
        "privileges_dropped": p["ids"] is not None,
        "rlimit_nproc_effective": p["ids"] is not None or not p["root_parent"],
        "python": p["python"],
        "audit_hook": cfg.audit_hook,
    }


# ---------------------------------------------------------------------------------------------
# running
# ---------------------------------------------------------------------------------------------


def _read_capped(path: Path, cap: int) -> tuple[str, bool]:
    size = path.stat().st_size
    with open(path, "rb") as f:
        data = f.read(cap)
    return data.decode("utf-8", errors="replace"), size >= cap


def run_python(code: str, config: SandboxConfig | None = None, **overrides) -> SandboxResult:
    """Run ``code`` (Python source) under the sandbox; keyword overrides update ``config``'s fields."""
    if not isinstance(code, str):
        raise ValueError(f"code must be a str, got {type(code).__name__}")
    cfg = config or SandboxConfig()
    if overrides:
        cfg = SandboxConfig(**{**asdict(cfg), **overrides})
    plan = _plan(cfg)
    iso = {
        "network_namespace": plan["net_ns"],
        "pid_namespace": plan["pid_ns"],
        "privileges_dropped": plan["ids"] is not None,
    }
    ctl = Path(tempfile.mkdtemp(prefix="tiltlab-sbx-ctl-"))  # parent-owned: program, config, outputs
    work = Path(tempfile.mkdtemp(prefix="tiltlab-sbx-"))  # the child's empty cwd
    proc = None
    t0 = time.monotonic()
    try:
        prog = ctl / "program.py"
        prog.write_text(code, encoding="utf-8")
        uid, gid = plan["ids"] if plan["ids"] else (None, None)
        if uid is not None:
            os.chown(work, uid, gid)
            os.chmod(ctl, 0o711)
            os.chmod(prog, 0o644)
        cpu_s = cfg.cpu_s if cfg.cpu_s is not None else int(cfg.timeout_s) + 2
        child_cfg = {
            "cwd": str(work),
            "program": str(prog),
            "config": str(ctl / "config.json"),
            "cpu_s": int(cpu_s),
            "fsize": int(max(cfg.max_file_mb * (1 << 20), cfg.max_output_bytes)),
            "nofile": cfg.nofile,
            "nproc": cfg.nproc,
            "as_bytes": int(cfg.memory_mb) << 20,
            "uid": uid,
            "gid": gid,
            "block_processes": cfg.block_processes,
            "audit_hook": cfg.audit_hook,
        }
        (ctl / "config.json").write_text(json.dumps(child_cfg))
        if uid is not None:
            os.chmod(ctl / "config.json", 0o644)
        cmd = [plan["python"], "-I", "-B", "-c", _BOOT, str(ctl / "config.json")]
        if plan["pid_ns"]:
            # keep the interpreter off PID 1 (PID 1 ignores default-action signals such as SIGXCPU)
            cmd = ["/bin/sh", "-c", '"$@"; exit $?', "sh", *cmd]
        cmd = plan["prefix"] + cmd
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(work),
            "LANG": "C.UTF-8",
            "TMPDIR": str(work),
            # one BLAS/OpenMP thread: keeps numeric libraries inside RLIMIT_AS and the CPU budget
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }
        with open(ctl / "stdout", "wb") as out, open(ctl / "stderr", "wb") as err:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=str(work),
                env=env,
                start_new_session=True,
                close_fds=True,
            )
            timed_out = False
            try:
                rc = proc.wait(timeout=cfg.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc)
                rc = proc.wait()
            _kill_group(proc)  # reap anything the program left behind in its group
        wall = time.monotonic() - t0
        stdout, over_out = _read_capped(ctl / "stdout", cfg.max_output_bytes)
        stderr, over_err = _read_capped(ctl / "stderr", cfg.max_output_bytes)
        if timed_out:
            status = "timeout"
        elif over_out or over_err or rc in (-signal.SIGXFSZ, 128 + signal.SIGXFSZ):
            status = "output_limit"
        elif (
            rc in (-signal.SIGXCPU, 128 + signal.SIGXCPU, -signal.SIGKILL, 128 + signal.SIGKILL)
            and "MemoryError" not in stderr
        ):
            status = "timeout" if rc in (-signal.SIGXCPU, 128 + signal.SIGXCPU) else "killed"
        elif "MemoryError" in stderr:
            status = "memory"
        elif "sandbox:" in stderr and "blocked" in stderr:
            status = "blocked"
        elif rc != 0:
            status = "error"
        else:
            status = "ok"
        return SandboxResult(status, rc, stdout, stderr, wall, iso)
    finally:
        if proc is not None and proc.poll() is None:
            _kill_group(proc)
            proc.wait()
        shutil.rmtree(ctl, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def run_many(
    codes: list[str], config: SandboxConfig | None = None, max_workers: int | None = None, progress: bool = False
) -> list[SandboxResult]:
    """Run several programs concurrently (a thread per running sandbox); results in input order."""
    if not codes:
        return []
    workers = max_workers or max(1, min(len(codes), os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futs = [pool.submit(run_python, c, config) for c in codes]
        if progress:
            from tqdm.auto import tqdm

            for _ in tqdm(futs, desc="sandbox", total=len(futs)):
                _.result()
        return [f.result() for f in futs]
