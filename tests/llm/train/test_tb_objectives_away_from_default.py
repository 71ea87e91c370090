"""The online trainer's TB objectives away from the defaults that hide a wrong anchor or tilt.

At ``paced_kl_coef = 1`` a tilt written ``r * kl_coef`` equals ``r / kl_coef``; when ``pi_old = pi_ref`` a
DISA residual anchored on the wrong policy is the right number. Here ``pi_old``, ``pi_ref`` and the
current policy all differ, ``rewards`` differs from ``tb_reward``, ``paced_kl_coef = 0.25`` and
``tilt_beta = 2.5``: each objective's loss and its gradients (to the token log-probs and, for PACED, to
the learned log Z) are compared with a plain loop over rows of the formula the objective states."""

from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("trl")

from tiltlab.llm.train.online import TiltGRPOConfig, TiltGRPOTrainer

B, T = 6, 4
LENGTHS = [4, 2, 3, 4, 1, 3]
KL_COEF, BETA, MAX_W = 0.25, 2.5, 1.3  # the cap 1.3 clips 1 of the 6 rollout weights


class _Stub:
    def __init__(self, args, logp, log_z):
        self.args, self.logp, self.log_z = args, logp, log_z
        self.accelerator = SimpleNamespace(
            num_processes=1, device=torch.device("cpu"), gather=lambda x: x, unwrap_model=lambda m: m
        )
        self.model = SimpleNamespace(training=True)
        self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
        self.current_gradient_accumulation_steps = 1
        self.kl_coef = 0.0
        self.vllm_importance_sampling_clip_max = 3.0

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, **kw):
        return self.logp, torch.ones_like(self.logp), None

    def _paced_log_z(self, model, batch):
        return self.log_z

    _learned_log_z = _paced_log_z

    def _log(self, mode, name, value):
        return TiltGRPOTrainer._log(self, mode, name, value)


def _data():
    g = torch.Generator().manual_seed(3)
    mask = (torch.arange(T)[None, :] < torch.tensor(LENGTHS)[:, None]).long()
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    inputs = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": mask,
        "advantages": torch.zeros(B, dtype=torch.float64),
        # pi_old near the policy (weights around 1, one of them above the cap), pi_ref far from both
        "old_per_token_logps": logp + 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64),
        "ref_per_token_logps": logp - 0.7 + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64),
        "rewards": torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0], dtype=torch.float64),
        "tb_reward": torch.tensor([0.8, -0.3, 0.6, 1.1, -0.2, 0.1], dtype=torch.float64),  # != rewards
        "log_z": torch.randn(B, generator=g, dtype=torch.float64),
        "num_items_in_batch": mask.sum(),
    }
    return logp, inputs


def _args(tmp_path, objective, **kw):
    kw.setdefault("weight_clip", "max")
    kw.setdefault("max_weight", MAX_W)
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


def _run(args):
    logp, inputs = _data()
    logp = logp.clone().requires_grad_(True)
    log_z = torch.linspace(-0.4, 0.9, B, dtype=torch.float64).requires_grad_(True)
    stub = _Stub(args, logp, log_z)
    loss = TiltGRPOTrainer._compute_loss(stub, None, inputs)
    g_logp, g_lz = torch.autograd.grad(loss, [logp, log_z], allow_unused=True)
    logged = {k: v[-1] for k, v in stub._metrics["train"].items()}
    return loss.detach(), g_logp, g_lz, logp.detach(), log_z.detach(), inputs, logged


def _naive(logp, inputs, anchor_key, reward_key, log_z, beta, normalize, clip=("max", MAX_W)):
    """Loss, d loss / d logp, d loss / d log Z and the logged metrics by a loop over rows:
    ``delta_b = log_z_b + lp_b - lp_anchor_b - beta * r_b``, ``w_b = min(exp(sum_t (logp - old)), cap)``
    (``clip = ("max", cap)``) or ``w_b`` clamped to ``[1 - eps, 1 + eps_high]`` (``("eps", eps, eps_high)``),
    ``loss = (1/B) sum_b w_b delta_b^2`` (``lp`` the masked sum, or the masked mean with ``normalize``)."""
    loss, g_logp, g_lz = 0.0, torch.zeros(B, T, dtype=torch.float64), torch.zeros(B, dtype=torch.float64)
    res_abs, ws, clipped = [], [], 0
    for b in range(B):
        n = LENGTHS[b]
        div = n if normalize else 1
        lp = sum(float(logp[b, t]) for t in range(n)) / div
        la = sum(float(inputs[anchor_key][b, t]) for t in range(n)) / div
        w_raw = math.exp(sum(float(logp[b, t] - inputs["old_per_token_logps"][b, t]) for t in range(n)))
        if clip[0] == "max":
            w = min(w_raw, clip[1])
            clipped += w_raw > clip[1]
        else:
            w = max(1 - clip[1], min(1 + clip[2], w_raw))
            clipped += not 1 - clip[1] <= w_raw <= 1 + clip[2]
        delta = float(log_z[b]) + lp - la - beta * float(inputs[reward_key][b])
        res_abs.append(abs(delta))
        ws.append(w)
        loss += w * delta * delta / B
        for t in range(n):
            g_logp[b, t] = 2 * w * delta / B / div
        g_lz[b] = 2 * w * delta / B
    metrics = {"residual": sum(res_abs) / B, "weight_mean": sum(ws) / B, "weight_clip_frac": clipped / B}
    return loss, g_logp, g_lz, metrics


def _weights_straddle_the_cap(logp, inputs):
    m = inputs["completion_mask"].double()
    w = ((logp - inputs["old_per_token_logps"]) * m).sum(1).exp()
    return bool((w > MAX_W).any()) and bool((w < MAX_W).any())


def _assert_metrics(got, want, log_z):
    """The logged TB metrics: mean |residual|, mean loss weight, fraction of weights at the cap, log Z mean/std."""
    for k in ("residual", "weight_mean", "weight_clip_frac"):
        assert got[k] == pytest.approx(want[k], rel=2e-5, abs=1e-6), k
    assert want["weight_clip_frac"] == pytest.approx(1 / 6)
    assert got["log_z/mean"] == pytest.approx(float(log_z.mean()), rel=2e-5, abs=1e-6)
    assert got["log_z/std"] == pytest.approx(float(log_z.std()), rel=2e-5, abs=1e-6)


# float32 inside the trainer (it casts the log-probs with .float()): ~1e-6 relative rounding
TOL = dict(rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("length_normalize", [False, True])
def test_paced_is_anchored_on_pi_old_with_tilt_r_over_kl_coef(tmp_path, length_normalize):
    scale = "mean" if length_normalize else "sum"
    args = _args(tmp_path, "paced", paced_kl_coef=KL_COEF, logprob_scale=scale)
    loss, g_logp, g_lz, logp, log_z, inputs, logged = _run(args)
    assert _weights_straddle_the_cap(logp, inputs)
    want, w_logp, w_lz, w_metrics = _naive(
        logp, inputs, "old_per_token_logps", "rewards", log_z, 1.0 / KL_COEF, length_normalize
    )
    torch.testing.assert_close(loss, torch.tensor(want, dtype=loss.dtype), **TOL)
    torch.testing.assert_close(g_logp.double(), w_logp, **TOL)
    torch.testing.assert_close(g_lz.double(), w_lz, **TOL)  # PACED's log Z is learned: it gets the gradient
    _assert_metrics(logged, w_metrics, log_z)
    # the tilt really is r / kl_coef: at kl_coef 1 the loss is another number
    other, *_ = _run(_args(tmp_path, "paced", paced_kl_coef=1.0, logprob_scale=scale))
    assert abs(float(other) - float(loss)) > 100 * TOL["rtol"] * abs(float(loss))


@pytest.mark.parametrize("objective", ["disa", "vargrad"])
def test_disa_and_vargrad_are_anchored_on_pi_ref_with_beta_times_tb_reward(tmp_path, objective):
    args = _args(tmp_path, objective, tilt_beta=BETA, logprob_scale="sum")
    loss, g_logp, g_lz, logp, _, inputs, logged = _run(args)
    assert _weights_straddle_the_cap(logp, inputs)
    want, w_logp, _, w_metrics = _naive(logp, inputs, "ref_per_token_logps", "tb_reward", inputs["log_z"], BETA, False)
    torch.testing.assert_close(loss, torch.tensor(want, dtype=loss.dtype), **TOL)
    torch.testing.assert_close(g_logp.double(), w_logp, **TOL)
    _assert_metrics(logged, w_metrics, inputs["log_z"])
    assert g_lz is None  # the frozen (DISA) / batch-optimal (VarGrad) log Z comes from the batch, not a head
    # anchored on pi_old instead, the loss would be another number (pi_old != pi_ref here)
    wrong, *_ = _naive(logp, inputs, "old_per_token_logps", "tb_reward", inputs["log_z"], BETA, False)
    assert abs(wrong - want) > 0.1 * want


def test_flowrl_is_anchored_on_pi_ref_with_beta_times_tb_reward_and_learns_log_z(tmp_path):
    # FlowRL in the trainer: tb_reward (already group-normalized at generation) times tilt_beta, anchored
    # on pi_ref, the head's log Z gets the gradient; length-normalized log-probs (FlowRL's code) here
    args = _args(tmp_path, "flowrl", tilt_beta=BETA, logprob_scale="mean")
    loss, g_logp, g_lz, logp, log_z, inputs, logged = _run(args)
    want, w_logp, w_lz, w_metrics = _naive(logp, inputs, "ref_per_token_logps", "tb_reward", log_z, BETA, True)
    torch.testing.assert_close(loss, torch.tensor(want, dtype=loss.dtype), **TOL)
    torch.testing.assert_close(g_logp.double(), w_logp, **TOL)
    torch.testing.assert_close(g_lz.double(), w_lz, **TOL)
    _assert_metrics(logged, w_metrics, log_z)
    other, *_ = _naive(logp, inputs, "ref_per_token_logps", "tb_reward", log_z, BETA, False)
    assert abs(other - want) > 0.1 * want  # logprob_scale binds


EPS, EPS_HIGH = 0.15, 0.05


@pytest.mark.parametrize("objective", ["disa", "vargrad", "paced", "flowrl"])
def test_eps_weight_clip_uses_weight_eps_and_weight_eps_high(tmp_path, objective):
    # weight_clip="eps" clamps the TB rollout weight to [1 - weight_eps, 1 + weight_eps_high]; with
    # eps != eps_high (and neither at its default 0.2) a trainer that dropped or swapped them is caught
    kw = dict(weight_clip="eps", weight_eps=EPS, weight_eps_high=EPS_HIGH, logprob_scale="sum")
    if objective == "paced":
        args = _args(tmp_path, objective, paced_kl_coef=KL_COEF, **kw)
        anchor, reward, beta = "old_per_token_logps", "rewards", 1.0 / KL_COEF
    else:
        args = _args(tmp_path, objective, tilt_beta=BETA, **kw)
        anchor, reward, beta = "ref_per_token_logps", "tb_reward", BETA
    loss, g_logp, _, logp, log_z, inputs, logged = _run(args)
    lz = inputs["log_z"] if objective in ("disa", "vargrad") else log_z
    clip = ("eps", EPS, EPS_HIGH)
    want, w_logp, _, w_metrics = _naive(logp, inputs, anchor, reward, lz, beta, False, clip)
    torch.testing.assert_close(loss, torch.tensor(want, dtype=loss.dtype), **TOL)
    torch.testing.assert_close(g_logp.double(), w_logp, **TOL)
    for k in ("weight_mean", "weight_clip_frac"):
        assert logged[k] == pytest.approx(w_metrics[k], rel=2e-5, abs=1e-6), k
    assert 0 < w_metrics["weight_clip_frac"] < 1  # some weights clipped below, some above, some not
    for other in (("eps", EPS_HIGH, EPS), ("eps", 0.2, 0.2), ("max", MAX_W)):
        o, *_ = _naive(logp, inputs, anchor, reward, lz, beta, False, other)
        assert abs(o - want) > 1e-3 * want, other
