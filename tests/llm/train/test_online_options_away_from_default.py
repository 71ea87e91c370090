"""The online trainer's grpo / gspo / lad options and the TB reward transform away from their defaults.

A trainer that dropped ``kl_estimator``, ``dual_clip``, ``log_ratio_clip``, ``epsilon`` /
``epsilon_high``, ``lad_divergence``, ``lad_eta`` or ``lad_level`` on the way to the loss would pass
every test run at the defaults (and, for gspo, at the paper's clip values, which are also
``gspo_loss``'s defaults). Here each is set to a value at which it binds on the stub batch (ratios
above the dual-clip constant and the log-ratio clip, advantages of both signs, ragged lengths); the
trainer's ``_compute_loss`` is compared with the formula of ``docs/math.md`` written as a loop, and
the option's default gives another number. The TB objectives' reward ``r~`` (``reward_transform``,
``reward_scale``, ``reward_shift``) is read off the batch the trainer's generation step returns.
"""

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
ADV = [1.2, -0.8, -1.5, 0.6, -0.3, 2.0]
# logp - logp_old per token: spans the clip ranges below (both signs, beyond log 1.5 and beyond 0.6)
DELTA = [
    [0.9, -0.7, 0.05, 0.3],
    [0.7, 0.45, 0.0, 0.0],
    [-0.2, 0.95, 0.5, 0.0],
    [0.1, -0.4, 0.8, -0.05],
    [0.55, 0.0, 0.0, 0.0],
    [-0.9, 0.25, 0.65, 0.0],
]
TOL = dict(rel=2e-5, abs=1e-6)  # float32 inside the trainer (it casts log-probs with .float())


class _Stub:
    def __init__(self, args, logp):
        self.args, self.logp = args, logp
        self.accelerator = SimpleNamespace(
            num_processes=1, device=torch.device("cpu"), gather=lambda x: x, unwrap_model=lambda m: m
        )
        self.model = SimpleNamespace(training=True)
        self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
        self.current_gradient_accumulation_steps = 1
        self.kl_coef = args.beta
        self.vllm_importance_sampling_clip_max = 3.0

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, **kw):
        return self.logp, torch.ones_like(self.logp), None

    def _dapo_num_tokens(self, inputs, mode):
        return TiltGRPOTrainer._dapo_num_tokens(self, inputs, mode)

    def _log(self, mode, name, value):
        return TiltGRPOTrainer._log(self, mode, name, value)


def _data():
    g = torch.Generator().manual_seed(5)
    mask = (torch.arange(T)[None, :] < torch.tensor(LENGTHS)[:, None]).long()
    logp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2 - 0.1
    old = logp - torch.tensor(DELTA, dtype=torch.float64)
    ref = logp - 0.4 + 0.6 * torch.randn(B, T, generator=g, dtype=torch.float64)
    inputs = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": mask,
        "advantages": torch.tensor(ADV, dtype=torch.float64),
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        "num_items_in_batch": mask.sum(),
    }
    return logp, inputs


def _args(tmp_path, objective, **kw):
    return TiltGRPOConfig(
        output_dir=str(tmp_path),
        objective=objective,
        per_device_train_batch_size=B,
        num_generations=2,
        max_completion_length=T,
        use_cpu=True,
        report_to="none",
        **kw,
    )


def _loss(args) -> float:
    logp, inputs = _data()
    return float(TiltGRPOTrainer._compute_loss(_Stub(args, logp.clone()), None, inputs))


def _rows():
    logp, inputs = _data()
    old, ref = inputs["old_per_token_logps"], inputs["ref_per_token_logps"]
    return [([float(logp[b, t]) for t in range(n)], [float(old[b, t]) for t in range(n)],
             [float(ref[b, t]) for t in range(n)], ADV[b]) for b, n in enumerate(LENGTHS)]  # fmt: skip


def _kl(lp, lr, estimator):
    d = lp - lr
    return {"k1": d, "k2": 0.5 * d * d, "k3": math.exp(-d) + d - 1.0}[estimator]


def _naive_grpo(eps, eps_high, beta, estimator, dual, log_clip, kl_weighted):
    """loss_type "grpo": mean over sequences of the token mean of
    ``-min(rho A, clip(rho, 1 - eps, 1 + eps_high) A)`` (``min(., -c A)`` for ``A < 0`` with the dual
    clip ``c``), ``rho = exp(clamp(logp - old, -log_clip, log_clip))``, plus ``beta * kl(logp, ref)``
    (times ``rho`` with TRL's ``use_bias_correction_kl``, its default)."""
    total = 0.0
    for lps, olds, refs, a in _rows():
        s = 0.0
        for lp, lo, lr in zip(lps, olds, refs):
            d = lp - lo
            if log_clip is not None:
                d = max(-log_clip, min(log_clip, d))
            rho = math.exp(d)
            term = -min(rho * a, max(1 - eps, min(1 + eps_high, rho)) * a)
            if dual is not None and a < 0:
                term = min(term, -dual * a)
            s += term + beta * _kl(lp, lr, estimator) * (rho if kl_weighted else 1.0)
        total += s / len(lps)
    return total / B


def _naive_gspo(eps, eps_high, beta):
    """``-mean_B min(s A, clip(s, 1 - eps, 1 + eps_high) A)``, ``s = exp(token mean of logp - old)``,
    plus ``beta`` times the token-mean k3 KL to the reference (TRL's, not importance-weighted)."""
    pg, kl_num, kl_den = 0.0, 0.0, 0
    for lps, olds, refs, a in _rows():
        s = math.exp(sum(lp - lo for lp, lo in zip(lps, olds)) / len(lps))
        pg += -min(s * a, max(1 - eps, min(1 + eps_high, s)) * a) / B
        kl_num += sum(_kl(lp, lr, "k3") for lp, lr in zip(lps, refs))
        kl_den += len(lps)
    return pg + beta * kl_num / kl_den


_F = {
    "kl": lambda x: x * math.log(x),
    "rkl": lambda x: -math.log(x),
    "tv": lambda x: abs(x - 1.0),
    "hellinger": lambda x: 0.5 * (math.sqrt(x) - 1.0) ** 2,
    "js": lambda x: 0.5 * (x * math.log(x) - (x + 1.0) * math.log((x + 1.0) / 2.0)),
}


def _naive_lad(divergence, eta, level):
    """LAD eq. (8): ``e^{A/eta} f(exp(logp - old - A/eta))``, per token (mean over a sequence's tokens,
    then over sequences) or per sequence on the length-normalized log-probs (mean over sequences)."""
    f, total = _F[divergence], 0.0
    for lps, olds, _, a in _rows():
        if level == "token":
            per = [math.exp(a / eta) * f(math.exp(lp - lo - a / eta)) for lp, lo in zip(lps, olds)]
            total += sum(per) / len(per)
        else:
            lp, lo = sum(lps) / len(lps), sum(olds) / len(olds)
            total += math.exp(a / eta) * f(math.exp(lp - lo - a / eta))
    return total / B


GRPO = dict(loss_type="grpo", epsilon=0.1, epsilon_high=0.25, beta=0.3)


@pytest.mark.parametrize("kl_weighted", [True, False])
@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_grpo_kl_estimator_dual_clip_and_log_ratio_clip(tmp_path, estimator, kl_weighted):
    args = _args(
        tmp_path,
        "grpo",
        kl_estimator=estimator,
        dual_clip=1.5,
        log_ratio_clip=0.6,
        use_bias_correction_kl=kl_weighted,
        **GRPO,
    )
    got = _loss(args)
    want = _naive_grpo(0.1, 0.25, 0.3, estimator, 1.5, 0.6, kl_weighted)
    assert got == pytest.approx(want, **TOL)
    # each option binds here: turning one off (or another estimator) gives another number
    others = {
        "no dual clip": _naive_grpo(0.1, 0.25, 0.3, estimator, None, 0.6, kl_weighted),
        "no log-ratio clip": _naive_grpo(0.1, 0.25, 0.3, estimator, 1.5, None, kl_weighted),
        "epsilon_high = epsilon": _naive_grpo(0.1, 0.1, 0.3, estimator, 1.5, 0.6, kl_weighted),
        "epsilon 0.2": _naive_grpo(0.2, 0.25, 0.3, estimator, 1.5, 0.6, kl_weighted),
        "kl weighting": _naive_grpo(0.1, 0.25, 0.3, estimator, 1.5, 0.6, not kl_weighted),
        **{
            f"kl {e}": _naive_grpo(0.1, 0.25, 0.3, e, 1.5, 0.6, kl_weighted)
            for e in ("k1", "k2", "k3")
            if e != estimator
        },
    }
    for name, v in others.items():
        assert abs(v - want) > 1e-3 * abs(want), name


def test_gspo_uses_the_configured_epsilons_not_its_paper_defaults(tmp_path):
    got = _loss(_args(tmp_path, "gspo", epsilon=0.1, epsilon_high=0.3, beta=0.2, use_bias_correction_kl=False))
    want = _naive_gspo(0.1, 0.3, 0.2)
    assert got == pytest.approx(want, **TOL)
    assert abs(_naive_gspo(3e-4, 4e-4, 0.2) - want) > 1e-3 * abs(want)  # gspo_loss's own defaults
    assert abs(_naive_gspo(0.1, 0.1, 0.2) - want) > 1e-3 * abs(want)


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("divergence", ["kl", "rkl", "tv", "hellinger", "js"])
def test_lad_divergence_eta_and_level(tmp_path, divergence, level):
    got = _loss(_args(tmp_path, "lad", lad_divergence=divergence, lad_eta=0.7, lad_level=level, beta=0.0))
    want = _naive_lad(divergence, 0.7, level)
    assert got == pytest.approx(want, **TOL)
    assert abs(_naive_lad(divergence, 1.0, level) - want) > 1e-3 * abs(want)  # eta binds
    if divergence != "rkl":  # rkl's generator is linear in logp - old: both levels give one number
        other_level = "sequence" if level == "token" else "token"
        assert abs(_naive_lad(divergence, 0.7, other_level) - want) > 1e-3 * abs(want)
    if divergence != "js":
        assert abs(_naive_lad("js", 0.7, level) - want) > 1e-3 * abs(want)  # the default divergence


# ------------------------------------------------------------------------------------------------
# the TB reward r~ each objective regresses on: reward_transform / reward_scale / reward_shift

REWARDS = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.5, 1.0]  # two groups of 4, different means and spreads


def _tb_reward(tmp_path, monkeypatch, objective, **kw):
    """``tb_reward`` of the batch ``TiltGRPOTrainer._generate_and_score`` returns, TRL's generation
    replaced by a fixed batch (its rewards per function are what TRL's ``_calculate_rewards`` left)."""
    from trl import GRPOTrainer

    n, g = len(REWARDS), 4
    args = TiltGRPOConfig(
        output_dir=str(tmp_path),
        objective=objective,
        per_device_train_batch_size=n,
        num_generations=g,
        max_completion_length=T,
        use_cpu=True,
        report_to="none",
        **kw,
    )
    out = {
        "prompt_ids": torch.zeros(n, 1, dtype=torch.long),
        "prompt_mask": torch.ones(n, 1, dtype=torch.long),
        "completion_ids": torch.zeros(n, 2, dtype=torch.long),
        "completion_mask": torch.ones(n, 2, dtype=torch.long),
        "old_per_token_logps": -torch.ones(n, 2),
        "ref_per_token_logps": -torch.ones(n, 2),
    }
    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", lambda self, inputs: dict(out))
    tr = TiltGRPOTrainer.__new__(TiltGRPOTrainer)  # the method's state only, no model
    tr.args, tr.model, tr.num_generations = args, SimpleNamespace(training=True), g
    tr._last_rewards_per_func = torch.tensor(REWARDS)[:, None]
    tr.reward_weights = torch.ones(1)
    tr.accelerator = SimpleNamespace(process_index=0, gather=lambda x: x)
    tr._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    tr._signal_rewards = lambda r: None
    tr._paced_head, tr._replay = None, None
    rows = [{"prompt": f"p{i // g}", "log_z": 0.0} for i in range(n)]
    return tr._generate_and_score(rows)["tb_reward"].double().tolist()


def _group_norm(rs, g=4):
    out = []
    for s in range(0, len(rs), g):
        grp = rs[s : s + g]
        mu = sum(grp) / g
        sd = math.sqrt(sum((x - mu) ** 2 for x in grp) / (g - 1))  # unbiased, as GRPO / FlowRL
        out += [(x - mu) / (sd + 1e-6) for x in grp]
    return out


@pytest.mark.parametrize(
    "objective,kw,want",
    [
        ("disa", dict(reward_scale=2.0, reward_shift=-0.5), [2 * r - 0.5 for r in REWARDS]),
        ("vargrad", dict(reward_scale=3.0, reward_shift=0.25), [3 * r + 0.25 for r in REWARDS]),
        ("paced", dict(reward_scale=2.0, reward_shift=-0.5), [2 * r - 0.5 for r in REWARDS]),
        ("disa", dict(reward_transform="group_norm"), _group_norm(REWARDS)),
        ("flowrl", {}, _group_norm(REWARDS)),  # FlowRL's default: the per-group plug-in
        ("flowrl", dict(reward_transform="affine", reward_scale=2.0, reward_shift=1.0), [2 * r + 1 for r in REWARDS]),
        ("disa", dict(reward_transform="identity", reward_scale=5.0, reward_shift=3.0), REWARDS),  # identity wins
    ],
)
def test_tb_reward_is_the_configured_transform_of_the_rewards(tmp_path, monkeypatch, objective, kw, want):
    if objective == "paced":
        kw = dict(kw, paced_pool_factor=0, paced_replay=False, paced_embeddings="live")
    got = _tb_reward(tmp_path, monkeypatch, objective, **kw)
    assert got == pytest.approx(want, rel=1e-6, abs=1e-6)
    # the transforms differ on these rewards: a trainer that used another one would be caught
    for other in (REWARDS, _group_norm(REWARDS), [2 * r - 0.5 for r in REWARDS]):
        if other != pytest.approx(want, abs=1e-9):
            assert got != pytest.approx(other, abs=1e-3)
