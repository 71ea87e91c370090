"""The seccomp filters (classic BPF) that refuse the channel and memory-budget system calls."""

from __future__ import annotations

import errno
import functools
import platform
import struct

# System calls per architecture (audit arch, numbers by name) that the seccomp filter refuses in part or whole.
_SYSCALLS: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (0xC000003E, {
        "add_key": 248, "request_key": 249, "keyctl": 250, "mincore": 27, "madvise": 28, "clone": 56,
        "fcntl": 72, "flock": 73, "ptrace": 101, "readahead": 187, "io_setup": 206, "fadvise64": 221,
        "inotify_init": 253, "inotify_add_watch": 254, "unshare": 272, "inotify_init1": 294, "setns": 308,
        "process_vm_readv": 310, "process_vm_writev": 311, "preadv2": 327, "pwritev2": 328,
        "io_uring_setup": 425, "clone3": 435, "pidfd_getfd": 438, "cachestat": 451,
        "fork": 57, "vfork": 58, "memfd_create": 319, "shmget": 29,
        "sysinfo": 99, "getrusage": 98, "perf_event_open": 298, "process_madvise": 440, "pidfd_open": 434,
    }),
    "aarch64": (0xC00000B7, {
        "add_key": 217, "request_key": 218, "keyctl": 219, "mincore": 232, "madvise": 233, "clone": 220,
        "fcntl": 25, "flock": 32, "ptrace": 117, "readahead": 213, "io_setup": 0, "fadvise64": 223,
        "inotify_add_watch": 27, "unshare": 97, "inotify_init1": 26, "setns": 268,
        "process_vm_readv": 270, "process_vm_writev": 271, "preadv2": 286, "pwritev2": 287,
        "io_uring_setup": 425, "clone3": 435, "pidfd_getfd": 438, "cachestat": 451,
        "memfd_create": 279, "shmget": 194,
        "sysinfo": 179, "getrusage": 165, "perf_event_open": 241, "process_madvise": 440, "pidfd_open": 434,
    }),
}  # fmt: skip

SECCOMP_DENIED = (
    # the kernel keyrings: keys outlive a run (user and session keyrings; the session keyring is the trainer's)
    "add_key", "request_key", "keyctl",
    # page-cache residency probes and resets (a channel between runs and between concurrent candidates
    # through the page cache of shared files such as /usr's); io_setup / io_uring_setup would reach the
    # same operations (RWF_NOWAIT reads, fadvise, madvise) past this filter
    "mincore", "readahead", "fadvise64", "cachestat", "io_setup", "io_uring_setup",
    # the same, exactly, by counting faults (a major fault: the page was not cached) and by evicting
    # (process_madvise MADV_PAGEOUT / MADV_COLD on the process's own pidfd)
    "getrusage", "perf_event_open", "process_madvise",
    # host-wide counters: sysinfo (free and shared RAM: the tmpfs pages of every sandbox, the number of
    # processes) and pidfd_open (a pidfd's inode number counts the pids allocated on the whole host)
    "sysinfo", "pidfd_open",
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
