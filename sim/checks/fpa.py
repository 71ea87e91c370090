"""Numeric (layer="sim") checks of FPA's claims (FPA §3).

Losses and the future policy come from ``objectives.offline``; this module builds bandit and
token-tree instances and compares. Verdicts are computed from the measurements.
"""

from __future__ import annotations

import torch

from tiltlab.claims import stats
from tiltlab.claims.pinned import residual
from tiltlab.claims.registry import CheckResult, Verdict, register_check
from tiltlab.objectives import tb as tb_obj
from tiltlab.objectives.offline import dpo_loss, future_policy_logprobs, offrl_loss, simper_loss
from tiltlab.sim.experiments import fpa_entanglement
from tiltlab.sim.token_tree import TokenTree, ragged_mask

F64 = torch.float64


def _dpo_pair_losses(logits_theta, logits_ref, ids_w, ids_l, lam, beta):
    """DPO with the future policy (token-level normalization) vs DPO with beta_eff = (1+lam) beta.

    ``logits_* [2, B, T, V]`` (index 0: y_w, 1: y_l), ``ids_* [B, T]``. Returns (loss_fpa, loss_eff,
    margin_fpa [B], margin_eff [B]) where margins are the arguments of the sigmoid."""
    lp = torch.log_softmax(logits_theta, -1)
    lr = torch.log_softmax(logits_ref, -1)
    tok = lambda t, ids: t.gather(-1, ids.unsqueeze(-1)).squeeze(-1).sum(-1)
    lw, ll = tok(lp[0], ids_w), tok(lp[1], ids_l)
    rw, rl = tok(lr[0], ids_w), tok(lr[1], ids_l)
    fw = future_policy_logprobs(logits_theta[0], logits_ref[0], ids_w, lam=lam).sum(-1)
    fl = future_policy_logprobs(logits_theta[1], logits_ref[1], ids_l, lam=lam).sum(-1)
    loss_fpa = dpo_loss(fw, fl, rw, rl, beta=beta).loss
    loss_eff = dpo_loss(lw, ll, rw, rl, beta=(1 + lam) * beta).loss
    return loss_fpa, loss_eff, beta * ((fw - rw) - (fl - rl)), (1 + lam) * beta * ((lw - rw) - (ll - rl))


#: ``fpa.dpo_equiv``: relative value / gradient difference accepted as equality. float64 inputs stay float64 in
#: future_policy_logprobs: the identity holds to rounding (~1e-15); 1e-9 relative leaves room for log-softmax
#: cancellation of O(10) logits.
DPO_EQUIV_RTOL = 1e-9


@register_check(
    "fpa.dpo_equiv",
    layer="sim",
    expected=Verdict.VERIFIED,
    pins={"max_rel_value_err": residual(DPO_EQUIV_RTOL), "max_rel_grad_err": residual(DPO_EQUIV_RTOL)},
)
def dpo_equiv(seed: int) -> CheckResult:
    """Bandit idealization (one 'token' = the whole response, K = 16 outcomes): DPO on pi_hat
    (``future_policy_logprobs``) equals DPO with beta_eff = (1+lambda) beta, values and gradients."""
    g = torch.Generator().manual_seed(seed)
    B, K, beta = 64, 16, 0.1
    worst_val, worst_grad = 0.0, 0.0
    for lam in (0.5, 1.0, 2.0, 10.0):
        ref = torch.randn(B, 1, K, generator=g, dtype=F64)
        th = (ref + torch.randn(B, 1, K, generator=g, dtype=F64)).requires_grad_(True)
        yw = torch.randint(K, (B, 1), generator=g)
        yl = torch.randint(K, (B, 1), generator=g)
        both = lambda x: torch.stack([x, x])
        lf, le, _, _ = _dpo_pair_losses(both(th), both(ref), yw, yl, lam, beta)
        (gf,) = torch.autograd.grad(lf, th)
        (ge,) = torch.autograd.grad(le, th)
        worst_val = max(worst_val, abs(float((lf - le).detach())) / abs(float(le.detach())))
        worst_grad = max(worst_grad, float((gf - ge).norm() / ge.norm()))
    ok = worst_val < DPO_EQUIV_RTOL and worst_grad < DPO_EQUIV_RTOL
    return CheckResult(
        Verdict.VERIFIED if ok else Verdict.REFUTED,
        f"bandit idealization, lambda in {{0.5,1,2,10}}: max relative |L_DPO(pi_hat) - L_DPO(beta_eff)| = {worst_val:.1e}, "
        f"gradient relative error {worst_grad:.1e}",
        numbers={"max_rel_value_err": worst_val, "max_rel_grad_err": worst_grad},
    )


def token_level_deviation(context: str, drift: float, lam: float, seed: int, n_pairs: int = 256, beta: float = 0.1):
    """Token tree (V=6, L=6): mean |margin_FPA - margin_beta_eff| / mean |margin_beta_eff| and the
    relative loss / gradient differences, for theta = ref + drift * noise."""
    env = TokenTree(6, 6, context=context)
    g = torch.Generator().manual_seed(seed)
    ref = env.init_params(1.0, generator=g)
    theta = (ref + drift * torch.randn(ref.shape, generator=g, dtype=F64)).requires_grad_(True)
    ids_w = env.sample(ref, n_pairs, generator=g)
    ids_l = env.sample(ref, n_pairs, generator=g)
    lt = torch.stack([env.gather_logits(env.table(theta), ids_w), env.gather_logits(env.table(theta), ids_l)])
    lr = torch.stack([env.gather_logits(env.table(ref), ids_w), env.gather_logits(env.table(ref), ids_l)])
    lf, le, mf, me = _dpo_pair_losses(lt, lr, ids_w, ids_l, lam, beta)
    (gf,) = torch.autograd.grad(lf, theta, retain_graph=True)
    (ge,) = torch.autograd.grad(le, theta)
    return {
        "margin_rel_dev": float(((mf - me).abs().mean() / me.abs().mean()).detach()),
        "loss_rel_dev": abs(float((lf - le).detach())) / abs(float(le.detach())),
        "grad_rel_dev": float((gf - ge).norm() / ge.norm()),
        "grad_cos": float((gf * ge).sum() / (gf.norm() * ge.norm())),
    }


#: ``fpa.dpo_token_level``: relative margin deviation accepted as equality (float64 throughout; observed ~1e-15).
TOKEN_LEVEL_RTOL = 1e-9
#: ``fpa.dpo_token_level``: a mean relative margin deviation above this (1% of the margin) is material.
TOKEN_LEVEL_MATERIAL = 0.01


@register_check(
    "fpa.dpo_token_level",
    layer="sim",
    expected=Verdict.REFUTED,
    # per-position logits: margins equal to rounding, judged at TOKEN_LEVEL_RTOL; the loss and gradient deviations
    # are not judged (diagnostics of the same identity) and take its tolerance. The bigram_* ones are effects.
    pins={"position_d*_rel_dev": residual(TOKEN_LEVEL_RTOL)},
)
def dpo_token_level(seed: int) -> CheckResult:
    """Token-level normalization: the equivalence holds only when the per-token normalizers do not
    depend on the prefix (per-position logits) or theta = ref; with context-dependent logits
    (bigram, like an LLM) the DPO-FPA margin deviates from (1+lambda) beta Delta."""
    res = {}
    for ctx in ("position", "bigram"):
        for drift in (0.25, 1.0):
            res[f"{ctx}_d{drift:g}"] = token_level_deviation(ctx, drift, 2.0, seed)
    pos = max(r["margin_rel_dev"] for k, r in res.items() if k.startswith("position"))
    big = res["bigram_d1"]
    big_small = res["bigram_d0.25"]
    holds_position = pos < TOKEN_LEVEL_RTOL
    breaks_bigram = big["margin_rel_dev"] > TOKEN_LEVEL_MATERIAL
    verdict = (
        Verdict.REFUTED
        if (holds_position and breaks_bigram)
        else (Verdict.VERIFIED if big["margin_rel_dev"] < TOKEN_LEVEL_RTOL else Verdict.PARTLY)
    )
    return CheckResult(
        verdict,
        f"lambda=2: per-position logits -> margins equal to {pos:.1e} (normalizers cancel); prefix-dependent (bigram) "
        f"logits -> mean |margin dev|/|margin| = {big_small['margin_rel_dev']:.2f} at drift 0.25, "
        f"{big['margin_rel_dev']:.2f} at drift 1 (loss rel. dev {big['loss_rel_dev']:.1e}, gradient cosine "
        f"{big['grad_cos']:.3f}): the beta_eff equivalence is a bandit-level statement only",
        numbers={f"{k}_{m}": v for k, r in res.items() for m, v in r.items()},
    )


#: ``fpa.entanglement``'s items and margins (smallest effects of interest, in the item's units): log-prob changes
#: in nats (Off-RL "lowers" = by more than 0.5; the others 0.05, the "moved" threshold), accuracies 0.01.
#: ``*_not_below_0`` are non-inferiority items: not worse than lambda = 0 by more than the margin.
ENTANGLEMENT_MARGINS = {
    "offrl_lowers_correct": 0.5,
    "fpa1_keeps_correct": 0.05,
    "fpa2_keeps_correct": 0.05,
    "cor_only_faster": 0.05,
    "fpa1_not_below_0": 0.01,
    "fpa2_not_below_0": 0.01,
    "fpa10_not_below_0": 0.01,
}
NON_INFERIORITY = ("fpa1_not_below_0", "fpa2_not_below_0", "fpa10_not_below_0")
#: Per-item outcomes ``fpa.entanglement`` is known to return at CLAIM_CONFIG (20 paired seeds): the three
#: non-inferiority items are undecided under Holm.
ENTANGLEMENT_ITEMS = {
    **{f"{k}_supports": k not in NON_INFERIORITY for k in ENTANGLEMENT_MARGINS},
    **dict.fromkeys((f"{k}_against" for k in ENTANGLEMENT_MARGINS), False),
    "fpa_moves": True,
    "fpa_raises_acc": True,
}


def entanglement_decision(diffs: dict[str, list[float]], ran: dict[str, bool] | None = None) -> stats.Decision:
    """Holm over the seven items of :data:`ENTANGLEMENT_MARGINS` (paired 95% t intervals, paper's direction
    positive); a non-inferiority item ``d`` enters as ``d + margin`` with margin 0. ``ran``: FPA's "it
    ran" flags; any false refutes (:func:`entanglement_verdict`)."""
    items = {
        k: [v + ENTANGLEMENT_MARGINS[k] for v in diffs[k]] if k in NON_INFERIORITY else diffs[k]
        for k in ENTANGLEMENT_MARGINS
    }
    margins = {k: 0.0 if k in NON_INFERIORITY else m for k, m in ENTANGLEMENT_MARGINS.items()}
    return stats.decide(items, margins, "greater", ran=ran, not_ran="refuted")


def entanglement_verdict(decision: stats.Decision, fpa_learns: bool) -> Verdict:
    """FPA must learn (move the policy and raise accuracy: "it ran") before "keeps the correct log-probs"
    counts: otherwise refuted. Then :func:`stats.aggregate` over the items (all support -> verified)."""
    if not fpa_learns:
        return Verdict.REFUTED
    return Verdict(decision.verdict)


@register_check("fpa.entanglement", layer="sim", expected=Verdict.PARTLY, expected_items=ENTANGLEMENT_ITEMS)
def entanglement(seed: int) -> CheckResult:
    """Token-tree offline RL (fig09 setup, 20 paired seeds, 120 SGD steps): the claim's parts as paired items
    (:func:`entanglement_decision`), with FPA required to move the policy and raise accuracy (an FPA that
    stops learning keeps every log-prob). The best lambda by accuracy is recorded through its paired
    difference lambda 1-2 minus 10, not judged (a max over noisy arms is biased)."""
    claim = fpa_entanglement.entanglement_claim(seed)
    n, summ = claim["numbers"], claim["summary"]
    fin = summ["final"]
    ran = {"fpa_moves": bool(n["fpa_moves"]), "fpa_raises_acc": bool(n["fpa_raises_acc"])}
    dec = entanglement_decision(claim["diffs"], ran)
    learns = all(ran.values())
    items = {f"{k}_supports": it.outcome == stats.SUPPORTS for k, it in dec.items.items()}
    items |= {f"{k}_against": it.outcome == stats.AGAINST for k, it in dec.items.items()}
    items |= {"fpa_moves": bool(n["fpa_moves"]), "fpa_raises_acc": bool(n["fpa_raises_acc"])}
    return CheckResult(
        entanglement_verdict(dec, learns),
        f"{n['pairs']} paired seeds: Off-RL correct log-prob {fin['offrl']['corr']:+.2f} (acc {summ['ref_acc']:.3f}->"
        f"{fin['offrl']['acc']:.3f}); FPA lambda=1/2 correct {fin['fpa1']['corr']:+.2f}/{fin['fpa2']['corr']:+.2f}, acc "
        f"{fin['fpa1']['acc']:.3f}/{fin['fpa2']['acc']:.3f}; correct-only {fin['cor_only']['corr']:+.2f}; items (Holm, "
        "margins "
        + ", ".join(f"{k} {m:g}" for k, m in ENTANGLEMENT_MARGINS.items())
        + "): "
        + "; ".join(
            f"{k} {n[f'd_{k}']:+.3f} [{n[f'd_{k}_lo']:+.3f}, {n[f'd_{k}_hi']:+.3f}] {it.outcome}"
            for k, it in dec.items.items()
        )
        + f"; recorded: acc lambda 1-2 minus 10 {n['d_lam12_minus_10']:+.4f} [{n['d_lam12_minus_10_lo']:+.4f}, "
        f"{n['d_lam12_minus_10_hi']:+.4f}] (paper: 1-2 best)",
        numbers=n,
        figure="fig09_fpa_entanglement",
        items=items,
        evidence=dec.judgement.evidence(),
    )


def dpo_bandit_training(
    seed: int, beta: float, steps: int = 300, lr: float = 0.05, lam: float = 0.0, prompts: int = 64
) -> dict:
    """Train a softmax bandit (``prompts`` prompts, K = 16 outcomes, one preference pair (y_w, y_l) each) from
    pi_ref with Adam on ``dpo_loss`` (``lam > 0``: DPO on the future policy pi_hat of FPA eq. 5).

    Returns the mean change of log pi(y_w)/pi(y_l) over the pairs, the fraction of pairs whose ratio
    rose, and pi(y_l) at the start and the end (mean over pairs), plus pi(y_l) after ``steps // 10``."""
    return dpo_bandit_sweep(seed, (beta,), steps, lr, lam, prompts)[0]


def dpo_bandit_sweep(
    seed: int, betas: tuple[float, ...], steps: int = 300, lr: float = 0.05, lam: float = 0.0, prompts: int = 64
) -> list[dict]:
    """:func:`dpo_bandit_training` for each beta in ``betas`` (same instance), the runs trained side by side:
    one logits tensor ``[len(betas), prompts, 1, K]``, one backward of the sum of the per-beta losses and one
    Adam step per step. Each run's loss depends on its own slice only and Adam is elementwise, so every run
    takes the same steps as when trained alone (the numbers are identical; tests/sim pins this)."""
    g = torch.Generator().manual_seed(seed)
    B, K, R = prompts, 16, len(betas)
    ref = torch.randn(B, 1, K, generator=g, dtype=F64)
    yw = torch.randint(K, (B, 1), generator=g)
    yl = (yw + torch.randint(1, K, (B, 1), generator=g)) % K  # y_l != y_w
    th = ref.expand(R, B, 1, K).clone().requires_grad_(True)
    opt = torch.optim.Adam([th], lr=lr)
    yw_r, yl_r, ref_r = yw.expand(R, B, 1), yl.expand(R, B, 1), ref.expand(R, B, 1, K)

    def logp(t, y):
        return torch.log_softmax(t, -1).gather(-1, y.unsqueeze(-1)).squeeze(-1).sum(-1)

    rw, rl = logp(ref, yw), logp(ref, yl)
    pl_early = [float("nan")] * R
    for step in range(steps):
        if lam > 0:
            lw = future_policy_logprobs(th.flatten(0, 1), ref_r.flatten(0, 1), yw_r.flatten(0, 1), lam=lam)
            ll = future_policy_logprobs(th.flatten(0, 1), ref_r.flatten(0, 1), yl_r.flatten(0, 1), lam=lam)
            lw, ll = lw.sum(-1).view(R, B), ll.sum(-1).view(R, B)
        else:
            lw, ll = logp(th, yw_r), logp(th, yl_r)
        loss = sum(dpo_loss(lw[r], ll[r], rw, rl, beta=beta).loss for r, beta in enumerate(betas))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step + 1 == steps // 10:
            pl_early = [float(x) for x in logp(th.detach(), yl_r).exp().mean(-1)]
    out = []
    with torch.no_grad():
        for r in range(R):
            d = (logp(th[r], yw) - logp(th[r], yl)) - (rw - rl)
            out.append(
                {
                    "ratio_change": float(d.mean()),
                    "frac_raised": float((d > 0).double().mean()),
                    "pi_l_start": float(rl.exp().mean()),
                    "pi_l_early": pl_early[r],
                    "pi_l_end": float(logp(th[r], yl).exp().mean()),
                }
            )
    return out


@register_check("fpa.dpo_equiv", layer="sim", expected=Verdict.VERIFIED, name="dpo_training_raises_preferred_ratio")
def dpo_raises_ratio(seed: int) -> CheckResult:
    """DPO as implemented (``objectives.offline.dpo_loss``), alone and on FPA's pi_hat (lambda = 2), must
    raise log pi(y_w)/pi(y_l) above pi_ref's on every training pair: the equivalence check compares DPO
    only with itself, which a flipped margin (y_w and y_l swapped) would pass."""
    res = {
        "dpo": dpo_bandit_training(seed, 0.1, steps=100),
        "dpo_fpa2": dpo_bandit_training(seed, 0.1, steps=100, lam=2.0),
    }
    items = {f"{k}_raises_every_pair": r["frac_raised"] == 1.0 for k, r in res.items()}
    return CheckResult(
        Verdict.VERIFIED if all(items.values()) else Verdict.REFUTED,
        "bandit, 64 pairs, 100 Adam steps, beta 0.1: change of log pi(y_w)/pi(y_l) - ref "
        + "; ".join(
            f"{k} {r['ratio_change']:+.2f} (raised on {r['frac_raised']:.0%} of pairs)" for k, r in res.items()
        ),
        numbers={f"{k}_{m}": v for k, r in res.items() for m, v in r.items()},
        items=items,
    )


#: ``fpa.a4.loser_vanishes``: the betas and the bound on the final mean pi(y_l) relative to its start.
A4_BETAS = (0.1, 0.5, 2.0)
A4_FINAL_FRACTION = 0.1


@register_check(
    "fpa.a4.loser_vanishes",
    layer="sim",
    expected=Verdict.VERIFIED,
    name="dpo_bandit_beta_sweep",
    # The probabilities that have vanished (1e-26 .. 1e-7: they move with the CPU) are residuals. "Vanished" is
    # judged as pi_l_end < A4_FINAL_FRACTION * pi_l_start and pi_l_start <= 1, so A4_FINAL_FRACTION bounds them
    # (beta0.1_pi_l_early is judged only by end < early < start: it takes the bound of the criterion it belongs
    # to). The rest, beta2's pi(y_l) and the starts included, are pinned by value: exact names, no glob.
    pins={name: residual(A4_FINAL_FRACTION) for name in ("beta0.1_pi_l_early", "beta0.1_pi_l_end", "beta0.5_pi_l_end")},
)
def dpo_loser_vanishes(seed: int) -> CheckResult:
    """FPA App. A.4: DPO drives pi(y_l) towards 0 whatever beta. Softmax bandit, one pair per prompt,
    16 prompts, 3000 Adam steps per beta: pi(y_l) must keep falling (step 300 below the start, step 3000
    below step 300) and end below A4_FINAL_FRACTION of its start. Larger beta saturates the sigmoid
    sooner and slows the fall (beta 2: ~0.06 of the start after 3000 steps), but it does not stop it."""
    res = dict(zip(A4_BETAS, dpo_bandit_sweep(seed, A4_BETAS, steps=3000, prompts=16)))
    items = {
        f"beta{b:g}": r["pi_l_end"] < A4_FINAL_FRACTION * r["pi_l_start"]
        and r["pi_l_end"] < r["pi_l_early"] < r["pi_l_start"]
        for b, r in res.items()
    }
    return CheckResult(
        Verdict.VERIFIED if all(items.values()) else Verdict.REFUTED,
        "mean pi(y_l) start -> step 300 -> step 3000: "
        + "; ".join(
            f"beta {b:g}: {r['pi_l_start']:.3f} -> {r['pi_l_early']:.2e} -> {r['pi_l_end']:.2e}" for b, r in res.items()
        )
        + f" (must end below {A4_FINAL_FRACTION:g} x start and still falling)",
        numbers={f"beta{b:g}_{m}": v for b, r in res.items() for m, v in r.items()},
        items=items,
    )


def ragged_simper(seed: int, n_pairs: int = 64, eos: int = 1) -> dict:
    """SimPER vs Off-RL vs FPA eq. (2) on a bigram token tree (V = 4, L = 6) with ragged lengths (a
    sequence ends at its first ``eos``; padding after it keeps finite log-probs).

    The batch goes through the objectives as an LLM trainer would: ``sequence_logprob(token_logp,
    mask, "sum")`` for log pi(y), ``mask.sum`` for |y|, ``sequence_logprob(..., "mean")`` for the
    length-normalized log-prob (pi^{1/|y|} = exp(mean)). The reference is a loop over the sequences
    that reads only each sequence's own tokens. Returns the errors and the length histogram."""
    env = TokenTree(4, 6, context="bigram")
    g = torch.Generator().manual_seed(seed)
    params = env.init_params(1.0, generator=g).requires_grad_(True)
    ids_w = env.sample(params.detach(), n_pairs, generator=g)
    ids_l = env.sample(params.detach(), n_pairs, generator=g)
    tok_w, tok_l = env.token_logprobs(params, ids_w), env.token_logprobs(params, ids_l)
    m_w, m_l = ragged_mask(ids_w, eos), ragged_mask(ids_l, eos)
    lw, ll = tb_obj.sequence_logprob(tok_w, m_w, normalize="sum"), tb_obj.sequence_logprob(tok_l, m_l, normalize="sum")
    nw, nl = m_w.sum(-1), m_l.sum(-1)
    mean_w = tb_obj.sequence_logprob(tok_w, m_w, normalize="mean")
    (g_simper,) = torch.autograd.grad(simper_loss(lw, ll, nw, nl).loss, params, retain_graph=True)
    both = torch.cat([lw, ll])
    reward = torch.cat([torch.ones(n_pairs, dtype=F64), -torch.ones(n_pairs, dtype=F64)])
    (g_offrl,) = torch.autograd.grad(2 * offrl_loss(both, torch.cat([nw, nl]), reward).loss, params, retain_graph=True)
    # reference: FPA eq. (2) per sequence, -(1/B) sum_i (1/|y_i|) R_i pi_i^{1/|y_i|} grad log pi_i, with
    # log pi_i and |y_i| read from the sequence's own tokens (no mask, no padding)
    ref = torch.zeros_like(params)
    mean_err = 0.0
    for ids, tok, R in ((ids_w, tok_w, 1.0), (ids_l, tok_l, -1.0)):
        for i in range(n_pairs):
            row = ids[i].tolist()
            n = row.index(eos) + 1 if eos in row else len(row)
            lp_i = tok[i, :n].sum()
            (gi,) = torch.autograd.grad(lp_i, params, retain_graph=True)
            ref -= (R / n) * torch.exp(lp_i.detach() / n) * gi / n_pairs
            if R > 0:
                mean_err = max(mean_err, abs(float(mean_w[i].detach()) - float(lp_i.detach()) / n))
    scale = float(ref.norm())
    lengths = torch.cat([nw, nl])
    return {
        "simper_vs_eq2": float((g_simper - ref).norm()) / scale,
        "offrl_vs_eq2": float((g_offrl - ref).norm()) / scale,
        "mean_logprob_err": mean_err,
        "min_len": float(lengths.min()),
        "max_len": float(lengths.max()),
        "n_lengths": float(lengths.unique().numel()),
    }


#: ``fpa.simper``: float64 throughout: equality to 1e-10 relative (observed ~1e-15); a length-normalization slip
#: (dividing by the padded L, or summing padding) changes these by O(1).
SIMPER_RTOL = 1e-10


@register_check(
    "fpa.simper",
    layer="sim",
    expected=Verdict.VERIFIED,
    name="ragged_token_tree",
    expected_items={"ragged": True, "simper_eq_eq2": True, "offrl_eq_eq2": True, "length_mean_exact": True},
    pins={name: residual(SIMPER_RTOL) for name in ("simper_vs_eq2", "offrl_vs_eq2", "mean_logprob_err")},
)
def simper_ragged(seed: int) -> CheckResult:
    """Prop. A.1 with ragged lengths through the trainer's code path: grad SimPER == grad Off-RL ==
    FPA eq. (2), and the length-normalized log-prob equals each sequence's own token mean. With |y|
    equal for every sequence a normalization by the padded length cannot show; here |y| varies."""
    n = ragged_simper(seed)
    items = {
        "ragged": n["n_lengths"] >= 3,
        "simper_eq_eq2": n["simper_vs_eq2"] < SIMPER_RTOL,
        "offrl_eq_eq2": n["offrl_vs_eq2"] < SIMPER_RTOL,
        "length_mean_exact": n["mean_logprob_err"] < SIMPER_RTOL,
    }
    return CheckResult(
        Verdict.VERIFIED if all(items.values()) else Verdict.REFUTED,
        f"bigram token tree, |y| in {n['min_len']:g}..{n['max_len']:g} ({n['n_lengths']:g} distinct lengths, masked "
        f"padding): relative |grad SimPER - eq. 2| {n['simper_vs_eq2']:.1e}, |grad Off-RL - eq. 2| "
        f"{n['offrl_vs_eq2']:.1e}; max |masked mean log-prob - own-token mean| {n['mean_logprob_err']:.1e}",
        numbers=n,
        items=items,
    )
