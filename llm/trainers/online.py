"""Online RL on TRL's ``GRPOTrainer``: GRPO, GSPO, CISPO, SAPO, LUSPO, VESPO, FlowRL, DISA Stage 3,
VarGrad, LAD, PACED.

One trainer, one ``objective`` option. TRL does the rollouts (transformers ``generate`` on CPU,
vLLM colocate/server on GPUs), the reward calls, the reference forward, the optimizer and the
distributed plumbing (accelerate: DDP, DeepSpeed, FSDP). This module only

1. adds per-completion fields in :meth:`TiltGRPOTrainer._generate_and_score_completions`, where
   whole groups are present (gathered across processes): the raw reward, the transformed reward
   ``r~`` of the TB objectives (identity, or the group-normalized plug-in), the frozen DISA
   ``log Z_psi(x)``, the batch-optimal VarGrad ``log Z``, the behaviour log-probs; PACED's prompt
   selection and replay also live there;
2. gathers current log-probs in :meth:`TiltGRPOTrainer._compute_loss` and calls the objective's
   entry of :data:`LOSSES` (one small function per objective, each calling ``objectives/``: no
   formula is written here), with TRL's vLLM importance-sampling ratio
   ``inputs["importance_sampling_ratio"]`` as a per-sequence weight
   (:func:`objectives.correction.sequence_is_weight`);
3. logs loss, reward, log Z mean/std, residual, weight-clip fraction, entropy and KL to the
   reference through TRL's metrics (so ``report_to`` sees them).

Objectives (``docs/math.md`` §1-§6):

* ``grpo``  — :func:`objectives.pg.grpo_loss` (token ratio, clip ``epsilon``/``epsilon_high``,
  KL to ref with coefficient ``beta`` = TRL's KL coefficient). With ``kl_in_reward=True`` the KL
  goes into the reward instead: ``r - beta * (log pi_old(y|x) - log pi_ref(y|x))``
  (:func:`objectives.pg.kl_in_reward`) before the advantages, recomputed here with TRL's
  ``scale_rewards`` rule, and no KL term in the loss; of the KL placements it is the one whose
  fixed point is the tilted target ``pi_ref e^{r / beta} / Z`` (``docs/math.md`` §6).
* ``gspo``  — :func:`objectives.pg.gspo_loss` (sequence ratio).
* ``cispo`` / ``sapo`` / ``luspo`` / ``vespo`` — TRL's loss types of those names
  (:func:`objectives.pg.cispo_loss` etc.) with TRL's options (``epsilon_high`` as CISPO's ratio
  cap, ``sapo_temperature_pos/neg``, ``vespo_k_pos`` ..., ``epsilon``/``epsilon_high`` as LUSPO's
  clip) and normalization.
* ``flowrl`` — :func:`objectives.tb.flowrl_loss` with a learned ``log Z`` head
  (:mod:`llm.trainers.logz_head`); coded defaults: length-normalized log-probs, group-normalized
  reward, ``tilt_beta = 15``, weight ``clamp(exp(sum log-ratio), max=10)``; the paper's
  ``[1-eps, 1+eps]`` clip via ``weight_clip="eps"``.
* ``disa``  — :func:`objectives.tb.disa_loss`: the frozen Stage-2 ``log Z_psi(x)``, no gradient,
  with the SAME reward transform, ``beta``, residual scale and prompt format as Stage 1 (checked,
  see :func:`tiltlab.llm.trainers.disa_labels.check_label_compat`).
* ``vargrad`` — TB at the per-group batch-optimal ``log Z`` (:func:`objectives.tb.vargrad_log_z`),
  computed at generation time where the whole group is present.
* ``lad``   — :func:`objectives.lad.lad_loss` with any of the six divergences, ``lad_eta``.
* ``paced`` — TB anchored on ``pi_old`` with tilt ``r / paced_kl_coef`` and a learned ``log Z``
  head; prompts selected by ``|p_hat - tau|`` (:func:`objectives.paced.select_prompts`) from the
  learned or the DISA-frozen partition function; correct samples replayed by accuracy-error
  priority (:class:`objectives.paced.ReplayBuffer`); the glue is :mod:`tiltlab.llm.trainers.paced`.

Loss normalization: ``grpo`` implements TRL's ``loss_type`` values ``dapo`` (TRL's default: the
token sum over the token count of the whole accumulation window, across processes), ``grpo``,
``bnpo`` and ``dr_grpo`` (divided by ``max_completion_length``) with TRL's normalization;
``gspo`` is TRL's ``loss_type="grpo"`` at ``importance_sampling_level="sequence"``; ``cispo``,
``sapo``, ``luspo`` and ``vespo`` are TRL's loss types of the same name (``loss_type`` defaults to
it; ``cispo``/``vespo`` normalized like ``dapo``, ``sapo`` like ``grpo``, ``luspo`` by the
sequence mean of token sums, at ``importance_sampling_level="sequence"``); the other objectives
take no ``loss_type``. Any other value, and every TRL loss option the objectives do not
implement, is refused by :class:`TiltGRPOConfig` (:data:`LOSS_TYPES`). TRL's
``off_policy_mask_threshold`` (DeepSeek-V3.2's off-policy sequence mask, from vLLM's
``sampling_per_token_logps`` when present, else ``pi_old``'s) is honoured by the GRPO family
(:data:`GRPO_FAMILY`) and refused for the others; ``use_bias_correction_kl`` is honoured where the
KL term is TRL's per-token one (:data:`BIAS_CORRECTED_KL`).

Groups and micro-batches: TRL shuffles a generation batch and splits it over gradient-
accumulation micro-batches and processes, so a group's G completions are usually NOT together in
``_compute_loss``. Every group-level quantity (group normalization, VarGrad ``log Z``, PACED's
accuracy) is therefore computed in ``_generate_and_score_completions`` on gathered tensors and
carried per completion; the losses in ``_compute_loss`` are then per-sequence and split-invariant.
The VarGrad ``log Z`` is computed from the behaviour log-probs (``logp_old``) and held fixed:
its gradient contribution is zero at the minimizer anyway (``dL/dlog Z = 0``), and on-policy
``logp = logp_old`` numerically, so the loss equals TB at the batch-optimal ``log Z``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from trl import GRPOConfig, GRPOTrainer

from tiltlab.files import atomic_path
from tiltlab.objectives.correction import kl_penalty, sequence_is_weight
from tiltlab.objectives.diagnostics import pearson, sequence_kl_old, spearman
from tiltlab.objectives.lad import F_DIVERGENCES
from tiltlab.objectives.output import LossOutput
from tiltlab.objectives.paced import ReplayBuffer
from tiltlab.objectives.pg import (
    group_advantages,
    kl_in_reward,
    masked_mean,
)
from tiltlab.objectives.registry import ObjectiveBatch, get_objective
from tiltlab.objectives.tb import (
    sequence_logprob,
    vargrad_log_z,
)
from tiltlab.objectives.transforms import affine_reward

from .disa_labels import check_label_compat
from .logz_head import attach_log_z_head, get_log_z_head, prompt_log_z
from .paced import PacedMixin
from .signal_guard import SignalGuardMixin
from .vllm_sync import cpu_colocate_llm, cpu_trainer_bf16, keep_log_z_head_out, reload_on_cpu

__all__ = [
    "BIAS_CORRECTED_KL",
    "GRPO_FAMILY",
    "KL_IN_REWARD",
    "LOSSES",
    "OBJECTIVES",
    "LossBatch",
    "TiltGRPOConfig",
    "TiltGRPOTrainer",
    "informative_groups",
]

OBJECTIVES = ("grpo", "gspo", "cispo", "sapo", "luspo", "vespo", "flowrl", "disa", "vargrad", "lad", "paced")
_TRL_LOSS_OBJECTIVES = ("cispo", "sapo", "luspo", "vespo")
GRPO_FAMILY = ("grpo", "gspo", *_TRL_LOSS_OBJECTIVES)
"""The objectives that honour TRL's ``off_policy_mask_threshold`` (DeepSeek-V3.2's off-policy sequence mask)."""
BIAS_CORRECTED_KL = ("grpo", *_TRL_LOSS_OBJECTIVES)
"""The objectives whose KL term is TRL's per-token one and honours ``use_bias_correction_kl`` (the KL times
the importance ratio); ``gspo`` and ``lad`` add a token-mean KL and refuse it when ``beta != 0``."""
KL_IN_REWARD = ("grpo",)
"""The objectives that implement ``kl_in_reward`` (TRL's ``beta`` as the sequence-level k1 penalty in the reward)."""
TRL_ADVANTAGE_EPS = 1e-4
"""TRL's ``eps`` in ``(r - mean) / (std + eps)`` (``GRPOTrainer._generate_and_score_completions``)."""
ADV_SCALE = {"group": "std", "batch": "batch", "none": "none"}
"""TRL ``scale_rewards`` -> :func:`~tiltlab.objectives.pg.group_advantages` ``scale``."""
_TB = ("flowrl", "disa", "vargrad", "paced")
_NEEDS_REF = ("flowrl", "disa", "vargrad")
_LEARNED_Z = ("flowrl", "paced")
REWARD_TRANSFORMS = ("affine", "identity", "group_norm")
LOSS_TYPES = {"grpo": ("dapo", "grpo", "bnpo", "dr_grpo"), "gspo": ("grpo",), **{o: (o,) for o in _TRL_LOSS_OBJECTIVES}}
"""TRL ``loss_type`` values each objective implements with TRL's normalization (the first is the
default); the other objectives define their own per-sequence mean and take no ``loss_type``."""
IS_LEVEL = {
    "grpo": "token",
    "gspo": "sequence",
    "cispo": "token",
    "sapo": "token",
    "luspo": "sequence",
    "vespo": "token",
}
"""TRL ``importance_sampling_level`` of the ratio each objective uses (GSPO and LUSPO: sequence)."""


@dataclass
class TiltGRPOConfig(GRPOConfig):
    """``GRPOConfig`` plus the objective. TRL's ``beta`` stays TRL's KL-to-reference coefficient
    (used by ``grpo``/``gspo``/``lad``: a per-token loss term, or with ``kl_in_reward`` the
    sequence-level penalty in the reward of ``grpo``); the tilt of the TB objectives is
    ``tilt_beta`` and MULTIPLIES the reward (DISA convention); PACED's ``exp(r / beta)`` is
    ``paced_kl_coef``."""

    objective: str = field(default="grpo", metadata={"help": f"one of {OBJECTIVES}"})
    loss_type: str | None = field(  # type: ignore[assignment]  # TRL's field, default resolved per objective
        default=None,
        metadata={
            "help": f"TRL's loss normalization: {LOSS_TYPES}; default dapo (grpo), grpo (gspo), the objective's "
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
    tilt_beta: float = field(default=15.0, metadata={"help": "beta multiplying r~ in flowrl/disa/vargrad (FlowRL: 15)"})
    reward_transform: str | None = field(
        default=None,
        metadata={
            "help": "r~ of the TB objectives: affine (r~ = reward_scale * r + reward_shift; "
            "'identity' = affine(1, 0)) | group_norm (the per-group plug-in). Default: "
            "group_norm for flowrl, affine for disa/vargrad/paced"
        },
    )
    reward_scale: float = field(default=1.0, metadata={"help": "a in the fixed transform r~ = a r + c (a > 0)"})
    reward_shift: float = field(default=0.0, metadata={"help": "c in the fixed transform r~ = a r + c"})
    length_normalize: bool | None = field(
        default=None,
        metadata={
            "help": "masked-mean (True) or sum (False) log-probs in the TB residual "
            "(default: True for flowrl, False otherwise)"
        },
    )
    weight_clip: str = field(
        default="max", metadata={"help": "TB rollout weight: max (FlowRL code) | eps (paper) | none"}
    )
    max_weight: float = field(default=10.0, metadata={"help": "cap of the TB rollout weight for weight_clip=max"})
    weight_eps: float = field(default=0.2, metadata={"help": "eps of the [1-eps, 1+eps_high] weight clip"})
    weight_eps_high: float | None = field(
        default=None, metadata={"help": "upper eps of the weight clip (None = weight_eps; FlowRL recipe: 0.28)"}
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
    lad_divergence: str = field(default="js", metadata={"help": f"one of {sorted(F_DIVERGENCES)}"})
    lad_eta: float = field(default=1.0, metadata={"help": "LAD temperature eta"})
    lad_level: str = field(default="token", metadata={"help": "token | sequence ratio in the LAD loss"})
    paced_kl_coef: float = field(default=1.0, metadata={"help": "PACED's beta: the TB tilt is r / paced_kl_coef"})
    paced_tau: float = field(default=0.5, metadata={"help": "target accuracy of the prompt selection"})
    paced_pool_factor: int = field(default=4, metadata={"help": "candidates per selected prompt (0 = no selection)"})
    paced_select_from: str = field(default="learned", metadata={"help": "learned | disa (the frozen Stage-2 log Z)"})
    paced_replay: bool = field(default=True, metadata={"help": "accuracy-error-prioritized replay of correct samples"})
    paced_replay_capacity: int = field(default=128, metadata={"help": "replay buffer capacity (PACED: 128)"})
    paced_replay_add: int = field(default=64, metadata={"help": "correct samples added per step (PACED: 64)"})
    paced_replay_max: int | None = field(default=None, metadata={"help": "at most this many replayed rows per batch"})
    paced_embeddings: str = field(
        default="frozen_ref",
        metadata={
            "help": "PACED's Z_phi input: frozen_ref (paper Sec. 4.3: an MLP on frozen pi_ref prompt embeddings, "
            "precomputed once) | live (the head on the live policy's hidden states)"
        },
    )
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

    def __post_init__(self) -> None:
        # before TRL resolves an unset bf16 to True: on CPU with vLLM the trainer must score in vLLM's fp32
        self.bf16 = cpu_trainer_bf16(
            self.bf16, bool(self.fp16), bool(self.use_vllm), bool(self.use_cpu) or not torch.cuda.is_available()
        )
        super().__post_init__()
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        self._check_trl_options()
        if self.reward_transform is None:
            self.reward_transform = "group_norm" if self.objective == "flowrl" else "affine"
        if self.reward_transform == "identity":
            self.reward_transform, self.reward_scale, self.reward_shift = "affine", 1.0, 0.0
        if not self.reward_scale > 0:
            raise ValueError(f"reward_scale (a in r~ = a r + c) must be > 0, got {self.reward_scale}")
        if self.reward_transform not in REWARD_TRANSFORMS:
            raise ValueError(f"reward_transform must be one of {REWARD_TRANSFORMS}, got {self.reward_transform!r}")
        if self.length_normalize is None:
            self.length_normalize = self.objective == "flowrl"
        if self.weight_clip not in ("max", "eps", "none"):
            raise ValueError(f"weight_clip must be max | eps | none, got {self.weight_clip!r}")
        if self.lad_divergence not in F_DIVERGENCES:
            raise ValueError(f"lad_divergence must be one of {sorted(F_DIVERGENCES)}, got {self.lad_divergence!r}")
        if self.lad_eta <= 0 or self.paced_kl_coef <= 0 or self.tilt_beta <= 0:
            raise ValueError("lad_eta, paced_kl_coef and tilt_beta must be > 0")
        if self.lad_level not in ("token", "sequence"):
            raise ValueError(f"lad_level must be token | sequence, got {self.lad_level!r}")
        if self.disa_label not in ("predictor", "column"):
            raise ValueError(f"disa_label must be predictor | column, got {self.disa_label!r}")
        if self.paced_embeddings not in ("frozen_ref", "live"):
            raise ValueError(f"paced_embeddings must be frozen_ref | live, got {self.paced_embeddings!r}")
        if self.dynamic_sampling_max_refills < 0:
            raise ValueError("dynamic_sampling_max_refills must be >= 0")
        if self.paced_select_from not in ("learned", "disa"):
            raise ValueError(f"paced_select_from must be learned | disa, got {self.paced_select_from!r}")
        if not 0.0 <= self.paced_tau <= 1.0:
            raise ValueError("paced_tau must lie in [0, 1]")
        if self.use_liger_kernel:
            raise ValueError("use_liger_kernel bypasses _compute_loss; the tiltlab objectives need it off")

    def _check_trl_options(self) -> None:
        """Resolve ``loss_type`` / ``importance_sampling_level`` per objective and refuse every TRL
        loss option the objectives do not implement: a value the trainer cannot honour is an error."""
        obj = self.objective
        types = LOSS_TYPES.get(obj, ())
        if self.loss_type is None:
            self.loss_type = types[0] if types else None
        elif self.loss_type not in types:
            hint = f"; for TRL's loss_type={self.loss_type!r} set objective={self.loss_type!r}"
            raise ValueError(
                f"objective={obj!r} implements loss_type in {types or '(none: leave it unset)'}, got "
                f"{self.loss_type!r}{hint if self.loss_type in _TRL_LOSS_OBJECTIVES else ''}"
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
        if self.off_policy_mask_threshold is not None and obj not in GRPO_FAMILY:
            raise ValueError(
                f"off_policy_mask_threshold is implemented by objective in {GRPO_FAMILY} only, got objective={obj!r}"
            )
        if obj in ("gspo", "lad") and self.beta != 0.0 and self.use_bias_correction_kl:
            raise ValueError(
                f"objective={obj!r} does not implement use_bias_correction_kl (objectives that do: "
                f"{BIAS_CORRECTED_KL}); set it False (or beta=0)"
            )

    def _check_kl_in_reward(self) -> None:
        if self.objective not in KL_IN_REWARD:
            raise ValueError(
                f"kl_in_reward is implemented by objective in {KL_IN_REWARD} only, got objective={self.objective!r}"
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

    @property
    def logprob_scale(self) -> str:
        return "mean" if self.length_normalize else "sum"


LogZFn = Callable[[list[Any]], Tensor]
TILT_STATE = "tiltlab_state_{}.pt"
"""Per-process trainer state in each checkpoint (see :meth:`TiltGRPOTrainer._tilt_state`)."""


def _is_chat_dataset(dataset) -> bool | None:
    """Whether the dataset's prompts are conversational (TRL renders them with the chat template);
    None without a dataset."""
    if dataset is None or len(dataset) == 0:
        return None
    from trl.data_utils import is_conversational

    return bool(is_conversational({"prompt": dataset[0]["prompt"]}))


def informative_groups(rewards: Tensor, g: int) -> Tensor:
    """DAPO dynamic sampling's filter (DAPO Sec. 3.2, eq. 11 constraint ``0 < |correct| < G``,
    generalized to any reward): ``[N/g]`` bool, True for the groups of ``g`` consecutive rewards
    that are not all equal (a group with equal rewards has zero advantage and no gradient)."""
    if rewards.dim() != 1 or rewards.numel() % g:
        raise ValueError(f"rewards must be [N] with N a multiple of g={g}, got {tuple(rewards.shape)}")
    r = rewards.view(-1, g)
    return (r != r[:, :1]).any(dim=1)


def _merge_rows(outs: list[dict], rows: Tensor, pad_id: int) -> dict:
    """Concatenate the per-row tensors of several generation outputs (re-padding prompts on the
    left and completions on the right) and keep ``rows``; non-row entries come from the first."""
    from trl.trainer.utils import pad

    n_each = [o["completion_ids"].shape[0] for o in outs]
    merged: dict = {}
    for key, v0 in outs[0].items():
        if not (isinstance(v0, Tensor) and v0.dim() >= 1 and v0.shape[0] == n_each[0]):
            merged[key] = v0
            continue
        parts = [o[key] for o in outs]
        if v0.dim() == 1:
            merged[key] = torch.cat(parts)[rows]
            continue
        side = "left" if key.startswith("prompt") else "right"
        value = pad_id if key.endswith("_ids") else 1.0 if key == "importance_sampling_ratio" else 0
        rows_list = [x for p in parts for x in p.unbind(0)]
        merged[key] = pad(rows_list, padding_value=value, padding_side=side)[rows]
    return merged


def _param_dtype(model) -> torch.dtype | None:
    p = next(iter(model.parameters()), None) if model is not None else None
    return None if p is None else p.dtype


def _record_profiled_times() -> None:
    """Make TRL's ``profiling_context`` blocks (``vLLM.generate``, ``sync_weights``, each reward
    function, ...) also append their duration to a :class:`TiltGRPOTrainer`'s metrics as
    ``time/<name>``: TRL sends them only to wandb / mlflow / trackio, and a run's per-step time and
    where it goes then lands in ``trainer_state.json``'s log history (with TRL's ``step_time``, the
    whole ``training_step``: the rollout when one is due, the loss's forward and backward, and
    ``time/generate_and_score``, the rollout with its scoring passes)."""
    import trl.trainer.grpo_trainer as gt

    trl_context = gt.profiling_context
    if getattr(trl_context, "_tiltlab", False):
        return

    def profiling_context(trainer, name: str):
        ctx = trl_context(trainer, name)
        if isinstance(trainer, TiltGRPOTrainer):
            log = ctx._log_metrics

            def log_and_record(duration: float) -> None:
                log(duration)
                mode = "train" if trainer.model.training else "eval"
                trainer._metrics[mode][f"time/{name}"].append(duration)

            ctx._log_metrics = log_and_record
        return ctx

    profiling_context._tiltlab = True  # type: ignore[attr-defined]
    gt.profiling_context = profiling_context


class TiltGRPOTrainer(SignalGuardMixin, PacedMixin, GRPOTrainer):
    """``GRPOTrainer`` whose loss is one of :data:`OBJECTIVES` from ``objectives/``.

    Extra arguments:
        log_z_fn: DISA's frozen partition function: ``log_z_fn(prompts) -> [N]`` (the Stage-2
            predictor; ``prompts`` are the dataset's ``prompt`` entries). Required for
            ``objective="disa"`` unless the dataset carries a ``log_z`` column, and for
            ``paced_select_from="disa"``.
        log_z_manifest: Stage 1's recorded settings (overrides ``args.disa_stage1_manifest``).
    """

    def __init__(
        self,
        model,
        reward_funcs=None,
        args: TiltGRPOConfig | None = None,
        train_dataset=None,
        *,
        log_z_fn: LogZFn | None = None,
        log_z_manifest: dict | None = None,
        **kwargs,
    ) -> None:
        if args is None or not isinstance(args, TiltGRPOConfig):
            raise ValueError("TiltGRPOTrainer needs args=TiltGRPOConfig(...)")
        if isinstance(model, str):  # an alias (smollm2-135m) -> its local directory, which TRL can load
            from tiltlab.llm.models import resolve_model

            model = resolve_model(model)
        obj = args.objective
        # TRL's KL-to-ref coefficient, used by grpo/gspo/lad in the loss; with kl_in_reward it goes into the
        # reward instead (TRL's own beta stays, so that TRL builds the reference model and its log-probs)
        self.kl_coef = 0.0 if args.kl_in_reward else float(args.beta)
        if obj in _NEEDS_REF and args.beta == 0.0:
            # TRL builds the reference model and its log-probs only when beta != 0; the TB losses
            # need them and ignore TRL's beta (their KL to ref is only logged).
            args.beta = 1.0
        if obj == "flowrl" or (obj == "paced" and args.paced_embeddings == "live"):
            from transformers import set_seed

            set_seed(args.seed)  # the head is created here, before GRPOTrainer seeds: same seed, same head
            if isinstance(model, str):
                from tiltlab.llm.models import load_model

                # as TRL loads a model name: args.model_init_kwargs (dtype float32 unless given, e.g.
                # bfloat16 for a half-size copy per process); from_pretrained partitions under ZeRO-3
                init = dict(args.model_init_kwargs or {})
                init.pop("device_map", None)
                model = load_model(model, dtype=init.pop("dtype", "float32"), device="cpu", **init)
            # seeded: every process builds the same head (FSDP2 does not broadcast module states
            # as DDP does, so unseeded heads would start different on each rank)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(int(args.seed))
                attach_log_z_head(model, args.log_z_hidden, args.log_z_layers, args.log_z_dropout)
        manifest = log_z_manifest if log_z_manifest is not None else args.disa_stage1_manifest
        self.label_mismatches: list[str] = []
        if obj == "disa":
            self.label_mismatches = check_label_compat(
                manifest,
                beta=args.tilt_beta,
                reward_transform=args.reward_transform_spec,
                logprob_scale=args.logprob_scale,
                chat_template=_is_chat_dataset(train_dataset),
                allow_mismatch=args.disa_allow_label_mismatch,
                reason=args.disa_mismatch_reason,
            )
        self.log_z_fn = log_z_fn
        self._log_z_cache: dict[str, float] = {}
        self._last_rewards_per_func: Tensor | None = None
        self._replay = (
            ReplayBuffer(args.paced_replay_capacity, args.paced_replay_add)
            if obj == "paced" and args.paced_replay
            else None
        )
        self._paced_rng = random.Random(int(args.seed))
        _record_profiled_times()
        # no CUDA: TRL's colocated vLLM is built with CPU settings (llm/trainers/vllm_sync.py), in the
        # policy's dtype (TRL has loaded the policy when it builds the engine)
        with cpu_colocate_llm(lambda: _param_dtype(getattr(self, "model", None)), args.vllm_kv_cache_memory_bytes):
            super().__init__(model=model, reward_funcs=reward_funcs, args=args, train_dataset=train_dataset, **kwargs)
        head = get_log_z_head(self.model, required=False)
        if getattr(self, "vllm_generation", None) is not None:  # TRL's weight sync (llm/trainers/vllm_sync.py)
            if head is not None:
                keep_log_z_head_out(self.vllm_generation)
            reload_on_cpu(self.vllm_generation)
        if head is not None and not any(p.requires_grad for p in head.parameters()):
            raise ValueError(
                "the log Z head is frozen (PEFT freezes non-adapter modules): pass "
                "peft_config with modules_to_save=['log_z_head'] for a learned log Z"
            )
        if obj == "paced" and args.paced_embeddings == "live" and getattr(self.accelerator, "is_fsdp2", False):
            raise ValueError(
                "paced_embeddings='live' calls the log Z head outside the policy's forward, which FSDP2 does not "
                "support (mixed torch.Tensor and DTensor); use paced_embeddings='frozen_ref' (the paper's Z_phi)"
            )
        if obj == "paced" and args.paced_embeddings == "frozen_ref":
            self._paced_setup_frozen()
        if obj == "paced":
            g = self.num_generations
            gen_local = args.per_device_train_batch_size * args.steps_per_generation
            if gen_local % g:
                raise ValueError(
                    f"objective='paced' selects whole groups per process: per_device_train_batch_size * "
                    f"steps_per_generation = {gen_local} must be a multiple of num_generations = {g}"
                )
            if (
                args.paced_select_from == "disa"
                and log_z_fn is None
                and (train_dataset is None or "log_z" not in train_dataset.column_names)
            ):
                raise ValueError("paced_select_from='disa' needs log_z_fn (the Stage-2 predictor) or a 'log_z' column")
        uses_frozen = obj == "disa" or (obj == "paced" and args.paced_select_from == "disa")
        if uses_frozen and args.disa_label == "column":
            if train_dataset is None or "log_z" not in train_dataset.column_names:
                raise ValueError(
                    "disa.label=column needs a 'log_z' column in the dataset: write it with "
                    "`tiltlab llm stage2-annotate --stage2-dir STAGE2 --dataset DATA --out DATA_WITH_LOG_Z.jsonl`"
                )
            self.log_z_fn = None  # the column only: no predictor (no second model) during training
        if obj == "disa" and log_z_fn is None and (train_dataset is None or "log_z" not in train_dataset.column_names):
            raise ValueError("objective='disa' needs log_z_fn (Stage-2 predict_log_z) or a 'log_z' dataset column")

    # ------------------------------------------------------------------------------------------
    # optimizer: optional separate learning rate for the log Z head
    def create_optimizer(self, model=None):
        head = get_log_z_head(self.model, required=False)
        if head is None or self.args.log_z_lr is None:
            return super().create_optimizer(model) if model is not None else super().create_optimizer()
        opt = super().create_optimizer(model) if model is not None else super().create_optimizer()
        head_ids = {id(p) for p in head.parameters()}
        for group in list(opt.param_groups):
            keep = [p for p in group["params"] if id(p) not in head_ids]
            group["params"] = keep
        opt.add_param_group({"params": list(head.parameters()), "lr": self.args.log_z_lr, "weight_decay": 0.0})
        return opt

    # ------------------------------------------------------------------------------------------
    # checkpoints: the trainer state TRL/transformers do not save (as TRL does for its entropy
    # controller: written in _save_checkpoint, read in _load_optimizer_and_scheduler)
    def _tilt_state(self) -> dict:
        """Per-process state for a bit-identical resume: TRL's micro-step counter and buffered
        generation batch (a resume between two generations reuses it) and PACED's RNG and replay buffer."""
        buffered = self._buffered_inputs
        if buffered is not None:
            buffered = [{k: v.cpu() if isinstance(v, Tensor) else v for k, v in b.items()} for b in buffered]
        state = {"step": self._step, "buffered_inputs": buffered}
        if self.args.objective == "paced":
            state["paced"] = self.paced_state_dict()
        return state

    def _save_checkpoint(self, model, trial):
        import os

        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        super()._save_checkpoint(model, trial)
        out = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        os.makedirs(out, exist_ok=True)
        path = os.path.join(out, TILT_STATE.format(self.accelerator.process_index))
        with atomic_path(path) as tmp:  # a killed save leaves no half-written state
            torch.save(self._tilt_state(), tmp)

    def evaluate(self, *args, **kwargs):
        """transformers' ``evaluate`` plus the generation metrics TRL logs in eval mode
        (``eval_reward``, ``eval_accuracy``, ...), so ``metric_for_best_model`` can name them."""
        metrics = super().evaluate(*args, **kwargs)
        last = self.state.log_history[-1] if self.state.log_history else {}
        metrics.update({k: v for k, v in last.items() if k.startswith("eval_") and k not in metrics})
        return metrics

    def _load_optimizer_and_scheduler(self, checkpoint):
        import os

        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        path = os.path.join(checkpoint, TILT_STATE.format(self.accelerator.process_index))
        if not os.path.isfile(path):
            raise ValueError(
                f"{checkpoint} has no {os.path.basename(path)} (written by tiltlab's trainer with the same number "
                "of processes); resume from a checkpoint of this trainer"
            )
        state = torch.load(path, map_location="cpu", weights_only=True)
        self._step = int(state["step"])
        dev = self.accelerator.device
        buffered = state["buffered_inputs"]
        if buffered is not None:
            buffered = [{k: v.to(dev) if isinstance(v, Tensor) else v for k, v in b.items()} for b in buffered]
        self._buffered_inputs = buffered
        if self.args.objective == "paced":
            self.load_paced_state_dict(state["paced"])

    # ------------------------------------------------------------------------------------------
    # rollouts: whole groups are present here
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        out = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._last_rewards_per_func = out  # [B_global, n_funcs], gathered across processes
        return out

    def _gathered(self, x: Tensor) -> Tensor:
        return self.accelerator.gather(x.contiguous())

    def _local(self, x_global: Tensor, n_local: int) -> Tensor:
        i = self.accelerator.process_index
        return x_global[i * n_local : (i + 1) * n_local]

    def _frozen_log_z(self, rows: list[dict]) -> Tensor:
        if "log_z" in rows[0] and rows[0]["log_z"] is not None:
            return torch.tensor([float(r["log_z"]) for r in rows], dtype=torch.float32)
        if self.log_z_fn is None:
            raise ValueError("no frozen log Z: pass log_z_fn or a 'log_z' column")
        keys = [repr(r["prompt"]) for r in rows]
        missing = sorted({k for k in keys if k not in self._log_z_cache})
        if missing:
            by_key = {repr(r["prompt"]): r["prompt"] for r in rows}
            vals = torch.as_tensor(self.log_z_fn([by_key[k] for k in missing]), dtype=torch.float32).flatten()
            if vals.numel() != len(missing) or not torch.isfinite(vals).all():
                raise ValueError("log_z_fn must return one finite log Z per prompt")
            self._log_z_cache.update(zip(missing, vals.tolist()))
        return torch.tensor([self._log_z_cache[k] for k in keys], dtype=torch.float32)

    def _prompt_tensors(self, prompts: list) -> tuple[Tensor, Tensor]:
        from tiltlab.llm.scoring import build_batch

        ids_list = self._tokenize_prompts(prompts)[0]
        dev = self.accelerator.device
        pid = self._tokenizer.pad_token_id
        # left-padded prompts only (empty completions): build_batch pads right; the head pools with the mask
        ids, attn, _, _ = build_batch(ids_list, [[] for _ in ids_list], pid, "left", dev)
        return ids, attn

    def _generate_and_score_completions(self, inputs):
        t0 = time.perf_counter()
        out = self._generate_and_score(inputs)
        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["time/generate_and_score"].append(time.perf_counter() - t0)
        return out

    def _generate_and_score(self, inputs):
        args, obj = self.args, self.args.objective
        mode = "train" if self.model.training else "eval"
        if obj == "paced" and mode == "train":
            inputs = self._paced_select(inputs)
        if args.dynamic_sampling and mode == "train":
            out, inputs = self._dynamic_sampling(inputs)
        else:
            out = super()._generate_and_score_completions(inputs)
        n = out["completion_ids"].shape[0]
        dev = out["completion_ids"].device
        g = self.num_generations if mode == "train" else self.num_generations_eval
        rpf = self._last_rewards_per_func
        r_global = torch.nan_to_num((rpf * self.reward_weights.to(rpf.device).unsqueeze(0)).nansum(1), nan=0.0)
        out["rewards"] = self._local(r_global, n).to(dev)
        if mode == "train":
            self._signal_rewards(r_global)  # vacuous-run guard: all rewards of the batch equal
        if mode == "eval":  # validation accuracy: the fraction of completions with reward > 0.5
            self._metrics["eval"]["accuracy"].append(float((r_global > 0.5).float().mean()))
        if args.kl_in_reward:
            self._apply_kl_in_reward(out, r_global, g, mode)
        if obj not in _TB and obj != "lad":
            return out
        mask = out["completion_mask"].float()
        if "old_per_token_logps" not in out:
            out["old_per_token_logps"] = self._behaviour_logps(out, mode)
        if obj in _TB:
            if args.reward_transform == "group_norm":
                r_tilde = group_advantages(r_global.view(-1, g), scale="std").reshape(-1)
            else:
                r_tilde = affine_reward(r_global, args.reward_scale, args.reward_shift)
            out["tb_reward"] = self._local(r_tilde, n).to(dev)
        if obj == "disa" or (obj == "paced" and args.paced_select_from == "disa"):
            out["log_z"] = self._frozen_log_z(inputs).to(dev)
        if obj == "paced" and self._paced_head is not None:
            out["paced_emb"] = self._paced_rows_emb(inputs).to(dev)
        if obj == "vargrad":
            scale = args.logprob_scale
            lp_old = sequence_logprob(out["old_per_token_logps"], mask, scale)
            lp_ref = sequence_logprob(out["ref_per_token_logps"], mask, scale)
            lz = vargrad_log_z(
                self._gathered(lp_old).view(-1, g),
                self._gathered(lp_ref).view(-1, g),
                self._gathered(out["tb_reward"]).view(-1, g),
                args.tilt_beta,
                detach=True,
            )
            out["log_z"] = self._local(lz.repeat_interleave(g), n)
        if args.log_z_accuracy_correlation and mode == "train" and obj in _TB:
            self._log_log_z_accuracy(out, g)
        if obj == "paced" and mode == "train" and self._replay is not None:
            out = self._paced_replay(out, inputs, r_global, g)
        return out

    def _behaviour_logps(self, out: dict, mode: str) -> Tensor:
        """``[B, T]`` behaviour log-probs of the generated completions, computed now: what TRL's
        ``old_per_token_logps`` would hold (TRL skips them when perfectly on-policy)."""
        args = self.args
        with torch.no_grad():
            pc = torch.cat([out["prompt_ids"], out["completion_ids"]], 1)
            am = torch.cat([out["prompt_mask"], out["completion_mask"]], 1)
            bs = args.per_device_train_batch_size if mode == "train" else args.per_device_eval_batch_size
            logps, _, _ = self._get_per_token_logps_and_entropies(
                self.model, pc, am, out["completion_ids"].shape[1], batch_size=bs
            )
        return logps

    def _apply_kl_in_reward(self, out: dict, r_global: Tensor, g: int, mode: str) -> None:
        """``kl_in_reward``: TRL's advantages recomputed from the penalised rewards
        ``r - beta * (log pi_old(y|x) - log pi_ref(y|x))`` (:func:`~tiltlab.objectives.pg.kl_in_reward`, the
        sequence log-probs summed over the completion tokens the loss trains on) with TRL's rule:
        :func:`~tiltlab.objectives.pg.group_advantages` with ``scale_rewards`` and TRL's eps, on the
        gathered batch (a group may span processes), then sliced to this process. ``pi_old`` is TRL's
        ``old_per_token_logps``, or computed here when TRL skipped it (on-policy; the loss then keeps
        TRL's ``pi_old = pi_theta.detach()``)."""
        args = self.args
        rpf = self._last_rewards_per_func
        if bool(torch.isnan(rpf).all(1).any()):
            raise ValueError(
                "kl_in_reward: a completion that no reward function scored (every one returned None); TRL leaves "
                "such rows out of the group mean, which kl_in_reward does not implement: score every completion"
            )
        n = out["completion_ids"].shape[0]
        mask = out["completion_mask"].float()
        if "tool_mask" in out:
            mask = mask * out["tool_mask"].float()
        old = out["old_per_token_logps"] if "old_per_token_logps" in out else self._behaviour_logps(out, mode)
        seq_old = self._gathered(sequence_logprob(old.float(), mask, "sum")).to(r_global.device)
        seq_ref = self._gathered(sequence_logprob(out["ref_per_token_logps"].float(), mask, "sum")).to(r_global.device)
        penalised = kl_in_reward(r_global.float(), seq_old, seq_ref, float(args.beta))
        if g > 1:  # one completion per prompt (eval): every advantage is 0 already, as in TRL
            scale = ADV_SCALE[str(args.scale_rewards)]
            adv = group_advantages(penalised.view(-1, g), scale=scale, eps=TRL_ADVANTAGE_EPS).reshape(-1)  # type: ignore[arg-type]
            out["advantages"] = self._local(adv, n).to(out["advantages"].device, out["advantages"].dtype)
            logged = self._logs["advantages"]  # TRL's completions table: the advantages trained on
            if not args.dynamic_sampling and len(logged) >= adv.numel():  # (dynamic sampling logs per round)
                for _ in range(adv.numel()):
                    logged.pop()
                logged.extend(adv.tolist())
        kl = seq_old - seq_ref
        self._metrics[mode]["kl_in_reward/kl"].append(float(kl.mean()))
        self._metrics[mode]["kl_in_reward/penalty"].append(float(args.beta) * float(kl.mean()))

    def _dynamic_sampling(self, inputs: list[dict]) -> tuple[dict, list[dict]]:
        """DAPO dynamic sampling: generate, drop the groups whose rewards are all equal, and refill
        from further generations (fresh random prompts of the training set) until every process
        holds as many informative groups as the batch has, or ``dynamic_sampling_max_refills``
        extra rounds were spent (then the batch is completed with dropped groups, which carry
        zero advantage). Rounds are synchronized across processes (generation is collective)."""
        args, g = self.args, self.num_generations
        n_local = len(inputs)
        if n_local % g:
            raise ValueError(
                f"dynamic_sampling keeps whole groups per process: per_device_train_batch_size * "
                f"steps_per_generation = {n_local} must be a multiple of num_generations = {g}"
            )
        n_groups = n_local // g
        outs, rows_in, rpf_local, keep = [], [], [], []
        rng = random.Random(self._paced_rng.random() + 7919 * (self.accelerator.process_index + 1))
        batch, refills = inputs, 0
        for refills in range(args.dynamic_sampling_max_refills + 1):  # noqa: B007 - the count is logged below
            out = super()._generate_and_score_completions(batch)
            rpf = self._last_rewards_per_func
            n = out["completion_ids"].shape[0]
            local = self._local(rpf, n)
            r = torch.nan_to_num((local * self.reward_weights.to(local.device).unsqueeze(0)).nansum(1), nan=0.0)
            outs.append(out)
            rows_in.extend(batch)
            rpf_local.append(local)
            keep.extend(informative_groups(r, g).tolist())
            have = torch.tensor([float(sum(keep))], device=self.accelerator.device)
            if self.accelerator.gather(have).min().item() >= n_groups:
                break
            ds = self.train_dataset
            picks = [ds[i] for i in rng.sample(range(len(ds)), min(len(ds), n_groups))]
            batch = [row for row in picks for _ in range(g)]
            if len(batch) < n_local:  # a dataset smaller than the batch: repeat groups
                batch = (batch * (n_local // len(batch) + 1))[:n_local]
        self._metrics["train"]["dynamic_sampling/refills"].append(float(refills))
        good = [i for i, k in enumerate(keep) if k][:n_groups]
        bad = [i for i, k in enumerate(keep) if not k][: n_groups - len(good)]
        self._metrics["train"]["dynamic_sampling/informative_frac"].append(len(good) / n_groups)
        groups = sorted(good + bad)
        rows = torch.tensor([gi * g + j for gi in groups for j in range(g)], dtype=torch.long)
        merged = _merge_rows(outs, rows.to(outs[0]["completion_ids"].device), self._tokenizer.pad_token_id)
        merged["num_items_in_batch"] = self.accelerator.gather(merged["completion_mask"].sum()).sum()
        self._last_rewards_per_func = self._gathered(torch.cat(rpf_local)[rows.to(rpf_local[0].device)])
        return merged, [rows_in[i] for i in rows.tolist()]

    def _log_log_z_accuracy(self, out: dict, g: int) -> None:
        """Pearson and Spearman correlation, over this process's groups, between the log Z the
        objective uses (learned head, frozen DISA or VarGrad) and the group's measured accuracy."""
        with torch.no_grad():
            if "log_z" in out:
                lz = out["log_z"].float()
            elif self._paced_head is not None:
                lz = self._paced_frozen_log_z(out["paced_emb"]).float()
            else:
                unwrapped = self.accelerator.unwrap_model(self.model)
                lz = prompt_log_z(unwrapped, out["prompt_ids"], out["prompt_mask"], detach_input=True).float()
            lz = lz.view(-1, g)[:, 0].cpu()
            acc = (out["rewards"].float() > 0.5).float().view(-1, g).mean(1).cpu()
            if lz.numel() < 3 or lz.std() == 0 or acc.std() == 0:
                return
            self._metrics["train"]["log_z/accuracy_pearson"].append(float(pearson(lz, acc)))
            self._metrics["train"]["log_z/accuracy_spearman"].append(float(spearman(lz, acc)))

    # ------------------------------------------------------------------------------------------
    # loss: gather log-probs, call the objective's entry of LOSSES
    def _log(self, mode: str, name: str, value: Tensor | float) -> None:
        v = value if isinstance(value, Tensor) else torch.tensor(float(value))
        v = v.detach().float().reshape(1).to(self.accelerator.device)
        self._metrics[mode][name].append(self.accelerator.gather(v).nanmean().item())

    def _learned_log_z(self, model, batch: LossBatch) -> Tensor:
        """``[B]`` log Z of the learned head on the batch's prompts (gradient into the head)."""
        unwrapped = self.accelerator.unwrap_model(model)
        return prompt_log_z(unwrapped, batch.prompt_ids, batch.prompt_mask, detach_input=self.args.log_z_detach_input)

    def _compute_loss(self, model, inputs):
        args, obj = self.args, self.args.objective
        mode = "train" if self.model.training else "eval"
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        mask = (completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]).float()
        logp, entropy, _ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True
        )  # [B, T]
        logp = logp.float()
        old = inputs.get("old_per_token_logps")
        old = logp.detach() if old is None else old.float()
        ref = inputs.get("ref_per_token_logps")
        isr = inputs.get("importance_sampling_ratio")
        seq_w = None if isr is None else sequence_is_weight(isr, mask, self.vllm_importance_sampling_clip_max)
        batch = LossBatch(logp, old, ref, mask, isr, seq_w, inputs, prompt_ids, prompt_mask, mode)
        out = LOSSES[obj](self, model, batch)
        loss, metrics = out.loss, dict(out.metrics)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"objective {obj!r} produced a non-finite loss ({loss.item()})")
        if args.log_kl_old:
            kl_old = sequence_kl_old(old, logp, mask)
            metrics["kl_old"] = kl_old
            if obj == "paced":
                metrics["paced/beta_kl_old"] = args.paced_kl_coef * kl_old
        # ---- metrics (TRL averages the lists per logging step; report_to sees them)
        with torch.no_grad():
            self._log(mode, f"objective/{obj}_loss", loss)
            self._log(mode, "entropy", masked_mean(entropy.float(), mask))
            if ref is not None:
                self._log(mode, "kl_ref", kl_penalty(logp, ref.float(), mask))
            if "log_z" in metrics:
                lz = metrics.pop("log_z").float()
                self._log(mode, "log_z/mean", lz.mean())
                self._log(mode, "log_z/std", lz.std() if lz.numel() > 1 else torch.zeros(()))
            for k, v in metrics.items():
                self._log(mode, k, v)
        if args.loss_type in _WINDOW_TOKENS:  # normalized by the accumulation window's token count already
            return loss
        normalizer = getattr(self, "current_gradient_accumulation_steps", 1) if mode == "train" else 1.0
        return loss / normalizer

    def _dapo_num_tokens(self, inputs: dict, mode: str) -> Tensor:
        """TRL's ``dapo`` divisor: the completion tokens of one accumulation window per process,
        ``num_items_in_batch / processes * accumulation_steps / steps_per_generation`` (train;
        ``num_items_in_batch`` counts the whole generation batch, gathered over processes)."""
        n = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
        if mode == "train":
            n = n * self.current_gradient_accumulation_steps / self.args.steps_per_generation
        return n


# ----------------------------------------------------------------------------------------------
# the objectives: one loss function per entry of OBJECTIVES
# ----------------------------------------------------------------------------------------------


@dataclass
class LossBatch:
    """What a loss function of :data:`LOSSES` gets from :meth:`TiltGRPOTrainer._compute_loss`.

    ``logp`` ``[B, T]`` current token log-probs (with gradient); ``old`` ``[B, T]`` behaviour
    log-probs (``pi_old``); ``ref`` ``[B, T]`` or None, reference log-probs; ``mask`` ``[B, T]``
    float completion mask; ``isr`` TRL's ``importance_sampling_ratio`` (``[B, 1]`` or ``[B, T]``)
    or None and ``seq_w`` ``[B]`` its per-sequence form (:func:`~tiltlab.objectives.correction.
    sequence_is_weight`) or None; ``inputs`` the batch dict (``advantages``, ``rewards``,
    ``tb_reward``, ``log_z``: ``[B]``); ``prompt_ids`` / ``prompt_mask`` ``[B, P]``; ``mode``
    ``"train"`` or ``"eval"``.
    """

    logp: Tensor
    old: Tensor
    ref: Tensor | None
    mask: Tensor
    isr: Tensor | None
    seq_w: Tensor | None
    inputs: dict
    prompt_ids: Tensor
    prompt_mask: Tensor
    mode: str = "train"


_LOSS_AGG = {
    "grpo": "seq_mean_token_mean",
    "bnpo": "token_mean",
    "dapo": "token_mean",
    "dr_grpo": "seq_mean_token_sum_norm",
    "cispo": "token_mean",
    "sapo": "seq_mean_token_mean",
    "vespo": "token_mean",
}
"""TRL ``loss_type`` -> :func:`~tiltlab.objectives.pg.aggregate` mode (``dapo``, ``cispo``, ``vespo`` with
TRL's window token count; ``luspo``'s sequence mean of token sums is fixed by its function)."""
_WINDOW_TOKENS = ("dapo", "cispo", "vespo")
"""TRL's loss types normalized by the accumulation window's token count (no division by the accumulation steps)."""


LossFn = Callable[[TiltGRPOTrainer, Any, LossBatch], LossOutput]
"""``loss_fn(trainer, model, batch) -> LossOutput``; a ``log_z`` metric is logged as mean/std."""


def _with_kl(trainer: TiltGRPOTrainer, out: LossOutput, b: LossBatch, metrics: dict[str, Tensor]) -> LossOutput:
    """``loss + kl_coef * kl_penalty`` when TRL computed reference log-probs and ``beta != 0``
    (the KL term is not importance-weighted, as in TRL), with ``metrics``."""
    loss = out.loss
    if b.ref is not None and trainer.kl_coef:
        loss = loss + trainer.kl_coef * kl_penalty(b.logp, b.ref, b.mask)
    return LossOutput(loss, metrics)


def _off_policy(trainer: TiltGRPOTrainer, b: LossBatch) -> tuple[dict[str, Any], Tensor | None]:
    """``(options, sampler log-probs)``: TRL's ``off_policy_mask_threshold`` and the log-probs it
    compares with (vLLM's ``sampling_per_token_logps`` when present, else None: the loss function
    falls back to ``pi_old``'s)."""
    threshold = trainer.args.off_policy_mask_threshold
    if threshold is None:
        return {}, None
    sampler = b.inputs.get("sampling_per_token_logps")
    return {"off_policy_threshold": threshold}, None if sampler is None else sampler.float()


def _kept(out: dict[str, Tensor], m: Mapping[str, Tensor | float]) -> dict[str, Tensor]:
    if "off_policy_kept" in m:
        out["off_policy_kept"] = m["off_policy_kept"]
    return out


def _token_is_weight(b: LossBatch) -> Tensor | None:
    """TRL's vLLM IS ratio as the loss functions take it: ``[B, T]`` per token or ``[B]`` per sequence."""
    return None if b.isr is None else (b.isr[:, 0] if b.isr.shape[1] == 1 else b.isr)


def _policy(
    trainer: TiltGRPOTrainer, name: str, b: LossBatch, is_weight: Tensor | None, ref: bool = True, **options: Any
) -> LossOutput:
    """The registry's ``name`` (a GRPO-family loss) on TRL's batch: advantages, ``pi_old``, the
    reference log-probs (with ``ref``), the IS weight, the off-policy mask."""
    opsm, sampler = _off_policy(trainer, b)
    batch = ObjectiveBatch(
        b.logp, b.mask, token_logp_old=b.old, token_logp_ref=b.ref if ref else None, token_logp_sampler=sampler,
        advantages=b.inputs["advantages"], is_weight=is_weight,
    )  # fmt: skip
    return get_objective(name)(batch, **options, **opsm)


def _family(trainer: TiltGRPOTrainer, b: LossBatch) -> dict[str, Any]:
    """The options the GRPO family shares in TRL: the KL to ref with ``beta`` (ratio-weighted with
    ``use_bias_correction_kl``)."""
    return {
        "kl_coef": trainer.kl_coef if b.ref is not None else 0.0,
        "kl_ratio_weighted": bool(trainer.args.use_bias_correction_kl),
    }


def cispo_objective(trainer: TiltGRPOTrainer, model, b: LossBatch) -> LossOutput:
    """CISPO (:func:`~tiltlab.objectives.pg.cispo_loss`), TRL's ``loss_type="cispo"``: the token ratio
    capped at ``epsilon_high`` (stop-gradient), the window token count normalization."""
    args = trainer.args
    out = _policy(
        trainer, "cispo", b, _token_is_weight(b), ratio_max=args.epsilon_high,
        num_tokens=trainer._dapo_num_tokens(b.inputs, b.mode), **_family(trainer, b),
    )  # fmt: skip
    return LossOutput(out.loss, _kept({"clip_frac": out.metrics["clip_frac"]}, out.metrics))


def sapo_objective(trainer: TiltGRPOTrainer, model, b: LossBatch) -> LossOutput:
    """SAPO (:func:`~tiltlab.objectives.pg.sapo_loss`), TRL's ``loss_type="sapo"``: the sigmoid gate at
    ``sapo_temperature_pos/neg``, the sequence mean of token means."""
    args = trainer.args
    out = _policy(
        trainer, "sapo", b, _token_is_weight(b), temp_pos=args.sapo_temperature_pos,
        temp_neg=args.sapo_temperature_neg, **_family(trainer, b),
    )  # fmt: skip
    return LossOutput(out.loss, _kept({}, out.metrics))


def luspo_objective(trainer: TiltGRPOTrainer, model, b: LossBatch) -> LossOutput:
    """LUSPO (:func:`~tiltlab.objectives.pg.luspo_loss`), TRL's ``loss_type="luspo"`` at
    ``importance_sampling_level="sequence"``: GSPO's clip (``epsilon``/``epsilon_high``), each
    sequence weighted by its length."""
    args = trainer.args
    out = _policy(
        trainer, "luspo", b, _token_is_weight(b), clip_eps=args.epsilon, clip_eps_high=args.epsilon_high,
        **_family(trainer, b),
    )  # fmt: skip
    return LossOutput(out.loss, _kept({"clip_frac": out.metrics["clip_frac"]}, out.metrics))


def vespo_objective(trainer: TiltGRPOTrainer, model, b: LossBatch) -> LossOutput:
    """VESPO (:func:`~tiltlab.objectives.pg.vespo_loss`), TRL's ``loss_type="vespo"``: the Gamma weight
    (``vespo_k_pos`` ...) of the sequence ratio times vLLM's IS ratio (which does not multiply the
    loss), the window token count normalization."""
    args = trainer.args
    out = _policy(
        trainer, "vespo", b, _token_is_weight(b), k_pos=args.vespo_k_pos, lambda_pos=args.vespo_lambda_pos,
        k_neg=args.vespo_k_neg, lambda_neg=args.vespo_lambda_neg,
        num_tokens=trainer._dapo_num_tokens(b.inputs, b.mode), **_family(trainer, b),
    )  # fmt: skip
    return LossOutput(out.loss, _kept({"vespo/phi_mean": out.metrics["phi_mean"]}, out.metrics))


def grpo_objective(trainer: TiltGRPOTrainer, model, b: LossBatch) -> LossOutput:
    """GRPO (:func:`~tiltlab.objectives.pg.grpo_loss`): token ratio, clip ``epsilon``/``epsilon_high``,
    KL to ref with TRL's ``beta`` (ratio-weighted with ``use_bias_correction_kl``); TRL's IS ratio
    per token or per sequence; TRL's ``loss_type`` normalization."""
    args = trainer.args
    loss_type = str(args.loss_type)
    out = _policy(
        trainer, "grpo", b, _token_is_weight(b), clip_eps=args.epsilon, clip_eps_high=args.epsilon_high,
        loss_agg=_LOSS_AGG[loss_type], max_len=args.max_completion_length,
        num_tokens=trainer._dapo_num_tokens(b.inputs, b.mode) if loss_type == "dapo" else None,
        dual_clip=args.dual_clip, log_ratio_clip=args.log_ratio_clip, kl_estimator=args.kl_estimator,
        **_family(trainer, b),
    )  # fmt: skip
    return LossOutput(out.loss, _kept({"clip_frac": out.metrics["clip_frac"]}, out.metrics))


def gspo_objective(trainer: TiltGRPOTrainer, model, b: LossBatch) -> LossOutput:
    """GSPO (:func:`~tiltlab.objectives.pg.gspo_loss`): sequence ratio, sequence IS weight, KL to ref."""
    args = trainer.args
    out = _policy(trainer, "gspo", b, b.seq_w, ref=False, clip_eps=args.epsilon, clip_eps_high=args.epsilon_high)
    return _with_kl(trainer, out, b, _kept({"clip_frac": out.metrics["clip_frac"]}, out.metrics))


def lad_objective(trainer: TiltGRPOTrainer, model, b: LossBatch) -> LossOutput:
    """LAD (:func:`~tiltlab.objectives.lad.lad_loss`) at token level (per-token IS ratio, mean over
    tokens then sequences) or sequence level (length-normalized log-probs, sequence IS weight)."""
    args = trainer.args
    token = args.lad_level == "token"
    batch = ObjectiveBatch(
        b.logp, b.mask, token_logp_old=b.old, advantages=b.inputs["advantages"],
        is_weight=_token_is_weight(b) if token else b.seq_w,
    )  # fmt: skip
    level = (
        {"level": "token", "loss_agg": "seq_mean_token_mean"}
        if token
        else {"level": "sequence", "logprob_scale": "mean"}
    )
    out = get_objective("lad")(batch, eta=args.lad_eta, divergence=args.lad_divergence, **level)
    return _with_kl(trainer, out, b, {})


def flowrl_objective(trainer: TiltGRPOTrainer, model, b: LossBatch) -> LossOutput:
    """FlowRL (:func:`~tiltlab.objectives.tb.flowrl_loss`) with the learned log Z head."""
    args = trainer.args
    log_z = trainer._learned_log_z(model, b)
    batch = ObjectiveBatch(
        b.logp, b.mask, token_logp_old=b.old, token_logp_ref=b.ref, rewards=b.inputs["tb_reward"][:, None],
        log_z=log_z, is_weight=b.seq_w,
    )  # fmt: skip
    out = get_objective("flowrl")(
        batch, beta=args.tilt_beta, length_normalize=args.length_normalize, group_normalize=False,
        weight_clip=args.weight_clip, max_weight=args.max_weight, eps=args.weight_eps, eps_high=args.weight_eps_high,
    )  # fmt: skip
    m = out.metrics
    return LossOutput(
        out.loss,
        {
            "log_z": log_z.detach(),
            "residual": m["residual_abs_mean"],
            "weight_clip_frac": m["weight_clip_frac"],
            "weight_mean": m["weight_mean"],
        },
    )


def _tb_family(
    trainer: TiltGRPOTrainer, name: str, b: LossBatch, log_z: Tensor, reward: Tensor, **options: Any
) -> LossOutput:
    """The registry's TB entry ``name`` on TRL's batch at ``logprob_scale``, with the TB rollout weight
    (:func:`~tiltlab.objectives.tb.tb_importance_weight` at TRL's clip options) times the sampler's
    sequence IS weight; its clip fraction is of the TB weight at its own clip bounds, before the
    sampler IS weight multiplies it (as in :func:`~tiltlab.objectives.tb.flowrl_loss`)."""
    args = trainer.args
    batch = ObjectiveBatch(
        b.logp, b.mask, token_logp_old=b.old, token_logp_ref=b.ref, rewards=reward, log_z=log_z, is_weight=b.seq_w
    )
    out = get_objective(name)(
        batch, logprob_scale=args.logprob_scale, weight_clip=args.weight_clip, max_weight=args.max_weight,
        eps=args.weight_eps, eps_high=args.weight_eps_high, **options,
    )  # fmt: skip
    m = out.metrics
    return LossOutput(
        out.loss,
        {
            "log_z": log_z.detach(),
            "residual": m["residual_abs_mean"],
            "weight_clip_frac": m["weight_clip_frac"],
            "weight_mean": m["weight_mean"],
        },
    )


def disa_objective(trainer: TiltGRPOTrainer, model, b: LossBatch) -> LossOutput:
    """DISA Stage 3 (:func:`~tiltlab.objectives.tb.disa_loss`): TB with the frozen Stage-2 log Z."""
    return _tb_family(
        trainer, "disa", b, b.inputs["log_z"].float(), b.inputs["tb_reward"].float(), beta=trainer.args.tilt_beta
    )


def vargrad_objective(trainer: TiltGRPOTrainer, model, b: LossBatch) -> LossOutput:
    """VarGrad: TB (:func:`~tiltlab.objectives.tb.tb_loss`) at the per-group batch-optimal log Z
    computed at generation time (:func:`~tiltlab.objectives.tb.vargrad_log_z`), held fixed."""
    return _tb_family(
        trainer, "vargrad", b, b.inputs["log_z"].float(), b.inputs["tb_reward"].float(), beta=trainer.args.tilt_beta
    )


def paced_objective(trainer: TiltGRPOTrainer, model, b: LossBatch) -> LossOutput:
    """PACED-RL: TB anchored on ``pi_old`` with tilt ``r / paced_kl_coef`` and the learned log Z head."""
    log_z = trainer._paced_log_z(model, b)
    return _tb_family(trainer, "paced", b, log_z, b.inputs["rewards"].float(), kl_coef=trainer.args.paced_kl_coef)


LOSSES: dict[str, LossFn] = {
    "grpo": grpo_objective,
    "gspo": gspo_objective,
    "cispo": cispo_objective,
    "sapo": sapo_objective,
    "luspo": luspo_objective,
    "vespo": vespo_objective,
    "flowrl": flowrl_objective,
    "disa": disa_objective,
    "vargrad": vargrad_objective,
    "lad": lad_objective,
    "paced": paced_objective,
}
"""Objective name -> loss function; a new objective is one function and one entry here (and in
:data:`OBJECTIVES`, whose order is the documented one)."""
if set(LOSSES) != set(OBJECTIVES):  # pragma: no cover - a module-level consistency check
    raise ImportError(f"LOSSES {sorted(LOSSES)} and OBJECTIVES {sorted(OBJECTIVES)} differ")
