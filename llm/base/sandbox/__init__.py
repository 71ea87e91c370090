"""Run untrusted Python (model-written code) in an OS-isolated process, and judge it from outside.

Two entry points:

* :func:`run_python` runs one program and reports how it ended (``status`` from the exit status,
  the signal or the limit that stopped it; output is never searched). A program decides its own
  exit status, so ``run_python(...).passed`` says "it exited 0", nothing more.
* :func:`run_judged` is what the code reward uses. The candidate's code runs in the sandbox as a
  *server*; the tests run in a separate *judge* process that the candidate's code does not share.
  The judge reaches the candidate's top-level functions and classes through proxies: each call is
  one request over a pipe, its arguments and result cross as tagged JSON, by value for the
  builtin and stdlib types that compare by value (exact types, never subclasses: see ``programs/codec.py``
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
  (:func:`llm.base.rewards.code_job` puts them in the tests);
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
  of the current environment import), no ``/proc`` and no ``/sys`` (their host-wide counters and a
  process's own fault and residency counts are channels; ``/proc/<pid>/mem`` would let the candidate
  write bwrap's init and the stdio server), minimal ``/dev``, size-capped tmpfs
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
``tests/llm/base/hostile`` does so to show that the OS layers hold without it.
"""

from __future__ import annotations

from .config import (  # noqa: F401 (public, outside __all__ as before)
    JUDGE_MODULES,
    NO_CROSS,
    RC_BLOCKED,
    RC_MEMORY,
    SCRIPT,
    WIRE_DEPTH,
    SandboxConfig,
    SandboxResult,
    SandboxWarning,
)
from .probe import isolation_report
from .runner import run_judged, run_many, run_many_judged, run_python
from .seccomp import (
    SECCOMP_BUDGET_DENIED,
    SECCOMP_BUDGET_DENIED_ARGS,
    SECCOMP_DENIED,
    SECCOMP_DENIED_ARGS,
    seccomp_budget_program,
    seccomp_program,
)

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
