"""Peer tests: TRL 1.16's other loss types (``cispo``, ``sapo``, ``luspo``, ``vespo``) and its
off-policy sequence mask / KL bias correction on the GRPO family, against
``tiltlab.objectives.pg`` in value AND gradient.

TRL's real ``GRPOTrainer._compute_loss`` runs on a stub trainer (the policy's per-token log-probs
are given), in train mode over a generation batch split into ``steps_per_generation``
micro-batches with ``current_gradient_accumulation_steps`` > 1 and ``num_items_in_batch`` the
generation batch's token count (optionally "two processes": TRL divides that count by
``num_processes``), and in eval mode. The sum of the micro-batch losses (what the optimizer steps
on) and its gradient must equal tiltlab's with TRL's normalization written out here: ``cispo`` /
``vespo`` / ``dapo`` divide the token sum by the window's token count (``num_tokens``), ``sapo`` /
``grpo`` take the sequence mean of token means and ``luspo`` the sequence mean of token sums, both
divided by the accumulation steps. Options are away from TRL's defaults (``epsilon_high`` as the
CISPO cap, SAPO temperatures with pos != neg, VESPO's k / lambda, LUSPO's clip range), the KL
term with and without ``use_bias_correction_kl``, vLLM's importance-sampling ratio per token and
per sequence, and ``off_policy_mask_threshold`` set so that some negative-advantage sequences are
dropped and others kept (from vLLM's ``sampling_per_token_logps`` with an unscored NaN token, and
from TRL's fallback ``old_per_token_logps``).

float64 on both sides, the same formula: agreement to 1e-12 (summation order only).
With ``CI`` set a missing TRL fails these tests instead of skipping them.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from tiltlab.objectives import pg

pytestmark = pytest.mark.peer

try:
    from trl import GRPOTrainer
except ImportError as e:  # the [llm] extra is not installed
    GRPOTrainer, _ERR = None, f"{type(e).__name__}: {e}"
else:
    _ERR = ""

_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
_HINT = f"TRL is not importable ({_ERR}): pip install -e '.[llm]'"
if GRPOTrainer is None and not _CI:
    pytest.skip(_HINT, allow_module_level=True)
if GRPOTrainer is None:  # CI: every test of this module fails with the reason
    pytestmark = [pytest.mark.peer, pytest.mark.usefixtures("_fail_without_trl")]


@pytest.fixture
def _fail_without_trl():
    pytest.fail(f"CI is set and {_HINT}")


F64 = torch.float64
TOL = {"rtol": 1e-12, "atol": 1e-12}
B, T = 8, 6
LENGTHS = [6, 2, 3, 5, 1, 6, 4, 3]
ADV = [1.3, -0.9, -1.4, 0.7, -0.4, -1.1, 0.0, -0.6]  # both signs and a zero (SAPO's tau, VESPO's k)

# per loss type: TRL's options away from their defaults, and our function's corresponding arguments.
# TRL builds SAPO's temperatures and VESPO's k / lambda per sequence with ``torch.where`` on Python
# floats, i.e. in float32 whatever the batch dtype: the values here are exact in float32 (0.6 would
# leave a 1e-8 relative difference that is TRL's rounding, not a formula difference).
OPTS = {
    "cispo": ({"epsilon": 0.2, "epsilon_high": 1.3}, {"ratio_max": 1.3}),
    "sapo": ({"sapo_temperature_pos": 0.625, "sapo_temperature_neg": 1.75}, {"temp_pos": 0.625, "temp_neg": 1.75}),
    "luspo": ({"epsilon": 0.08, "epsilon_high": 0.12}, {"clip_eps": 0.08, "clip_eps_high": 0.12}),
    "vespo": (
        {"vespo_k_pos": 1.5, "vespo_lambda_pos": 2.5, "vespo_k_neg": 2.5, "vespo_lambda_neg": 1.25},
        {"k_pos": 1.5, "lambda_pos": 2.5, "k_neg": 2.5, "lambda_neg": 1.25},
    ),
    "grpo": ({"epsilon": 0.15, "epsilon_high": 0.25}, {"clip_eps": 0.15, "clip_eps_high": 0.25}),
    "dapo": ({"epsilon": 0.15, "epsilon_high": 0.25}, {"clip_eps": 0.15, "clip_eps_high": 0.25}),
}
FN = {
    "cispo": pg.cispo_loss,
    "sapo": pg.sapo_loss,
    "luspo": pg.luspo_loss,
    "vespo": pg.vespo_loss,
    "grpo": pg.grpo_loss,
    "dapo": pg.grpo_loss,
}
WINDOW_TOKENS = ("cispo", "vespo", "dapo")  # TRL's window token count normalization
TRL_DEFAULTS = {
    "epsilon": 0.2,
    "epsilon_high": None,
    "sapo_temperature_pos": 1.0,
    "sapo_temperature_neg": 1.05,
    "vespo_k_pos": 2.0,
    "vespo_lambda_pos": 3.0,
    "vespo_k_neg": 3.0,
    "vespo_lambda_neg": 2.0,
}

# option sets: beta, use_bias_correction_kl, vLLM IS ratio (None | token | sequence), off-policy mask source
CASES = {
    "plain": dict(beta=0.0, bias_kl=False, isr=None, opsm=None),
    "kl": dict(beta=0.2, bias_kl=False, isr=None, opsm=None),
    "kl_bias_corrected": dict(beta=0.2, bias_kl=True, isr=None, opsm=None),
    "isr_token": dict(beta=0.0, bias_kl=False, isr="token", opsm=None),
    "isr_sequence": dict(beta=0.0, bias_kl=False, isr="sequence", opsm=None),
    "opsm_sampler": dict(beta=0.0, bias_kl=False, isr=None, opsm="sampler"),
    "opsm_old": dict(beta=0.0, bias_kl=False, isr=None, opsm="old"),
    "all": dict(beta=0.2, bias_kl=True, isr="token", opsm="sampler"),
}
# (current_gradient_accumulation_steps, steps_per_generation, num_processes, mode)
ACCUM = [(2, 2, 1, "train"), (2, 4, 2, "train"), (4, 4, 1, "train"), (2, 2, 1, "eval")]
THRESHOLD = 0.05  # between the per-sequence KLs of the negative-advantage rows (test_the_off_policy_mask_binds)


def _data(seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.arange(T)[None, :] < torch.tensor(LENGTHS)[:, None]).to(F64)
    logp = -torch.rand(B, T, generator=g, dtype=F64) * 2 - 0.05
    old = logp + 0.35 * torch.randn(B, T, generator=g, dtype=F64)
    ref = logp + 0.3 * torch.randn(B, T, generator=g, dtype=F64)
    sampler = old + 0.25 * torch.randn(B, T, generator=g, dtype=F64)
    sampler[2, 1] = math.nan  # a token vLLM could not score (TRL: no evidence of drift)
    isr_tok = torch.where(mask > 0, torch.rand(B, T, generator=g, dtype=F64) + 0.5, torch.ones(B, T, dtype=F64))
    isr_seq = torch.rand(B, 1, generator=g, dtype=F64) + 0.5
    return dict(logp=logp, old=old, ref=ref, sampler=sampler, mask=mask, isr_tok=isr_tok, isr_seq=isr_seq)


def _trl_stub(loss_type, case, logp, ga, spg, procs, mode):
    trl_opts = {**TRL_DEFAULTS, **OPTS[loss_type][0]}
    args = SimpleNamespace(
        delta=None,
        use_bias_correction_kl=case["bias_kl"],
        steps_per_generation=spg,
        **{k: v for k, v in trl_opts.items() if k not in ("epsilon", "epsilon_high")},
    )
    eps_high = trl_opts["epsilon_high"]
    return SimpleNamespace(
        args=args,
        accelerator=SimpleNamespace(
            num_processes=procs,
            device=torch.device("cpu"),
            sync_gradients=True,
            gather=lambda x: x,
            reduce=lambda x, reduction="sum": x,
        ),
        model=SimpleNamespace(training=mode == "train"),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        current_gradient_accumulation_steps=ga,
        loss_type=loss_type,
        beta=case["beta"],
        epsilon_low=trl_opts["epsilon"],
        epsilon_high=trl_opts["epsilon"] if eps_high is None else eps_high,
        importance_sampling_level="sequence" if loss_type == "luspo" else "token",
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=THRESHOLD if case["opsm"] else None,
        use_vllm=case["isr"] is not None,
        vllm_importance_sampling_correction=case["isr"] is not None,
        max_completion_length=T + 2,
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        get_off_policy_mask=GRPOTrainer.get_off_policy_mask,  # TRL's own static methods
        get_gamma_weights=GRPOTrainer.get_gamma_weights,
        _get_per_token_logps_and_entropies=lambda model, ids, *a, **k: (logp[ids[:, 0]], torch.ones_like(logp[ids[:, 0]]), None),
    )  # fmt: skip


def _inputs(d, rows, case):
    idx = torch.arange(B)[rows]
    out = {
        "prompt_ids": idx[:, None],  # the stub's log-probs are looked up by this row index
        "prompt_mask": torch.ones(len(idx), 1, dtype=torch.long),
        "completion_ids": torch.zeros(len(idx), T, dtype=torch.long),
        "completion_mask": d["mask"][rows].long(),
        "advantages": torch.tensor(ADV, dtype=F64)[rows],
        "old_per_token_logps": d["old"][rows],
        "ref_per_token_logps": d["ref"][rows],
        "num_items_in_batch": d["mask"].sum(),  # the whole generation batch (TRL, gathered over processes)
    }
    if case["isr"] is not None:
        out["importance_sampling_ratio"] = (d["isr_tok"] if case["isr"] == "token" else d["isr_seq"])[rows]
    if case["opsm"] == "sampler":
        out["sampling_per_token_logps"] = d["sampler"][rows]
    return out


def _ours(loss_type, case, x, micro, ga, spg, procs, mode):
    """tiltlab's loss for one micro-batch, with TRL's normalization written out (module docstring)."""
    kw = dict(OPTS[loss_type][1])
    n_rows = micro["advantages"].shape[0]
    if case["beta"]:
        kw.update(token_logp_ref=micro["ref_per_token_logps"], kl_coef=case["beta"], kl_ratio_weighted=case["bias_kl"])
    isr = micro.get("importance_sampling_ratio")
    if isr is not None:
        kw["is_weight"] = isr[:, 0] if isr.shape[1] == 1 else isr
    if case["opsm"]:
        kw.update(off_policy_threshold=THRESHOLD, token_logp_sampler=micro.get("sampling_per_token_logps"))
    accum = ga if mode == "train" else 1
    if loss_type in WINDOW_TOKENS:
        kw["loss_agg"] = "token_mean"
        kw["num_tokens"] = micro["num_items_in_batch"] / procs * (ga / spg if mode == "train" else 1.0)
    elif loss_type in ("grpo", "sapo"):
        kw["loss_agg"] = "seq_mean_token_mean"
    rows = micro["prompt_ids"][:, 0]
    loss = FN[loss_type](
        x[rows], micro["old_per_token_logps"], micro["advantages"], micro["completion_mask"].to(F64), **kw
    ).loss
    assert loss.shape == () and n_rows > 0
    return loss if loss_type in WINDOW_TOKENS else loss / accum


def _accumulated(compute, loss_type, case, ga, spg, procs, mode, seed=0):
    """The sum of one generation batch's micro-batch losses and its gradient w.r.t. the log-probs."""
    d = _data(seed)
    x = d["logp"].clone().requires_grad_(True)
    parts = spg if mode == "train" else 1
    total = torch.zeros((), dtype=F64)
    for p in range(parts):
        rows = slice(p * B // parts, (p + 1) * B // parts)
        micro = _inputs(d, rows, case)
        total = total + compute(x, micro)
    (grad,) = torch.autograd.grad(total, x)
    return total.detach(), grad


def _trl(loss_type, case, ga, spg, procs, mode):
    def compute(x, micro):
        return GRPOTrainer._compute_loss(_trl_stub(loss_type, case, x, ga, spg, procs, mode), None, micro)

    return _accumulated(compute, loss_type, case, ga, spg, procs, mode)


def _tilt(loss_type, case, ga, spg, procs, mode):
    return _accumulated(
        lambda x, micro: _ours(loss_type, case, x, micro, ga, spg, procs, mode), loss_type, case, ga, spg, procs, mode
    )


PEER_CASES = [
    (lt, name, acc)
    for lt in ("cispo", "sapo", "luspo", "vespo", "grpo", "dapo")
    for name in CASES
    if not (lt == "vespo" and name == "isr_sequence")  # TRL refuses sequence-level IS ratios for VESPO
    for acc in ACCUM
]


@pytest.mark.parametrize(
    ("loss_type", "case", "accum"),
    PEER_CASES,
    ids=[f"{lt}-{c}-ga{a[0]}spg{a[1]}np{a[2]}-{a[3]}" for lt, c, a in PEER_CASES],
)
def test_matches_trl_compute_loss(loss_type, case, accum):
    want = _trl(loss_type, CASES[case], *accum)
    got = _tilt(loss_type, CASES[case], *accum)
    torch.testing.assert_close(got[0], want[0], **TOL)
    torch.testing.assert_close(got[1], want[1], **TOL)
    assert float(want[1].abs().max()) > 0


@pytest.mark.parametrize("loss_type", ["cispo", "sapo", "luspo", "vespo"])
def test_the_options_bind(loss_type):
    # TRL at its defaults gives another loss here: a dropped option would not pass the peer tests
    # (not with the off-policy mask: it drops the negative-advantage rows that LUSPO's clip binds on)
    case, acc = CASES["kl_bias_corrected"], ACCUM[0]
    got = _tilt(loss_type, case, *acc)[0]
    saved = OPTS[loss_type]
    try:
        OPTS[loss_type] = ({}, {})
        default_trl = _trl(loss_type, case, *acc)[0]
    finally:
        OPTS[loss_type] = saved
    assert abs(float(got - default_trl)) > 1e-3


@pytest.mark.parametrize("source", ["sampler", "old"])
def test_the_off_policy_mask_binds_and_matches_trl(source):
    # some negative-advantage sequences are dropped, others kept, at THRESHOLD; TRL's own mask agrees
    d = _data()
    adv = torch.tensor(ADV, dtype=F64)
    samp = d["sampler"] if source == "sampler" else d["old"]
    keep = pg.off_policy_sequence_mask(d["logp"], samp, adv, d["mask"], threshold=THRESHOLD)
    want = GRPOTrainer.get_off_policy_mask(adv[:, None], d["logp"], samp, d["mask"], THRESHOLD)[:, 0]
    torch.testing.assert_close(keep, want, rtol=0, atol=0)
    neg = adv < 0
    assert 0 < int((keep[neg] == 0).sum()) < int(neg.sum())
    assert bool((keep[~neg] == 1).all())


def test_vespo_gamma_weight_matches_trl():
    d = _data()
    adv = torch.tensor(ADV, dtype=F64)
    k = OPTS["vespo"][1]
    log_ratio = d["logp"] - d["old"]
    want = GRPOTrainer.get_gamma_weights(
        adv[:, None], log_ratio, d["mask"], d["isr_tok"], k_pos=k["k_pos"], lambda_pos=k["lambda_pos"],
        k_neg=k["k_neg"], lambda_neg=k["lambda_neg"],
    )[:, 0]  # fmt: skip
    m = pg.vespo_loss(d["logp"], d["old"], adv, d["mask"], is_weight=d["isr_tok"], **k).metrics
    torch.testing.assert_close(m["phi_mean"], want.mean(), **TOL)
    assert float(want.std()) > 1e-2  # the weights differ between sequences here
