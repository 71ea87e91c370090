"""PACED-RL's prompt selection and replay on the online trainer (the math is in
:mod:`tiltlab.objectives.paced`: ``select_prompts``, ``replay_priority``, ``ReplayBuffer``).

:class:`PacedMixin` holds the two steps of :class:`~tiltlab.llm.train.online.TiltGRPOTrainer`
that run at generation time, where whole groups are present:

* :meth:`PacedMixin._paced_select` (PACED-RL Sec. 4.2) before the rollouts: keep the prompts whose
  estimated accuracy ``p_hat`` is closest to ``tau``;
* :meth:`PacedMixin._paced_replay` (PACED-RL Sec. 4.4) after the rewards: add the correct samples
  to the prioritized buffer and append the buffer's contents to the batch.

Z_phi (``paced_embeddings``): ``"frozen_ref"`` (the paper, Sec. 4.3) is a 3-layer MLP
(:class:`~tiltlab.llm.disa.logz_head.LogZHead`) on frozen ``pi_ref`` prompt embeddings (masked
mean of the final hidden states) precomputed once over the whole dataset (the policy at
initialization is ``pi_ref``; under ZeRO-3 with its parameters gathered); only the MLP trains. It lives outside the policy, replicated on
every process with its own optimizer (its gradient all-reduced, averaged over processes, at each
optimizer step), so no standalone call ever touches a sharded policy parameter (FSDP2 DTensors,
ZeRO-3 partitions). ``"live"`` is the head on the live policy's hidden states (FlowRL's code).

It reads the trainer's state (``args``, ``model``, ``train_dataset``, ``accelerator``,
``_metrics``, ``_replay``, ``_paced_rng``, ``_frozen_log_z``, ``_prompt_tensors``,
``_get_per_token_logps_and_entropies``) and is mixed into ``TiltGRPOTrainer`` only.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
from pathlib import Path

import torch
from torch import Tensor
from tqdm.auto import tqdm
from trl.trainer.utils import pad

from tiltlab.files import atomic_path
from tiltlab.llm.base.models import masked_mean_pool, model_fingerprint
from tiltlab.llm.base.scoring import hidden_states
from tiltlab.llm.disa.logz_head import LogZHead, prompt_log_z
from tiltlab.objectives.estimators import pass_rate_from_log_z
from tiltlab.objectives.paced import accuracy_from_log_z, replay_priority, select_prompts

__all__ = ["PacedMixin"]


def _prompt_key(prompt) -> str:
    return repr(prompt)


def _zero3_gathered(model, only: list | None = None):
    """A context in which a model whose parameters DeepSpeed ZeRO-3 partitioned at load
    (``zero.Init``) has them whole on every rank (a no-op for any other model). The embedding pass
    runs when the trainer is built, before DeepSpeed's engine installs the hooks that gather each
    layer for its forward; it gathers all parameters at once, so each rank holds the full weights
    (its dtype) for the duration of the pass. ``only``: gather just these parameters of the model."""

    params = [p for p in (model.parameters() if only is None else only) if hasattr(p, "ds_id")]
    if not params:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(params, modifier_rank=None)


class PacedMixin:
    """PACED-RL selection and replay for :class:`~tiltlab.llm.train.online.TiltGRPOTrainer`."""

    _paced_head: LogZHead | None = None
    _paced_opt: torch.optim.Optimizer | None = None
    _paced_emb: Tensor | None = None
    _paced_index: dict[str, int] | None = None

    # ------------------------------------------------------------------------------------------
    # Z_phi on frozen pi_ref embeddings (paced_embeddings="frozen_ref")
    def _paced_setup_frozen(self) -> None:
        """Precompute the ``pi_ref`` prompt embeddings of the train (and eval) prompts and build
        the replicated MLP and its optimizer. Call after ``GRPOTrainer.__init__`` and before the
        first step (the model is still the unwrapped initial policy, i.e. ``pi_ref``)."""
        args = self.args
        prompts: list = []
        seen: set[str] = set()
        datasets = [self.train_dataset]
        ev = getattr(self, "eval_dataset", None)
        datasets += list(ev.values()) if isinstance(ev, dict) else [ev] if ev is not None else []
        for ds in datasets:
            for p in ds["prompt"]:
                k = _prompt_key(p)
                if k not in seen:
                    seen.add(k)
                    prompts.append(p)
        self._paced_index = {_prompt_key(p): i for i, p in enumerate(prompts)}
        self._paced_emb = self._paced_ref_embeddings(prompts)
        with torch.random.fork_rng(devices=[]):  # identical initial weights on every process, seeded
            torch.manual_seed(int(args.seed))
            head = LogZHead(self._paced_emb.shape[1], args.log_z_hidden, args.log_z_layers, args.log_z_dropout)
        self._paced_head = head.to(self.accelerator.device)
        lr = args.log_z_lr if args.log_z_lr is not None else args.learning_rate
        self._paced_opt = torch.optim.AdamW(self._paced_head.parameters(), lr=lr, weight_decay=0.0)

    def _paced_ref_embeddings(self, prompts: list) -> Tensor:
        """``[N, H]`` float32 masked-mean-pooled final hidden states of ``pi_ref`` (the initial
        policy); each process embeds every ``world``-th prompt, then all-gather. Cached in
        ``output_dir/paced_ref_embeddings.pt`` (keyed by the prompts in order and the model's
        :func:`~tiltlab.llm.base.models.model_fingerprint`)."""

        acc = self.accelerator
        model = acc.unwrap_model(self.model)
        name = str(getattr(getattr(model, "config", None), "_name_or_path", ""))
        # the key holds the weights too (model_fingerprint: name, config, slices of the first, middle
        # and last parameter): another model saved under the same name never reads these embeddings
        params = list(model.parameters())
        with _zero3_gathered(model, only=[params[0], params[len(params) // 2], params[-1]]):
            fingerprint = model_fingerprint(model, name)
        key = hashlib.sha256(("\n".join(_prompt_key(p) for p in prompts) + "|" + fingerprint).encode()).hexdigest()
        cache = Path(self.args.output_dir) / "paced_ref_embeddings.pt"
        if cache.is_file():
            d = torch.load(cache, map_location="cpu", weights_only=True)
            if d.get("key") == key:
                return d["emb"].float()
        world, rank = acc.num_processes, acc.process_index
        mine = list(range(rank, len(prompts), world))
        m = (len(prompts) + world - 1) // world
        bs = max(1, int(self.args.per_device_train_batch_size))
        dev = next(model.parameters()).device
        rows: list[Tensor] = []
        was_training = model.training
        model.eval()

        with torch.no_grad(), _zero3_gathered(model):
            for s in tqdm(range(0, len(mine), bs), desc="PACED pi_ref embeddings", disable=not acc.is_main_process):
                ids, mask = self._prompt_tensors([prompts[i] for i in mine[s : s + bs]])
                h = hidden_states(model, ids.to(dev), mask.to(dev))
                rows.append(masked_mean_pool(h.float(), mask.to(dev)).cpu())
        model.train(was_training)
        h_dim = int(model.config.hidden_size)
        local = torch.zeros(m, h_dim)
        if rows:
            cat = torch.cat(rows)
            local[: cat.shape[0]] = cat
        gathered = acc.gather(local.to(acc.device)).cpu().view(world, m, h_dim) if world > 1 else local[None]
        emb = torch.stack([gathered[i % world, i // world] for i in range(len(prompts))])
        if acc.is_main_process:
            with atomic_path(cache) as tmp:
                torch.save({"key": key, "emb": emb}, tmp)
        return emb

    def _paced_rows_emb(self, rows: list[dict]) -> Tensor:
        """``[B, H]`` frozen embeddings of dataset rows (one per row)."""
        try:
            idx = [self._paced_index[_prompt_key(r["prompt"])] for r in rows]
        except KeyError as e:
            raise ValueError(
                "PACED frozen_ref: a prompt is not in the precomputed pi_ref embeddings (only the train/eval "
                "datasets given to the trainer are embedded)"
            ) from e
        return self._paced_emb[idx]

    def _paced_frozen_log_z(self, emb: Tensor) -> Tensor:
        """``[B]`` log Z_phi from frozen embeddings ``[B, H]`` (gradient into the MLP only; dropout
        only where a gradient is taken in training)."""
        self._paced_head.train(bool(self.model.training and torch.is_grad_enabled()))
        return self._paced_head(emb.to(self.accelerator.device))

    def _paced_log_z(self, model, batch) -> Tensor:
        """The learned PACED log Z of a loss batch: the MLP on frozen embeddings or the live head."""
        if self._paced_head is not None:
            return self._paced_frozen_log_z(batch.inputs["paced_emb"])
        return self._learned_log_z(model, batch)

    def training_step(self, *args, **kwargs):
        out = super().training_step(*args, **kwargs)
        if self._paced_head is not None and self.accelerator.sync_gradients:
            self._paced_head_step()
        return out

    def _paced_head_step(self) -> None:
        """One optimizer step of the replicated MLP: gradients averaged over processes (the same
        reduction DDP applies to the policy), the learning rate follows the policy's schedule."""
        acc, head = self.accelerator, self._paced_head
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in head.parameters()]
        if acc.num_processes > 1:
            flat = torch.cat([g.reshape(-1) for g in grads])
            flat = acc.reduce(flat, reduction="mean")
            off = 0
            for p, g in zip(head.parameters(), grads):
                p.grad = flat[off : off + g.numel()].view_as(p).clone()
                off += g.numel()
        base = self.args.log_z_lr if self.args.log_z_lr is not None else self.args.learning_rate
        sched = getattr(self, "lr_scheduler", None)
        scale = (
            sched.get_last_lr()[0] / self.args.learning_rate if sched is not None and self.args.learning_rate else 1.0
        )
        for g in self._paced_opt.param_groups:
            g["lr"] = base * scale
        self._paced_opt.step()
        self._paced_opt.zero_grad(set_to_none=True)

    # ------------------------------------------------------------------------------------------
    # state for resume: replay buffer, RNG, and the frozen_ref MLP + its optimizer
    def paced_state_dict(self) -> dict:
        """What a checkpoint must hold for a bit-identical resume, outside the policy and TRL's
        checkpoint: the selection RNG, the replay buffer and (``frozen_ref``) the MLP's and its
        optimizer's state dicts."""
        d: dict = {
            "rng": self._paced_rng.getstate(),
            "replay": None if self._replay is None else self._replay.state_dict(),
        }
        if self._paced_head is not None:
            d["head"] = {k: v.detach().cpu().clone() for k, v in self._paced_head.state_dict().items()}
            d["head_opt"] = self._paced_opt.state_dict()
        return d

    def load_paced_state_dict(self, state: dict) -> None:
        """Restore :meth:`paced_state_dict` (same configuration)."""
        self._paced_rng.setstate(state["rng"])
        if self._replay is not None and state.get("replay") is not None:
            self._replay.load_state_dict(state["replay"])
        if self._paced_head is not None:
            if "head" not in state:
                raise ValueError("the saved PACED state has no frozen_ref MLP (paced.embeddings differ?)")
            self._paced_head.load_state_dict(state["head"])
            self._paced_opt.load_state_dict(state["head_opt"])

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
                p_hat = pass_rate_from_log_z(self._frozen_log_z(cand), beta=args.tilt_beta).clamp(0.0, 1.0)
            elif self._paced_head is not None:
                log_z = self._paced_frozen_log_z(self._paced_rows_emb(cand)).float().cpu()
                p_hat = accuracy_from_log_z(log_z, kl_coef=args.paced_kl_coef)
            else:
                ids, mask = self._prompt_tensors([c["prompt"] for c in cand])
                unwrapped = self.accelerator.unwrap_model(self.model)
                log_z = prompt_log_z(unwrapped, ids, mask, detach_input=True).float().cpu()
                p_hat = accuracy_from_log_z(log_z, kl_coef=args.paced_kl_coef)
        chosen = select_prompts(p_hat, tau=args.paced_tau, m=n_groups).tolist()
        self._metrics["train"]["paced/p_hat_selected_mean"].append(float(p_hat[chosen].mean()))
        self._metrics["train"]["paced/p_hat_pool_mean"].append(float(p_hat.mean()))
        return [cand[i] for i in chosen for _ in range(g)]

    def _paced_replay(self, out: dict, inputs: list[dict], r_global: Tensor, g: int) -> dict:
        """PACED Sec. 4.4: add this batch's correct samples (highest ``|N_correct/N - p_hat|``
        first) to the buffer, then append the buffer's contents to the batch. Replayed rows are
        re-anchored on the current ``pi_old`` (their behaviour log-probs are recomputed now)."""

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
                p_hat = pass_rate_from_log_z(out["log_z"].float(), beta=self.args.tilt_beta).clamp(0.0, 1.0)
            elif self._paced_head is not None:
                p_hat = accuracy_from_log_z(
                    self._paced_frozen_log_z(out["paced_emb"]).float(), kl_coef=self.args.paced_kl_coef
                )
            else:
                unwrapped = self.accelerator.unwrap_model(self.model)
                log_z = prompt_log_z(unwrapped, out["prompt_ids"], out["prompt_mask"], detach_input=True).float()
                p_hat = accuracy_from_log_z(log_z, kl_coef=self.args.paced_kl_coef)
        n_corr = correct.float().view(-1, g).sum(1).repeat_interleave(g)
        prio = replay_priority(n_corr, torch.full_like(n_corr, float(g)), p_hat)
        rows = []
        for b in range(n):
            pm = out["prompt_mask"][b].bool()
            cm = out["completion_mask"][b].bool()
            row = {
                "prompt_ids": out["prompt_ids"][b][pm].cpu(),
                "completion_ids": out["completion_ids"][b][cm].cpu(),
                "reward": float(r_local[b]),
                "tb_reward": float(out["tb_reward"][b]),
            }
            if "paced_emb" in out:
                row["paced_emb"] = out["paced_emb"][b].cpu()
            rows.append(row)
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
        if "paced_emb" in out:
            new["paced_emb"] = torch.cat([out["paced_emb"], torch.stack([it["paced_emb"] for it in items]).to(dev)])
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
