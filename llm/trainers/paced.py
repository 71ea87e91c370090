"""PACED-RL's prompt selection and replay on the online trainer (the math is in
:mod:`tiltlab.objectives.paced`: ``select_prompts``, ``replay_priority``, ``ReplayBuffer``).

:class:`PacedMixin` holds the two steps of :class:`~tiltlab.llm.trainers.online.TiltGRPOTrainer`
that run at generation time, where whole groups are present:

* :meth:`PacedMixin._paced_select` (PACED-RL Sec. 4.2) before the rollouts: keep the prompts whose
  estimated accuracy ``p_hat`` is closest to ``tau``;
* :meth:`PacedMixin._paced_replay` (PACED-RL Sec. 4.4) after the rewards: add the correct samples
  to the prioritized buffer and append the buffer's contents to the batch.

It reads the trainer's state (``args``, ``model``, ``train_dataset``, ``accelerator``,
``_metrics``, ``_replay``, ``_paced_rng``, ``_frozen_log_z``, ``_prompt_tensors``,
``_get_per_token_logps_and_entropies``) and is mixed into ``TiltGRPOTrainer`` only.
"""

from __future__ import annotations

import random

import torch
from torch import Tensor

from tiltlab.objectives.estimators import pass_rate_from_log_z
from tiltlab.objectives.paced import accuracy_from_log_z, replay_priority, select_prompts

from .logz_head import prompt_log_z

__all__ = ["PacedMixin"]


class PacedMixin:
    """PACED-RL selection and replay for :class:`~tiltlab.llm.trainers.online.TiltGRPOTrainer`."""

    def paced_state_dict(self) -> dict:
        """What a checkpoint must hold for a bit-identical resume: the selection RNG and the replay buffer."""
        return {
            "rng": self._paced_rng.getstate(),
            "replay": None if self._replay is None else self._replay.state_dict(),
        }

    def load_paced_state_dict(self, state: dict) -> None:
        self._paced_rng.setstate(state["rng"])
        if self._replay is not None and state.get("replay") is not None:
            self._replay.load_state_dict(state["replay"])

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
