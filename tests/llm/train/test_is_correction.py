"""TRL's vLLM importance-sampling ratio reaches every objective of the online trainer (docs/colocate.md).

TRL hands ``inputs["importance_sampling_ratio"]`` to ``_compute_loss``: ``[B, 1]`` in its default
``sequence_mask`` / ``sequence_truncate`` modes (0 for a masked sequence), ``[B, T]`` in the token modes.
For every objective, run ``TiltGRPOTrainer._compute_loss`` on a stub batch and check that the gradient of
each sequence's log-probs scales with that sequence's ratio: ``grad(r) = r_i * grad(1)`` row by row, so a
masked sequence gets no gradient, and a ratio of 1 is the same as no ratio. Token ratios weight each token
(``grpo``, token-level ``lad``) or become the product over the completion capped at
``vllm_importance_sampling_clip_max`` (the sequence-level objectives). The KL-to-reference term is not
IS-weighted (as in TRL), so ``beta = 0`` here."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("trl")

from tiltlab.llm.train.online import TiltGRPOConfig, TiltGRPOTrainer, objectives

B, T = 6, 4


class _Stub:
    """What ``_compute_loss`` and the loss functions read; the policy's token log-probs are ``self.logp``."""

    def __init__(self, args, logp):
        self.args, self.logp = args, logp
        self.accelerator = SimpleNamespace(
            num_processes=1, device=torch.device("cpu"), gather=lambda x: x, unwrap_model=lambda m: m
        )
        self.model = SimpleNamespace(training=True)
        self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
        self.current_gradient_accumulation_steps = 1
        self.kl_coef = 0.0
        self.vllm_importance_sampling_clip_max = 3.0
        self.log_z = torch.linspace(-0.5, 0.5, B, dtype=torch.float64)  # a learned head's output, fixed

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, **kw):
        return self.logp, torch.ones_like(self.logp), None

    def _learned_log_z(self, model, batch):
        return self.log_z

    def _paced_log_z(self, model, batch):
        return self.log_z

    def _dapo_num_tokens(self, inputs, mode):
        return TiltGRPOTrainer._dapo_num_tokens(self, inputs, mode)

    def _log(self, mode, name, value):
        return TiltGRPOTrainer._log(self, mode, name, value)


def _inputs(g: torch.Generator) -> tuple[torch.Tensor, dict]:
    mask = (torch.arange(T)[None, :] < torch.tensor([4, 2, 3, 4, 1, 3])[:, None]).long()
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    return logp, {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": mask,
        "advantages": torch.randn(B, generator=g, dtype=torch.float64),
        # close to the current log-probs: the TB weights and GRPO's ratios stay inside their clips
        "old_per_token_logps": logp + 0.01 * torch.randn(B, T, generator=g, dtype=torch.float64),
        "ref_per_token_logps": logp + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64),
        "rewards": rewards,
        "tb_reward": rewards,
        "log_z": torch.randn(B, generator=g, dtype=torch.float64),
        "num_items_in_batch": mask.sum(),
    }


def _grad(args, ratio: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    logp, inputs = _inputs(torch.Generator().manual_seed(0))
    logp = logp.requires_grad_(True)
    if ratio is not None:
        inputs["importance_sampling_ratio"] = ratio
    loss = TiltGRPOTrainer._compute_loss(_Stub(args, logp), None, inputs)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.detach(), grad


def _args(tmp_path, objective: str, **kw) -> TiltGRPOConfig:
    return TiltGRPOConfig(
        output_dir=str(tmp_path),
        objective=objective,
        beta=0.0,
        per_device_train_batch_size=B,
        num_generations=2,
        max_completion_length=T,
        use_cpu=True,
        report_to="none",
        **kw,
    )


# every objective multiplies its loss by the sampler's IS ratio, except VESPO, which folds it into its
# Gamma weight of the sequence ratio instead (TRL's "vespo": test_trl_loss_types.py checks that)
CASES = [(obj, {"epsilon_high": 5.0} if obj == "cispo" else {}) for obj in objectives() if obj != "vespo"]
CASES += [("lad", {"lad_level": "sequence"})]


@pytest.mark.parametrize(
    "objective,kw", CASES, ids=[c[0] + ("_sequence" if c[1].get("lad_level") else "") for c in CASES]
)
def test_sequence_ratio_scales_each_sequence_gradient(objective, kw, tmp_path):
    args = _args(tmp_path, objective, **kw)
    ratio = torch.tensor([0.5, 1.7, 0.0, 1.0, 2.5, 0.8], dtype=torch.float64)[:, None]  # row 2 masked by TRL
    loss_none, g_none = _grad(args, None)
    loss_one, g_one = _grad(args, torch.ones(B, 1, dtype=torch.float64))
    _, g_r = _grad(args, ratio)
    # float32 losses (the trainer casts the log-probs with .float()): rounding ~1e-7 relative
    torch.testing.assert_close(loss_one, loss_none, rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(g_one, g_none, rtol=1e-6, atol=1e-8)
    assert (g_one.abs().sum(1) > 1e-4).all(), g_one  # every sequence has a gradient to scale
    torch.testing.assert_close(g_r, ratio * g_one, rtol=1e-5, atol=1e-8)
    assert torch.all(g_r[2] == 0)


@pytest.mark.parametrize("objective", ["grpo", "lad"])
def test_token_ratio_scales_each_token_gradient(objective, tmp_path):
    # TRL's token_* modes: grpo and token-level lad weight each token by its own ratio
    args = _args(tmp_path, objective)
    g = torch.Generator().manual_seed(1)
    ratio = 0.5 + torch.rand(B, T, generator=g, dtype=torch.float64) * 1.5
    _, g_one = _grad(args, torch.ones(B, T, dtype=torch.float64))
    _, g_r = _grad(args, ratio)
    assert (g_one.abs() > 0).sum() >= 15
    torch.testing.assert_close(g_r, ratio * g_one, rtol=1e-5, atol=1e-8)


SEQUENCE_LEVEL = [(obj, {}) for obj in ("gspo", "flowrl", "disa", "vargrad", "paced")] + [
    ("lad", {"lad_level": "sequence"})
]


@pytest.mark.parametrize(
    "objective,kw", SEQUENCE_LEVEL, ids=[c[0] + ("_sequence" if c[1] else "") for c in SEQUENCE_LEVEL]
)
def test_token_ratio_becomes_a_capped_sequence_weight(objective, kw, tmp_path):
    # TRL's token_* modes with a sequence-level objective: the sequence weight is the product of the
    # completion's token ratios, capped at vllm_importance_sampling_clip_max (3 here); padding counts 1
    args = _args(tmp_path, objective, **kw)
    mask = _inputs(torch.Generator().manual_seed(0))[1]["completion_mask"].bool()
    ratio = torch.tensor([[1.5, 1.5, 1.5, 1.5], [0.5, 1.2, 9.0, 9.0], [2.0, 2.0, 2.0, 0.1]], dtype=torch.float64)
    ratio = torch.cat([ratio, ratio.flip(0)])  # rows 0, 2, 5 exceed the cap (5.06, 8, 4 before capping)
    weight = torch.where(mask, ratio, torch.ones_like(ratio)).prod(1).clamp(max=3.0)
    assert (weight == 3.0).sum() == 3 and (weight < 3.0).sum() == 3
    _, g_one = _grad(args, torch.ones(B, T, dtype=torch.float64))
    _, g_r = _grad(args, ratio)
    torch.testing.assert_close(g_r, weight[:, None] * g_one, rtol=1e-5, atol=1e-8)
