"""Seed-sharded llm checks (``pool.map_seeds``): the seeds of a check in forked processes give the
sequential run's result exactly, in seed order; errors name their seed; ``tiltlab check --jobs N``
runs the llm-layer checks one at a time with their seeds in N processes."""

from __future__ import annotations

import dataclasses
import os
import time

import pytest
import torch

from tiltlab.llm.checks import enumerable
from tiltlab.llm.experiments import pool, warmup
from tiltlab.llm.experiments import tiny as tiny_runs

# ------------------------------------------------------------------ map_seeds itself (torch only)


def test_jobs_1_runs_in_this_process_in_seed_order():
    pid = os.getpid()
    assert pool.map_seeds(lambda s: (s, os.getpid()), [5, 3, 9], jobs=1) == [(5, pid), (3, pid), (9, pid)]
    with pool.seed_jobs(1):
        assert pool.map_seeds(lambda s: os.getpid(), [0, 1]) == [pid, pid]


def test_jobs_1_raises_the_seeds_own_error_unchanged():
    err = KeyError("boom")

    def fn(s):
        if s == 2:
            raise err
        return s

    with pytest.raises(KeyError) as info:
        pool.map_seeds(fn, [0, 1, 2], jobs=1)
    assert info.value is err


def test_order_is_seed_order_when_workers_finish_out_of_order(tmp_path):
    """Seed 0 waits until seed 1 has finished in the other worker, so the results arrive 1 before 0;
    the list still follows the seeds. The per-seed function is a closure: it reaches the workers by
    fork, not by pickling."""
    marks = tmp_path

    def fn(s):
        if s == 0:
            t_end = time.monotonic() + 60  # a bound on a hang, never a timing assertion
            while not (marks / "done-1").exists():
                if time.monotonic() > t_end:
                    raise TimeoutError("seed 1 never finished")
                time.sleep(0.01)
        with open(marks / "order", "a") as f:
            f.write(f"{s}\n")
        (marks / f"done-{s}").touch()
        return (s, s * 10, os.getpid())

    out = pool.map_seeds(fn, [0, 1, 2], jobs=2)
    assert [(s, v) for s, v, _ in out] == [(0, 0), (1, 10), (2, 20)]
    finished = (marks / "order").read_text().split()
    assert finished.index("1") < finished.index("0")  # a worker finished out of order
    assert os.getpid() not in {p for _, _, p in out} and len({p for _, _, p in out}) == 2


def test_workers_use_one_torch_thread_and_do_not_shard_again():
    outer = torch.get_num_threads()
    torch.set_num_threads(3)  # not 1 (the workers' count), so "untouched here" can fail
    try:
        with pool.seed_jobs(2):
            out = pool.map_seeds(lambda s: (torch.get_num_threads(), pool._JOBS), [0, 1, 2])
        assert out == [(1, 1)] * 3
        assert pool._JOBS == 1 and torch.get_num_threads() == 3  # restored here, untouched by the workers
    finally:
        torch.set_num_threads(outer)


def test_a_failing_worker_names_its_seed():
    def fn(s):
        if s == 301:
            raise FloatingPointError("non-finite training loss nan at step 1")
        return s

    with pytest.raises(FloatingPointError, match=r"^seed 301: non-finite training loss nan at step 1$"):
        pool.map_seeds(fn, [300, 301, 302], jobs=2)

    class Odd(Exception):  # cannot be built from one message: re-raised as RuntimeError, the type named
        def __init__(self, a, b):
            super().__init__(f"{a}/{b}")

    def odd(s):
        raise Odd(s, "x")

    with pytest.raises(RuntimeError, match=r"^seed 7: Odd: 7/x$"):
        pool.map_seeds(odd, [7, 8], jobs=2)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_bad_job_counts_are_refused(bad):
    with pytest.raises(ValueError, match=r"^jobs must be an integer >= 1 \(1 = in this process\), got "):
        pool.set_jobs(bad)
    with pytest.raises(ValueError, match="jobs must be an integer >= 1"):
        pool.map_seeds(lambda s: s, [0], jobs=bad)
    assert pool._JOBS == 1


def test_gather_concatenates_each_list_in_seed_order():
    from tiltlab.llm.checks import rules as R

    def part(s):
        log = R.RunLog([s > 0], [True], [s % 2 == 0])
        return {"a": {1.0: [s, s + 0.5]}, "b": [s]}, (log, [(s, -s)])

    got = pool.gather([part(s) for s in (0, 1, 2)])
    assert got[0] == {"a": {1.0: [0, 0.5, 1, 1.5, 2, 2.5]}, "b": [0, 1, 2]}
    assert got[1][0] == R.RunLog([False, True, True], [True] * 3, [True, False, True])
    assert got[1][1] == [(0, 0), (1, -1), (2, -2)]
    with pytest.raises(ValueError, match="different keys"):
        pool.gather([{"a": []}, {"b": []}])
    with pytest.raises(ValueError, match="at least one seed"):
        pool.gather([])


# ------------------------------------------------------------------ sharded checks equal the sequential ones


@pytest.fixture(scope="module")
def tiny_task(tmp_path_factory):
    pytest.importorskip("transformers")
    mp = pytest.MonkeyPatch()
    mp.setenv("TILTLAB_CACHE", str(tmp_path_factory.mktemp("cache")))
    mp.setattr(warmup, "WARM_STEPS", 3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the workers' count: a float reduction's order depends on it
    yield
    torch.set_num_threads(threads)
    mp.undo()


def _both(fn, monkeypatch):
    """``fn()`` sequentially, then with the seeds in 2 processes, each with a fresh memo. Before each
    run the global torch generator is set to a different state: a seed that read it would differ."""
    out = []
    for jobs, rng in ((1, 11), (2, 22)):
        monkeypatch.setattr(tiny_runs, "_MEMO", {})
        torch.manual_seed(rng)
        with pool.seed_jobs(jobs):
            out.append(fn())
    return out


@pytest.mark.llm
def test_sharded_memoized_run_equals_sequential(tiny_task, monkeypatch):
    """The LAD run (eight arms per seed, memoized for two claims): raw lists and both checks' results."""
    kw = dict(n_seeds=3, steps=2)
    seq, par = _both(
        lambda: (tiny_runs.lad_raw(0, **kw), enumerable.lad_divergences(0, **kw), enumerable.lad_table8(0, **kw)),
        monkeypatch,
    )
    (acc, hacc, log), *checks = seq
    assert len(acc["kl"]) == len(hacc["kl"]) == 3 and len(log.loss_moved) == 3 * len(tiny_runs.LAD_NAMES)
    assert par[0] == seq[0]
    for a, b in zip(par[1:], checks):
        assert dataclasses.asdict(a) == dataclasses.asdict(b)  # verdict, summary, every number and item


@pytest.mark.llm
def test_sharded_plain_check_equals_sequential(tiny_task, monkeypatch):
    seq, par = _both(lambda: enumerable.target_tracking(0, n_seeds=3, steps=2, betas=(1.0, 4.0)), monkeypatch)
    assert seq.numbers["runs"] == 6
    assert dataclasses.asdict(par) == dataclasses.asdict(seq)


# ------------------------------------------------------------------ the command line


def test_check_jobs_n_shards_llm_seeds_in_this_process(monkeypatch):
    """``tiltlab check --jobs 2``: llm-layer checks run here, one after another, at 2 seed jobs (one memo
    for all of them); the other layers keep their pool of one process per check."""
    from types import SimpleNamespace

    from tiltlab.claims import registry
    from tiltlab.paper_checks import cli

    pid = os.getpid()

    def check(key, layer):
        return SimpleNamespace(key=key, layer=layer)

    seen = []
    monkeypatch.setattr(
        registry,
        "run_one",
        lambda c, seed: seen.append((c.key, pool._JOBS, os.getpid())) or registry.Outcome(c, None, 0),
    )
    pooled = []

    def fake_checks(chks, seed, progress, jobs):
        if jobs > 1:  # the per-check pool, stubbed: record what it was given
            pooled.append([c.key for c in chks])
            return [registry.Outcome(c, None, 0.0) for c in chks]
        return real(chks, seed, progress, jobs)

    real = cli._run_checks
    monkeypatch.setattr(cli.runner, "_run_checks", fake_checks)
    chks = [check("a", "llm"), check("b", "sim"), check("c", "llm"), check("d", "theory")]
    outs = cli._run(chks, 0, progress=False, jobs=2)
    assert [o.check.key for o in outs] == ["a", "b", "c", "d"]
    assert pooled == [["b", "d"]] and seen == [("a", 2, pid), ("c", 2, pid)]
    assert pool._JOBS == 1
    seen.clear()
    cli._run(chks, 0, progress=False, jobs=1)  # --jobs 1: everything here, seeds in this process
    assert seen == [(k, 1, pid) for k in "abcd"]


def test_the_first_failing_seed_in_seed_order_is_reported_whatever_finishes_first():
    """As with jobs = 1: when several seeds fail, the error names the first of them in seed order, even
    when a later seed's worker fails first (seed 10 fails at once, seed 9 only after a pause)."""
    import time

    def fn(s):
        if s == 9:
            time.sleep(0.5)  # an ordering device, not a timing assertion: the result must not depend on it
            raise ValueError("late")
        if s == 10:
            raise ValueError("early")
        return s

    for _ in range(3):
        with pytest.raises(ValueError, match=r"^seed 9: late$"):
            pool.map_seeds(fn, [8, 9, 10, 11], jobs=2)
