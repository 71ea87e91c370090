"""Enumerable environments: K-armed bandits and a multi-prompt binary-reward environment.

An environment is ``P`` prompts, each with ``K`` complete outputs ("arms"), a reference policy
``logp_ref [P, K]``, a reward ``reward [P, K]`` and prompt features ``features [P, D]``, all float64.
Because ``K`` is small, every expectation is an exact sum; sampling exists next to it so that
Monte-Carlo estimators can be checked against the exact value.

Exact quantities (DISA eq. (4); ``docs/math.md`` §1):

    Z(x)   = sum_y pi_ref(y|x) exp(beta r(x, y))           (log_z)
    pi*(y|x) = pi_ref(y|x) exp(beta r(x, y)) / Z(x)         (target_logp)

and for binary rewards ``Z(x) = 1 + p_ref(x) (e^beta - 1)`` with ``p_ref = E_{pi_ref}[r]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from tiltlab.sim import proposals

__all__ = ["BanditEnv", "gather", "make_bandit", "make_lad_bandit", "make_multiprompt", "make_two_outcome"]

DTYPE = torch.float64


def gather(values: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Pick ``values[..., p, idx[..., p, g]]``: values ``[..., P, K]`` (broadcast over leading dims), idx ``[..., P, G]`` -> ``[..., P, G]``."""
    if values.dim() < idx.dim() or values.shape[:-1] != idx.shape[:-1]:
        values = values.expand(*idx.shape[:-1], values.shape[-1])
    return torch.gather(values, -1, idx)


@dataclass
class BanditEnv:
    """A set of ``P`` one-step prompts with ``K`` enumerable outputs each.

    Attributes:
        logp_ref: reference log-policy ``log pi_ref(y|x)``, ``[P, K]`` float64 (rows normalized).
        reward: reward ``r(x, y)``, ``[P, K]`` float64 (binary for verifier envs; real for the LAD bandit).
        features: prompt features ``[P, D]`` for Stage-2 regressors (DISA eq. (9)).
        name: a short label.
        binary: True when ``reward`` is in {0, 1}.
        info: free-form metadata (e.g. the pass rates the env was built for).
    """

    logp_ref: torch.Tensor
    reward: torch.Tensor
    features: torch.Tensor
    name: str = "bandit"
    binary: bool = False
    info: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.logp_ref.dim() != 2:
            raise ValueError(f"logp_ref must be [P, K], got shape {tuple(self.logp_ref.shape)}")
        if self.reward.shape != self.logp_ref.shape:
            raise ValueError(f"reward shape {tuple(self.reward.shape)} != logp_ref shape {tuple(self.logp_ref.shape)}")
        if self.features.dim() != 2 or self.features.shape[0] != self.logp_ref.shape[0]:
            raise ValueError(
                f"features must be [P, D] with P={self.logp_ref.shape[0]}, got {tuple(self.features.shape)}"
            )
        self.logp_ref = torch.log_softmax(self.logp_ref.to(DTYPE), -1)
        self.reward = self.reward.to(DTYPE)
        self.features = self.features.to(DTYPE)

    # -- sizes ---------------------------------------------------------------------------------
    @property
    def P(self) -> int:
        return self.logp_ref.shape[0]

    @property
    def K(self) -> int:
        return self.logp_ref.shape[1]

    # -- exact quantities ----------------------------------------------------------------------
    def log_z(self, beta: float, logp_ref: torch.Tensor | None = None) -> torch.Tensor:
        """Exact ``log Z(x) = LSE_y(log pi_ref + beta r)``, ``[P]`` (or ``[..., P]`` for a given ``logp_ref``)."""
        lr = self.logp_ref if logp_ref is None else logp_ref
        return torch.logsumexp(lr + float(beta) * self.reward, dim=-1)

    def target_logp(self, beta: float, logp_ref: torch.Tensor | None = None) -> torch.Tensor:
        """Exact ``log pi*(y|x) = log pi_ref + beta r - log Z``, ``[P, K]`` (DISA eq. (4))."""
        lr = self.logp_ref if logp_ref is None else logp_ref
        return torch.log_softmax(lr + float(beta) * self.reward, dim=-1)

    def pass_rate(self, logp: torch.Tensor | None = None) -> torch.Tensor:
        """Exact ``E_pi[r]`` per prompt, ``[..., P]``; ``logp`` defaults to ``pi_ref``."""
        lp = self.logp_ref if logp is None else logp
        return (lp.exp() * self.reward).sum(-1)

    def expectation(self, logp: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """Exact ``E_{y~pi}[values(y)]`` over the last axis: logp ``[..., P, K]``, values broadcastable -> ``[..., P]``."""
        return (logp.exp() * values).sum(-1)

    # -- sampling ------------------------------------------------------------------------------
    def sample(self, logp: torch.Tensor, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``n`` outputs per prompt from ``pi`` (``logp [..., P, K]``) -> indices ``[..., P, n]``."""
        if logp.shape[-1] != self.K:
            raise ValueError(f"logp last axis must be K={self.K}, got {tuple(logp.shape)}")
        return proposals.sample(logp, n, generator)

    def rewards_of(self, idx: torch.Tensor) -> torch.Tensor:
        """Rewards of sampled outputs: idx ``[..., P, G]`` -> ``[..., P, G]``."""
        return gather(self.reward, idx)

    def ref_logp_of(self, idx: torch.Tensor) -> torch.Tensor:
        """``log pi_ref`` of sampled outputs: idx ``[..., P, G]`` -> ``[..., P, G]``."""
        return gather(self.logp_ref, idx)

    def subset(self, prompts: torch.Tensor | list[int]) -> BanditEnv:
        """The environment restricted to some prompts."""
        ix = torch.as_tensor(prompts, dtype=torch.long)
        return BanditEnv(self.logp_ref[ix], self.reward[ix], self.features[ix], self.name, self.binary, dict(self.info))


# ----------------------------------------------------------------------------------------------
# factories
# ----------------------------------------------------------------------------------------------


def _gen(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(int(seed))
    return g


def make_bandit(K: int = 10, seed: int = 0, ref_scale: float = 1.0, reward: str = "gaussian") -> BanditEnv:
    """A single-prompt K-armed bandit with random reference logits ``N(0, ref_scale^2)``.

    ``reward``: ``"gaussian"`` (``r ~ N(0, 1)``), ``"binary"`` (about a third of the arms correct,
    at least one) or ``"linear"`` (``r = k / (K-1)``).
    """
    if K < 2:
        raise ValueError(f"K must be >= 2, got {K}")
    g = _gen(seed)
    logits = ref_scale * torch.randn(1, K, generator=g, dtype=DTYPE)
    if reward == "gaussian":
        r = torch.randn(1, K, generator=g, dtype=DTYPE)
        binary = False
    elif reward == "binary":
        r = (torch.rand(1, K, generator=g, dtype=DTYPE) < 1 / 3).to(DTYPE)
        r[0, int(torch.randint(K, (1,), generator=g))] = 1.0
        binary = True
    elif reward == "linear":
        r = torch.linspace(0, 1, K, dtype=DTYPE)[None]
        binary = False
    else:
        raise ValueError(f"unknown reward kind {reward!r} (gaussian|binary|linear)")
    return BanditEnv(logits, r, torch.zeros(1, 1, dtype=DTYPE), name=f"bandit{K}-{reward}", binary=binary)


def make_two_outcome(p1: float = 0.5, r: tuple[float, float] = (1.0, 0.0)) -> BanditEnv:
    """``Y = {y1, y2}``, ``pi_ref = (p1, 1-p1)``, rewards ``r`` (DISA App. C.5's counterexample uses (½, ½), (1, 0))."""
    if not 0.0 < p1 < 1.0:
        raise ValueError(f"p1 must lie in (0, 1), got {p1}")
    lp = torch.tensor([[math.log(p1), math.log(1 - p1)]], dtype=DTYPE)
    return BanditEnv(lp, torch.tensor([list(r)], dtype=DTYPE), torch.zeros(1, 1, dtype=DTYPE), name="two-outcome")


def lad_mixture(
    K: int = 50, centers=(0.18, 0.5, 0.82), widths=(0.05, 0.06, 0.05), weights=(0.3, 0.45, 0.25), floor: float = 2e-3
) -> torch.Tensor:
    """The three-mode target of LAD Fig. 1: a mixture of three Gaussians over arm positions, ``[K]`` (sums to 1).

    Centers and widths are fractions of the arm range; ``floor`` mixes in a small uniform mass so
    that ``log`` of the mixture (the advantage) stays finite. The paper gives no numbers for the
    mixture (LAD §4.1); these are ours.
    """
    x = torch.linspace(0, 1, K, dtype=DTYPE)
    dens = sum(w * torch.exp(-0.5 * ((x - c) / s) ** 2) / s for c, s, w in zip(centers, widths, weights))
    dens = dens / dens.sum()
    dens = (1 - floor) * dens + floor / K
    return dens / dens.sum()


def make_lad_bandit(K: int = 50, eta: float = 1.0, **mixture_kw) -> BanditEnv:
    """LAD Fig. 1 (LAD §4.1): 50 arms, uniform initial policy, advantage a three-mode mixture.

    The advantage is ``A(y) = eta · (log m(y) - mean_y log m(y))`` for the mixture ``m`` of
    :func:`lad_mixture`, so the advantage distribution ``P_A = e^{A/eta} / Z_A`` equals ``m``
    exactly. ``reward`` holds A; ``logp_ref`` is uniform (the initial policy and ``pi_old``).
    """
    m = lad_mixture(K, **mixture_kw)
    lm = m.log()
    adv = float(eta) * (lm - lm.mean())
    env = BanditEnv(torch.zeros(1, K, dtype=DTYPE), adv[None], torch.zeros(1, 1, dtype=DTYPE), name=f"lad-bandit{K}")
    env.info.update({"eta": float(eta), "P_A": m.tolist()})
    return env


def make_multiprompt(
    P: int = 64,
    K: int = 16,
    seed: int = 0,
    p_min: float = 0.01,
    p_max: float = 0.9,
    feature_dim: int = 8,
    feature_noise: float = 0.1,
    ref_scale: float = 1.0,
) -> BanditEnv:
    """Multi-prompt binary-reward environment with pass rates spread from ``p_min`` (hard) to ``p_max`` (easy).

    Per prompt: ``K`` outputs with random reference logits ``N(0, ref_scale^2)``, a random non-empty
    proper subset of them correct, and the correct logits shifted so that the reference pass
    rate ``p_ref(x) = E_{pi_ref}[r]`` equals a target spaced evenly in logit between ``p_min`` and
    ``p_max`` (then shuffled). Features ``[P, D]``: a random linear embedding of
    ``(logit p_ref, 1)`` plus ``N(0, feature_noise^2)`` noise, so a regressor can learn log Z from
    them (DISA Stage 2) but not perfectly.
    """
    if not (0.0 < p_min < p_max < 1.0):
        raise ValueError(f"need 0 < p_min < p_max < 1, got {p_min}, {p_max}")
    if K < 2 or P < 1:
        raise ValueError(f"need K >= 2 and P >= 1, got K={K}, P={P}")
    g = _gen(seed)
    lo, hi = math.log(p_min / (1 - p_min)), math.log(p_max / (1 - p_max))
    logit_p = torch.linspace(lo, hi, P, dtype=DTYPE) if P > 1 else torch.tensor([0.5 * (lo + hi)], dtype=DTYPE)
    logit_p = logit_p[torch.randperm(P, generator=g)]
    p = torch.sigmoid(logit_p)
    logits = ref_scale * torch.randn(P, K, generator=g, dtype=DTYPE)
    n_correct = torch.randint(1, max(2, K // 2 + 1), (P,), generator=g)
    perm = torch.argsort(torch.rand(P, K, generator=g), dim=-1)
    correct = perm < n_correct[:, None]
    r = correct.to(DTYPE)
    # shift correct logits by s so that sum_correct pi = p
    lc = torch.logsumexp(logits.masked_fill(~correct, float("-inf")), -1)
    lw = torch.logsumexp(logits.masked_fill(correct, float("-inf")), -1)
    shift = logit_p + lw - lc
    logits = logits + shift[:, None] * r
    W = torch.randn(2, feature_dim, generator=g, dtype=DTYPE)
    feats = torch.stack([logit_p, torch.ones_like(logit_p)], -1) @ W
    feats = feats + feature_noise * torch.randn(P, feature_dim, generator=g, dtype=DTYPE)
    env = BanditEnv(logits, r, feats, name=f"multiprompt{P}x{K}", binary=True)
    env.info["p_ref_target"] = p.tolist()
    return env
