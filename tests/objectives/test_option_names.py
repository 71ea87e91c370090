"""One argument dialect across the objectives (issue 56, item 2): tensors positional, options
keyword-only; one name per knob (``is_weight``, ``loss_agg``, ``weight_clip``), the old names
refused in one line naming the new; the GRPO family's shared options declared once
(``llm/checks/rules.py`` judges ``stats.Item`` itself: ``tests/llm/checks/test_rules.py``)."""

from __future__ import annotations

import dataclasses
import inspect
import itertools

import pytest
import torch

from tiltlab.objectives import correction, diagnostics, estimators, lad, offline, paced, pg, tb

F64 = torch.float64
MODULES = (pg, lad, tb, offline, estimators, paced, correction, diagnostics)


def _public_functions():
    for mod in MODULES:
        for name in mod.__all__:
            f = getattr(mod, name)
            if inspect.isfunction(f) or (inspect.isclass(f) and name == "ReplayBuffer"):
                yield f"{mod.__name__.rsplit('.', 1)[1]}.{name}", f


@pytest.mark.parametrize("name,f", list(_public_functions()))
def test_every_option_with_a_default_is_keyword_only(name, f):
    """A parameter with a default (an option, or an optional tensor such as ``is_weight``) cannot be
    passed by position: the positional parameters are the data the function works on."""
    sig = inspect.signature(f)
    positional = [
        p.name
        for p in sig.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is not p.empty
    ]
    assert positional == [], f"{name}: options {positional} can be passed by position"


def _tokens(b=4, t=3):
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(b, t, generator=g, dtype=F64)
    mask = torch.ones(b, t, dtype=F64)
    mask[1, 1:] = 0
    return lp, lp + 0.1 * torch.randn(b, t, generator=g, dtype=F64), torch.randn(b, generator=g, dtype=F64), mask


def test_a_positional_option_is_refused():
    lp, old, adv, mask = _tokens()
    for call in (
        lambda: pg.grpo_loss(lp, old, adv, mask, 0.2),
        lambda: pg.aggregate(lp, mask, "token_mean"),
        lambda: lad.lad_loss(lp[:, 0], old[:, 0], adv, 1.0, "kl"),
        lambda: tb.tb_residual(lp[:, 0], old[:, 0], adv, 0.0, 2.0),
        lambda: tb.tb_importance_weight(lp, old, mask, "max"),
        lambda: paced.select_prompts(adv.sigmoid(), 0.5, 1),
        lambda: estimators.log_partition_lse(lp, -1),
    ):
        with pytest.raises(TypeError, match="positional argument"):
            call()


def test_the_old_keywords_are_refused_in_one_line_naming_the_new():
    lp, old, adv, mask = _tokens()
    s, so = lp[:, 0], old[:, 0]
    w = torch.ones(4, dtype=F64)
    cases = [
        (lambda: lad.lad_loss(s, so, adv, eta=1.0, divergence="kl", weight=w), "lad_loss: 'weight' is now 'is_weight'"),
        (
            lambda: lad.lad_loss(s, so, adv, eta=1.0, divergence="kl", reduction="none"),
            "lad_loss: 'reduction' is now 'loss_agg' (reduction='mean' is loss_agg='token_mean')",
        ),
        (lambda: tb.tb_loss(s, weight=w), "tb_loss: 'weight' is now 'is_weight'"),
        (lambda: tb.disa_loss(s, so, adv, s, beta=1.0, weight=w), "disa_loss: 'weight' is now 'is_weight'"),
        (
            lambda: tb.tb_importance_weight(lp, old, mask, clip="max"),
            "tb_importance_weight: 'clip' is now 'weight_clip'",
        ),
        (
            lambda: diagnostics.weight_clip_fraction(w, clip="max"),
            "weight_clip_fraction: 'clip' is now 'weight_clip'",
        ),
    ]
    for call, message in cases:
        with pytest.raises(TypeError) as e:
            call()
        assert str(e.value) == message
        assert "\n" not in str(e.value)


def test_the_new_names_compute_what_the_old_did():
    """``is_weight`` multiplies each term, ``loss_agg='token_mean'`` is the plain mean and ``'none'``
    the per-sample terms; ``tb_loss`` / ``disa_loss`` weigh each squared residual by ``is_weight``."""
    lp, old, adv, _ = _tokens()
    s, so = lp[:, 0].requires_grad_(), old[:, 0]
    w = torch.tensor([0.5, 1.0, 2.0, 0.0], dtype=F64)
    per = lad.lad_loss(s, so, adv, eta=0.7, divergence="js", loss_agg="none").loss
    assert per.shape == (4,)
    weighted = lad.lad_loss(s, so, adv, eta=0.7, divergence="js", is_weight=w, loss_agg="none").loss
    torch.testing.assert_close(weighted, per * w, rtol=0, atol=0)
    torch.testing.assert_close(lad.lad_loss(s, so, adv, eta=0.7, divergence="js").loss, per.mean(), rtol=0, atol=0)
    with pytest.raises(ValueError, match="loss_agg of lad_loss must be 'token_mean' or 'none'"):
        lad.lad_loss(s, so, adv, eta=0.7, divergence="js", loss_agg="mean")  # type: ignore[arg-type]
    r = s - so
    torch.testing.assert_close(tb.tb_loss(r, is_weight=w).loss, (w * r * r).mean(), rtol=0, atol=0)
    d = tb.disa_loss(s, so, adv, torch.zeros(4, dtype=F64), beta=2.0, is_weight=w).loss
    torch.testing.assert_close(d, (w * (s - so - 2.0 * adv) ** 2).mean(), rtol=0, atol=0)


# ------------------------------------------------------------------- the GRPO family's tail, once
FAMILY = {
    pg.grpo_loss: pg.PolicyOptions,
    pg.cispo_loss: pg.PolicyOptions,
    pg.sapo_loss: pg.PolicyOptions,
    pg.vespo_loss: pg.AggOptions,
    pg.luspo_loss: pg.KlOptions,
    pg.gspo_loss: pg.SequenceOptions,
}


def _pair(key, b, t):
    """Two option sets that differ in ``key`` only (with what ``key`` needs to be read)."""
    ref = torch.zeros(b, t, dtype=F64) - 0.2
    kl = {"kl_coef": 0.1, "token_logp_ref": ref}
    return {
        "is_weight": ({}, {"is_weight": torch.tensor([0.5, 2.0, 1.0, 3.0], dtype=F64)}),
        "off_policy_threshold": ({}, {"off_policy_threshold": 1.0}),
        # 1.0: pi_old's drift keeps every row; the sampler's (5 nats) drops the rows with A < 0
        "token_logp_sampler": (
            {"off_policy_threshold": 1.0},
            {"off_policy_threshold": 1.0, "token_logp_sampler": torch.zeros(b, t, dtype=F64) + 5.0},
        ),
        "token_logp_ref": (kl, {**kl, "token_logp_ref": ref - 0.5}),
        "kl_coef": ({"token_logp_ref": ref}, kl),
        "kl_estimator": (kl, {**kl, "kl_estimator": "k2"}),
        "kl_ratio_weighted": (kl, {**kl, "kl_ratio_weighted": True}),
        "loss_agg": ({"loss_agg": "token_mean"}, {"loss_agg": "seq_mean_token_sum"}),
        "max_len": (
            {"loss_agg": "seq_mean_token_sum_norm", "max_len": 7},
            {"loss_agg": "seq_mean_token_sum_norm", "max_len": 3},
        ),
        "num_tokens": ({"loss_agg": "token_mean"}, {"loss_agg": "token_mean", "num_tokens": 3.0}),
        "log_ratio_clip": ({}, {"log_ratio_clip": 0.01}),
    }[key]


def test_the_shared_options_are_declared_once():
    """The TypedDicts nest (each loss takes a prefix of one list), and the tail's values are those keys."""
    keys = [set(td.__optional_keys__) for td in (pg.SequenceOptions, pg.KlOptions, pg.AggOptions, pg.PolicyOptions)]
    assert all(a < b for a, b in itertools.pairwise(keys))
    assert keys[-1] == {f.name for f in dataclasses.fields(pg._Tail)}


def _differs(a, b):
    if not torch.equal(a.loss, b.loss) or set(a.metrics) != set(b.metrics):
        return True
    return any(not torch.equal(torch.as_tensor(a.metrics[m]), torch.as_tensor(b.metrics[m])) for m in a.metrics)


@pytest.mark.parametrize("fn", list(FAMILY), ids=lambda f: f.__name__)
def test_each_family_loss_takes_exactly_its_shared_options(fn):
    """Every option of its TypedDict is read (changing it alone changes the loss or its metrics),
    every other shared option is refused as Python refuses an unknown keyword."""
    lp, old, _, mask = _tokens()
    adv = torch.tensor([0.5, -0.7, 1.2, -0.3], dtype=F64)
    b, t = lp.shape
    accepted = FAMILY[fn].__optional_keys__
    for key in pg.PolicyOptions.__optional_keys__:
        before, after = _pair(key, b, t)
        if key not in accepted:
            with pytest.raises(TypeError, match=f"{fn.__name__}\\(\\) got an unexpected keyword argument '{key}'"):
                fn(lp, old, adv, mask, **{key: after[key]})
            continue
        assert _differs(fn(lp, old, adv, mask, **before), fn(lp, old, adv, mask, **after)), f"{fn.__name__}: {key}"
