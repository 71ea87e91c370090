"""``tiltlab llm train --config configs/X.yaml [--objective NAME] [--set key=value ...] [--resume [DIR|latest]]``.

Online configs (``kind: online``) build :class:`llm.train.online.TiltGRPOTrainer`, offline
ones (``kind: offline``) :class:`llm.train.offline.OfflineTrainer`. Run it under
``accelerate launch --config_file configs/accelerate/<X>.yaml -m tiltlab.cli llm train ...`` for
several GPUs / nodes (``configs/README.md``). Import-light: the heavy stack loads in the handler.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shlex
import socket
import sys
from pathlib import Path

from tiltlab.files import write_json
from tiltlab.hints import hint
from tiltlab.llm.base.config_args import read_config
from tiltlab.llm.base.data import load_prompts, read_table
from tiltlab.llm.base.models import load_model, load_tokenizer
from tiltlab.llm.base.prompts import training_prompt
from tiltlab.llm.base.rewards import resolve_reward
from tiltlab.llm.disa.stage1 import read_manifest
from tiltlab.llm.disa.stage2.run import load_log_z_predictor
from tiltlab.llm.train import diagnose
from tiltlab.llm.train.config import load_run_config
from tiltlab.llm.train.online_rules import check_trainer_inputs
from tiltlab.llm.train.precheck import (
    check_labels,
    check_lora,
    check_loss_type_name,
    check_validation,
    needs_frozen_log_z,
    precheck,
)
from tiltlab.objectives.catalog import describe

__all__ = [
    "DEVICE_SWITCHES",
    "add_cli",
    "build_trainer",
    "dry_run",
    "lora_config",
    "main",
    "online_dataset",
    "resolve_checkpoint",
    "trainer_args",
]


def add_cli(subparsers) -> None:
    p = subparsers.add_parser(
        "train",
        help="RL / offline training from a YAML run config (TRL + accelerate)",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--config", required=True, help="YAML run config (configs/*.yaml)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, dotted keys (e.g. paced.tau=0.3); repeatable",
    )
    p.add_argument(
        "--objective",
        default=None,
        metavar="NAME",
        help=f"the objective, overriding the config's `objective:` (online: {describe('online')}; "
        f"offline: {describe('offline')})",
    )
    p.add_argument(
        "--resume",
        nargs="?",
        const="latest",
        default=None,
        metavar="DIR|latest",
        help="resume from a checkpoint-N directory, or from the newest one in output_dir (`latest`, the "
        "default without a value); model, optimizer, scheduler, RNG, data order and the objective's state",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="check the config as a run would (the trainer config, reward, LoRA), print it; load no model, do not train",
    )
    p.set_defaults(func=main)
    diagnose.add_cli(subparsers)


def _stage1_manifest(cfg) -> dict | None:
    """Stage 1's manifest from ``disa.stage1_dir`` (None without one): the label settings the
    trainer checks its own against."""
    s1 = cfg.disa.get("stage1_dir")
    if not s1:
        return None

    return read_manifest(s1)


def _disa_predictor(cfg):
    """``(log_z_fn, stage1 manifest)`` from the config's ``disa`` section (Stage 1/2 outputs)."""

    man = _stage1_manifest(cfg)
    s2 = _require_stage2_dir(cfg)
    log_z_fn = load_log_z_predictor(Path(s2))  # callable: chat message lists or raw prompts -> [N]
    return log_z_fn, man


def _require_stage2_dir(cfg) -> str:
    """``disa.stage2_dir``, which a run that reads DISA's log Z from the Stage-2 predictor needs."""
    s2 = cfg.disa.get("stage2_dir")
    if not s2:
        raise ValueError(
            "objective 'disa' needs disa.stage2_dir (the Stage-2 regressor written by `tiltlab llm stage2`)"
        )
    return s2


def online_dataset(rows, chat_template: bool = True):
    """The online trainer's ``datasets.Dataset``: the rows with ``prompt`` in the form TRL renders
    into :func:`tiltlab.llm.base.prompts.format_prompt`'s text (the string Stage 1 labelled)."""
    from datasets import Dataset

    return Dataset.from_list([{**r, "prompt": training_prompt(r["prompt"], chat_template)} for r in rows])


def _nonempty(rows: list, dataset) -> list:
    """The training rows, or a ``ValueError`` when there are none (a run of 0 steps would still
    write a model)."""
    if not rows:
        raise ValueError(
            f"dataset {str(dataset)!r} has no rows: nothing to train on; point `dataset:` at a non-empty file"
        )
    return rows


def resolve_checkpoint(resume: str, output_dir: str) -> str:
    """``latest`` -> the newest ``checkpoint-N`` in ``output_dir``; a ``checkpoint-N`` directory
    (one with ``trainer_state.json``) -> itself; a run directory -> its newest checkpoint."""

    from transformers.trainer_utils import get_last_checkpoint

    where = Path(output_dir) if resume == "latest" else Path(resume)
    if not where.is_dir():
        raise ValueError(f"--resume {resume}: {str(where)!r} is not a directory; {hint('resume_from')}")
    if (where / "trainer_state.json").is_file():
        return str(where)
    last = get_last_checkpoint(str(where))
    if last is None:
        raise ValueError(f"--resume {resume}: no checkpoint-N directory in {str(where)!r}; {hint('save_checkpoints')}")
    return last


def lora_config(cfg):
    """The ``lora:`` section as a ``peft.LoraConfig`` (None without one; checked by
    :func:`~tiltlab.llm.train.precheck.check_lora`). The learned log Z head of flowrl/paced is trained in
    full (``modules_to_save``) and kept out of the adapter targets."""
    if not cfg.lora:
        return None
    lo = check_lora(cfg)
    from peft import LoraConfig

    from tiltlab.llm.disa.logz_head import HEAD_NAME

    learned_z = cfg.kind == "online" and (cfg.objective in ("flowrl", "paced"))
    return LoraConfig(
        r=int(lo["r"]),
        lora_alpha=float(lo["alpha"]),
        lora_dropout=float(lo["dropout"]),
        target_modules=lo["target_modules"],
        exclude_modules=rf".*{HEAD_NAME}.*" if learned_z else None,
        modules_to_save=[HEAD_NAME] if learned_z else None,
        task_type="CAUSAL_LM",
    )


def _offline_validation(cfg, v: dict, kw: dict) -> list:
    """Offline runs (no generation during training): the held-out rows of ``validation.dataset`` (the
    same format as the training file, e.g. the ``.val`` file ``tiltlab llm prepare fpa`` writes), scored
    by the objective's loss every ``every_steps``; the checkpoint with the lowest ``eval_loss`` is kept.
    A held-out split must be by prompt, so ``holdout_fraction`` of the rows is refused
    (:func:`~tiltlab.llm.train.precheck.check_validation`)."""

    held = list(read_table(v["dataset"]))
    if not held:
        raise ValueError(f"validation.dataset {v['dataset']!r} has no rows")
    _eval_settings(cfg, kw)
    return held


def _validation(cfg, rows: list, kw: dict) -> tuple[list, list | None]:
    """``(train rows, held-out rows)`` from the ``validation:`` section, and the evaluation /
    checkpoint-selection settings written into the trainer kwargs ``kw`` (transformers' machinery:
    ``eval_strategy=steps``, ``metric_for_best_model``; a checkpoint at every evaluation)."""
    v = dict(cfg.validation)
    if not v:
        return rows, None
    check_validation(cfg)  # the section's own rules (the pre-check's)
    if cfg.kind != "online":
        return rows, _offline_validation(cfg, v, kw)
    if "dataset" in v:
        held = _nonempty(load_prompts(v["dataset"]), v["dataset"])
    else:
        frac = float(v["holdout_fraction"])
        order = list(range(len(rows)))
        random.Random(int(kw.get("seed", 42))).shuffle(order)
        n_held = max(1, round(frac * len(rows)))
        if n_held >= len(rows):
            raise ValueError(f"validation.holdout_fraction={frac} leaves no training rows out of {len(rows)}")
        held_ix = set(order[:n_held])
        held = [rows[i] for i in sorted(held_ix)]
        rows = [r for i, r in enumerate(rows) if i not in held_ix]
    _eval_settings(cfg, kw)
    return rows, held


def _eval_settings(cfg, kw: dict) -> None:
    """The evaluation / checkpoint-selection settings of the ``validation:`` section written into the trainer
    kwargs ``kw`` (an evaluation and a checkpoint every ``every_steps``; the metric to select on)."""
    v = cfg.validation
    every = v["every_steps"]
    if cfg.kind != "online":
        kw.update(
            eval_strategy="steps",
            eval_steps=every,
            save_strategy="steps",
            save_steps=every,
            metric_for_best_model="eval_loss",
            greater_is_better=False,
        )
        return
    metric = v.get("metric", "reward")
    k = int(v.get("k", kw.get("num_generations", 8)))
    kw.update(
        eval_strategy="steps",
        eval_steps=every,
        save_strategy="steps",
        save_steps=every,
        metric_for_best_model=f"eval_{metric}",
        greater_is_better=True,
        num_generations_eval=k,
    )
    kw.setdefault("per_device_eval_batch_size", k)


#: the trainer-config switches that depend on the machine (an accelerator, a logging service): a
#: dry run on another machine (a login node, a laptop) sets them to these values and says so
DEVICE_SWITCHES = {"bf16": False, "fp16": False, "use_cpu": True, "report_to": "none"}


def trainer_args(cfg, kw: dict | None = None, device_checks: bool = True):
    """The trainer config a run builds (``TiltGRPOConfig`` online, ``OfflineConfig`` offline) from the
    run config's trainer kwargs: every cross-field check of TRL / transformers / tiltlab runs here
    (loss types, clip ranges, batch divisibility). ``device_checks=False`` replaces the
    machine-dependent switches (:data:`DEVICE_SWITCHES`) so that the rest can be checked anywhere."""
    kw = dict(cfg.trainer_kwargs() if kw is None else kw)
    if not device_checks:
        kw.update(DEVICE_SWITCHES)
    if cfg.kind == "online":
        from tiltlab.llm.train.online import TiltGRPOConfig

        check_loss_type_name(cfg.objective, kw.get("loss_type"))
        kw.setdefault("remove_unused_columns", False)
        return TiltGRPOConfig(**kw)
    from tiltlab.llm.train.offline import OfflineConfig

    return OfflineConfig(**kw)


def _local_rows(cfg, notes: list[str]) -> list | None:
    """The training rows when the dataset is on this machine (a local file or a ``synthetic:`` spec), else None
    with a note; an empty dataset fails as it fails the run."""
    path = str(cfg.dataset)
    if not (path.startswith("synthetic:") or os.path.exists(path)):
        notes.append(f"dataset {path!r} is not on this machine (a hub name, or a file made later)")
        return None
    if cfg.kind == "online":
        return _nonempty(load_prompts(cfg.dataset), cfg.dataset)
    return _nonempty(list(read_table(cfg.dataset)), cfg.dataset)


def dry_run(cfg, overrides=(), resume: str | None = None) -> list[str]:
    """What ``--dry-run`` checks: everything the run checks before it loads a model. The pre-check
    (:func:`~tiltlab.llm.train.precheck.precheck`: keys, values, the tiltlab rules, DISA's labels against Stage
    1's manifest where it exists), the trainer config with the validation settings (:func:`trainer_args`:
    TRL's and transformers' checks, machine switches aside), the dataset's rows and columns where it is on this
    machine (non-empty, the validation split, DISA's log Z source, PACED's groups:
    :func:`~tiltlab.llm.train.online_rules.check_trainer_inputs`), the reward, the LoRA section and
    ``--resume``'s checkpoint. Returns the notes for what it could not check here (local files that are
    absent, the machine switches)."""

    notes: list[str] = []
    if cfg.objective == "none":
        return ["objective 'none': nothing to train; the eval section is checked by `tiltlab llm eval`"]
    precheck(cfg, overrides, notes)
    kw = cfg.trainer_kwargs()
    rows = _local_rows(cfg, notes)
    if cfg.validation:
        v = cfg.validation
        held_path = v.get("dataset")
        if held_path is not None and not os.path.exists(str(held_path)) and not str(held_path).startswith("synthetic:"):
            notes.append(
                f"validation.dataset {str(held_path)!r} is not on this machine: its rows are checked by the run"
            )
            _eval_settings(cfg, kw)
        elif rows is None and "holdout_fraction" in v:
            _eval_settings(cfg, kw)
        else:
            rows, _ = _validation(cfg, rows or [], kw)
    args = trainer_args(cfg, kw, device_checks=False)
    if cfg.kind == "online":
        resolve_reward(cfg.reward)
        check_labels(cfg, args)
        if rows is not None:
            columns = set().union(*(r.keys() for r in rows))
            has_predictor = (
                needs_frozen_log_z(cfg, args)
                and args.disa_label != "column"
                and (cfg.disa.get("stage2_dir") or "log_z" not in columns)
            )
            if has_predictor:
                _require_stage2_dir(cfg)
            check_trainer_inputs(args, columns, bool(has_predictor))
    elif rows is not None:  # the offline rows as the run prepares them (pairs, columns)
        from tiltlab.llm.train.offline import prepare_offline_rows

        _nonempty(prepare_offline_rows(rows, args.objective, args.apo_beta1), cfg.dataset)
    lora_config(cfg)
    if resume:
        resolve_checkpoint(str(resume), cfg.trl.get("output_dir", cfg.output_dir))
    changed = {k: kw[k] for k in DEVICE_SWITCHES if k in kw and kw[k] != DEVICE_SWITCHES[k]}
    if changed:
        notes.append(f"not checked on this machine: {changed} (checked when the run starts)")
    paths = {f"disa.{k}": v for k, v in cfg.disa.items() if k.endswith("_dir") and v}
    for key, path in paths.items():
        if not os.path.exists(str(path)):
            notes.append(f"{key} {str(path)!r} is not on this machine (a file made later)")
    return notes


def build_trainer(cfg):
    """Model, data, reward and trainer for a validated :class:`llm.train.config.RunConfig`."""
    from datasets import Dataset

    if cfg.objective == "none":
        raise ValueError("objective 'none' has nothing to train (use `tiltlab llm eval`)")
    if not cfg.dataset:
        raise ValueError("the config names no dataset")
    kw = cfg.trainer_kwargs()
    if cfg.kind == "online":
        from tiltlab.llm.train.online import TiltGRPOTrainer

        rows, held = _validation(cfg, _nonempty(load_prompts(cfg.dataset), cfg.dataset), kw)
        ds = online_dataset(rows)
        args = trainer_args(cfg, kw)
        log_z_fn = man = None
        needs_z = cfg.objective == "disa" or (cfg.objective == "paced" and args.paced_select_from == "disa")
        # a dataset with a precomputed log_z column needs no Stage-2 predictor
        if needs_z and args.disa_label == "column":
            man = _stage1_manifest(cfg)  # the labels are in the dataset: no Stage-2 model is loaded
        elif needs_z and (cfg.disa.get("stage2_dir") or "log_z" not in ds.column_names):
            log_z_fn, man = _disa_predictor(cfg)
        return TiltGRPOTrainer(
            model=cfg.model,
            reward_funcs=resolve_reward(cfg.reward),
            args=args,
            train_dataset=ds,
            eval_dataset=None if held is None else online_dataset(held),
            processing_class=load_tokenizer(cfg.model),
            log_z_fn=log_z_fn,
            log_z_manifest=man,
            peft_config=lora_config(cfg),
        )
    from tiltlab.llm.train.offline import OfflineCollator, OfflineTrainer, prepare_offline_rows

    _, held = _validation(cfg, [], kw)  # held-out rows (raw) and the eval / selection settings in kw
    args = trainer_args(cfg, kw)
    rows = _nonempty(prepare_offline_rows(read_table(cfg.dataset), args.objective, args.apo_beta1), cfg.dataset)
    if held is not None:
        held = _nonempty(prepare_offline_rows(held, args.objective, args.apo_beta1), cfg.validation["dataset"])
    tok = load_tokenizer(cfg.model, padding_side="right")
    model = load_model(cfg.model)
    peft_cfg = lora_config(cfg)
    if peft_cfg is not None:
        from peft import get_peft_model

        model = get_peft_model(model, peft_cfg)
    ref = load_model(cfg.ref_model or cfg.model)
    return OfflineTrainer(
        model=model,
        args=args,
        ref_model=ref,
        train_dataset=Dataset.from_list(rows),
        eval_dataset=None if held is None else Dataset.from_list(held),
        data_collator=OfflineCollator(tok, max_length=args.max_length),
    )


def _resume_command(args) -> str:
    """The command line that continues this run from its newest checkpoint (``--resume latest``
    replacing any ``--resume`` given)."""

    cmd = ["tiltlab", "llm", "train", "--config", args.config]
    for o in args.overrides:
        cmd += ["--set", o]
    if args.objective:
        cmd += ["--objective", args.objective]
    return shlex.join([*cmd, "--resume", "latest"])


def free_master_port() -> None:
    """A single-process run (no launcher: ``WORLD_SIZE`` unset) without ``MASTER_PORT``: set it to a port the OS
    picks. TRL's colocated vLLM rendezvous otherwise tries a fixed list (29500 first), and two runs started
    together on one machine both take 29500 (``EADDRINUSE``)."""
    if os.environ.get("MASTER_PORT") or os.environ.get("WORLD_SIZE"):
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        os.environ["MASTER_PORT"] = str(s.getsockname()[1])


def main(args) -> int:

    overrides = list(args.overrides) + ([f"objective={args.objective}"] if args.objective else [])
    cfg = read_config(args.config, overrides, loader=load_run_config)
    precheck(cfg, overrides)  # before torch / TRL / vLLM load: a mistyped key or value fails in a second
    if args.dry_run:
        notes = dry_run(
            cfg, overrides, args.resume
        )  # a config the run would refuse raises here: exit 2 with its one line
        print(json.dumps(dataclasses.asdict(cfg), indent=2, default=str))
        for n in notes:
            print(f"[dry-run] {n}", file=sys.stderr)
        print(
            "[dry-run] the run config, the trainer config, the data on this machine, the reward and LoRA are valid",
            file=sys.stderr,
        )
        return 0
    # transformers' Trainer never reads TrainingArguments.resume_from_checkpoint: honour it here
    resume = args.resume or cfg.trl.get("resume_from_checkpoint")
    checkpoint = resolve_checkpoint(str(resume), cfg.trl.get("output_dir", cfg.output_dir)) if resume else None
    free_master_port()
    print(f"[train] {cfg.kind} {cfg.objective} on {cfg.model}: building the trainer", flush=True)
    trainer = build_trainer(cfg)
    from tiltlab.llm.train.stop import GracefulStop

    stop = GracefulStop()  # SIGTERM / SIGINT: a checkpoint at the next step boundary on every rank
    trainer.add_callback(stop)
    if checkpoint:
        print(f"[train] resuming from {checkpoint}", flush=True)
    trainer.train(resume_from_checkpoint=checkpoint)
    steps = trainer.state.global_step
    out = trainer.args.output_dir
    if trainer.is_world_process_zero():
        write_results(trainer, out)
    if stop.stopped_by is not None and steps < trainer.state.max_steps:
        if not trainer.is_world_process_zero():
            return 0
        print(
            f"[train] stopped by {stop.stopped_by} at step {steps} of {trainer.state.max_steps}; "
            f"checkpoint {os.path.join(out, f'checkpoint-{steps}')}; continue with: {_resume_command(args)}"
            + (" (under the same launcher)" if trainer.args.world_size > 1 else ""),
            flush=True,
        )
        return 0
    if steps == 0:
        raise RuntimeError("training ran 0 optimizer steps (check max_steps / the dataset size); no model written")
    trainer.save_model(out)
    trainer.save_state()  # trainer_state.json beside the model: the log history (losses, times per step)
    print(f"[train] {steps} optimizer steps; model written to {out}")
    if cfg.validation:
        _write_best(trainer, out)
    return 0


STEP_KEYS = (
    "loss", "grad_norm", "learning_rate", "reward", "kl_ref", "kl_ref_seq", "entropy", "residual",
    "residual/abs_p50", "residual/abs_p90", "residual/abs_max", "residual/pos_frac", "residual/flip_frac",
    "residual/after_abs_mean", "residual/after_over_before", "log_z/mean", "log_z/std", "clip_frac",
    "kl_in_reward/kl", "step_time",
)  # fmt: skip
"""The per-step diagnostics ``results.json`` keeps (those a step logged; TRL's full log is trainer_state.json)."""


def write_results(trainer, out_dir: str) -> str:
    """``results.json`` in the run directory: per logged training step the diagnostics of :data:`STEP_KEYS`,
    every evaluation's metrics, and the training-health warnings (:class:`~tiltlab.llm.train.health.
    HealthMonitor`: ``{"step", "kind", "message"}``; empty when none was given). Written atomically."""
    hist = trainer.state.log_history
    steps = [{"step": h["step"], **{k: h[k] for k in STEP_KEYS if k in h}} for h in hist if "loss" in h]
    evals = [{k: v for k, v in h.items() if k == "step" or k.startswith("eval_")} for h in hist if "eval_loss" in h]
    health = getattr(trainer, "health", None)
    rec = {
        "objective": trainer.args.objective,
        "global_step": trainer.state.global_step,
        "max_steps": trainer.state.max_steps,
        "steps": steps,
        "evals": evals,
        "warnings": list(health.warnings) if health is not None else [],
    }
    path = os.path.join(out_dir, "results.json")
    os.makedirs(out_dir, exist_ok=True)
    write_json(path, rec, indent=1, newline=False)
    return path


def _write_best(trainer, out_dir: str) -> None:
    """``best_checkpoint.json`` in the run directory: the checkpoint with the best validation metric."""

    st, name = trainer.state, trainer.args.metric_for_best_model
    evals = [(h["step"], h[name]) for h in st.log_history if name in h]
    rec = {"best_checkpoint": st.best_model_checkpoint, "metric": name, "best_metric": st.best_metric, "evals": evals}
    path = os.path.join(out_dir, "best_checkpoint.json")
    write_json(path, rec, indent=2, newline=False)
    print(f"[train] best {name} = {st.best_metric} at {st.best_model_checkpoint} ({path})")
