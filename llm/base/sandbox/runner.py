"""Running: one candidate under the planned isolation, judged or not, and pools of runs."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict

from . import leftovers
from .clock import _RunDeadline
from .config import _RECURSION, JUDGE_MODULES, NO_CROSS, RC_BLOCKED, RC_MEMORY, SCRIPT, SandboxConfig, SandboxResult
from .probe import _bwrap_args, _plan
from .proc import _env, _kill_group, _read_memfd, _site_dirs, _write_all
from .programs import BOOT, JUDGE
from .seccomp import seccomp_budget_program, seccomp_program
from .server import _kill_judge, _served_judge, _ServedJudge
from .slots import _slot_for, _slot_uid

#: Seconds a candidate whose judge gave up may take to exit on its own before it is killed (bounded by the run's
#: own time limit): long enough for bwrap to reap a process that already ended, short for one that did not.
_EXIT_GRACE_S = 1.0


def _status_from_rc(rc: int | None, timed_out: bool, over: bool) -> str:
    if timed_out:
        return "timeout"
    if over or rc in (-signal.SIGXFSZ, 128 + signal.SIGXFSZ):
        return "output_limit"
    if rc in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
        return "timeout"
    if rc in (-signal.SIGKILL, 128 + signal.SIGKILL):
        return "killed"
    if rc == RC_MEMORY:
        return "memory"
    if rc == RC_BLOCKED:
        return "blocked"
    return "ok" if rc == 0 else "error"


def _wait(
    proc: subprocess.Popen | _ServedJudge, clock: _RunDeadline, roots: list[int], drain: int | None = None, sink=None
) -> bool:
    """Wait for ``proc`` to exit within ``clock``; True if the clock ran out first (``proc`` is still running).

    ``drain``: a pipe read into ``sink`` (a bytearray, last 16 KiB kept) meanwhile.
    """
    try:
        pidfd = os.dup(proc.pidfd) if isinstance(proc, _ServedJudge) else os.pidfd_open(proc.pid)
    except (OSError, AttributeError):
        pidfd = None
    try:
        while True:
            left = clock.left()
            if left <= 0:
                return proc.poll() is None
            step = min(left, 0.5)
            if pidfd is None:
                try:
                    proc.wait(timeout=step)
                    return False
                except subprocess.TimeoutExpired:
                    pass
            else:
                fds = [pidfd] + ([drain] if drain is not None else [])
                ready, _, _ = select.select(fds, [], [], step)
                if drain is not None and drain in ready:
                    chunk = os.read(drain, 65536)
                    if chunk and sink is not None:
                        sink += chunk
                        del sink[:-16384]
                    elif not chunk:
                        drain = None
                if pidfd in ready:
                    return False
                if ready:
                    continue
            clock.sample(roots)
    finally:
        if pidfd is not None:
            os.close(pidfd)


class _Candidate:
    """One candidate process under the planned isolation; ``fds`` are passed through unchanged."""

    def __init__(self, code: str, cfg: SandboxConfig, mode: str, fds: dict, slot: int | None):
        self.cfg = cfg
        self.plan = _plan(cfg)
        self.work = None
        plan = self.plan
        uid = gid = None
        if plan["level"] == "bwrap":
            cwd = "/tmp"
            if plan["ids"] == "slot":
                uid = gid = _slot_uid(cfg, slot)
        else:
            self.work = leftovers.mkdtemp("tiltlab-sbx-")
            cwd = self.work
            if plan["ids"]:
                uid, gid = plan["ids"]
                os.chown(self.work, uid, gid)
        # the process that starts runs the candidate's code, except stdio's server (it forks one child per case,
        # which installs the budget filter itself)
        filt = seccomp_program(budget=mode != "stdio")
        boot = {
            "cwd": cwd,
            "program": code,
            "mode": mode,
            "cpu_s": _cpu_s(cfg),
            "fsize": int(max(cfg.max_file_mb * (1 << 20), cfg.max_output_bytes)),
            "nofile": cfg.nofile,
            "nproc": cfg.nproc,
            **_memory_shares(cfg, mode, plan["level"] == "bwrap"),
            "uid": uid,
            "gid": gid,
            "block_processes": cfg.block_processes,
            "audit_hook": cfg.audit_hook,
            # under bwrap the OS is the boundary and ctypes stays usable (numpy needs it)
            "block_ctypes": plan["level"] != "bwrap",
            # bwrap installs the filter itself (--seccomp); below it the bootstrap does
            "seccomp": filt.hex() if filt is not None and plan["level"] != "bwrap" else "",
            "budget_seccomp": (seccomp_budget_program() or b"").hex() if mode == "stdio" else "",
            "max_reply": _reply_cap(cfg),
            "recursion": _RECURSION,
            "rc_memory": RC_MEMORY,
            "rc_blocked": RC_BLOCKED,
            "script": SCRIPT,
            **fds,
        }
        rb, wb = os.pipe()
        keep = [rb]
        self.out = os.memfd_create("tiltlab-sbx-stdout")
        self.err = os.memfd_create("tiltlab-sbx-stderr")
        site = _site_dirs(plan["python"])
        boot["site"] = site
        cmd = [plan["python"], "-I", "-B", *(["-S"] if site is not None else []), BOOT, str(rb)]
        env = _env(cwd)
        if plan["level"] == "bwrap":
            pre = _bwrap_args(plan["python"], plan["root_parent"], cfg.disk_mb)
            if filt is not None:
                sr, sw = os.pipe()
                os.write(sw, filt)  # a few hundred bytes: far below the pipe buffer
                os.close(sw)
                keep.append(sr)
                pre += ["--seccomp", str(sr)]
            for k, v in env.items():
                pre += ["--setenv", k, v]
            cmd = [*pre, "--", *cmd]
        else:
            if plan["pid_ns"]:
                # keep the interpreter off PID 1 (PID 1 ignores default-action signals such as SIGXCPU)
                cmd = ["/bin/sh", "-c", '"$@"; exit $?', "sh", *cmd]
            cmd = [*_pdeathsig(), *plan["prefix"], *cmd]
        self.t0 = time.monotonic()
        try:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=self.out,
                stderr=self.err,
                cwd=cwd if self.work else "/",
                env=env,
                start_new_session=True,
                pass_fds=(*keep, *fds.values()),
            )
        except BaseException:
            os.close(wb)
            for fd in (self.out, self.err):
                os.close(fd)
            if self.work:
                shutil.rmtree(self.work, ignore_errors=True)
            raise
        finally:
            for fd in keep:
                os.close(fd)
        _write_all(wb, json.dumps(boot).encode())

    def finish(self, rc: int | None, timed_out: bool) -> SandboxResult:
        cap = self.cfg.max_output_bytes
        stdout, over_out = _read_memfd(self.out, cap)
        stderr, over_err = _read_memfd(self.err, cap)
        status = _status_from_rc(rc, timed_out, over_out or over_err)
        iso = {
            "level": self.plan["level"],
            "network_namespace": self.plan["net_ns"],
            "pid_namespace": self.plan["pid_ns"],
            "privileges_dropped": self.plan["ids"] is not None
            or (self.plan["level"] == "bwrap" and not self.plan["root_parent"]),
            "seccomp": seccomp_program() is not None,
        }
        return SandboxResult(status, rc, stdout, stderr, time.monotonic() - self.t0, iso)

    def close(self) -> None:
        if self.proc.poll() is None:
            _kill_group(self.proc)
            self.proc.wait()
        _kill_group(self.proc)  # anything the program left in its session
        for fd in (self.out, self.err):
            with contextlib.suppress(OSError):
                os.close(fd)
        if self.work:
            shutil.rmtree(self.work, ignore_errors=True)


@functools.cache
def _pdeathsig() -> tuple[str, ...]:
    """Below the bwrap level, ``setpriv --pdeathsig KILL`` when it works: the run's first process (``unshare``,
    whose ``--kill-child`` takes the PID namespace with it) is killed when the thread that started it dies,
    with the trainer (bwrap's ``--die-with-parent`` does the same at the bwrap level). A process that changes
    its uid loses it: on the ``process`` level as root the candidate outlives a killed trainer."""
    exe = shutil.which("setpriv")
    if exe is None:
        return ()
    try:
        ok = subprocess.run([exe, "--pdeathsig", "KILL", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return (exe, "--pdeathsig", "KILL") if ok else ()


#: The address space of bwrap's init (pid 1 of the sandbox; bwrap's own code, about 3.3 MiB, 1.4 MiB resident)
INIT_BYTES = 8 << 20


def _memory_shares(cfg: SandboxConfig, mode: str, bwrap: bool) -> dict:
    """The run's budget (``memory_mb``) as RLIMIT_AS shares whose sum it is: bwrap's init gets
    :data:`INIT_BYTES`, the process that runs the candidate's code the rest; in stdio mode the server gets
    ``min(rest // 2, 32 MiB + 4 * max_reply_mb)`` (its interpreter, about 17 MiB, and a reply: the output,
    joined, decoded, encoded) and each case's child ``rest - server`` (one case runs at a time)."""
    budget = int(cfg.memory_mb) << 20
    init = INIT_BYTES if bwrap else 0
    rest = budget - init
    if mode != "stdio":
        return {"init_as": init, "as_bytes": rest, "as_hard": rest, "case_as_bytes": 0}
    server = min(rest // 2, (32 << 20) + 4 * _reply_cap(cfg))
    return {"init_as": init, "as_bytes": server, "as_hard": rest, "case_as_bytes": rest - server}


def _cpu_s(cfg: SandboxConfig) -> int:
    return int(cfg.cpu_s if cfg.cpu_s is not None else int(cfg.timeout_s) + 2)


def _reply_cap(cfg: SandboxConfig) -> int:
    return int(cfg.max_reply_mb * (1 << 20))


def _max_wall(cfg: SandboxConfig) -> float:
    return cfg.max_wall_s if cfg.max_wall_s is not None else 6.0 * cfg.timeout_s


def _config(config: SandboxConfig | None, overrides: dict) -> SandboxConfig:
    cfg = config or SandboxConfig()
    return SandboxConfig(**{**asdict(cfg), **overrides}) if overrides else cfg


def run_python(code: str, config: SandboxConfig | None = None, **overrides) -> SandboxResult:
    """Run ``code`` (Python source) as ``__main__``; keyword overrides update ``config``'s fields."""
    if not isinstance(code, str):
        raise ValueError(f"code must be a str, got {type(code).__name__}")
    cfg = _config(config, overrides)
    with _slot_for(cfg) as slot:
        cand = _Candidate(code, cfg, "run", {}, slot)
        try:
            timed_out = _wait(cand.proc, _RunDeadline(cfg.timeout_s, _max_wall(cfg)), [cand.proc.pid])
            if timed_out:
                _kill_group(cand.proc)
            rc = cand.proc.wait()
            _kill_group(cand.proc)  # reap anything the program left behind in its group
            return cand.finish(rc, timed_out)
        finally:
            cand.close()


def run_judged(
    code: str,
    tests: str,
    config: SandboxConfig | None = None,
    stdio: bool = False,
    entry_point: str | None = None,
    **overrides,
):
    """Run ``code`` in the sandbox and ``tests`` in a separate judge process; ``passed`` is the judge's verdict.

    ``tests`` is Python source. It sees every top-level callable the candidate's code defines
    (functions, classes; names of builtins and dunder names excepted) as a proxy, and
    ``__stdio__(input) -> str``, which runs the candidate's code as ``__main__`` with ``input`` on
    stdin (``stdio=True``: the code is not run at load time). ``entry_point`` names the candidate's
    function the task asks for: the tests reach that name in the candidate's code even when a builtin
    has it (``def pow(...)``), and a candidate that does not define it fails. The verdict is True iff
    the tests ran to the end with no failed assertion, no error and no broken exchange with the candidate.
    """
    if not isinstance(code, str) or not isinstance(tests, str):
        raise ValueError("code and tests must be str")
    if entry_point is not None and not (entry_point.isidentifier() and not entry_point.startswith("__")):
        raise ValueError(f"entry_point must be an identifier that is not a dunder name, got {entry_point!r}")
    cfg = _config(config, overrides)
    req_r, req_w = os.pipe()  # judge -> candidate
    rep_r, rep_w = os.pipe()  # candidate -> judge
    ver_r, ver_w = os.pipe()  # judge -> parent only
    jb_r, jb_w = os.pipe()
    err_r, err_w = os.pipe()  # the judge's stderr
    judge = cand = None
    try:
        with _slot_for(cfg) as slot:
            cand = _Candidate(code, cfg, "stdio" if stdio else "module", {"rfd": req_r, "wfd": rep_w}, slot)
            os.close(req_r)
            os.close(rep_w)
            req_r = rep_w = -1
            with leftovers.tempdir("tiltlab-judge-") as jdir:
                jcfg = {
                    "tests": tests,
                    "as_bytes": int(cfg.memory_mb) << 20,
                    "cpu_s": _cpu_s(cfg),
                    "max_reply": _reply_cap(cfg),
                    "recursion": _RECURSION,
                    "site": _site_dirs(sys.executable),
                    "modules": sorted(JUDGE_MODULES),
                    "no_cross": list(NO_CROSS),
                    "entry": entry_point,
                }
                payload = {**jcfg, "cwd": jdir, "env": _env(jdir)}
                if cfg.judge_server:
                    judge = _served_judge((jb_r, req_w, rep_r, ver_w, err_w))
                if judge is None:
                    payload = {**jcfg, "wfd": req_w, "rfd": rep_r, "vfd": ver_w}
                    judge = subprocess.Popen(
                        [sys.executable, "-I", "-B", "-S", JUDGE, str(jb_r)],
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=err_w,
                        cwd=jdir,
                        env=_env(jdir),
                        start_new_session=True,
                        pass_fds=(jb_r, req_w, rep_r, ver_w),
                    )
                for fd in (jb_r, req_w, rep_r, ver_w, err_w):
                    os.close(fd)
                jb_r = req_w = rep_r = ver_w = err_w = -1
                _write_all(jb_w, json.dumps(payload).encode())
                jb_w = -1
                clock = _RunDeadline(cfg.timeout_s, _max_wall(cfg))
                clock.t0 = clock.last = cand.t0
                jerr = bytearray()
                timed_out = _wait(judge, clock, [judge.pid, cand.proc.pid], drain=err_r, sink=jerr)
                if timed_out:
                    _kill_judge(judge)
                judge.wait()
                with contextlib.suppress(OSError):
                    while chunk := os.read(err_r, 65536):
                        jerr += chunk
                        del jerr[:-16384]
                verdict = False
                if not timed_out and judge.returncode == 0:
                    verdict = os.read(ver_r, 1) == b"1"
                if not timed_out and judge.returncode != 0:
                    # The judge gave up, typically because the candidate's process is going away (its pipes
                    # closed: a syntax error, an exit). Let it finish exiting, so its own exit status is
                    # recorded (a syntax error is "error") rather than the SIGKILL below; a served judge
                    # answers fast enough to get here while bwrap is still reaping the candidate.
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        cand.proc.wait(timeout=min(_EXIT_GRACE_S, max(0.0, clock.left())))
                _kill_group(cand.proc)
                rc = cand.proc.wait()
                res = cand.finish(rc if rc is not None else None, timed_out)
                res.verdict = verdict
                res.judge_stderr = jerr.decode("utf-8", "replace")[-4000:]
                if verdict:
                    res.status = "ok"
                elif res.status in ("ok", "killed"):
                    res.status = "failed"
                return res
    finally:
        if judge is not None:
            if judge.poll() is None:
                _kill_judge(judge)
                judge.wait()
            if isinstance(judge, _ServedJudge):
                judge.close()
        if cand is not None:
            cand.close()
        for fd in (req_r, req_w, rep_r, rep_w, ver_r, ver_w, jb_r, jb_w, err_r, err_w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)


def _pool(fn, items, max_workers: int | None, progress: bool):
    if not items:
        return []
    workers = max_workers or max(1, min(len(items), os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futs = [pool.submit(fn, it) for it in items]
        if progress:
            from tqdm.auto import tqdm

            for f in tqdm(futs, desc="sandbox", total=len(futs)):
                f.result()
        return [f.result() for f in futs]


def run_many(
    codes: list[str], config: SandboxConfig | None = None, max_workers: int | None = None, progress: bool = False
) -> list[SandboxResult]:
    """:func:`run_python` on several programs concurrently (a thread per running sandbox); input order."""
    return _pool(lambda c: run_python(c, config), codes, max_workers, progress)


def run_many_judged(
    jobs: list[tuple[str, str, bool]] | list[tuple[str, str, bool, str | None]],
    config: SandboxConfig | None = None,
    max_workers: int | None = None,
    progress: bool = False,
) -> list[SandboxResult]:
    """:func:`run_judged` on ``(code, tests, stdio)`` or ``(code, tests, stdio, entry_point)`` jobs
    concurrently; results in input order.

    ``max_workers`` defaults to the number of CPUs.
    """
    return _pool(
        lambda j: run_judged(j[0], j[1], config, stdio=j[2], entry_point=j[3] if len(j) > 3 else None),
        jobs,
        max_workers,
        progress,
    )
