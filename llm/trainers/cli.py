"""``tiltlab llm train --config configs/X.yaml [--objective NAME] [--set key=value ...]``.

Online configs (``kind: online``) build :class:`llm.trainers.online.TiltGRPOTrainer`, offline
ones (``kind: offline``) :class:`llm.trainers.offline.OfflineTrainer`. Run it under
``accelerate launch --config_file configs/accelerate/<X>.yaml -m tiltlab.cli llm train ...`` for
several GPUs / nodes (``configs/README.md``). Import-light: the heavy stack loads in the handler.
"""

from __future__ import annotations

__all__ = ["add_cli", "build_trainer", "main", "online_dataset"]


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
        help="the objective, overriding the config's `objective:` (online: grpo, gspo, flowrl, disa, vargrad, "
        "lad, paced; offline: offrl, fpa, dpo, rpo, kto, simper, apo, sft)",
    )
    p.add_argument("--dry-run", action="store_true", help="validate the config and print it; do not train")
    p.set_defaults(func=main)


def _disa_predictor(cfg):
    """``(log_z_fn, stage1 manifest)`` from the config's ``disa`` section (Stage 1/2 outputs)."""
    from pathlib import Path

    man = None
    s1 = cfg.disa.get("stage1_dir")
    if s1:
        from tiltlab.llm.stage1 import read_manifest

        man = read_manifest(s1)
    s2 = cfg.disa.get("stage2_dir")
    if not s2:
        raise ValueError(
            "objective 'disa' needs disa.stage2_dir (the Stage-2 regressor written by `tiltlab llm stage2`)"
        )
    from tiltlab.llm.stage2 import load_log_z_predictor

    log_z_fn = load_log_z_predictor(Path(s2))  # callable: chat message lists or raw prompts -> [N]
    return log_z_fn, man


def online_dataset(rows, chat_template: bool = True):
    """The online trainer's ``datasets.Dataset``: the rows with ``prompt`` in the form TRL renders
    into :func:`tiltlab.llm.prompts.format_prompt`'s text (the string Stage 1 labelled)."""
    from datasets import Dataset

    from tiltlab.llm.prompts import training_prompt

    return Dataset.from_list([{**r, "prompt": training_prompt(r["prompt"], chat_template)} for r in rows])


def _nonempty(rows: list, dataset) -> list:
    """The training rows, or a ``ValueError`` when there are none (a run of 0 steps would still
    write a model)."""
    if not rows:
        raise ValueError(
            f"dataset {str(dataset)!r} has no rows: nothing to train on; point `dataset:` at a non-empty file"
        )
    return rows


def build_trainer(cfg):
    """Model, data, reward and trainer for a validated :class:`llm.trainers.config.RunConfig`."""
    from datasets import Dataset

    from tiltlab.llm.data import load_prompts
    from tiltlab.llm.models import load_model, load_tokenizer
    from tiltlab.llm.rewards import resolve_reward

    if cfg.objective == "none":
        raise ValueError("objective 'none' has nothing to train (use `tiltlab llm eval`)")
    if not cfg.dataset:
        raise ValueError("the config names no dataset")
    kw = cfg.trainer_kwargs()
    if cfg.kind == "online":
        from tiltlab.llm.trainers.online import TiltGRPOConfig, TiltGRPOTrainer

        ds = online_dataset(_nonempty(load_prompts(cfg.dataset), cfg.dataset))
        kw.setdefault("remove_unused_columns", False)
        args = TiltGRPOConfig(**kw)
        log_z_fn = man = None
        if cfg.objective == "disa" or (cfg.objective == "paced" and args.paced_select_from == "disa"):
            log_z_fn, man = _disa_predictor(cfg)
        return TiltGRPOTrainer(
            model=cfg.model,
            reward_funcs=resolve_reward(cfg.reward),
            args=args,
            train_dataset=ds,
            processing_class=load_tokenizer(cfg.model),
            log_z_fn=log_z_fn,
            log_z_manifest=man,
        )
    from tiltlab.llm.data import read_table
    from tiltlab.llm.trainers.offline import OfflineCollator, OfflineConfig, OfflineTrainer, prepare_offline_rows

    args = OfflineConfig(**kw)
    rows = _nonempty(prepare_offline_rows(read_table(cfg.dataset), args.objective, args.apo_beta1), cfg.dataset)
    tok = load_tokenizer(cfg.model, padding_side="right")
    model = load_model(cfg.model)
    ref = load_model(cfg.ref_model or cfg.model)
    return OfflineTrainer(
        model=model,
        args=args,
        ref_model=ref,
        train_dataset=Dataset.from_list(rows),
        data_collator=OfflineCollator(tok, max_length=args.max_length),
    )


def main(args) -> int:
    import dataclasses
    import json

    from tiltlab.llm.config_args import read_config
    from tiltlab.llm.trainers.config import load_run_config

    overrides = list(args.overrides) + ([f"objective={args.objective}"] if args.objective else [])
    cfg = read_config(args.config, overrides, loader=load_run_config)
    if args.dry_run:
        print(json.dumps(dataclasses.asdict(cfg), indent=2, default=str))
        return 0
    print(f"[train] {cfg.kind} {cfg.objective} on {cfg.model}: building the trainer", flush=True)
    trainer = build_trainer(cfg)
    trainer.train()
    steps = trainer.state.global_step
    if steps == 0:
        raise RuntimeError("training ran 0 optimizer steps (check max_steps / the dataset size); no model written")
    trainer.save_model(cfg.output_dir)
    print(f"[train] {steps} optimizer steps; model written to {cfg.output_dir}")
    return 0
