"""The trainer: :class:`TiltGRPOTrainer`, TRL's ``GRPOTrainer`` whose loss is an entry of
:func:`~tiltlab.llm.train.online.losses.loss_function` (see the package's docstring)."""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable
from typing import Any

import torch
import trl.trainer.grpo_trainer as gt
from torch import Tensor
from transformers import TrainerCallback, set_seed
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOTrainer
from trl.data_utils import is_conversational
from trl.trainer.utils import pad

from tiltlab.files import atomic_path
from tiltlab.llm.base.models import load_model, resolve_model
from tiltlab.llm.base.scoring import build_batch
from tiltlab.llm.disa.labels import check_label_compat
from tiltlab.llm.disa.logz_head import attach_log_z_head, get_log_z_head, prompt_log_z
from tiltlab.objectives.correction import kl_penalty, sequence_is_weight
from tiltlab.objectives.diagnostics import flip_stats, pearson, residual_stats, sequence_kl_old, spearman
from tiltlab.objectives.paced import ReplayBuffer
from tiltlab.objectives.pg import (
    group_advantages,
    kl_in_reward,
    masked_mean,
)
from tiltlab.objectives.tb import (
    sequence_logprob,
    vargrad_log_z,
)
from tiltlab.objectives.transforms import affine_reward

from ..health import HealthMonitor, bounds_of
from ..online_rules import check_trainer_inputs
from ..paced import PacedMixin
from ..signal_guard import SignalGuardMixin
from ..vllm_sync import cpu_colocate_llm, keep_log_z_head_out, reload_on_cpu
from .config import ADV_SCALE, TRL_ADVANTAGE_EPS, TiltGRPOConfig, needs_ref, tb_family
from .losses import _WINDOW_TOKENS, LossBatch, loss_function

logger = logging.getLogger(__name__)
LogZFn = Callable[[list[Any]], Tensor]
FLIP_CHECKED = ("disa", "flowrl", "vargrad")
"""The TB objectives whose residuals are scored again after each optimizer step (``log_residual_flips``);
PACED's log Z path (its replay and selection state) is not re-run."""


class _ResidualFlips(TrainerCallback):
    """Calls :meth:`TiltGRPOTrainer._residuals_after_step` after each optimizer step (before the step is logged)."""

    def __init__(self, trainer: TiltGRPOTrainer) -> None:
        self.trainer = trainer

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.trainer._residuals_after_step()


TILT_STATE = "tiltlab_state_{}.pt"
"""Per-process trainer state in each checkpoint (see :meth:`TiltGRPOTrainer._tilt_state`)."""


def _is_chat_dataset(dataset) -> bool | None:
    """Whether the dataset's prompts are conversational (TRL renders them with the chat template);
    None without a dataset."""
    if dataset is None or len(dataset) == 0:
        return None

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
    """``GRPOTrainer`` whose loss is one of the declared ``online`` objectives from ``objectives/``.

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
            model = resolve_model(model)
        obj = args.objective
        # TRL's KL-to-ref coefficient, used by grpo/gspo/lad in the loss; with kl_in_reward it goes into the
        # reward instead (TRL's own beta stays, so that TRL builds the reference model and its log-probs)
        self.kl_coef = 0.0 if args.kl_in_reward else float(args.beta)
        if obj in needs_ref():  # TiltGRPOConfig refused any other beta than 0 for these objectives
            # TRL builds the reference model and its log-probs only when beta != 0; the TB losses need them and
            # have no KL term (self.kl_coef stays 0; the KL to ref is only logged)
            args.beta = 1.0
            logger.info(
                "objective=%r: TRL's beta set to 1.0 internally so that TRL computes pi_ref's log-probs; the loss has "
                "no KL term",
                obj,
            )
        if obj == "flowrl" or (obj == "paced" and args.paced_embeddings == "live"):
            set_seed(args.seed)  # the head is created here, before GRPOTrainer seeds: same seed, same head
            if isinstance(model, str):
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
                tilt_beta=args.tilt_beta,
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
            ReplayBuffer(capacity=args.paced_replay_capacity, n_add=args.paced_replay_add)
            if obj == "paced" and args.paced_replay
            else None
        )
        self._paced_rng = random.Random(int(args.seed))
        _record_profiled_times()
        # no CUDA: TRL's colocated vLLM is built with CPU settings (llm/train/vllm_sync.py), in the
        # policy's dtype (TRL has loaded the policy when it builds the engine)
        with cpu_colocate_llm(lambda: _param_dtype(getattr(self, "model", None)), args.vllm_kv_cache_memory_bytes):
            super().__init__(model=model, reward_funcs=reward_funcs, args=args, train_dataset=train_dataset, **kwargs)
        head = get_log_z_head(self.model, required=False)
        if getattr(self, "vllm_generation", None) is not None:  # TRL's weight sync (llm/train/vllm_sync.py)
            if head is not None:
                keep_log_z_head_out(self.vllm_generation)
            reload_on_cpu(self.vllm_generation)
        if head is not None and not any(p.requires_grad for p in head.parameters()):
            raise ValueError(
                "the log Z head is frozen (PEFT freezes non-adapter modules): pass "
                "peft_config with modules_to_save=['log_z_head'] for a learned log Z"
            )
        metric = args.metric_for_best_model or "reward"
        self.health = HealthMonitor(
            bounds_of(args),
            metric=metric if metric.startswith("eval_") else f"eval_{metric}",
            greater_is_better=args.greater_is_better is not False,
        )
        self.add_callback(self.health)
        self._flip_pending: tuple[dict, Tensor] | None = None
        if args.log_residual_flips and obj in FLIP_CHECKED:
            self.add_callback(_ResidualFlips(self))
        if obj == "paced" and args.paced_embeddings == "live" and getattr(self.accelerator, "is_fsdp2", False):
            raise ValueError(
                "paced_embeddings='live' calls the log Z head outside the policy's forward, which FSDP2 does not "
                "support (mixed torch.Tensor and DTensor); use paced_embeddings='frozen_ref' (the paper's Z_phi)"
            )
        if obj == "paced" and args.paced_embeddings == "frozen_ref":
            self._paced_setup_frozen()
        # the groups per process and DISA's frozen log Z source (online_rules.py: `--dry-run` runs the same check)
        check_trainer_inputs(args, () if train_dataset is None else train_dataset.column_names, log_z_fn is not None)
        uses_frozen = obj == "disa" or (obj == "paced" and args.paced_select_from == "disa")
        if uses_frozen and args.disa_label == "column":
            self.log_z_fn = None  # the column only: no predictor (no second model) during training

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

        ids_list = self._tokenize_prompts(prompts)[0]
        dev = self.accelerator.device
        pid = self._tokenizer.pad_token_id
        # left-padded prompts only (empty completions): build_batch pads right; the head pools with the mask
        ids, attn, _, _ = build_batch(ids_list, [[] for _ in ids_list], pid, "left", dev)
        return ids, attn

    def _generate_and_score_completions(self, inputs):
        t0 = time.perf_counter()
        self._logp_phase, self._logp_seconds = "generation", 0.0
        try:
            out = self._generate_and_score(inputs)
        finally:
            self._logp_phase = "loss"
        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["time/generate_and_score"].append(time.perf_counter() - t0)
        # the log-prob passes TRL runs at generation (pi_old for the sampler's IS ratio, pi_ref), inside the above
        self._metrics[mode]["time/generation_logps"].append(self._logp_seconds)
        return out

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        """TRL's, timed while generating (:meth:`_generate_and_score_completions` logs the sum)."""
        if getattr(self, "_logp_phase", "loss") != "generation":
            return super()._get_per_token_logps_and_entropies(*args, **kwargs)
        t0 = time.perf_counter()
        try:
            return super()._get_per_token_logps_and_entropies(*args, **kwargs)
        finally:
            self._logp_seconds += time.perf_counter() - t0

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
        if obj not in tb_family() and obj != "lad":
            return out
        mask = out["completion_mask"].float()
        if "old_per_token_logps" not in out:
            out["old_per_token_logps"] = self._behaviour_logps(out, mode)
        if obj in tb_family():
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
            lp_old = sequence_logprob(out["old_per_token_logps"], mask, normalize=scale)
            lp_ref = sequence_logprob(out["ref_per_token_logps"], mask, normalize=scale)
            lz = vargrad_log_z(
                self._gathered(lp_old).view(-1, g),
                self._gathered(lp_ref).view(-1, g),
                self._gathered(out["tb_reward"]).view(-1, g),
                beta=args.tilt_beta,
                detach=True,
            )
            out["log_z"] = self._local(lz.repeat_interleave(g), n)
        if args.log_z_accuracy_correlation and mode == "train" and obj in tb_family():
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
        seq_old = self._gathered(sequence_logprob(old.float(), mask, normalize="sum")).to(r_global.device)
        seq_ref = self._gathered(sequence_logprob(out["ref_per_token_logps"].float(), mask, normalize="sum")).to(
            r_global.device
        )
        penalised = kl_in_reward(r_global.float(), seq_old, seq_ref, coef=float(args.beta))
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

    def _objective_output(self, model, inputs, mode: str):
        """The objective's :class:`~tiltlab.objectives.output.LossOutput` on TRL's batch ``inputs`` and the
        tensors its metrics are computed from: ``(out, logp, entropy, ref, mask, old)``."""
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
        seq_w = None if isr is None else sequence_is_weight(isr, mask, cap=self.vllm_importance_sampling_clip_max)
        batch = LossBatch(logp, old, ref, mask, isr, seq_w, inputs, prompt_ids, prompt_mask, mode)
        return loss_function(self.args.objective)(self, model, batch), logp, entropy, ref, mask, old

    def _residuals_after_step(self) -> None:
        """After the optimizer step (:class:`_ResidualFlips`): the TB residuals of the step's last micro-batch
        under the updated weights, against those it was trained with (:func:`~tiltlab.objectives.diagnostics.
        flip_stats`, gathered over processes), appended to this step's logged metrics."""
        pending, self._flip_pending = self._flip_pending, None
        if pending is None:
            return
        inputs, before = pending
        t0 = time.perf_counter()
        with torch.no_grad():
            out = self._objective_output(self.model_wrapped, inputs, "train")[0]
        after = out.metrics["residuals"].detach().float()
        stats = flip_stats(self.accelerator.gather(before), self.accelerator.gather(after))
        for k, v in stats.items():
            self._metrics["train"][k].append(v)
        self._metrics["train"]["time/residual_flips"].append(time.perf_counter() - t0)

    def _compute_loss(self, model, inputs):
        args, obj = self.args, self.args.objective
        mode = "train" if self.model.training else "eval"
        # called on the class: the loss tests run _compute_loss on stand-ins that carry only what it reads
        out, logp, entropy, ref, mask, old = TiltGRPOTrainer._objective_output(self, model, inputs, mode)
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
                # the sequence-level KL(pi || pi_ref) on pi's samples, mean_b sum_t (logp - logp_ref): what enters
                # the TB residual (sequence_kl_old(a, b) = mean_b sum_t (a - b))
                self._log(mode, "kl_ref_seq", sequence_kl_old(logp.detach(), ref.float(), mask))
            residuals = metrics.pop("residuals", None)
            if residuals is not None:
                res = self.accelerator.gather(residuals.detach().float().reshape(-1))
                for k, v in residual_stats(res).items():
                    self._metrics[mode][k].append(v)
                if mode == "train" and args.log_residual_flips and obj in FLIP_CHECKED:
                    self._flip_pending = (inputs, residuals.detach().float().reshape(-1))
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
