"""Bad inputs at the objective boundary: a NaN at a real position, an empty batch and mismatched
shapes raise a ValueError naming the argument; non-finite values at padded positions are ignored
(the generic padding check, ``tests/objectives/_generic.check_padding``, covers every entry)."""

from __future__ import annotations

import math

import pytest
import torch

from tiltlab.objectives import correction, lad, offline, paced, pg, regressor, tb

F64 = torch.float64


def _tokens(b=4, t=3):
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(b, t, generator=g, dtype=F64)
    mask = torch.ones(b, t, dtype=F64)
    mask[1, 1:] = 0
    return lp, lp + 0.1, torch.randn(b, generator=g, dtype=F64), mask


def _nan_at(x, idx):
    x = x.clone()
    x[idx] = math.nan
    return x


@pytest.mark.parametrize("arg", ["token_logp", "token_logp_old", "adv", "token_logp_ref", "is_weight"])
def test_grpo_nan_in_real_position_names_the_argument(arg):
    lp, old, adv, mask = _tokens()
    kw = {"token_logp": lp, "token_logp_old": old, "adv": adv, "mask": mask}
    kw |= {"token_logp_ref": old.clone(), "kl_coef": 0.1, "is_weight": torch.ones(4, 3, dtype=F64)}
    kw[arg] = _nan_at(kw[arg], (0,) if arg == "adv" else (0, 0))
    with pytest.raises(ValueError, match=f"^{arg} contains NaN"):
        pg.grpo_loss(**kw)


def test_nan_and_inf_at_padded_positions_are_ignored():
    lp, old, adv, mask = _tokens()
    want = pg.grpo_loss(lp, old, adv, mask, token_logp_ref=old, kl_coef=0.1).loss
    for v in (math.nan, math.inf, -math.inf):
        bad = lp.clone()
        bad[1, 2] = v  # mask[1, 2] == 0
        got = pg.grpo_loss(bad, old, adv, mask, token_logp_ref=old, kl_coef=0.1).loss
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        assert torch.isfinite(correction.kl_penalty(bad, old, mask))
        assert torch.isfinite(pg.gspo_loss(bad, old, adv, mask).loss)


@pytest.mark.parametrize("arg", ["logp", "logp_ref", "reward", "log_z", "beta"])
def test_tb_nan_names_the_argument(arg):
    kw = {"logp": -torch.rand(3, dtype=F64), "logp_ref": -torch.rand(3, dtype=F64), "reward": torch.rand(3, dtype=F64)}
    kw |= {"log_z": torch.zeros(3, dtype=F64), "beta": 2.0}
    kw[arg] = math.nan if arg == "beta" else _nan_at(kw[arg], (1,))
    with pytest.raises(ValueError, match=f"^{arg} (contains|is) NaN"):
        tb.tb_residual(**kw)


def test_nan_rewards_raise():
    with pytest.raises(ValueError, match="^rewards contains NaN"):
        pg.group_advantages(torch.tensor([[1.0, math.nan]], dtype=F64))


def test_empty_batch_raises():
    e = torch.zeros(0, 3, dtype=F64)
    with pytest.raises(ValueError, match="token_logp is empty"):
        pg.grpo_loss(e, e, torch.zeros(0, dtype=F64), e)
    with pytest.raises(ValueError, match="token_logp is empty"):
        pg.gspo_loss(e, e, torch.zeros(0, dtype=F64), e)
    with pytest.raises(ValueError, match="token_logp is empty"):
        correction.kl_penalty(e, e, e)
    z = torch.zeros(0, dtype=F64)
    with pytest.raises(ValueError, match="logp is empty"):
        tb.tb_residual(z, z, z, z, beta=1.0)
    with pytest.raises(ValueError, match="logp is empty"):
        lad.lad_loss(z, z, z, eta=1.0, divergence="kl")
    with pytest.raises(ValueError, match="rewards is empty"):
        pg.group_advantages(torch.zeros(0, 4, dtype=F64))


def test_square_against_vector_is_refused():
    v, m = torch.zeros(8, dtype=F64), torch.zeros(8, 8, dtype=F64)
    with pytest.raises(ValueError, match="log_z"):
        tb.tb_residual(v, v, v, m, beta=1.0)  # would silently broadcast to an [8, 8] residual
    with pytest.raises(ValueError, match="adv"):
        lad.lad_loss(m, m, v, eta=1.0, divergence="kl")  # would align adv with the token axis
    with pytest.raises(ValueError, match="weight"):
        lad.lad_loss(v, v, v, eta=1.0, divergence="kl", is_weight=m)
    assert tb.tb_residual(v, v, v, 0.5, beta=1.0).shape == (8,)  # a scalar log Z is fine


def _seq(n=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    return -torch.rand(n, generator=g, dtype=F64) * 5 - 0.1


@pytest.mark.parametrize(
    ("fn", "kwargs", "arg"),
    [
        (offline.offrl_loss, {"logp": _seq(), "lengths": torch.full((4,), 3), "reward": _seq(seed=2)}, "reward"),
        (
            offline.fpa_loss,
            {"logp": _seq(), "logp_future": _seq(seed=3), "lengths": torch.full((4,), 3), "reward": _seq(seed=2)},
            "logp_future",
        ),
        (
            offline.dpo_loss,
            {"logp_w": _seq(), "logp_l": _seq(seed=2), "ref_w": _seq(seed=3), "ref_l": _seq(seed=4)},
            "ref_l",
        ),
        (
            offline.kto_loss,
            {"logp": _seq(), "logp_ref": _seq(seed=2), "correct": torch.tensor([1, 0, 1, 0])},
            "logp_ref",
        ),
        (
            offline.simper_loss,
            {"logp_w": _seq(), "len_w": torch.full((4,), 2), "logp_l": _seq(seed=2), "len_l": torch.full((4,), 3)},
            "logp_l",
        ),
        (
            offline.apo_loss,
            {"logp": _seq(), "logp_ref": _seq(seed=2), "reward": _seq(seed=3), "v_hat": _seq(seed=4)},
            "v_hat",
        ),
        (regressor.regressor_loss, {"pred": _seq(), "target": _seq(seed=2)}, "target"),
        (paced.accuracy_from_log_z, {"log_z": _seq(), "kl_coef": 0.5}, "log_z"),
    ],
    ids=lambda v: getattr(v, "__name__", None) if callable(v) else None,
)
def test_offline_paced_regressor_nan_names_the_argument(fn, kwargs, arg):
    """A NaN in any real input of the offline (FPA-paper), PACED and Stage-2 losses is refused
    with a ValueError naming that input (these returned NaN before)."""
    bad = dict(kwargs)
    bad[arg] = _nan_at(kwargs[arg], (1,))
    with pytest.raises(ValueError, match=f"^{arg} contains NaN"):
        fn(**bad)
    fn(**kwargs)  # the clean inputs are accepted


def test_offline_empty_batch_raises():
    z = torch.zeros(0, dtype=F64)
    with pytest.raises(ValueError, match="logp_w is empty"):
        offline.dpo_loss(z, z, z, z)
    with pytest.raises(ValueError, match="token_logp is empty"):
        offline.sft_loss(torch.zeros(0, 3, dtype=F64), torch.zeros(0, 3, dtype=F64))
    with pytest.raises(ValueError, match="pred is empty"):
        regressor.regressor_loss(z, z)
