"""The configuration of :class:`~tiltlab.llm.train.online.TiltGRPOTrainer`: :class:`TiltGRPOConfig`
(TRL's ``GRPOConfig`` plus the objective and its options, each checked at construction) and the
tables of what each objective implements."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from trl import GRPOConfig

from tiltlab.objectives.catalog import (
    TB_OPTIONS,
    check_knobs,
    default_logprob_scale,
    describe,
    knob_fields,
    names,
    options_dataclass,
    refuse_old_names,
)

from ..health import bounds_of
from ..vllm_sync import cpu_trainer_bf16


def objectives() -> tuple[str, ...]:
    """The objectives the TRL trainer runs: the declared names with trainer ``online``."""
    return names("online")


def grpo_family() -> tuple[str, ...]:
    """The objectives that honour TRL's ``off_policy_mask_threshold`` (DeepSeek-V3.2's off-policy
    sequence mask): tag ``off_policy_mask``."""
    return names("online", tag="off_policy_mask")


def bias_corrected_kl() -> tuple[str, ...]:
    """The objectives whose KL term is TRL's per-token one and honours ``use_bias_correction_kl`` (the
    KL times the importance ratio): tag ``bias_corrected_kl``; ``gspo`` and ``lad`` add a token-mean KL
    and refuse it when ``beta != 0``."""
    return names("online", tag="bias_corrected_kl")


def kl_in_reward() -> tuple[str, ...]:
    """The objectives that implement ``kl_in_reward`` (TRL's ``beta`` as the sequence-level k1 penalty
    in the reward): tag ``kl_in_reward``."""
    return names("online", tag="kl_in_reward")


def tb_family() -> tuple[str, ...]:
    """The trajectory-balance objectives (family ``tb``): a transformed reward, log Z, the TB weight."""
    return names("online", family="tb")


def needs_ref() -> tuple[str, ...]:
    """The objectives that read pi_ref's log-probs even at TRL's ``beta = 0`` (tag ``needs_ref``)."""
    return names("online", tag="needs_ref")


def loss_types(objective: str) -> tuple[str, ...]:
    """TRL ``loss_type`` values ``objective`` implements with TRL's normalization (the first is the
    default): ``grpo``'s and ``gspo``'s, and an objective tagged ``trl_loss_type`` is its own loss type;
    the other objectives define their own per-sequence mean and take no ``loss_type``."""
    if objective in names(tag="trl_loss_type"):
        return (objective,)
    return _GRPO_LOSS_TYPES.get(objective, ())


_GRPO_LOSS_TYPES = {"grpo": ("dapo", "grpo", "bnpo", "dr_grpo"), "gspo": ("grpo",)}
TRL_ADVANTAGE_EPS = 1e-4
"""TRL's ``eps`` in ``(r - mean) / (std + eps)`` (``GRPOTrainer._generate_and_score_completions``)."""
ADV_SCALE = {"group": "std", "batch": "batch", "none": "none"}
"""TRL ``scale_rewards`` -> :func:`~tiltlab.objectives.pg.group_advantages` ``scale``."""
REWARD_TRANSFORMS = ("affine", "identity", "group_norm")
IS_LEVEL = {
    "grpo": "token",
    "gspo": "sequence",
    "cispo": "token",
    "sapo": "token",
    "luspo": "sequence",
    "vespo": "token",
}
"""TRL ``importance_sampling_level`` of the ratio each objective uses (GSPO and LUSPO: sequence)."""


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
        if self.objective not in objectives():
            raise ValueError(f"objective must be one of {objectives()}, got {self.objective!r}")
        self._check_trl_options()
        if self.reward_transform is None:
            self.reward_transform = "group_norm" if self.objective == "flowrl" else "affine"
        if self.reward_transform == "identity":
            self.reward_transform, self.reward_scale, self.reward_shift = "affine", 1.0, 0.0
        if not self.reward_scale > 0:
            raise ValueError(f"reward_scale (a in r~ = a r + c) must be > 0, got {self.reward_scale}")
        if self.reward_transform not in REWARD_TRANSFORMS:
            raise ValueError(f"reward_transform must be one of {REWARD_TRANSFORMS}, got {self.reward_transform!r}")
        if self.logprob_scale is None:
            self.logprob_scale = default_logprob_scale(self.objective)
        for option in TB_OPTIONS:
            option.check(getattr(self, option.name))
        check_knobs(self, "online")
        if self.lad_eta <= 0 or self.paced_kl_coef <= 0 or self.tilt_beta <= 0:
            raise ValueError("lad_eta, paced_kl_coef and tilt_beta must be > 0")
        if self.disa_label not in ("predictor", "column"):
            raise ValueError(f"disa_label must be predictor | column, got {self.disa_label!r}")
        if self.dynamic_sampling_max_refills < 0:
            raise ValueError("dynamic_sampling_max_refills must be >= 0")
        if not 0.0 <= self.paced_tau <= 1.0:
            raise ValueError("paced_tau must lie in [0, 1]")
        bounds_of(self)  # the health_* bounds, one line each when out of range
        if self.objective in needs_ref() and self.beta != 0.0:
            # the TB losses have no KL-to-reference term: a TRL beta would be silently ignored
            raise ValueError(
                f"objective={self.objective!r} has no KL-to-reference term, so TRL's beta (its KL coefficient) would "
                f"be ignored: leave it at 0 (got {self.beta}); the tilt is tilt_beta"
            )
        if self.use_liger_kernel:
            raise ValueError("use_liger_kernel bypasses _compute_loss; the tiltlab objectives need it off")

    def _check_trl_options(self) -> None:
        """Resolve ``loss_type`` / ``importance_sampling_level`` per objective and refuse every TRL
        loss option the objectives do not implement: a value the trainer cannot honour is an error."""
        obj = self.objective
        types = loss_types(obj)
        if self.loss_type is None:
            self.loss_type = types[0] if types else None
        elif self.loss_type not in types:
            hint = f"; for TRL's loss_type={self.loss_type!r} set objective={self.loss_type!r}"
            raise ValueError(
                f"objective={obj!r} implements loss_type in {types or '(none: leave it unset)'}, got "
                f"{self.loss_type!r}{hint if self.loss_type in names(tag='trl_loss_type') else ''}"
            )
        level = IS_LEVEL.get(obj)
        if self.importance_sampling_level is None:
            self.importance_sampling_level = level or "token"
        elif self.importance_sampling_level != level:
            raise ValueError(
                f"objective={obj!r} uses importance_sampling_level={level!r} ({IS_LEVEL}), "
                f"got {self.importance_sampling_level!r}"
            )
        unsupported = {
            "delta": self.delta is not None,
            "top_entropy_quantile": self.top_entropy_quantile != 1.0,
            "entropy_coef": self.entropy_coef != 0.0 or self.use_adaptive_entropy,
        }
        bad = [k for k, v in unsupported.items() if v]
        if bad:
            raise ValueError(f"the tiltlab objectives do not implement TRL's {bad}; leave them at TRL's defaults")
        if self.kl_estimator not in ("k1", "k2", "k3"):
            raise ValueError(f"kl_estimator must be k1 | k2 | k3, got {self.kl_estimator!r}")
        if obj != "grpo" and (
            self.dual_clip is not None or self.log_ratio_clip is not None or self.kl_estimator != "k3"
        ):
            raise ValueError("dual_clip, log_ratio_clip and kl_estimator != 'k3' are options of objective='grpo'")
        if self.kl_in_reward:
            self._check_kl_in_reward()
        if obj == "cispo" and self.epsilon_high is None:
            raise ValueError(
                "objective='cispo' caps the importance ratio at epsilon_high (ScaleRL's eps_max; TRL recommends 5.0): "
                "set it (TRL would fall back to epsilon)"
            )
        if self.off_policy_mask_threshold is not None and obj not in grpo_family():
            raise ValueError(
                f"off_policy_mask_threshold is implemented by objective in {grpo_family()} only, got objective={obj!r}"
            )
        if obj in ("gspo", "lad") and self.beta != 0.0 and self.use_bias_correction_kl:
            raise ValueError(
                f"objective={obj!r} does not implement use_bias_correction_kl (objectives that do: "
                f"{bias_corrected_kl()}); set it False (or beta=0)"
            )

    def _check_kl_in_reward(self) -> None:
        if self.objective not in kl_in_reward():
            raise ValueError(
                f"kl_in_reward is implemented by objective in {kl_in_reward()} only, got objective={self.objective!r}"
            )
        if not self.beta > 0.0:
            raise ValueError(
                f"kl_in_reward applies beta as the KL coefficient in the reward: set beta > 0, got {self.beta}"
            )
        if self.kl_estimator != "k3":
            raise ValueError(
                "kl_in_reward replaces the per-token KL loss term that kl_estimator chooses (the reward takes the "
                f"sequence-level k1): leave kl_estimator at 'k3', got {self.kl_estimator!r}"
            )
        if self.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError(
                "kl_in_reward penalises the weighted sum of the rewards: it needs multi_objective_aggregation="
                f"'sum_then_normalize', got {self.multi_objective_aggregation!r}"
            )

    @property
    def reward_transform_spec(self) -> tuple:
        return (
            ("affine", float(self.reward_scale), float(self.reward_shift))
            if self.reward_transform == "affine"
            else ("group_norm",)
        )


refuse_old_names(TiltGRPOConfig, "TiltGRPOConfig")  # old knob names refused naming the new
