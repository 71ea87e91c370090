"""The rules of :class:`~tiltlab.llm.train.online.TiltGRPOConfig` that need no torch / TRL: the tables of what
each objective implements and the checks of its options (:func:`check_options`, which
``TiltGRPOConfig.__post_init__`` runs after TRL's own checks). Import-light, so that
:mod:`tiltlab.llm.train.precheck` runs the same checks on a run config before torch / TRL / vLLM load (on a
namespace of TRL's defaults, :mod:`tiltlab.llm.train.trl_fields`, updated with the config's values): one home
for each rule, two callers.
"""

from __future__ import annotations

from typing import Any

from tiltlab.dataclass_cli import did_you_mean
from tiltlab.objectives.catalog import TB_OPTIONS, check_knobs, default_logprob_scale, names

from .health_bounds import bounds_of

__all__ = [
    "IS_LEVEL",
    "REWARD_TRANSFORMS",
    "bias_corrected_kl",
    "check_kl_in_reward",
    "check_options",
    "check_trainer_inputs",
    "check_trl_options",
    "grpo_family",
    "kl_in_reward",
    "loss_types",
    "needs_ref",
    "objectives",
    "reward_transform_spec",
    "tb_family",
]


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


def check_options(c: Any) -> None:
    """Check (and resolve the per-objective defaults of) a trainer config's tiltlab options: ``c`` is a
    :class:`~tiltlab.llm.train.online.TiltGRPOConfig` after TRL's ``__post_init__``, or the pre-check's
    namespace of the same fields. A value the trainer cannot honour is a one-line ``ValueError``."""
    if c.objective not in objectives():
        raise ValueError(
            f"objective must be one of {objectives()}, got {c.objective!r}{did_you_mean(str(c.objective), objectives())}"
        )
    check_trl_options(c)
    if c.reward_transform is None:
        c.reward_transform = "group_norm" if c.objective == "flowrl" else "affine"
    if c.reward_transform == "identity":
        c.reward_transform, c.reward_scale, c.reward_shift = "affine", 1.0, 0.0
    if not c.reward_scale > 0:
        raise ValueError(f"reward_scale (a in r~ = a r + c) must be > 0, got {c.reward_scale}")
    if c.reward_transform not in REWARD_TRANSFORMS:
        raise ValueError(
            f"reward_transform must be one of {REWARD_TRANSFORMS}, got {c.reward_transform!r}"
            f"{did_you_mean(str(c.reward_transform), [*REWARD_TRANSFORMS, 'identity'])}"
        )
    if c.logprob_scale is None:
        c.logprob_scale = default_logprob_scale(c.objective)
    for option in TB_OPTIONS:
        option.check(getattr(c, option.name))
    check_knobs(c, "online")
    if c.lad_eta <= 0 or c.paced_kl_coef <= 0 or c.tilt_beta <= 0:
        raise ValueError("lad_eta, paced_kl_coef and tilt_beta must be > 0")
    if c.disa_label not in ("predictor", "column"):
        raise ValueError(
            f"disa_label must be predictor | column, got {c.disa_label!r}"
            f"{did_you_mean(str(c.disa_label), ('predictor', 'column'))}"
        )
    if c.dynamic_sampling_max_refills < 0:
        raise ValueError("dynamic_sampling_max_refills must be >= 0")
    if not 0.0 <= c.paced_tau <= 1.0:
        raise ValueError("paced_tau must lie in [0, 1]")
    bounds_of(c)  # the health_* bounds, one line each when out of range
    if c.objective in needs_ref() and c.beta != 0.0:
        # the TB losses have no KL-to-reference term: a TRL beta would be silently ignored
        raise ValueError(
            f"objective={c.objective!r} has no KL-to-reference term, so TRL's beta (its KL coefficient) would "
            f"be ignored: leave it at 0 (got {c.beta}); the tilt is tilt_beta"
        )
    if c.use_liger_kernel:
        raise ValueError("use_liger_kernel bypasses _compute_loss; the tiltlab objectives need it off")


def check_trl_options(c: Any) -> None:
    """Resolve ``loss_type`` / ``importance_sampling_level`` per objective and refuse every TRL
    loss option the objectives do not implement: a value the trainer cannot honour is an error."""
    obj = c.objective
    types = loss_types(obj)
    if c.loss_type is None:
        c.loss_type = types[0] if types else None
    elif c.loss_type not in types:
        hint = f"; for TRL's loss_type={c.loss_type!r} set objective={c.loss_type!r}"
        raise ValueError(
            f"objective={obj!r} implements loss_type in {types or '(none: leave it unset)'}, got "
            f"{c.loss_type!r}{hint if c.loss_type in names(tag='trl_loss_type') else ''}"
        )
    level = IS_LEVEL.get(obj)
    if c.importance_sampling_level is None:
        c.importance_sampling_level = level or "token"
    elif c.importance_sampling_level != level:
        raise ValueError(
            f"objective={obj!r} uses importance_sampling_level={level!r} ({IS_LEVEL}), "
            f"got {c.importance_sampling_level!r}"
        )
    unsupported = {
        "delta": c.delta is not None,
        "top_entropy_quantile": c.top_entropy_quantile != 1.0,
        "entropy_coef": c.entropy_coef != 0.0 or c.use_adaptive_entropy,
    }
    bad = [k for k, v in unsupported.items() if v]
    if bad:
        raise ValueError(f"the tiltlab objectives do not implement TRL's {bad}; leave them at TRL's defaults")
    if c.kl_estimator not in ("k1", "k2", "k3"):
        raise ValueError(
            f"kl_estimator must be k1 | k2 | k3, got {c.kl_estimator!r}{did_you_mean(str(c.kl_estimator), ('k1', 'k2', 'k3'))}"
        )
    if obj != "grpo" and (c.dual_clip is not None or c.log_ratio_clip is not None or c.kl_estimator != "k3"):
        raise ValueError("dual_clip, log_ratio_clip and kl_estimator != 'k3' are options of objective='grpo'")
    if c.kl_in_reward:
        check_kl_in_reward(c)
    if obj == "cispo" and c.epsilon_high is None:
        raise ValueError(
            "objective='cispo' caps the importance ratio at epsilon_high (ScaleRL's eps_max; TRL recommends 5.0): "
            "set it (TRL would fall back to epsilon)"
        )
    if c.off_policy_mask_threshold is not None and obj not in grpo_family():
        raise ValueError(
            f"off_policy_mask_threshold is implemented by objective in {grpo_family()} only, got objective={obj!r}"
        )
    if obj in ("gspo", "lad") and c.beta != 0.0 and c.use_bias_correction_kl:
        raise ValueError(
            f"objective={obj!r} does not implement use_bias_correction_kl (objectives that do: "
            f"{bias_corrected_kl()}); set it False (or beta=0)"
        )


def check_kl_in_reward(c: Any) -> None:
    if c.objective not in kl_in_reward():
        raise ValueError(
            f"kl_in_reward is implemented by objective in {kl_in_reward()} only, got objective={c.objective!r}"
        )
    if not c.beta > 0.0:
        raise ValueError(f"kl_in_reward applies beta as the KL coefficient in the reward: set beta > 0, got {c.beta}")
    if c.kl_estimator != "k3":
        raise ValueError(
            "kl_in_reward replaces the per-token KL loss term that kl_estimator chooses (the reward takes the "
            f"sequence-level k1): leave kl_estimator at 'k3', got {c.kl_estimator!r}"
        )
    if c.multi_objective_aggregation != "sum_then_normalize":
        raise ValueError(
            "kl_in_reward penalises the weighted sum of the rewards: it needs multi_objective_aggregation="
            f"'sum_then_normalize', got {c.multi_objective_aggregation!r}"
        )


def check_trainer_inputs(args: Any, columns, has_log_z_fn: bool) -> None:
    """What :class:`~tiltlab.llm.train.online.TiltGRPOTrainer` checks of its inputs beyond its config: PACED's
    whole groups per process, and a source of DISA's frozen log Z (a Stage-2 predictor, ``has_log_z_fn``, or a
    ``log_z`` dataset column among ``columns``). ``args``: the (resolved) trainer config."""
    obj = args.objective
    if obj == "paced":
        g = args.num_generations
        gen_local = args.per_device_train_batch_size * args.steps_per_generation
        if gen_local % g:
            raise ValueError(
                f"objective='paced' selects whole groups per process: per_device_train_batch_size * "
                f"steps_per_generation = {gen_local} must be a multiple of num_generations = {g}"
            )
        if args.paced_select_from == "disa" and not has_log_z_fn and "log_z" not in columns:
            raise ValueError("paced_select_from='disa' needs log_z_fn (the Stage-2 predictor) or a 'log_z' column")
    uses_frozen = obj == "disa" or (obj == "paced" and args.paced_select_from == "disa")
    if uses_frozen and args.disa_label == "column" and "log_z" not in columns:
        raise ValueError(
            "disa.label=column needs a 'log_z' column in the dataset: write it with "
            "`tiltlab llm stage2-annotate --stage2-dir STAGE2 --dataset DATA --out DATA_WITH_LOG_Z.jsonl`"
        )
    if obj == "disa" and not has_log_z_fn and "log_z" not in columns:
        raise ValueError("objective='disa' needs log_z_fn (Stage-2 predict_log_z) or a 'log_z' dataset column")


def reward_transform_spec(c: Any) -> tuple:
    """The reward transform as the Stage-1 manifest records it: ``("affine", a, c)`` or ``("group_norm",)``."""
    return (
        ("affine", float(c.reward_scale), float(c.reward_shift)) if c.reward_transform == "affine" else ("group_norm",)
    )
