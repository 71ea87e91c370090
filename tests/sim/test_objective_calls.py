"""The simulator's trainers call the public ``tiltlab.objectives`` function the LLM trainers call for
the same objective (``sim/train.py``'s table), so the checks run through the training code.

Each case replaces the function in its ``objectives`` module by a wrapper that counts calls and
returns the original's value; a trainer that computed the loss some other way leaves the count at 0.
"""

from __future__ import annotations

import importlib

import pytest

from tiltlab.objectives.output import LossOutput
from tiltlab.sim.config import SimConfig
from tiltlab.sim.train import train

# (config overrides, objectives module, function) — one row per objective in sim/train.py's table
CASES = [
    (dict(method="tb", log_z="frozen"), "tb", "disa_loss"),
    (dict(method="tb", log_z="exact"), "tb", "disa_loss"),
    (dict(method="tb", log_z="vargrad"), "tb", "vargrad_log_z"),
    (dict(method="tb", log_z="learned", anchor="old"), "tb", "tb_residual"),
    (
        dict(method="tb", log_z="learned", anchor="old", select_m=2, paced_replay=True, logz_init="frozen"),
        "tb",
        "tb_loss",
    ),
    (dict(method="flowrl"), "tb", "flowrl_loss"),
    (dict(method="lad"), "lad", "lad_loss"),
    (dict(method="grpo", advantage="group"), "pg", "grpo_loss"),
    (dict(method="grpo", advantage="group"), "pg", "group_advantages"),
    (dict(method="gspo", advantage="group"), "pg", "gspo_loss"),
    (dict(method="cispo", advantage="group", inner_steps=2), "pg", "cispo_loss"),
    (dict(method="sapo", advantage="group", inner_steps=2), "pg", "sapo_loss"),
    (dict(method="offrl"), "offline", "offrl_loss"),
    (dict(method="fpa"), "offline", "fpa_loss"),
    (dict(method="fpa"), "offline", "future_policy_logprobs"),
    (dict(method="dpo"), "offline", "dpo_loss"),
    (dict(method="sft"), "offline", "sft_loss"),
]


def _record(monkeypatch, module: str, fn: str) -> list:
    mod = importlib.import_module(f"tiltlab.objectives.{module}")
    original = getattr(mod, fn)
    calls: list = []

    def recording(*args, **kwargs):
        calls.append(fn)
        return original(*args, **kwargs)

    monkeypatch.setattr(mod, fn, recording)
    return calls


@pytest.mark.parametrize(("overrides", "module", "fn"), CASES, ids=[f"{c[0]}->{c[2]}" for c in CASES])
def test_trainer_calls_the_objectives_function(monkeypatch, overrides, module, fn):
    calls = _record(monkeypatch, module, fn)
    cfg = SimConfig(env="multiprompt", P=4, K=6, steps=2, G=4, seeds=2, log_every=1, **overrides)
    train(cfg, _env(cfg))
    assert calls, f"sim trainer ({overrides}) did not call tiltlab.objectives.{module}.{fn}"


@pytest.mark.parametrize("log_z", ["learned", "vargrad"])
def test_attached_or_batch_log_z_does_not_go_through_disa_loss(monkeypatch, log_z):
    """``disa_loss`` detaches log Z: a learned log Z (PACED) must not pass through it, and VarGrad
    composes ``tb_residual`` / ``tb_loss`` as the LLM trainer does."""
    calls = _record(monkeypatch, "tb", "disa_loss")
    cfg = SimConfig(env="multiprompt", P=4, K=6, steps=2, G=4, seeds=2, log_z=log_z, anchor="old")
    res = train(cfg, _env(cfg))
    assert not calls
    if log_z == "learned":  # the gradient reached the log Z parameter
        assert float(res.extra["log_z"].abs().max()) > 0


def test_disa_path_uses_disa_loss_value(monkeypatch):
    """The DISA trainer's gradient comes from ``disa_loss``: scaling its value scales the first update's size."""
    from tiltlab.objectives import tb

    original = tb.disa_loss
    cfg = SimConfig(env="multiprompt", P=4, K=6, steps=1, G=4, seeds=1, log_z="frozen", optimizer="sgd", lr=0.1)
    step = {}
    for scale in (1.0, 3.0):
        monkeypatch.setattr(tb, "disa_loss", lambda *a, s=scale, **k: LossOutput(s * original(*a, **k).loss))
        res = train(cfg, _env(cfg))
        step[scale] = res.logp  # one SGD step from pi_ref
    env = _env(cfg)
    d1 = step[1.0][0] - env.logp_ref
    d3 = step[3.0][0] - env.logp_ref
    # one SGD step: the logit change is linear in the loss scale; log_softmax of a 3x step is not 3x the
    # 1x one, so compare directions of the first-order change (cosine > 0.99 holds for steps this small)
    cos = float((d1 * d3).sum() / (d1.norm() * d3.norm()))
    assert float(d3.norm()) > 2.5 * float(d1.norm()) and cos > 0.99


def _env(cfg: SimConfig):
    from tiltlab.sim.api import make_env

    return make_env(cfg)
