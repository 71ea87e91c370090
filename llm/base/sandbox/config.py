"""The sandbox's configuration and result types, and the constants its programs and the host share."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

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
