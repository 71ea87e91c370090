"""Trainers of the exact simulator, vectorized over seeds and prompts.

The policy is a tabular softmax: logits ``theta [S, P, K]`` (S seeds, P prompts, K outputs), float64.
This module only gathers log-probabilities of sampled (or, in exact-gradient mode, all) outputs,
rewards and reference log-probs, and hands them, as an ``ObjectiveBatch``, to the registry of objective
adapters (``tiltlab.objectives.registry``) that the TRL trainer (``llm/train/online/``) and the veRL
plug-in dispatch through too; each entry calls the public loss function below, so the simulator's checks
exercise the code that trains models:

===========================================  ===============================================================
``method`` / ``log_z``                       ``tiltlab.objectives`` function (the LLM trainer's objective)
===========================================  ===============================================================
``tb``, ``frozen`` (``exact``, ``zero``)     ``tb.disa_loss`` (``disa``; DISA §2.2 eq. (10))
``tb``, ``vargrad``                          ``tb.vargrad_log_z`` (detached) + ``tb.tb_residual`` / ``tb_loss``
                                             (``vargrad``)
``tb``, ``learned`` (``anchor=old``: PACED)  ``tb.tb_residual`` / ``tb.tb_loss`` with attached log Z (``paced``)
``flowrl``                                   ``tb.flowrl_loss`` (``flowrl``)
``lad``                                      ``lad.lad_loss`` (``lad``, sequence level)
``grpo`` / ``gspo``                          ``pg.grpo_loss`` / ``pg.gspo_loss``, ``pg.group_advantages``
``cispo`` / ``sapo``                         ``pg.cispo_loss`` / ``pg.sapo_loss`` (differ from ``grpo`` only off-policy:
                                             ``inner_steps`` > 1 or ``refresh_every`` > 1)
``offrl`` / ``fpa``                          ``offline.offrl_loss`` / ``offline.fpa_loss`` with
                                             ``offline.future_policy_logprobs`` (the LLM uses its fused form)
``dpo`` / ``sft``                            ``offline.dpo_loss`` / ``offline.sft_loss``
===========================================  ===============================================================

TB rollout weights come from ``tb.tb_importance_weight``; DISA's Stage-1 labels from
``objectives.estimators``; PACED's prompt selection and replay priority from ``objectives.paced``.
Paper references (short names of the paper index in ``docs/``): DISA §2 eqs. (5)-(10), FlowRL as coded
(``docs/math.md`` §2), PACED-RL Alg. 1 and eq. (6), LAD eq. (8), FPA eqs. (1), (3), (5) and App. B.2.

Sequences are one token long here (a bandit), so token tensors are ``[B, 1]`` with mask 1 and
``B = S * P * G`` (group-major: rows ``(s, p)`` hold one group of G samples).

Exact-gradient mode replaces a sample mean ``(1/G) sum_g l(y_g)``, ``y_g ~ q``, by the exact
expectation ``sum_y q(y) l(y)``: it passes all K outputs with weight ``K q(y)`` to the same loss
(``tb_loss`` / ``lad_loss`` / ``grpo_loss`` average over the batch, so the weights turn that average
into the expectation). The per-seed loss is the batch mean; seeds are summed so that they do not
interact through the optimizer.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from tiltlab.objectives import estimators as est
from tiltlab.objectives import lad as lad_obj
from tiltlab.objectives import offline as off_obj
from tiltlab.objectives import paced as paced_obj
from tiltlab.objectives import pg as pg_obj
from tiltlab.objectives import tb as tb_obj
from tiltlab.objectives.catalog import names
from tiltlab.objectives.metrics import tv_distance
from tiltlab.objectives.registry import ObjectiveBatch, get_objective
from tiltlab.sim import proposals
from tiltlab.sim.config import RunResult, SimConfig, pg_methods
from tiltlab.sim.envs import BanditEnv, gather


def tb_objective_name(log_z: str) -> str:
    """The registry entry of ``method="tb"`` with ``cfg.log_z``: a fixed label (``frozen``, ``exact``,
    ``zero``) -> ``disa``; ``vargrad`` -> ``vargrad``; ``learned`` -> ``tb`` (the log Z attached)."""
    names = {"frozen": "disa", "exact": "disa", "zero": "disa", "vargrad": "vargrad", "learned": "tb"}
    if log_z not in names:
        raise ValueError(f"unknown log_z {log_z!r}")
    return names[log_z]


__all__ = [
    "gradient_at",
    "kl_divergence",
    "stage1_log_z",
    "tb_objective_name",
    "train",
]


def kl_divergence(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """``KL(p || q) = sum_y p (log p - log q)`` over the last axis (0·log 0 = 0)."""
    p = logp.exp()
    return torch.where(p > 0, p * (logp - logq), torch.zeros_like(p)).sum(-1)


def make_proposal(
    kind: str, logp_anchor: torch.Tensor, logp_target: torch.Tensor, alpha=0.5, k=4, top_p=0.9
) -> torch.Tensor:
    """Stage-1 proposal over ``[..., K]`` (see :mod:`sim.proposals`)."""
    if kind == "ref":
        return proposals.ref_proposal(logp_anchor)
    if kind == "tilted":
        return proposals.tilted_proposal(logp_anchor, logp_target, alpha)
    if kind == "topk":
        return proposals.top_k_proposal(logp_anchor, k)
    if kind == "topp":
        return proposals.top_p_proposal(logp_anchor, top_p)
    raise ValueError(f"unknown proposal {kind!r} (ref|tilted|topk|topp)")


def stage1_log_z(
    logp_anchor: torch.Tensor,
    reward: torch.Tensor,
    beta: float,
    M: int,
    generator: torch.Generator,
    proposal: str = "ref",
    bias_correct: bool = False,
    **proposal_kw,
) -> torch.Tensor:
    """DISA Stage 1 (eqs. 7-8): ``log Z_hat_M = LSE_i(log w_i) - log M``, ``y_i ~ q``.

    Args:
        logp_anchor: ``[..., P, K]`` the distribution being tilted (pi_ref, or pi_old for PACED/LAD anchors).
        reward: ``[P, K]`` rewards (broadcast).
        M: samples per prompt.
    Returns:
        ``[..., P]`` labels (``objectives.estimators.log_partition_lse`` or its delta-method correction).
    """
    r = reward.expand_as(logp_anchor)
    logq = make_proposal(proposal, logp_anchor, torch.log_softmax(logp_anchor + beta * r, -1), **proposal_kw)
    idx = proposals.sample(logq, M, generator)  # [..., P, M]
    log_w = est.log_importance_weights(gather(logp_anchor, idx), gather(logq, idx), beta * gather(r, idx))
    return est.bias_corrected_log_partition(log_w) if bias_correct else est.log_partition_lse(log_w)


@dataclass
class _Batch:
    idx: torch.Tensor  # [S, P, G] sampled outputs
    w: torch.Tensor  # [S, P, G] weights (exact-mode K q, selection mask)
    logp_old: torch.Tensor  # [S, P, K] pi_old
    anchor: torch.Tensor  # [S, P, K] reference of the TB residual / LAD ratio
    replay: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = (
        None  # (prompt [S, C], output [S, C], valid [S, C])
    )


class _Trainer:
    """One simulator run: ``cfg.seeds`` tabular softmax policies trained on ``env`` at once.

    State: the logits ``theta [S, P, K]`` (and, for FlowRL / a learned TB log Z, a ``[S, P]`` log Z
    parameter) with their optimizer, ``pi_old`` (refreshed every ``cfg.refresh_every`` steps), DISA's
    frozen Stage-1 labels, PACED's replay buffer and the fixed offline data of the offline methods.

    Each step (:meth:`run`): select prompts (:meth:`select`, PACED), draw a batch from ``pi_old``
    (:meth:`make_batch`; exact-gradient mode passes every output weighted by ``K q(y)``), take
    ``cfg.inner_steps`` optimizer steps on :meth:`loss` (or :meth:`offline_loss`), push correct
    samples to the replay buffer, and log TV / KL to the target, reward and log Z errors (:meth:`record`).

    The loss is never written here: :meth:`loss` and :meth:`offline_loss` build an
    :class:`~tiltlab.objectives.registry.ObjectiveBatch` of one-token sequences (``[B, 1]``, mask 1)
    and call the registry entry that ``cfg.method`` (the entry of that name; ``tb``: :func:`tb_objective_name`) names for
    ``cfg.method`` -- the same adapter the TRL trainer and the veRL plug-in call -- with the options
    of :meth:`options`. Each seed's loss is its batch mean; seeds are summed (``S *`` the mean over
    all rows) so that they do not interact through the optimizer.
    """

    def __init__(self, cfg: SimConfig, env: BanditEnv):
        self.cfg, self.env = cfg, env
        S, P, K = cfg.seeds, env.P, env.K
        self.S, self.P, self.K = S, P, K
        self.gen = torch.Generator().manual_seed(int(cfg.seed))
        base = torch.zeros(P, K, dtype=torch.float64) if cfg.uniform_init else env.logp_ref.clone()
        theta = base.expand(S, P, K).clone()
        if cfg.init_scale > 0:
            theta = theta + cfg.init_scale * torch.randn(S, P, K, generator=self.gen, dtype=torch.float64)
        self.theta = theta.requires_grad_(True)
        groups = [{"params": [self.theta], "lr": cfg.lr}]
        self.logz_param = None
        if cfg.method == "flowrl" or (cfg.method == "tb" and cfg.log_z == "learned"):
            init = torch.zeros(S, P, dtype=torch.float64)
            if cfg.logz_init == "frozen":
                lz = stage1_log_z(
                    env.logp_ref.expand(S, P, K), env.reward, cfg.tilt_beta, cfg.frozen_M, self.gen, "ref"
                )
                init = lz if cfg.anchor == "ref" else cfg.tilt_beta * est.pass_rate_from_log_z(lz, beta=cfg.tilt_beta)
            self.logz_param = init.clone().requires_grad_(True)
            groups.append({"params": [self.logz_param], "lr": cfg.logz_lr})
        if cfg.optimizer == "adam":
            self.opt = torch.optim.Adam(groups)
        elif cfg.optimizer == "sgd":
            self.opt = torch.optim.SGD(groups)
        else:
            raise ValueError(f"optimizer must be adam|sgd, got {cfg.optimizer!r}")
        self.reward = env.reward  # [P, K]
        self.ref = env.logp_ref.expand(S, P, K)
        self.logp_old = torch.log_softmax(self.theta.detach(), -1)
        self.frozen = None
        self.frozen_ref_p = None
        if cfg.scheduler == "frozen" and cfg.select_m:
            # DISA's frozen Z (Stage 1 on pi_ref) turned into the reference pass rate (binary rewards).
            lz = stage1_log_z(self.ref, self.reward, cfg.tilt_beta, cfg.frozen_M, self.gen, "ref")
            self.frozen_ref_p = est.pass_rate_from_log_z(lz, beta=cfg.tilt_beta)
        self.buf = None
        if cfg.paced_replay:
            C = cfg.paced_replay_capacity
            self.buf = (
                torch.zeros(S, C, dtype=torch.long),
                torch.zeros(S, C, dtype=torch.long),
                torch.zeros(S, C, dtype=torch.bool),
            )
        self.hist: dict[str, list[float]] = {}
        self.reward_per_seed: list[torch.Tensor] = []  # per logged step: [S] mean over prompts of E_pi r
        self.update_terms: list[torch.Tensor] = []  # per rollout batch: [S, 2] fresh terms with weight > 0, replayed
        self.offline = None
        if cfg.method in names("sim", family="offline"):
            self.offline = self._offline_data()

    def _offline_data(self) -> dict:
        """Fixed offline data from pi_ref: ``G`` samples per prompt (Off-RL/FPA), plus ``G`` correct and
        ``G`` incorrect samples (pi_ref restricted to each class) for DPO pairs / SFT."""
        c, env = self.cfg, self.env
        if not env.binary:
            raise ValueError(f"offline methods need a binary-reward env, got {env.name}")
        ref = self.ref
        idx = proposals.sample(ref, c.G, self.gen)
        corr = env.reward.bool()
        if not bool(corr.any(-1).all()) or not bool((~corr).any(-1).all()):
            raise ValueError("offline pairs need a correct and an incorrect output for every prompt")
        w = proposals.sample(ref.masked_fill(~corr, float("-inf")), c.G, self.gen)
        lo = proposals.sample(ref.masked_fill(corr, float("-inf")), c.G, self.gen)
        return {"idx": idx, "w": w, "l": lo}

    # -- targets and log Z ----------------------------------------------------------------------
    @property
    def cfg_weight_clip(self) -> str:
        wc = self.cfg.weight_clip
        if wc == "auto":
            return "max" if self.cfg.method == "flowrl" else "one"
        return wc

    def anchor(self) -> torch.Tensor:
        return self.ref if self.cfg.anchor == "ref" else self.logp_old

    def tilt(self) -> torch.Tensor:
        """The log-tilt of the target: ``beta r`` (TB family) or ``A / eta`` (LAD and the policy-gradient methods)."""
        if self.cfg.method in ("lad", *pg_methods()):
            return self.reward / self.cfg.lad_eta
        return self.cfg.tilt_beta * self.reward

    def target(self) -> torch.Tensor:
        """``[S, P, K]``: pi* = anchor e^{tilt} normalized (LAD: ``lad_target_logprobs``)."""
        if self.cfg.method in ("lad", *pg_methods()):
            return lad_obj.lad_target_logprobs(
                self.logp_old, self.reward.expand_as(self.logp_old), eta=self.cfg.lad_eta
            )
        return torch.log_softmax(self.anchor() + self.tilt(), -1)

    def exact_log_z(self) -> torch.Tensor:
        return torch.logsumexp(self.anchor() + self.cfg.tilt_beta * self.reward, -1)  # [S, P]

    def refresh_frozen(self) -> None:
        c = self.cfg
        self.frozen = stage1_log_z(
            self.anchor(),
            self.reward,
            c.tilt_beta,
            c.frozen_M,
            self.gen,
            c.frozen_proposal,
            c.frozen_bias_correct,
            **self._prop_kw(),
        )

    def _prop_kw(self) -> dict:
        c = self.cfg
        if c.frozen_proposal == "tilted":
            return {"alpha": c.proposal_alpha}
        if c.frozen_proposal == "topk":
            return {"k": c.proposal_k}
        if c.frozen_proposal == "topp":
            return {"top_p": c.proposal_p}
        return {}

    def log_z_in_use(self) -> torch.Tensor:
        """``[S, P]`` log Z of the TB loss (``vargrad``'s depends on the batch: NaN here, see :meth:`tb_family_loss`)."""
        c = self.cfg
        if c.method == "flowrl" or c.log_z == "learned":
            return self.logz_param
        if c.log_z == "exact":
            return self.exact_log_z() + c.log_z_bias
        if c.log_z == "frozen":
            return self.frozen
        if c.log_z == "zero":
            return torch.zeros(self.S, self.P, dtype=torch.float64)
        if c.log_z == "vargrad":
            return torch.full((self.S, self.P), math.nan, dtype=torch.float64)
        raise ValueError(c.log_z)

    def p_hat(self) -> torch.Tensor:
        """``[S, P]`` accuracy estimate driving PACED selection."""
        c = self.cfg
        if c.scheduler == "logz":
            if self.logz_param is None:
                raise ValueError("scheduler='logz' needs a learned log Z (log_z='learned' or method='flowrl')")
            return paced_obj.accuracy_from_log_z(self.logz_param.detach(), kl_coef=1.0 / c.tilt_beta)
        if c.scheduler == "frozen":
            return self.frozen_ref_p
        if c.scheduler == "oracle":
            return self.env.pass_rate(self.logp_old)
        return torch.rand(self.S, self.P, generator=self.gen, dtype=torch.float64)

    # -- the loss -------------------------------------------------------------------------------
    def advantages(self, r: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        if c.advantage == "raw":
            return r
        G = r.shape[-1]
        scale = "std" if c.advantage == "group" else "none"
        if c.advantage not in ("group", "center"):
            raise ValueError(f"advantage must be raw|group|center, got {c.advantage!r}")
        return pg_obj.group_advantages(r.reshape(-1, G), scale=scale).reshape(r.shape)

    def tb_family_loss(self, b: _Batch, logp, lp, lp_old, lp_anchor, r) -> torch.Tensor:
        """Mean over seeds of the TB objective of ``cfg.log_z`` on the batch (plus replayed samples).

        The registry entry is the one the LLM trainer dispatches to for the same log Z
        (:func:`tb_objective_name`): a fixed label (``frozen``: DISA; ``exact`` / ``zero``: the same
        loss with another label) -> ``disa`` (``objectives.tb.disa_loss``); ``vargrad`` -> ``vargrad``
        with the detached ``objectives.tb.vargrad_log_z`` of the fresh groups; ``learned`` (PACED with
        ``anchor=old``) -> ``tb`` (``tb_residual`` / ``tb_loss`` with the log Z parameter attached).
        The rollout weight is computed here (fresh samples only; replayed ones weigh 1), so the
        adapter gets it as ``is_weight`` with the registry's default ``weight_clip="one"`` (no second weight).
        """
        c = self.cfg
        S, P, G = lp.shape
        B = S * P * G
        if c.log_z == "vargrad":
            log_z = tb_obj.vargrad_log_z(
                lp.reshape(-1, G), lp_anchor.reshape(-1, G), r.reshape(-1, G), beta=c.tilt_beta, detach=True
            ).reshape(S, P)
        else:
            log_z = self.log_z_in_use()
        w = b.w
        wc = self.cfg_weight_clip
        if wc != "one":
            ones = torch.ones(B, 1, dtype=lp.dtype)
            iw = tb_obj.tb_importance_weight(lp.reshape(B, 1), lp_old.reshape(B, 1), ones, weight_clip=wc).reshape(
                S, P, G
            )
            w = w * iw
        # per-sample rows [S, N]: the batch, then the replayed samples (weight 0 on empty buffer slots)
        rows = [(lp, lp_anchor, r, log_z[..., None].expand(S, P, G), w)]
        if b.replay is not None:
            pr, yr, valid = b.replay

            def at(t: torch.Tensor) -> torch.Tensor:  # t [S, P, K] at (prompt pr, output yr) -> [S, C]
                return torch.gather(t.gather(1, pr[..., None].expand(-1, -1, self.K)), -1, yr[..., None])[..., 0]

            rows.append((at(logp), at(b.anchor), self.reward[pr, yr], torch.gather(log_z, 1, pr), valid.to(lp.dtype)))
        # one-token sequences [S * N, 1] (mask 1: the adapter's sequence log-prob is the value itself)
        lp_all, an_all, r_all, lz_all, w_all = (
            torch.cat([x.reshape(S, -1) for x in col], 1).reshape(-1) for col in zip(*rows)
        )
        tok = lp_all[:, None]
        anchor = {"token_logp_ref": an_all[:, None]} if c.anchor == "ref" else {"token_logp_old": an_all[:, None]}
        batch = ObjectiveBatch(tok, torch.ones_like(tok), rewards=r_all, log_z=lz_all, is_weight=w_all, **anchor)
        return get_objective(tb_objective_name(c.log_z))(batch, tilt_beta=c.tilt_beta, anchor=c.anchor).loss

    def loss(self, b: _Batch) -> torch.Tensor:
        """Scalar loss = sum over seeds of each seed's batch-mean loss, from the registry entry
        ``cfg.method`` names (``tb``: :meth:`tb_family_loss`)."""
        c = self.cfg
        logp = torch.log_softmax(self.theta, -1)  # [S, P, K]
        lp = gather(logp, b.idx)  # [S, P, G]
        lp_old = gather(b.logp_old, b.idx)
        lp_anchor = gather(b.anchor, b.idx)
        r = gather(self.reward, b.idx)
        S, P, G = lp.shape
        B = S * P * G
        if c.method == "tb":
            return S * self.tb_family_loss(b, logp, lp, lp_old, lp_anchor, r)
        ones = torch.ones(B, 1, dtype=lp.dtype)
        tok, old, w = lp.reshape(B, 1), lp_old.reshape(B, 1), b.w.reshape(B)
        if c.method == "flowrl":
            batch = ObjectiveBatch(
                tok, ones, token_logp_old=old, token_logp_ref=lp_anchor.reshape(B, 1), rewards=r.reshape(S * P, G),
                log_z=self.logz_param.reshape(S * P), is_weight=w,
            )  # fmt: skip
        else:
            adv = self.advantages(r).reshape(B)
            ref = None
            if c.method in pg_methods() and c.method != "gspo":  # a KL term toward kl_anchor
                ref = (lp_old if c.kl_anchor == "old" else gather(self.ref, b.idx)).reshape(B, 1)
            batch = ObjectiveBatch(tok, ones, token_logp_old=old, token_logp_ref=ref, advantages=adv, is_weight=w)
        return S * get_objective(c.method)(batch, **self.options()).loss

    def options(self) -> dict:
        """The registry options of ``cfg.method`` (not ``tb``: :meth:`tb_family_loss`); another declared
        ``pg`` method takes the family's ``kl_coef`` and its declared defaults."""
        c = self.cfg
        kl = {"kl_coef": c.kl_coef}
        return {
            "flowrl": lambda: {
                "tilt_beta": c.tilt_beta, "logprob_scale": "mean", "group_normalize": c.flowrl_group_normalize,
                "weight_clip": self.cfg_weight_clip,
            },
            "lad": lambda: {"eta": c.lad_eta, "divergence": c.lad_divergence, "level": "sequence", "logprob_scale": "sum"},
            "grpo": lambda: {"clip_eps": c.clip_eps, **kl},
            "cispo": lambda: {"ratio_max": c.cispo_ratio_max, **kl},
            "sapo": lambda: {"temp_pos": c.sapo_temp_pos, "temp_neg": c.sapo_temp_neg, **kl},
            "gspo": lambda: {"clip_eps": c.clip_eps, "clip_eps_high": c.clip_eps},
            "offrl": lambda: {"kl_tau": c.offrl_kl_tau},
            "fpa": dict,
            "dpo": lambda: {"beta": c.dpo_beta},
            "sft": dict,
        }.get(c.method, lambda: dict(kl) if c.method in pg_methods() else {})()  # fmt: skip

    def offline_loss(self) -> torch.Tensor:
        """Off-RL / FPA / DPO / SFT on the fixed offline data (one-token sequences: |y| = 1), through
        the registry entry of ``cfg.method``."""
        c, d = self.cfg, self.offline
        logp = torch.log_softmax(self.theta, -1)
        S = self.S
        if c.method in ("offrl", "fpa"):
            idx = d["idx"]
            lp = gather(logp, idx).reshape(-1, 1)
            R = 2.0 * gather(self.reward, idx).reshape(-1) - 1.0  # {0,1} -> {-1,+1} (FPA eq. 1)
            extra = {"token_logp_ref": gather(self.ref, idx).reshape(-1, 1)}
            if c.method == "fpa":
                B = lp.shape[0]
                lt = self.theta.detach().unsqueeze(2).expand(S, self.P, idx.shape[-1], self.K).reshape(B, 1, self.K)
                lr = self.ref.unsqueeze(2).expand(S, self.P, idx.shape[-1], self.K).reshape(B, 1, self.K)
                extra = {"token_logp_future": off_obj.future_policy_logprobs(lt, lr, idx.reshape(B, 1), lam=c.fpa_lam)}
            batch = ObjectiveBatch(lp, torch.ones_like(lp), rewards=R, **extra)
        else:
            lw, ll = gather(logp, d["w"]).reshape(-1, 1), gather(logp, d["l"]).reshape(-1, 1)
            rw, rl = gather(self.ref, d["w"]).reshape(-1, 1), gather(self.ref, d["l"]).reshape(-1, 1)
            rejected = ObjectiveBatch(ll, torch.ones_like(ll), token_logp_ref=rl)
            batch = ObjectiveBatch(lw, torch.ones_like(lw), token_logp_ref=rw, rejected=rejected)
        return S * get_objective(c.method)(batch, **self.options()).loss

    # -- batches --------------------------------------------------------------------------------
    def make_batch(self, sel: torch.Tensor) -> _Batch:
        c = self.cfg
        logq = self.logp_old if c.temperature == 1.0 else proposals.temperature_proposal(self.logp_old, c.temperature)
        if c.exact:
            idx = torch.arange(self.K).expand(self.S, self.P, self.K)
            w = self.K * logq.exp()
        else:
            idx = proposals.sample(logq, c.G, self.gen)
            w = torch.ones(idx.shape, dtype=torch.float64)
        w = w * sel[..., None]
        replay = self.buf if (self.buf is not None and bool(self.buf[2].any())) else None
        if replay is not None and c.paced_replay_mode == "replace":
            w = w * self.fresh_kept(sel, replay[2].sum(1))
        return _Batch(idx, w, self.logp_old, self.anchor(), replay)

    def fresh_kept(self, sel: torch.Tensor, n_drop: torch.Tensor) -> torch.Tensor:
        """``[S, P, G]`` 0/1 mask of the fresh samples kept: all of seed ``s``'s selected prompts but ``n_drop[s]``.

        Dropped first: the highest sample index ``g``, round-robin over the selected prompts in prompt
        order (slot key ``(G - 1 - g) * P + p``), so the kept samples of a prompt are its first draws.
        """
        S, P, G = self.S, self.P, self.cfg.G
        g = torch.arange(G)
        key = ((G - 1 - g)[None, None, :] * P + torch.arange(P)[None, :, None]).expand(S, P, G).to(torch.float64)
        key = torch.where(sel[..., None] > 0, key, torch.full_like(key, math.inf)).reshape(S, -1)
        pos = torch.argsort(torch.argsort(key, dim=1, stable=True), dim=1)  # rank of each slot in drop order
        keep = (pos >= n_drop[:, None]).reshape(S, P, G).to(torch.float64)
        return keep * (sel[..., None] > 0)

    def select(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Selection mask ``[S, P]`` (PACED) and the estimate used."""
        c = self.cfg
        if not c.select_m:
            return torch.ones(self.S, self.P, dtype=torch.float64), None
        p_hat = self.p_hat()
        sel = torch.zeros(self.S, self.P, dtype=torch.float64)
        sel.scatter_(
            1, paced_obj.select_prompts(p_hat, tau=c.paced_tau, m=c.select_m), 1.0
        )  # every seed's prompt set at once
        return sel, p_hat

    def push_replay(self, b: _Batch, sel: torch.Tensor, p_hat: torch.Tensor | None) -> None:
        c = self.cfg
        r = gather(self.reward, b.idx)  # [S, P, G]
        G = r.shape[-1]
        if p_hat is None:
            p_hat = paced_obj.accuracy_from_log_z(self.logz_param.detach(), kl_coef=1.0 / c.tilt_beta)
        correct = r > 0.5  # as the LLM trainer: N_correct counts samples, not reward mass
        pri = paced_obj.replay_priority(correct.sum(-1).to(r.dtype), float(G), p_hat)  # [S, P]
        cand_pri = torch.where(
            correct & (sel[..., None] > 0), pri[..., None].expand_as(r), torch.full_like(r, -math.inf)
        )
        flat = cand_pri.reshape(self.S, -1)
        n_add = min(c.paced_replay_add, flat.shape[1])
        top = torch.argsort(-flat, dim=1, stable=True)[:, :n_add]
        new_valid = torch.isfinite(torch.gather(flat, 1, top))
        new_p = top // G
        new_y = torch.gather(b.idx.reshape(self.S, -1), 1, top)
        bp, by, bv = self.buf
        C = c.paced_replay_capacity
        # FIFO: newest first, oldest dropped (PACED: bounded age of the buffer)
        self.buf = (
            torch.cat([new_p, bp], 1)[:, :C],
            torch.cat([new_y, by], 1)[:, :C],
            torch.cat([new_valid, bv], 1)[:, :C],
        )

    # -- metrics --------------------------------------------------------------------------------
    def grad_variance(self, sel: torch.Tensor) -> float:
        """Mean over seeds/prompts of sum_k Var(dL/dtheta_k) across fresh batches at the current theta."""
        grads = []
        for _ in range(self.cfg.grad_var_draws):
            b = self.make_batch(sel)
            (g,) = torch.autograd.grad(self.loss(b), [self.theta])
            grads.append(g)
        g = torch.stack(grads)  # [D, S, P, K]
        return float(g.var(0).sum(-1).mean())

    def record(self, step: int, sel: torch.Tensor, p_hat: torch.Tensor | None) -> None:
        c = self.cfg
        with torch.no_grad():
            logp = torch.log_softmax(self.theta, -1)
            tgt = self.target()
            row = {
                "step": step,
                "tv": float(tv_distance(logp, tgt).mean()),
                "kl": float(kl_divergence(logp, tgt).mean()),
                "reward": float(self.env.expectation(logp, self.reward).mean()),
            }
            self.reward_per_seed.append(self.env.expectation(logp, self.reward).mean(-1))  # [S]
            if c.anchor == "old" or c.method in ("lad", *pg_methods()):
                p_pi = torch.log_softmax(logp - self.logp_old, -1)
                p_a = torch.log_softmax(self.tilt().expand_as(logp), -1)
                row["tv_ratio"] = float(tv_distance(p_pi, p_a).mean())
            if c.method in ("tb", "flowrl") and not (c.log_z == "vargrad" and c.method == "tb"):
                lz = self.log_z_in_use()
                row["log_z"] = float(lz.mean())
                row["log_z_err"] = float((lz - self.exact_log_z()).abs().mean())
            if p_hat is not None:
                p_true = self.env.pass_rate(self.logp_old)
                row["p_hat_err"] = float((p_hat - p_true).abs().mean())
                row["sel_p"] = float((p_true * sel).sum() / sel.sum())
        if c.grad_var_every and step % c.grad_var_every == 0 and self.offline is None:
            row["grad_var"] = self.grad_variance(sel)
        for k, v in row.items():
            self.hist.setdefault(k, []).append(v)

    # -- main loop ------------------------------------------------------------------------------
    def run(self) -> RunResult:
        c = self.cfg
        t0 = time.perf_counter()
        if c.method == "tb" and c.log_z == "frozen":
            self.refresh_frozen()
        it = range(c.steps)
        if c.progress:
            from tqdm import tqdm

            it = tqdm(it, desc=f"sim {c.method}/{c.log_z}", leave=False)
        sel, p_hat = self.select()
        self.record(0, sel, p_hat)
        for t in it:
            if t > 0 and t % c.refresh_every == 0:
                self.logp_old = torch.log_softmax(self.theta.detach(), -1)
                if c.method == "tb" and c.log_z == "frozen" and c.anchor == "old":
                    self.refresh_frozen()
            sel, p_hat = self.select()
            b = self.make_batch(sel) if self.offline is None else None
            if b is not None:
                n_replay = b.replay[2].sum(1) if b.replay is not None else torch.zeros(self.S, dtype=torch.long)
                self.update_terms.append(torch.stack([(b.w > 0).sum((1, 2)), n_replay], -1))
            for _ in range(c.inner_steps):
                self.opt.zero_grad(set_to_none=True)
                (self.loss(b) if b is not None else self.offline_loss()).backward()
                self.opt.step()
            if self.buf is not None and b is not None:
                self.push_replay(b, sel, p_hat)
            if (t + 1) % c.log_every == 0 or t + 1 == c.steps:
                self.record(t + 1, sel, p_hat)
        with torch.no_grad():
            logp = torch.log_softmax(self.theta, -1)
            res = RunResult(c, self.hist, logp, self.logp_old.clone(), self.target(), time.perf_counter() - t0)
        res.extra["reward_per_seed"] = torch.stack(
            self.reward_per_seed
        )  # [logged steps, S]: history["reward"] per seed
        if self.update_terms:
            terms = torch.stack(self.update_terms)  # [steps, S, 2]
            res.extra["update_terms"] = terms.sum(-1)  # [steps, S] sample terms of each optimizer step's loss
            res.extra["replay_terms"] = terms[..., 1]  # [steps, S] of which replayed
        if self.logz_param is not None:
            res.extra["log_z"] = self.logz_param.detach().clone()
        if self.frozen is not None:
            res.extra["frozen_log_z"] = self.frozen.clone()
        return res


def train(cfg: SimConfig, env: BanditEnv) -> RunResult:
    """Train ``cfg.seeds`` tabular policies on ``env`` with ``cfg.method``; see :class:`sim.api.SimConfig`."""
    cfg.validate()
    return _Trainer(cfg, env).run()


def gradient_at(
    cfg: SimConfig,
    env: BanditEnv,
    logits: torch.Tensor,
    logp_old: torch.Tensor | None = None,
    draws: int = 0,
) -> torch.Tensor:
    """Gradient of the configured loss w.r.t. the policy logits at ``logits [S, P, K]``.

    ``pi_old`` (the behaviour / anchor) is ``logp_old`` or, by default, ``log_softmax(logits)``
    (on-policy semi-gradient). With ``cfg.exact`` the result is the exact expected gradient
    ``[S, P, K]``; otherwise ``draws`` (>= 1) sampled batches give ``[draws, S, P, K]``.
    Scale: each seed's loss is its batch mean (see :mod:`sim.train`).
    """
    cfg.validate()
    tr = _Trainer(cfg, env)
    if logits.shape != tr.theta.shape:
        raise ValueError(f"logits must be [S, P, K]={tuple(tr.theta.shape)}, got {tuple(logits.shape)}")
    with torch.no_grad():
        tr.theta.copy_(logits)
    tr.logp_old = torch.log_softmax(logits, -1).detach() if logp_old is None else logp_old.detach()
    if cfg.method == "tb" and cfg.log_z == "frozen":
        tr.refresh_frozen()
    sel = torch.ones(tr.S, tr.P, dtype=torch.float64)
    if cfg.exact:
        (g,) = torch.autograd.grad(tr.loss(tr.make_batch(sel)), [tr.theta])
        return g
    if draws < 1:
        raise ValueError("sampled mode needs draws >= 1")
    return torch.stack([torch.autograd.grad(tr.loss(tr.make_batch(sel)), [tr.theta])[0] for _ in range(draws)])
