"""One registry entry per public objective / estimator of ``tiltlab.objectives`` (PyTorch OpInfo style).

An :class:`OpInfo` names the function, an independent naive reference (Python loops over 0-d
float64 tensors, written from the formula in ``docs/math.md``; it never calls the fast code), a
seeded float64 sample generator, which inputs must receive gradient and which must not, whether
the function is token-level (a mask and its padding axis), how it aggregates over the batch
(micro-batch split invariance) and its NaN semantics. ``tests/objectives/_generic.py`` runs the
same checks on every entry. Adding an objective is adding one entry to :data:`OPS`.

References mark a stop-gradient ``sg(.)`` of the formula with ``.detach()``; that is part of
the formula (e.g. KTO's reference point ``z0``), not a shared implementation detail.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor

from tests.objectives._ref import (
    exp,
    log,
    ref_delta_bias,
    ref_divergence,
    ref_ess,
    ref_geomean,
    ref_group_adv,
    ref_log_partition_lse,
    ref_sigmoid,
    ref_tb_residual,
)
from tiltlab.objectives import correction, estimators, lad, offline, paced, pg, regressor, tb, transforms
from tiltlab.objectives.output import LossOutput

F64 = torch.float64


@dataclass(frozen=True)
class Split:
    """Micro-batch split invariance: the inputs split along dim 0 and how the parts recombine.

    ``rows`` maps an input to its rows per unit (a unit is a sequence, or a prompt group: the
    FlowRL tokens have ``G`` rows per prompt); inputs not listed are shared by the parts.
    ``weighting``: ``"mean"`` (part ``i`` weighs ``units_i / units``), ``"token"`` (weighs
    ``sum(mask_i) / sum(mask)``: a token mean), ``"concat"`` (per-row outputs: concatenate).
    """

    rows: Mapping[str, int]
    weighting: Literal["mean", "token", "concat"]


@dataclass(frozen=True)
class OpInfo:
    name: str
    fn: Callable[..., Tensor]
    ref: Callable[..., Tensor]
    make: Callable[[torch.Generator], dict[str, Tensor]]
    kwargs: Mapping[str, Any] = field(default_factory=dict)  # non-tensor arguments, passed to fn and ref
    grad: tuple[str, ...] = ()  # inputs the gradient must reach
    frozen: tuple[str, ...] = ()  # inputs that must receive no gradient
    mask: str | None = None  # token-level: the name of the [B, T] mask
    tokens: tuple[str, ...] = ()  # the [B, T] inputs padded along with the mask
    split: Split | None = None  # None: the aggregation couples the batch (no split invariance)
    nan: Literal["propagate", "raise"] = "propagate"  # a NaN in a real position: NaN out, or ValueError
    nan_input: str | None = None  # where the NaN goes (default: the first grad input)
    shape_inputs: tuple[str, ...] | None = None  # inputs whose dim 0 is cut by one (default: all, if >= 2)
    low: torch.dtype = torch.bfloat16  # the low-precision dtype compared with float64
    low_ulps: float = 4.0  # low-precision tolerance in units of the low dtype's eps (see _generic)
    # False for a surrogate whose gradient is by design not the derivative of its value (a
    # stop-gradient of a quantity computed from a trainable input: FlowRL's rollout weight, KTO's
    # batch z0); finite differences cannot see the stop-gradient, check_grad covers it.
    gradcheck: bool = True

    def sample(self, seed: int = 0) -> dict[str, Tensor]:
        return self.make(torch.Generator().manual_seed(seed))

    def __call__(self, inputs: Mapping[str, Tensor]) -> Tensor:
        return self.fn(**inputs, **self.kwargs)

    def reference(self, inputs: Mapping[str, Tensor]) -> Tensor:
        return self.ref(**inputs, **self.kwargs)


def loss_of(f: Callable[..., LossOutput]) -> Callable[..., Tensor]:
    """The loss tensor of a function returning a :class:`LossOutput` (every ``*_loss``); the
    wrapper refuses any other return type, so a loss that stops returning one fails every check."""

    def g(**kw: Any) -> Tensor:
        out = f(**kw)
        if not isinstance(out, LossOutput):
            raise TypeError(f"{f.__name__} returned {type(out).__name__}, not LossOutput")
        return out.loss

    g.__name__ = f.__name__
    return g


# ------------------------------------------------------------------------------------ samplers
B, T = 4, 5
P, G = 3, 3


def _randn(g: torch.Generator, *shape: int, scale: float = 1.0) -> Tensor:
    return torch.randn(shape, generator=g, dtype=F64) * scale


def _mask(g: torch.Generator, b: int = B, t: int = T) -> Tensor:
    """Ragged right-padded mask: row 0 full, row 1 a single token, the others random lengths >= 1."""
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    lengths[0], lengths[1] = t, 1
    return (torch.arange(t)[None, :] < lengths[:, None]).to(F64)


def _signed_adv(g: torch.Generator, n: int) -> Tensor:
    adv = _randn(g, n)
    adv[0], adv[1] = abs(float(adv[0])) + 0.5, -abs(float(adv[1])) - 0.5  # both signs: both clip sides bind
    return adv


def _tokens(g: torch.Generator, b: int = B) -> dict[str, Tensor]:
    """Token log-probs (padded slots hold finite garbage: the mask, not the values, marks padding)."""
    lp = -torch.rand(b, T, generator=g, dtype=F64) * 2.0 - 0.05
    old = lp + _randn(g, b, T, scale=0.4)  # ratios ~ exp(+-0.4): many beyond 0.8 and 1.28
    # Row 0 has A > 0 and row 1 A < 0 (_signed_adv): token ratios 1.24 and 0.76 lie between the
    # two clip bounds (0.2 / 0.28), so a clip with swapped bounds clips them differently.
    # (row 0 is full length, row 1 has one token: see _mask)
    old[0, 0] = lp[0, 0] - math.log(1.24)
    old[0, 1] = lp[0, 1] - math.log(1.22)  # two of the first kind: the clip fraction changes too
    old[1, 0] = lp[1, 0] - math.log(0.76)
    return {"token_logp": lp, "token_logp_old": old, "mask": _mask(g, b)}


def _seqs(g: torch.Generator, n: int = B) -> dict[str, Tensor]:
    lengths = torch.randint(2, 9, (n,), generator=g)
    logp = -torch.rand(n, generator=g, dtype=F64) * lengths.to(F64) * 0.8 - 0.1
    return {"logp": logp, "lengths": lengths}


def _pm1(g: torch.Generator, n: int = B) -> Tensor:
    r = torch.where(torch.rand(n, generator=g) < 0.5, 1.0, -1.0).to(F64)
    r[0], r[1] = 1.0, -1.0
    return r


# --------------------------------------------------------------------------------- references
def _stack(xs: list[Any]) -> Tensor:
    return torch.stack([torch.as_tensor(x, dtype=F64) for x in xs])


def _mean(xs: list[Any]) -> Any:
    return sum(xs) / len(xs)


def _real(mask: Tensor, b: int) -> list[int]:
    return [t for t in range(mask.shape[1]) if float(mask[b, t]) > 0]


def ref_sequence_logprob(token_logp: Tensor, mask: Tensor, normalize: str = "sum") -> Tensor:
    out = []
    for b in range(token_logp.shape[0]):
        ts = _real(mask, b)
        s = sum(token_logp[b, t] for t in ts)
        out.append(s / max(len(ts), 1) if normalize == "mean" else s)
    return _stack(out)


def ref_kl(lp: Any, lpr: Any, estimator: str = "k3") -> Any:
    """Schulman's estimators of ``KL(pi || pi_ref)`` at one sample, ``d = log pi - log pi_ref``."""
    d = lp - lpr
    if estimator == "k1":
        return d
    if estimator == "k2":
        return d * d / 2
    return exp(-d) + d - 1


def ref_grpo_terms(
    lp: Tensor,
    lpo: Tensor,
    adv: Tensor,
    mask: Tensor,
    lo: float,
    hi: float,
    lpr: Tensor | None,
    kl: float,
    is_weight: Tensor | None = None,
    dual_clip: float | None = None,
    log_ratio_clip: float | None = None,
    kl_estimator: str = "k3",
    kl_ratio_weighted: bool = False,
    keep: Tensor | None = None,
):
    """Per-sequence lists of per-token GRPO terms
    ``w * pg + kl * k(lp, lpr)``, ``pg = -min(rho A, clip(rho, 1-lo, 1+hi) A)``, for ``A < 0`` with
    the dual clip ``min(pg, -c A)``; ``w`` (the IS weight) never multiplies the KL term."""
    rows = []
    for b in range(lp.shape[0]):
        row = []
        for t in _real(mask, b):
            lr = lp[b, t] - lpo[b, t]
            if log_ratio_clip is not None:
                lr = min(max(lr, -log_ratio_clip), log_ratio_clip)
            rho = exp(lr)
            clipped = min(max(rho, 1 - lo), 1 + hi)
            v = -min(rho * adv[b], clipped * adv[b])
            if dual_clip is not None and adv[b] < 0:
                v = min(v, -adv[b] * dual_clip)
            if keep is not None:
                v = v * float(keep[b])
            if is_weight is not None:
                v = v * (is_weight[b] if is_weight.dim() == 1 else is_weight[b, t])
            if kl:
                v = v + kl * ref_kl(lp[b, t], lpr[b, t], kl_estimator) * (rho if kl_ratio_weighted else 1.0)
            row.append(v)
        rows.append(row)
    return rows


def ref_aggregate(rows: list[list[Any]], loss_agg: str, max_len: int | None) -> Tensor:
    if loss_agg == "token_mean":
        flat = [v for row in rows for v in row]
        return sum(flat) / len(flat)
    if loss_agg == "seq_mean_token_mean":
        return _mean([sum(row) / len(row) for row in rows])
    if loss_agg == "seq_mean_token_sum":
        return _mean([sum(row) for row in rows])
    return _mean([sum(row) / max_len for row in rows])


def ref_grpo(
    token_logp,
    token_logp_old,
    adv,
    mask,
    token_logp_ref=None,
    clip_eps=0.2,
    clip_eps_high=None,
    loss_agg="token_mean",
    kl_coef=0.0,
    max_len=None,
    is_weight=None,
    dual_clip=None,
    log_ratio_clip=None,
    kl_estimator="k3",
    kl_ratio_weighted=False,
    off_policy_threshold=None,
    token_logp_sampler=None,
):
    hi = clip_eps if clip_eps_high is None else clip_eps_high
    keep = None
    if off_policy_threshold is not None:
        samp = token_logp_old if token_logp_sampler is None else token_logp_sampler
        keep = ref_off_policy_mask(token_logp, samp, adv, mask, off_policy_threshold)
    rows = ref_grpo_terms(
        token_logp,
        token_logp_old,
        adv,
        mask,
        clip_eps,
        hi,
        token_logp_ref,
        kl_coef,
        is_weight,
        dual_clip,
        log_ratio_clip,
        kl_estimator,
        kl_ratio_weighted,
        keep,
    )
    return ref_aggregate(rows, loss_agg, max_len)


def ref_grpo_clip_frac(token_logp, token_logp_old, adv, mask, clip_eps=0.2, clip_eps_high=None, **_):
    hi = clip_eps if clip_eps_high is None else clip_eps_high
    n = hits = 0
    for b in range(token_logp.shape[0]):
        for t in _real(mask, b):
            rho = float(exp(token_logp[b, t] - token_logp_old[b, t]))
            a = float(adv[b])
            n += 1
            hits += min(max(rho, 1 - clip_eps), 1 + hi) * a < rho * a
    return torch.tensor(hits / n, dtype=F64)


def ref_ppo_kl(
    token_logp, token_logp_old, adv, mask, kl_coef=1.0, clip_eps=0.2, clip_eps_high=None, loss_agg="token_mean"
):
    hi = clip_eps if clip_eps_high is None else clip_eps_high
    rows = ref_grpo_terms(token_logp, token_logp_old, adv, mask, clip_eps, hi, token_logp_old, kl_coef)
    return ref_aggregate(rows, loss_agg, None)


def ref_gspo(
    token_logp,
    token_logp_old,
    adv,
    mask,
    clip_eps=3e-4,
    clip_eps_high=4e-4,
    off_policy_threshold=None,
    token_logp_sampler=None,
):
    hi = clip_eps if clip_eps_high is None else clip_eps_high
    keep = None
    if off_policy_threshold is not None:
        samp = token_logp_old if token_logp_sampler is None else token_logp_sampler
        keep = ref_off_policy_mask(token_logp, samp, adv, mask, off_policy_threshold)
    out = []
    for b in range(token_logp.shape[0]):
        ts = _real(mask, b)
        s = exp(sum(token_logp[b, t] - token_logp_old[b, t] for t in ts) / len(ts))
        v = -min(s * adv[b], min(max(s, 1 - clip_eps), 1 + hi) * adv[b])
        out.append(v if keep is None else v * float(keep[b]))
    return _mean(out)


def ref_off_policy_mask(token_logp, token_logp_sampler, adv, mask, threshold):
    """DeepSeek-V3.2 eq. 9: keep a sequence when ``A >= 0`` or the token mean of
    ``logp_sampler - logp`` is ``<= threshold``; an unscored (NaN) sampler token counts 0."""
    out = []
    for b in range(token_logp.shape[0]):
        ts = _real(mask, b)
        ds = [
            0.0 if math.isnan(float(token_logp_sampler[b, t])) else float(token_logp_sampler[b, t] - token_logp[b, t])
            for t in ts
        ]
        kl = sum(ds) / max(len(ds), 1)
        out.append(1.0 if float(adv[b]) >= 0 or kl <= threshold else 0.0)
    return torch.tensor(out, dtype=F64)


def _ref_family(
    term,
    lp,
    lpo,
    adv,
    mask,
    lpr,
    kl_coef,
    is_weight,
    kl_estimator,
    kl_ratio_weighted,
    off_policy_threshold,
    token_logp_sampler,
    loss_agg,
    max_len,
    weight_pg=True,
    ratio=None,
):
    """Per-token rows ``m_b w_bt term(b, t) + kl_coef k(lp, lpr) (* rho)`` of the GRPO family
    (``m`` the off-policy keep mask, ``w`` the IS weight, ``rho`` the token ratio or ``ratio(b)``),
    aggregated."""
    keep = None
    if off_policy_threshold is not None:
        samp = lpo if token_logp_sampler is None else token_logp_sampler
        keep = ref_off_policy_mask(lp, samp, adv, mask, off_policy_threshold)
    rows = []
    for b in range(lp.shape[0]):
        row = []
        for t in _real(mask, b):
            v = term(b, t)
            if keep is not None:
                v = v * float(keep[b])
            if weight_pg and is_weight is not None:
                v = v * (is_weight[b] if is_weight.dim() == 1 else is_weight[b, t])
            if kl_coef:
                rho = exp(lp[b, t] - lpo[b, t]) if ratio is None else ratio(b)
                v = v + kl_coef * ref_kl(lp[b, t], lpr[b, t], kl_estimator) * (rho if kl_ratio_weighted else 1.0)
            row.append(v)
        rows.append(row)
    return ref_aggregate(rows, loss_agg, max_len)


def _clamp(x, lo, hi):
    if lo is not None:
        x = max(x, lo)
    return min(x, hi) if hi is not None else x


def ref_cispo(
    token_logp,
    token_logp_old,
    adv,
    mask,
    ratio_max=5.0,
    ratio_min=None,
    loss_agg="token_mean",
    token_logp_ref=None,
    kl_coef=0.0,
    is_weight=None,
    max_len=None,
    log_ratio_clip=None,
    kl_estimator="k3",
    kl_ratio_weighted=False,
    off_policy_threshold=None,
    token_logp_sampler=None,
):
    """MiniMax-M1 CISPO: ``-sg(clip(rho, r_min, r_max)) A logp``."""

    def term(b, t):
        lr = token_logp[b, t] - token_logp_old[b, t]
        if log_ratio_clip is not None:
            lr = _clamp(lr, -log_ratio_clip, log_ratio_clip)
        w = _clamp(float(exp(lr)), ratio_min, ratio_max)  # a constant: sg(.)
        return -w * adv[b] * token_logp[b, t]

    return _ref_family(
        term,
        token_logp,
        token_logp_old,
        adv,
        mask,
        token_logp_ref,
        kl_coef,
        is_weight,
        kl_estimator,
        kl_ratio_weighted,
        off_policy_threshold,
        token_logp_sampler,
        loss_agg,
        max_len,
    )


def ref_sapo(
    token_logp,
    token_logp_old,
    adv,
    mask,
    temp_pos=1.0,
    temp_neg=1.05,
    loss_agg="seq_mean_token_mean",
    token_logp_ref=None,
    kl_coef=0.0,
    is_weight=None,
    max_len=None,
    log_ratio_clip=None,
    kl_estimator="k3",
    kl_ratio_weighted=False,
    off_policy_threshold=None,
    token_logp_sampler=None,
):
    """SAPO: ``-(4 / tau) sigmoid(tau (rho - 1)) A``, ``tau = temp_pos`` if ``A > 0`` else ``temp_neg``."""

    def term(b, t):
        tau = temp_pos if float(adv[b]) > 0 else temp_neg
        lr = token_logp[b, t] - token_logp_old[b, t]
        if log_ratio_clip is not None:
            lr = _clamp(lr, -log_ratio_clip, log_ratio_clip)
        return -ref_sigmoid(tau * (exp(lr) - 1)) * (4 / tau) * adv[b]

    return _ref_family(
        term,
        token_logp,
        token_logp_old,
        adv,
        mask,
        token_logp_ref,
        kl_coef,
        is_weight,
        kl_estimator,
        kl_ratio_weighted,
        off_policy_threshold,
        token_logp_sampler,
        loss_agg,
        max_len,
    )


def ref_luspo(
    token_logp,
    token_logp_old,
    adv,
    mask,
    clip_eps=3e-4,
    clip_eps_high=4e-4,
    token_logp_ref=None,
    kl_coef=0.0,
    is_weight=None,
    kl_estimator="k3",
    kl_ratio_weighted=False,
    off_policy_threshold=None,
    token_logp_sampler=None,
):
    """LUSPO: GSPO's clipped sequence term on every token of the sequence, token SUM per sequence, mean over B."""
    hi = clip_eps if clip_eps_high is None else clip_eps_high

    def s(b):
        ts = _real(mask, b)
        return exp(sum(token_logp[b, t] - token_logp_old[b, t] for t in ts) / len(ts))

    def term(b, t):
        return -min(s(b) * adv[b], min(max(s(b), 1 - clip_eps), 1 + hi) * adv[b])

    return _ref_family(
        term,
        token_logp,
        token_logp_old,
        adv,
        mask,
        token_logp_ref,
        kl_coef,
        is_weight,
        kl_estimator,
        kl_ratio_weighted,
        off_policy_threshold,
        token_logp_sampler,
        "seq_mean_token_sum",
        None,
        ratio=s,
    )


def ref_vespo(
    token_logp,
    token_logp_old,
    adv,
    mask,
    k_pos=2.0,
    lambda_pos=3.0,
    k_neg=3.0,
    lambda_neg=2.0,
    loss_agg="token_mean",
    token_logp_ref=None,
    kl_coef=0.0,
    is_weight=None,
    max_len=None,
    kl_estimator="k3",
    kl_ratio_weighted=False,
    off_policy_threshold=None,
    token_logp_sampler=None,
):
    """VESPO: ``-sg(phi(w)) A logp``, ``phi(w) = e^lam w^k e^{-lam w}``, ``w`` the sequence ratio
    (product of token ratios, times the IS weight), log w clamped to ``[log 1e-8, 20]``."""
    lo = math.log(1e-8)

    def phi(b):
        ts = _real(mask, b)
        log_w = sum(_clamp(float(token_logp[b, t] - token_logp_old[b, t]), -20.0, 20.0) for t in ts)
        if is_weight is not None:
            iw = [float(is_weight[b])] if is_weight.dim() == 1 else [float(is_weight[b, t]) for t in ts]
            log_w += sum(_clamp(math.log(v) if v > 0 else -math.inf, lo, 20.0) for v in iw)
        log_w = _clamp(log_w, lo, 20.0)
        k, lam = (k_pos, lambda_pos) if float(adv[b]) >= 0 else (k_neg, lambda_neg)
        lam = max(lam, 1e-4)
        return math.exp(lam + k * log_w - lam * math.exp(log_w))

    def term(b, t):
        return -phi(b) * adv[b] * token_logp[b, t]

    return _ref_family(
        term,
        token_logp,
        token_logp_old,
        adv,
        mask,
        token_logp_ref,
        kl_coef,
        is_weight,
        kl_estimator,
        kl_ratio_weighted,
        off_policy_threshold,
        token_logp_sampler,
        loss_agg,
        max_len,
        weight_pg=False,
    )


def ref_group_advantages(rewards, scale="std", eps=1e-6):
    rows = []
    for p in range(rewards.shape[0]):
        row = [rewards[p, j] for j in range(rewards.shape[1])]
        if scale == "std":
            rows.append(_stack(ref_group_adv(row, eps)))
        elif scale == "batch":
            flat = [rewards[i, j] for i in range(rewards.shape[0]) for j in range(rewards.shape[1])]
            mu_all = _mean(flat)
            sd = (sum((v - mu_all) ** 2 for v in flat) / (len(flat) - 1)) ** 0.5  # unbiased, as TRL's nanstd
            mu = _mean(row)
            rows.append(_stack([(v - mu) / (sd + eps) for v in row]))
        else:
            mu = _mean(row)
            rows.append(_stack([v - mu for v in row]))
    return torch.stack(rows)


def ref_kl_in_reward(rewards, logp_old_seq, logp_ref_seq, coef):
    flat = rewards.reshape(-1)
    old, lref = logp_old_seq.reshape(-1), logp_ref_seq.reshape(-1)
    out = [flat[i] - coef * (old[i] - lref[i]).detach() for i in range(flat.shape[0])]  # the penalty is sg(.)
    return _stack(out).reshape(rewards.shape)


def ref_masked_mean(x, mask):
    flat = [x[b, t] for b in range(x.shape[0]) for t in _real(mask, b)]
    return sum(flat) / len(flat)


def ref_kl_k3(logp, logp_ref):
    out = []
    for i in range(logp.shape[0]):
        d = logp_ref[i] - logp[i]
        out.append(exp(d) - d - 1)
    return _stack(out)


def ref_kl_penalty(token_logp, token_logp_ref, mask, estimator="k3"):
    flat = [
        ref_kl(token_logp[b, t], token_logp_ref[b, t], estimator) for b in range(mask.shape[0]) for t in _real(mask, b)
    ]
    return sum(flat) / len(flat)


def ref_sequence_is_weight(ratio, mask, cap):
    out = []
    for b in range(ratio.shape[0]):
        w = exp(sum(log(ratio[b, t]) for t in _real(mask, b)))
        out.append(w if w < cap else w * 0 + cap)
    return _stack(out)


def ref_affine_reward(reward, scale, shift):
    return _stack([scale * reward[i] + shift for i in range(reward.shape[0])])


def mk_is_ratio(g: torch.Generator) -> dict[str, Tensor]:
    # token ratios around 1 (sampler close to the trained policy); one row's product exceeds the cap
    ratio = torch.exp(_randn(g, B, T, scale=0.3))
    ratio[0] = 1.6  # full row: 1.6**T > 3, capped
    return {"ratio": ratio, "mask": _mask(g)}


def mk_reward(g: torch.Generator) -> dict[str, Tensor]:
    return {"reward": torch.rand(B, generator=g, dtype=F64)}


def ref_tb_residual_(logp, logp_ref, reward, log_z, beta):
    n = logp.shape[0]
    return _stack(
        ref_tb_residual(
            [logp[i] for i in range(n)],
            [logp_ref[i] for i in range(n)],
            [reward[i] for i in range(n)],
            [log_z[i] for i in range(n)],
            beta,
        )
    )


def ref_tb_loss(residual, is_weight):
    return _mean([is_weight[i] * residual[i] ** 2 for i in range(residual.shape[0])])


def ref_disa(logp, logp_ref, reward, log_z_frozen, beta, is_weight):
    return _mean(
        [is_weight[i] * (log_z_frozen[i] + logp[i] - logp_ref[i] - beta * reward[i]) ** 2 for i in range(logp.shape[0])]
    )


def ref_vargrad_log_z(logp, logp_ref, reward, beta):
    return _stack(
        [
            _mean([beta * reward[p, j] - logp[p, j] + logp_ref[p, j] for j in range(logp.shape[1])])
            for p in range(logp.shape[0])
        ]
    )


def ref_vargrad(logp, logp_ref, reward, beta):
    lz = ref_vargrad_log_z(logp, logp_ref, reward, beta)
    terms = [
        (lz[p] + logp[p, j] - logp_ref[p, j] - beta * reward[p, j]) ** 2
        for p in range(logp.shape[0])
        for j in range(logp.shape[1])
    ]
    return _mean(terms)


def ref_is_weight(token_logp, token_logp_old, mask, weight_clip="max", max_weight=10.0, eps=0.2, eps_high=None):
    hi = eps if eps_high is None else eps_high
    out = []
    for b in range(token_logp.shape[0]):
        w = exp(sum(token_logp[b, t] - token_logp_old[b, t] for t in _real(mask, b)))
        if weight_clip == "max":
            w = min(w, max_weight)
        elif weight_clip == "eps":
            w = min(max(w, 1 - eps), 1 + hi)
        out.append(w)
    return _stack(out).detach()  # a weight: sg(.)


def ref_flowrl(
    token_logp,
    token_logp_ref,
    token_logp_old,
    mask,
    rewards,
    log_z,
    beta=15.0,
    length_normalize=True,
    group_normalize=True,
    weight_clip="max",
    max_weight=10.0,
    eps=0.2,
    eps_high=None,
):
    norm = "mean" if length_normalize else "sum"
    lp = ref_sequence_logprob(token_logp, mask, norm)
    lpr = ref_sequence_logprob(token_logp_ref, mask, norm)
    w = ref_is_weight(token_logp, token_logp_old, mask, weight_clip, max_weight, eps, eps_high)
    p_, g_ = rewards.shape
    adv = ref_group_advantages(rewards) if group_normalize else rewards
    terms = []
    for p in range(p_):
        for j in range(g_):
            b = p * g_ + j
            terms.append(w[b] * (log_z[p] + lp[b] - lpr[b] - beta * adv[p, j]) ** 2)
    return _mean(terms)


def ref_lad(logp, logp_old, adv, is_weight, eta, divergence):
    terms = []
    for i in range(logp.shape[0]):
        a = adv[i] / eta
        terms.append(is_weight[i] * exp(a) * ref_divergence(divergence, exp(logp[i] - logp_old[i] - a)))
    return _mean(terms)


def _softmax(xs: list[Any]) -> list[Any]:
    m = max(float(torch.as_tensor(x).detach()) for x in xs)  # a constant shift: no gradient
    es = [exp(x - m) for x in xs]
    z = sum(es)
    return [e / z for e in es]


def ref_lad_theoretical(logp, logp_old, adv, eta, divergence):
    out = []
    for p in range(logp.shape[0]):
        k = range(logp.shape[1])
        p_pi = _softmax([logp[p, j] - logp_old[p, j] for j in k])
        p_a = _softmax([adv[p, j] / eta for j in k])
        out.append(sum(p_a[j] * ref_divergence(divergence, p_pi[j] / p_a[j]) for j in k))
    return _stack(out)


def ref_offrl(logp, lengths, reward, logp_ref, kl_tau=0.0):
    n = logp.shape[0]
    v = -_mean([reward[i] * exp(logp[i] / float(lengths[i])) for i in range(n)])
    return v + kl_tau * _mean([logp_ref[i] - logp[i] for i in range(n)])


def ref_fpa(logp, logp_future, lengths, reward):
    return -_mean(
        [
            reward[i] * exp(logp_future[i].detach() / float(lengths[i])) * logp[i] / float(lengths[i])
            for i in range(logp.shape[0])
        ]
    )


def ref_dpo(logp_w, logp_l, ref_w, ref_l, beta=0.1):
    return -_mean(
        [log(ref_sigmoid(beta * ((logp_w[i] - ref_w[i]) - (logp_l[i] - ref_l[i])))) for i in range(logp_w.shape[0])]
    )


def ref_rpo(logp_w, logp_l, ref_w, ref_l, len_w, beta=0.1, alpha=1.0):
    nll = _mean([logp_w[i] / float(len_w[i]) for i in range(logp_w.shape[0])])
    return ref_dpo(logp_w, logp_l, ref_w, ref_l, beta) - alpha * nll


def ref_kto(logp, logp_ref, correct, beta=0.1, lambda_w=1.0, lambda_l=1.0, z0=None):
    n = logp.shape[0]
    r = [logp[i] - logp_ref[i] for i in range(n)]
    z = _mean(r).detach() if z0 is None else z0  # the reference point: sg(mean r)
    terms = []
    for i in range(n):
        if bool(correct[i]):
            terms.append(lambda_w - lambda_w * ref_sigmoid(beta * (r[i] - z)))
        else:
            terms.append(lambda_l - lambda_l * ref_sigmoid(beta * (z - r[i])))
    return _mean(terms)


def ref_simper(logp_w, len_w, logp_l, len_l):
    return -_mean([exp(logp_w[i] / float(len_w[i])) - exp(logp_l[i] / float(len_l[i])) for i in range(logp_w.shape[0])])


def ref_apo_value(rewards, beta1=0.5):
    return _stack(
        [
            beta1 * ref_log_partition_lse([rewards[p, j] / beta1 for j in range(rewards.shape[1])])
            for p in range(rewards.shape[0])
        ]
    )


def ref_apo_loss(logp, logp_ref, reward, v_hat, beta2=1e-3):
    return _mean([(beta2 * (logp[i] - logp_ref[i]) - (reward[i] - v_hat[i])) ** 2 for i in range(logp.shape[0])])


def ref_sft(token_logp, mask):
    return -ref_masked_mean(token_logp, mask)


def ref_future_logprobs(logits_theta, logits_ref, ids, lam):
    out = []
    for b in range(logits_theta.shape[0]):
        row = []
        for t in range(logits_theta.shape[1]):
            z = [(1 + lam) * logits_theta[b, t, v] - lam * logits_ref[b, t, v] for v in range(logits_theta.shape[2])]
            row.append(log(_softmax(z)[int(ids[b, t])]))
        out.append(_stack(row))
    return torch.stack(out)


def _rowwise(f: Callable[[list[Any]], Any]) -> Callable[..., Tensor]:
    def g(log_w: Tensor) -> Tensor:
        return _stack([f([log_w[p, j] for j in range(log_w.shape[1])]) for p in range(log_w.shape[0])])

    return g


def _ref_max_weight(lw: list[Any]) -> Any:
    ws = [exp(x) for x in lw]
    return max(ws, key=lambda w: float(w.detach())) / sum(ws)


def ref_log_importance_weights(logp_target, logp_proposal, tilt):
    return _stack([logp_target[i] + tilt[i] - logp_proposal[i] for i in range(logp_target.shape[0])])


def ref_log_z_from_pass_rate(p, beta):
    return _stack([log(1 + p[i] * (math.exp(beta) - 1)) for i in range(p.shape[0])])


def ref_pass_rate_from_log_z(log_z, beta):
    return _stack([(exp(log_z[i]) - 1) / (math.exp(beta) - 1) for i in range(log_z.shape[0])])


def ref_accuracy(log_z, kl, kl_coef, r_low=0.0, r_high=1.0, clip=True):
    out = []
    for i in range(log_z.shape[0]):
        v = (kl_coef * (log_z[i] - kl[i]) - r_low) / (r_high - r_low)
        out.append(min(max(v, 0.0), 1.0) if clip else v)
    return _stack(out)


def ref_replay_priority(n_correct, n, p_hat):
    return _stack([abs(float(n_correct[i]) / float(n[i]) - p_hat[i]) for i in range(p_hat.shape[0])])


def ref_regressor_loss(pred, target):
    return _mean([(pred[i] - target[i]) ** 2 for i in range(pred.shape[0])])


# ------------------------------------------------------------------------------ input makers
def mk_grpo(g: torch.Generator) -> dict[str, Tensor]:
    d = _tokens(g)
    d["adv"] = _signed_adv(g, B)
    d["token_logp_ref"] = d["token_logp"] + _randn(g, B, T, scale=0.3)
    return d


def mk_grpo_isw(g: torch.Generator) -> dict[str, Tensor]:
    d = mk_grpo(g)
    d["is_weight"] = torch.rand(B, T, generator=g, dtype=F64) + 0.5
    return d


def mk_grpo_far(g: torch.Generator) -> dict[str, Tensor]:
    """GRPO inputs with ratios far from 1 (log-ratio scale 0.8): the dual clip (c = 1.5) and a
    log-ratio clamp at 0.5 bind on some tokens."""
    d = mk_grpo(g)
    d["token_logp_old"] = d["token_logp"] + _randn(g, B, T, scale=0.8)
    d["token_logp_old"][1, 0] = d["token_logp"][1, 0] - 1.0  # row 1 has A < 0: rho = e > c, the dual clip binds
    return d


def mk_ppo(g: torch.Generator) -> dict[str, Tensor]:
    d = _tokens(g)
    d["adv"] = _signed_adv(g, B)
    return d


def mk_gspo(g: torch.Generator) -> dict[str, Tensor]:
    d = _tokens(g)
    d["token_logp_old"] = d["token_logp"] + _randn(g, B, T, scale=0.15)
    # sequence ratios exp(+-0.125) for row 0 (A > 0) and row 1 (A < 0): between the bounds 0.1 / 0.15
    d["token_logp_old"][0] = d["token_logp"][0] - 0.125
    d["token_logp_old"][1] = d["token_logp"][1] + 0.125
    d["adv"] = _signed_adv(g, B)
    return d


def _with_sampler(d: dict[str, Tensor], g: torch.Generator) -> dict[str, Tensor]:
    """A sampler log-prob (vLLM's) per token, and advantages, such that the off-policy mask at
    ``OPSM_THRESHOLD`` drops row 1 (A < 0, mean sampler-minus-current log-ratio 0.5) and keeps
    row 2 (A < 0, 0.05) and rows 0 and 3 (A >= 0, however far); an unscored token (NaN) in row 2."""
    d["adv"] = torch.tensor([0.9, -0.7, -1.1, 0.4], dtype=F64)
    off = torch.tensor([0.6, 0.5, 0.05, 0.7], dtype=F64)[:, None]
    d["token_logp_sampler"] = d["token_logp"] + off + _randn(g, B, T, scale=0.02)
    d["token_logp_sampler"][2, 0] = math.nan
    return d


OPSM_THRESHOLD = 0.2


def mk_opsm(g: torch.Generator) -> dict[str, Tensor]:
    d = _tokens(g)
    d.pop("token_logp_old")
    return _with_sampler(d, g)


def mk_grpo_opsm(g: torch.Generator) -> dict[str, Tensor]:
    return _with_sampler(mk_grpo_isw(g), g)


def mk_gspo_opsm(g: torch.Generator) -> dict[str, Tensor]:
    return _with_sampler(mk_gspo(g), g)


def mk_family(g: torch.Generator) -> dict[str, Tensor]:
    """The GRPO family's inputs with ratios spread around the CISPO cap 1.3 / floor 0.8 and the
    LUSPO clip range, a reference for the KL term and a per-token sampler IS weight."""
    d = mk_grpo_isw(g)
    d["token_logp_old"] = d["token_logp"] + _randn(g, B, T, scale=0.5)
    return d


def mk_family_seq_w(g: torch.Generator) -> dict[str, Tensor]:
    d = mk_family(g)
    d["is_weight"] = torch.rand(B, generator=g, dtype=F64) + 0.5
    return d


def mk_family_opsm(g: torch.Generator) -> dict[str, Tensor]:
    return _with_sampler(mk_family(g), g)


def mk_rewards(g: torch.Generator) -> dict[str, Tensor]:
    return {"rewards": _randn(g, P, G)}


def mk_kl_in_reward(g: torch.Generator, shape: tuple[int, ...] = (B,)) -> dict[str, Tensor]:
    # 0/1 rewards and sequence log-probs (sums over a few tokens) of a policy near the reference
    old = -torch.rand(shape, generator=g, dtype=F64) * 6
    return {
        "rewards": torch.randint(0, 2, shape, generator=g).to(F64),
        "logp_old_seq": old,
        "logp_ref_seq": old + _randn(g, *shape, scale=1.5),
    }


def mk_masked(g: torch.Generator) -> dict[str, Tensor]:
    return {"x": _randn(g, B, T), "mask": _mask(g)}


def mk_seq_tokens(g: torch.Generator) -> dict[str, Tensor]:
    d = _tokens(g)
    return {"token_logp": d["token_logp"], "mask": d["mask"]}


def mk_is_weight(g: torch.Generator) -> dict[str, Tensor]:
    d = _tokens(g)
    d["token_logp_old"] = d["token_logp"] + _randn(g, B, T, scale=0.5)
    return d


def mk_kl(g: torch.Generator) -> dict[str, Tensor]:
    lp = -torch.rand(B, generator=g, dtype=F64) * 2
    return {"logp": lp, "logp_ref": lp + _randn(g, B, scale=0.5)}


def mk_tb(g: torch.Generator) -> dict[str, Tensor]:
    lp = -torch.rand(B, generator=g, dtype=F64) * 3
    return {
        "logp": lp,
        "logp_ref": lp + _randn(g, B, scale=0.5),
        "reward": torch.rand(B, generator=g, dtype=F64),
        "log_z": _randn(g, B),
    }


def mk_tb_loss(g: torch.Generator) -> dict[str, Tensor]:
    return {"residual": _randn(g, B), "is_weight": torch.rand(B, generator=g, dtype=F64) + 0.5}


def mk_disa(g: torch.Generator) -> dict[str, Tensor]:
    d = mk_tb(g)
    d["log_z_frozen"] = d.pop("log_z")
    d["is_weight"] = torch.rand(B, generator=g, dtype=F64) + 0.5
    return d


def mk_vargrad(g: torch.Generator) -> dict[str, Tensor]:
    lp = -torch.rand(P, G, generator=g, dtype=F64) * 3
    return {"logp": lp, "logp_ref": lp + _randn(g, P, G, scale=0.5), "reward": torch.rand(P, G, generator=g, dtype=F64)}


def mk_flowrl(g: torch.Generator) -> dict[str, Tensor]:
    d = _tokens(g, P * G)
    d["token_logp_old"] = d["token_logp"] + _randn(g, P * G, T, scale=0.2)
    d["token_logp_ref"] = d["token_logp"] + _randn(g, P * G, T, scale=0.3)
    d["rewards"] = _randn(g, P, G)
    d["log_z"] = _randn(g, P)
    return d


def mk_lad(g: torch.Generator) -> dict[str, Tensor]:
    lp = -torch.rand(B, generator=g, dtype=F64) * 3
    return {
        "logp": lp,
        "logp_old": lp + _randn(g, B, scale=0.5),
        "adv": _randn(g, B),
        "is_weight": torch.rand(B, generator=g, dtype=F64) + 0.5,
    }


def mk_lad_thm(g: torch.Generator) -> dict[str, Tensor]:
    return {
        "logp": torch.log_softmax(_randn(g, P, 4), -1),
        "logp_old": torch.log_softmax(_randn(g, P, 4), -1),
        "adv": _randn(g, P, 4),
    }


def mk_offrl(g: torch.Generator) -> dict[str, Tensor]:
    d = _seqs(g)
    d["reward"] = _pm1(g)
    d["logp_ref"] = d["logp"] + _randn(g, B, scale=0.5)
    return d


def mk_fpa(g: torch.Generator) -> dict[str, Tensor]:
    d = _seqs(g)
    d["reward"] = _pm1(g)
    d["logp_future"] = d["logp"] + _randn(g, B, scale=0.5)
    return d


def mk_pairs(g: torch.Generator) -> dict[str, Tensor]:
    w, lo = _seqs(g), _seqs(g)
    return {
        "logp_w": w["logp"],
        "logp_l": lo["logp"],
        "ref_w": w["logp"] + _randn(g, B, scale=2.0),
        "ref_l": lo["logp"] + _randn(g, B, scale=2.0),
        "len_w": w["lengths"],
    }


def mk_dpo(g: torch.Generator) -> dict[str, Tensor]:
    d = mk_pairs(g)
    del d["len_w"]
    return d


def mk_simper(g: torch.Generator) -> dict[str, Tensor]:
    w, lo = _seqs(g), _seqs(g)
    return {"logp_w": w["logp"], "len_w": w["lengths"], "logp_l": lo["logp"], "len_l": lo["lengths"]}


def mk_kto(g: torch.Generator) -> dict[str, Tensor]:
    lp = -torch.rand(B, generator=g, dtype=F64) * 5
    correct = torch.tensor([True, False] + [bool(torch.rand(1, generator=g) < 0.5) for _ in range(B - 2)])
    return {"logp": lp, "logp_ref": lp + _randn(g, B, scale=4.0), "correct": correct}


def mk_kto_z0(g: torch.Generator) -> dict[str, Tensor]:
    d = mk_kto(g)
    d["z0"] = _randn(g, scale=2.0)
    return d


def mk_apo_value(g: torch.Generator) -> dict[str, Tensor]:
    return {"rewards": torch.rand(P, 4, generator=g, dtype=F64)}


def mk_apo_loss(g: torch.Generator) -> dict[str, Tensor]:
    lp = -torch.rand(B, generator=g, dtype=F64) * 5
    return {
        "logp": lp,
        "logp_ref": lp + _randn(g, B),
        "reward": torch.rand(B, generator=g, dtype=F64),
        "v_hat": torch.rand(B, generator=g, dtype=F64),
    }


def mk_future(g: torch.Generator) -> dict[str, Tensor]:
    return {
        "logits_theta": _randn(g, 3, 2, 5),
        "logits_ref": _randn(g, 3, 2, 5),
        "ids": torch.randint(0, 5, (3, 2), generator=g),
    }


def mk_log_w(g: torch.Generator) -> dict[str, Tensor]:
    return {"log_w": _randn(g, P + 1, 5, scale=1.5)}


def mk_liw(g: torch.Generator) -> dict[str, Tensor]:
    return {
        "logp_target": -torch.rand(B, generator=g, dtype=F64) * 3,
        "logp_proposal": -torch.rand(B, generator=g, dtype=F64) * 3,
        "tilt": torch.rand(B, generator=g, dtype=F64),
    }


def mk_pass_rate(g: torch.Generator) -> dict[str, Tensor]:
    return {"p": torch.rand(B, generator=g, dtype=F64) * 0.8 + 0.1}


def mk_log_z(g: torch.Generator) -> dict[str, Tensor]:
    return {"log_z": torch.rand(B, generator=g, dtype=F64) * 1.5 + 0.1}


def mk_accuracy(g: torch.Generator) -> dict[str, Tensor]:
    return {"log_z": _randn(g, B), "kl": torch.rand(B, generator=g, dtype=F64) * 0.2}


def mk_priority(g: torch.Generator) -> dict[str, Tensor]:
    n = torch.randint(4, 9, (B,), generator=g).to(F64)
    return {
        "n_correct": torch.floor(n * torch.rand(B, generator=g, dtype=F64)),
        "n": n,
        "p_hat": torch.rand(B, generator=g, dtype=F64),
    }


def mk_regressor(g: torch.Generator) -> dict[str, Tensor]:
    return {"pred": _randn(g, B), "target": _randn(g, B)}


# ----------------------------------------------------------------------------------- registry
TOK = ("token_logp", "token_logp_old")
CLIP = {"clip_eps": 0.2, "clip_eps_high": 0.28}  # asymmetric (DAPO's clip-higher): swapping the bounds is visible
ROWS = {
    "token_logp": 1,
    "token_logp_old": 1,
    "mask": 1,
    "adv": 1,
    "token_logp_ref": 1,
    "is_weight": 1,
    "token_logp_sampler": 1,
}


def _rows(*names: str, n: int = 1) -> dict[str, int]:
    return {k: n for k in names}


FAMILY_FROZEN = ("token_logp_old", "adv", "token_logp_ref", "is_weight", "token_logp_sampler")
FAMILY_TOK = (*TOK, "token_logp_ref", "is_weight", "token_logp_sampler")
OPSM = {"off_policy_threshold": OPSM_THRESHOLD}
KL = {"kl_coef": 0.1, "kl_ratio_weighted": True}
# (function, reference, stop-gradient surrogate, {variant: (maker, kwargs, split weighting)}); every
# variant's options away from the function's defaults
FAMILY = {
    "cispo_loss": (
        pg.cispo_loss,
        ref_cispo,
        True,
        {
            "token_mean": (mk_family, {"ratio_max": 1.3, **KL}, "token"),
            "ratio_min": (
                mk_family,
                {
                    "ratio_min": 0.8,
                    "ratio_max": 1.2,
                    "loss_agg": "seq_mean_token_mean",
                    "kl_coef": 0.1,
                    "log_ratio_clip": 0.6,
                },
                "mean",
            ),
            "off_policy": (
                mk_family_opsm,
                {"ratio_max": 1.3, "loss_agg": "seq_mean_token_sum_norm", "max_len": 8, **OPSM},
                "mean",
            ),
        },
    ),
    "sapo_loss": (
        pg.sapo_loss,
        ref_sapo,
        False,
        {
            "seq_mean_token_mean": (mk_family, {"temp_pos": 0.7, "temp_neg": 1.6, **KL}, "mean"),
            "seq_w": (
                mk_family_seq_w,
                {"temp_pos": 1.4, "temp_neg": 0.5, "loss_agg": "token_mean", "log_ratio_clip": 0.6, "kl_coef": 0.1},
                "token",
            ),
            "off_policy": (mk_family_opsm, {"temp_pos": 0.7, "temp_neg": 1.6, **OPSM}, "mean"),
        },
    ),
    "luspo_loss": (
        pg.luspo_loss,
        ref_luspo,
        False,
        {
            "token_w": (mk_family, {"clip_eps": 0.1, "clip_eps_high": 0.15, **KL}, "mean"),
            "seq_w": (mk_family_seq_w, {"clip_eps": 0.1, "clip_eps_high": 0.15, "kl_coef": 0.1}, "mean"),
            "off_policy": (mk_family_opsm, {"clip_eps": 0.1, "clip_eps_high": 0.15, **OPSM}, "mean"),
        },
    ),
    "vespo_loss": (
        pg.vespo_loss,
        ref_vespo,
        True,
        {
            "token_mean": (
                mk_family,
                {"k_pos": 1.5, "lambda_pos": 2.5, "k_neg": 2.5, "lambda_neg": 1.2, **KL},
                "token",
            ),
            "seq_w": (
                mk_family_seq_w,
                {
                    "k_pos": 3.0,
                    "lambda_pos": 1.0,
                    "k_neg": 1.0,
                    "lambda_neg": 4.0,
                    "loss_agg": "seq_mean_token_mean",
                    "kl_coef": 0.1,
                },
                "mean",
            ),
            "off_policy": (mk_family_opsm, {"k_pos": 1.5, "lambda_pos": 2.5, **OPSM}, "token"),
        },
    ),
}


def _family_entries() -> list[OpInfo]:
    out = []
    for fname, (fn, ref, surrogate, variants) in FAMILY.items():
        for variant, (mk, kw, weighting) in variants.items():
            seq_w = mk is mk_family_seq_w
            names = set(mk(torch.Generator().manual_seed(0)))
            out.append(
                OpInfo(
                    f"pg.{fname}[{variant}]",
                    loss_of(fn),
                    ref,
                    mk,
                    kw,
                    grad=("token_logp",),
                    frozen=tuple(n for n in FAMILY_FROZEN if n in names),
                    mask="mask",
                    tokens=tuple(n for n in FAMILY_TOK if n in names and not (seq_w and n == "is_weight")),
                    split=Split(ROWS, weighting),
                    # CISPO's sg(clip(rho)) and VESPO's sg(phi(w)) are stop-gradients of functions of logp
                    gradcheck=not surrogate,
                )
            )
    return out


def _grpo_entries() -> list[OpInfo]:
    out = []
    for agg, w in (("token_mean", "token"), ("seq_mean_token_mean", "mean"), ("seq_mean_token_sum_norm", "mean")):
        kw = {**CLIP, "loss_agg": agg, "kl_coef": 0.1, "max_len": 8}
        out.append(
            OpInfo(
                f"pg.grpo_loss[{agg}]",
                loss_of(pg.grpo_loss),
                ref_grpo,
                mk_grpo,
                kw,
                grad=("token_logp",),
                frozen=("token_logp_old", "adv", "token_logp_ref"),
                mask="mask",
                tokens=(*TOK, "token_logp_ref"),
                split=Split(ROWS, w),
            )
        )
    out.append(
        OpInfo(
            "pg.grpo_loss[is_weight]",
            loss_of(pg.grpo_loss),
            ref_grpo,
            mk_grpo_isw,
            {**CLIP, "kl_coef": 0.1},
            grad=("token_logp",),
            frozen=("token_logp_old", "adv", "token_logp_ref", "is_weight"),
            mask="mask",
            tokens=(*TOK, "token_logp_ref", "is_weight"),
            split=Split(ROWS, "token"),
        )
    )
    options = {
        "clip_eps": {"clip_eps": 0.1},  # away from the default 0.2 (clip_eps_high stays 0.28)
        "dual_clip": {"dual_clip": 1.5},
        "log_ratio_clip": {"log_ratio_clip": 0.5},
        "k1": {"kl_estimator": "k1"},
        "k2": {"kl_estimator": "k2"},
        "kl_ratio_weighted": {"kl_ratio_weighted": True},
    }
    for name, opt in options.items():
        out.append(
            OpInfo(
                f"pg.grpo_loss[{name}]",
                loss_of(pg.grpo_loss),
                ref_grpo,
                mk_grpo_far,
                {**CLIP, "kl_coef": 0.1, **opt},
                grad=("token_logp",),
                frozen=("token_logp_old", "adv", "token_logp_ref"),
                mask="mask",
                tokens=(*TOK, "token_logp_ref"),
                split=Split(ROWS, "token"),
            )
        )
    out.append(
        OpInfo(
            "pg.grpo_loss.clip_frac",
            lambda **kw: pg.grpo_loss(**kw).metrics["clip_frac"],
            ref_grpo_clip_frac,
            mk_ppo,
            CLIP,
            frozen=("token_logp", "token_logp_old", "adv"),
            mask="mask",
            tokens=TOK,
            split=Split(ROWS, "token"),
            nan_input="token_logp",
            low=torch.float32,
        )
        # clip_frac counts threshold crossings: a bf16 ratio may land on the other side of 1 + eps
        # than its float64 value, so its low-precision twin is float32 (the ratios are O(1) apart).
    )
    out.append(
        OpInfo(
            "pg.ppo_kl_loss",
            loss_of(pg.ppo_kl_loss),
            ref_ppo_kl,
            mk_ppo,
            {**CLIP, "kl_coef": 1.0},
            grad=("token_logp",),
            frozen=("token_logp_old", "adv"),
            mask="mask",
            tokens=TOK,
            split=Split(ROWS, "token"),
        )
    )
    out.append(
        OpInfo(
            "pg.gspo_loss",
            loss_of(pg.gspo_loss),
            ref_gspo,
            mk_gspo,
            {"clip_eps": 0.1, "clip_eps_high": 0.15},
            grad=("token_logp",),
            frozen=("token_logp_old", "adv"),
            mask="mask",
            tokens=TOK,
            split=Split(ROWS, "mean"),
        )
    )
    out.append(
        OpInfo(
            "pg.grpo_loss[off_policy]",
            loss_of(pg.grpo_loss),
            ref_grpo,
            mk_grpo_opsm,
            {**CLIP, "kl_coef": 0.1, "off_policy_threshold": OPSM_THRESHOLD},
            grad=("token_logp",),
            frozen=FAMILY_FROZEN,
            mask="mask",
            tokens=FAMILY_TOK,
            split=Split(ROWS, "token"),
        )
    )
    out.append(
        OpInfo(
            "pg.gspo_loss[off_policy]",
            loss_of(pg.gspo_loss),
            ref_gspo,
            mk_gspo_opsm,
            {"clip_eps": 0.1, "clip_eps_high": 0.15, "off_policy_threshold": OPSM_THRESHOLD},
            grad=("token_logp",),
            frozen=("token_logp_old", "adv", "token_logp_sampler"),
            mask="mask",
            tokens=(*TOK, "token_logp_sampler"),
            split=Split(ROWS, "mean"),
        )
    )
    out.extend(_family_entries())
    out.append(
        OpInfo(
            "pg.off_policy_sequence_mask",
            pg.off_policy_sequence_mask,
            ref_off_policy_mask,
            mk_opsm,
            {"threshold": OPSM_THRESHOLD},
            frozen=("token_logp", "token_logp_sampler", "adv"),
            mask="mask",
            tokens=("token_logp", "token_logp_sampler"),
            split=Split(_rows("token_logp", "token_logp_sampler", "adv", "mask"), "concat"),
            nan="raise",
            nan_input="token_logp",
            low=torch.float32,  # a threshold comparison: bf16 may move a sequence's KL across it
        )
    )
    return out


def _lad_entries() -> list[OpInfo]:
    out = []
    for name in lad.F_DIVERGENCES:
        out.append(
            OpInfo(
                f"lad.lad_loss[{name}]",
                loss_of(lad.lad_loss),
                ref_lad,
                mk_lad,
                {"eta": 0.7, "divergence": name},
                grad=("logp",),
                frozen=("logp_old", "adv", "is_weight"),
                split=Split(_rows("logp", "logp_old", "adv", "is_weight"), "mean"),
            )
        )
        out.append(
            OpInfo(
                f"lad.lad_theoretical_loss[{name}]",
                loss_of(lad.lad_theoretical_loss),
                ref_lad_theoretical,
                mk_lad_thm,
                {"eta": 0.7, "divergence": name},
                grad=("logp",),
                frozen=("logp_old", "adv"),
                split=Split(_rows("logp", "logp_old", "adv"), "concat"),
            )
        )
    return out


_EST_ROWS = Split({"log_w": 1}, "concat")

OPS: list[OpInfo] = [
    # --- tb
    OpInfo(
        "tb.sequence_logprob[sum]",
        tb.sequence_logprob,
        ref_sequence_logprob,
        mk_seq_tokens,
        {"normalize": "sum"},
        grad=("token_logp",),
        mask="mask",
        tokens=("token_logp",),
        split=Split(_rows("token_logp", "mask"), "concat"),
    ),
    OpInfo(
        "tb.sequence_logprob[mean]",
        tb.sequence_logprob,
        ref_sequence_logprob,
        mk_seq_tokens,
        {"normalize": "mean"},
        grad=("token_logp",),
        mask="mask",
        tokens=("token_logp",),
        split=Split(_rows("token_logp", "mask"), "concat"),
    ),
    OpInfo(
        "tb.tb_residual",
        tb.tb_residual,
        ref_tb_residual_,
        mk_tb,
        {"beta": 2.0},
        grad=("logp", "log_z"),
        split=Split(_rows("logp", "logp_ref", "reward", "log_z"), "concat"),
    ),
    OpInfo(
        "tb.tb_loss",
        loss_of(tb.tb_loss),
        ref_tb_loss,
        mk_tb_loss,
        grad=("residual",),
        frozen=("is_weight",),
        split=Split(_rows("residual", "is_weight"), "mean"),
    ),
    OpInfo(
        "tb.disa_loss",
        loss_of(tb.disa_loss),
        ref_disa,
        mk_disa,
        {"beta": 2.0},
        grad=("logp",),
        frozen=("logp_ref", "reward", "log_z_frozen", "is_weight"),
        split=Split(_rows("logp", "logp_ref", "reward", "log_z_frozen", "is_weight"), "mean"),
    ),
    OpInfo(
        "tb.vargrad_log_z",
        tb.vargrad_log_z,
        ref_vargrad_log_z,
        mk_vargrad,
        {"beta": 2.0},
        grad=("logp",),
        split=Split(_rows("logp", "logp_ref", "reward"), "concat"),
    ),
    OpInfo(
        "tb.vargrad_loss",
        loss_of(tb.vargrad_loss),
        ref_vargrad,
        mk_vargrad,
        {"beta": 2.0},
        grad=("logp",),
        frozen=("logp_ref", "reward"),
        split=Split(_rows("logp", "logp_ref", "reward"), "mean"),
    ),
    OpInfo(
        "tb.tb_importance_weight[max]",
        tb.tb_importance_weight,
        ref_is_weight,
        mk_is_weight,
        {"weight_clip": "max", "max_weight": 1.5},
        frozen=TOK,
        mask="mask",
        tokens=TOK,
        split=Split(_rows(*TOK, "mask"), "concat"),
        nan_input="token_logp",
    ),
    OpInfo(
        "tb.tb_importance_weight[eps]",
        tb.tb_importance_weight,
        ref_is_weight,
        mk_is_weight,
        {"weight_clip": "eps"},
        frozen=TOK,
        mask="mask",
        tokens=TOK,
        split=Split(_rows(*TOK, "mask"), "concat"),
        nan_input="token_logp",
    ),
    OpInfo(
        "tb.tb_importance_weight[eps,asymmetric]",
        tb.tb_importance_weight,
        ref_is_weight,
        mk_is_weight,
        {"weight_clip": "eps", "eps": 0.2, "eps_high": 0.28},  # FlowRL's [0.8, 1.28] recipe
        frozen=TOK,
        mask="mask",
        tokens=TOK,
        split=Split(_rows(*TOK, "mask"), "concat"),
        nan_input="token_logp",
    ),
    OpInfo(
        "tb.tb_importance_weight[eps,away]",
        tb.tb_importance_weight,
        ref_is_weight,
        mk_is_weight,
        {"weight_clip": "eps", "eps": 0.07, "eps_high": 0.03},  # neither at the default 0.2; low wider than high
        frozen=TOK,
        mask="mask",
        tokens=TOK,
        split=Split(_rows(*TOK, "mask"), "concat"),
        nan_input="token_logp",
    ),
    OpInfo(
        "tb.flowrl_loss",
        loss_of(tb.flowrl_loss),
        ref_flowrl,
        mk_flowrl,
        {"beta": 2.0, "max_weight": 1.3},
        grad=("token_logp", "log_z"),
        frozen=("token_logp_ref", "token_logp_old", "rewards"),
        mask="mask",
        tokens=(*TOK, "token_logp_ref"),
        split=Split({**_rows(*TOK, "token_logp_ref", "mask", n=G), "rewards": 1, "log_z": 1}, "mean"),
        gradcheck=False,
    ),
    OpInfo(
        "tb.flowrl_loss[sum,eps,raw]",
        loss_of(tb.flowrl_loss),
        ref_flowrl,
        mk_flowrl,
        {"beta": 0.5, "length_normalize": False, "group_normalize": False, "weight_clip": "eps"},
        grad=("token_logp", "log_z"),
        frozen=("token_logp_ref", "token_logp_old", "rewards"),
        mask="mask",
        tokens=(*TOK, "token_logp_ref"),
        split=Split({**_rows(*TOK, "token_logp_ref", "mask", n=G), "rewards": 1, "log_z": 1}, "mean"),
        gradcheck=False,
    ),
    OpInfo(
        "tb.flowrl_loss[eps,away]",
        loss_of(tb.flowrl_loss),
        ref_flowrl,
        mk_flowrl,
        {"beta": 0.5, "weight_clip": "eps", "eps": 0.07, "eps_high": 0.03},  # neither at its default
        grad=("token_logp", "log_z"),
        frozen=("token_logp_ref", "token_logp_old", "rewards"),
        mask="mask",
        tokens=(*TOK, "token_logp_ref"),
        split=Split({**_rows(*TOK, "token_logp_ref", "mask", n=G), "rewards": 1, "log_z": 1}, "mean"),
        gradcheck=False,
    ),
    # --- pg
    OpInfo(
        "pg.group_advantages[std]",
        pg.group_advantages,
        ref_group_advantages,
        mk_rewards,
        {"scale": "std"},
        grad=("rewards",),
        split=Split({"rewards": 1}, "concat"),
    ),
    OpInfo(
        "pg.group_advantages[none]",
        pg.group_advantages,
        ref_group_advantages,
        mk_rewards,
        {"scale": "none"},
        grad=("rewards",),
        split=Split({"rewards": 1}, "concat"),
    ),
    OpInfo(
        "pg.group_advantages[batch]",
        pg.group_advantages,
        ref_group_advantages,
        mk_rewards,
        {"scale": "batch", "eps": 1e-4},  # TRL's scale_rewards="batch" and TRL's eps
        grad=("rewards",),
        split=None,  # the batch std couples all groups
    ),
    OpInfo(
        "pg.kl_in_reward",
        pg.kl_in_reward,
        ref_kl_in_reward,
        mk_kl_in_reward,
        {"coef": 0.7},
        grad=("rewards",),
        frozen=("logp_old_seq", "logp_ref_seq"),  # the penalty is a constant of the reward
        split=Split(_rows("rewards", "logp_old_seq", "logp_ref_seq"), "concat"),
    ),
    OpInfo(
        "pg.kl_in_reward[groups]",
        pg.kl_in_reward,
        ref_kl_in_reward,
        lambda g: mk_kl_in_reward(g, (P, G)),
        {"coef": 2.5},
        grad=("rewards",),
        frozen=("logp_old_seq", "logp_ref_seq"),
        split=Split(_rows("rewards", "logp_old_seq", "logp_ref_seq"), "concat"),
    ),
    OpInfo(
        "pg.masked_mean",
        pg.masked_mean,
        ref_masked_mean,
        mk_masked,
        grad=("x",),
        mask="mask",
        tokens=("x",),
        split=Split({"x": 1, "mask": 1}, "token"),
    ),
    OpInfo(
        "pg.kl_k3",
        pg.kl_k3,
        ref_kl_k3,
        mk_kl,
        grad=("logp", "logp_ref"),
        split=Split(_rows("logp", "logp_ref"), "concat"),
    ),
    *(
        OpInfo(
            f"pg.kl_estimate[{k}]",
            pg.kl_estimate,
            lambda logp, logp_ref, estimator: _stack([ref_kl(logp[i], logp_ref[i], estimator) for i in range(B)]),
            mk_kl,
            {"estimator": k},
            grad=("logp", "logp_ref"),
            split=Split(_rows("logp", "logp_ref"), "concat"),
        )
        for k in ("k1", "k2", "k3")
    ),
    *_grpo_entries(),
    # --- correction / transforms (applied by the online trainer)
    OpInfo(
        "correction.kl_penalty",
        correction.kl_penalty,
        ref_kl_penalty,
        lambda g: {**mk_seq_tokens(g), "token_logp_ref": _tokens(g)["token_logp_old"]},
        grad=("token_logp",),
        mask="mask",
        tokens=("token_logp", "token_logp_ref"),
        split=Split({"token_logp": 1, "token_logp_ref": 1, "mask": 1}, "token"),
    ),
    *(
        OpInfo(
            f"correction.kl_penalty[{k}]",
            correction.kl_penalty,
            ref_kl_penalty,
            lambda g: {**mk_seq_tokens(g), "token_logp_ref": _tokens(g)["token_logp_old"]},
            {"estimator": k},
            grad=("token_logp",),
            mask="mask",
            tokens=("token_logp", "token_logp_ref"),
            split=Split({"token_logp": 1, "token_logp_ref": 1, "mask": 1}, "token"),
        )
        for k in ("k1", "k2")
    ),
    OpInfo(
        "correction.sequence_is_weight",
        correction.sequence_is_weight,
        ref_sequence_is_weight,
        mk_is_ratio,
        {"cap": 3.0},
        grad=("ratio",),
        mask="mask",
        tokens=("ratio",),
        split=Split({"ratio": 1, "mask": 1}, "concat"),
    ),
    OpInfo(
        "transforms.affine_reward",
        transforms.affine_reward,
        ref_affine_reward,
        mk_reward,
        {"scale": 2.0, "shift": -0.5},
        grad=("reward",),
        split=Split({"reward": 1}, "concat"),
    ),
    # --- lad
    *_lad_entries(),
    # --- offline
    OpInfo(
        "offline.offrl_loss",
        loss_of(offline.offrl_loss),
        ref_offrl,
        mk_offrl,
        {"kl_tau": 0.04},
        grad=("logp",),
        frozen=("reward", "logp_ref"),
        split=Split(_rows("logp", "lengths", "reward", "logp_ref"), "mean"),
        nan="raise",
    ),
    OpInfo(
        "offline.fpa_loss",
        loss_of(offline.fpa_loss),
        ref_fpa,
        mk_fpa,
        grad=("logp",),
        frozen=("logp_future", "reward"),
        split=Split(_rows("logp", "lengths", "reward", "logp_future"), "mean"),
        nan="raise",
    ),
    OpInfo(
        "offline.dpo_loss",
        loss_of(offline.dpo_loss),
        ref_dpo,
        mk_dpo,
        {"beta": 0.1},
        grad=("logp_w", "logp_l"),
        frozen=("ref_w", "ref_l"),
        split=Split(_rows("logp_w", "logp_l", "ref_w", "ref_l"), "mean"),
        nan="raise",
    ),
    OpInfo(
        "offline.rpo_loss",
        loss_of(offline.rpo_loss),
        ref_rpo,
        mk_pairs,
        {"beta": 0.1, "alpha": 1.0},
        grad=("logp_w", "logp_l"),
        frozen=("ref_w", "ref_l"),
        split=Split(_rows("logp_w", "logp_l", "ref_w", "ref_l", "len_w"), "mean"),
        nan="raise",
    ),
    # KTO with z0 = the batch mean of r: the reference point couples the batch (no split invariance).
    OpInfo(
        "offline.kto_loss[batch z0]",
        loss_of(offline.kto_loss),
        ref_kto,
        mk_kto,
        {"beta": 0.5, "lambda_l": 1.33},
        grad=("logp",),
        frozen=("logp_ref",),
        gradcheck=False,
        nan="raise",
    ),
    OpInfo(
        "offline.kto_loss[given z0]",
        loss_of(offline.kto_loss),
        ref_kto,
        mk_kto_z0,
        {"beta": 0.5, "lambda_l": 1.33},
        grad=("logp",),
        frozen=("logp_ref", "z0"),
        split=Split(_rows("logp", "logp_ref", "correct"), "mean"),
        shape_inputs=("logp", "logp_ref", "correct"),
        nan="raise",
    ),
    OpInfo(
        "offline.simper_loss",
        loss_of(offline.simper_loss),
        ref_simper,
        mk_simper,
        grad=("logp_w", "logp_l"),
        split=Split(_rows("logp_w", "len_w", "logp_l", "len_l"), "mean"),
        nan="raise",
    ),
    OpInfo(
        "offline.apo_value",
        offline.apo_value,
        ref_apo_value,
        mk_apo_value,
        {"beta1": 0.5},
        grad=("rewards",),
        split=Split({"rewards": 1}, "concat"),
        nan="raise",
    ),
    OpInfo(
        "offline.apo_loss",
        loss_of(offline.apo_loss),
        ref_apo_loss,
        mk_apo_loss,
        {"beta2": 0.1},
        grad=("logp",),
        frozen=("logp_ref", "reward", "v_hat"),
        split=Split(_rows("logp", "logp_ref", "reward", "v_hat"), "mean"),
        nan="raise",
    ),
    OpInfo(
        "offline.sft_loss",
        loss_of(offline.sft_loss),
        ref_sft,
        mk_seq_tokens,
        grad=("token_logp",),
        mask="mask",
        tokens=("token_logp",),
        split=Split(_rows("token_logp", "mask"), "token"),
        nan="raise",
    ),
    OpInfo(
        "offline.future_policy_logprobs",
        offline.future_policy_logprobs,
        ref_future_logprobs,
        mk_future,
        {"lam": 0.5},
        grad=("logits_theta", "logits_ref"),
        split=Split(_rows("logits_theta", "logits_ref", "ids"), "concat"),
        low=torch.float32,
    ),
    # (future_policy_logprobs normalizes half inputs in float32 and returns the input dtype: float32 is its twin)
    # --- estimators (Stage 1)
    OpInfo(
        "estimators.log_partition_lse",
        estimators.log_partition_lse,
        _rowwise(ref_log_partition_lse),
        mk_log_w,
        grad=("log_w",),
        split=_EST_ROWS,
        nan="raise",
    ),
    OpInfo(
        "estimators.log_partition_geomean",
        estimators.log_partition_geomean,
        _rowwise(ref_geomean),
        mk_log_w,
        grad=("log_w",),
        split=_EST_ROWS,
        nan="raise",
    ),
    OpInfo(
        "estimators.effective_sample_size",
        estimators.effective_sample_size,
        _rowwise(ref_ess),
        mk_log_w,
        grad=("log_w",),
        split=_EST_ROWS,
        nan="raise",
    ),
    OpInfo(
        "estimators.max_normalized_weight",
        estimators.max_normalized_weight,
        _rowwise(_ref_max_weight),
        mk_log_w,
        grad=("log_w",),
        split=_EST_ROWS,
        nan="raise",
    ),
    OpInfo(
        "estimators.delta_method_bias",
        estimators.delta_method_bias,
        _rowwise(ref_delta_bias),
        mk_log_w,
        grad=("log_w",),
        split=_EST_ROWS,
        nan="raise",
    ),
    OpInfo(
        "estimators.bias_corrected_log_partition",
        estimators.bias_corrected_log_partition,
        _rowwise(lambda lw: ref_log_partition_lse(lw) - ref_delta_bias(lw)),
        mk_log_w,
        grad=("log_w",),
        split=_EST_ROWS,
        nan="raise",
    ),
    OpInfo(
        "estimators.log_importance_weights",
        estimators.log_importance_weights,
        ref_log_importance_weights,
        mk_liw,
        grad=("logp_target", "tilt"),
        split=Split(_rows("logp_target", "logp_proposal", "tilt"), "concat"),
        nan="raise",
    ),
    OpInfo(
        "estimators.log_z_from_pass_rate",
        estimators.log_z_from_pass_rate,
        ref_log_z_from_pass_rate,
        mk_pass_rate,
        {"beta": 3.0},
        grad=("p",),
        split=Split({"p": 1}, "concat"),
        nan="raise",
    ),
    OpInfo(
        "estimators.pass_rate_from_log_z",
        estimators.pass_rate_from_log_z,
        ref_pass_rate_from_log_z,
        mk_log_z,
        {"beta": 3.0},
        grad=("log_z",),
        split=Split({"log_z": 1}, "concat"),
    ),
    # --- paced
    OpInfo(
        "paced.accuracy_from_log_z[clip]",
        paced.accuracy_from_log_z,
        ref_accuracy,
        mk_accuracy,
        {"kl_coef": 0.3, "r_low": -1.0, "r_high": 1.0, "clip": True},
        grad=("log_z", "kl"),
        split=Split(_rows("log_z", "kl"), "concat"),
        nan="raise",
    ),
    OpInfo(
        "paced.accuracy_from_log_z[raw]",
        paced.accuracy_from_log_z,
        ref_accuracy,
        mk_accuracy,
        {"kl_coef": 0.3, "clip": False},
        grad=("log_z", "kl"),
        split=Split(_rows("log_z", "kl"), "concat"),
        nan="raise",
    ),
    OpInfo(
        "paced.replay_priority",
        paced.replay_priority,
        ref_replay_priority,
        mk_priority,
        grad=("p_hat",),
        split=Split(_rows("n_correct", "n", "p_hat"), "concat"),
        nan_input="p_hat",
        nan="raise",
    ),
    # --- Stage 2
    OpInfo(
        "regressor.regressor_loss",
        loss_of(regressor.regressor_loss),
        ref_regressor_loss,
        mk_regressor,
        grad=("pred",),
        frozen=("target",),
        split=Split(_rows("pred", "target"), "mean"),
        nan="raise",
    ),
]

RAISE_ON_NAN = (
    "tb.tb_residual",
    "tb.disa_loss",
    "tb.vargrad_log_z",
    "tb.vargrad_loss",
    "tb.flowrl_loss",
    "pg.group_advantages",
    "pg.kl_in_reward",
    "pg.grpo_loss",
    "pg.ppo_kl_loss",
    "pg.gspo_loss",
    "pg.cispo_loss",
    "pg.sapo_loss",
    "pg.luspo_loss",
    "pg.vespo_loss",
    "pg.off_policy_sequence_mask",
    "correction.kl_penalty",
    "lad.lad_loss",
)
"""The losses the online trainer calls refuse a NaN at a real position with a ValueError naming
the argument (``objectives._checks.no_nan_at``); the other entries propagate it."""
OPS = [
    dataclasses.replace(op, nan="raise") if op.name.split("[")[0].removesuffix(".clip_frac") in RAISE_ON_NAN else op
    for op in OPS
]

BY_NAME: dict[str, OpInfo] = {op.name: op for op in OPS}
assert len(BY_NAME) == len(OPS), "duplicate OpInfo names"
