"""Probing what this OS allows (bubblewrap, namespaces, an unprivileged uid), cached; the isolation plan."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import threading
import warnings
from pathlib import Path

from . import programs
from .config import SandboxConfig, SandboxWarning

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
        import grp  # POSIX only: elsewhere there is no nobody user to run as
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
    """Host directories the sandboxed interpreter needs, outside ``/usr``, without nesting: its prefixes and
    the folder of the programs it runs by path (:data:`.programs.DIR`, inside a prefix when installed)."""
    real = os.path.realpath(python)
    cands = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, os.path.dirname(os.path.dirname(real))}
    cands |= {os.path.dirname(os.path.dirname(os.path.abspath(python))), str(programs.DIR)}
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
    # no /proc (nor /sys): its host-wide counters (meminfo, stat, loadavg, vmstat, pty/nr, file-nr, pressure)
    # and the process's own (smaps, pagemap, statm, status, stat: page-cache residency after fault-around)
    # would be channels between runs and between concurrent candidates, and /proc/<pid>/mem would let the
    # candidate write the sandbox's init and the stdio server (same uid as an ordinary user)
    # the private /dev and tmpfs /tmp come before the interpreter's prefixes: bwrap mounts in argument
    # order, and a tmpfs mounted after them would hide a prefix under /tmp (a virtualenv in /tmp/...)
    size = str(int(disk_mb) << 20)
    args += ["--dev", "/dev", "--size", size, "--perms", "1777", "--tmpfs", "/dev/shm"]
    args += ["--size", size, "--perms", "1777", "--tmpfs", "/tmp"]
    made: set[str] = {"/tmp", "/dev"}
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
