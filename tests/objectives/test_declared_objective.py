"""An objective declared once is found everywhere: a toy policy-gradient objective, declared in a
fixture (``registry.registered``) and nowhere else, is in ``tiltlab llm train``'s ``--objective``
help, passes the run config's check, is accepted by ``TiltGRPOConfig`` and trained by the TRL
trainer's loss path, registered and run by the veRL plug-in, and trained by the simulator; once the
fixture ends it is in none of them.

The toy is GRPO's clipped surrogate at ``clip_eps=0.1`` times 2 (so its value tells it from GRPO's
own entry); each dispatcher's loss is compared with that direct computation."""

from __future__ import annotations

import argparse
import math

import pytest
import torch

from tiltlab.objectives import pg, registry
from tiltlab.objectives.catalog import SPECS, Spec, names
from tiltlab.objectives.output import LossOutput
from tiltlab.objectives.registry import ObjectiveBatch

F64 = torch.float64
TOY = "toy_pg"
CLIP = 0.1


def _direct(b: ObjectiveBatch, **options) -> torch.Tensor:
    """The toy's loss written out: 2 x GRPO's surrogate at the toy's clip."""
    kw = {"clip_eps": CLIP, **options}
    return 2.0 * pg.grpo_loss(b.token_logp, b.token_logp_old, b.advantages, b.mask, **kw).loss


@pytest.fixture
def toy():
    """The toy objective, declared and registered for the test only; ``calls`` records each adapter call's options."""
    calls: list[dict] = []

    def adapter(b: ObjectiveBatch, opts: dict) -> LossOutput:
        calls.append(dict(opts))
        kw = dict(opts)
        if b.token_logp_ref is not None:
            kw["token_logp_ref"] = b.token_logp_ref
        out = pg.grpo_loss(b.get("token_logp"), b.get("token_logp_old"), b.get("advantages"), b.mask, **kw)
        return LossOutput(2.0 * out.loss, out.metrics)

    spec = Spec(
        TOY,
        "pg.grpo_loss",
        ("token_logp_old", "advantages"),
        "pg",
        frozenset({"online", "sim", "verl"}),
        doc="a test's toy: 2 x GRPO at clip 0.1",
        defaults={"clip_eps": CLIP},
    )
    with registry.registered(spec, adapter):
        yield calls
    assert TOY not in SPECS and TOY not in registry.OBJECTIVES


def _batch(seed: int = 0, b: int = 4, t: int = 3) -> ObjectiveBatch:
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(b, t, generator=g, dtype=F64) - 0.1).requires_grad_(True)
    old = logp.detach() + 0.3 * torch.randn(b, t, generator=g, dtype=F64)
    mask = torch.ones(b, t, dtype=F64)
    mask[0, -1] = 0.0
    adv = torch.randn(b, generator=g, dtype=F64)
    return ObjectiveBatch(logp, mask, token_logp_old=old, advantages=adv)


def test_the_declaration_lists_it_for_its_trainers_only(toy):
    assert TOY in names("online") and TOY in names("sim") and TOY in names("verl")
    assert TOY not in names("offline") and TOY in names(family="pg")
    assert names("online")[-1] == TOY  # appended after the documented order


def test_the_train_cli_offers_it(toy):
    from tiltlab.llm.train import cli as train_cli

    parser = argparse.ArgumentParser()
    train_cli.add_cli(parser.add_subparsers())
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["train"]
    help_of = {a.dest: a.help for a in sub._actions}
    assert TOY in help_of["objective"] and "disa" in help_of["objective"]


def test_the_run_config_accepts_it_and_forgets_it_afterwards():
    from tiltlab.llm.base.run_config import RunConfig

    with pytest.raises(ValueError, match="not an online objective"):
        RunConfig(model="tiny", objective=TOY)
    spec = Spec(TOY, "pg.grpo_loss", ("token_logp_old", "advantages"), "pg", frozenset({"online"}))
    with registry.registered(spec, lambda b, o: LossOutput(b.token_logp.sum())):
        assert RunConfig(model="tiny", objective=TOY).objective == TOY
        with pytest.raises(ValueError, match="not an offline objective"):
            RunConfig(model="tiny", kind="offline", objective=TOY)
    with pytest.raises(ValueError, match="not an online objective"):
        RunConfig(model="tiny", objective=TOY)


def test_the_trl_trainer_trains_it(toy, tmp_path):
    pytest.importorskip("trl")
    from types import SimpleNamespace

    from tiltlab.llm.train import online

    args = online.TiltGRPOConfig(
        output_dir=str(tmp_path), objective=TOY, report_to="none", use_cpu=True, per_device_train_batch_size=2,
        num_generations=2, max_completion_length=3, beta=0.0,
    )  # fmt: skip
    assert args.loss_type is None and args.importance_sampling_level == "token"  # not a TRL loss type
    assert online.loss_function(TOY) is online.losses.policy_objective
    b = _batch()
    lb = online.LossBatch(
        b.token_logp, b.token_logp_old, None, b.mask, None, None, {"advantages": b.advantages}, None, None
    )
    trainer = SimpleNamespace(args=args, kl_coef=0.0)
    out = online.loss_function(TOY)(trainer, None, lb)
    assert toy == [{"clip_eps": CLIP, "kl_coef": 0.0, "kl_ratio_weighted": bool(args.use_bias_correction_kl)}]
    assert math.isclose(float(out.loss), float(_direct(b)), rel_tol=1e-12)
    (g,) = torch.autograd.grad(out.loss, b.token_logp)
    (g_ref,) = torch.autograd.grad(_direct(b), b.token_logp)
    assert torch.allclose(g, g_ref, rtol=1e-12, atol=0)
    with pytest.raises(ValueError, match="objective must be one of"):
        online.TiltGRPOConfig(output_dir=str(tmp_path), objective="toy_pgx", report_to="none", use_cpu=True)


def test_the_verl_plugin_registers_and_runs_it(toy, monkeypatch):
    pytest.importorskip("verl")
    from verl.trainer.ppo import core_algos
    from verl.workers.config import ActorConfig

    from tiltlab.llm import verl as plugin

    # the toy's registration is undone with the toy (other tests run every loss the plug-in registered)
    monkeypatch.setattr(plugin.policy, "POLICY_LOSSES", dict(plugin.POLICY_LOSSES))
    monkeypatch.setattr(core_algos, "POLICY_LOSS_REGISTRY", dict(core_algos.POLICY_LOSS_REGISTRY))
    plugin.register()
    fn = plugin.policy.POLICY_LOSSES[f"tiltlab_{TOY}"]
    cfg = ActorConfig(strategy="fsdp", rollout_n=2, ppo_micro_batch_size_per_gpu=1, clip_ratio=0.2)
    b = _batch(1)
    mask = b.mask > 0
    loss, metrics = fn(
        old_log_prob=b.token_logp_old, log_prob=b.token_logp, advantages=b.advantages[:, None] * mask,
        response_mask=mask, loss_agg_mode="token-mean", config=cfg, rollout_is_weights=None,
    )  # fmt: skip
    assert toy == [{"clip_eps": CLIP, "loss_agg": "token_mean"}]
    assert math.isclose(float(loss), float(_direct(b, loss_agg="token_mean")), rel_tol=1e-12)
    assert "actor/pg_clipfrac" in metrics
    assert f"tiltlab_{TOY}" in core_algos.POLICY_LOSS_REGISTRY


def test_the_simulator_trains_it(toy):
    from tiltlab.sim.api import make_env
    from tiltlab.sim.config import SimConfig, methods
    from tiltlab.sim.train import train

    assert TOY in methods()
    cfg = SimConfig(env="multiprompt", P=3, K=5, steps=2, G=3, seeds=1, log_every=1, method=TOY, advantage="group")
    res = train(cfg, make_env(cfg))
    assert toy and all(c == {"clip_eps": CLIP, "kl_coef": 0.0} for c in toy)
    assert len(toy) == 2  # one loss per rollout batch
    assert res is not None


def test_registering_a_declared_name_or_a_bad_declaration_is_refused():
    with (
        pytest.raises(ValueError, match="already registered"),
        registry.registered(SPECS["grpo"], registry.OBJECTIVES["grpo"].adapter),
    ):
        pass
    assert "grpo" in SPECS and "grpo" in registry.OBJECTIVES
    with pytest.raises(ValueError, match="family must be one of"):
        Spec("x", "pg.grpo_loss", (), "policy", frozenset({"online"}))
    with pytest.raises(ValueError, match="unknown trainers/tags"):
        Spec("x", "pg.grpo_loss", (), "pg", frozenset({"trl"}))
    with pytest.raises(ValueError, match="unknown trainer"):
        names("trl")


def test_every_declaration_says_what_it_is():
    """Each declared objective has its one-line doc (the CLI help and docs read it) and a loss function
    named module.function."""
    for s in SPECS.values():
        assert s.doc and "\n" not in s.doc, s.name
        module, _, fn = s.loss.partition(".")
        assert module and fn, s.name
