"""DISA's bias propositions in closed form: App. C.5's two-outcome counterexample, the local and global
thresholds of the biased on-policy TB loss (results beyond the paper, ``docs/math.md`` §1), and the
Prop. 4 envelope (DISA App. C.4).

Residuals come from ``objectives.tb.tb_residual``; exact enumerations from :mod:`tiltlab.sim.exact`.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from tiltlab.objectives.tb import tb_residual
from tiltlab.sim.exact import log_partition, target_logprobs
from tiltlab.sim.experiments import cached

F64 = torch.float64
#: The biases b of ``disa.beyond.local_threshold`` (either side of the threshold b = -1).
LOCAL_BS = (-1.3, -1.05, -1.01, -0.99, -0.95, -0.5, 0.0, 0.4)
#: A policy "beats" pi* when the numeric minimum of L is below L(pi*) = b^2 by more than this (float64 Adam on
#: O(1) losses): ``disa.beyond.global_threshold``'s tolerance for a gain over b^2 above the threshold.
BEATS_TOL = 1e-9


def two_outcome_loss(p: torch.Tensor, b: float, beta: float = 1.0) -> torch.Tensor:
    """On-policy biased TB loss ``L(p) = E_pi[delta^2]`` for DISA App. C.5's example:
    ``Y = {y1, y2}``, ``pi_ref = (1/2, 1/2)``, ``r = (1, 0)``, ``pi = (p, 1 - p)``, ``log Z_psi = log Z + b``.
    ``p [N] -> [N]`` (0 log^2 0 = 0 at the end points)."""
    logp_ref = torch.full((2,), math.log(0.5), dtype=F64)
    reward = torch.tensor([1.0, 0.0], dtype=F64)
    log_z = log_partition(logp_ref, beta * reward) + b
    pi = torch.stack([p, 1 - p], -1)  # [N, 2]
    safe = torch.where(pi > 0, pi, torch.ones_like(pi)).log()
    d = tb_residual(safe, logp_ref.expand_as(safe), reward.expand_as(safe), log_z, beta=beta)
    return torch.where(pi > 0, pi * d * d, torch.zeros_like(pi)).sum(-1)


@cached
def counterexample() -> dict:
    """``disa.c5.counterexample``: DISA App. C.5's two-outcome example at b = -0.5 on a 100001-point grid of p."""
    b = -0.5
    p = torch.linspace(0, 1, 100001, dtype=F64)
    loss = two_outcome_loss(p, b)
    p_star = math.e / (math.e + 1)
    l_star = float(two_outcome_loss(torch.tensor([p_star], dtype=F64), b))
    l_one = float(loss[-1])
    p_min = float(p[loss.argmin()])
    return {
        "Z": (math.e + 1) / 2,
        "pi_star_y1": p_star,
        "L_pi_star": l_star,
        "L_vertex": l_one,
        "argmin_p": p_min,
        "min_L": float(loss.min()),
    }


def biased_loss(logits: torch.Tensor, log_star: torch.Tensor, b) -> torch.Tensor:
    """``L = E_pi[(b + log pi/pi*)^2]`` via :func:`objectives.tb.tb_residual` with pi_ref = pi*, r = 0,
    log Z = b (so delta = b + log pi - log pi*). ``logits [..., K]`` may hold -inf (a face of the
    simplex; 0 log^2 0 = 0). ``b`` broadcasts against ``[...]``."""
    lp = torch.log_softmax(logits, -1)
    pi = lp.exp()
    live = pi > 0
    safe = torch.where(live, lp, torch.zeros_like(lp))
    b = torch.as_tensor(b, dtype=lp.dtype)
    d = tb_residual(safe, log_star.expand_as(safe), torch.zeros_like(safe), b.unsqueeze(-1).expand_as(safe), beta=0.0)
    return torch.where(live, pi * d * d, torch.zeros_like(pi)).sum(-1)


@cached
def local_threshold(seed: int) -> dict:
    """Autograd Hessian of L in the logits at pi* vs 2(1+b)(diag pi* - pi* pi*^T); tangent-space eigenvalue sign vs b."""
    g = torch.Generator().manual_seed(seed)
    k = 5
    log_star = torch.log_softmax(torch.randn(k, generator=g, dtype=F64), -1)
    ps = log_star.exp()
    fisher = torch.diag(ps) - torch.outer(ps, ps)
    # tangent basis: orthonormal complement of the all-ones direction (softmax shift invariance)
    basis = torch.linalg.qr(torch.cat([torch.ones(k, 1, dtype=F64), torch.eye(k, dtype=F64)[:, : k - 1]], 1))[0][:, 1:]
    bs = LOCAL_BS
    errs, mins = [], []
    for b in bs:
        hess = torch.autograd.functional.hessian(lambda u: biased_loss(u, log_star, b), log_star.clone())
        errs.append(float((hess - 2 * (1 + b) * fisher).abs().max()))
        mins.append(float(torch.linalg.eigvalsh(basis.T @ hess @ basis).min()))
    return {"max_hessian_err": max(errs), **{f"min_eig_b{b}": m for b, m in zip(bs, mins)}}


def simplex_min(
    log_star: torch.Tensor, b: torch.Tensor, starts: int = 4, steps: int = 250, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Numeric global minimum of ``L`` over the simplex: multistart Adam on every face.

    ``log_star [n, K]`` (K <= 5), ``b [n, nb]``. Every nonempty support subset is searched
    (logits -inf off the support) from ``starts`` random inits plus pi* restricted to the face.
    Returns ``[n, nb]`` the smallest loss found.
    """
    n, k = log_star.shape
    nb = b.shape[1]
    subsets = torch.tensor([[(s >> i) & 1 for i in range(k)] for s in range(1, 2**k)], dtype=torch.bool)  # [S, K]
    S = subsets.shape[0]
    init = torch.randn(n, nb, S, starts, k, generator=generator, dtype=F64) * 2
    init[..., 0, :] = log_star[:, None, None, :]
    mask = subsets[None, None, :, None, :].expand(n, nb, S, starts + 0, k)
    ls = log_star[:, None, None, None, :]
    bb = b[:, :, None, None]
    # A one-outcome face is a vertex: pi is the same whatever the logits, so L is evaluated there, not
    # optimized (Adam is elementwise: the other faces take the same steps as when the vertices ride along).
    face = subsets.sum(-1) > 1  # [S]
    u = init[:, :, face].clone().requires_grad_(True)
    opt = torch.optim.Adam([u], lr=0.05)
    for _ in range(steps):
        opt.zero_grad()
        loss = biased_loss(u.masked_fill(~mask[:, :, face], float("-inf")), ls, bb)
        loss.sum().backward()
        opt.step()
    with torch.no_grad():
        final = init.clone()
        final[:, :, face] = u
        loss = biased_loss(final.masked_fill(~mask, float("-inf")), ls, bb)
    return loss.flatten(2).amin(-1)


@cached
def global_threshold(seed: int) -> dict:
    """Random instances (K = 3, 4): numeric global min of L at b slightly above / below the conjectured
    threshold b_c = 1/2 log(1 - min pi*) (+-0.01, +-0.05), at b_c/2 and at b = 0.3; agreement rate with the conjecture."""
    g = torch.Generator().manual_seed(seed)
    agree, total, worst = 0, 0, 0.0
    details = {}
    for k, n in ((3, 30), (4, 16)):
        log_star = torch.log_softmax(torch.randn(n, k, generator=g, dtype=F64) * 1.2, -1)
        bc = 0.5 * torch.log1p(-log_star.exp().min(-1).values)  # [n]
        offs = torch.tensor([-0.05, -0.01, 0.01, 0.05], dtype=F64)
        b = torch.cat([bc[:, None] + offs, (bc / 2)[:, None], torch.full((n, 1), 0.3, dtype=F64)], 1)  # [n, 6]
        mins = simplex_min(log_star, b, generator=g)
        below = mins < b**2 - BEATS_TOL  # some pi beats pi* (L(pi*) = b^2)
        predicted = b < bc[:, None]
        agree += int((below == predicted).sum())
        total += below.numel()
        # largest improvement over b^2 found where the conjecture says pi* is global
        gain = torch.where(~predicted, b**2 - mins, torch.zeros_like(mins))
        worst = max(worst, float(gain.max()))
        details[f"K{k}_agree"] = float((below == predicted).to(F64).mean())
    rate = agree / total
    return {"agreement": rate, "agreed": agree, "cases": total, "max_violation_above_threshold": worst, **details}


def numeric_thresholds(n: int, k: int, n_b: int, seed: int, steps: int = 250):
    """For ``n`` random pi* over ``k`` outcomes: the smallest b on a grid (step ``0.4/n_b``, from -0.45)
    at which pi* is the numeric global minimizer for every larger grid b. Returns (conjectured [n], numeric [n])."""
    g = torch.Generator().manual_seed(seed)
    log_star = torch.log_softmax(torch.randn(n, k, generator=g, dtype=F64) * 0.7, -1)
    conj = 0.5 * torch.log1p(-log_star.exp().min(-1).values)
    grid = torch.linspace(-0.45, 0.05, n_b, dtype=F64)
    b = grid.expand(n, n_b).contiguous()
    mins = simplex_min(log_star, b, steps=steps, generator=g)
    beaten = (mins < b**2 - BEATS_TOL).numpy()  # [n, n_b]
    num = []
    for row in beaten:
        idx = np.nonzero(row)[0]
        num.append(
            float(grid[idx.max() + 1])
            if len(idx) and idx.max() + 1 < n_b
            else (float(grid[0]) if not len(idx) else math.nan)
        )
    return conj.numpy(), np.asarray(num), float(grid[1] - grid[0])


def envelope_instances(
    n: int,
    p: int,
    k: int,
    generator: torch.Generator,
    at_target: bool = False,
    unit_mean: bool = True,
    toward_target: bool = False,
):
    """Random instances of DISA Prop. 4: returns (|J_Zpsi - J_Z| [n], bound [n], E[Delta^2] [n], J_Z [n]).

    Each instance: ``p`` prompts (uniform), ``k`` outcomes, random pi_ref, graded reward, beta, a
    behaviour policy pi_b, nonnegative weights with ``E_{pi_b}[w | x] = 1`` (``unit_mean``),
    a policy pi_theta (= pi* when ``at_target``; a random geometric mix of a random policy and pi*
    concentrated near pi* when ``toward_target``) and a prompt-only error ``Delta(x)``.
    """
    g = generator
    logp_ref = torch.log_softmax(torch.randn(n, p, k, generator=g, dtype=F64), -1)
    reward = torch.rand(n, p, k, generator=g, dtype=F64)
    beta = 0.5 + 2.5 * torch.rand(n, 1, 1, generator=g, dtype=F64)
    log_z = log_partition(logp_ref, beta * reward).unsqueeze(-1)  # [n, p, 1]
    pi_b = torch.softmax(torch.randn(n, p, k, generator=g, dtype=F64), -1)
    w = torch.rand(n, p, k, generator=g, dtype=F64) ** 3 * 5
    if unit_mean:
        w = w / (pi_b * w).sum(-1, keepdim=True)
    if at_target:
        logp = target_logprobs(logp_ref, beta * reward)
    else:
        scale = torch.rand(n, 1, 1, generator=g, dtype=F64) * 2
        logp = torch.log_softmax(scale * torch.randn(n, p, k, generator=g, dtype=F64), -1)
        if toward_target:
            mix = 1 - torch.rand(n, 1, 1, generator=g, dtype=F64) ** 2
            logp = torch.log_softmax(mix * target_logprobs(logp_ref, beta * reward) + (1 - mix) * logp, -1)
    delta_err = torch.randn(n, p, 1, generator=g, dtype=F64) * torch.rand(n, 1, 1, generator=g, dtype=F64)
    d_exact = tb_residual(logp, logp_ref, reward, log_z, beta=beta)
    d_psi = tb_residual(logp, logp_ref, reward, log_z + delta_err, beta=beta)
    j_z = (pi_b * w * d_exact**2).sum(-1).mean(-1)
    j_psi = (pi_b * w * d_psi**2).sum(-1).mean(-1)
    e_d2 = (delta_err.squeeze(-1) ** 2).mean(-1)
    bound = e_d2 + 2 * e_d2.sqrt() * j_z.sqrt()
    return (j_psi - j_z).abs(), bound, e_d2, j_z


@cached
def envelope(seed: int) -> dict:
    """``disa.prop4.envelope``: 4000 random instances with unit-mean weights, 200 at pi = pi*, 4000 with
    weights not unit-mean, and 4000 with pi drawn toward pi* (plotted, not judged).

    Returns ``{"unit", "target", "nonunit", "toward"}`` (each the tuple of :func:`envelope_instances`)
    and ``numbers`` (the claim's numbers)."""
    g = torch.Generator().manual_seed(seed)
    sets = {"unit": envelope_instances(4000, 5, 6, g)}
    sets["target"] = envelope_instances(200, 5, 6, g, at_target=True)
    sets["nonunit"] = envelope_instances(4000, 5, 6, g, unit_mean=False)
    sets["toward"] = envelope_instances(4000, 5, 6, g, toward_target=True)
    ratio = {k: v[0] / v[1] for k, v in sets.items()}
    sets["numbers"] = {
        "max_ratio": float(ratio["unit"].max()),
        "tight_min": float(ratio["target"].min()),
        "tight_max": float(ratio["target"].max()),
        "max_ratio_nonunit": float(ratio["nonunit"].max()),
        "max_J_Z_at_target": float(sets["target"][3].max()),
        "max_ratio_toward_target": float(ratio["toward"].max()),
    }
    return sets
