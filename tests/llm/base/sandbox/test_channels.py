"""No channel across runs or between concurrent candidates, measured as an attacker would: exactly, no timing.

Each class of channel has a WRITER, which sets one bit in state the kernel shares between sandboxes, and a
READER, which tries every exact read of that state the class offers and prints what it observed (a value, or
the error it got). They run as separate sandboxed runs, one after the other (across runs) and at the same
time (between concurrent candidates: the writer holds its bit until the reader has finished). Each test runs
both bit values and asserts the reader could read nothing, so that what it printed is the same for both bits.
With ``--proc /proc`` in bwrap's arguments and without the ``sysinfo`` / ``getrusage`` / ``pidfd_open`` rules
of the seccomp filter, every one of these tests fails (the reader decodes the bit).
"""

import contextlib
import ctypes
import json
import mmap
import os
import secrets
import signal
import stat
import sys
import threading

import pytest

if not sys.platform.startswith("linux"):
    pytest.skip("the sandbox targets Linux (namespaces, seccomp)", allow_module_level=True)

from tiltlab.llm.base.sandbox import SandboxConfig, run_python

pytestmark = pytest.mark.filterwarnings("ignore::tiltlab.llm.base.sandbox.SandboxWarning")
CFG = SandboxConfig(timeout_s=20.0, memory_mb=512, max_file_mb=64.0, audit_hook=False)
HOLD = SandboxConfig(timeout_s=60.0, memory_mb=512, max_file_mb=64.0, audit_hook=False)

#: the writer's hold: it names its thread ``tag`` (the host sees it in /proc/<pid>/comm), then waits to be killed
_HOLD = "import ctypes, time\nctypes.CDLL(None).prctl(15, {tag!r}.encode())\ntime.sleep(55)\n"

#: the reader's helpers: ``see(name, fn)`` records fn()'s value or the error it raised
_SEE = r"""
import ctypes, json, os
OUT = {}
def see(name, fn):
    try:
        OUT[name] = fn()
    except Exception as e:
        OUT[name] = "error " + type(e).__name__ + " " + str(getattr(e, "errno", None))
def done():
    print(json.dumps(OUT, sort_keys=True))
"""


def _tagged(tag: str) -> int | None:
    for p in os.listdir("/proc"):
        if p.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{p}/comm") as fh:
                if fh.read().strip() == tag:
                    return int(p)
    return None


def _exchange(writer: str, reader: str, bit: int, concurrent: bool, before=None, check=None) -> dict:
    """What ``reader`` observed after (or while, ``concurrent``) ``writer`` set ``bit``; ``before()`` runs
    before the writer, ``check()`` between the writer's bit and the reader."""
    if before is not None:
        before()
    if not concurrent:
        w = run_python(writer.format(bit=bit, hold=""), CFG)
        assert w.passed, w.stderr[-2000:]
        if check is not None:
            check()
        r = run_python(reader, CFG)
    else:
        tag = "tlw" + secrets.token_hex(5)
        out = {}
        t = threading.Thread(
            target=lambda: out.update(w=run_python(writer.format(bit=bit, hold=_HOLD.format(tag=tag)), HOLD))
        )
        t.start()
        try:
            pid = None
            while pid is None and t.is_alive():  # until the writer has set its bit (or ended: then it failed)
                pid = _tagged(tag)
                t.join(0.05)
            assert pid is not None, out["w"].stderr[-2000:]
            if check is not None:
                check()
            r = run_python(reader, CFG)
        finally:
            if pid is not None:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            t.join()
        assert out["w"].status == "killed", (out["w"].status, out["w"].stderr[-2000:])  # it held its bit to the end
    assert r.passed, r.stderr[-2000:]
    return json.loads(r.stdout.splitlines()[-1])


def _assert_learns_nothing(obs: dict[int, dict]) -> None:
    readable = {k: v for b in (0, 1) for k, v in obs[b].items() if not str(v).startswith("error ")}
    assert readable == {} and obs[0] == obs[1], obs


# ---------------------------------------------------------------------------------------------
# page-cache residency of a shared read-only file, read back exactly from fault-around and fault counts
# ---------------------------------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)
PS = mmap.PAGESIZE
PAGE = 40  # the writer's page; the reader maps it with the page before it


def _cached(path: str) -> list[bool]:
    """Residency of the file's pages PAGE - 1 and PAGE (the host's mincore, which loads nothing)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _libc.mmap(None, 2 * PS, mmap.PROT_READ, mmap.MAP_SHARED, fd, (PAGE - 1) * PS)
        assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
        vec = ctypes.create_string_buffer(2)
        try:
            assert _libc.mincore(addr, 2 * PS, vec) == 0, ctypes.get_errno()
        finally:
            _libc.munmap(addr, 2 * PS)
        return [bool(b & 1) for b in vec.raw]
    finally:
        os.close(fd)


def _evict(path: str) -> bool:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return _cached(path) == [False, False]


@pytest.fixture(scope="module")
def cold_file():
    """A world-readable file under /usr that no process maps, so the host can evict it before each trial."""
    for root in ("/usr/share", "/usr/lib", "/usr/include"):
        for dirpath, dirs, files in os.walk(root):
            dirs.sort()
            for f in sorted(files):
                p = os.path.join(dirpath, f)
                with contextlib.suppress(OSError):
                    st = os.stat(p, follow_symlinks=False)
                    big = stat.S_ISREG(st.st_mode) and st.st_mode & 0o004 and st.st_size >= (PAGE + 8) * PS
                    if big and not p.endswith((".so", ".a")) and ".so." not in p and _evict(p):
                        return p
    raise AssertionError("no evictable world-readable file under /usr")


PAGE_WRITER = """
import mmap, os
fd = os.open({path!r}, os.O_RDONLY)
m = mmap.mmap(fd, mmap.PAGESIZE, prot=mmap.PROT_READ, offset={page} * mmap.PAGESIZE)
m.madvise(mmap.MADV_RANDOM)  # no readahead: the touch below loads exactly this page
if {{bit}}:
    m[0]
{{hold}}print("ok")
"""

PAGE_READER = (
    _SEE
    + r"""
import resource
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
PS = os.sysconf("SC_PAGE_SIZE")
fd = os.open(PATH, os.O_RDONLY)
def mapping(first, n):
    a = libc.mmap(None, n * PS, 1, 2, fd, first * PS)  # PROT_READ, MAP_PRIVATE
    libc.madvise(ctypes.c_void_p(a), n * PS, 1)  # MADV_RANDOM: a fault loads the one page it needs
    return a
def counters():
    c = {}
    def get(name, fn):
        try:
            c[name] = fn()
        except Exception as e:
            c[name] = "error " + type(e).__name__ + " " + str(getattr(e, "errno", None))
    get("statm resident", lambda: int(open("/proc/self/statm").read().split()[1]))
    get("status RssFile", lambda: [l for l in open("/proc/self/status") if l.startswith("RssFile")][0].split()[1])
    get("stat minflt/majflt", lambda: [open("/proc/self/stat").read().rsplit(")", 1)[1].split()[i] for i in (7, 9)])
    get("getrusage ru_minflt/ru_majflt", lambda: list(resource.getrusage(resource.RUSAGE_SELF)[6:8]))
    return c
# 1. fault-around: touching page PAGE - 1 maps page PAGE too when (and only when) it is cached
a = mapping(PAGE - 1, 2)
ctypes.c_char.from_address(a).value
def rss():
    lines = open("/proc/self/smaps").read().splitlines()
    i = next(i for i, l in enumerate(lines) if l.startswith("%x-" % a))
    return next(l for l in lines[i:] if l.startswith("Rss:")).split()[1]
see("smaps Rss of the two pages", rss)
def present():
    with open("/proc/self/pagemap", "rb") as f:
        f.seek((a // PS + 1) * 8)
        return int.from_bytes(f.read(8), "little") >> 63
see("pagemap present bit of the page", present)
# 2. fault counts: touching the page alone is a major fault when it was not cached
b = mapping(PAGE, 1)
c0 = counters()
ctypes.c_char.from_address(b).value
c1 = counters()
for k in c0:
    OUT[k + " (change)"] = c0[k] if str(c0[k]).startswith("error ") else str((c0[k], c1[k]))
done()
"""
)


@pytest.mark.parametrize("concurrent", [False, True], ids=["across-runs", "concurrent"])
def test_page_cache_residency_is_not_readable(cold_file, concurrent):
    writer = PAGE_WRITER.format(path=cold_file, page=PAGE)
    reader = f"PATH, PAGE = {cold_file!r}, {PAGE}\n" + PAGE_READER
    obs = {}
    for bit in (0, 1):

        def evict():
            assert _evict(cold_file), cold_file

        def check(bit=bit):  # the writer's bit is in the page cache, where the reader looks for it
            assert _cached(cold_file) == [False, bool(bit)]

        obs[bit] = _exchange(writer, reader, bit, concurrent, before=evict, check=check)
    _assert_learns_nothing(obs)


# ---------------------------------------------------------------------------------------------
# host-wide counters: /proc, /sys and the pid counter behind a pidfd's inode number
# ---------------------------------------------------------------------------------------------

COUNTER_WRITER = """
import os, threading
threading.stack_size(1 << 18)
if {bit}:
    ptys = [os.openpty() for _ in range(12)]  # /proc/sys/kernel/pty/nr
    for i in range(3):  # 45 MiB of tmpfs pages: Shmem in /proc/meminfo, sharedram in sysinfo
        with open("/dev/shm/f%d" % i, "wb") as f:
            f.write(b"x" * (15 << 20))
    for _ in range(300):  # /proc/stat processes, the pid counter, loadavg's last pid
        t = threading.Thread(target=lambda: None)
        t.start()
        t.join()
    hold = [threading.Thread(target=threading.Event().wait, daemon=True) for _ in range(20)]  # procs
    for t in hold:
        t.start()
{hold}print("ok")
"""

HOST_FILES = (
    "/proc/sys/kernel/pty/nr", "/proc/meminfo", "/proc/loadavg", "/proc/vmstat", "/proc/stat", "/proc/slabinfo",
    "/proc/sys/fs/file-nr", "/proc/sys/fs/inode-nr", "/proc/sys/fs/dentry-state", "/proc/pressure/memory",
    "/proc/pressure/cpu", "/proc/sys/kernel/ns_last_pid", "/proc/sys/kernel/random/entropy_avail",
    "/proc/buddyinfo", "/proc/zoneinfo", "/proc/diskstats", "/proc/interrupts", "/proc/net/sockstat",
    "/proc/1/status", "/proc/uptime", "/sys/fs/cgroup/memory/memory.usage_in_bytes",
    "/sys/fs/cgroup/memory.current", "/sys/kernel/mm/transparent_hugepage/enabled", "/sys/devices/system/node/node0/meminfo",
)  # fmt: skip

COUNTER_READER = (
    _SEE
    + r"""
import threading
for p in FILES:
    see(p, lambda: "read %d bytes" % len(open(p, "rb").read()))
# decoded, where the file was readable: the writer's bit is there
see("pty/nr", lambda: int(open("/proc/sys/kernel/pty/nr").read()))
see("meminfo Shmem", lambda: [l for l in open("/proc/meminfo") if l.startswith("Shmem:")][0].split()[1])
see("stat processes", lambda: [l for l in open("/proc/stat") if l.startswith("processes")][0].split()[1])
def pid_counter():  # a new thread's pidfd: its inode number counts the pids allocated on the host
    got = []
    def f():
        fd = os.pidfd_open(threading.get_native_id(), os.O_EXCL)  # PIDFD_THREAD
        got.append(os.fstat(fd).st_ino)
    t = threading.Thread(target=f)
    t.start()
    t.join()
    return got[0] if got else "error no pidfd"
see("pidfd inode of a new thread", pid_counter)
see("own pidfd", lambda: os.fstat(os.pidfd_open(os.getpid())).st_ino)
done()
"""
)


@pytest.mark.parametrize("concurrent", [False, True], ids=["across-runs", "concurrent"])
def test_host_wide_counters_are_not_readable(concurrent):
    reader = f"FILES = {HOST_FILES!r}\n" + COUNTER_READER
    obs = {bit: _exchange(COUNTER_WRITER, reader, bit, concurrent) for bit in (0, 1)}
    _assert_learns_nothing(obs)


# ---------------------------------------------------------------------------------------------
# sysinfo(2): free and shared RAM (every sandbox's tmpfs pages), the number of processes of the host
# ---------------------------------------------------------------------------------------------

SYSINFO_READER = (
    _SEE
    + r"""
libc = ctypes.CDLL(None, use_errno=True)
def sysinfo():
    buf = ctypes.create_string_buffer(256)
    if libc.sysinfo(buf) != 0:
        raise OSError(ctypes.get_errno(), "sysinfo")
    w = memoryview(buf.raw).cast("Q")  # uptime, loads[3], totalram, freeram, sharedram, bufferram, ..., procs
    return {"freeram": w[5], "sharedram": w[6], "procs": w[10] & 0xFFFF}
see("sysinfo", sysinfo)
done()
"""
)


@pytest.mark.parametrize("concurrent", [False, True], ids=["across-runs", "concurrent"])
def test_sysinfo_is_refused(concurrent):
    obs = {bit: _exchange(COUNTER_WRITER, SYSINFO_READER, bit, concurrent) for bit in (0, 1)}
    _assert_learns_nothing(obs)
    assert obs[0]["sysinfo"] == "error PermissionError 1"  # EPERM: the seccomp filter's answer
