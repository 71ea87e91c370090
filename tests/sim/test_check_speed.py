"""What made ``tiltlab check`` cheaper computes the same numbers: the run-scoped experiment cache shared
by forked workers (computed once, identical results, no waiting cycle, nothing left behind), the DPO beta
sweep trained side by side (bit-identical to one run per beta), and the cache folder's variable name is
the one the check runner sets."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle

import pytest
import torch

import tiltlab.sim.checks.fpa as fpa_checks
import tiltlab.sim.experiments as experiments
from tiltlab.paper_checks import cli
from tiltlab.sim.experiments import RUN_CACHE_ENV, cached

pytestmark = pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="the runner forks its workers")


def _counting(log_dir):
    """A cached experiment that appends a line to ``log_dir/calls`` each time it really runs."""

    @cached
    def experiment(seed: int, scale: float = 1.0) -> dict:
        with open(os.path.join(log_dir, "calls"), "a") as fh:
            fh.write(f"{os.getpid()} {seed}\n")
        g = torch.Generator().manual_seed(seed)
        return {"x": torch.randn(4, generator=g, dtype=torch.float64) * scale, "seed": seed}

    return experiment


def _calls(log_dir) -> list[str]:
    path = os.path.join(log_dir, "calls")
    return open(path).read().split("\n")[:-1] if os.path.exists(path) else []


def _child(fn, q) -> None:
    q.put(
        pickle.dumps(fn())
    )  # plain bytes: torch's queue pickler would share the tensors' memory with a process that exits


def _in_children(fn, n: int = 3) -> list:
    """``fn()`` in ``n`` forked processes at once, one call per process (a pool worker that finished one
    call could take another, which its in-memory cache would answer); their results."""
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(fn, q)) for _ in range(n)]
    for p in procs:
        p.start()
    results = [pickle.loads(q.get(timeout=120)) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return results


_EXPERIMENT = None


def _call_experiment():
    return _EXPERIMENT(3, scale=2.0)


def test_shared_cache_computes_once_across_processes(tmp_path, monkeypatch):
    global _EXPERIMENT
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    _EXPERIMENT = _counting(str(log_dir))
    monkeypatch.setenv(RUN_CACHE_ENV, str(cache_dir))
    results = _in_children(_call_experiment)
    assert len(_calls(log_dir)) == 1  # three processes asked, one computed
    alone = _counting(str(tmp_path))  # the same experiment without any cache
    monkeypatch.delenv(RUN_CACHE_ENV)
    want = alone(3, scale=2.0)
    for r in results:
        assert torch.equal(r["x"], want["x"]) and r["seed"] == 3
    # another argument is another result
    monkeypatch.setenv(RUN_CACHE_ENV, str(cache_dir))
    assert not torch.equal(_EXPERIMENT(4, scale=2.0)["x"], want["x"])
    assert torch.equal(_EXPERIMENT(3, scale=3.0)["x"], want["x"] * 1.5)  # a keyword argument too
    assert len(_calls(log_dir)) == 3


def test_without_the_variable_each_process_computes(tmp_path, monkeypatch):
    global _EXPERIMENT
    monkeypatch.delenv(RUN_CACHE_ENV, raising=False)
    _EXPERIMENT = _counting(str(tmp_path))
    _in_children(_call_experiment, n=2)
    assert len(_calls(tmp_path)) == 2


def test_callers_get_copies(tmp_path, monkeypatch):
    monkeypatch.setenv(RUN_CACHE_ENV, str(tmp_path))
    exp = _counting(str(tmp_path))
    a = exp(1)
    a["x"].zero_()
    assert exp(1)["x"].abs().sum() > 0


_OUTER = _INNER = None


def _call_outer():
    return _OUTER(0)


def _call_inner():
    return _INNER(0)


def test_nested_experiments_are_shared_and_finish(tmp_path, monkeypatch):
    """An experiment that needs another one takes the inner lock while holding its own: processes asking
    for the outer and the inner at the same time all finish, and the inner is computed once."""
    global _OUTER, _INNER
    monkeypatch.setenv(RUN_CACHE_ENV, str(tmp_path))
    _INNER = _counting(str(tmp_path))

    @cached
    def outer(seed: int) -> float:
        return float(_INNER(seed)["x"].sum()) + 1.0

    _OUTER = outer
    ctx = mp.get_context("fork")
    with ctx.Pool(4) as pool:
        rs = [pool.apply_async(f) for f in (_call_outer, _call_inner, _call_outer, _call_inner)]
        got = [r.get(timeout=120) for r in rs]
    assert got[0] == got[2] == float(got[1]["x"].sum()) + 1.0
    assert len(_calls(tmp_path)) == 1


def test_failed_experiment_leaves_nothing_and_unlocks(tmp_path, monkeypatch):
    monkeypatch.setenv(RUN_CACHE_ENV, str(tmp_path))
    state = {"fail": True}

    @cached
    def flaky(seed: int) -> int:
        if state["fail"]:
            raise RuntimeError("boom")
        return seed + 1

    with pytest.raises(RuntimeError, match="boom"):
        flaky(5)
    assert not list(tmp_path.glob("*.pkl")) and not list(tmp_path.glob(".*.tmp*"))
    state["fail"] = False
    assert flaky(5) == 6  # the lock was released; the result is stored now
    assert len(list(tmp_path.glob("*.pkl"))) == 1


def test_runner_and_cache_agree_on_the_variable(monkeypatch):
    assert cli.RUN_CACHE_ENV == experiments.RUN_CACHE_ENV
    monkeypatch.setenv(RUN_CACHE_ENV, "outer-value")
    with cli._run_cache() as folder:
        assert os.environ[RUN_CACHE_ENV] == folder and os.path.isdir(folder)
    assert not os.path.exists(folder)  # one run only: removed at the end
    assert os.environ[RUN_CACHE_ENV] == "outer-value"
    monkeypatch.delenv(RUN_CACHE_ENV)
    with cli._run_cache():
        pass
    assert RUN_CACHE_ENV not in os.environ


def _naive_dpo_run(seed, beta, steps, prompts, lam, lr=0.05):
    """One beta trained alone, step by step (the loop the sweep replaced)."""
    from tiltlab.objectives.offline import dpo_loss, future_policy_logprobs

    g = torch.Generator().manual_seed(seed)
    B, K = prompts, 16
    ref = torch.randn(B, 1, K, generator=g, dtype=torch.float64)
    yw = torch.randint(K, (B, 1), generator=g)
    yl = (yw + torch.randint(1, K, (B, 1), generator=g)) % K
    th = ref.clone().requires_grad_(True)
    opt = torch.optim.Adam([th], lr=lr)

    def logp(t, y):
        return torch.log_softmax(t, -1).gather(-1, y.unsqueeze(-1)).squeeze(-1).sum(-1)

    rw, rl = logp(ref, yw), logp(ref, yl)
    early = None
    for step in range(steps):
        if lam > 0:
            lw = future_policy_logprobs(th, ref, yw, lam=lam).sum(-1)
            ll = future_policy_logprobs(th, ref, yl, lam=lam).sum(-1)
        else:
            lw, ll = logp(th, yw), logp(th, yl)
        loss = dpo_loss(lw, ll, rw, rl, beta=beta).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step + 1 == steps // 10:
            early = float(logp(th.detach(), yl).exp().mean())
    with torch.no_grad():
        d = (logp(th, yw) - logp(th, yl)) - (rw - rl)
        return {
            "ratio_change": float(d.mean()),
            "frac_raised": float((d > 0).double().mean()),
            "pi_l_start": float(rl.exp().mean()),
            "pi_l_early": early,
            "pi_l_end": float(logp(th, yl).exp().mean()),
        }


@pytest.mark.parametrize("lam", [0.0, 1.5])
def test_dpo_sweep_is_bit_identical_to_one_run_per_beta(lam):
    """The side-by-side sweep (fpa.a4.loser_vanishes) and one training per beta give the same floats."""
    betas = (0.1, 0.5, 2.0)
    sweep = fpa_checks.dpo_bandit_sweep(7, betas, steps=40, prompts=8, lam=lam)
    for beta, got in zip(betas, sweep):
        assert got == _naive_dpo_run(7, beta, steps=40, prompts=8, lam=lam)
    assert sweep[0] != sweep[2]  # the betas differ: each run used its own beta
    assert fpa_checks.dpo_bandit_training(7, 0.5, steps=40, prompts=8, lam=lam) == sweep[1]


def _naive_simplex_min(log_star, b, starts=4, steps=250, generator=None):
    """Every face optimized, the vertices included (what simplex_min did before it skipped them)."""
    from tiltlab.sim.experiments.bias import biased_loss

    n, k = log_star.shape
    nb = b.shape[1]
    subsets = torch.tensor([[(s >> i) & 1 for i in range(k)] for s in range(1, 2**k)], dtype=torch.bool)
    S = subsets.shape[0]
    init = torch.randn(n, nb, S, starts, k, generator=generator, dtype=torch.float64) * 2
    init[..., 0, :] = log_star[:, None, None, :]
    u = init.clone().requires_grad_(True)
    mask = subsets[None, None, :, None, :].expand(n, nb, S, starts, k)
    ls, bb = log_star[:, None, None, None, :], b[:, :, None, None]
    opt = torch.optim.Adam([u], lr=0.05)
    for _ in range(steps):
        opt.zero_grad()
        biased_loss(u.masked_fill(~mask, float("-inf")), ls, bb).sum().backward()
        opt.step()
    with torch.no_grad():
        return biased_loss(u.masked_fill(~mask, float("-inf")), ls, bb).flatten(2).amin(-1)


@pytest.mark.parametrize("k", [3, 4])
def test_simplex_min_is_bit_identical_to_optimizing_every_face(k):
    from tiltlab.sim.experiments.bias import simplex_min

    g = torch.Generator().manual_seed(k)
    log_star = torch.log_softmax(torch.randn(3, k, generator=g, dtype=torch.float64) * 1.2, -1)
    b = torch.tensor([[-0.4, -0.05, 0.3]], dtype=torch.float64).expand(3, 3)
    got = simplex_min(log_star, b, steps=40, generator=torch.Generator().manual_seed(1))
    want = _naive_simplex_min(log_star, b, steps=40, generator=torch.Generator().manual_seed(1))
    assert torch.equal(got, want)
    assert (got < b**2 - 1e-9).any()  # some case where a face beats pi*: the faces' optimum matters
