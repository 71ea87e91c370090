"""The configuration of :class:`~tiltlab.llm.train.online.TiltGRPOTrainer`: :class:`TiltGRPOConfig`
(TRL's ``GRPOConfig`` plus the objective and its options, each checked at construction) and the
tables of what each objective implements (whose rules live, import-light, in :mod:`tiltlab.llm.train.online_rules`
so that the run-config pre-check runs them before torch / TRL load; re-exported here)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from trl import GRPOConfig

from tiltlab.objectives.catalog import TB_OPTIONS, describe, knob_fields, options_dataclass, refuse_old_names

from ..online_rules import (  # noqa: F401  (re-exported: the tables' public place stays this module)
    _GRPO_LOSS_TYPES,
    IS_LEVEL,
    REWARD_TRANSFORMS,
    bias_corrected_kl,
    check_options,
    grpo_family,
    kl_in_reward,
    loss_types,
    needs_ref,
    objectives,
    reward_transform_spec,
    tb_family,
)
from ..vllm_sync import cpu_trainer_bf16

TRL_ADVANTAGE_EPS = 1e-4
"""TRL's ``eps`` in ``(r - mean) / (std + eps)`` (``GRPOTrainer._generate_and_score_completions``)."""
ADV_SCALE = {"group": "std", "batch": "batch", "none": "none"}
"""TRL ``scale_rewards`` -> :func:`~tiltlab.objectives.pg.group_advantages` ``scale``."""

_TBOptions = options_dataclass("_TBOptions", TB_OPTIONS)
"""The TB family's declared knobs (:data:`~tiltlab.objectives.catalog.TB_OPTIONS`) as dataclass fields."""

_ObjectiveKnobs = options_dataclass("_ObjectiveKnobs", knob_fields("online"))
"""The declared objectives' own knobs the TRL trainer reads (``lad_*``, ``paced_*``:
:func:`~tiltlab.objectives.catalog.knob_fields` of ``online``) as dataclass fields."""


@dataclass
class TiltGRPOConfig(GRPOConfig, _TBOptions, _ObjectiveKnobs):
    """``GRPOConfig`` plus the objective. TRL's ``beta`` stays TRL's KL-to-reference coefficient
    (used by ``grpo``/``gspo``/``lad``: a per-token loss term, or with ``kl_in_reward`` the
    sequence-level penalty in the reward of ``grpo``); the tilt of the TB objectives is
    ``tilt_beta`` and MULTIPLIES the reward (DISA convention); PACED's ``exp(r / beta)`` is
    ``paced_kl_coef``. The TB family's knobs (``tilt_beta``, ``reward_scale``, ``reward_shift``,
    ``logprob_scale``, ``weight_clip``, ``max_weight``, ``weight_eps``, ``weight_eps_high``) are the
    fields of :data:`~tiltlab.objectives.catalog.TB_OPTIONS`, under the names the registry and the veRL
    plug-in use; an old name (``length_normalize``) is refused naming the new one. The objectives' own
    knobs (``lad_eta``, ``lad_divergence``, ``lad_level``, ``paced_*``) are the fields of their
    :attr:`~tiltlab.objectives.catalog.Spec.knobs` (``<objective>_<knob>``)."""

    objective: str = field(default="grpo", metadata={"help": f"one of {describe('online')}"})
    loss_type: str | None = field(  # type: ignore[assignment]  # TRL's field, default resolved per objective
        default=None,
        metadata={
            "help": f"TRL's loss normalization: {_GRPO_LOSS_TYPES}; default dapo (grpo), grpo (gspo), the objective's "
            "name (cispo/sapo/luspo/vespo); unset otherwise"
        },
    )
    importance_sampling_level: str | None = field(
        default=None, metadata={"help": f"TRL's ratio level, fixed by the objective: {IS_LEVEL}; unset otherwise"}
    )
    kl_estimator: str = field(default="k3", metadata={"help": "KL-to-reference estimator of grpo: k1 | k2 | k3 (TRL)"})
    kl_in_reward: bool = field(
        default=False,
        metadata={
            "help": "grpo: apply beta as the sequence-level k1 penalty in the reward, r - beta * sum_t (logp_old - "
            "logp_ref), before the advantages (KL-regularised RLHF; veRL's use_kl_in_reward), instead of TRL's "
            "per-token KL loss term: its optimum is pi_ref e^{r / beta} / Z"
        },
    )
    dual_clip: float | None = field(default=None, metadata={"help": "grpo: veRL's dual-clip constant c > 1 (A < 0)"})
    log_ratio_clip: float | None = field(
        default=None, metadata={"help": "grpo: clamp logp - logp_old to [-c, c] before exp (veRL: 20)"}
    )
    reward_transform: str | None = field(
        default=None,
        metadata={
            "help": "r~ of the TB objectives: affine (r~ = reward_scale * r + reward_shift; "
            "'identity' = affine(1, 0)) | group_norm (the per-group plug-in). Default: "
            "group_norm for flowrl, affine for disa/vargrad/paced"
        },
    )
    log_z_detach_input: bool = field(
        default=False, metadata={"help": "stop log-Z gradients at the pooled hidden state"}
    )
    log_z_hidden: int = field(default=256, metadata={"help": "width of the log Z head"})
    log_z_layers: int = field(default=3, metadata={"help": "Linear layers of the log Z head (FlowRL: 3)"})
    log_z_dropout: float = field(default=0.1, metadata={"help": "dropout in the log Z head (FlowRL: 0.1)"})
    vllm_kv_cache_memory_bytes: int | None = field(
        default=None,
        metadata={
            "help": "KV cache of the colocated vLLM on CPU, in bytes (default 1 GiB); GPUs use "
            "vllm_gpu_memory_utilization"
        },
    )
    log_z_lr: float | None = field(
        default=None, metadata={"help": "learning rate of the log Z head (None = learning_rate)"}
    )
    disa_stage1_manifest: dict | None = field(
        default=None, metadata={"help": "Stage-1 recorded settings (beta, reward_transform, logprob_scale)"}
    )
    disa_label: str = field(
        default="predictor",
        metadata={
            "help": "where DISA's frozen log Z comes from: predictor (log_z_fn, the Stage-2 model loaded on every "
            "process) | column (the dataset's log_z column written by `tiltlab llm stage2-annotate`; no second model)"
        },
    )
    disa_allow_label_mismatch: bool = field(default=False, metadata={"help": "override the label-compat check"})
    disa_mismatch_reason: str | None = field(default=None, metadata={"help": "why the override is sound"})
    dynamic_sampling: bool = field(
        default=False,
        metadata={
            "help": "DAPO dynamic sampling (DAPO Sec. 3.2): drop groups whose rewards are all equal and refill "
            "the batch from further generations"
        },
    )
    dynamic_sampling_max_refills: int = field(
        default=8, metadata={"help": "at most this many extra generation rounds per batch (then train on what is kept)"}
    )
    log_kl_old: bool = field(
        default=False, metadata={"help": "log KL(pi_old || pi_theta) (and times paced_kl_coef), PACED Fig. 1"}
    )
    log_z_accuracy_correlation: bool = field(
        default=False,
        metadata={
            "help": "log Pearson/Spearman correlation of the log Z used by the objective with the group accuracy "
            "(PACED App. C.1)"
        },
    )

    log_residual_flips: bool = field(
        default=True,
        metadata={
            "help": "TB objectives: after each optimizer step, score the step's last micro-batch again (one forward "
            "pass) and log the share of residuals whose sign changed and |residual| after / before (overshoot)"
        },
    )
    health_patience: int = field(
        default=3, metadata={"help": "consecutive logged steps (evaluations) over a bound before a one-line warning"}
    )
    health_residual_factor: float = field(
        default=3.0, metadata={"help": "warn when mean |TB residual| exceeds this times its first step's value"}
    )
    health_grad_norm_factor: float = field(
        default=10.0,
        metadata={"help": "warn when the gradient norm (before clipping) exceeds this times its first step's"},
    )
    health_kl_bound: float | None = field(
        default=None,
        metadata={
            "help": "warn when the sequence KL(pi || pi_ref) exceeds this; default (None): tilt_beta x reward_scale "
            "for disa / flowrl / vargrad with an affine reward transform (no tilted target is further from pi_ref)"
        },
    )
    health_flip_frac: float = field(
        default=0.5,
        metadata={
            "help": "warn when more than this share of residuals changes sign in an update (or |residual| grows)"
        },
    )

    def __post_init__(self) -> None:
        # before TRL resolves an unset bf16 to True: on CPU with vLLM the trainer must score in vLLM's fp32
        self.bf16 = cpu_trainer_bf16(
            self.bf16, bool(self.fp16), bool(self.use_vllm), bool(self.use_cpu) or not torch.cuda.is_available()
        )
        super().__post_init__()
        check_options(self)  # the tiltlab rules (llm/train/online_rules.py: also run by the pre-check)

    @property
    def reward_transform_spec(self) -> tuple:
        return reward_transform_spec(self)


refuse_old_names(TiltGRPOConfig, "TiltGRPOConfig")  # old knob names refused naming the new
