"""One registry of objective adapters: objective name -> the loss call on a common batch.

Every trainer of the project builds an :class:`ObjectiveBatch` from its own data and calls
``OBJECTIVES[name](batch, **options)``; the adapter maps the batch's fields onto the arguments of
the loss function in this package and returns its :class:`~tiltlab.objectives.output.LossOutput`.
The simulator's trainer (``sim/train.py``), the TRL trainer (``llm/train/online/``), the offline
trainer (``llm/train/offline.py``) and the veRL plug-in (``llm/verl/``) all dispatch through it,
so they call each objective's loss the same way; what stays in a trainer is its framework's own
convention (the scale that turns a micro-batch loss into veRL's global-batch one, TRL's KL term on
GSPO / LAD, metric names).

The batch is token-level: ``[B, T]`` log-probs with a float ``mask``, ``[B]`` sequence quantities.
A sequence-level objective reduces the token log-probs itself (:func:`tb.sequence_logprob`, option
``logprob_scale``); a bandit (the simulator) passes ``T = 1`` with mask 1, where the reduction is
the identity. Fields an objective does not read are ignored; a field it needs and is missing is a
``ValueError`` naming it. Options are the loss function's own keyword arguments (``clip_eps``,
``beta``, ``loss_agg`` ...) plus the adapter's few (``level``, ``logprob_scale``, ``anchor``,
``weight_clip`` ...), documented on each entry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tiltlab.objectives import lad, offline, pg, tb
from tiltlab.objectives.catalog import SPECS, TB_OPTIONS, Spec, default_logprob_scale, names, renamed
from tiltlab.objectives.diagnostics import weight_clip_fraction
from tiltlab.objectives.output import LossOutput

__all__ = ["OBJECTIVES", "Objective", "ObjectiveBatch", "get_objective", "names", "registered"]


@dataclass(frozen=True)
class ObjectiveBatch:
    """The common input of every objective adapter.

    Attributes:
        token_logp: ``[B, T]`` log-probs of the sampled tokens under the trained policy (with grad).
        mask: ``[B, T]`` float, 1 on completion tokens.
        token_logp_old: ``[B, T]`` behaviour policy ``pi_old`` (ratios, TB rollout weight, PACED's anchor).
        token_logp_ref: ``[B, T]`` reference policy ``pi_ref`` (KL term, TB anchor, DPO's reference).
        token_logp_sampler: ``[B, T]`` the sampler's log-probs (the off-policy sequence mask).
        token_logp_future: ``[B, T]`` FPA's extrapolated policy (detached by the loss).
        advantages: ``[B]`` sequence advantages (policy-gradient family, LAD).
        rewards: ``[B]`` rewards (the TB family's transformed reward, Off-RL's ``R``; KTO's desirable rows
            are ``rewards > 0``); FlowRL also takes ``[P, G]``.
        log_z: ``[B]`` log partition per sequence (FlowRL also ``[P]``).
        is_weight: ``[B]`` or ``[B, T]`` importance weight (sampler mismatch, exact-expectation weights).
        lengths: ``[B]`` sequence lengths ``|y|`` (default: ``mask.sum(1)``).
        values: ``[B]`` A*-PO's estimated optimal value ``V*(x)`` of each row's prompt.
        rejected: the losers of a paired objective (DPO): this batch holds the winners.
    """

    token_logp: Tensor
    mask: Tensor
    token_logp_old: Tensor | None = None
    token_logp_ref: Tensor | None = None
    token_logp_sampler: Tensor | None = None
    token_logp_future: Tensor | None = None
    advantages: Tensor | None = None
    rewards: Tensor | None = None
    log_z: Tensor | None = None
    is_weight: Tensor | None = None
    lengths: Tensor | None = None
    values: Tensor | None = None
    rejected: ObjectiveBatch | None = None

    def get(self, name: str) -> Tensor:
        """The tensor field ``name``, or a ValueError naming it when it is missing."""
        x = getattr(self, name)
        if x is None:
            raise ValueError(f"this objective needs batch.{name}, got None")
        if not isinstance(x, Tensor):
            raise TypeError(f"batch.{name} is not a tensor")
        return x

    def seq(self, name: str = "token_logp", scale: str = "sum") -> Tensor:
        """``[B]`` sequence log-prob of the token field ``name``: masked sum or mean (``scale``)."""
        if scale == "sum":
            return tb.sequence_logprob(self.get(name), self.mask, normalize="sum")
        if scale == "mean":
            return tb.sequence_logprob(self.get(name), self.mask, normalize="mean")
        raise ValueError(f"logprob_scale must be 'sum' or 'mean', got {scale!r}")

    def seq_lengths(self) -> Tensor:
        """``[B]`` ``|y|``: ``lengths``, or the mask's row sums."""
        return self.lengths if self.lengths is not None else self.mask.sum(1)

    def pair(self) -> ObjectiveBatch:
        """The losers of a paired objective."""
        if self.rejected is None:
            raise ValueError("this paired objective needs batch.rejected (the losers), got None")
        return self.rejected


Adapter = Callable[[ObjectiveBatch, dict[str, Any]], LossOutput]
_WEIGHT_CLIP = next(o for o in TB_OPTIONS if o.name == "weight_clip")


def _tilt(o: dict[str, Any], default: float | None = None) -> float:
    """Pop the TB tilt ``tilt_beta`` from ``o`` (required without ``default``); ``beta`` is refused naming it."""
    if "beta" in o:
        raise TypeError("TB options: 'beta' is now 'tilt_beta' (the tilt multiplying the reward)")
    if "tilt_beta" not in o and default is None:
        raise TypeError("TB options: 'tilt_beta' (the tilt multiplying the reward) is required")
    return float(o.pop("tilt_beta", default))


@dataclass(frozen=True)
class Objective:
    """One registered objective: its declaration (:class:`~tiltlab.objectives.catalog.Spec`: name,
    loss, needs, family, trainers, tags, documentation, options) and its adapter
    ``(batch, options) -> LossOutput``."""

    spec: Spec
    adapter: Adapter

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def loss(self) -> str:
        return self.spec.loss

    @property
    def needs(self) -> tuple[str, ...]:
        return self.spec.needs

    @property
    def options(self) -> str:
        return self.spec.options

    @property
    def defaults(self) -> Mapping[str, Any]:
        return self.spec.defaults

    def __call__(self, batch: ObjectiveBatch, **options: Any) -> LossOutput:
        missing = [n for n in self.needs if getattr(batch, n) is None]
        if missing:
            raise ValueError(f"objective {self.name!r} needs batch fields {missing}, got None")
        out = self.adapter(batch, {**self.defaults, **options})
        if not isinstance(out, LossOutput):  # a loss function that broke the convention
            raise TypeError(f"objective {self.name!r} returned {type(out).__name__}, not LossOutput")
        return out


# ----------------------------------------------------------------------------- policy gradient
def _policy(fn: str, takes_ref: bool) -> Adapter:
    """``pg.<fn>(token_logp, token_logp_old, advantages, mask, **options)`` with the optional
    ``is_weight``, ``token_logp_sampler`` (and ``token_logp_ref`` where the loss has a KL term) from the batch."""

    def adapt(b: ObjectiveBatch, opts: dict[str, Any]) -> LossOutput:
        kw = dict(opts)
        if b.is_weight is not None:
            kw["is_weight"] = b.is_weight
        if b.token_logp_sampler is not None:
            kw["token_logp_sampler"] = b.token_logp_sampler
        if takes_ref and b.token_logp_ref is not None:
            kw["token_logp_ref"] = b.token_logp_ref
        out: LossOutput = getattr(pg, fn)(
            b.get("token_logp"), b.get("token_logp_old"), b.get("advantages"), b.mask, **kw
        )
        return out

    return adapt


# ------------------------------------------------------------------------------------------ LAD
def _lad(b: ObjectiveBatch, opts: dict[str, Any]) -> LossOutput:
    """LAD at ``level="sequence"`` (sequence log-probs by ``logprob_scale``, ``is_weight`` ``[B]`` the
    per-sample weight) or ``level="token"`` (per-token terms times ``is_weight``, reduced by
    :func:`pg.aggregate` with ``loss_agg`` / ``max_len`` / ``num_tokens``)."""
    o = dict(opts)
    level, eta, div = o.pop("level", "sequence"), o.pop("eta"), o.pop("divergence")
    adv = b.get("advantages")
    if level == "sequence":
        scale = o.pop("logprob_scale", "mean")
        if o:
            raise TypeError(f"unknown LAD options {sorted(o)}")
        lp, lo = b.seq("token_logp", scale), b.seq("token_logp_old", scale)
        return lad.lad_loss(lp, lo, adv, eta=eta, divergence=div, is_weight=b.is_weight)
    if level != "token":
        raise ValueError(f"LAD level must be 'sequence' or 'token', got {level!r}")
    lp = b.get("token_logp")
    per = lad.lad_loss(
        lp, b.get("token_logp_old"), adv[:, None].expand_as(lp), eta=eta, divergence=div, loss_agg="none"
    ).loss
    if b.is_weight is not None:
        w = b.is_weight.detach()
        per = per * (w[:, None] if w.dim() == 1 else w)
    agg = o.pop("loss_agg", "seq_mean_token_mean")
    return LossOutput(pg.aggregate(per, b.mask, loss_agg=agg, **o))


# ---------------------------------------------------------------------------- trajectory balance
@dataclass
class _TB:
    """The TB family's inputs at ``logprob_scale`` (``sum``, the default, | ``mean``), anchored on
    ``anchor`` (``ref`` | ``old``), and its weights: with ``weight_clip`` ``max`` | ``eps`` | ``ratio``
    the rollout weight of :func:`tb.tb_importance_weight` on ``pi_old`` (at ``max_weight``,
    ``weight_eps``, ``weight_eps_high``) times ``is_weight``; with ``weight_clip="one"`` (the default)
    only ``is_weight`` (a trainer that weighs its samples itself). The option names are
    :data:`~tiltlab.objectives.catalog.TB_OPTIONS`'; the old ones are refused naming the new."""

    lp: Tensor
    anchor: Tensor
    reward: Tensor
    w_tb: Tensor | None
    w: Tensor | None
    clip: tuple[str, float, float, float | None] | None

    @classmethod
    def of(cls, b: ObjectiveBatch, o: dict[str, Any]) -> _TB:
        renamed(o, "TB options")
        scale, anchor = o.pop("logprob_scale", None) or "sum", o.pop("anchor", "ref")
        if anchor not in ("ref", "old"):
            raise ValueError(f"anchor must be 'ref' or 'old', got {anchor!r}")
        clip = o.pop("weight_clip", "one")
        max_weight, eps, eps_high = o.pop("max_weight", 10.0), o.pop("weight_eps", 0.2), o.pop("weight_eps_high", None)
        if o:
            raise TypeError(f"unknown options {sorted(o)}")
        _WEIGHT_CLIP.check(clip)
        lp = b.seq("token_logp", scale)
        an = b.seq("token_logp_ref" if anchor == "ref" else "token_logp_old", scale)
        if clip == "one":
            return cls(lp, an, b.get("rewards"), None, b.is_weight, None)
        w_tb = tb.tb_importance_weight(
            b.get("token_logp"),
            b.get("token_logp_old"),
            b.mask,
            weight_clip=clip,
            max_weight=max_weight,
            eps=eps,
            eps_high=eps_high,
        )
        w = w_tb if b.is_weight is None else w_tb * b.is_weight
        return cls(lp, an, b.get("rewards"), w_tb, w, (clip, max_weight, eps, eps_high))

    def output(self, loss: LossOutput, residual: Tensor) -> LossOutput:
        """``loss`` with the metrics ``residual_abs_mean``, ``residuals`` (the per-sequence residual, detached,
        ``[B]``: what a trainer's diagnostics read), ``weight_mean`` and ``weight_clip_frac`` (of the rollout
        weight at its own clip, before ``is_weight``) where they exist."""
        with torch.no_grad():
            m: dict[str, Tensor | float] = {
                **loss.metrics,
                "residual_abs_mean": residual.detach().abs().mean(),
                "residuals": residual.detach().reshape(-1),
            }
            if self.w is not None:
                m["weight_mean"] = self.w.detach().mean()
            if self.w_tb is not None and self.clip is not None:
                clip, max_weight, eps, eps_high = self.clip
                m["weight_clip_frac"] = weight_clip_fraction(
                    self.w_tb.detach(), weight_clip=clip, max_weight=max_weight, eps=eps, eps_high=eps_high
                )
        return LossOutput(loss.loss, m)


def _disa(b: ObjectiveBatch, opts: dict[str, Any]) -> LossOutput:
    """DISA: :func:`tb.disa_loss` (log Z, anchor and reward detached)."""
    o = dict(opts)
    beta = _tilt(o)
    t, log_z = _TB.of(b, o), b.get("log_z")
    out = tb.disa_loss(t.lp, t.anchor, t.reward, log_z, beta=beta, is_weight=t.w)
    residual = tb.tb_residual(t.lp.detach(), t.anchor, t.reward, log_z.detach(), beta=beta)  # for the metrics
    return t.output(out, residual)


def _tb_given_log_z(b: ObjectiveBatch, o: dict[str, Any], beta: float, log_z: Tensor) -> LossOutput:
    t = _TB.of(b, o)
    residual = tb.tb_residual(t.lp, t.anchor, t.reward, log_z, beta=beta)
    return t.output(tb.tb_loss(residual, is_weight=t.w), residual)


def _tb(b: ObjectiveBatch, opts: dict[str, Any]) -> LossOutput:
    """TB with the batch's log Z attached (a learned log Z receives gradient)."""
    o = dict(opts)
    beta = _tilt(o)
    return _tb_given_log_z(b, o, beta, b.get("log_z"))


def _paced(b: ObjectiveBatch, opts: dict[str, Any]) -> LossOutput:
    """PACED-RL: TB anchored on ``pi_old`` with the tilt ``r / kl_coef`` and the learned log Z."""
    o = dict(opts)
    beta = 1.0 / o.pop("kl_coef")
    return _tb_given_log_z(b, {"anchor": "old", **o}, beta, b.get("log_z"))


def _vargrad(b: ObjectiveBatch, opts: dict[str, Any]) -> LossOutput:
    """VarGrad: TB at the per-group batch-optimal log Z, detached: ``batch.log_z`` (computed elsewhere,
    e.g. at generation time), or :func:`tb.vargrad_log_z` of this batch's groups of ``group_size``."""
    o = dict(opts)
    beta, g = _tilt(o), o.pop("group_size", None)
    log_z = b.log_z
    if log_z is None:
        if g is None:
            raise ValueError("vargrad without batch.log_z needs the group_size option")
        t = _TB.of(b, {k: v for k, v in o.items() if k in ("logprob_scale", "anchor")})
        est = tb.vargrad_log_z(t.lp.view(-1, g), t.anchor.view(-1, g), t.reward.view(-1, g), beta=beta, detach=True)
        log_z = est.repeat_interleave(g)
    return _tb_given_log_z(b, o, beta, log_z.detach())


def _flowrl(b: ObjectiveBatch, opts: dict[str, Any]) -> LossOutput:
    """FlowRL: :func:`tb.flowrl_loss` with the TB family's option names (``tilt_beta``, ``logprob_scale``
    (default ``mean``, FlowRL's code), ``weight_clip`` (default ``max``), ``max_weight``, ``weight_eps``,
    ``weight_eps_high``) plus its own ``group_size`` and ``group_normalize``."""
    o = dict(opts)
    renamed(o, "flowrl options")
    scale = o.pop("logprob_scale", None) or default_logprob_scale("flowrl")
    if scale not in ("sum", "mean"):
        raise ValueError(f"logprob_scale must be 'sum' or 'mean', got {scale!r}")
    clip = o.pop("weight_clip", "max")
    if clip == "one":
        raise ValueError("flowrl: weight_clip='one' (no rollout weight) is not FlowRL's loss; use max | eps | ratio")
    _WEIGHT_CLIP.check(clip)
    kw = {
        "beta": _tilt(o, 15.0), "length_normalize": scale == "mean", "weight_clip": clip,
        "max_weight": o.pop("max_weight", 10.0), "eps": o.pop("weight_eps", 0.2), "eps_high": o.pop("weight_eps_high", None),
    }  # fmt: skip
    return tb.flowrl_loss(
        b.get("token_logp"),
        b.get("token_logp_ref"),
        b.get("token_logp_old"),
        b.mask,
        b.get("rewards"),
        b.get("log_z"),
        is_weight=b.is_weight,
        **kw,
        **o,
    )


# ------------------------------------------------------------------------------------- offline
def _offrl(b: ObjectiveBatch, opts: dict[str, Any]) -> LossOutput:
    ref = b.seq("token_logp_ref") if b.token_logp_ref is not None else None
    return offline.offrl_loss(b.seq(), b.seq_lengths(), b.get("rewards"), logp_ref=ref, **opts)


def _fpa(b: ObjectiveBatch, opts: dict[str, Any]) -> LossOutput:
    return offline.fpa_loss(b.seq(), b.seq("token_logp_future"), b.seq_lengths(), b.get("rewards"), **opts)


def _dpo(b: ObjectiveBatch, opts: dict[str, Any]) -> LossOutput:
    lo = b.pair()
    return offline.dpo_loss(b.seq(), lo.seq(), b.seq("token_logp_ref"), lo.seq("token_logp_ref"), **opts)


def _rpo(b: ObjectiveBatch, opts: dict[str, Any]) -> LossOutput:
    lo = b.pair()
    return offline.rpo_loss(
        b.seq(), lo.seq(), b.seq("token_logp_ref"), lo.seq("token_logp_ref"), b.seq_lengths(), **opts
    )


def _simper(b: ObjectiveBatch, opts: dict[str, Any]) -> LossOutput:
    lo = b.pair()
    return offline.simper_loss(b.seq(), lo.seq(), b.seq_lengths(), lo.seq_lengths(), **opts)


def _kto(b: ObjectiveBatch, opts: dict[str, Any]) -> LossOutput:
    return offline.kto_loss(b.seq(), b.seq("token_logp_ref"), b.get("rewards") > 0, **opts)


def _apo(b: ObjectiveBatch, opts: dict[str, Any]) -> LossOutput:
    return offline.apo_loss(b.seq(), b.seq("token_logp_ref"), b.get("rewards"), b.get("values"), **opts)


def _sft(b: ObjectiveBatch, opts: dict[str, Any]) -> LossOutput:
    return offline.sft_loss(b.get("token_logp"), b.mask, **opts)


_ADAPTERS: dict[str, Adapter] = {
    **{n: _policy(f"{n}_loss", n != "gspo") for n in ("grpo", "gspo", "cispo", "sapo", "luspo", "vespo")},
    "flowrl": _flowrl,
    "disa": _disa,
    "vargrad": _vargrad,
    "lad": _lad,
    "paced": _paced,
    "tb": _tb,
    "offrl": _offrl,
    "fpa": _fpa,
    "dpo": _dpo,
    "rpo": _rpo,
    "kto": _kto,
    "simper": _simper,
    "apo": _apo,
    "sft": _sft,
}
"""Objective name -> adapter: the loss call of each :data:`~tiltlab.objectives.catalog.SPECS` entry."""
if set(_ADAPTERS) != set(SPECS):  # pragma: no cover - a module-level consistency check
    raise ImportError(f"adapters {sorted(_ADAPTERS)} and declarations {sorted(SPECS)} differ")

OBJECTIVES: dict[str, Objective] = {n: Objective(s, _ADAPTERS[n]) for n, s in SPECS.items()}
"""Objective name -> :class:`Objective`, in the declared order. A new objective is its loss function
(with an OpInfo entry in ``tests/objectives/opinfo.py``), its declaration in
:data:`~tiltlab.objectives.catalog.SPECS` and its adapter in :data:`_ADAPTERS`; every trainer's
names, choices and config schema derive from the declarations
(:func:`~tiltlab.objectives.catalog.names`)."""


@contextmanager
def registered(spec: Spec, adapter: Adapter) -> Iterator[Objective]:
    """Declare ``spec`` and register it with ``adapter`` for the block (a plug-in's or a test's own
    objective): it is in :func:`~tiltlab.objectives.catalog.names` and so in every trainer's choices
    while the block runs, and removed afterwards; a name already declared is refused."""
    if spec.name in SPECS or spec.name in OBJECTIVES:
        raise ValueError(f"objective {spec.name!r} is already registered")
    SPECS[spec.name], OBJECTIVES[spec.name] = spec, Objective(spec, adapter)
    try:
        yield OBJECTIVES[spec.name]
    finally:
        SPECS.pop(spec.name, None)
        OBJECTIVES.pop(spec.name, None)


def get_objective(name: str) -> Objective:
    try:
        return OBJECTIVES[name]
    except KeyError:
        raise ValueError(f"unknown objective {name!r}; registered: {sorted(OBJECTIVES)}") from None
