"""Every dispatcher of the objective registry, asked which entry it runs.

The four dispatchers -- the simulator's trainer (``sim/train.py``), the TRL trainer
(``llm/train/online/``), the offline trainer (``llm/train/offline.py``) and the veRL plug-in
(``llm/verl/``) -- are asked two things, neither read from a list written here:

* which objective names they accept: every registry name (and one that no registry holds) is offered
  to the dispatcher's own config (``SimConfig.validate``, ``TiltGRPOConfig``, ``OfflineConfig``,
  veRL's ``TBSettings``), which refuses a name it does not run with its one-line "... must be one of"
  error; the veRL policy losses are the names the plug-in registered in veRL (``POLICY_LOSSES``);
* which registry entry each accepted name reaches: the dispatcher's own dispatch path runs once per
  name on tiny tensors (``train`` for one step, ``TiltGRPOTrainer._compute_loss``,
  ``OfflineTrainer.compute_loss``, ``tb_loss_fn`` and each registered policy loss) with every entry's
  adapter of :data:`~tiltlab.objectives.registry.OBJECTIVES` wrapped to record its name.

Each accepted name must reach the entry of that name, alone, except where the dispatcher documents
another mapping (:data:`SIM_TB_ENTRY`, the veRL policy losses' suffixes); and the union of the
entries reached must be the whole registry, less the entries no dispatcher is meant to run
(:data:`UNREACHED`: none).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from tiltlab.objectives import registry
from tiltlab.objectives.output import LossOutput
from tiltlab.objectives.registry import OBJECTIVES

F64 = torch.float64
P, G, T = 3, 2, 4
B = P * G
NOT_AN_OBJECTIVE = "no_such_objective"
#: every name a dispatcher is offered: the registry's, and one that must be refused by all
CANDIDATES = (*OBJECTIVES, NOT_AN_OBJECTIVE)

SIM_TB_ENTRY = {"frozen": "disa", "exact": "disa", "zero": "disa", "vargrad": "vargrad", "learned": "tb"}
"""The simulator's ``method="tb"`` with ``cfg.log_z``: the entry ``sim.train.tb_objective_name``
documents (a fixed label is DISA's loss, ``vargrad`` VarGrad's, ``learned`` TB with log Z attached)."""
UNREACHED: frozenset[str] = frozenset()
"""Registry entries that no dispatcher runs (none: an entry no trainer can reach is dead code)."""


@contextlib.contextmanager
def _recording():
    """Every registry entry's adapter wrapped to append its entry's name to the yielded list."""
    calls: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        for name, obj in list(OBJECTIVES.items()):

            def adapter(batch, opts, _a=obj.adapter, _n=name):
                calls.append(_n)
                return _a(batch, opts)

            mp.setitem(registry.OBJECTIVES, name, dataclasses.replace(obj, adapter=adapter))
        yield calls


def _accepted(make, field: str) -> list[str]:
    """The candidates ``make(name)`` accepts: a name is refused by a ValueError that starts with
    ``"<field> must be one of"`` (the configs' error for a name they do not run); any other error of
    ``make`` is a failure of the test, not a refusal."""
    names = []
    for name in CANDIDATES:
        try:
            make(name)
        except ValueError as e:
            if not str(e).startswith(f"{field} must be one of"):
                raise
            continue
        names.append(name)
    assert NOT_AN_OBJECTIVE not in names, f"{make} accepts {NOT_AN_OBJECTIVE!r}: the probe cannot tell"
    return names


def _tensors(seed: int = 0) -> SimpleNamespace:
    """Tiny ``[B, T]`` log-probs (ragged lengths) and ``[B]`` sequence quantities, all distinct."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([T, 1, 3, 2, T, 3])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(F64)

    def lp():
        return -torch.rand(B, T, generator=g, dtype=F64) * 2 - 0.05

    return SimpleNamespace(
        mask=mask, logp=lp(), old=lp(), ref=lp(), future=lp(), logp_l=lp(), ref_l=lp(),
        advantages=torch.randn(B, generator=g, dtype=F64), rewards=torch.rand(B, generator=g, dtype=F64),
        log_z=torch.randn(B, generator=g, dtype=F64), values=torch.rand(B, generator=g, dtype=F64),
    )  # fmt: skip


# --------------------------------------------------------------------------- the four dispatchers
@pytest.fixture(scope="module")
def sim_dispatch() -> dict[str, tuple[str, list[str]]]:
    """``label -> (the entry its name names, the entries one training step called)`` for every method
    ``SimConfig`` accepts (``tb``: once per ``log_z`` mode)."""
    from tiltlab.sim.api import make_env
    from tiltlab.sim.config import LOG_Z_MODES, SimConfig
    from tiltlab.sim.train import train

    base = dict(env="multiprompt", P=3, K=5, steps=1, G=3, seeds=1, log_every=1)
    out = {}
    for method in _accepted(lambda m: SimConfig(**base, method=m).validate(), "method"):
        runs = [(method, {})]
        if method == "tb":
            runs = [(SIM_TB_ENTRY[z], {"log_z": z, "anchor": "old" if z == "learned" else "ref"}) for z in LOG_Z_MODES]
        for want, extra in runs:
            cfg = SimConfig(**base, method=method, **extra)
            with _recording() as calls:
                train(cfg, make_env(cfg))
            out[method + (f"[log_z={extra['log_z']}]" if extra else "")] = (want, calls)
    return out


@pytest.fixture(scope="module")
def trl_dispatch(tmp_path_factory) -> dict[str, tuple[str, list[str]]]:
    """``objective -> (objective, the entries TiltGRPOTrainer._compute_loss called)`` for every objective
    ``TiltGRPOConfig`` accepts; the trainer is a stand-in holding what the loss path reads (the
    log-probs of a model replaced by the tiny batch's)."""
    pytest.importorskip("trl")
    from tiltlab.llm.train.online import TiltGRPOConfig, TiltGRPOTrainer

    folder = str(tmp_path_factory.mktemp("trl_dispatch"))
    manifest = {"beta": 2.0, "reward_transform": "identity", "logprob_scale": "sum"}

    def config(name):
        return TiltGRPOConfig(
            output_dir=folder, objective=name, report_to="none", use_cpu=True, per_device_train_batch_size=2,
            num_generations=2, max_completion_length=T, tilt_beta=2.0, epsilon_high=1.3 if name == "cispo" else 0.28,
            **({"disa_stage1_manifest": manifest} if name == "disa" else {}),
        )  # fmt: skip

    x = _tensors()
    prompt = torch.ones(B, 2, dtype=torch.long)
    inputs = {
        "prompt_ids": prompt, "prompt_mask": prompt, "completion_ids": torch.ones(B, T, dtype=torch.long),
        "completion_mask": x.mask, "old_per_token_logps": x.old, "ref_per_token_logps": x.ref,
        "advantages": x.advantages, "tb_reward": x.rewards, "rewards": x.rewards, "log_z": x.log_z,
    }  # fmt: skip

    def logps(model, input_ids, attention_mask, logits_to_keep, compute_entropy=False):
        return x.logp.clone().requires_grad_(True), torch.zeros(B, T, dtype=F64), None

    out = {}
    for name in _accepted(config, "objective"):
        trainer = SimpleNamespace(
            args=config(name), model=SimpleNamespace(training=True), kl_coef=0.1, current_gradient_accumulation_steps=1,
            vllm_importance_sampling_clip_max=2.0, _get_per_token_logps_and_entropies=logps,
            _log=lambda mode, key, value: None, _dapo_num_tokens=lambda inputs, mode: x.mask.sum(),
            accelerator=SimpleNamespace(gather=lambda t: t), _metrics={"train": defaultdict(list)},
            _learned_log_z=lambda model, batch: x.log_z.clone().requires_grad_(True),
            _paced_log_z=lambda model, batch: x.log_z.clone().requires_grad_(True),
        )  # fmt: skip
        with _recording() as calls:
            loss = TiltGRPOTrainer._compute_loss(trainer, None, inputs)
        assert torch.isfinite(loss) and loss.requires_grad, name
        out[name] = (name, calls)
    return out


@pytest.fixture(scope="module")
def offline_dispatch(tmp_path_factory) -> dict[str, tuple[str, list[str]]]:
    """``objective -> (objective, the entries OfflineTrainer.compute_loss called)`` for every objective
    ``OfflineConfig`` accepts (its scoring, which needs a model, replaced by the tiny batch's log-probs)."""
    pytest.importorskip("transformers")
    from tiltlab.llm.train import offline as offline_trainer

    folder = str(tmp_path_factory.mktemp("offline_dispatch"))

    def config(name):
        return offline_trainer.OfflineConfig(
            output_dir=folder, objective=name, report_to="none", use_cpu=True, offrl_kl_tau=0.5
        )

    x = _tensors(1)
    sel = x.mask[:, 1:] > 0

    def seq(logp, mask):
        return (logp * mask).sum(1)

    def score(model, inputs, suffix="", grad=True, future=None):
        logp = (x.logp if suffix == "" else x.logp_l).clone().requires_grad_(grad)
        if future is not None:  # FPA: the future log-probs of the scored tokens
            future["logp"] = x.future[:, 1:][sel]
        return seq(logp, x.mask), x.mask.sum(1), logp, None, sel

    def ref_score(inputs, suffix=""):
        ref = x.ref if suffix == "" else x.ref_l
        return seq(ref, x.mask), ref

    inputs = {"reward": (x.rewards > 0.5).to(F64), "v_hat": x.values, "target_mask": x.mask, "target_mask_l": x.mask}
    out = {}
    for name in _accepted(config, "objective"):
        fake = SimpleNamespace(args=config(name), _seq=score, _ref_seq=ref_score, _dyn=defaultdict(list))
        fake.options = lambda f=fake: offline_trainer.OfflineTrainer.options(f)
        with _recording() as calls:
            loss = offline_trainer.OfflineTrainer.compute_loss(fake, None, inputs)
        assert torch.isfinite(loss) and loss.requires_grad, name
        out[name] = (name, calls)
    return out


def _policy_entry(loss_name: str) -> str:
    """The entry a veRL policy loss names (the plug-in's docstring): ``tiltlab_<entry>``, or
    ``tiltlab_<entry>_<variant>`` (``tiltlab_grpo_<agg>``, ``tiltlab_lad_<divergence>[_seq]``)."""
    assert loss_name.startswith("tiltlab_"), loss_name
    rest = loss_name.removeprefix("tiltlab_")
    return rest if rest in OBJECTIVES else rest.split("_", 1)[0]


@pytest.fixture(scope="module")
def verl_dispatch() -> dict[str, tuple[str, list[str]]]:
    """``name -> (its entry, the entries called)`` for every policy loss the plug-in registered in veRL
    and every TB objective ``TBSettings`` accepts (``tb_loss_fn``, veRL's unpadding of the model's
    log-probs stood in for: the tiny batch is already padded)."""
    pytest.importorskip("verl")
    from tensordict import TensorDict
    from verl.workers.config import ActorConfig
    from verl.workers.utils import padding

    from tiltlab.llm import verl as plugin

    x = _tensors(2)
    mask = x.mask > 0
    out = {}
    cfg = ActorConfig(strategy="fsdp", rollout_n=G, ppo_micro_batch_size_per_gpu=1, clip_ratio=0.2)
    cfg.global_batch_info["loss_scale_factor"] = T  # what veRL's actor sets (seq-mean-token-sum-norm needs it)
    for loss_name, fn in sorted(plugin.POLICY_LOSSES.items()):
        with _recording() as calls:
            loss, _ = fn(
                old_log_prob=x.old, log_prob=x.logp.clone().requires_grad_(True),
                advantages=x.advantages[:, None] * mask, response_mask=mask, loss_agg_mode="token-mean",
                config=cfg, rollout_is_weights=None,
            )  # fmt: skip
        assert torch.isfinite(loss), loss_name
        out[loss_name] = (_policy_entry(loss_name), calls)

    data = TensorDict(
        {"response_mask": mask, "old_log_probs": x.old, "ref_log_prob": x.ref, plugin.LOG_Z_KEY: x.log_z,
         "token_level_scores": x.rewards[:, None] * (torch.arange(T) == 0)},
        batch_size=[B],
    )  # fmt: skip
    actor = {"use_kl_loss": True, "kl_loss_coef": 0.0}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(padding, "no_padding_2_padding", lambda log_probs, data: log_probs)
        for name in _accepted(lambda n: plugin.TBSettings(objective=n), "objective"):
            model_output = {"log_probs": x.logp.clone().requires_grad_(True), plugin.LOG_Z_KEY: x.log_z}
            with _recording() as calls:
                loss, _ = plugin.tb_loss_fn(actor, model_output, data, settings=plugin.TBSettings(objective=name))
            assert torch.isfinite(loss) and loss.requires_grad, name
            out[f"tb_loss_fn[{name}]"] = (name, calls)
    return out


# --------------------------------------------------------------------------------------- the tests
def _wrong(dispatch: dict[str, tuple[str, list[str]]]) -> dict[str, tuple[str, list[str]]]:
    """The accepted names whose run did not call their own entry, alone."""
    return {k: (want, calls) for k, (want, calls) in dispatch.items() if not calls or set(calls) != {want}}


def test_sim_trainer_runs_the_entry_each_method_names(sim_dispatch):
    assert "tb" in {k.split("[")[0] for k in sim_dispatch}  # the probe found the methods (tb among them)
    assert _wrong(sim_dispatch) == {}


def test_trl_trainer_runs_the_entry_each_objective_names(trl_dispatch):
    assert trl_dispatch and _wrong(trl_dispatch) == {}
    # one call per loss: the objective's entry, once (no second objective mixed into the loss)
    assert all(len(calls) == 1 for _, calls in trl_dispatch.values()), trl_dispatch


def test_offline_trainer_runs_the_entry_each_objective_names(offline_dispatch):
    assert offline_dispatch and _wrong(offline_dispatch) == {}
    assert all(len(calls) == 1 for _, calls in offline_dispatch.values()), offline_dispatch


def test_verl_plugin_runs_the_entry_each_loss_names(verl_dispatch):
    assert any(k.startswith("tb_loss_fn[") for k in verl_dispatch) and _wrong(verl_dispatch) == {}
    assert all(len(calls) == 1 for _, calls in verl_dispatch.values()), verl_dispatch


def test_every_entry_is_reached_by_a_dispatcher(sim_dispatch, trl_dispatch, offline_dispatch, verl_dispatch):
    """The union of the entries the dispatchers ran is the registry (no dead entry); each entry's
    reachers are named in the failure."""
    reached: dict[str, set[str]] = defaultdict(set)
    for who, dispatch in (
        ("sim", sim_dispatch), ("trl", trl_dispatch), ("offline", offline_dispatch), ("verl", verl_dispatch)
    ):  # fmt: skip
        for name, (_, calls) in dispatch.items():
            for entry in calls:
                reached[entry].add(f"{who}:{name}")
    assert set(reached) <= set(OBJECTIVES)
    assert set(OBJECTIVES) - set(reached) == set(UNREACHED), dict(reached)
    assert not set(UNREACHED) & set(reached), "an entry listed as unreached is reached: drop it from UNREACHED"


def test_a_dispatcher_that_bypasses_or_mixes_entries_is_caught():
    """The recorder sees what the tests above rely on: a loss computed without the registry records
    nothing, and a call of another entry records that entry (so ``_wrong`` flags both)."""
    x = _tensors()
    b = registry.ObjectiveBatch(
        x.logp.clone().requires_grad_(True), x.mask, token_logp_old=x.old, token_logp_ref=x.ref,
        advantages=x.advantages,
    )  # fmt: skip
    with _recording() as calls:
        from tiltlab.objectives import pg

        pg.grpo_loss(b.token_logp, x.old, b.advantages, x.mask)  # the loss function itself: no entry
    assert calls == []
    with _recording() as calls:
        out = registry.get_objective("gspo")(b)
    assert isinstance(out, LossOutput) and calls == ["gspo"]
    assert _wrong({"grpo": ("grpo", calls), "cispo": ("cispo", [])}) == {
        "grpo": ("grpo", ["gspo"]),
        "cispo": ("cispo", []),
    }
