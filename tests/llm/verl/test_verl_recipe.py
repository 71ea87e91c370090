"""The veRL TB recipe's loss step on CPU: veRL's data path and veRL's engine forward on a tiny model.

What runs here is veRL's own code: ``DataProto`` (with the DISA label as a dataset column in
``non_tensor_batch``) -> ``DataProto.to_tensordict`` -> ``left_right_2_no_padding`` ->
``tu.chunk_tensordict`` (micro-batches) -> ``FSDPEngineWithLMHead.forward_step`` (model inputs from
the nested batch, the forward, ``prepare_model_outputs``, then the loss function) with
:func:`tiltlab.llm.verl.tb_loss_fn` as the actor loss. Only two things are stood in for: the engine
object is built without ``initialize()`` (no FSDP wrapping, no process group) and veRL's device
lookup is pointed at the CPU (veRL has no CPU platform; it falls back to CUDA).

The reference is written independently: one unpadded forward of the same model per row, the
response tokens' log-probs gathered from the logits, and tiltlab's objective on them. The model
runs in float64 with SDPA attention, so both sides agree to ~1e-12 relative (different padding
layouts change summation order only): tolerance 1e-9, while a wrong label, reward or scale moves the
loss by >1e-2. Not eager attention: transformers' eager path takes its softmax in float32 even in a
float64 model, which limits agreement to float32 rounding that depends on the padding layout and the
CPU (seen: 2e-8 relative on one machine, under 1e-9 on another).
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tiltlab.objectives import tb

pytest.importorskip("transformers")
_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
try:
    from verl import DataProto

    import tiltlab.llm.verl as plugin
    from tiltlab.llm.verl import runner as verl_runner
except ImportError as e:  # veRL (or a package its modules import) is missing
    if _CI:
        raise ImportError(f"CI is set and veRL is not importable: {e}") from e
    pytest.skip(
        f"veRL is not importable ({e}); pip install --no-deps verl==0.9.1 tensordict==0.15.3", allow_module_level=True
    )

pytestmark = pytest.mark.peer

F64 = torch.float64
TOL = {"rtol": 1e-9, "atol": 1e-9}  # float64 model, same math, different padding layout (module docstring)
B, LP, LR, V = 8, 5, 6, 64
PROMPT_LENS = [5, 3, 4, 2, 5, 1, 3, 4]
RESP_LENS = [6, 1, 3, 4, 2, 6, 5, 3]


@pytest.fixture(scope="module")
def model():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=64, attn_implementation="sdpa",
    )  # fmt: skip
    return Qwen3ForCausalLM(cfg).to(F64).eval()


def _rollout(seed: int = 0):
    """A veRL rollout batch: left-padded prompts, right-padded responses, rewards on the last token."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.zeros(B, LP, dtype=torch.long)
    responses = torch.zeros(B, LR, dtype=torch.long)
    attn = torch.zeros(B, LP + LR, dtype=torch.long)
    for i, (p, r) in enumerate(zip(PROMPT_LENS, RESP_LENS)):
        prompts[i, LP - p :] = torch.randint(1, V, (p,), generator=g)
        responses[i, :r] = torch.randint(1, V, (r,), generator=g)
        attn[i, LP - p : LP + r] = 1
    resp_mask = attn[:, LP:].clone()
    pos = (attn.cumsum(-1) - 1).clamp_min(0)
    noise = lambda s: s * torch.randn(B, LR, generator=g, dtype=F64) * resp_mask
    scores = torch.zeros(B, LR, dtype=F64)
    reward = torch.randint(0, 2, (B,), generator=g).to(F64) + 0.25 * torch.rand(B, generator=g, dtype=F64)
    scores[torch.arange(B), torch.tensor(RESP_LENS) - 1] = reward
    log_z = (3.0 * torch.randn(B, generator=g, dtype=F64)).tolist()
    return dict(
        prompts=prompts, responses=responses, input_ids=torch.cat([prompts, responses], 1), attention_mask=attn,
        position_ids=pos, response_mask=resp_mask, token_level_scores=scores, noise=noise, reward=reward,
        log_z=log_z,
    )  # fmt: skip


def _reference_token_logp(model, r) -> torch.Tensor:
    """[B, LR] log pi(response token), one unpadded forward per row (no padding layout at all), 0 on padding."""
    rows = []
    for i, (p, n) in enumerate(zip(PROMPT_LENS, RESP_LENS)):
        ids = torch.cat([r["prompts"][i, LP - p :], r["responses"][i, :n]])[None]
        logp = torch.log_softmax(model(input_ids=ids).logits[0, p - 1 : -1], -1)  # predicts tokens p .. p+n-1
        rows.append(torch.nn.functional.pad(logp.gather(-1, ids[0, p:, None])[:, 0], (0, LR - n)))
    return torch.stack(rows)


def _verl_batch(model, r, old, ref, global_batch_size=B, with_label="extra_info"):
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    tensors = {k: r[k] for k in ("prompts", "responses", "input_ids", "attention_mask", "position_ids")}
    tensors.update(response_mask=r["response_mask"], old_log_probs=old, ref_log_prob=ref)
    tensors["token_level_scores"] = r["token_level_scores"]
    non_tensors = {"uid": np.array([f"p{i // 4}" for i in range(B)], dtype=object)}
    # the DISA label: in each row's extra_info (the data step writes it there) or a top-level column
    if with_label == "extra_info":
        non_tensors["extra_info"] = np.array([{"index": i, "tiltlab_log_z": z} for i, z in enumerate(r["log_z"])])
    elif with_label == "column":
        non_tensors["tiltlab_log_z"] = np.array(r["log_z"], dtype=object)
    data = DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info={"temperature": 1.0})
    td = left_right_2_no_padding(data.to_tensordict())
    tu.assign_non_tensor(td, use_remove_padding=False, global_batch_size=global_batch_size, dp_size=1)
    return td


def _engine(model, monkeypatch):
    import verl.workers.engine.fsdp.transformer_impl as impl

    monkeypatch.setattr(impl, "get_device_id", lambda: "cpu")  # veRL has no CPU platform (module docstring)
    monkeypatch.setattr(impl, "get_device_name", lambda: "cpu")
    eng = object.__new__(impl.FSDPEngineWithLMHead)  # no initialize(): no FSDP, no process group
    eng.module = model
    eng._autocast_dtype = torch.float32  # no autocast: the model stays in float64
    eng.use_ulysses_sp = False
    eng.pad_to_length = None
    eng.engine_config = SimpleNamespace(entropy_checkpointing=False)
    eng.get_data_parallel_group = lambda: None
    return eng


def _actor_config(**kw):
    from verl.workers.config import ActorConfig

    kw = {"use_kl_loss": True, "kl_loss_coef": 0.0, **kw}  # the recipe's setting: reference log-probs, no KL term
    return ActorConfig(strategy="fsdp", rollout_n=4, ppo_micro_batch_size_per_gpu=1, **kw)


def _grads(model):
    return [p.grad.detach().clone() for p in model.parameters()]


def _step(eng, model, td, loss_fn, n_micro=1):
    """veRL's micro-batch loop: forward_step + backward per micro-batch; returns (sum of losses, grads)."""
    from verl.utils import tensordict_utils as tu

    model.zero_grad()
    total = 0.0
    if n_micro > 1:  # veRL's mini-batch iterator shuffles the rows (labels must travel with them)
        (td,) = list(tu.make_iterator(td, mini_batch_size=B, epochs=1, seed=0, dataloader_kwargs={"shuffle": True}))
    for mb in tu.chunk_tensordict(td, n_micro) if n_micro > 1 else [td]:
        loss, _ = eng.forward_step(mb, loss_function=loss_fn, forward_only=False)
        loss.backward()
        total += float(loss.detach())
    return total, _grads(model)


SETTINGS = dict(
    tilt_beta=4.0, reward_scale=2.0, reward_shift=-0.5, weight_clip="eps", weight_eps=0.1, weight_eps_high=0.3
)


@pytest.mark.parametrize(
    ("logprob_scale", "n_micro", "label"), [("sum", 1, "extra_info"), ("mean", 2, "extra_info"), ("sum", 2, "column")]
)
def test_disa_loss_step_equals_tiltlab(model, monkeypatch, logprob_scale, n_micro, label):
    r = _rollout(1)
    with torch.no_grad():
        base = _reference_token_logp(model, r)
    old, ref = base + r["noise"](0.05), base + r["noise"](0.3)
    settings = plugin.TBSettings(objective="disa", logprob_scale=logprob_scale, **SETTINGS)  # type: ignore[arg-type]
    loss_fn = partial(plugin.tb_loss_fn, config=_actor_config(), settings=settings)
    eng = _engine(model, monkeypatch)
    got, got_g = _step(eng, model, _verl_batch(model, r, old, ref, with_label=label), loss_fn, n_micro)

    model.zero_grad()
    m = r["response_mask"].to(F64)
    norm = logprob_scale
    logp = _reference_token_logp(model, r)
    w = tb.tb_importance_weight(logp, old, m, weight_clip="eps", eps=0.1, eps_high=0.3)
    want = tb.disa_loss(
        tb.sequence_logprob(logp, m, normalize=norm), tb.sequence_logprob(ref, m, normalize=norm), 2.0 * r["reward"] - 0.5,
        torch.tensor(r["log_z"], dtype=F64), beta=4.0, is_weight=w,
    ).loss  # fmt: skip
    want.backward()
    assert got == pytest.approx(float(want), rel=1e-9)
    for a, b in zip(got_g, _grads(model)):
        torch.testing.assert_close(a, b, **TOL)
    # the label column is live: another frozen log Z gives another loss
    r2 = dict(r, log_z=[z + 1.0 for z in r["log_z"]])
    other, _ = _step(eng, model, _verl_batch(model, r2, old, ref, with_label=label), loss_fn, n_micro)
    assert abs(other - got) > 1e-2


@pytest.mark.parametrize("objective", ["flowrl", "paced"])
def test_learned_log_z_loss_step_equals_tiltlab(model, monkeypatch, objective):
    # the learned log Z arrives in the model output (a head on the actor supplies it on GPU); here a
    # leaf tensor stands in for the head's output, so its gradient is the head's upstream gradient
    r = _rollout(2)
    with torch.no_grad():
        base = _reference_token_logp(model, r)
    old, ref = base + r["noise"](0.05), base + r["noise"](0.3)
    log_z = torch.linspace(-1.0, 2.0, B, dtype=F64).requires_grad_(True)
    settings = plugin.TBSettings(objective=objective, paced_kl_coef=0.5, logprob_scale="sum", **SETTINGS)  # type: ignore[arg-type]

    def loss_fn(model_output, data, dp_group=None):
        return plugin.tb_loss_fn(
            _actor_config(), {**model_output, "tiltlab_log_z": log_z}, data, dp_group, settings=settings
        )

    eng = _engine(model, monkeypatch)
    got, got_g = _step(eng, model, _verl_batch(model, r, old, ref, with_label=None), loss_fn)
    got_z = log_z.grad.clone()

    model.zero_grad()
    log_z.grad = None
    m = r["response_mask"].to(F64)
    logp = _reference_token_logp(model, r)
    reward = 2.0 * r["reward"] - 0.5
    if objective == "flowrl":  # FlowRL's loss as coded, without its group normalization (reward given)
        want = tb.flowrl_loss(
            logp, ref, old, m, reward[:, None], log_z, beta=4.0, length_normalize=False, group_normalize=False,
            weight_clip="eps", eps=0.1, eps_high=0.3,
        ).loss  # fmt: skip
    else:  # PACED: anchored on pi_old, tilt r / kl_coef
        w = tb.tb_importance_weight(logp, old, m, weight_clip="eps", eps=0.1, eps_high=0.3)
        res = tb.tb_residual(tb.sequence_logprob(logp, m), tb.sequence_logprob(old, m), reward, log_z, beta=1.0 / 0.5)
        want = tb.tb_loss(res, is_weight=w).loss
    want.backward()
    assert got == pytest.approx(float(want), rel=1e-9)
    torch.testing.assert_close(got_z, log_z.grad, **TOL)
    for a, b in zip(got_g, _grads(model)):
        torch.testing.assert_close(a, b, **TOL)


def test_tb_loss_refuses_bad_settings_and_batches(model, monkeypatch):
    r = _rollout(3)
    with torch.no_grad():
        base = _reference_token_logp(model, r)
    eng = _engine(model, monkeypatch)
    disa = plugin.TBSettings(objective="disa")
    no_label = _verl_batch(model, r, base, base, with_label=None)
    with pytest.raises(ValueError, match="tiltlab_log_z"):
        eng.forward_step(no_label, partial(plugin.tb_loss_fn, config=_actor_config(), settings=disa), False)
    with pytest.raises(ValueError, match="kl_loss_coef"):
        cfg = _actor_config(kl_loss_coef=0.1)
        eng.forward_step(no_label, partial(plugin.tb_loss_fn, config=cfg, settings=disa), False)
    flow = plugin.TBSettings(objective="flowrl")
    with pytest.raises(ValueError, match="learned log Z"):
        eng.forward_step(no_label, partial(plugin.tb_loss_fn, config=_actor_config(), settings=flow), False)
    with pytest.raises(ValueError, match="unknown keys"):
        plugin.TBSettings.from_config({"objective": "disa", "betta": 3.0})
    with pytest.raises(ValueError, match="objective"):
        plugin.TBSettings(objective="grpo")


def test_tb_settings_take_the_tb_knobs_under_their_one_name():
    """TBSettings' TB fields are the declared knobs (TB_OPTIONS: names, defaults); the per-objective default of
    logprob_scale is the TRL trainer's (mean for flowrl, sum for disa); old spellings are refused naming the new,
    from Python and from the Hydra mapping."""
    import dataclasses

    from tiltlab.objectives.catalog import TB_OPTIONS

    got = {f.name: f.default for f in dataclasses.fields(plugin.TBSettings)}
    assert all(got[o.name] == o.default for o in TB_OPTIONS)
    assert plugin.TBSettings(objective="flowrl").logprob_scale == "mean"
    assert plugin.TBSettings(objective="disa").logprob_scale == "sum"
    for old, new in (("beta", "tilt_beta"), ("length_normalize", "logprob_scale")):
        with pytest.raises(TypeError, match=f"'{old}' is now {new}"):
            plugin.TBSettings(objective="disa", **{old: 1.0})
        with pytest.raises(TypeError, match=f"'{old}' is now {new}"):
            plugin.TBSettings.from_config({"objective": "disa", old: 1.0})
    with pytest.raises(ValueError, match="weight_clip must be one of"):
        plugin.TBSettings(objective="disa", weight_clip="none")


@pytest.mark.parametrize("field", ["tilt_beta", "paced_kl_coef"])
def test_tb_settings_take_any_positive_tilt_and_refuse_zero(field):
    """beta and PACED's KL coefficient: any value > 0 is a tilt (0.25 and 0.5 as much as 15), 0 and below are
    refused with their name."""
    for ok in (0.25, 0.5, 1.0, 15.0):
        assert getattr(plugin.TBSettings(objective="paced", **{field: ok}), field) == ok
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="tilt_beta and paced_kl_coef must be > 0"):
            plugin.TBSettings(objective="paced", **{field: bad})


def test_worker_and_task_runner_build():
    # the classes Ray instantiates on GPU nodes; built here, not started (veRL needs CUDA to run them)
    from verl.single_controller.base.decorator import MAGIC_ATTR
    from verl.workers.engine_workers import ActorRolloutRefWorker

    cls = plugin.worker_class()
    assert issubclass(cls, ActorRolloutRefWorker)
    assert (
        getattr(cls.init_model, MAGIC_ATTR)["dispatch_mode"]
        == getattr(ActorRolloutRefWorker.init_model, MAGIC_ATTR)["dispatch_mode"]
    )
    runner_cls = verl_runner._task_runner().__ray_actor_class__
    runner = runner_cls()
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(
        {"actor_rollout_ref": {"model": {}, "actor": {"use_kl_loss": True}}, "algorithm": {"use_kl_in_reward": False}}
    )
    placed, _ = runner.add_actor_rollout_worker(cfg)
    assert placed is not cls and issubclass(placed, ActorRolloutRefWorker)  # a fresh class per call is fine
    (role,) = runner.role_worker_mapping
    assert role.name == "ActorRolloutRef"  # use_kl_loss: the fused worker also serves pi_ref
    assert runner.role_worker_mapping[role].__ray_actor_class__.__name__ == "TiltlabActorRolloutRefWorker"


def test_compute_score_is_tiltlabs_math_reward_loaded_the_way_verl_loads_it():
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn

    cfg = yaml_config()
    fn = get_custom_reward_fn(OmegaConf.create({"reward": cfg["reward"]}))
    assert fn(data_source="tiltlab_math", solution_str="so \\boxed{4}.", ground_truth="4", extra_info={}) == 1.0
    assert fn(data_source="tiltlab_math", solution_str="so \\boxed{5}.", ground_truth="4", extra_info={}) == 0.0
    assert (
        fn(data_source="tiltlab_math", solution_str="Answer: 4", ground_truth="4", extra_info={}) == 0.0
    )  # boxed only


def yaml_config() -> dict:
    import yaml

    return yaml.safe_load((ROOT / "configs" / "verl" / "disa_qwen3_4b.yaml").read_text())


def test_verl_rows_carry_the_label_through_verl_dataset_and_repeat(tmp_path):
    # veRL's own RLHFDataset, collate_fn and DataProto.repeat (the rollout's n copies per prompt)
    import pyarrow as pa
    import pyarrow.parquet as pq
    from omegaconf import OmegaConf
    from transformers import PreTrainedTokenizerFast
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    from tiltlab.llm.base.models import train_bpe

    rows = [{"id": f"q{i}", "prompt": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(5)]
    log_z = [-1.5, 0.25, 3.0, -0.75, 2.0]
    out = plugin.verl_rows(rows, log_z)
    assert out[2]["extra_info"] == {"index": 2, "id": "q2", "tiltlab_log_z": 3.0}
    assert out[2]["reward_model"]["ground_truth"] == "4" and out[2]["prompt"][0]["content"] == "What is 2 + 2?"
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(out), path)
    tok = PreTrainedTokenizerFast(tokenizer_object=train_bpe(vocab_size=300), pad_token="<|endoftext|>")
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    ds = RLHFDataset(str(path), tok, OmegaConf.create({"cache_dir": str(tmp_path), "max_prompt_length": 64}))
    batch = DataProto.from_single_dict(collate_fn([ds[i] for i in (3, 1, 4)])).repeat(repeat_times=2, interleave=True)
    got = [e["tiltlab_log_z"] for e in batch.non_tensor_batch["extra_info"]]
    assert got == [-0.75, -0.75, 0.25, 0.25, 2.0, 2.0]
    with pytest.raises(ValueError, match="log_z"):
        plugin.verl_rows(rows, log_z[:4])
    with pytest.raises(ValueError, match="finite"):
        plugin.verl_rows(rows, [0.0, 0.0, float("nan"), 0.0, 0.0])


# -------------------------------------------------------------------------------- the config
ROOT = Path(__file__).resolve().parents[3]


def test_disa_config_composes_on_verl_defaults_and_matches_the_trl_config():
    """configs/verl/disa_qwen3_4b.yaml overrides only keys veRL's trainer config has (a typo would be a
    silent no-op under Hydra's struct-less merge), and shares its run values with the TRL config."""
    import verl
    import yaml
    from omegaconf import OmegaConf

    ours = yaml_config()
    base = OmegaConf.load(Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml")
    tilt = ours["actor_rollout_ref"].pop("tiltlab")
    settings = plugin.TBSettings.from_config(tilt)
    ours.pop("defaults", None)
    ours.pop("hydra", None)

    known = OmegaConf.to_container(base, resolve=False, throw_on_missing=False)

    def walk(node, ref, prefix=""):
        for k, v in node.items():
            assert isinstance(ref, dict) and k in ref, f"{prefix}{k} is not a veRL setting"
            if isinstance(v, dict) and ref[k] not in ({}, None):
                walk(v, ref[k], f"{prefix}{k}.")

    walk(ours, known)
    trl = yaml.safe_load((ROOT / "configs" / "disa_qwen3_4b.yaml").read_text())
    a = ours["actor_rollout_ref"]
    assert settings.objective == "disa"
    assert settings.tilt_beta == trl["tilt_beta_levels"][trl["tilt_beta"]] == trl["stage1"]["tilt_beta"]
    assert settings.logprob_scale == trl["disa"]["logprob_scale"]
    assert settings.reward_scale == trl["disa"]["reward_scale"] and settings.reward_shift == trl["disa"]["reward_shift"]
    assert a["rollout"]["n"] == trl["trl"]["num_generations"]
    assert a["actor"]["optim"]["lr"] == trl["trl"]["learning_rate"]
    assert ours["data"]["train_batch_size"] * a["rollout"]["n"] == trl["trl"]["generation_batch_size"]
    assert ours["data"]["max_response_length"] == trl["trl"]["max_completion_length"]
    assert a["model"]["path"] == trl["model"]
    assert a["actor"]["use_kl_loss"] is True and a["actor"]["kl_loss_coef"] == 0.0  # reference log-probs, no KL
    assert ours["trainer"]["use_v1"] is False
    assert trl["reward"] == "math" and ours["reward"]["custom_reward_function"]["name"] == "compute_score"


# ------------------------------------------------------------------------ the learned log Z head
def _head_model(model):
    import copy

    from tiltlab.llm.disa.logz_head import attach_log_z_head

    m = copy.deepcopy(model)
    torch.manual_seed(1)
    head = attach_log_z_head(m, hidden=16, n_layers=2, dropout=0.0, init=0.5)
    torch.nn.init.normal_(head.net[-1].weight, std=0.3)  # a non-constant head: log Z depends on the prompt
    return m.to(F64)


def test_log_z_engine_forward_supplies_the_heads_log_z(model, monkeypatch):
    # veRL's forward_step of the head engine puts log Z [B] in the model output; it equals the TRL
    # path's prompt_log_z row by row (float32: LogZHead returns float32, so 1e-6 relative), and the
    # FlowRL loss step's gradients (head and backbone) equal tiltlab's on an independent forward
    from tiltlab.llm.disa.logz_head import get_log_z_head, prompt_log_z

    m = _head_model(model)
    cls = plugin.log_z_engine_class()
    eng = _engine(m, monkeypatch)
    eng.__class__ = cls
    r = _rollout(4)
    with torch.no_grad():
        base = _reference_token_logp(m, r)
    old, ref = base + r["noise"](0.05), base + r["noise"](0.3)
    settings = plugin.TBSettings(objective="flowrl", logprob_scale="sum", **SETTINGS)  # type: ignore[arg-type]
    seen = {}

    def loss_fn(model_output, data, dp_group=None):
        seen["log_z"] = model_output[plugin.LOG_Z_KEY].detach().clone()
        return plugin.tb_loss_fn(_actor_config(), model_output, data, dp_group, settings=settings)

    got, got_g = _step(eng, m, _verl_batch(m, r, old, ref, with_label=None), loss_fn)

    m.zero_grad()
    head = get_log_z_head(m)
    rows = [r["prompts"][i, LP - p :][None] for i, p in enumerate(PROMPT_LENS)]
    log_z = torch.cat([prompt_log_z(m, ids, torch.ones_like(ids)) for ids in rows])
    torch.testing.assert_close(seen["log_z"], log_z.detach(), rtol=1e-6, atol=1e-6)
    mask = r["response_mask"].to(F64)
    logp = _reference_token_logp(m, r)
    want = tb.flowrl_loss(
        logp, ref, old, mask, (2.0 * r["reward"] - 0.5)[:, None], log_z, beta=4.0, length_normalize=False,
        group_normalize=False, weight_clip="eps", eps=0.1, eps_high=0.3,
    ).loss  # fmt: skip
    want.backward()
    assert got == pytest.approx(float(want), rel=1e-6)
    names = [n for n, _ in m.named_parameters()]
    # LogZHead returns float32: a 1-ulp (~6e-8) difference of log Z between the two forwards enters every
    # residual, so gradients agree to ~1e-6 of their own scale; 1e-5 of each tensor's largest entry
    for n, a, b in zip(names, got_g, _grads(m)):
        scale = float(b.abs().max())
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5 * scale, msg=lambda s, n=n: f"{n}: {s}")
    assert float(head.net[-1].weight.grad.abs().sum()) > 0  # the head learns from the TB loss


@pytest.mark.parametrize("forward_only", [False, True])
def test_log_z_engine_attaches_the_head_to_the_trained_policy_only(model, monkeypatch, forward_only):
    import copy

    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    from tiltlab.llm.disa.logz_head import get_log_z_head

    cls = plugin.log_z_engine_class()
    monkeypatch.setattr(cls, "head_kwargs", {"hidden": 8, "n_layers": 2, "dropout": 0.0})
    monkeypatch.setattr(FSDPEngineWithLMHead, "_build_module", lambda self: copy.deepcopy(model))  # HF load stand-in
    eng = object.__new__(cls)
    eng.engine_config = SimpleNamespace(forward_only=forward_only)
    head = get_log_z_head(eng._build_module(), required=False)
    assert (head is None) == forward_only  # the reference engine (forward only) gets no head
    if head is not None:
        assert head.net[0].out_features == 8 and len([m for m in head.net if isinstance(m, torch.nn.Linear)]) == 2


def test_pool_prompt_hidden_packed_equals_padded():
    # the packed layout (use_remove_padding) and the padded one pool the same prompt tokens
    from tensordict import TensorDict

    g = torch.Generator().manual_seed(5)
    seq = [p + n for p, n in zip(PROMPT_LENS, RESP_LENS)]
    rows = [torch.randn(s, 3, generator=g, dtype=F64) for s in seq]
    offsets = torch.tensor([0, *np.cumsum(seq)])
    ids = torch.nested.nested_tensor_from_jagged(torch.zeros(int(offsets[-1]), dtype=torch.long), offsets)
    attn = torch.zeros(B, LP + 1, dtype=torch.long)
    for i, p in enumerate(PROMPT_LENS):
        attn[i, LP - p : LP + 1] = 1
    data = TensorDict({"input_ids": ids, "prompts": torch.zeros(B, LP, dtype=torch.long), "attention_mask": attn}, [B])
    packed = torch.cat(rows)[None]  # [1, N, H]
    padded = torch.stack([torch.nn.functional.pad(x, (0, 0, 0, max(seq) - len(x))) for x in rows])
    want = torch.stack([x[:p].mean(0) for x, p in zip(rows, PROMPT_LENS)])
    torch.testing.assert_close(plugin.pool_prompt_hidden(packed, data, True), want, **TOL)
    torch.testing.assert_close(plugin.pool_prompt_hidden(padded, data, False), want, **TOL)


def test_log_z_engine_is_selected_and_keeps_the_head_out_of_the_rollout_weights(monkeypatch):
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    monkeypatch.setenv("VERL_ENGINE_VENDOR", "unset-by-the-test")  # restored after the test
    settings = plugin.TBSettings(objective="paced", log_z_hidden=32, log_z_layers=2, log_z_dropout=0.0)
    cls = plugin.use_log_z_engine(settings)
    assert EngineRegistry.get_engine_cls("language_model", "fsdp2") is cls
    assert cls.head_kwargs == {"hidden": 32, "n_layers": 2, "dropout": 0.0}
    assert plugin.use_log_z_engine(settings) is cls  # idempotent
    names = ["model.embed_tokens.weight", "log_z_head.net.0.weight", "lm_head.weight", "log_z_head.net.3.bias"]
    monkeypatch.setattr(FSDPEngineWithLMHead, "get_per_tensor_param", lambda self, **k: (((n, 0) for n in names), None))
    gen, _ = cls.get_per_tensor_param(object.__new__(cls))
    assert [n for n, _ in gen] == ["model.embed_tokens.weight", "lm_head.weight"]
