"""The generic checks kill classes of bugs: each test builds a deliberately wrong variant of an
objective (a wrapped or modified copy, defined here), points a registry entry at it, and asserts
that the named generic check reports a failure (while the real entry passes it).

Mutant -> the generic check that kills it:

- group advantages with the population std (``unbiased=False``) instead of the sample std that
  the code, TRL and veRL use -> ``check_value`` (the loop reference pins ``n - 1``);
- the KL-in-reward penalty left attached -> ``check_detach``; with the log-ratio the other way
  round (``ref - old``) -> ``check_value``;
- GRPO / PPO+KL / GSPO with swapped low/high clip bounds -> ``check_value`` (the entries use an
  asymmetric clip 0.2 / 0.28 and advantages of both signs, so both bounds bind);
- GRPO ignoring ``clip_eps_high`` (a symmetric clip) -> ``check_value`` on the asymmetric entry;
  the same mutant passes on a symmetric sample, which is why the entries are asymmetric;
- KTO with its reference point ``z0`` left attached -> ``check_grad`` (its value is unchanged, so
  a value-only test cannot see it); with a given ``z0`` not detached -> ``check_detach``;
- KTO with a right value and a wrong gradient -> ``check_grad`` and ``check_gradcheck``;
- a wrong constant in a divergence generator, in ``theory/`` (sympy) -> ``check_generators_match``;
  in ``objectives/`` -> ``check_value`` on the ``lad_loss`` entry;
- an unmasked mean (padding counted in the denominator) -> ``check_padding`` and ``check_split``;
- a mask applied by multiplication only (``x * mask``: NaN * 0 = NaN leaks) -> ``check_padding``;
- DISA with its frozen log Z left attached -> ``check_detach``;
- NaN silently replaced (``nan_to_num``) -> ``check_nan``;
- a missing entry shape check (torch broadcasting error instead of a ValueError) -> ``check_shape_errors``.
"""

from __future__ import annotations

import dataclasses

import pytest
import sympy as sp
import torch
import torch.nn.functional as F

from tests.objectives._generic import (
    check_detach,
    check_generators_match,
    check_grad,
    check_gradcheck,
    check_nan,
    check_padding,
    check_shape_errors,
    check_split,
    check_value,
)
from tests.objectives.opinfo import BY_NAME, loss_of
from tiltlab.objectives import lad, offline, pg, tb
from tiltlab.theory import lad as theory_lad


def kills(check, op, mutant_fn) -> None:
    """``check`` passes on ``op`` and fails on ``op`` with ``fn`` replaced by ``mutant_fn``."""
    check(op)
    mutant = dataclasses.replace(op, fn=mutant_fn, name=op.name + "[mutant]")
    with pytest.raises(AssertionError):
        check(mutant)


# ----------------------------------------------------------------- population vs sample std
def group_advantages_population_std(rewards, scale="std", eps=1e-6):
    centered = rewards - rewards.mean(dim=1, keepdim=True)
    return centered / (rewards.std(dim=1, keepdim=True, unbiased=False) + eps)


def test_population_std_in_group_advantages_is_killed_by_value():
    kills(check_value, BY_NAME["pg.group_advantages[std]"], group_advantages_population_std)


# ------------------------------------------------------------------------ KL in the reward
def kl_in_reward_attached(rewards, logp_old_seq, logp_ref_seq, coef):
    return rewards - coef * (logp_old_seq - logp_ref_seq)


def kl_in_reward_reversed(rewards, logp_old_seq, logp_ref_seq, coef):
    return rewards - coef * (logp_ref_seq - logp_old_seq).detach()


def test_attached_kl_in_reward_penalty_is_killed_by_detach():
    kills(check_detach, BY_NAME["pg.kl_in_reward"], kl_in_reward_attached)


def test_reversed_kl_in_reward_log_ratio_is_killed_by_value():
    kills(check_value, BY_NAME["pg.kl_in_reward[groups]"], kl_in_reward_reversed)


# ------------------------------------------------------------------------ clip bounds
def _swap_bounds(f):
    def g(**kw):
        lo, hi = kw["clip_eps"], kw["clip_eps_high"]
        return f(**{**kw, "clip_eps": hi, "clip_eps_high": lo})

    return g


@pytest.mark.parametrize(
    "name, f",
    [("pg.grpo_loss[token_mean]", pg.grpo_loss), ("pg.ppo_kl_loss", pg.ppo_kl_loss), ("pg.gspo_loss", pg.gspo_loss)],
)
def test_swapped_clip_bounds_are_killed_by_value(name, f):
    kills(check_value, BY_NAME[name], _swap_bounds(loss_of(f)))


def test_swapped_clip_bounds_in_clip_fraction_are_killed_by_value():
    op = BY_NAME["pg.grpo_loss.clip_frac"]
    kills(check_value, op, _swap_bounds(lambda **kw: pg.grpo_loss(**kw).metrics["clip_frac"]))


def grpo_symmetric_only(**kw):
    kw.pop("clip_eps_high")
    return pg.grpo_loss(**kw).loss


def test_ignored_high_clip_is_killed_only_by_an_asymmetric_sample():
    op = BY_NAME["pg.grpo_loss[seq_mean_token_mean]"]
    kills(check_value, op, grpo_symmetric_only)
    symmetric = dataclasses.replace(op, kwargs={**op.kwargs, "clip_eps_high": op.kwargs["clip_eps"]})
    check_value(dataclasses.replace(symmetric, fn=grpo_symmetric_only))  # a symmetric test cannot see it


# ------------------------------------------------------------------------------------- KTO
def kto_attached_z0(logp, logp_ref, correct, beta=0.1, lambda_w=1.0, lambda_l=1.0, z0=None):
    r = logp - logp_ref.detach()
    z = r.mean() if z0 is None else z0  # the bug: the reference point carries gradient
    c = correct.bool()
    v = torch.where(c, lambda_w * torch.sigmoid(beta * (r - z)), lambda_l * torch.sigmoid(beta * (z - r)))
    lam = torch.where(c, torch.full_like(r, lambda_w), torch.full_like(r, lambda_l))
    return (lam - v).mean()


def test_attached_batch_z0_is_killed_by_grad_not_by_value():
    op = BY_NAME["offline.kto_loss[batch z0]"]
    check_value(dataclasses.replace(op, fn=kto_attached_z0))  # same value: a value-only test misses it
    kills(check_grad, op, kto_attached_z0)


def test_attached_given_z0_is_killed_by_detach():
    kills(check_detach, BY_NAME["offline.kto_loss[given z0]"], kto_attached_z0)


def kto_wrong_gradient(logp, logp_ref, correct, **kw):
    doubled = logp + (logp - logp.detach())  # the value of logp, twice its gradient
    return offline.kto_loss(doubled, logp_ref, correct, **kw).loss


def test_kto_wrong_gradient_is_killed_by_grad_and_gradcheck():
    op = BY_NAME["offline.kto_loss[given z0]"]
    check_value(dataclasses.replace(op, fn=kto_wrong_gradient))
    kills(check_grad, op, kto_wrong_gradient)
    kills(check_gradcheck, op, kto_wrong_gradient)


# ----------------------------------------------------------------------- divergence constants
def test_wrong_constant_in_a_theory_generator_is_killed_by_the_cross_check():
    check_generators_match(theory_lad.F_DIVERGENCES, lad.F_DIVERGENCES)
    for name, wrong in {
        "hellinger": lambda u: (sp.sqrt(u) - 1) ** 2,  # the 1/2 dropped
        "js": lambda u: (u * sp.log(u) - (u + 1) * sp.log((u + 1) / 3)) / 2,  # log((x+1)/3)
    }.items():
        mutant = {**theory_lad.F_DIVERGENCES, name: wrong}
        with pytest.raises(AssertionError, match=name):
            check_generators_match(mutant, lad.F_DIVERGENCES)


def test_wrong_constant_in_an_objectives_generator_is_killed_by_value():
    op = BY_NAME["lad.lad_loss[jeffreys]"]
    wrong = lad.Divergence("jeffreys", lambda x: 0.5 * (x - 1.0) * torch.log(x), False, "(x - 1) log x / 2")
    kills(check_value, op, lambda **kw: lad.lad_loss(**{**kw, "divergence": wrong}).loss)
    with pytest.raises(AssertionError):
        check_generators_match(theory_lad.F_DIVERGENCES, {**lad.F_DIVERGENCES, "jeffreys": wrong})


# ------------------------------------------------------------------------------ padding leaks
def sft_unmasked_mean(token_logp, mask):
    return -(torch.where(mask > 0, token_logp, 0.0) * mask).sum() / mask.numel()  # padding in the denominator


def masked_mean_by_multiplication(x, mask, dim=None):
    return (x * mask).sum() / mask.sum()  # NaN * 0 = NaN: a NaN in padding leaks


def test_unmasked_mean_is_killed_by_padding_and_split():
    kills(check_padding, BY_NAME["offline.sft_loss"], sft_unmasked_mean)
    kills(check_split, BY_NAME["offline.sft_loss"], sft_unmasked_mean)


def test_mask_by_multiplication_is_killed_by_padding_only():
    op = BY_NAME["pg.masked_mean"]
    check_value(dataclasses.replace(op, fn=masked_mean_by_multiplication))  # right on finite padding
    kills(check_padding, op, masked_mean_by_multiplication)


# ---------------------------------------------------------------------- detach / NaN / shapes
def disa_attached_log_z(logp, logp_ref, reward, log_z_frozen, beta, is_weight=None):
    return tb.tb_loss(
        tb.tb_residual(logp, logp_ref.detach(), reward, log_z_frozen, beta=beta), is_weight=is_weight
    ).loss


def test_attached_frozen_log_z_is_killed_by_detach():
    kills(check_detach, BY_NAME["tb.disa_loss"], disa_attached_log_z)


def sft_nan_to_num(token_logp, mask):
    return offline.sft_loss(torch.nan_to_num(token_logp, nan=0.0), mask).loss


def test_silent_nan_masking_is_killed_by_nan():
    kills(check_nan, BY_NAME["offline.sft_loss"], sft_nan_to_num)


def dpo_without_shape_checks(logp_w, logp_l, ref_w, ref_l, *, beta=0.1):
    return -F.logsigmoid(beta * ((logp_w - ref_w.detach()) - (logp_l - ref_l.detach()))).mean()


def test_missing_shape_check_is_killed_by_shape_errors():
    kills(check_shape_errors, BY_NAME["offline.dpo_loss"], dpo_without_shape_checks)
