"""Online RL on TRL's ``GRPOTrainer``: GRPO, GSPO, FlowRL, DISA Stage 3, VarGrad, LAD, PACED.

One trainer, one ``objective`` option. TRL does the rollouts (transformers ``generate`` on CPU,
vLLM colocate/server on GPUs), the reward calls, the reference forward, the optimizer and the
distributed plumbing (accelerate: DDP, DeepSpeed, FSDP). This module only

1. adds per-completion fields in :meth:`TiltGRPOTrainer._generate_and_score_completions`, where
   whole groups are present (gathered across processes): the raw reward, the transformed reward
   ``r~`` of the TB objectives (identity, or the group-normalized plug-in), the frozen DISA
   ``log Z_psi(x)``, the batch-optimal VarGrad ``log Z``, the behaviour log-probs; PACED's prompt
   selection and replay also live there;
2. gathers current log-probs in :meth:`TiltGRPOTrainer._compute_loss` and calls the loss of
   ``objectives/`` (no loss formula is written here), multiplying in TRL's vLLM
   importance-sampling ratio ``inputs["importance_sampling_ratio"]`` itself;
3. logs loss, reward, log Z mean/std, residual, weight-clip fraction, entropy and KL to the
   reference through TRL's metrics (so ``report_to`` sees them).

Objectives (``math.md`` §1-§6):

* ``grpo``  — :func:`objectives.pg.grpo_loss` (token ratio, clip ``epsilon``/``epsilon_high``,
  KL to ref with coefficient ``beta`` = TRL's KL coefficient).
* ``gspo``  — :func:`objectives.pg.gspo_loss` (sequence ratio).
* ``flowrl`` — :func:`objectives.tb.flowrl_loss` with a learned ``log Z`` head
  (:mod:`llm.trainers.logz_head`); coded defaults: length-normalized log-probs, group-normalized
  reward, ``tilt_beta = 15``, weight ``clamp(exp(sum log-ratio), max=10)``; the paper's
  ``[1-eps, 1+eps]`` clip via ``weight_clip="eps"``.
* ``disa``  — :func:`objectives.tb.disa_loss`: the frozen Stage-2 ``log Z_psi(x)``, no gradient,
  with the SAME reward transform, ``beta`` and residual scale as Stage 1 (checked, see
  :func:`check_label_compat`).
* ``vargrad`` — TB at the per-group batch-optimal ``log Z`` (:func:`objectives.tb.vargrad_log_z`),
  computed at generation time where the whole group is present.
* ``lad``   — :func:`objectives.lad.lad_loss` with any of the six divergences, ``lad_eta``.
* ``paced`` — TB anchored on ``pi_old`` with tilt ``r / paced_kl_coef`` and a learned ``log Z``
  head; prompts selected by ``|p_hat - tau|`` (:func:`objectives.paced.select_prompts`) from the
  learned or the DISA-frozen partition function; correct samples replayed by accuracy-error
  priority (:class:`objectives.paced.ReplayBuffer`).

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

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from trl import GRPOConfig, GRPOTrainer

from tiltlab.objectives.estimators import pass_rate_from_log_z
from tiltlab.objectives.lad import F_DIVERGENCES, lad_loss
from tiltlab.objectives.paced import ReplayBuffer, accuracy_from_log_z, replay_priority, select_prompts
from tiltlab.objectives.pg import group_advantages, grpo_loss, gspo_loss, kl_k3, masked_mean
from tiltlab.objectives.tb import (
    disa_loss,
    flowrl_loss,
    sequence_logprob,
    tb_importance_weight,
    tb_loss,
    tb_residual,
    vargrad_log_z,
)

from .logz_head import attach_log_z_head, get_log_z_head, prompt_log_z

__all__ = ["OBJECTIVES", "LabelMismatchError", "TiltGRPOConfig", "TiltGRPOTrainer", "check_label_compat"]

OBJECTIVES = ("grpo", "gspo", "flowrl", "disa", "vargrad", "lad", "paced")
_TB = ("flowrl", "disa", "vargrad", "paced")
_NEEDS_REF = ("flowrl", "disa", "vargrad")
_LEARNED_Z = ("flowrl", "paced")
REWARD_TRANSFORMS = ("affine", "identity", "group_norm")


class LabelMismatchError(ValueError):
    """Stage-1 labels and the Stage-3 residual disagree (reward transform, beta, or log-prob scale)."""


def _recorded_settings(recorded: dict[str, Any]) -> dict[str, Any]:
    """Normalize a Stage-1 manifest (``llm.stage1``'s ``manifest.json``, format ``tiltlab.stage1/1``,
    or a flat dict) to ``{beta, reward_transform, logprob_scale}``.

    ``tiltlab.stage1/1`` labels are trajectory-level by construction (``log w = log pi_ref(y|x)
    + beta r~ - log q(y|x)`` with masked-SUM sequence log-probs), so ``logprob_scale = "sum"`` is
    implied by that format when the manifest does not state it.
    """
    out: dict[str, Any] = {}
    if "beta" in recorded:
        out["beta"] = float(recorded["beta"])
    rt = recorded.get("reward_transform")
    if isinstance(rt, dict):
        name = rt.get("name", "affine")
        out["reward_transform"] = (
            (name, float(rt.get("a", 1.0)), float(rt.get("c", 0.0))) if name == "affine" else (name,)
        )
    elif rt is not None:
        out["reward_transform"] = ("affine", 1.0, 0.0) if rt == "identity" else (str(rt),)
    if "logprob_scale" in recorded:
        out["logprob_scale"] = str(recorded["logprob_scale"])
    elif str(recorded.get("format", "")).startswith("tiltlab.stage1/"):
        out["logprob_scale"] = "sum"
    return out


def check_label_compat(
    recorded: dict[str, Any] | None,
    *,
    beta: float,
    reward_transform: tuple,
    logprob_scale: str,
    allow_mismatch: bool = False,
    reason: str | None = None,
) -> list[str]:
    """Check that the Stage-3 residual uses what Stage 1 used for its labels.

    DISA eq. (10) subtracts ``beta * r~`` and uses ``log pi_theta - log pi_ref`` on the scale the
    labels ``log Z_hat = LSE(log pi_ref + beta r~ - log q) - log M`` were computed on (eqs. 7-8):
    trajectory-level (``"sum"``) labels with a length-normalized (``"mean"``) residual, another
    ``beta`` or another reward transform make ``sg(log Z_psi)`` the log-partition of a different
    target. ``recorded`` is Stage 1's manifest (see :func:`_recorded_settings`);
    ``reward_transform`` is ``("affine", a, c)`` or ``("group_norm",)``.

    Returns the list of mismatches (empty when consistent). Raises :class:`LabelMismatchError`
    unless ``allow_mismatch`` is set together with a ``reason``.
    """
    if recorded is None:
        problems = ["Stage-1 manifest not given: cannot check beta / reward transform / log-prob scale"]
    else:
        got = _recorded_settings(recorded)
        want = {"beta": float(beta), "reward_transform": tuple(reward_transform), "logprob_scale": logprob_scale}
        problems = []
        for key, val in want.items():
            if key not in got:
                problems.append(f"Stage 1 did not record {key!r}")
            elif key == "beta" and not math.isclose(got[key], val, rel_tol=1e-9):
                problems.append(f"beta: Stage 1 used {got[key]!r}, Stage 3 uses {val!r}")
            elif key != "beta" and got[key] != val:
                problems.append(f"{key}: Stage 1 used {got[key]!r}, Stage 3 uses {val!r}")
        if want["reward_transform"][0] == "group_norm":
            problems.append("a group-normalized reward is a per-batch plug-in, not the fixed transform the labels used")
    if problems and not allow_mismatch:
        raise LabelMismatchError(
            "DISA Stage 3 must use the reward transform, beta and log-prob scale of the Stage-1 labels "
            "(e.g. trajectory-level labels with a length-normalized residual, or another beta, make log Z_psi the "
            "log-partition of a different target): "
            + "; ".join(problems)
            + ". Set disa_allow_label_mismatch=True with disa_mismatch_reason='...' to override."
        )
    if problems and not reason:
        raise LabelMismatchError(
            "disa_allow_label_mismatch=True needs disa_mismatch_reason explaining why: " + "; ".join(problems)
        )
    return problems


@dataclass
class TiltGRPOConfig(GRPOConfig):
    """``GRPOConfig`` plus the objective. TRL's ``beta`` stays TRL's KL-to-reference coefficient
    (used by ``grpo``/``gspo``/``lad``); the tilt of the TB objectives is ``tilt_beta`` and
    MULTIPLIES the reward (DISA convention); PACED's ``exp(r / beta)`` is ``paced_kl_coef``."""

    objective: str = field(default="grpo", metadata={"help": f"one of {OBJECTIVES}"})
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
    weight_eps: float = field(default=0.2, metadata={"help": "eps of the [1-eps, 1+eps] weight clip"})
    log_z_detach_input: bool = field(
        default=False, metadata={"help": "stop log-Z gradients at the pooled hidden state"}
    )
    log_z_hidden: int = field(default=256, metadata={"help": "width of the log Z head"})
    log_z_layers: int = field(default=3, metadata={"help": "Linear layers of the log Z head (FlowRL: 3)"})
    log_z_dropout: float = field(default=0.1, metadata={"help": "dropout in the log Z head (FlowRL: 0.1)"})
    log_z_lr: float | None = field(
        default=None, metadata={"help": "learning rate of the log Z head (None = learning_rate)"}
    )
    disa_stage1_manifest: dict | None = field(
        default=None, metadata={"help": "Stage-1 recorded settings (beta, reward_transform, logprob_scale)"}
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
        super().__post_init__()
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
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
        if self.paced_select_from not in ("learned", "disa"):
            raise ValueError(f"paced_select_from must be learned | disa, got {self.paced_select_from!r}")
        if not 0.0 <= self.paced_tau <= 1.0:
            raise ValueError("paced_tau must lie in [0, 1]")
        if self.use_liger_kernel:
            raise ValueError("use_liger_kernel bypasses _compute_loss; the tiltlab objectives need it off")

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


class TiltGRPOTrainer(GRPOTrainer):
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
        obj = args.objective
        self.kl_coef = float(args.beta)  # TRL's KL-to-ref coefficient, used by grpo/gspo/lad
        if obj in _NEEDS_REF and args.beta == 0.0:
            # TRL builds the reference model and its log-probs only when beta != 0; the TB losses
            # need them and ignore TRL's beta (their KL to ref is only logged).
            args.beta = 1.0
        if obj in _LEARNED_Z:
            if isinstance(model, str):
                from tiltlab.llm.models import load_model

                model = load_model(model, device="cpu")
            attach_log_z_head(model, args.log_z_hidden, args.log_z_layers, args.log_z_dropout)
        manifest = log_z_manifest if log_z_manifest is not None else args.disa_stage1_manifest
        self.label_mismatches: list[str] = []
        if obj == "disa":
            self.label_mismatches = check_label_compat(
                manifest,
                beta=args.tilt_beta,
                reward_transform=args.reward_transform_spec,
                logprob_scale=args.logprob_scale,
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
        super().__init__(model=model, reward_funcs=reward_funcs, args=args, train_dataset=train_dataset, **kwargs)
        head = get_log_z_head(self.model, required=False)
        if head is not None and not any(p.requires_grad for p in head.parameters()):
            raise ValueError(
                "the log Z head is frozen (PEFT freezes non-adapter modules): pass "
                "peft_config with modules_to_save=['log_z_head'] for a learned log Z"
            )
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

    def _paced_select(self, inputs: list[dict]) -> list[dict]:
        """PACED Sec. 4.2: replace this process's groups by the prompts whose estimated accuracy
        ``p_hat`` is closest to ``tau``, out of ``pool_factor`` times as many random candidates."""
        args, g = self.args, self.num_generations
        n_groups = len(inputs) // g
        if args.paced_pool_factor <= 0 or n_groups == 0:
            return inputs
        ds = self.train_dataset
        n_cand = min(len(ds), n_groups * args.paced_pool_factor)
        if n_cand <= n_groups:
            return inputs
        rng = random.Random(self._paced_rng.random() + self.accelerator.process_index)
        cand = [ds[i] for i in rng.sample(range(len(ds)), n_cand)]
        with torch.no_grad():
            if args.paced_select_from == "disa":
                p_hat = pass_rate_from_log_z(self._frozen_log_z(cand), args.tilt_beta).clamp(0.0, 1.0)
            else:
                ids, mask = self._prompt_tensors([c["prompt"] for c in cand])
                unwrapped = self.accelerator.unwrap_model(self.model)
                log_z = prompt_log_z(unwrapped, ids, mask, detach_input=True).float().cpu()
                p_hat = accuracy_from_log_z(log_z, args.paced_kl_coef)
        chosen = select_prompts(p_hat, args.paced_tau, n_groups).tolist()
        self._metrics["train"]["paced/p_hat_selected_mean"].append(float(p_hat[chosen].mean()))
        self._metrics["train"]["paced/p_hat_pool_mean"].append(float(p_hat.mean()))
        return [cand[i] for i in chosen for _ in range(g)]

    def _prompt_tensors(self, prompts: list) -> tuple[Tensor, Tensor]:
        from tiltlab.llm.scoring import build_batch

        ids_list = self._tokenize_prompts(prompts)[0]
        dev = self.accelerator.device
        pid = self._tokenizer.pad_token_id
        # left-padded prompts only (empty completions): build_batch pads right; the head pools with the mask
        ids, attn, _, _ = build_batch(ids_list, [[] for _ in ids_list], pid, "left", dev)
        return ids, attn

    def _generate_and_score_completions(self, inputs):
        args, obj = self.args, self.args.objective
        mode = "train" if self.model.training else "eval"
        if obj == "paced" and mode == "train":
            inputs = self._paced_select(inputs)
        out = super()._generate_and_score_completions(inputs)
        n = out["completion_ids"].shape[0]
        dev = out["completion_ids"].device
        g = self.num_generations if mode == "train" else self.num_generations_eval
        rpf = self._last_rewards_per_func
        r_global = torch.nan_to_num((rpf * self.reward_weights.to(rpf.device).unsqueeze(0)).nansum(1), nan=0.0)
        out["rewards"] = self._local(r_global, n).to(dev)
        if obj not in _TB and obj != "lad":
            return out
        mask = out["completion_mask"].float()
        if "old_per_token_logps" not in out:
            # behaviour log-probs at generation time (TRL skips them when perfectly on-policy)
            with torch.no_grad():
                pc = torch.cat([out["prompt_ids"], out["completion_ids"]], 1)
                am = torch.cat([out["prompt_mask"], out["completion_mask"]], 1)
                bs = args.per_device_train_batch_size if mode == "train" else args.per_device_eval_batch_size
                out["old_per_token_logps"], _, _ = self._get_per_token_logps_and_entropies(
                    self.model, pc, am, out["completion_ids"].shape[1], batch_size=bs
                )
        if obj in _TB:
            if args.reward_transform == "group_norm":
                r_tilde = group_advantages(r_global.view(-1, g), scale="std").reshape(-1)
            else:
                r_tilde = args.reward_scale * r_global + args.reward_shift
            out["tb_reward"] = self._local(r_tilde, n).to(dev)
        if obj == "disa" or (obj == "paced" and args.paced_select_from == "disa"):
            out["log_z"] = self._frozen_log_z(inputs).to(dev)
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

    def _log_log_z_accuracy(self, out: dict, g: int) -> None:
        """Pearson and Spearman correlation, over this process's groups, between the log Z the
        objective uses (learned head, frozen DISA or VarGrad) and the group's measured accuracy."""
        with torch.no_grad():
            if "log_z" in out:
                lz = out["log_z"].float()
            else:
                unwrapped = self.accelerator.unwrap_model(self.model)
                lz = prompt_log_z(unwrapped, out["prompt_ids"], out["prompt_mask"], detach_input=True).float()
            lz = lz.view(-1, g)[:, 0].cpu()
            acc = (out["rewards"].float() > 0.5).float().view(-1, g).mean(1).cpu()
            if lz.numel() < 3 or lz.std() == 0 or acc.std() == 0:
                return

            def pearson(a, b):
                a, b = a - a.mean(), b - b.mean()
                return float((a * b).sum() / (a.norm() * b.norm()))

            def ranks(x):
                return torch.argsort(torch.argsort(x, stable=True), stable=True).float()

            self._metrics["train"]["log_z/accuracy_pearson"].append(pearson(lz, acc))
            self._metrics["train"]["log_z/accuracy_spearman"].append(pearson(ranks(lz), ranks(acc)))

    def _paced_replay(self, out: dict, inputs: list[dict], r_global: Tensor, g: int) -> dict:
        """PACED Sec. 4.4: add this batch's correct samples (highest ``|N_correct/N - p_hat|``
        first) to the buffer, then append the buffer's contents to the batch. Replayed rows are
        re-anchored on the current ``pi_old`` (their behaviour log-probs are recomputed now)."""
        from trl.trainer.utils import pad

        n = out["completion_ids"].shape[0]
        dev = out["completion_ids"].device
        spg = self.args.steps_per_generation
        cap = self.args.paced_replay_max
        # replay first (items from earlier steps), then insert this step's correct samples
        items = self._replay.contents()
        k = (len(items) // spg) * spg
        if cap is not None:
            k = min(k, (cap // spg) * spg)
        items = items[-k:] if k else []
        # priority: |N_correct / N - p_hat(x)| per prompt, from this step's groups
        r_local = out["rewards"].float()
        correct = r_local > 0.5
        with torch.no_grad():
            if self.args.paced_select_from == "disa":  # the same estimate that selected the prompts
                p_hat = pass_rate_from_log_z(out["log_z"].float(), self.args.tilt_beta).clamp(0.0, 1.0)
            else:
                unwrapped = self.accelerator.unwrap_model(self.model)
                log_z = prompt_log_z(unwrapped, out["prompt_ids"], out["prompt_mask"], detach_input=True).float()
                p_hat = accuracy_from_log_z(log_z, self.args.paced_kl_coef)
        n_corr = correct.float().view(-1, g).sum(1).repeat_interleave(g)
        prio = replay_priority(n_corr, torch.full_like(n_corr, float(g)), p_hat)
        rows = []
        for b in range(n):
            pm = out["prompt_mask"][b].bool()
            cm = out["completion_mask"][b].bool()
            rows.append(
                {
                    "prompt_ids": out["prompt_ids"][b][pm].cpu(),
                    "completion_ids": out["completion_ids"][b][cm].cpu(),
                    "reward": float(r_local[b]),
                    "tb_reward": float(out["tb_reward"][b]),
                }
            )
        added = self._replay.add(rows, prio.cpu(), correct.cpu())
        self._metrics["train"]["paced/replay_added"].append(float(added))
        self._metrics["train"]["paced/replay_used"].append(float(len(items)))
        self._metrics["train"]["paced/accuracy_error"].append(float((n_corr / g - p_hat).abs().mean()))
        if not items:
            return out
        pid = self._tokenizer.pad_token_id
        p_ids = [out["prompt_ids"][b][out["prompt_mask"][b].bool()] for b in range(n)] + [
            it["prompt_ids"].to(dev) for it in items
        ]
        c_ids = [out["completion_ids"][b][out["completion_mask"][b].bool()] for b in range(n)] + [
            it["completion_ids"].to(dev) for it in items
        ]
        new = dict(out)
        new["prompt_ids"] = pad(p_ids, padding_value=pid, padding_side="left").to(dev)
        new["prompt_mask"] = pad([torch.ones_like(x) for x in p_ids], padding_value=0, padding_side="left").to(dev)
        new["completion_ids"] = pad(c_ids, padding_value=pid, padding_side="right").to(dev)
        new["completion_mask"] = pad([torch.ones_like(x) for x in c_ids], padding_value=0, padding_side="right").to(dev)
        with torch.no_grad():
            pc = torch.cat([new["prompt_ids"], new["completion_ids"]], 1)
            am = torch.cat([new["prompt_mask"], new["completion_mask"]], 1)
            new["old_per_token_logps"], _, _ = self._get_per_token_logps_and_entropies(
                self.model, pc, am, new["completion_ids"].shape[1], batch_size=self.args.per_device_train_batch_size
            )
        extra = len(items)
        new["rewards"] = torch.cat([out["rewards"], torch.tensor([it["reward"] for it in items], device=dev)])
        new["tb_reward"] = torch.cat([out["tb_reward"], torch.tensor([it["tb_reward"] for it in items], device=dev)])
        new["advantages"] = torch.cat(
            [out["advantages"], torch.zeros(extra, device=dev, dtype=out["advantages"].dtype)]
        )
        if "log_z" in out:
            new["log_z"] = torch.cat([out["log_z"], out["log_z"].new_zeros(extra)])
        new.pop("ref_per_token_logps", None)
        new.pop("sampling_per_token_logps", None)
        if "importance_sampling_ratio" in out:
            isr = out["importance_sampling_ratio"]
            t_new = new["completion_ids"].shape[1]
            if isr.shape[1] == 1:
                new["importance_sampling_ratio"] = torch.cat([isr, isr.new_ones(extra, 1)])
            else:
                base = isr.new_ones(n + extra, t_new)
                base[:n, : isr.shape[1]] = isr
                new["importance_sampling_ratio"] = base
        new["num_items_in_batch"] = (
            out["num_items_in_batch"] + self.accelerator.gather(new["completion_mask"][n:].sum()).sum()
        )
        return new

    # ------------------------------------------------------------------------------------------
    # loss: gather log-probs, call objectives/
    def _seq_is_weight(self, inputs: dict, mask: Tensor) -> Tensor | None:
        """TRL's vLLM sampler-mismatch ratio as a per-sequence weight: a sequence-level ratio is
        used as is; a token-level one becomes the product over the completion's tokens, capped
        at ``vllm_importance_sampling_clip_max`` (use ``vllm_importance_sampling_mode=
        'sequence_truncate'`` with the TB objectives to have TRL do this)."""
        isr = inputs.get("importance_sampling_ratio")
        if isr is None:
            return None
        if isr.dim() == 2 and isr.shape[1] == 1:
            return isr[:, 0]
        log_w = (torch.log(isr.clamp_min(1e-30)) * mask).sum(1)
        cap = self.vllm_importance_sampling_clip_max
        w = torch.exp(log_w.clamp(max=80.0))
        return w.clamp(max=cap) if cap is not None else w

    def _log(self, mode: str, name: str, value: Tensor | float) -> None:
        v = value if isinstance(value, Tensor) else torch.tensor(float(value))
        v = v.detach().float().reshape(1).to(self.accelerator.device)
        self._metrics[mode][name].append(self.accelerator.gather(v).nanmean().item())

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
        seq_w = self._seq_is_weight(inputs, mask)
        metrics: dict[str, Tensor] = {}
        if obj == "grpo":
            loss, m = grpo_loss(
                logp,
                old,
                inputs["advantages"],
                mask,
                clip_eps=args.epsilon,
                clip_eps_high=args.epsilon_high,
                loss_agg="seq_mean_token_mean" if args.loss_type == "grpo" else "token_mean",
                token_logp_ref=ref,
                kl_coef=self.kl_coef if ref is not None else 0.0,
                is_weight=None if isr is None else (isr[:, 0] if isr.shape[1] == 1 else isr),
            )
            metrics["clip_frac"] = m["clip_frac"]
        elif obj == "gspo":
            loss, m = gspo_loss(
                logp,
                old,
                inputs["advantages"],
                mask,
                clip_eps=args.epsilon,
                clip_eps_high=args.epsilon_high,
                is_weight=seq_w,
            )
            metrics["clip_frac"] = m["clip_frac"]
            if ref is not None and self.kl_coef:
                loss = loss + self.kl_coef * masked_mean(kl_k3(logp, ref), mask)
        elif obj == "lad":
            adv = inputs["advantages"]
            if args.lad_level == "token":
                per = lad_loss(
                    logp, old, adv[:, None].expand_as(logp), args.lad_eta, args.lad_divergence, reduction="none"
                )  # [B, T]
                if isr is not None:
                    per = per * isr
                loss = masked_mean(per, mask, dim=1).mean()
            else:
                lp = sequence_logprob(logp, mask, "mean")
                lo = sequence_logprob(old, mask, "mean")
                loss = lad_loss(lp, lo, adv, args.lad_eta, args.lad_divergence, weight=seq_w)
            if ref is not None and self.kl_coef:
                loss = loss + self.kl_coef * masked_mean(kl_k3(logp, ref), mask)
        elif obj == "flowrl":
            log_z = prompt_log_z(
                self.accelerator.unwrap_model(model), prompt_ids, prompt_mask, detach_input=args.log_z_detach_input
            )
            loss, m = flowrl_loss(
                logp,
                ref,
                old,
                mask,
                inputs["tb_reward"][:, None],
                log_z,
                beta=args.tilt_beta,
                length_normalize=args.length_normalize,
                group_normalize=False,
                weight_clip=args.weight_clip,
                max_weight=args.max_weight,
                eps=args.weight_eps,
                is_weight=seq_w,
            )
            metrics.update(
                log_z=log_z.detach(),
                residual=m["residual_abs_mean"],
                weight_clip_frac=m["weight_clip_frac"],
                weight_mean=m["weight_mean"],
            )
        else:  # disa, vargrad, paced: TB with frozen / batch-optimal / learned log Z
            scale = args.logprob_scale
            lp = sequence_logprob(logp, mask, scale)
            w = tb_importance_weight(logp, old, mask, args.weight_clip, args.max_weight, args.weight_eps)
            if seq_w is not None:
                w = w * seq_w
            if obj == "paced":
                log_z = prompt_log_z(
                    self.accelerator.unwrap_model(model), prompt_ids, prompt_mask, detach_input=args.log_z_detach_input
                )
                anchor = sequence_logprob(old, mask, scale)
                residual = tb_residual(lp, anchor, inputs["rewards"].float(), log_z, 1.0 / args.paced_kl_coef)
                loss = tb_loss(residual, w)
            else:
                lp_ref = sequence_logprob(ref, mask, scale)
                log_z = inputs["log_z"].float()
                r = inputs["tb_reward"].float()
                if obj == "disa":
                    loss = disa_loss(lp, lp_ref, r, log_z, args.tilt_beta, weight=w)
                else:
                    loss = tb_loss(tb_residual(lp, lp_ref, r, log_z.detach(), args.tilt_beta), w)
                residual = tb_residual(lp.detach(), lp_ref, r, log_z.detach(), args.tilt_beta)
            metrics.update(
                log_z=log_z.detach(),
                residual=residual.detach().abs().mean(),
                weight_clip_frac=(w >= args.max_weight).float().mean()
                if args.weight_clip == "max"
                else ((w <= 1 - args.weight_eps) | (w >= 1 + args.weight_eps)).float().mean()
                if args.weight_clip == "eps"
                else torch.zeros(()),
                weight_mean=w.mean(),
            )
        if not torch.isfinite(loss):
            raise FloatingPointError(f"objective {obj!r} produced a non-finite loss ({loss.item()})")
        if args.log_kl_old:
            # KL(pi_old || pi_theta) = E_{y ~ pi_old}[log pi_old(y) - log pi_theta(y)], sequence level
            kl_old = ((old - logp.detach()) * mask).sum(1).mean()
            metrics["kl_old"] = kl_old
            if obj == "paced":
                metrics["paced/beta_kl_old"] = args.paced_kl_coef * kl_old
        # ---- metrics (TRL averages the lists per logging step; report_to sees them)
        with torch.no_grad():
            self._log(mode, f"objective/{obj}_loss", loss)
            self._log(mode, "entropy", masked_mean(entropy.float(), mask))
            if ref is not None:
                self._log(mode, "kl_ref", masked_mean(kl_k3(logp, ref.float()), mask))
            if "log_z" in metrics:
                lz = metrics.pop("log_z").float()
                self._log(mode, "log_z/mean", lz.mean())
                self._log(mode, "log_z/std", lz.std() if lz.numel() > 1 else torch.zeros(()))
            for k, v in metrics.items():
                self._log(mode, k, v)
        normalizer = getattr(self, "current_gradient_accumulation_steps", 1) if mode == "train" else 1.0
        return loss / normalizer
