"""Peer tests: ``tiltlab.objectives`` against the engines users compare with, on the same tensors.

* TRL (installed with the ``[llm]`` extra): ``GRPOTrainer._compute_loss`` itself, run on a stub
  trainer (the per-token log-probs are given), for every TRL loss type tiltlab implements, with a
  KL term and the vLLM importance-sampling ratio on.
* veRL 0.9.1 ``verl.trainer.ppo.core_algos``: GRPO advantages, the PPO clip (clip-higher, dual
  clip, ``log_ratio`` clamp at 20) under its three aggregations, GSPO, and the k1/k2/k3 KL; and
  the KL penalty in the reward through veRL's own ``ray_trainer.apply_kl_penalty`` and
  ``compute_advantage`` (the v0 trainer's functions; its imports are in the ``verl`` extra).
  veRL is not a dependency of tiltlab; install it as CI does (``.ci/run``):
  ``pip install --no-deps verl==0.9.1 tensordict==0.15.3`` and ``pip install omegaconf ray codetiming
  pyvers orjson``. Without it these tests are skipped (with that reason), except with ``CI`` set
  (``CI=true``), where they fail.

Every comparison is in float64 and must agree to 1e-12 (both sides evaluate the same formula on
O(1) numbers: the differences are summation order, ~1e-16 relative). Convention differences
(veRL's seq-mean denominators exclude empty sequences, veRL clamps k3 to [-10, 10]) are kept out
of the inputs here and named in ``docs/math.md``'s conventions table.
"""

from __future__ import annotations

import importlib.util
import os
from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tiltlab.objectives import pg

pytestmark = pytest.mark.peer

F64 = torch.float64
TOL = {"rtol": 1e-12, "atol": 1e-12}  # float64, same formula: see the module docstring
# veRL's seq-mean-token-mean divides each sequence's token sum by n_tokens + 1e-8: a relative change
# of at most 1e-8 per O(1) sequence term; 1e-7 / 1e-8 covers it and stays 1e4 below the 1e-3
# differences a wrong formula (a missing dual clip, another aggregation) makes here
SEQ_MEAN_TOL = {"rtol": 1e-7, "atol": 1e-8}
B, T, G = 8, 6, 4


def _batch(seed: int = 0, scale: float = 0.4):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([6, 1, 3, 4, 2, 6, 5, 3])  # ragged, no empty row (see the docstring)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(F64)
    lp = -torch.rand(B, T, generator=g, dtype=F64) * 2
    old = lp + scale * torch.randn(B, T, generator=g, dtype=F64)
    ref = lp + scale * torch.randn(B, T, generator=g, dtype=F64)
    adv = torch.randn(B, generator=g, dtype=F64)
    adv[0], adv[1] = abs(float(adv[0])) + 0.5, -abs(float(adv[1])) - 0.5
    return lp, old, ref, adv, mask


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().to(F64) - b.detach().to(F64)).abs().max())


# ------------------------------------------------------------------------------------------ TRL
trl_spec = importlib.util.find_spec("trl")


class _Accelerator:
    num_processes = 1
    device = torch.device("cpu")
    sync_gradients = True

    def gather(self, x):
        return x

    def reduce(self, x, reduction="sum"):
        return x


def _trl_loss(loss_type: str, lp, old, ref, adv, mask, isr, beta: float, max_len: int) -> torch.Tensor:
    """TRL 1.16's ``GRPOTrainer._compute_loss`` on one micro-batch (eval mode: no accumulation)."""
    from trl import GRPOTrainer

    stub = SimpleNamespace(
        args=SimpleNamespace(delta=None, use_bias_correction_kl=False, steps_per_generation=1),
        accelerator=_Accelerator(),
        model=SimpleNamespace(training=False),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        current_gradient_accumulation_steps=1,
        loss_type=loss_type,
        beta=beta,
        epsilon_low=0.2,
        epsilon_high=0.28,
        importance_sampling_level="token",
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        use_vllm=True,
        vllm_importance_sampling_correction=True,
        max_completion_length=max_len,
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        _get_per_token_logps_and_entropies=lambda *a, **k: (lp, torch.ones_like(lp), None),
    )
    inputs = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": mask.long(),
        "advantages": adv,
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        "importance_sampling_ratio": isr,
        "num_items_in_batch": mask.sum(),
    }
    return GRPOTrainer._compute_loss(stub, None, inputs)


TRL_AGG = {
    "grpo": "seq_mean_token_mean",
    "bnpo": "token_mean",
    "dapo": "token_mean",
    "dr_grpo": "seq_mean_token_sum_norm",
}


@pytest.mark.skipif(trl_spec is None, reason="TRL is not installed (the [llm] extra)")
@pytest.mark.parametrize("loss_type", sorted(TRL_AGG))
@pytest.mark.parametrize("isr_level", ["token", "sequence"])
def test_trl_compute_loss(loss_type, isr_level):
    lp, old, ref, adv, mask = _batch(1)
    g = torch.Generator().manual_seed(2)
    isr = torch.rand(B, T if isr_level == "token" else 1, generator=g, dtype=F64) + 0.5
    want = _trl_loss(loss_type, lp, old, ref, adv, mask, isr, beta=0.3, max_len=9)
    got = pg.grpo_loss(
        lp, old, adv, mask, clip_eps=0.2, clip_eps_high=0.28, loss_agg=TRL_AGG[loss_type],  # type: ignore[arg-type]
        token_logp_ref=ref, kl_coef=0.3, is_weight=isr[:, 0] if isr_level == "sequence" else isr, max_len=9,
    ).loss  # fmt: skip
    torch.testing.assert_close(got, want, **TOL)


# ----------------------------------------------------------------------------------------- veRL
try:  # veRL's core_algos imports ray, tensordict and omegaconf at import time
    import verl.trainer.ppo.core_algos as _verl_core
except ImportError as e:  # not installed, or installed without the packages core_algos imports
    _verl_core, _verl_error = None, f"{type(e).__name__}: {e}"
else:
    _verl_error = ""
# With CI set (CI=true, as CI services set it) a missing veRL is a failure, not a skip: the skip
# mark is off and every veRL test fails in _core() with the import error.
_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
_VERL_HINT = (
    f"veRL's core_algos is not importable ({_verl_error}): pip install --no-deps verl==0.9.1 "
    "tensordict==0.15.3; pip install omegaconf ray codetiming pyvers orjson"
)
needs_verl = pytest.mark.skipif(_verl_core is None and not _CI, reason=_VERL_HINT)


def _core():
    if _verl_core is None:
        pytest.fail(f"CI is set and {_VERL_HINT}")
    return _verl_core


def _actor(**kw):
    from verl.workers.config import ActorConfig

    return ActorConfig(strategy="fsdp", rollout_n=G, ppo_micro_batch_size_per_gpu=1, **kw)


@needs_verl
@pytest.mark.parametrize("std", [True, False])
def test_verl_grpo_advantage(std):
    g = torch.Generator().manual_seed(3)
    rewards = torch.randint(0, 3, (B // G, G), generator=g).to(F64)
    scores = torch.zeros(B, T, dtype=F64)
    scores[:, 0] = rewards.reshape(-1)
    index = np.repeat(np.arange(B // G), G)
    want, _ = _core().compute_grpo_outcome_advantage(scores, torch.ones(B, T, dtype=F64), index, 1e-6, std)
    got = pg.group_advantages(rewards, scale="std" if std else "none", eps=1e-6).reshape(-1)
    torch.testing.assert_close(got, want[:, 0], **TOL)


VERL_AGG = {
    "token-mean": "token_mean",
    "seq-mean-token-mean": "seq_mean_token_mean",
    "seq-mean-token-sum-norm": "seq_mean_token_sum_norm",
}


@needs_verl
@pytest.mark.parametrize("agg", sorted(VERL_AGG))
@pytest.mark.parametrize("weighted", [False, True])
def test_verl_ppo_clip_dual_clip(agg, weighted):
    # scale 1.2: ratios up to ~e^3 reach the dual clip (c = 3) on negative-advantage tokens
    lp, old, _, adv, mask = _batch(4, scale=1.2)
    w = torch.rand(B, T, generator=torch.Generator().manual_seed(5), dtype=F64) + 0.5 if weighted else None
    cfg = _actor(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, loss_agg_mode=agg)
    cfg.global_batch_info["loss_scale_factor"] = T + 3  # a fixed Dr. GRPO normalizer
    lpg = lp.clone().requires_grad_(True)
    want, _ = _core().compute_policy_loss_vanilla(old, lpg, adv[:, None].expand(B, T), mask, agg, cfg, w)
    (gw,) = torch.autograd.grad(want, lpg)
    lpg = lp.clone().requires_grad_(True)
    got = pg.grpo_loss(
        lpg, old, adv, mask, clip_eps=0.2, clip_eps_high=0.28, loss_agg=VERL_AGG[agg],  # type: ignore[arg-type]
        max_len=T + 3, dual_clip=3.0, log_ratio_clip=20.0, is_weight=w,
    ).loss  # fmt: skip
    (gg,) = torch.autograd.grad(got, lpg)
    tol = SEQ_MEAN_TOL if agg == "seq-mean-token-mean" else TOL
    torch.testing.assert_close(got, want, **tol)
    torch.testing.assert_close(gg, gw, **tol)
    if not weighted and agg == "token-mean":  # the dual clip binds on this sample: without it the value differs
        plain = pg.grpo_loss(lp, old, adv, mask, clip_eps=0.2, clip_eps_high=0.28).loss
        assert abs(float(plain - want.detach())) > 1e-3


@needs_verl
def test_verl_gspo():
    lp, old, _, adv, mask = _batch(6, scale=0.05)
    cfg = _actor(clip_ratio=0.1, clip_ratio_low=0.1, clip_ratio_high=0.15, loss_agg_mode="seq-mean-token-mean")
    lpg = lp.clone().requires_grad_(True)
    want, _ = _core().compute_policy_loss_gspo(old, lpg, adv[:, None].expand(B, T), mask, "seq-mean-token-mean", cfg)
    (gw,) = torch.autograd.grad(want, lpg)
    lpg = lp.clone().requires_grad_(True)
    got = pg.gspo_loss(lpg, old, adv, mask, clip_eps=0.1, clip_eps_high=0.15).loss
    (gg,) = torch.autograd.grad(got, lpg)
    torch.testing.assert_close(got, want, **SEQ_MEAN_TOL)
    torch.testing.assert_close(gg, gw, **SEQ_MEAN_TOL)


@needs_verl
@pytest.mark.parametrize("k", ["k1", "k2", "k3"])
def test_verl_kl_estimators(k):
    lp, _, ref, _, _ = _batch(7)
    want = _core().kl_penalty(lp, ref, k)
    torch.testing.assert_close(pg.kl_estimate(lp, ref, estimator=k), want, **TOL)  # type: ignore[arg-type]


@needs_verl
def test_verl_seq_mean_counts_only_nonempty_sequences():
    # the one aggregation convention that differs: veRL's seq-mean leaves an empty sequence out of
    # the count, tiltlab (with TRL) divides by B; both give the empty sequence 0 loss
    lp, old, _, adv, mask = _batch(8)
    mask[1] = 0.0
    cfg = _actor(clip_ratio=0.2, loss_agg_mode="seq-mean-token-mean")
    want, _ = _core().compute_policy_loss_vanilla(old, lp, adv[:, None].expand(B, T), mask, "seq-mean-token-mean", cfg)
    got = pg.grpo_loss(lp, old, adv, mask, loss_agg="seq_mean_token_mean", dual_clip=3.0, log_ratio_clip=20.0).loss
    torch.testing.assert_close(got * B / (B - 1), want, **SEQ_MEAN_TOL)


@needs_verl
@pytest.mark.parametrize("std", [True, False])
def test_verl_kl_in_reward_advantage(std):
    """veRL's ``algorithm.use_kl_in_reward=True, kl_penalty="kl"`` path itself: ``apply_kl_penalty``
    (``ray_trainer``, the token-level reward ``score - coef * (old - ref)`` per token) then
    ``compute_advantage`` with the GRPO estimator (the outcome advantage sums the token-level
    rewards), against ``group_advantages(kl_in_reward(r, sum old, sum ref, coef))``. Rows of a group
    are not contiguous (veRL groups by ``uid``), lengths are ragged, the score sits on the last token."""
    _core()
    from verl import DataProto
    from verl.trainer.ppo.core_algos import AdvantageEstimator, FixedKLController
    from verl.trainer.ppo.ray_trainer import apply_kl_penalty, compute_advantage

    coef = 0.37
    _, old, ref, _, mask = _batch(11, scale=0.8)
    old = old.clone()
    old[mask == 0] = -5.0  # garbage beyond the response: veRL masks it, tiltlab's sums never see it
    g = torch.Generator().manual_seed(12)
    rewards = torch.randint(0, 2, (B // G, G), generator=g).to(F64)
    perm = torch.randperm(B, generator=g)
    uid = np.array([f"prompt-{i // G}" for i in range(B)], dtype=object)[perm.numpy()]
    lengths = mask.sum(1).long()
    scores = torch.zeros(B, T, dtype=F64)
    scores[torch.arange(B), lengths - 1] = rewards.reshape(-1)[perm]
    data = DataProto.from_dict(
        tensors={"token_level_scores": scores, "old_log_probs": old, "ref_log_prob": ref, "response_mask": mask},
        non_tensors={"uid": uid},
    )
    data, metrics = apply_kl_penalty(data, FixedKLController(coef), kl_penalty="kl")
    data = compute_advantage(data, AdvantageEstimator.GRPO, norm_adv_by_std_in_grpo=std)
    want = data.batch["advantages"]

    inv = torch.argsort(perm)  # back to group-major order: row p * G + j of prompt p
    seq_old = (old * mask).sum(1)[inv].view(B // G, G)
    seq_ref = (ref * mask).sum(1)[inv].view(B // G, G)
    penalised = pg.kl_in_reward(rewards, seq_old, seq_ref, coef=coef)
    got = pg.group_advantages(penalised, scale="std" if std else "none", eps=1e-6).reshape(-1)[perm]
    torch.testing.assert_close(want, got[:, None] * mask, **TOL)
    assert metrics["actor/reward_kl_penalty_coeff"] == coef
    # the penalty moves the advantages here: without it they differ
    plain = pg.group_advantages(rewards, scale="std" if std else "none", eps=1e-6).reshape(-1)[perm]
    assert _max_diff(plain[:, None] * mask, want) > 1e-2
