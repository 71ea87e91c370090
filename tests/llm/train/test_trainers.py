"""Online trainer (TRL GRPOTrainer subclass): every objective trains for real on the tiny model,
the FlowRL log Z head receives gradients and DISA's frozen log Z does not; label-compat checks;
every config in configs/ validates."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")

from tests.llm.train._tiny_trainer import disa_kwargs, online_args, parity_reward
from tiltlab.llm.disa.labels import LabelMismatchError, check_label_compat
from tiltlab.llm.train.online import TiltGRPOConfig, TiltGRPOTrainer

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def _dataset(math_rows, with_log_z=False):
    from datasets import Dataset

    rows = [{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]} for r in math_rows]
    if with_log_z:
        for i, r in enumerate(rows):
            r["log_z"] = 0.1 * i
    return Dataset.from_list(rows)


def _trainer(tiny_dir, tmp_path, math_rows, objective, **kw):
    from tiltlab.llm.base.models import load_model, load_tokenizer

    extra = {**(disa_kwargs() if objective == "disa" else {}), "max_steps": 2, **kw}
    args = online_args(tmp_path / objective, objective, **extra)
    return TiltGRPOTrainer(
        model=load_model(tiny_dir, device="cpu"),
        reward_funcs=parity_reward,
        args=args,
        train_dataset=_dataset(math_rows, with_log_z=objective == "disa" or kw.get("paced_select_from") == "disa"),
        processing_class=load_tokenizer(tiny_dir),
    )


VARIANTS = {
    "flowrl-paper": ("flowrl", {"weight_clip": "eps", "log_z_detach_input": True}),  # FlowRL paper's [1-eps, 1+eps]
    "lad-seq-tv": ("lad", {"lad_level": "sequence", "lad_divergence": "tv"}),
    "grpo-kl": ("grpo", {"beta": 0.05}),
}


@pytest.mark.parametrize("objective", ["grpo", "gspo", "flowrl", "disa", "vargrad", "lad", "paced", *VARIANTS])
def test_objective_trains(objective, tiny_dir, tmp_path, math_rows):
    objective, extra = VARIANTS.get(objective, (objective, {}))
    extra = dict(extra)
    if objective == "paced":
        extra.update(log_kl_old=True, log_z_accuracy_correlation=True)
    tr = _trainer(tiny_dir, tmp_path, math_rows, objective, **extra)
    before = {k: v.detach().clone() for k, v in tr.model.named_parameters()}
    tr.train()
    changed = [k for k, v in tr.model.named_parameters() if not torch.equal(v, before[k])]
    assert len(changed) == len(before), f"{objective}: parameters left unchanged: {set(before) - set(changed)}"
    logs = [h for h in tr.state.log_history if "loss" in h and "train_loss" not in h]
    assert len(logs) == 2 and all(torch.isfinite(torch.tensor(h["loss"])) for h in logs)
    key = f"objective/{objective}_loss"
    assert all(key in h for h in logs)
    if "beta" in extra:
        assert all("kl_ref" in h for h in logs)  # the reference model was built and the KL logged
    if objective in ("flowrl", "disa", "vargrad", "paced"):
        assert all("log_z/mean" in h and "residual" in h and "weight_clip_frac" in h for h in logs)
    if objective == "paced":
        assert logs[1]["paced/replay_used"] >= 0 and "paced/p_hat_selected_mean" in logs[0]
        assert all("kl_old" in h and "paced/beta_kl_old" in h for h in logs)
        assert abs(logs[0]["kl_old"]) < 1e-5  # first micro-batch: pi_theta = pi_old exactly


def test_paced_selects_with_disa_partition_function(tiny_dir, tmp_path, math_rows):
    # log_z column = 0.1 i; with tilt_beta = 2 the DISA pass rate p = (Z - 1)/(e^2 - 1) rises with i,
    # so tau = 0 must select the prompts with the smallest log Z among the candidates.
    tr = _trainer(
        tiny_dir,
        tmp_path,
        math_rows,
        "paced",
        paced_select_from="disa",
        paced_tau=0.0,
        tilt_beta=2.0,
        paced_pool_factor=3,
        max_steps=1,
    )
    tr.train()
    logs = [h for h in tr.state.log_history if "paced/p_hat_selected_mean" in h]
    assert logs and logs[0]["paced/p_hat_selected_mean"] < logs[0]["paced/p_hat_pool_mean"]


def _one_batch(tr):
    batch = next(iter(tr.get_train_dataloader()))
    tr.model.train()
    return tr._prepare_inputs(batch)


def test_flowrl_log_z_head_gets_gradient_and_disa_log_z_does_not(tiny_dir, tmp_path, math_rows):
    from tiltlab.llm.disa.logz_head import get_log_z_head

    tr = _trainer(tiny_dir, tmp_path, math_rows, "flowrl")
    head = get_log_z_head(tr.model)
    inputs = _one_batch(tr)
    tr.model.zero_grad()
    tr.compute_loss(tr.model, inputs).backward()
    g = torch.cat([p.grad.flatten() for p in head.parameters() if p.grad is not None])
    assert g.numel() > 0 and g.abs().sum() > 0  # the learned log Z is trained by the TB loss

    tr = _trainer(tiny_dir, tmp_path, math_rows, "disa")
    assert get_log_z_head(tr.model, required=False) is None  # no learned partition function at all
    inputs = _one_batch(tr)
    log_z = inputs["log_z"].clone().requires_grad_(True)
    inputs["log_z"] = log_z
    tr.model.zero_grad()
    loss = tr.compute_loss(tr.model, inputs)
    loss.backward()
    assert log_z.grad is None  # sg(log Z_psi): the frozen value is detached inside disa_loss
    g0 = torch.cat([p.grad.flatten().clone() for p in tr.model.parameters() if p.grad is not None])
    assert g0.abs().sum() > 0
    # ...but the frozen value does enter the residual: shifting it changes the policy gradient
    inputs["log_z"] = log_z.detach() + 1.0
    tr.model.zero_grad()
    tr.compute_loss(tr.model, inputs).backward()
    g1 = torch.cat([p.grad.flatten() for p in tr.model.parameters() if p.grad is not None])
    assert (g1 - g0).norm() > 1e-3 * g0.norm()


def test_log_z_head_options_reach_the_head_and_its_optimizer(tiny_dir, tmp_path, math_rows):
    # log_z_hidden / log_z_layers / log_z_dropout size the head; log_z_lr gives its parameters their own
    # group (lr, no weight decay); log_z_detach_input stops the log Z gradient at the pooled hidden state
    from types import SimpleNamespace

    from tiltlab.llm.disa.logz_head import get_log_z_head

    tr = _trainer(
        tiny_dir,
        tmp_path,
        math_rows,
        "flowrl",
        learning_rate=1e-3,
        weight_decay=0.1,
        log_z_lr=0.05,
        log_z_hidden=24,
        log_z_layers=2,
        log_z_dropout=0.3,
    )
    head = get_log_z_head(tr.model)
    linears = [m for m in head.net if isinstance(m, torch.nn.Linear)]
    drops = [m for m in head.net if isinstance(m, torch.nn.Dropout)]
    assert [(m.in_features, m.out_features) for m in linears] == [(tr.model.config.hidden_size, 24), (24, 1)]
    assert [m.p for m in drops] == [0.3]
    opt = tr.create_optimizer()
    head_ids = {id(p) for p in head.parameters()}
    seen = [id(p) for g in opt.param_groups for p in g["params"]]
    assert sorted(seen) == sorted(id(p) for p in tr.model.parameters() if p.requires_grad)  # each param once
    for g in opt.param_groups:
        ids = {id(p) for p in g["params"]}
        if ids & head_ids:
            assert ids == head_ids and g["lr"] == 0.05 and g["weight_decay"] == 0.0
        elif ids:
            assert g["lr"] == 1e-3
    # without log_z_lr the head trains at the policy's learning rate
    tr0 = _trainer(tiny_dir, tmp_path, math_rows, "flowrl", learning_rate=1e-3)
    head0 = {id(p) for p in get_log_z_head(tr0.model).parameters()}
    assert all(g["lr"] == 1e-3 for g in tr0.create_optimizer().param_groups if {id(p) for p in g["params"]} & head0)
    # detach_input: the same log Z values; the backbone gets a gradient from them only when attached
    ids = torch.tensor([[5, 6, 7, 8], [0, 9, 10, 11]])
    batch = SimpleNamespace(prompt_ids=ids, prompt_mask=(ids > 0).long())
    backbone = [p for n, p in tr.model.named_parameters() if not n.startswith("log_z_head.")]
    with torch.no_grad():  # the head starts with a zero last layer (log Z = init): no gradient reaches its input
        linears[-1].weight.normal_(generator=torch.Generator().manual_seed(0))
    vals = {}
    tr.model.eval()  # no dropout: the two passes compute the same values
    for detach in (False, True):
        tr.args.log_z_detach_input = detach
        tr.model.zero_grad()
        lz = tr._learned_log_z(tr.model, batch)
        lz.sum().backward()
        vals[detach] = lz.detach()
        got = [p.grad for p in backbone if p.grad is not None and p.grad.abs().sum() > 0]
        assert (len(got) == 0) is detach
        assert all(p.grad is not None for p in head.parameters())
    torch.testing.assert_close(vals[False], vals[True])


def test_disa_label_compat():
    man = {"format": "tiltlab.stage1/1", "tilt_beta": 2.0, "reward_transform": {"name": "affine", "a": 1.0, "c": 0.0}}
    assert check_label_compat(man, tilt_beta=2.0, reward_transform=("affine", 1.0, 0.0), logprob_scale="sum") == []
    refused = "must use the reward transform, tilt_beta, log-prob scale"  # refused by default, not for want of a reason
    with pytest.raises(LabelMismatchError, match=f"{refused}.*logprob_scale"):  # trajectory labels, mean residual
        check_label_compat(man, tilt_beta=2.0, reward_transform=("affine", 1.0, 0.0), logprob_scale="mean")
    with pytest.raises(LabelMismatchError, match=f"{refused}.*tilt_beta: Stage 1 used 2.0"):
        check_label_compat(man, tilt_beta=15.0, reward_transform=("affine", 1.0, 0.0), logprob_scale="sum")
    with pytest.raises(LabelMismatchError, match="reason"):
        check_label_compat(
            man, tilt_beta=15.0, reward_transform=("affine", 1.0, 0.0), logprob_scale="sum", allow_mismatch=True
        )
    probs = check_label_compat(
        man,
        tilt_beta=15.0,
        reward_transform=("affine", 1.0, 0.0),
        logprob_scale="sum",
        allow_mismatch=True,
        reason="testing",
    )
    assert len(probs) == 1
    # a manifest written before the rename (its key `beta`) is read as one with `tilt_beta`
    old = {k if k != "tilt_beta" else "beta": v for k, v in man.items()}
    assert check_label_compat(old, tilt_beta=2.0, reward_transform=("affine", 1.0, 0.0), logprob_scale="sum") == []
    with pytest.raises(LabelMismatchError, match="tilt_beta: Stage 1 used 2.0"):
        check_label_compat(old, tilt_beta=15.0, reward_transform=("affine", 1.0, 0.0), logprob_scale="sum")


def test_disa_label_compat_checks_the_prompt_format():
    """Labels of raw prompts do not describe chat-templated training prompts (and vice versa)."""
    man = {
        "format": "tiltlab.stage1/1",
        "tilt_beta": 2.0,
        "reward_transform": {"name": "affine", "a": 1.0, "c": 0.0},
        "config": {"chat_template": False},
    }
    kw = dict(tilt_beta=2.0, reward_transform=("affine", 1.0, 0.0), logprob_scale="sum")
    assert check_label_compat(man, chat_template=False, **kw) == []
    assert check_label_compat(man, **kw) == []  # prompt format not given: not checked
    with pytest.raises(LabelMismatchError, match="chat_template: Stage 1 labelled raw prompts"):
        check_label_compat(man, chat_template=True, **kw)


def test_disa_trainer_refuses_mismatched_labels(tiny_dir, tmp_path, math_rows):
    with pytest.raises(LabelMismatchError):
        _trainer(tiny_dir, tmp_path, math_rows, "disa", logprob_scale="mean")
    # disa_allow_label_mismatch with a reason: the trainer is built and records what does not match
    tr = _trainer(
        tiny_dir,
        tmp_path,
        math_rows,
        "disa",
        logprob_scale="mean",
        disa_allow_label_mismatch=True,
        disa_mismatch_reason="labels re-derived for mean log-probs",
    )
    assert len(tr.label_mismatches) == 1 and "logprob_scale" in tr.label_mismatches[0]


def test_bad_objective_rejected(tmp_path):
    with pytest.raises(ValueError, match="objective"):
        TiltGRPOConfig(output_dir=str(tmp_path), objective="ppo", use_cpu=True, report_to="none")


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_config_validates(path):
    from tiltlab.llm.train.config import load_run_config

    cfg = load_run_config(path)
    assert cfg.model
    if cfg.objective != "none":
        kw = cfg.trainer_kwargs()
        assert kw["objective"] == cfg.objective
        # build the trainer config itself (its own cross-field checks), CPU-only switches aside
        kw.update(bf16=False, use_cpu=True, report_to="none", output_dir=str(Path(kw["output_dir"]).name))
        if cfg.kind == "online":
            TiltGRPOConfig(**{**kw, "use_vllm": False})
        else:
            from tiltlab.llm.train.offline import OfflineConfig

            OfflineConfig(**kw)


#: a value other than the field's default, valid for it (string options: another allowed choice)
_OTHER = {
    "reward_transform": "affine",
    "weight_clip": "eps",
    "logprob_scale": "mean",
    "lad_divergence": "tv",
    "lad_level": "sequence",
    "paced_select_from": "disa",
    "paced_embeddings": "live",
    "fpa_apply_to": "incorrect",
    "disa_label": "column",
    "disa_mismatch_reason": "labels checked by hand",
}


def _away(field):
    import dataclasses

    d = field.default if field.default is not dataclasses.MISSING else None
    if field.name in _OTHER:
        return _OTHER[field.name]
    if isinstance(d, bool):
        return not d
    if isinstance(d, int):
        return d + 3
    if isinstance(d, float):
        return round(d * 0.5 + 0.37, 4)
    return 0.123  # an unset (None) float option


def test_every_section_key_lands_on_its_trainer_field_away_from_default(tmp_path):
    # `fpa: {lam: 2}` must set OfflineConfig.fpa_lam, `lad: {eta: ...}` TiltGRPOConfig.lad_eta ...: each key of
    # every objective section, at a non-default value, reaches the trainer config field named after it
    import dataclasses

    from tiltlab.llm.base.run_config import SECTION_KEYS, RunConfig
    from tiltlab.llm.train.offline import OfflineConfig
    from tiltlab.objectives.catalog import names

    for section, keys in SECTION_KEYS.items():
        kind = "offline" if section in names("offline") else "online"
        cls = OfflineConfig if kind == "offline" else TiltGRPOConfig
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for key, target in keys.items():
            if not target:  # read by the CLI itself (stage dirs, lora, validation)
                continue
            assert target.endswith(key) and target in fields, (section, key, target)
            value = _away(fields[target])
            assert value != fields[target].default, (section, key)
            sec = {key: value}
            if key == "allow_label_mismatch":
                sec["mismatch_reason"] = "labels checked by hand"
            objective = "paced" if section == "paced" else section
            rc = RunConfig(model="tiny", kind=kind, objective=objective, **{section: sec})
            kw = rc.trainer_kwargs()
            assert kw[target] == value, (section, key)
            kw.update(output_dir=str(tmp_path / section), use_cpu=True, report_to="none")
            if kind == "online" and objective == "disa":
                kw.update(disa_kwargs())
            assert getattr(cls(**kw), target) == value, (section, key)


def test_every_config_named_by_a_claim_exists():
    import re

    claims = Path(__file__).resolve().parents[3] / "paper_checks" / "claims"
    names = set()
    for f in claims.glob("*.toml"):
        names |= set(re.findall(r"configs/([A-Za-z0-9_.\-]+\.yaml)", f.read_text()))
    missing = sorted(n for n in names if not (CONFIGS / n).exists())
    assert not missing, missing


def test_overrides_and_tilt_beta_levels(tmp_path):
    from tiltlab.llm.train.config import load_run_config

    cfg = load_run_config(CONFIGS / "disa_code_qwen2.5_7b.yaml", ["tilt_beta=high", "trl.learning_rate=2e-6"])
    assert cfg.tilt_beta_value == cfg.tilt_beta_levels["high"] and cfg.trainer_kwargs()["learning_rate"] == 2e-6
    cfg = load_run_config(CONFIGS / "paced_qwen2.5_math_1.5b.yaml", ["paced.tau=0.9"])
    assert cfg.trainer_kwargs()["paced_tau"] == 0.9
    with pytest.raises(ValueError, match="unknown keys"):
        load_run_config(CONFIGS / "paced_qwen2.5_math_1.5b.yaml", ["paced.taux=0.9"])


def test_lr_scale_multiplies_the_learning_rate():
    from tiltlab.llm.base.run_config import RunConfig

    assert RunConfig(model="tiny", lr_scale=0.5, trl={"learning_rate": 4e-6}).trainer_kwargs()["learning_rate"] == 2e-6
    assert RunConfig(model="tiny", lr_scale=3.0).trainer_kwargs()["learning_rate"] == pytest.approx(3e-6)  # TRL's 1e-6
    assert "learning_rate" not in RunConfig(model="tiny").trainer_kwargs()  # scale 1: TRL's default stays


def test_every_claim_train_command_parses():
    """Each `tiltlab llm train --config X --set ...` named in paper_checks/claims validates."""
    import re
    import shlex

    from tiltlab.llm.train.config import load_run_config

    claims = Path(__file__).resolve().parents[3] / "paper_checks" / "claims"
    cmds = set()
    for f in claims.glob("*.toml"):
        for m in re.finditer(r"tiltlab llm train ([^&\"]+)", f.read_text()):
            cmds.add(m.group(1).strip())
    assert cmds
    for c in sorted(cmds):
        toks = shlex.split(c)
        path = Path(__file__).resolve().parents[3] / toks[toks.index("--config") + 1]
        sets = [toks[i + 1] for i, t in enumerate(toks) if t == "--set"]
        load_run_config(path, sets)


def test_cli_train_online_and_offline(tiny_dir, tmp_path):
    """`tiltlab llm train --config` end to end on the tiny model (online grpo, offline fpa)."""
    import json

    import yaml

    from tiltlab.cli import main

    on = {
        "kind": "online",
        "objective": "grpo",
        "model": str(tiny_dir),
        "dataset": "synthetic:math:8:1",
        "reward": "math",
        "output_dir": str(tmp_path / "on"),
        "trl": {
            "per_device_train_batch_size": 4,
            "num_generations": 4,
            "max_completion_length": 6,
            "max_steps": 1,
            "use_cpu": True,
            "report_to": "none",
            "save_strategy": "no",
            "disable_tqdm": True,
        },
    }
    (tmp_path / "on.yaml").write_text(yaml.safe_dump(on))
    assert main(["llm", "train", "--config", str(tmp_path / "on.yaml"), "--set", "trl.learning_rate=1e-3"]) == 0
    assert (tmp_path / "on" / "model.safetensors").exists()

    rows = [
        {"prompt": "Compute 1 + 2.", "completion": c, "reward": r} for c, r in (("\\boxed{3}", 1), ("\\boxed{4}", 0))
    ]
    (tmp_path / "off.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows * 2))
    off = {
        "kind": "offline",
        "objective": "fpa",
        "model": str(tiny_dir),
        "dataset": str(tmp_path / "off.jsonl"),
        "output_dir": str(tmp_path / "off"),
        "fpa": {"lam": 2.0},
        "trl": {
            "per_device_train_batch_size": 2,
            "max_steps": 1,
            "use_cpu": True,
            "report_to": "none",
            "save_strategy": "no",
            "disable_tqdm": True,
        },
    }
    (tmp_path / "off.yaml").write_text(yaml.safe_dump(off))
    assert main(["llm", "train", "--config", str(tmp_path / "off.yaml")]) == 0
    assert (tmp_path / "off" / "model.safetensors").exists()


def test_tb_clip_fraction_is_of_the_tb_weight_not_of_the_sampler_weighted_one():
    """DISA/VarGrad/PACED log the fraction of TB weights at their clip bounds; the sampler's sequence
    IS weight multiplies the loss weight only (a large IS weight must not count as clipped)."""
    from types import SimpleNamespace

    import torch

    from tiltlab.llm.train.online.losses import LossBatch, _tb_family
    from tiltlab.objectives.tb import tb_importance_weight

    args = SimpleNamespace(
        weight_clip="max", max_weight=10.0, weight_eps=0.2, weight_eps_high=None, logprob_scale="sum", tilt_beta=1.0
    )
    trainer = SimpleNamespace(args=args)
    logp = torch.zeros(4, 2)
    old = logp - torch.tensor([3.0, 0.0, 0.0, 0.0])[:, None]  # sequence ratios e^6 (clipped at 10), 1, 1, 1
    mask = torch.ones(4, 2)
    b = LossBatch(logp, old, torch.zeros(4, 2), mask, None, torch.full((4,), 50.0), {}, torch.zeros(4, 1), mask[:, :1])
    w_tb = tb_importance_weight(logp, old, mask, weight_clip="max", max_weight=10.0, eps=0.2, eps_high=None)
    torch.testing.assert_close(w_tb, torch.tensor([10.0, 1.0, 1.0, 1.0]))
    for name, opts in (("disa", {"tilt_beta": 1.0}), ("vargrad", {"tilt_beta": 1.0})):
        m = _tb_family(trainer, name, b, torch.zeros(4), torch.zeros(4), **opts).metrics
        torch.testing.assert_close(m["weight_mean"], (w_tb * 50.0).mean())  # the loss weight carries the IS weight
        assert m["weight_clip_frac"].item() == 0.25  # one of four TB weights at max_weight, not all four


def test_learned_z_model_is_loaded_with_model_init_kwargs(tiny_dir, tmp_path):
    """FlowRL attaches its head to a model it loads itself: that load honours TRL's
    ``model_init_kwargs`` (a bf16 copy per process when asked), as TRL's own load of a name does."""
    import torch
    from datasets import Dataset

    from tiltlab.llm.base.models import load_tokenizer
    from tiltlab.llm.train.online import TiltGRPOConfig, TiltGRPOTrainer

    def build(**init):
        args = TiltGRPOConfig(
            output_dir=str(tmp_path),
            objective="flowrl",
            per_device_train_batch_size=4,
            num_generations=4,
            max_completion_length=4,
            use_cpu=True,
            report_to="none",
            model_init_kwargs=init or None,
        )
        return TiltGRPOTrainer(
            model=str(tiny_dir),
            reward_funcs=lambda completions, **kw: [0.0] * len(completions),
            args=args,
            train_dataset=Dataset.from_list([{"prompt": "1 + 1 ="}] * 4),
            processing_class=load_tokenizer(tiny_dir),
        )

    assert build().model.get_input_embeddings().weight.dtype == torch.float32  # TRL's default
    assert build(dtype="bfloat16").model.get_input_embeddings().weight.dtype == torch.bfloat16


def test_get_log_z_head_looks_through_nested_wrappers():
    """The head is found on the model and through up to three wrappers (DDP's ``.module``, PEFT's
    ``.base_model`` / ``.model``), each level a different attribute;
    without a head it is None (or an error when required)."""
    from torch import nn

    from tiltlab.llm.disa.logz_head import HEAD_NAME, LogZHead, get_log_z_head

    inner = nn.Module()
    head = LogZHead(4, hidden=3, n_layers=2)
    setattr(inner, HEAD_NAME, head)

    def wrap(m: nn.Module, attr: str) -> nn.Module:
        w = nn.Module()
        setattr(w, attr, m)
        return w

    chain = inner
    for attr in ("model", "base_model", "module"):  # DDP(PEFT(base)) style, three levels deep
        chain = wrap(chain, attr)
        assert get_log_z_head(chain) is head
    assert get_log_z_head(wrap(nn.Module(), "module"), required=False) is None
    with pytest.raises(ValueError, match="has no log_z_head"):
        get_log_z_head(wrap(nn.Module(), "model"))
