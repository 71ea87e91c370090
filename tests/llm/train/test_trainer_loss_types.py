"""The online trainer's ``grpo`` objective against TRL 1.16's own ``GRPOTrainer._compute_loss`` for
every ``loss_type`` it accepts, and its ``cispo`` / ``sapo`` / ``luspo`` / ``vespo`` objectives
against TRL's loss types of those names (with the KL term, ``use_bias_correction_kl``, vLLM's IS
ratio and ``off_policy_mask_threshold``): the same stub batch is split over gradient-accumulation
micro-batches, both ``_compute_loss`` run on each part, and the accumulated loss and gradient
(what the optimizer step sees) must agree. Unsupported loss types and options are refused."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("trl")

from trl import GRPOTrainer

from tiltlab.llm.train.online import TiltGRPOConfig, TiltGRPOTrainer

B, T, MAX_LEN, GA = 8, 5, 7, 2


class _Accelerator:
    num_processes = 1
    device = torch.device("cpu")
    sync_gradients = True

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x

    def unwrap_model(self, m):
        return m


class _Stub:
    """The attributes both ``_compute_loss`` read; the policy's token log-probs are ``self.logp``."""

    get_off_policy_mask = staticmethod(GRPOTrainer.get_off_policy_mask)
    get_gamma_weights = staticmethod(GRPOTrainer.get_gamma_weights)

    def __init__(self, args, logp, loss_type):
        self.args, self.logp = args, logp
        self.accelerator = _Accelerator()
        self.model = SimpleNamespace(training=True)
        self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
        self.current_gradient_accumulation_steps = GA
        self.loss_type, self.beta, self.kl_coef = loss_type, args.beta, args.beta
        self.epsilon_low, self.epsilon_high = args.epsilon, args.epsilon_high
        self.importance_sampling_level = args.importance_sampling_level
        self.top_entropy_quantile, self.off_policy_mask_threshold = 1.0, args.off_policy_mask_threshold
        self.use_vllm = self.vllm_importance_sampling_correction = bool(args.use_vllm)
        self.vllm_importance_sampling_clip_max = None
        self.max_completion_length = MAX_LEN
        self._entropy_bonus_enabled, self.aux_loss_enabled = False, False

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, **kw):
        rows = input_ids[:, 0]  # the stub batch's first prompt token is the row index
        return self.logp[rows], torch.ones_like(self.logp[rows]), None

    def _dapo_num_tokens(self, inputs, mode):
        return TiltGRPOTrainer._dapo_num_tokens(self, inputs, mode)

    def _log(self, mode, name, value):
        return TiltGRPOTrainer._log(self, mode, name, value)


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([5, 1, 3, 4, 2, 5, 3, 1])  # ragged: the normalizations differ
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    inputs = {
        "prompt_ids": torch.arange(B)[:, None],
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": mask,
        "advantages": torch.randn(B, generator=g, dtype=torch.float64),
        "old_per_token_logps": logp + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64),
        "ref_per_token_logps": logp + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64),
        "num_items_in_batch": mask.sum(),
    }
    return logp, inputs


def _accumulated(compute_loss, args, loss_type, extra=None):
    logp, inputs = _batch()
    inputs.update(extra or {})
    logp = logp.clone().requires_grad_(True)
    stub = _Stub(args, logp, loss_type)
    total = torch.zeros((), dtype=torch.float64)
    for part in range(GA):  # TRL's micro-batches of one generation batch (steps_per_generation = GA)
        rows = slice(part * B // GA, (part + 1) * B // GA)
        micro = {k: (v[rows] if v.dim() else v) for k, v in inputs.items()}
        total = total + compute_loss(stub, None, micro)
    (grad,) = torch.autograd.grad(total, logp)
    return total.detach(), grad


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "bnpo", "dr_grpo"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_grpo_loss_type_matches_trl_over_accumulation(loss_type, beta, tmp_path):
    args = TiltGRPOConfig(
        output_dir=str(tmp_path),
        objective="grpo",
        loss_type=loss_type,
        beta=beta,
        epsilon=0.2,
        epsilon_high=0.28,
        max_completion_length=MAX_LEN,
        per_device_train_batch_size=B // GA,
        gradient_accumulation_steps=GA,
        num_generations=2,
        use_cpu=True,
        report_to="none",
    )
    assert args.steps_per_generation == GA
    ours = _accumulated(TiltGRPOTrainer._compute_loss, args, loss_type)
    trl = _accumulated(GRPOTrainer._compute_loss, args, loss_type)
    # the trainer computes in float32 (it casts the model's log-probs with .float()), TRL here in
    # float64: agreement to float32 rounding (eps 1.2e-7, ~10 operations), 1e-4 of the smallest
    # gap between two loss types on this batch (test_loss_types_differ_on_the_stub_batch)
    torch.testing.assert_close(ours[0], trl[0].float().double(), rtol=2e-6, atol=1e-7)
    torch.testing.assert_close(ours[1], trl[1], rtol=2e-6, atol=1e-7)
    assert ours[1].abs().max() > 0


def test_loss_types_differ_on_the_stub_batch(tmp_path):
    # the four normalizations give four different values here, so matching TRL per type is a real check
    values = set()
    for lt in ("dapo", "grpo", "bnpo", "dr_grpo"):
        args = TiltGRPOConfig(
            output_dir=str(tmp_path), objective="grpo", loss_type=lt, max_completion_length=MAX_LEN,
            per_device_train_batch_size=B // GA, gradient_accumulation_steps=GA, num_generations=2,
            use_cpu=True, report_to="none",
        )  # fmt: skip
        values.add(float(_accumulated(TiltGRPOTrainer._compute_loss, args, lt)[0]))
    gaps = [abs(a - b) for a in values for b in values if a != b]
    assert len(values) == 4 and min(gaps) > 1e-3


def _cfg(tmp_path, **kw):
    return TiltGRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **kw)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"objective": "grpo", "loss_type": "cispo"}, "loss_type"),
        ({"objective": "grpo", "loss_type": "sapo"}, "loss_type"),
        ({"objective": "gspo", "loss_type": "dapo"}, "loss_type"),
        ({"objective": "flowrl", "loss_type": "grpo"}, "loss_type"),
        ({"objective": "grpo", "importance_sampling_level": "sequence"}, "importance_sampling_level"),
        ({"objective": "gspo", "importance_sampling_level": "token"}, "importance_sampling_level"),
        ({"objective": "grpo", "delta": 2.0}, "delta"),
        ({"objective": "grpo", "top_entropy_quantile": 0.2}, "top_entropy_quantile"),
        ({"objective": "grpo", "entropy_coef": 0.01}, "entropy_coef"),
        ({"objective": "gspo", "beta": 0.1}, "use_bias_correction_kl"),
        ({"objective": "gspo", "dual_clip": 3.0}, "dual_clip"),
    ],
)
def test_unsupported_trl_options_are_refused(tmp_path, kw, match):
    with pytest.raises(ValueError, match=match):
        _cfg(tmp_path, **kw)


def test_loss_type_defaults(tmp_path):
    assert _cfg(tmp_path, objective="grpo").loss_type == "dapo"  # TRL's default
    gspo = _cfg(tmp_path, objective="gspo")
    assert (gspo.loss_type, gspo.importance_sampling_level) == ("grpo", "sequence")
    assert _cfg(tmp_path, objective="flowrl").loss_type is None


# ------------------------------------------------------------------------------------------------
# TRL's other loss types: one objective each

# TRL's options for each objective, away from their defaults (exact in float32: TRL builds the
# per-sequence SAPO temperatures / VESPO parameters with torch.where on Python floats)
NEW = {
    "cispo": {"epsilon_high": 1.25},
    "sapo": {"sapo_temperature_pos": 0.625, "sapo_temperature_neg": 1.75},
    "luspo": {"epsilon": 0.08, "epsilon_high": 0.12},
    "vespo": {"vespo_k_pos": 1.5, "vespo_lambda_pos": 2.5, "vespo_k_neg": 2.5, "vespo_lambda_neg": 1.25},
}
OPTION_SETS = {
    "plain": {"beta": 0.0},
    "kl_bias_corrected": {"beta": 0.04, "use_bias_correction_kl": True},
    "kl": {"beta": 0.04, "use_bias_correction_kl": False},
    "vllm_opsm": {"beta": 0.0, "off_policy_mask_threshold": 0.05},
    "all": {"beta": 0.04, "use_bias_correction_kl": True, "off_policy_mask_threshold": 0.05},
}


def _vllm_extra(option_set):
    """vLLM's per-token IS ratio (1 at padding, as TRL computes it) and sampling log-probs with an
    unscored (NaN) token, for the option sets that use vLLM."""
    if option_set not in ("vllm_opsm", "all"):
        return {}, False
    _, inputs = _batch()
    g = torch.Generator().manual_seed(7)
    mask = inputs["completion_mask"].double()
    isr = torch.where(
        mask > 0, 0.5 + torch.rand(B, T, generator=g, dtype=torch.float64), torch.ones(B, T, dtype=torch.float64)
    )
    sampler = inputs["old_per_token_logps"] + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    sampler[2, 1] = float("nan")
    return {"importance_sampling_ratio": isr, "sampling_per_token_logps": sampler}, True


@pytest.mark.parametrize("option_set", sorted(OPTION_SETS))
@pytest.mark.parametrize("objective", sorted(NEW))
def test_trl_loss_type_objectives_match_trl_over_accumulation(objective, option_set, tmp_path):
    extra, vllm = _vllm_extra(option_set)
    args = TiltGRPOConfig(
        output_dir=str(tmp_path), objective=objective, max_completion_length=MAX_LEN,
        per_device_train_batch_size=B // GA, gradient_accumulation_steps=GA, num_generations=2,
        use_cpu=True, report_to="none", **NEW[objective], **OPTION_SETS[option_set],
    )  # fmt: skip
    assert args.loss_type == objective
    assert args.importance_sampling_level == ("sequence" if objective == "luspo" else "token")
    args.use_vllm = vllm  # the stub's flag only: TRL's vLLM itself is not started here
    ours = _accumulated(TiltGRPOTrainer._compute_loss, args, objective, extra)
    trl = _accumulated(GRPOTrainer._compute_loss, args, objective, extra)
    # float32 in the trainer, float64 in TRL here (see test_grpo_loss_type_matches_trl_over_accumulation)
    torch.testing.assert_close(ours[0], trl[0].float().double(), rtol=2e-6, atol=1e-7)
    torch.testing.assert_close(ours[1], trl[1], rtol=2e-6, atol=1e-6)
    assert ours[1].abs().max() > 0
    if option_set == "all":  # the options bind: TRL at its defaults (no KL, no mask, no vLLM) differs
        plain = _accumulated(GRPOTrainer._compute_loss, _with(args, NEW[objective], beta=0.0), objective)
        assert abs(float(plain[0] - trl[0])) > 1e-3


def _with(args, options, **kw):
    """``args`` with the objective's options at TRL's defaults and ``kw`` set (a plain namespace copy)."""
    defaults = {"epsilon": 0.2, "epsilon_high": 0.2, "sapo_temperature_pos": 1.0, "sapo_temperature_neg": 1.05,
                "vespo_k_pos": 2.0, "vespo_lambda_pos": 3.0, "vespo_k_neg": 3.0, "vespo_lambda_neg": 2.0}  # fmt: skip
    ns = SimpleNamespace(**vars(args))
    for k in options:
        setattr(ns, k, defaults[k])
    ns.off_policy_mask_threshold, ns.use_vllm = None, False
    for k, v in kw.items():
        setattr(ns, k, v)
    return ns


@pytest.mark.parametrize("objective", ["grpo", "gspo"])
def test_off_policy_mask_on_grpo_and_gspo_matches_trl(objective, tmp_path):
    extra, _ = _vllm_extra("all")
    extra.pop("importance_sampling_ratio")
    args = TiltGRPOConfig(
        output_dir=str(tmp_path), objective=objective, max_completion_length=MAX_LEN, beta=0.0,
        per_device_train_batch_size=B // GA, gradient_accumulation_steps=GA, num_generations=2,
        use_cpu=True, report_to="none", off_policy_mask_threshold=0.05, epsilon=0.2, epsilon_high=0.28,
    )  # fmt: skip
    ours = _accumulated(TiltGRPOTrainer._compute_loss, args, args.loss_type, extra)
    trl = _accumulated(GRPOTrainer._compute_loss, args, args.loss_type, extra)
    torch.testing.assert_close(ours[0], trl[0].float().double(), rtol=2e-6, atol=1e-7)
    torch.testing.assert_close(ours[1], trl[1], rtol=2e-6, atol=1e-6)
    unmasked = _accumulated(GRPOTrainer._compute_loss, _with(args, {}), args.loss_type, extra)
    assert abs(float(unmasked[0] - trl[0])) > 1e-3  # the mask drops a sequence here


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"objective": "grpo", "loss_type": "cispo"}, "set objective='cispo'"),
        ({"objective": "grpo", "loss_type": "vespo"}, "set objective='vespo'"),
        ({"objective": "gspo", "loss_type": "luspo"}, "set objective='luspo'"),
        ({"objective": "sapo", "loss_type": "grpo"}, "loss_type"),
        ({"objective": "luspo", "importance_sampling_level": "token"}, "importance_sampling_level"),
        ({"objective": "cispo", "importance_sampling_level": "sequence"}, "importance_sampling_level"),
        ({"objective": "cispo"}, "epsilon_high"),
        ({"objective": "flowrl", "off_policy_mask_threshold": 0.5}, "implemented by objective in"),
        ({"objective": "lad", "off_policy_mask_threshold": 0.5}, "implemented by objective in"),
        ({"objective": "lad", "beta": 0.1}, "objectives that do"),
    ],
)
def test_trl_loss_type_refusals_are_one_line(tmp_path, kw, match):
    with pytest.raises(ValueError, match=match) as e:
        _cfg(tmp_path, **kw)
    assert "\n" not in str(e.value)
