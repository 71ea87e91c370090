"""The run configuration: one YAML file per paper run (``configs/*.yaml``), one dataclass.

``tiltlab llm train --config configs/disa_qwen3_4b.yaml --set paced.tau=0.3`` reads the YAML and
applies the dotted ``--set`` overrides (values parsed as YAML). This module checks the schema
(unknown keys, objective names, section keys); it imports nothing of the LLM layer, so the
commands' ``--config`` handling (:mod:`tiltlab.llm.base.config_args`) can use it.
:func:`tiltlab.llm.train.config.load_run_config` adds the checks against the trainer configs
(:class:`~tiltlab.llm.train.online.TiltGRPOConfig`, :class:`~tiltlab.llm.train.offline.OfflineConfig`)
and the Stage-1/2 sections.

Sections (all optional except ``model``):

``kind``        ``online`` (TRL GRPOTrainer subclass) or ``offline`` (FPA setting).
``objective``   online: grpo|gspo|cispo|sapo|luspo|vespo|flowrl|disa|vargrad|lad|paced; offline:
                offrl|fpa|dpo|rpo|kto|simper|apo|sft; ``none`` = evaluate the starting model only.
``tilt_beta``   the tilt beta (MULTIPLIES the reward, DISA convention) -- a number or a name in
                ``tilt_beta_levels`` (``default``/``low``/``high`` for DISA's sensitivity runs); the
                trainer's ``tilt_beta``, Stage 1's ``stage1.tilt_beta``. TRL's KL coefficient is ``trl.beta``
                (the old top-level ``beta`` / ``beta_levels`` are refused, naming these).
``trl``         keyword arguments of the trainer's config (learning rate, batch sizes, vLLM ...).
``stage1`` / ``stage2`` / ``eval``  passed to ``tiltlab llm stage1/stage2/eval``.
``flowrl`` / ``disa`` / ``lad`` / ``paced`` / ``fpa`` / ``offrl`` / ``dpo`` / ``kto`` / ``apo``
                objective options (see :data:`SECTION_KEYS`).
``lora``        LoRA adapter (:data:`LORA_KEYS`: ``r``, ``alpha``, ``dropout``, ``target_modules``).
``validation``  periodic validation for checkpoint selection (:data:`VALIDATION_KEYS`: ``dataset`` or
                ``holdout_fraction``, ``every_steps``, ``metric``, ``k``).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tiltlab.dataclass_cli import check_field_values, did_you_mean, unknown_keys_message
from tiltlab.objectives.catalog import RENAMED, TB_OPTIONS, names, refuse_old_names, section_keys

__all__ = [
    "LORA_KEYS",
    "RENAMED_KEYS",
    "RENAMED_STAGE1_KEYS",
    "SECTION_KEYS",
    "STAGE1_KEYS",
    "VALIDATION_KEYS",
    "RunConfig",
    "apply_overrides",
    "read_run_config",
]

_TB_KEYS = {o.name: o.name for o in TB_OPTIONS if o.name != "tilt_beta"}  # the tilt is the top-level `tilt_beta:`
"""The TB family's knobs in an objective section: the declared names (the trainer-config fields of the same names)."""

#: objective option sections -> allowed keys (mapped onto trainer-config fields in ``to_trainer_kwargs``); an
#: objective's own knobs are its declared :attr:`~tiltlab.objectives.catalog.Spec.knobs` (key ``k`` -> field ``<objective>_k``)
SECTION_KEYS: dict[str, dict[str, str]] = {
    "flowrl": {
        **_TB_KEYS,
        "reward_transform": "reward_transform",
        "log_z_detach_input": "log_z_detach_input",
        "log_z_hidden": "log_z_hidden",
        "log_z_layers": "log_z_layers",
        "log_z_dropout": "log_z_dropout",
        "log_z_lr": "log_z_lr",
    },
    "disa": {
        **_TB_KEYS,
        "stage1_dir": "",
        "stage2_dir": "",
        "allow_label_mismatch": "disa_allow_label_mismatch",
        "mismatch_reason": "disa_mismatch_reason",
        "label": "disa_label",
    },
    "vargrad": {**_TB_KEYS, "reward_transform": "reward_transform"},
    "lad": section_keys("lad", "online"),
    "paced": {**section_keys("paced", "online"), "log_z_lr": "log_z_lr", "log_z_hidden": "log_z_hidden"},
    **{name: section_keys(name, "offline") for name in names("offline") if section_keys(name, "offline")},
    # read by `tiltlab llm train` itself (llm.train.cli), not mapped onto trainer-config fields
    "lora": dict.fromkeys(("r", "alpha", "dropout", "target_modules"), ""),
    "validation": dict.fromkeys(("dataset", "holdout_fraction", "every_steps", "metric", "k"), ""),
}

#: ``lora:`` keys (a PEFT ``LoraConfig``: rank, scaling alpha, dropout, module names)
LORA_KEYS = ("r", "alpha", "dropout", "target_modules")

#: ``validation:`` keys: a held-out ``dataset`` (path) or a ``holdout_fraction`` of the training set,
#: evaluated every ``every_steps`` optimizer steps with ``metric`` (e.g. mean@k) over ``k`` samples
VALIDATION_KEYS = ("dataset", "holdout_fraction", "every_steps", "metric", "k")

#: ``stage1:`` keys added for paper-scale Stage 1 (proposal sharding, context, tokenizer, template
#: options); the rest of the section is :class:`tiltlab.llm.disa.stage1.Stage1Config`'s fields
STAGE1_KEYS = (
    "tensor_parallel_size",
    "max_model_len",
    "tokenizer",
    "quantization",
    "chat_template_kwargs",
    "gpu_memory_utilization",
)


#: run-config keys renamed (old -> new): one name per knob, the tilt's everywhere ``tilt_beta``
RENAMED_KEYS = {"beta": "tilt_beta", "beta_levels": "tilt_beta_levels"}
#: ``stage1:`` keys renamed (Stage1Config's fields)
RENAMED_STAGE1_KEYS = {"beta": "tilt_beta"}
_TRL_BETA = " (the tilt multiplying the reward; TRL's KL coefficient is `trl.beta`)"


@dataclass
class RunConfig:
    """One training/evaluation run (the schema of ``configs/*.yaml``)."""

    model: str
    """Policy to start from (HF id, local path or "tiny[:seed]")."""
    kind: str = "online"
    """online (GRPOTrainer subclass) | offline (FPA setting, transformers.Trainer subclass)."""
    objective: str = "grpo"
    """The loss: a name the ``kind``'s trainer runs (``tiltlab.objectives.catalog.names("online")`` /
    ``names("offline")``); "none" = no training (eval only)."""
    ref_model: str | None = None
    """Reference policy pi_ref (default: the starting model)."""
    dataset: str | None = None
    """Training prompts (online) or (prompt, completion, reward) rows (offline): JSONL/Parquet/datasets dir."""
    reward: str = "math"
    """Reward function: math | code | auto | pkg.module:function (TRL signature)."""
    tilt_beta: Any = None
    """Tilt beta multiplying the reward (flowrl/disa/vargrad); a number or a key of tilt_beta_levels."""
    tilt_beta_levels: dict = field(default_factory=dict)
    """Named tilt values (DISA sensitivity: default/low/high)."""
    output_dir: str = "runs/run"
    """Where checkpoints, logs and the final model go."""
    lr_scale: float = 1.0
    """Multiplies trl.learning_rate (sensitivity runs)."""
    log_kl_old: bool = False
    """Log beta * KL(pi_old || pi_theta) estimates (PACED Fig. 1)."""
    log_z_accuracy_correlation: bool = False
    """Log the correlation of beta log Z_phi(x) with the measured group accuracy (PACED App. C.1)."""
    log_logprob_dynamics: bool = False
    """Offline: log mean log-probs of correct / incorrect completions each step (FPA Figs. 2-5)."""
    accelerate: str | None = None
    """Suggested accelerate config (configs/accelerate/*.yaml) for `accelerate launch`."""
    notes: str = ""
    """Free text: where the values come from."""
    trl: dict = field(default_factory=dict)
    """Trainer-config keyword arguments (TiltGRPOConfig for online, OfflineConfig for offline)."""
    stage1: dict = field(default_factory=dict)
    """Arguments of `tiltlab llm stage1` (llm.disa.stage1.Stage1Config fields)."""
    stage2: dict = field(default_factory=dict)
    """Arguments of `tiltlab llm stage2`."""
    eval: dict = field(default_factory=dict)
    """Arguments of `tiltlab llm eval` (benchmarks, k, temperature, split, ...)."""
    flowrl: dict = field(default_factory=dict)
    disa: dict = field(default_factory=dict)
    vargrad: dict = field(default_factory=dict)
    lad: dict = field(default_factory=dict)
    paced: dict = field(default_factory=dict)
    fpa: dict = field(default_factory=dict)
    offrl: dict = field(default_factory=dict)
    dpo: dict = field(default_factory=dict)
    rpo: dict = field(default_factory=dict)
    kto: dict = field(default_factory=dict)
    apo: dict = field(default_factory=dict)
    lora: dict = field(default_factory=dict)
    """LoRA adapters (peft): r, alpha, dropout, target_modules; the log Z head is trained in full."""
    validation: dict = field(default_factory=dict)
    """Periodic validation and best-checkpoint selection: dataset | holdout_fraction, every_steps, metric, k."""

    def __post_init__(self) -> None:
        if self.kind == "online" and self.log_logprob_dynamics:
            raise ValueError("log_logprob_dynamics is an offline (FPA) diagnostic")
        if self.kind == "offline" and (self.log_kl_old or self.log_z_accuracy_correlation):
            raise ValueError("log_kl_old / log_z_accuracy_correlation are online diagnostics")
        if self.kind not in ("online", "offline"):
            raise ValueError(f"kind must be 'online' or 'offline', got {self.kind!r}")
        allowed = names(self.kind)
        if self.objective != "none" and self.objective not in allowed:
            raise ValueError(
                f"objective {self.objective!r} is not an {self.kind} objective"
                f"{did_you_mean(self.objective, [*allowed, 'none'])}; choose from {allowed} or 'none'"
            )
        for name, keys in SECTION_KEYS.items():
            old = sorted(set(getattr(self, name)) & set(RENAMED))
            if old:
                raise ValueError(f"`{name}:` " + "; ".join(f"`{k}` is now `{RENAMED[k]}`" for k in old))
            unknown = set(getattr(self, name)) - set(keys)
            if unknown:
                raise ValueError(unknown_keys_message(unknown, keys, f"`{name}:`"))
        if self.validation and ("dataset" in self.validation) == ("holdout_fraction" in self.validation):
            raise ValueError("validation: give exactly one of `dataset` (a held-out file) or `holdout_fraction`")
        frac = self.validation.get("holdout_fraction")
        if frac is not None and not 0.0 < float(frac) < 1.0:
            raise ValueError(f"validation.holdout_fraction must lie in (0, 1), got {frac}")
        if self.lora and "r" not in self.lora:
            raise ValueError("lora: the rank `r` is required")
        beta = self.tilt_beta
        if beta is not None and (beta not in self.tilt_beta_levels if isinstance(beta, str) else not _is_number(beta)):
            levels = sorted(self.tilt_beta_levels)
            named = f" or a name in tilt_beta_levels ({', '.join(levels)})" if levels else ""
            raise ValueError(f"tilt_beta: expected a number{named}, got {beta!r}")
        if beta is not None and not isinstance(beta, str) and not float(beta) > 0:
            raise ValueError(f"tilt_beta must be > 0, got {beta}")
        if not self.lr_scale > 0:
            raise ValueError("lr_scale must be > 0")

    @property
    def tilt_beta_value(self) -> float | None:
        """The tilt as a number (a level name resolved through ``tilt_beta_levels``); None when unset."""
        if self.tilt_beta is None:
            return None
        if isinstance(self.tilt_beta, str):
            return float(self.tilt_beta_levels[self.tilt_beta])
        return float(self.tilt_beta)

    def trainer_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the trainer config: ``trl`` + the objective's section mapped onto
        config fields + ``tilt_beta``, ``output_dir``, ``lr_scale``."""
        kw = dict(self.trl)
        kw.setdefault("output_dir", self.output_dir)
        if self.objective != "none":
            kw["objective"] = self.objective
        sections = [self.objective]
        if self.objective == "paced" and self.paced.get("select_from") == "disa":
            sections.append("disa")
        for sec in sections:
            for k, v in getattr(self, sec, {}).items() if sec in SECTION_KEYS else []:
                target = SECTION_KEYS[sec][k]
                if target:
                    kw[target] = v
        if self.kind == "online" and self.tilt_beta_value is not None:
            kw["tilt_beta"] = self.tilt_beta_value
        if self.kind == "online":
            for flag in ("log_kl_old", "log_z_accuracy_correlation"):
                if getattr(self, flag):
                    kw[flag] = True
        elif self.log_logprob_dynamics:
            kw["log_logprob_dynamics"] = True
        if self.lr_scale != 1.0:
            kw["learning_rate"] = float(kw.get("learning_rate", 1e-6)) * self.lr_scale
        return kw


refuse_old_names(RunConfig, "RunConfig", RENAMED_KEYS, common=False)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _parse_value(text: str) -> Any:
    import yaml

    value = yaml.safe_load(text)
    if isinstance(value, str):  # YAML 1.1 reads "2e-6" as a string; numbers win
        try:
            return float(value)
        except ValueError:
            return value
    return value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """``["paced.tau=0.3", "objective=fpa"]`` -> nested update (values parsed as YAML)."""
    data = copy.deepcopy(data)
    for item in overrides or []:
        if "=" not in item:
            raise ValueError(f"--set expects key=value, got {item!r}")
        key, _, raw = item.partition("=")
        parts = key.strip().split(".")
        node = data
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ValueError(f"--set {key}: {p!r} is not a section")
        node[parts[-1]] = _parse_value(raw)
    return data


def read_run_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Read a YAML run config and apply ``--set`` overrides; checks the schema of this module only
    (:func:`tiltlab.llm.train.config.load_run_config` also checks the trainer and stage sections)."""
    import yaml

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"config {str(path)!r} does not exist")
    # libyaml's safe loader where PyYAML was built with it (the same documents, ~10x faster: the fast
    # checks read every shipped config); the pure-Python one otherwise
    data = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the top level must be a mapping")
    data = apply_overrides(data, overrides or [])
    old = [k for k in RENAMED_KEYS if k in data] + [
        f"stage1.{k}" for k in RENAMED_STAGE1_KEYS if isinstance(data.get("stage1"), dict) and k in data["stage1"]
    ]
    if old:
        table = {**RENAMED_KEYS, **{f"stage1.{k}": f"stage1.{v}" for k, v in RENAMED_STAGE1_KEYS.items()}}
        raise ValueError(f"{path}: " + "; ".join(f"`{k}` is now `{table[k]}`" for k in old) + _TRL_BETA)
    known = {f.name for f in dataclasses.fields(RunConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        sets = [o for o in overrides or [] if o.partition("=")[0].strip().split(".")[0] in unknown]
        origin = f"--set {sets[0]}" if sets else str(path)
        raise ValueError(f"{origin}: {unknown_keys_message(unknown, known, 'the run config')}")
    return RunConfig(**check_field_values(RunConfig, data))
