"""llm.base.sandbox.seccomp: the filters' programs (run on a BPF interpreter here) and, in the sandbox, the
keyring, the side-channel system calls and the memory budget they refuse."""

import sys

import pytest

if not sys.platform.startswith("linux"):
    pytest.skip("the sandbox targets Linux (rlimits, namespaces)", allow_module_level=True)

from tests.llm.base.sandbox._helpers import FAST
from tiltlab.llm.base import sandbox
from tiltlab.llm.base.sandbox import run_judged, run_python, seccomp

pytestmark = pytest.mark.filterwarnings("ignore::tiltlab.llm.base.sandbox.SandboxWarning")


def _bpf(prog: bytes, arch: int, nr: int, args: tuple[int, ...] = ()) -> int:
    """Run a classic-BPF seccomp program (the instructions seccomp_program uses) on one system call."""
    import struct

    ins = [struct.unpack("=HBBI", prog[i : i + 8]) for i in range(0, len(prog), 8)]
    data = {0: nr, 4: arch}
    for i, a in enumerate((*args, 0, 0, 0, 0, 0, 0)[:6]):
        data[16 + 8 * i], data[20 + 8 * i] = a & 0xFFFFFFFF, a >> 32
    acc = pc = 0
    while True:
        code, jt, jf, k = ins[pc]
        if code == 0x20:
            acc = data[k]
        elif code in (0x15, 0x35, 0x45):
            pc += jt if {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code] else jf
        elif code == 0x06:
            return k
        else:
            raise AssertionError(f"unexpected instruction {code:#x}")
        pc += 1


ALLOW, EPERM, ENOSYS = 0x7FFF0000, 0x00050001, 0x00050026


def test_seccomp_program_denies_the_listed_calls_only():
    for machine in ("x86_64", "aarch64"):
        arch, nrs = seccomp._SYSCALLS[machine]
        prog = sandbox.seccomp_program(machine)
        whole = {nrs[n] for n in sandbox.SECCOMP_DENIED if n in nrs}
        some = {nrs[n] for n in sandbox.SECCOMP_DENIED_ARGS}
        for nr in range(0, 460):
            want = EPERM if nr in whole else ENOSYS if nr == nrs["clone3"] else ALLOW
            if nr not in some:
                assert _bpf(prog, arch, nr, (1, 1, 1, 1, 1, 1)) == want, (machine, nr)
        assert _bpf(prog, 0x40000003, 0) == EPERM  # a foreign ABI (i386)
    x86 = sandbox.seccomp_program("x86_64")
    assert _bpf(x86, 0xC000003E, 0x40000000 + 1) == EPERM  # x32 ABI
    assert _bpf(sandbox.seccomp_program("aarch64"), 0xC00000B7, 0x40000000) == ALLOW  # no x32 check off x86_64
    assert sandbox.seccomp_program("s390x") is None


@pytest.mark.parametrize(
    "call,args,want",
    [
        ("preadv2", (3, 0, 1, 0, 0, 0), ALLOW),
        ("preadv2", (3, 0, 1, 0, 0, 0x8), EPERM),  # RWF_NOWAIT
        ("preadv2", (3, 0, 1, 0, 0, 0x8 | 0x1), EPERM),
        ("preadv2", (3, 0, 1, 0, 0, 0x1), ALLOW),  # RWF_HIPRI
        ("pwritev2", (3, 0, 1, 0, 0, 0x8), EPERM),
        ("madvise", (0, 4096, 4), ALLOW),  # MADV_DONTNEED (the allocators' own)
        ("madvise", (0, 4096, 20), EPERM),  # MADV_COLD
        ("madvise", (0, 4096, 21), EPERM),  # MADV_PAGEOUT
        ("madvise", (0, 4096, 14), ALLOW),  # MADV_HUGEPAGE
        ("fcntl", (3, 1), ALLOW),  # F_GETFD
        ("fcntl", (3, 4, 0x800), ALLOW),  # F_SETFL
        ("fcntl", (3, 1030, 0), ALLOW),  # F_DUPFD_CLOEXEC
        *[("fcntl", (3, c), EPERM) for c in (5, 6, 7, 36, 37, 38, 1024, 1026)],
        ("fcntl", (3, (1 << 32) | 6), EPERM),  # the kernel reads the low 32 bits of the command
        ("unshare", (0x10000000,), EPERM),  # CLONE_NEWUSER
        ("unshare", (0x10000000 | 0x20000,), EPERM),
        ("unshare", (0x400,), ALLOW),  # CLONE_FILES
        ("clone", (0x10000000 | 17,), EPERM),
        ("clone", (17,), ALLOW),  # fork
        ("clone", (0x3D0F00,), ALLOW),  # a thread (CLONE_VM | CLONE_FS | ... | CLONE_SETTLS ...)
    ],
)
def test_seccomp_program_reads_the_arguments(call, args, want):
    for machine in ("x86_64", "aarch64"):
        arch, nrs = seccomp._SYSCALLS[machine]
        assert _bpf(sandbox.seccomp_program(machine), arch, nrs[call], args) == want, machine


def test_seccomp_budget_program_refuses_new_processes_and_memory_outside_the_address_space():
    for machine in ("x86_64", "aarch64"):
        arch, nrs = seccomp._SYSCALLS[machine]
        prog = sandbox.seccomp_budget_program(machine)
        denied = {nrs[n] for n in sandbox.SECCOMP_BUDGET_DENIED if n in nrs}
        assert len(denied) == (4 if machine == "x86_64" else 2)  # aarch64 has no fork / vfork
        for nr in range(0, 460):
            if nr != nrs["clone"]:
                assert _bpf(prog, arch, nr) == (EPERM if nr in denied else ALLOW), (machine, nr)
        assert _bpf(prog, arch, nrs["clone"], (0x3D0F00,)) == ALLOW  # a thread (CLONE_THREAD)
        assert _bpf(prog, arch, nrs["clone"], (17,)) == EPERM  # fork
        assert _bpf(prog, arch, nrs["clone"], (0x4111,)) == EPERM  # vfork (CLONE_VM | CLONE_VFORK), posix_spawn
        assert _bpf(prog, 0x40000003, 0) == EPERM
        both = sandbox.seccomp_program(machine, budget=True)  # the two filters as one
        for nr in range(0, 460):
            if nr not in (nrs["clone"], *(nrs[n] for n in sandbox.SECCOMP_DENIED_ARGS)):
                alone = sandbox.seccomp_program(machine)
                want = EPERM if EPERM in (_bpf(alone, arch, nr), _bpf(prog, arch, nr)) else _bpf(alone, arch, nr)
                assert _bpf(both, arch, nr) == want, (machine, nr)
        for flags, want in ((0x3D0F00, ALLOW), (17, EPERM), (0x3D0F00 | 0x10000000, EPERM), (0x10000000 | 17, EPERM)):
            assert _bpf(both, arch, nrs["clone"], (flags,)) == want, (machine, flags)


def test_seccomp_program_layout():
    import struct

    prog = sandbox.seccomp_program("x86_64")
    ins = [struct.unpack("=HBBI", prog[i : i + 8]) for i in range(0, len(prog), 8)]
    assert ins[0] == (0x20, 0, 0, 4) and ins[1][3] == 0xC000003E and ins[2] == (0x20, 0, 0, 0)
    assert ins[-2] == (0x06, 0, 0, EPERM) and ins[-1] == (0x06, 0, 0, ENOSYS)
    deny = len(ins) - 2
    assert 2 + ins[1][2] == deny and ins[1][1] == 0  # a foreign architecture is denied too
    for pc, (code, jt, jf, k) in enumerate(ins):  # every jump goes forward, inside the program
        if code in (0x15, 0x35, 0x45):
            assert pc + 1 + max(jt, jf) < len(ins)
        if code == 0x20:  # loads: arch, nr, or the low word of an argument
            assert k in (0, 4) or ((k - 16) % 8 == 0 and 16 <= k < 64)
    assert sandbox.seccomp_program("aarch64") != prog


KEYCTL = (
    "import ctypes, platform\nlibc = ctypes.CDLL(None, use_errno=True)\n"
    "add, req, ctl = (248, 249, 250) if platform.machine() == 'x86_64' else (217, 218, 219)\n"
    "r = [libc.syscall(add, b'user', b'tiltlab-probe', b'x', 1, -4), libc.syscall(ctl, 0, -3, 0),"
    " libc.syscall(req, b'user', b'tiltlab-probe', None, 0)]\nprint(r, ctypes.get_errno())\n"
)


@pytest.mark.parametrize("backend", ["auto", "legacy"])
def test_keyring_calls_are_denied(backend):
    if sandbox.seccomp_program() is None:
        pytest.skip("no keyring system-call numbers for this architecture")
    r = run_python(KEYCTL, FAST, backend=backend, audit_hook=False, memory_mb=512)
    assert r.passed, r.stderr[-500:]
    assert r.stdout.split() == ["[-1,", "-1,", "-1]", "1"]  # EPERM
    assert r.isolation["seccomp"]


# Each channel below is tried by a "reader with no task logic": ``probe()`` makes the one system call
# and returns True when it was not refused (the call then tells the reader something: residency,
# a lock, an event, another process's memory), so the tests ``assert probe()`` pay it exactly when
# the channel is open. The candidate prints the errno it got.
_CHANNEL_PRELUDE = """
import ctypes, errno, fcntl, os, resource, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.syscall.restype = ctypes.c_long
NR = {nr!r}
F = os.open(sys.executable, os.O_RDONLY)  # a file every concurrent candidate shares (read-only)
ADDR = ctypes.c_void_p(libc.mmap(None, 4096, 1, 1, F, 0))  # PROT_READ, MAP_SHARED
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
SRC, DST = ctypes.create_string_buffer(b"abc"), ctypes.create_string_buffer(3)
def iov(buf):
    return ctypes.byref(iovec(ctypes.addressof(buf), 3))
def call():
    return {call}
def probe():
    ctypes.set_errno(0)
    r = None
    try:
        r = call()
        e = ctypes.get_errno() if r == -1 else 0
    except OSError as x:
        e = x.errno
    if r == 0 and os.getpid() != PID:  # a clone that went through: the child leaves at once
        os._exit(0)
    print(errno.errorcode.get(e, e), flush=True)
    return e != errno.EPERM
PID = os.getpid()
"""

_CHANNELS = {
    "mincore": "libc.mincore(ADDR, 4096, ctypes.create_string_buffer(1))",
    "preadv2 RWF_NOWAIT": "os.preadv(F, [bytearray(16)], 0, os.RWF_NOWAIT)",
    "pwritev2 RWF_NOWAIT": "os.pwritev(os.open('w', os.O_RDWR | os.O_CREAT), [b'x'], 0, os.RWF_NOWAIT)",
    "posix_fadvise DONTNEED": "os.posix_fadvise(F, 0, 0, os.POSIX_FADV_DONTNEED)",
    "madvise MADV_PAGEOUT": "libc.madvise(ADDR, 4096, 21)",
    "madvise MADV_COLD": "libc.madvise(ADDR, 4096, 20)",
    "readahead": "libc.readahead(F, ctypes.c_longlong(0), ctypes.c_size_t(4096))",
    # the kernel itself refuses cachestat on a file the caller may not write (since 6.10): probe an own file
    "cachestat": "libc.syscall(NR['cachestat'], os.open('c', os.O_RDWR | os.O_CREAT), ctypes.create_string_buffer(16),"
    " ctypes.create_string_buffer(96), 0)",
    "io_uring_setup": "libc.syscall(NR['io_uring_setup'], 1, ctypes.create_string_buffer(120))",
    "io_setup": "libc.syscall(NR['io_setup'], 1, ctypes.byref(ctypes.c_ulong(0)))",
    "flock": "fcntl.flock(F, fcntl.LOCK_SH | fcntl.LOCK_NB)",
    "fcntl F_SETLK (lockf)": "fcntl.lockf(F, fcntl.LOCK_SH | fcntl.LOCK_NB)",
    "fcntl F_OFD_GETLK": "fcntl.fcntl(F, 36, struct.pack('hhqqi4x', fcntl.F_RDLCK, 0, 0, 0, 0))",
    "inotify_init1": "libc.inotify_init1(0)",
    "unshare CLONE_NEWUSER": "libc.unshare(0x10000000)",
    "clone CLONE_NEWUSER": "libc.syscall(NR['clone'], 0x10000000 | 17, 0, 0, 0, 0)",
    "setns": "libc.setns(F, 0)",  # no /proc for a namespace file: unfiltered, the kernel answers EINVAL
    "ptrace": "libc.ptrace(0, 0, 0, 0)",  # PTRACE_TRACEME
    "process_vm_readv": "libc.process_vm_readv(os.getpid(), iov(DST), 1, iov(SRC), 1, 0)",
    "process_vm_writev": "libc.process_vm_writev(os.getpid(), iov(SRC), 1, iov(DST), 1, 0)",
    "pidfd_getfd": "libc.syscall(NR['pidfd_getfd'], F, 0, 0)",  # unfiltered, the kernel answers EBADF
    "pidfd_open": "os.pidfd_open(os.getpid())",  # its inode number counts the host's pids
    "getrusage (fault counts)": "resource.getrusage(resource.RUSAGE_SELF)",
    "sysinfo": "libc.sysinfo(ctypes.create_string_buffer(256))",
    "perf_event_open": "libc.syscall(NR['perf_event_open'], ctypes.create_string_buffer(128), 0, -1, -1, 0)",
    "process_madvise": "libc.syscall(NR['process_madvise'], 0, 0, 0, 21, 0)",
}


@pytest.mark.parametrize("channel", list(_CHANNELS))
def test_channel_system_calls_are_refused(channel):
    import platform

    if sandbox.seccomp_program() is None:
        pytest.skip("no system-call numbers for this architecture")
    nr = seccomp._SYSCALLS[platform.machine()][1]
    code = _CHANNEL_PRELUDE.format(nr=nr, call=_CHANNELS[channel])
    r = run_judged(code, "assert probe()", FAST, audit_hook=False, memory_mb=512)
    assert (r.passed, r.stdout.split()) == (False, ["EPERM"]), (r.stdout, r.stderr[-800:], r.judge_stderr[-800:])


def test_refused_system_calls_leave_threads_and_plain_reads_alone():
    # clone3 is answered ENOSYS (the C library then uses clone for threads), madvise(MADV_DONTNEED) and
    # preadv2 without RWF_NOWAIT run, fcntl's other commands run (new processes: the budget tests below)
    code = (
        "import ctypes, fcntl, os, sys, threading\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "t = threading.Thread(target=print, args=('thread',))\nt.start()\nt.join()\n"
        "f = os.open(sys.executable, os.O_RDONLY)\nprint('read', os.preadv(f, [bytearray(4)], 0, 0))\n"
        "print('flags', fcntl.fcntl(f, fcntl.F_GETFD) >= 0)\nimport mmap\n"
        "m = mmap.mmap(-1, 4096)\nm.madvise(mmap.MADV_DONTNEED)\nprint('madvise ok')\n"
    )
    r = run_python(code, FAST, audit_hook=False)
    assert r.passed, r.stderr[-800:]
    assert r.stdout.split("\n")[:4] == ["thread", "read 4", "flags True", "madvise ok"]


# Three ways to hold memory outside the address space that RLIMIT_AS bounds: each program tries to hold
# 3 x memory_mb (200 MiB at a time) and prints how much it held and the errno that stopped it.
_BUDGET_PRELUDE = """
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
CHUNK = 200 << 20
held, err = 0, 0
def grab():
{grab}
try:
    while held < 3 * {budget} << 20:
        grab()
        held += CHUNK
except OSError as e:
    err = e.errno
print(held >> 20, errno.errorcode.get(err, err), flush=True)
"""
_BUDGET_GRABS = {
    # a child allocates and tells the parent; it waits (blocked on a pipe) until the parent exits
    "fork": "    r, w = os.pipe()\n    done, hold = os.pipe()\n    if os.fork() == 0:\n"
    "        os.close(w)\n        x = bytearray(CHUNK)\n        os.write(hold, b'1')\n        os.read(r, 1)\n        os._exit(0)\n"
    "    os.read(done, 1)",
    "memfd": "    for _ in range(CHUNK >> 23):  # 8 MiB files, below RLIMIT_FSIZE\n"
    "        os.write(os.memfd_create('m'), bytes(1 << 23))",
    "SysV shm": "    i = libc.shmget(0, CHUNK, 0o1600)\n    if i < 0:\n        raise OSError(ctypes.get_errno(), 'shmget')\n"
    "    a = ctypes.c_void_p(libc.shmat(i, None, 0))\n    ctypes.memset(a, 1, CHUNK)\n    libc.shmdt(a)",
}


@pytest.mark.parametrize("way", list(_BUDGET_GRABS))
def test_memory_budget_bounds_the_whole_run(way):
    if sandbox.seccomp_budget_program() is None:
        pytest.skip("no system-call numbers for this architecture")
    code = _BUDGET_PRELUDE.format(grab=_BUDGET_GRABS[way], budget=256)
    r = run_python(code, FAST, audit_hook=False, nofile=256)
    held, err = r.stdout.split()
    assert (int(held), err) == (0, "EPERM"), (r.stdout, r.stderr[-500:])


def test_memory_budget_in_a_stdio_case():
    code = _BUDGET_PRELUDE.format(grab=_BUDGET_GRABS["fork"], budget=256)
    tests = "assert __stdio__('').split() == ['0', 'EPERM']"
    r = run_judged(code, tests, FAST, stdio=True, audit_hook=False)
    assert r.passed, r.judge_stderr[-500:]
