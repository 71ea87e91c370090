"""``pg.kl_in_reward``: the sequence-level k1 penalty in the reward, and where each KL placement
puts GRPO's fixed point (``docs/math.md`` §6, "Where the KL goes").

The fixed-point tests take EXACT expectations, no sampling: every group of ``G`` completions is
enumerated with its probability, and the expected gradient is the probability-weighted sum of the
gradients of the implemented loss (``pg.grpo_loss`` on the advantages of ``pg.group_advantages``,
the rewards through ``pg.kl_in_reward``), at ``pi = pi_old`` (the on-policy step). Two problems:

* a one-step bandit: a softmax policy over ``K = 5`` arms;
* a two-token sequence problem: a token tree of depth 2 over a vocabulary of 3, a tabular policy
  ``pi(a) pi(b | a)``, a reward on the 9 leaves.

The tilted target is ``pi* = pi_ref e^{beta r} / Z`` (sequence level), with the KL coefficient
``c = 1 / beta``. The claims pinned here:

1. KL in the reward: the expected gradient is ``-(1 - 1/G) / T * grad (E r - c KL(pi || pi_ref))``
   with ``scale="none"`` (``T`` tokens per completion, the ``token_mean`` aggregation), so it
   vanishes at ``pi*`` and only there; gradient ascent from ``pi_ref`` reaches ``pi*``.
2. k3 in the loss (TRL's): its expected gradient is that of ``KL(pi_ref || pi)``: not zero at ``pi*``.
3. k2 in the loss: on the bandit its gradient is that of ``KL(pi || pi_ref)``, but the group-mean
   baseline scales the policy term by ``1 - 1/G`` and not the KL term, so its fixed point is the
   tilt at ``beta (1 - 1/G)``; with that factor put into the coefficient it is ``pi*`` on the
   bandit, and still NOT on the sequences (per token it misses how a token changes the KL of the
   tokens after it).
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from tiltlab.objectives import pg

F64 = torch.float64
BETA, G = 2.0, 3
C = 1.0 / BETA  # the KL coefficient whose optimum is pi_ref e^{beta r} / Z
EPS = 1e-4  # TRL's advantage eps (the online trainer's)
# The exact expected gradients are float64 sums of O(100) terms of size <= 1: rounding leaves
# ~1e-16 per term. Where the claim is "vanishes", the measured residual is <= 2e-18 (scale "none")
# and <= 3e-14 (std scaling: (r' - mean) ~ 1e-16 divided by std + eps = 1e-4); 1e-12 covers both.
# Where the claim is "does not vanish", the residuals are 3e-3 .. 7e-2, nine orders above it.
ZERO = 1e-12
NONZERO = 1e-3


# ------------------------------------------------------------------------------------ the function
def test_kl_in_reward_is_the_naive_formula():
    g = torch.Generator().manual_seed(0)
    r = torch.randint(0, 2, (3, 4), generator=g).to(F64)
    old = -torch.rand(3, 4, generator=g, dtype=F64) * 5
    ref = old + torch.randn(3, 4, generator=g, dtype=F64)
    for coef in (0.0, 0.3, 7.0):
        want = [[float(r[p, j]) - coef * (float(old[p, j]) - float(ref[p, j])) for j in range(4)] for p in range(3)]
        got = pg.kl_in_reward(r, old, ref, coef=coef)
        torch.testing.assert_close(got, torch.tensor(want, dtype=F64), rtol=1e-14, atol=1e-14)
    assert torch.equal(pg.kl_in_reward(r, old, ref, coef=0.0), r)  # coef 0: the rewards themselves
    assert not torch.allclose(pg.kl_in_reward(r, old, ref, coef=0.3), r)  # the sample's penalty is not 0
    # the [B] form equals the [P, G] form row by row
    torch.testing.assert_close(
        pg.kl_in_reward(r.reshape(-1), old.reshape(-1), ref.reshape(-1), coef=0.3),
        pg.kl_in_reward(r, old, ref, coef=0.3).reshape(-1),
    )


def test_kl_in_reward_penalty_is_detached():
    r = torch.tensor([1.0, 0.0], dtype=F64, requires_grad=True)
    old = torch.tensor([-1.0, -2.0], dtype=F64, requires_grad=True)
    ref = torch.tensor([-1.5, -1.0], dtype=F64, requires_grad=True)
    out = pg.kl_in_reward(r, old, ref, coef=0.5)
    out.sum().backward()
    assert old.grad is None and ref.grad is None
    assert r.grad is not None and torch.equal(r.grad, torch.ones(2, dtype=F64))


@pytest.mark.parametrize(
    "kw, says",
    [
        ({"logp_old_seq": torch.zeros(3, dtype=F64)}, "rewards has shape (4,) but logp_old_seq has shape (3,)"),
        ({"logp_ref_seq": torch.zeros(2, 2, dtype=F64)}, "logp_ref_seq has shape (2, 2)"),
        ({"rewards": torch.tensor(1.0, dtype=F64)}, "rewards is empty"),
        ({"coef": -0.1}, "coef must be finite and >= 0, got -0.1"),
        ({"coef": math.inf}, "coef must be finite and >= 0, got inf"),
        ({"coef": math.nan}, "coef must be finite and >= 0, got nan"),
        ({"rewards": torch.tensor([1.0, math.nan, 0.0, 1.0], dtype=F64)}, "rewards contains NaN"),
        ({"logp_old_seq": torch.tensor([-1.0, -2.0, math.nan, -1.0], dtype=F64)}, "logp_old_seq contains NaN"),
        ({"logp_ref_seq": torch.tensor([math.nan, -2.0, -1.0, -1.0], dtype=F64)}, "logp_ref_seq contains NaN"),
    ],
)
def test_kl_in_reward_refuses_bad_input_in_one_line(kw, says):
    args = {
        "rewards": torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=F64),
        "logp_old_seq": -torch.ones(4, dtype=F64),
        "logp_ref_seq": -2 * torch.ones(4, dtype=F64),
        "coef": 0.5,
    }
    with pytest.raises(ValueError) as e:
        pg.kl_in_reward(**{**args, **kw})
    assert says in str(e.value) and "\n" not in str(e.value)


# ------------------------------------------------------------------------------------ the problems
class Problem:
    """Completions ``y`` of ``T`` tokens with a tabular policy given by ``token_logps(params)``
    (``[S, T]`` log-probs of the ``S`` completions' tokens), rewards ``r [S]``, the reference's
    parameters, and every group of ``G`` completions (``[N, G]`` indices into the ``S``)."""

    def __init__(self, token_logps, ref_params, r):
        self.token_logps, self.ref_params, self.r = token_logps, ref_params, r
        self.ref_tok = token_logps(ref_params)  # [S, T]
        self.S, self.T = self.ref_tok.shape
        self.groups = torch.tensor(list(itertools.product(range(self.S), repeat=G)))  # [S^G, G]

    def log_pi_star(self) -> torch.Tensor:
        """``log pi*(y) = log pi_ref(y) + beta r(y) - log Z``, sequence level, ``[S]``."""
        return torch.log_softmax(self.ref_tok.sum(1) + BETA * self.r, 0)

    def objective(self, params) -> torch.Tensor:
        """``E_pi[r] - c KL(pi || pi_ref)``, exactly (a sum over the ``S`` completions)."""
        lp = self.token_logps(params).sum(1)
        return (lp.exp() * (self.r - C * (lp - self.ref_tok.sum(1)))).sum()


def _bandit() -> Problem:
    g = torch.Generator().manual_seed(1)
    ref = torch.randn(5, generator=g, dtype=F64)
    r = torch.tensor([0.0, 1.0, 0.0, 1.0, 0.5], dtype=F64)
    return Problem(lambda theta: torch.log_softmax(theta, 0)[:, None], ref, r)


V = 3
LEAVES = torch.tensor(list(itertools.product(range(V), repeat=2)))  # [9, 2]: (a, b)


def _tree_logps(params: torch.Tensor) -> torch.Tensor:
    """``[9, 2]``: ``log pi(a)`` and ``log pi(b | a)`` of each leaf; ``params`` = ``V`` logits of
    the first token, then ``V x V`` logits of the second given the first."""
    first = torch.log_softmax(params[:V], 0)
    second = torch.log_softmax(params[V:].view(V, V), 1)
    return torch.stack([first[LEAVES[:, 0]], second[LEAVES[:, 0], LEAVES[:, 1]]], 1)


def _tree() -> Problem:
    g = torch.Generator().manual_seed(2)
    ref = torch.randn(V + V * V, generator=g, dtype=F64)
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0], dtype=F64)  # r(a, b), row-major
    return Problem(_tree_logps, ref, r)


def _tree_star_params(prob: Problem) -> torch.Tensor:
    """The tree's ``pi*`` as logits: ``pi*(b | a) ∝ pi_ref(b | a) e^{beta r(a, b)}``,
    ``pi*(a) ∝ pi_ref(a) Z(a)`` with ``Z(a) = sum_b pi_ref(b | a) e^{beta r(a, b)}``."""
    ref_first = torch.log_softmax(prob.ref_params[:V], 0)
    second = torch.log_softmax(prob.ref_params[V:].view(V, V), 1) + BETA * prob.r.view(V, V)
    return torch.cat([ref_first + torch.logsumexp(second, 1), second.reshape(-1)])


def _params_star(prob: Problem) -> torch.Tensor:
    return prob.log_pi_star() if prob.T == 1 else _tree_star_params(prob)


# ------------------------------------------------------------------------------------ expectations
def expected_grad(prob: Problem, params, kl: str, coef: float, scale: str = "none") -> torch.Tensor:
    """The exact expected gradient of the GRPO loss over groups of ``G`` on-policy completions.

    ``kl="reward"``: advantages of ``kl_in_reward(r, logp_old, logp_ref, coef)``, no KL loss term;
    ``kl="k1" | "k2" | "k3"``: advantages of ``r`` and ``coef * k`` per token in the loss (TRL's
    ``beta`` with ``kl_estimator``). One ``grpo_loss`` call per group, weighted by the group's
    probability ``prod_i pi(y_i)``."""
    p = params.detach().clone().requires_grad_(True)
    lt = prob.token_logps(p)  # [S, T]
    prob_y = lt.detach().sum(1).exp()
    total = torch.zeros((), dtype=F64)
    for ys in prob.groups:
        tok, ref = lt[ys], prob.ref_tok[ys]
        old = tok.detach()
        if kl == "reward":
            r = pg.kl_in_reward(prob.r[ys][None], old.sum(1)[None], ref.sum(1)[None], coef=coef)
            loss = pg.grpo_loss(tok, old, pg.group_advantages(r, scale=scale, eps=EPS)[0], torch.ones_like(tok)).loss
        else:
            adv = pg.group_advantages(prob.r[ys][None], scale=scale, eps=EPS)[0]
            loss = pg.grpo_loss(
                tok, old, adv, torch.ones_like(tok), token_logp_ref=ref, kl_coef=coef, kl_estimator=kl
            ).loss
        total = total + prob_y[ys].prod() * loss
    (grad,) = torch.autograd.grad(total, p)
    return grad


def expected_grad_kl_in_reward(prob: Problem, params, coef: float = C, scale: str = "none") -> torch.Tensor:
    """:func:`expected_grad` with ``kl="reward"`` in one ``grpo_loss`` call over all groups: the
    group probabilities (times the number of groups) as ``is_weight``, which multiplies the policy
    term, the only term without a KL loss term (checked against the loop below)."""
    p = params.detach().clone().requires_grad_(True)
    lt = prob.token_logps(p)
    n = prob.groups.shape[0]
    tok = lt[prob.groups].reshape(n * G, prob.T)
    old, ref = tok.detach(), prob.ref_tok[prob.groups].reshape(n * G, prob.T)
    r = pg.kl_in_reward(prob.r[prob.groups], old.sum(1).view(n, G), ref.sum(1).view(n, G), coef=coef)
    adv = pg.group_advantages(r, scale=scale, eps=EPS).reshape(-1)
    weight = (lt.detach().sum(1).exp()[prob.groups].prod(1) * n).repeat_interleave(G)
    loss = pg.grpo_loss(tok, old, adv, torch.ones_like(tok), is_weight=weight).loss
    (grad,) = torch.autograd.grad(loss, p)
    return grad


def _norm(g: torch.Tensor) -> float:
    return float(g.abs().max())


PROBLEMS = {"bandit": _bandit, "tree": _tree}


# ------------------------------------------------------------------------------------ 1. KL in the reward
@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_kl_in_reward_expected_gradient_is_the_kl_regularised_objective(name):
    """``E[grad loss] = -(1 - 1/G) / T * grad (E r - c KL(pi || pi_ref))`` with ``scale="none"``,
    at a point away from ``pi_ref`` and ``pi*`` (the leave-in group mean scales both terms alike)."""
    prob = PROBLEMS[name]()
    params = prob.ref_params + torch.randn(prob.ref_params.shape, generator=torch.Generator().manual_seed(3), dtype=F64)
    got = expected_grad(prob, params, "reward", C)
    p = params.clone().requires_grad_(True)
    (grad_j,) = torch.autograd.grad(prob.objective(p), p)
    want = -(1 - 1 / G) / prob.T * grad_j
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-14)  # float64 sums of O(100) terms
    assert _norm(want) > NONZERO  # a point where the gradient is not 0
    # the batched form used below is the same expectation, with and without std scaling
    torch.testing.assert_close(expected_grad_kl_in_reward(prob, params), got, rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(
        expected_grad_kl_in_reward(prob, params, scale="std"),
        expected_grad(prob, params, "reward", C, "std"),
        rtol=1e-10,
        atol=1e-14,
    )
    # a wrong coefficient (k1 scaled by 2) is a different objective
    assert _norm(expected_grad(prob, params, "reward", 2 * C) - want) > NONZERO


@pytest.mark.parametrize("scale", ["none", "std"])  # "batch" over one group is "std"
@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_kl_in_reward_vanishes_at_the_tilted_target(name, scale):
    """At ``pi*`` the penalised reward is ``c log Z`` for every completion: every advantage is 0,
    whatever the scaling, and the expected gradient vanishes; at ``pi_ref`` it does not."""
    prob = PROBLEMS[name]()
    star = _params_star(prob)
    torch.testing.assert_close(prob.token_logps(star).sum(1), prob.log_pi_star(), rtol=0, atol=1e-13)
    r = pg.kl_in_reward(prob.r, prob.log_pi_star(), prob.ref_tok.sum(1), coef=C)
    assert float(r.max() - r.min()) < 1e-14  # c log Z, the same for every completion
    assert _norm(expected_grad_kl_in_reward(prob, star, scale=scale)) < ZERO
    assert _norm(expected_grad_kl_in_reward(prob, prob.ref_params, scale=scale)) > NONZERO
    # another coefficient's target is not a fixed point of this one
    assert _norm(expected_grad_kl_in_reward(prob, star, 2 * C, scale)) > NONZERO


@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_gradient_ascent_with_kl_in_reward_reaches_the_tilted_target(name):
    """Exact expected-gradient steps from ``pi_ref`` (``scale="none"``) end at ``pi*``: TV < 1e-6."""
    prob = PROBLEMS[name]()
    params, target = prob.ref_params.clone(), prob.log_pi_star().exp()

    def tv(x):
        return 0.5 * float((prob.token_logps(x).sum(1).exp() - target).abs().sum())

    start = tv(params)
    # the update is (1 - 1/G) / T times grad J: a step of 5 on J (measured: TV < 1e-9 after 200 steps
    # on both problems; a step of 20 on J oscillates on the bandit)
    step = 5.0 * prob.T / (1 - 1 / G)
    for _ in range(200):
        params = params - step * expected_grad_kl_in_reward(prob, params)
    assert start > 0.1 and tv(params) < 1e-6


def test_std_scaling_keeps_the_fixed_point_but_not_the_gradient_size():
    """With std scaling (TRL's default ``scale_rewards="group"``) ``pi*`` stays a fixed point (the
    test above), but the update is no longer ``grad (E r - c KL)``: the group std divides out the
    size of the deviation, so a step of 1e-3 off ``pi*`` still gets an O(0.1) update where the
    unscaled one is O(1e-4) (and shrinks only when the reward spread reaches ``eps``)."""
    prob = _tree()
    star = _params_star(prob)
    direction = torch.randn(star.shape, generator=torch.Generator().manual_seed(9), dtype=F64)
    near = star + 1e-3 * direction
    unscaled = _norm(expected_grad_kl_in_reward(prob, near, scale="none"))
    scaled = _norm(expected_grad_kl_in_reward(prob, near, scale="std"))
    assert unscaled < 1e-3 and scaled > 0.05  # measured: 8.1e-5 and 0.117
    # it still points back: the first-order change of E r - c KL along -update is positive
    p = near.clone().requires_grad_(True)
    (grad_j,) = torch.autograd.grad(prob.objective(p), p)
    assert float(grad_j @ -expected_grad_kl_in_reward(prob, near, scale="std")) > 0


# ------------------------------------------------------------------------------------ 2-3. KL in the loss
def test_k3_in_the_loss_is_not_stationary_at_the_tilted_target():
    """TRL's ``beta * k3`` per token: its expected gradient is ``c grad KL(pi_ref || pi)``, whose
    balance with the reward is another policy. Bandit, the one-step case."""
    prob = _bandit()
    star = _params_star(prob)
    for scale in ("none", "std"):
        assert _norm(expected_grad(prob, star, "k3", C, scale)) > NONZERO  # measured 6.8e-2 / 3.8e-2
    # the KL term's expected gradient is exactly c * grad KL(pi_ref || pi) (reward 0: no policy term)
    zero_r = Problem(prob.token_logps, prob.ref_params, torch.zeros(5, dtype=F64))
    p = star.clone().requires_grad_(True)
    lp, lref = torch.log_softmax(p, 0), prob.ref_tok[:, 0]
    (want,) = torch.autograd.grad(C * (lref.exp() * (lref - lp)).sum(), p)
    torch.testing.assert_close(expected_grad(zero_r, star, "k3", C), want, rtol=1e-10, atol=1e-14)


def test_k2_in_the_loss_on_the_bandit_targets_the_tilt_at_beta_times_one_minus_one_over_g():
    """k2 per token has the gradient of ``KL(pi || pi_ref)`` on a bandit, but GRPO's group mean scales
    the policy term by ``1 - 1/G`` and not the KL term: the fixed point is ``pi_ref e^{beta (1 - 1/G) r}``,
    and with the coefficient ``(1 - 1/G) c`` it is ``pi*`` (``scale="none"``)."""
    prob = _bandit()
    star = _params_star(prob)
    lref = prob.ref_tok[:, 0]
    shrunk = torch.log_softmax(lref + BETA * (1 - 1 / G) * prob.r, 0)
    assert _norm(expected_grad(prob, star, "k2", C)) > NONZERO  # measured 2.2e-2
    assert _norm(expected_grad(prob, shrunk, "k2", C)) < ZERO
    assert _norm(expected_grad(prob, star, "k2", (1 - 1 / G) * C)) < ZERO


def test_per_token_k2_in_the_loss_is_not_stationary_at_the_sequence_target():
    """On sequences per-token k2 misses ``E[(log pi_2 - log pi_ref,2) grad log pi_1]`` (how the first
    token changes the KL of the second): even with the ``1 - 1/G`` factor put into the coefficient,
    which makes it exact on the bandit, it is not stationary at the sequence-level ``pi*``, while
    the KL in the reward is (``test_kl_in_reward_vanishes_at_the_tilted_target``)."""
    prob = _tree()
    star = _params_star(prob)
    scale_of_gradients = _norm(expected_grad(prob, prob.ref_params, "reward", C))  # measured 3.3e-2
    for coef in (C, (1 - 1 / G) * C):
        residual = _norm(expected_grad(prob, star, "k2", coef))
        assert residual > 0.05 * scale_of_gradients, coef  # measured 2.7e-2 and 3.3e-3
    assert _norm(expected_grad(prob, star, "k3", C)) > NONZERO  # measured 3.0e-2
