"""Stage-1 proposals for the exact simulator: pi_ref, tilted proposals, truncated samplers.

All functions work on log-probability tensors over an enumerable last axis ``[..., K]``
(a bandit's arms, or one token position's vocabulary) in float64, and return
normalized log-probabilities of the same shape (``-inf`` outside the support).

Sources:
- DISA eqs. (7)-(8): the proposal ``q`` of Stage 1 and the
  absolute-continuity condition of App. C.1 (``q > 0`` wherever ``pi_ref exp(beta r) > 0``).
- ``docs/math.md`` §1: "tilted proposals of adjustable strength"
  ``q_alpha ∝ pi_ref^{1-alpha} pi*^{alpha}`` (alpha = 0: pi_ref, alpha = 1: pi*), and the
  **open** question of truncated (top-k / top-p) samplers that violate absolute continuity.
"""

from __future__ import annotations

import torch

__all__ = [
    "normalize",
    "ref_proposal",
    "sample",
    "support_mass",
    "temperature_proposal",
    "tilted_proposal",
    "top_k_proposal",
    "top_p_proposal",
]


def _check_logp(logp: torch.Tensor, name: str = "logp") -> None:
    if not isinstance(logp, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(logp).__name__}")
    if logp.dim() < 1 or logp.shape[-1] < 1:
        raise ValueError(f"{name} must have a non-empty last axis [..., K], got shape {tuple(logp.shape)}")
    if not torch.is_floating_point(logp):
        raise ValueError(f"{name} must be floating point, got {logp.dtype}")


def normalize(logits: torch.Tensor) -> torch.Tensor:
    """Normalized log-probabilities ``log_softmax(logits, -1)``; ``-inf`` entries stay ``-inf``. ``[..., K]``."""
    _check_logp(logits, "logits")
    return torch.log_softmax(logits, dim=-1)


def ref_proposal(logp_ref: torch.Tensor) -> torch.Tensor:
    """``q = pi_ref`` (the proposal DISA uses for its delta-method analysis and A*-PO uses offline). ``[..., K]``."""
    return normalize(logp_ref)


def tilted_proposal(logp_ref: torch.Tensor, logp_target: torch.Tensor, alpha: float) -> torch.Tensor:
    """Tilted proposal ``q_alpha ∝ pi_ref^{1-alpha} · pi*^{alpha}`` (``docs/math.md`` §1), renormalized.

    ``alpha = 0`` gives ``pi_ref``; ``alpha = 1`` gives ``pi*`` (the zero-variance proposal:
    every IS weight equals Z). Values in ``[0, 1]`` interpolate geometrically; both inputs are
    log-probabilities ``[..., K]`` with the same shape.
    """
    _check_logp(logp_ref, "logp_ref")
    _check_logp(logp_target, "logp_target")
    if logp_ref.shape != logp_target.shape:
        raise ValueError(f"shape mismatch: logp_ref {tuple(logp_ref.shape)} vs logp_target {tuple(logp_target.shape)}")
    if not (0.0 <= float(alpha) <= 1.0):
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    a = float(alpha)
    # avoid 0 * (-inf) = nan when an input has -inf entries
    t1 = torch.where(torch.isinf(logp_ref) & (a == 1.0), torch.zeros_like(logp_ref), (1.0 - a) * logp_ref)
    t2 = torch.where(torch.isinf(logp_target) & (a == 0.0), torch.zeros_like(logp_target), a * logp_target)
    return normalize(t1 + t2)


def temperature_proposal(logp: torch.Tensor, temperature: float) -> torch.Tensor:
    """Temperature-scaled sampler ``q ∝ p^{1/T}`` (T > 1 flattens; LAD Fig. 1 samples pi_old at T = 1.5). ``[..., K]``."""
    _check_logp(logp)
    if not float(temperature) > 0.0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return normalize(logp / float(temperature))


def top_k_proposal(logp: torch.Tensor, k: int) -> torch.Tensor:
    """Top-k truncation of ``p``, renormalized: ``q = p·1[rank(y) < k] / mass``. ``[..., K]``.

    For ``k < K`` the support is smaller than ``p``'s, violating DISA's absolute continuity
    (App. C.1); ties at the k-th value are broken by index (``torch.topk``).
    """
    _check_logp(logp)
    K = logp.shape[-1]
    if not (1 <= int(k) <= K):
        raise ValueError(f"k must satisfy 1 <= k <= K={K}, got {k}")
    idx = torch.topk(logp, int(k), dim=-1).indices
    keep = torch.zeros_like(logp, dtype=torch.bool).scatter_(-1, idx, True)
    return normalize(logp.masked_fill(~keep, float("-inf")))


def top_p_proposal(logp: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus (top-p) truncation, renormalized. ``[..., K]``.

    Keeps the smallest set of highest-probability outcomes whose mass reaches ``top_p``
    (the outcome that crosses the threshold is kept, as in HF/vLLM samplers).
    ``top_p = 1`` returns ``p`` unchanged.
    """
    _check_logp(logp)
    if not (0.0 < float(top_p) <= 1.0):
        raise ValueError(f"top_p must lie in (0, 1], got {top_p}")
    if float(top_p) == 1.0:
        return normalize(logp)
    p = normalize(logp).exp()
    sp, order = torch.sort(p, dim=-1, descending=True)
    cum = sp.cumsum(-1)
    keep_sorted = (cum - sp) < float(top_p)  # mass strictly before this outcome is below top_p
    keep = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)
    return normalize(logp.masked_fill(~keep, float("-inf")))


def support_mass(logq: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """Mass of ``p`` on the support of ``q``: ``sum_y p(y) 1[q(y) > 0]``. ``[...]``.

    With ``p = pi*`` this is the factor by which a truncated proposal's IS estimate of Z is
    low in expectation: ``E_q[Ẑ] = Z · pi*(supp q)``.
    """
    _check_logp(logq, "logq")
    _check_logp(logp, "logp")
    return torch.where(torch.isfinite(logq), normalize(logp).exp(), torch.zeros_like(logp)).sum(-1)


def sample(logq: torch.Tensor, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw ``n`` i.i.d. indices from each distribution of ``logq [..., K]``; returns ``[..., n]`` (int64)."""
    _check_logp(logq, "logq")
    if int(n) < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    lead = logq.shape[:-1]
    probs = normalize(logq).exp().reshape(-1, logq.shape[-1])
    idx = torch.multinomial(probs, int(n), replacement=True, generator=generator)
    return idx.reshape(*lead, int(n))
