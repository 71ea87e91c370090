"""The registry of objective adapters (``tiltlab.objectives.registry``).

* every entry names a loss function with an OpInfo entry (the generic checks cover its math);
* each adapter's value, gradient and metrics equal a direct call of that loss on the same batch,
  at the defaults and with options away from them (the batch's fields are all distinct, so an
  adapter that passes one field where another belongs gives another value);
* the three dispatchers -- the simulator's trainer, the TRL trainer (``LOSSES``) and the veRL
  plug-in -- reach their objectives through the registry (a recording wrapper on every entry).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from tests.objectives.opinfo import BY_NAME
from tiltlab.objectives import lad, offline, pg, registry, tb
from tiltlab.objectives.catalog import names
from tiltlab.objectives.output import LossOutput
from tiltlab.objectives.registry import OBJECTIVES, ObjectiveBatch, get_objective

F64 = torch.float64
P, G, T = 3, 2, 4
B = P * G


def _batch(seed: int = 0) -> ObjectiveBatch:
    g = torch.Generator().manual_seed(seed)

    def rn(*shape, s=1.0):
        return torch.randn(shape, generator=g, dtype=F64) * s

    lengths = torch.tensor([T, 1, 3, 2, T, 3])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(F64)
    lp = (-torch.rand(B, T, generator=g, dtype=F64) * 2 - 0.05).requires_grad_(True)
    adv = rn(B)
    adv[0], adv[1] = abs(float(adv[0])) + 0.5, -abs(float(adv[1])) - 0.5
    rej_lp = (-torch.rand(B, T, generator=g, dtype=F64) * 2 - 0.05).requires_grad_(True)
    rejected = ObjectiveBatch(rej_lp, mask.flip(0), token_logp_ref=rej_lp.detach() + rn(B, T, s=0.3))
    return ObjectiveBatch(
        lp,
        mask,
        token_logp_old=lp.detach() + rn(B, T, s=0.4),
        token_logp_ref=lp.detach() + rn(B, T, s=0.3),
        token_logp_sampler=lp.detach() + rn(B, T, s=0.5),
        token_logp_future=lp.detach() + rn(B, T, s=0.2),
        advantages=adv,
        rewards=torch.where(torch.rand(B, generator=g) < 0.5, 1.0, -1.0).to(F64).index_fill(0, torch.tensor([2]), 0.0),
        log_z=rn(B).requires_grad_(True),
        is_weight=torch.rand(B, generator=g, dtype=F64) + 0.5,
        values=rn(B, s=0.5),
        rejected=rejected,
    )


def _seq(b: ObjectiveBatch, name: str = "token_logp", scale: str = "sum"):
    return tb.sequence_logprob(getattr(b, name), b.mask, normalize=scale)


def _tb_w(b, clip, max_weight=10.0, eps=0.2, eps_high=None):
    return (
        tb.tb_importance_weight(
            b.token_logp, b.token_logp_old, b.mask, weight_clip=clip, max_weight=max_weight, eps=eps, eps_high=eps_high
        )
        * b.is_weight
    )


def _lad_direct(b, eta, divergence, level="sequence", logprob_scale="mean", loss_agg="seq_mean_token_mean", **kw):
    if level == "sequence":
        return lad.lad_loss(
            _seq(b, scale=logprob_scale), _seq(b, "token_logp_old", logprob_scale), b.advantages, eta=eta, divergence=divergence,
            is_weight=b.is_weight,
        )  # fmt: skip
    per = lad.lad_loss(
        b.token_logp,
        b.token_logp_old,
        b.advantages[:, None].expand(B, T),
        eta=eta,
        divergence=divergence,
        loss_agg="none",
    )
    return LossOutput(pg.aggregate(per.loss * b.is_weight[:, None], b.mask, loss_agg=loss_agg, **kw))


def _vargrad_direct(b, beta, group_size):
    lz = tb.vargrad_log_z(
        _seq(b).view(-1, group_size),
        _seq(b, "token_logp_ref").view(-1, group_size),
        b.rewards.view(-1, group_size),
        beta=beta,
    )
    return tb.tb_loss(
        tb.tb_residual(
            _seq(b), _seq(b, "token_logp_ref"), b.rewards, lz.detach().repeat_interleave(group_size), beta=beta
        ),
        is_weight=b.is_weight,
    )


# name -> [(options, direct call of the loss on the batch)]: the defaults first, then options away from them
CASES = {
    "grpo": [
        ({}, lambda b: pg.grpo_loss(b.token_logp, b.token_logp_old, b.advantages, b.mask, token_logp_ref=b.token_logp_ref, is_weight=b.is_weight, token_logp_sampler=b.token_logp_sampler)),
        (
            {"clip_eps": 0.1, "clip_eps_high": 0.3, "kl_coef": 0.2, "loss_agg": "seq_mean_token_mean", "off_policy_threshold": 0.1},
            lambda b: pg.grpo_loss(b.token_logp, b.token_logp_old, b.advantages, b.mask, clip_eps=0.1, clip_eps_high=0.3, kl_coef=0.2, loss_agg="seq_mean_token_mean", off_policy_threshold=0.1, token_logp_ref=b.token_logp_ref, is_weight=b.is_weight, token_logp_sampler=b.token_logp_sampler),
        ),
    ],
    "gspo": [
        ({}, lambda b: pg.gspo_loss(b.token_logp, b.token_logp_old, b.advantages, b.mask, is_weight=b.is_weight, token_logp_sampler=b.token_logp_sampler)),
        ({"clip_eps": 0.05, "clip_eps_high": 0.08}, lambda b: pg.gspo_loss(b.token_logp, b.token_logp_old, b.advantages, b.mask, clip_eps=0.05, clip_eps_high=0.08, is_weight=b.is_weight, token_logp_sampler=b.token_logp_sampler)),
    ],
    "cispo": [
        ({"kl_coef": 0.3}, lambda b: pg.cispo_loss(b.token_logp, b.token_logp_old, b.advantages, b.mask, kl_coef=0.3, token_logp_ref=b.token_logp_ref, is_weight=b.is_weight, token_logp_sampler=b.token_logp_sampler)),
        ({"ratio_max": 1.2, "ratio_min": 0.9, "kl_coef": 0.3}, lambda b: pg.cispo_loss(b.token_logp, b.token_logp_old, b.advantages, b.mask, ratio_max=1.2, ratio_min=0.9, kl_coef=0.3, token_logp_ref=b.token_logp_ref, is_weight=b.is_weight, token_logp_sampler=b.token_logp_sampler)),
    ],
    "sapo": [
        ({"kl_coef": 0.3}, lambda b: pg.sapo_loss(b.token_logp, b.token_logp_old, b.advantages, b.mask, kl_coef=0.3, token_logp_ref=b.token_logp_ref, is_weight=b.is_weight, token_logp_sampler=b.token_logp_sampler)),
        ({"temp_pos": 0.5, "temp_neg": 2.0, "kl_coef": 0.3}, lambda b: pg.sapo_loss(b.token_logp, b.token_logp_old, b.advantages, b.mask, temp_pos=0.5, temp_neg=2.0, kl_coef=0.3, token_logp_ref=b.token_logp_ref, is_weight=b.is_weight, token_logp_sampler=b.token_logp_sampler)),
    ],
    "luspo": [
        ({"kl_coef": 0.3}, lambda b: pg.luspo_loss(b.token_logp, b.token_logp_old, b.advantages, b.mask, kl_coef=0.3, token_logp_ref=b.token_logp_ref, is_weight=b.is_weight, token_logp_sampler=b.token_logp_sampler)),
        ({"clip_eps": 0.1, "clip_eps_high": 0.2, "kl_coef": 0.3}, lambda b: pg.luspo_loss(b.token_logp, b.token_logp_old, b.advantages, b.mask, clip_eps=0.1, clip_eps_high=0.2, kl_coef=0.3, token_logp_ref=b.token_logp_ref, is_weight=b.is_weight, token_logp_sampler=b.token_logp_sampler)),
    ],
    "vespo": [
        ({"kl_coef": 0.3}, lambda b: pg.vespo_loss(b.token_logp, b.token_logp_old, b.advantages, b.mask, kl_coef=0.3, token_logp_ref=b.token_logp_ref, is_weight=b.is_weight, token_logp_sampler=b.token_logp_sampler)),
        ({"k_pos": 1.5, "lambda_neg": 1.2, "kl_coef": 0.3}, lambda b: pg.vespo_loss(b.token_logp, b.token_logp_old, b.advantages, b.mask, k_pos=1.5, lambda_neg=1.2, kl_coef=0.3, token_logp_ref=b.token_logp_ref, is_weight=b.is_weight, token_logp_sampler=b.token_logp_sampler)),
    ],
    "lad": [
        ({"eta": 1.0, "divergence": "kl"}, lambda b: _lad_direct(b, 1.0, "kl")),
        ({"eta": 0.7, "divergence": "hellinger", "logprob_scale": "sum"}, lambda b: _lad_direct(b, 0.7, "hellinger", logprob_scale="sum")),
        ({"eta": 0.7, "divergence": "js", "level": "token", "loss_agg": "token_mean"}, lambda b: _lad_direct(b, 0.7, "js", "token", loss_agg="token_mean")),
    ],
    "flowrl": [
        ({"group_size": G}, lambda b: tb.flowrl_loss(b.token_logp, b.token_logp_ref, b.token_logp_old, b.mask, b.rewards, b.log_z, group_size=G, is_weight=b.is_weight)),
        (
            {"tilt_beta": 2.0, "logprob_scale": "sum", "group_normalize": False, "weight_clip": "eps", "weight_eps": 0.1, "group_size": G},
            lambda b: tb.flowrl_loss(b.token_logp, b.token_logp_ref, b.token_logp_old, b.mask, b.rewards, b.log_z, group_size=G, beta=2.0, length_normalize=False, group_normalize=False, weight_clip="eps", eps=0.1, is_weight=b.is_weight),
        ),
    ],
    "disa": [
        ({"tilt_beta": 2.0}, lambda b: tb.disa_loss(_seq(b), _seq(b, "token_logp_ref"), b.rewards, b.log_z, beta=2.0, is_weight=b.is_weight)),
        (
            {"tilt_beta": 3.0, "logprob_scale": "mean", "weight_clip": "max", "max_weight": 1.2},
            lambda b: tb.disa_loss(_seq(b, scale="mean"), _seq(b, "token_logp_ref", "mean"), b.rewards, b.log_z, beta=3.0, is_weight=_tb_w(b, "max", 1.2)),
        ),
        ({"tilt_beta": 2.0, "anchor": "old"}, lambda b: tb.disa_loss(_seq(b), _seq(b, "token_logp_old"), b.rewards, b.log_z, beta=2.0, is_weight=b.is_weight)),
    ],
    "tb": [
        ({"tilt_beta": 2.0}, lambda b: tb.tb_loss(tb.tb_residual(_seq(b), _seq(b, "token_logp_ref"), b.rewards, b.log_z, beta=2.0), is_weight=b.is_weight)),
        (
            {"tilt_beta": 0.5, "anchor": "old", "weight_clip": "eps", "weight_eps": 0.1, "weight_eps_high": 0.3},
            lambda b: tb.tb_loss(tb.tb_residual(_seq(b), _seq(b, "token_logp_old"), b.rewards, b.log_z, beta=0.5), is_weight=_tb_w(b, "eps", eps=0.1, eps_high=0.3)),
        ),
    ],
    "paced": [
        ({"kl_coef": 0.5}, lambda b: tb.tb_loss(tb.tb_residual(_seq(b), _seq(b, "token_logp_old"), b.rewards, b.log_z, beta=1.0 / 0.5), is_weight=b.is_weight)),
        (
            {"kl_coef": 4.0, "logprob_scale": "mean", "weight_clip": "ratio"},
            lambda b: tb.tb_loss(tb.tb_residual(_seq(b, scale="mean"), _seq(b, "token_logp_old", "mean"), b.rewards, b.log_z, beta=0.25), is_weight=_tb_w(b, "ratio")),
        ),
    ],
    "vargrad": [
        ({"tilt_beta": 2.0}, lambda b: tb.tb_loss(tb.tb_residual(_seq(b), _seq(b, "token_logp_ref"), b.rewards, b.log_z.detach(), beta=2.0), is_weight=b.is_weight)),
        ({"tilt_beta": 3.0, "group_size": G}, lambda b: _vargrad_direct(b, 3.0, G)),  # batch.log_z removed below
    ],
    "offrl": [
        ({}, lambda b: offline.offrl_loss(_seq(b), b.mask.sum(1), b.rewards, logp_ref=_seq(b, "token_logp_ref"))),
        ({"kl_tau": 0.5}, lambda b: offline.offrl_loss(_seq(b), b.mask.sum(1), b.rewards, logp_ref=_seq(b, "token_logp_ref"), kl_tau=0.5)),
    ],
    "fpa": [({}, lambda b: offline.fpa_loss(_seq(b), _seq(b, "token_logp_future"), b.mask.sum(1), b.rewards))],
    "dpo": [
        ({}, lambda b: offline.dpo_loss(_seq(b), _seq(b.rejected), _seq(b, "token_logp_ref"), _seq(b.rejected, "token_logp_ref"))),
        ({"beta": 0.7}, lambda b: offline.dpo_loss(_seq(b), _seq(b.rejected), _seq(b, "token_logp_ref"), _seq(b.rejected, "token_logp_ref"), beta=0.7)),
    ],
    "rpo": [
        ({}, lambda b: offline.rpo_loss(_seq(b), _seq(b.rejected), _seq(b, "token_logp_ref"), _seq(b.rejected, "token_logp_ref"), b.mask.sum(1))),
        ({"beta": 0.7, "alpha": 0.3}, lambda b: offline.rpo_loss(_seq(b), _seq(b.rejected), _seq(b, "token_logp_ref"), _seq(b.rejected, "token_logp_ref"), b.mask.sum(1), beta=0.7, alpha=0.3)),
    ],
    "simper": [({}, lambda b: offline.simper_loss(_seq(b), _seq(b.rejected), b.mask.sum(1), b.rejected.mask.sum(1)))],
    "kto": [
        ({}, lambda b: offline.kto_loss(_seq(b), _seq(b, "token_logp_ref"), b.rewards > 0)),
        ({"beta": 0.4, "lambda_w": 1.5, "lambda_l": 0.6}, lambda b: offline.kto_loss(_seq(b), _seq(b, "token_logp_ref"), b.rewards > 0, beta=0.4, lambda_w=1.5, lambda_l=0.6)),
    ],
    "apo": [
        ({}, lambda b: offline.apo_loss(_seq(b), _seq(b, "token_logp_ref"), b.rewards, b.values)),
        ({"beta2": 0.3}, lambda b: offline.apo_loss(_seq(b), _seq(b, "token_logp_ref"), b.rewards, b.values, beta2=0.3)),
    ],
    "sft": [({}, lambda b: offline.sft_loss(b.token_logp, b.mask))],
}  # fmt: skip


def _value_grad(out: LossOutput, b: ObjectiveBatch):
    xs = [x for x in (b.token_logp, b.log_z, b.rejected.token_logp) if x is not None]
    grads = torch.autograd.grad(out.loss, xs, allow_unused=True)
    return out.loss.detach(), [torch.zeros_like(x) if gr is None else gr for x, gr in zip(xs, grads)]


def test_every_entry_has_cases_and_an_opinfo_entry():
    assert set(CASES) == set(OBJECTIVES)
    for name, obj in OBJECTIVES.items():
        assert obj.name == name
        assert any(op.split("[")[0] == obj.loss for op in BY_NAME), f"{name}: {obj.loss} has no OpInfo entry"
        assert len(CASES[name]) >= 2 or name in ("fpa", "sft", "simper"), f"{name}: no option away from the defaults"


@pytest.mark.parametrize(
    ("name", "i"), [(n, i) for n, cases in CASES.items() for i in range(len(cases))], ids=lambda x: str(x)
)
def test_adapter_equals_direct_call(name, i):
    options, direct = CASES[name][i]
    b = _batch()
    if name == "vargrad" and "group_size" in options:  # the adapter computes the batch-optimal log Z
        b = dataclasses.replace(b, log_z=None)
    got = get_objective(name)(b, **options)
    want = direct(b)
    assert isinstance(got, LossOutput)
    v_got, g_got = _value_grad(got, b)
    v_want, g_want = _value_grad(want, b)
    torch.testing.assert_close(v_got, v_want, rtol=0, atol=0)
    for x, y in zip(g_got, g_want):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
    for k, v in want.metrics.items():  # the loss's own metrics are passed on unchanged
        torch.testing.assert_close(torch.as_tensor(got.metrics[k]), torch.as_tensor(v), rtol=0, atol=0)
    assert g_got[0].abs().sum() > 0  # the gradient reached the policy
    if i > 0:  # the options are live: another value than at the first case's options
        assert not math.isclose(
            float(v_got), float(get_objective(name)(_batch(), **CASES[name][0][0]).loss), rel_tol=1e-9
        )


def test_tb_metrics():
    b = _batch()
    out = get_objective("disa")(b, tilt_beta=2.0, weight_clip="max", max_weight=1.2)
    with torch.no_grad():
        res = tb.tb_residual(_seq(b), _seq(b, "token_logp_ref"), b.rewards, b.log_z, beta=2.0)
        w_tb = tb.tb_importance_weight(b.token_logp, b.token_logp_old, b.mask, weight_clip="max", max_weight=1.2)
    torch.testing.assert_close(out.metrics["residual_abs_mean"], res.abs().mean(), rtol=0, atol=0)
    torch.testing.assert_close(out.metrics["weight_mean"], (w_tb * b.is_weight).mean(), rtol=0, atol=0)
    assert float(out.metrics["weight_clip_frac"]) == pytest.approx(float((w_tb >= 1.2).double().mean()))


def test_missing_fields_and_unknown_names_are_refused():
    b = _batch()
    with pytest.raises(ValueError, match="advantages"):
        get_objective("grpo")(dataclasses.replace(b, advantages=None))
    with pytest.raises(ValueError, match="rejected"):
        get_objective("dpo")(dataclasses.replace(b, rejected=None))
    with pytest.raises(ValueError, match="group_size"):
        get_objective("vargrad")(dataclasses.replace(b, log_z=None), tilt_beta=1.0)
    with pytest.raises(ValueError, match="unknown objective"):
        get_objective("ppo2")
    with pytest.raises(TypeError, match="unknown"):
        get_objective("disa")(b, tilt_beta=1.0, betta=2.0)
    with pytest.raises(ValueError, match="anchor"):
        get_objective("tb")(b, tilt_beta=1.0, anchor="pi")


_RENAMES = [
    ("beta", "tilt_beta"),
    ("length_normalize", "logprob_scale"),
    ("eps", "weight_eps"),
    ("eps_high", "weight_eps_high"),
]


@pytest.mark.parametrize(
    ("name", "old", "new"),
    [
        (name, old, new)
        for name in ("disa", "tb", "vargrad", "paced", "flowrl")
        for old, new in _RENAMES
        if not (name == "paced" and old == "beta")  # paced's tilt is kl_coef; it never took beta
    ],
)
def test_the_tb_familys_old_option_names_are_refused_naming_the_new(name, old, new):
    """One name per knob: each old spelling of a TB option is a one-line TypeError naming its new name (not
    silently ignored, not an "unknown options" list without the new name)."""
    b = _batch()
    opts = {"kl_coef": 1.0} if name == "paced" else ({} if old == "beta" else {"tilt_beta": 1.0})
    opts["group_size"] = G if name in ("vargrad", "flowrl") else opts.get("group_size")
    opts = {k: v for k, v in opts.items() if v is not None}
    with pytest.raises(TypeError, match=f"'{old}' is now '?{new}") as e:
        get_objective(name)(b, **opts, **{old: 1.0})
    assert "\n" not in str(e.value)


def test_the_weight_clip_takes_one_vocabulary():
    """``weight_clip`` is one of one | max | eps | ratio in the registry (the simulator's and the trainers'
    words); ``"none"`` (the old word for ``ratio``) is refused naming ``ratio``; ``one`` is no rollout weight."""
    b = _batch()
    with pytest.raises(ValueError, match="weight_clip must be one of"):
        get_objective("disa")(b, tilt_beta=1.0, weight_clip="none")
    with pytest.raises(ValueError, match="'ratio'"):
        tb.tb_importance_weight(b.token_logp, b.token_logp_old, b.mask, weight_clip="none")
    one = get_objective("disa")(b, tilt_beta=1.0, weight_clip="one")
    default = get_objective("disa")(b, tilt_beta=1.0)
    torch.testing.assert_close(one.loss, default.loss, rtol=0, atol=0)
    ratio = get_objective("disa")(b, tilt_beta=1.0, weight_clip="ratio")
    assert not torch.allclose(ratio.loss, one.loss)


def test_a_loss_returning_something_else_is_refused(monkeypatch):
    monkeypatch.setattr(pg, "grpo_loss", lambda *a, **k: (torch.zeros(()), {}))
    with pytest.raises(TypeError, match="not LossOutput"):
        get_objective("grpo")(_batch())


# ----------------------------------------------------------------------------------- dispatchers
def _record(monkeypatch) -> list[str]:
    calls: list[str] = []
    for name, obj in list(OBJECTIVES.items()):

        def adapter(batch, opts, _a=obj.adapter, _n=name):
            calls.append(_n)
            return _a(batch, opts)

        monkeypatch.setitem(registry.OBJECTIVES, name, dataclasses.replace(obj, adapter=adapter))
    return calls


SIM_CASES = [
    (dict(method="tb", log_z="frozen"), "disa"),
    (dict(method="tb", log_z="exact"), "disa"),
    (dict(method="tb", log_z="vargrad"), "vargrad"),
    (dict(method="tb", log_z="learned", anchor="old"), "tb"),
    (dict(method="flowrl"), "flowrl"),
    (dict(method="lad"), "lad"),
    (dict(method="grpo", advantage="group"), "grpo"),
    (dict(method="gspo", advantage="group"), "gspo"),
    (dict(method="cispo", advantage="group"), "cispo"),
    (dict(method="sapo", advantage="group"), "sapo"),
    (dict(method="offrl"), "offrl"),
    (dict(method="fpa"), "fpa"),
    (dict(method="dpo"), "dpo"),
    (dict(method="sft"), "sft"),
]
OFFLINE = ("offrl", "fpa", "dpo", "rpo", "kto", "simper", "apo", "sft")
TRL = ("grpo", "gspo", "cispo", "sapo", "luspo", "vespo", "flowrl", "disa", "vargrad", "lad", "paced")
VERL_POLICY = {"tiltlab_grpo": "grpo", "tiltlab_gspo": "gspo", "tiltlab_cispo": "cispo", "tiltlab_sapo": "sapo", "tiltlab_lad_kl": "lad", "tiltlab_lad_kl_seq": "lad"}  # fmt: skip


# the union of the entries the dispatchers reach, asked of the dispatchers: tests/objectives/test_dispatchers.py


@pytest.mark.parametrize(("overrides", "name"), SIM_CASES, ids=[n + str(i) for i, (_, n) in enumerate(SIM_CASES)])
def test_sim_trainer_dispatches_through_the_registry(monkeypatch, overrides, name):
    from tiltlab.sim.api import make_env
    from tiltlab.sim.config import SimConfig
    from tiltlab.sim.train import train

    calls = _record(monkeypatch)
    cfg = SimConfig(env="multiprompt", P=3, K=5, steps=1, G=3, seeds=1, log_every=1, **overrides)
    train(cfg, make_env(cfg))
    assert calls and set(calls) == {name}


def test_trl_trainer_dispatches_through_the_registry(monkeypatch, tmp_path):
    pytest.importorskip("trl")
    from types import SimpleNamespace

    from tiltlab.llm.train import online

    assert set(online.LOSSES) == set(TRL) and names("online") == TRL
    b = _batch()
    mask = b.mask
    inputs = {"advantages": b.advantages, "tb_reward": b.rewards, "rewards": b.rewards, "log_z": b.log_z.detach()}
    lb = online.LossBatch(b.token_logp, b.token_logp_old, b.token_logp_ref, mask, None, None, inputs, None, None)
    for name in TRL:
        args = online.TiltGRPOConfig(
            output_dir=str(tmp_path), objective=name, report_to="none", use_cpu=True, per_device_train_batch_size=2,
            num_generations=2, max_completion_length=T, tilt_beta=2.0, epsilon_high=1.3 if name == "cispo" else 0.28,
            **({"disa_stage1_manifest": {"beta": 2.0, "reward_transform": "identity", "logprob_scale": "sum"}} if name == "disa" else {}),
        )  # fmt: skip
        trainer = SimpleNamespace(
            args=args, kl_coef=0.1, _dapo_num_tokens=lambda inputs, mode: mask.sum(),
            _learned_log_z=lambda model, batch: b.log_z, _paced_log_z=lambda model, batch: b.log_z,
        )  # fmt: skip
        calls = _record(monkeypatch)
        out = online.LOSSES[name](trainer, None, lb)
        assert isinstance(out, LossOutput) and torch.isfinite(out.loss)
        assert calls == [name], (name, calls)


def test_offline_trainer_dispatches_through_the_registry(monkeypatch, tmp_path):
    """``OfflineTrainer.compute_loss`` reaches each of its objectives through the registry (its
    scoring, which needs a model, replaced by the batch's log-probs)."""
    pytest.importorskip("transformers")
    from collections import defaultdict
    from types import SimpleNamespace

    from tiltlab.llm.train import offline as offline_trainer

    assert names("offline") == OFFLINE and set(OFFLINE) <= set(OBJECTIVES)
    b = _batch()
    sel = b.mask[:, 1:] > 0

    def score(model, inputs, suffix="", grad=True, future=None):
        x = b if suffix == "" else b.rejected
        if future is not None:  # FPA: the future log-probs of the scored tokens
            future["logp"] = b.token_logp_future[:, 1:][sel]
        return _seq(x), x.mask.sum(1), x.token_logp, None, sel

    def ref_score(inputs, suffix=""):
        x = b if suffix == "" else b.rejected
        return _seq(x, "token_logp_ref"), x.token_logp_ref

    inputs = {
        "reward": (b.rewards > 0).to(F64),
        "v_hat": b.values,
        "target_mask": b.mask,
        "target_mask_l": b.rejected.mask,
    }
    for name in OFFLINE:
        args = offline_trainer.OfflineConfig(
            output_dir=str(tmp_path), objective=name, report_to="none", use_cpu=True, offrl_kl_tau=0.5
        )
        fake = SimpleNamespace(args=args, _seq=score, _ref_seq=ref_score, _dyn=defaultdict(list))
        fake.options = lambda f=fake: offline_trainer.OfflineTrainer.options(f)
        calls = _record(monkeypatch)
        loss = offline_trainer.OfflineTrainer.compute_loss(fake, None, inputs)
        assert torch.isfinite(loss) and loss.requires_grad
        assert calls == [name], (name, calls)


def test_verl_plugin_dispatches_through_the_registry(monkeypatch):
    pytest.importorskip("verl")
    from tiltlab.llm import verl as plugin

    assert plugin.tb_objectives() == ("flowrl", "disa", "paced")  # tb_loss_fn calls get_objective(settings.objective)
    from verl.workers.config import ActorConfig

    cfg = ActorConfig(strategy="fsdp", rollout_n=G, ppo_micro_batch_size_per_gpu=1, clip_ratio=0.2)
    b = _batch()
    mask = b.mask > 0
    for loss_name, name in VERL_POLICY.items():
        calls = _record(monkeypatch)
        loss, _ = plugin.POLICY_LOSSES[loss_name](
            old_log_prob=b.token_logp_old, log_prob=b.token_logp, advantages=b.advantages[:, None] * mask,
            response_mask=mask, loss_agg_mode="token-mean", config=cfg, rollout_is_weights=None,
        )  # fmt: skip
        assert torch.isfinite(loss)
        assert calls == [name], (loss_name, calls)


@pytest.mark.parametrize("method", ["grpo", "cispo", "sapo"])
def test_sim_options_reach_the_adapter(method):
    """The simulator's KL coefficient reaches the adapter: off-policy (pi_old != pi_theta) the exact
    gradient moves with it."""
    from tiltlab.sim.api import make_env
    from tiltlab.sim.config import SimConfig
    from tiltlab.sim.train import gradient_at

    grads = {}
    for kl in (0.0, 0.5):
        cfg = SimConfig(
            env="multiprompt", P=3, K=5, G=3, seeds=1, method=method, advantage="raw", exact=True, kl_coef=kl
        )
        env = make_env(cfg)
        logits = env.logp_ref[None] + 0.3 * torch.randn(
            1, env.P, env.K, generator=torch.Generator().manual_seed(1), dtype=F64
        )
        grads[kl] = gradient_at(cfg, env, logits, logp_old=env.logp_ref[None])
    assert (grads[0.5] - grads[0.0]).abs().max() > 1e-6


# ------------------------------------------------------------------------------ given lengths
# |y| given apart from the mask (a trainer that counts its tokens another way): none equals its
# row's mask sum ([T, 1, 3, 2, T, 3]), so an adapter that reads the mask sums gives another number
LENGTHS = torch.tensor([7.0, 2.0, 5.0, 9.0, 3.0, 6.0], dtype=F64)
LENGTHS_L = torch.tensor([2.0, 8.0, 4.0, 5.0, 6.0, 7.0], dtype=F64)  # the losers (mask flipped: [3, 4, 2, 3, 1, 4])


def _loop_seq(b: ObjectiveBatch, name: str = "token_logp") -> list[float]:
    x = getattr(b, name).detach()
    return [sum(float(x[i, t]) * float(b.mask[i, t]) for t in range(T)) for i in range(B)]


def _with_lengths() -> ObjectiveBatch:
    b = _batch()
    return dataclasses.replace(b, lengths=LENGTHS, rejected=dataclasses.replace(b.rejected, lengths=LENGTHS_L))


def _loop_offrl(b, lens):
    lp, r = _loop_seq(b), b.rewards.tolist()
    return -sum(r[i] * math.exp(lp[i] / lens[i]) for i in range(B)) / B


def _loop_fpa(b, lens):
    lp, lf, r = _loop_seq(b), _loop_seq(b, "token_logp_future"), b.rewards.tolist()
    return -sum(r[i] * math.exp(lf[i] / lens[i]) * lp[i] / lens[i] for i in range(B)) / B


def _loop_rpo(b, lens):
    w, lo = _loop_seq(b), _loop_seq(b.rejected)
    rw, rl = _loop_seq(b, "token_logp_ref"), _loop_seq(b.rejected, "token_logp_ref")
    dpo = -sum(math.log(1 / (1 + math.exp(-0.7 * ((w[i] - rw[i]) - (lo[i] - rl[i]))))) for i in range(B)) / B
    return dpo - 0.3 * sum(w[i] / lens[i] for i in range(B)) / B


def _loop_simper(b, lens, lens_l):
    w, lo = _loop_seq(b), _loop_seq(b.rejected)
    return -sum(math.exp(w[i] / lens[i]) - math.exp(lo[i] / lens_l[i]) for i in range(B)) / B


@pytest.mark.parametrize(
    ("name", "options", "loop"),
    [
        ("offrl", {}, lambda b, n, nl: _loop_offrl(b, n)),
        ("fpa", {}, lambda b, n, nl: _loop_fpa(b, n)),
        ("rpo", {"beta": 0.7, "alpha": 0.3}, lambda b, n, nl: _loop_rpo(b, n)),
        ("simper", {}, _loop_simper),
    ],
    ids=["offrl", "fpa", "rpo", "simper"],
)
def test_the_batch_lengths_given_are_the_ones_used_not_the_mask_sums(name, options, loop):
    """Every length-normalised objective on a batch whose ``lengths`` (and the losers') differ from
    its mask's row sums: the loss of a loop over rows at the GIVEN lengths; without ``lengths``, the
    loop at the mask sums counted by hand -- two different numbers."""
    b = _with_lengths()
    mask_sums = [sum(float(v) for v in b.mask[i]) for i in range(B)]
    mask_sums_l = [sum(float(v) for v in b.rejected.mask[i]) for i in range(B)]
    assert all(a != m for a, m in zip(LENGTHS.tolist(), mask_sums))
    assert all(a != m for a, m in zip(LENGTHS_L.tolist(), mask_sums_l))
    assert torch.equal(b.seq_lengths(), LENGTHS) and torch.equal(b.rejected.seq_lengths(), LENGTHS_L)
    got = float(get_objective(name)(b, **options).loss)
    want = loop(b, LENGTHS.tolist(), LENGTHS_L.tolist())
    assert got == pytest.approx(want, rel=1e-12, abs=1e-12)
    plain = dataclasses.replace(b, lengths=None, rejected=dataclasses.replace(b.rejected, lengths=None))
    assert plain.seq_lengths().tolist() == mask_sums
    got_plain = float(get_objective(name)(plain, **options).loss)
    assert got_plain == pytest.approx(loop(plain, mask_sums, mask_sums_l), rel=1e-12, abs=1e-12)
    assert not math.isclose(got, got_plain, rel_tol=1e-6)  # the lengths are live


def _far_weights() -> ObjectiveBatch:
    """A batch whose rollout weights lie far on both sides of every clip: log w per row from -6 to +6."""
    b = _batch(3)
    shift = torch.linspace(-6.0, 6.0, B, dtype=F64)[:, None] / b.mask.sum(1, keepdim=True)
    return dataclasses.replace(b, token_logp_old=(b.token_logp.detach() - shift) * b.mask)


@pytest.mark.parametrize("name", ["tb", "disa"])
@pytest.mark.parametrize("clip", ["max", "eps"])
def test_a_weight_clip_without_its_bound_takes_the_weight_functions_own_default(name, clip):
    """The adapter's defaults for ``max_weight`` / ``eps`` are :func:`tb.tb_importance_weight`'s own (read
    from its signature, not restated here), on weights beyond both clips (so a changed default shows)."""
    import inspect

    b = _far_weights()
    w_raw = torch.exp(_seq(b) - _seq(b, "token_logp_old")).detach()
    assert float(w_raw.max()) > 300 and float(w_raw.min()) < 1 / 300  # beyond any default bound
    w = tb.tb_importance_weight(b.token_logp, b.token_logp_old, b.mask, weight_clip=clip) * b.is_weight
    out = get_objective(name)(b, tilt_beta=2.0, weight_clip=clip)
    lp, ref = _seq(b), _seq(b, "token_logp_ref")
    lz = b.log_z if name == "tb" else b.log_z.detach()
    want = tb.tb_loss(tb.tb_residual(lp, ref, b.rewards, lz, beta=2.0), is_weight=w)
    torch.testing.assert_close(out.loss, want.loss, rtol=1e-12, atol=1e-12)
    sig = inspect.signature(tb.tb_importance_weight).parameters
    bound, option = {"max": ("max_weight", "max_weight"), "eps": ("eps", "weight_eps")}[clip]
    other = get_objective(name)(b, tilt_beta=2.0, weight_clip=clip, **{option: 2 * sig[bound].default})
    assert not torch.allclose(other.loss, out.loss)  # the bound matters on this batch


def test_vargrad_estimates_log_z_with_its_own_scale_and_anchor_options():
    """VarGrad without ``batch.log_z``: the per-prompt log Z estimate uses the run's ``logprob_scale`` and
    ``anchor`` (away from their defaults), compared with a loop over prompts; other options (the
    weight clip) do not enter the estimate."""
    b = dataclasses.replace(_far_weights(), log_z=None)
    opts = {"tilt_beta": 1.5, "group_size": G, "logprob_scale": "mean", "anchor": "old", "weight_clip": "max"}
    out = get_objective("vargrad")(b, **opts)
    lp, an = _seq(b, scale="mean"), _seq(b, "token_logp_old", "mean")
    lz = torch.empty(B, dtype=F64)
    for p in range(P):  # the batch-optimal log Z of each prompt's group, laid over its own completions
        rows = slice(p * G, (p + 1) * G)
        lz[rows] = (1.5 * b.rewards[rows] - lp[rows] + an[rows]).mean().detach()
    w = tb.tb_importance_weight(b.token_logp, b.token_logp_old, b.mask, weight_clip="max") * b.is_weight
    want = tb.tb_loss(tb.tb_residual(lp, an, b.rewards, lz, beta=1.5), is_weight=w)
    torch.testing.assert_close(out.loss, want.loss, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("obj", ["registry_objective", "registry_batch"])
def test_the_registrys_records_cannot_be_edited_after_the_fact(obj):
    item = get_objective("tb") if obj == "registry_objective" else _batch()
    field = dataclasses.fields(item)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(item, field, None)
