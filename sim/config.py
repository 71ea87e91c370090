"""The simulator's configuration and result types: :class:`SimConfig` (one experiment) and :class:`RunResult`.

A base module of ``tiltlab.sim``: the trainers (``sim.train``) and the entry point (``sim.api``) import
it; it imports nothing of the simulator.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # only annotations: importing the config must not import torch
    import torch

from tiltlab.dataclass_cli import did_you_mean
from tiltlab.objectives.catalog import check_knobs, knob_fields, names, options_dataclass, refuse_old_names

__all__ = ["LOG_Z_MODES", "RENAMED_FIELDS", "RunResult", "SimConfig", "methods", "pg_methods"]


def methods() -> tuple[str, ...]:
    """The simulator's ``method`` names: ``tb`` (the TB entries declared with tag ``sim_tb``, chosen by
    ``log_z``) and every other objective declared with trainer ``sim``, in the declared order."""
    return ("tb", *(n for n in names("sim") if n not in names(tag="sim_tb")))


def pg_methods() -> tuple[str, ...]:
    """The reward-maximising policy-gradient methods (family ``pg``: advantage-weighted; their target is
    LAD's pi_old e^{A/eta})."""
    return names("sim", family="pg")


LOG_Z_MODES = ("exact", "frozen", "learned", "vargrad", "zero")


_SimKnobs = options_dataclass("_SimKnobs", knob_fields("sim"))
"""The declared objectives' own knobs the simulator reads (``lad_eta``, ``lad_divergence``, ``paced_tau``,
``paced_replay*``, ``fpa_lam``, ``offrl_kl_tau``, ``dpo_beta``: :func:`~tiltlab.objectives.catalog.knob_fields`
of ``sim``, with the simulator's defaults), under the names the TRL and offline trainers' configs give them."""

RENAMED_FIELDS = {
    "beta": "tilt_beta",
    "eta": "lad_eta",
    "divergence": "lad_divergence",
    "tau": "paced_tau",
    "replay": "paced_replay",
    "replay_capacity": "paced_replay_capacity",
    "replay_add": "paced_replay_add",
    "replay_mode": "paced_replay_mode",
    "fpa_lambda": "fpa_lam",
    "offline_kl_tau": "offrl_kl_tau",
}
"""The simulator's old field names -> their one name (refused by :class:`SimConfig` and ``tiltlab sim``)."""


@dataclass
class SimConfig(_SimKnobs):
    """One simulator experiment. Every field is also a ``tiltlab sim --<field>`` option. The objectives'
    own knobs (``lad_*``, ``paced_*``, ``fpa_lam``, ``offrl_kl_tau``, ``dpo_beta``) are the fields of their
    declared :attr:`~tiltlab.objectives.catalog.Spec.knobs`; an old name (:data:`RENAMED_FIELDS`) is refused
    naming the new one."""

    # --- environment ---------------------------------------------------------------------------
    env: str = "multiprompt"
    """``multiprompt`` (binary rewards, pass rates p_min..p_max), ``bandit`` (K arms, Gaussian rewards),
    ``lad_bandit`` (LAD Fig. 1: 50 arms, three-mode advantage) or ``two_outcome`` (DISA App. C.5 counterexample)."""
    P: int = 16
    """Number of prompts (``multiprompt`` only; the bandits have one)."""
    K: int = 16
    """Outputs per prompt (arms). ``lad_bandit`` defaults to 50 when K is left at 16."""
    env_seed: int = 0
    """Seed of the environment's random construction (independent of the training seeds)."""
    p_min: float = 0.01
    """Hardest reference pass rate (``multiprompt``)."""
    p_max: float = 0.9
    """Easiest reference pass rate (``multiprompt``)."""

    # --- objective -----------------------------------------------------------------------------
    method: str = "tb"
    """``tb`` (trajectory balance, DISA eq. 5/10), ``flowrl`` (FlowRL's coded loss, docs/math.md §2),
    ``lad`` (LAD eq. 8), ``grpo`` (clipped surrogate, optional KL), ``gspo`` (sequence ratio), ``cispo`` (clipped
    stop-gradient IS weight, MiniMax-M1), ``sapo`` (sigmoid-gated ratio, Qwen); offline on a
    fixed dataset drawn once from pi_ref (binary rewards): ``offrl`` (FPA eq. 1, R = 2r - 1), ``fpa`` (FPA eq. 3),
    ``dpo`` (pairs: a correct and an incorrect sample of pi_ref per slot), ``sft`` (correct samples)."""
    tilt_beta: float = 1.0
    """The tilt beta multiplying the reward (DISA convention; the name it has in every config). PACED's
    ``kl_coef`` is ``1/tilt_beta``."""
    anchor: str = "ref"
    """Reference of the TB residual / target: ``ref`` (pi_ref, DISA/FlowRL) or ``old`` (pi_old, PACED eq. 6 and LAD)."""
    log_z: str = "exact"
    """TB log Z: ``exact`` (enumerated), ``frozen`` (DISA Stage-1 IS label, detached), ``learned``
    (a per-prompt parameter trained jointly, FlowRL), ``vargrad`` (batch-optimal, PACED/VarGrad), ``zero``."""
    log_z_bias: float = 0.0
    """A prompt-only bias b added to the exact log Z (``log_z=exact``): DISA App. C.3 Prop. 3(ii) / App. C.5."""
    frozen_M: int = 8
    """Stage-1 samples per prompt for ``log_z=frozen`` (DISA uses 8)."""
    frozen_proposal: str = "ref"
    """Stage-1 proposal: ``ref`` (pi_ref), ``tilted`` (pi_ref^{1-a} pi*^a), ``topk``, ``topp``."""
    proposal_alpha: float = 0.5
    """Tilt strength a of the ``tilted`` proposal."""
    proposal_k: int = 4
    """k of the ``topk`` proposal."""
    proposal_p: float = 0.9
    """p of the ``topp`` proposal."""
    frozen_bias_correct: bool = False
    """Use the delta-method bias-corrected label instead of the plain LSE label."""
    flowrl_group_normalize: bool = True
    """FlowRL: group-normalize rewards (its code); False uses raw rewards."""
    weight_clip: str = "auto"
    """TB/FlowRL rollout weight w = pi/pi_old (detached): ``one`` (w = 1, no correction), ``max``
    (FlowRL's code, min(w, 10)), ``eps`` (FlowRL's paper, clip to [0.8, 1.2]), ``ratio`` (unclipped);
    ``auto`` = ``one`` for ``tb`` and ``max`` for ``flowrl``."""
    advantage: str = "raw"
    """Advantages for LAD/GRPO/GSPO/CISPO/SAPO: ``raw`` (the reward itself, e.g. LAD's bandit A), ``group``
    (GRPO group normalization), ``center`` (group mean-centering)."""
    clip_eps: float = 0.2
    """GRPO/GSPO clip epsilon."""
    kl_coef: float = 0.0
    """GRPO/CISPO/SAPO KL penalty weight (k3 estimator) toward ``kl_anchor``."""
    cispo_ratio_max: float = 5.0
    """CISPO's cap on the stop-gradient IS weight (``pg.cispo_loss``'s ``ratio_max``; TRL's ``epsilon_high`` for
    ``loss_type="cispo"``: 5.0). CISPO differs from GRPO only off-policy (``inner_steps`` > 1 or ``refresh_every`` > 1)."""
    sapo_temp_pos: float = 1.0
    """SAPO's gate temperature for positive advantages (``pg.sapo_loss``'s ``temp_pos``; TRL: 1.0)."""
    sapo_temp_neg: float = 1.05
    """SAPO's gate temperature for non-positive advantages (``pg.sapo_loss``'s ``temp_neg``; TRL: 1.05)."""
    kl_anchor: str = "old"
    """GRPO/CISPO/SAPO KL anchor: ``old`` (LAD's bandit baseline) or ``ref``."""

    # --- sampling / optimisation ---------------------------------------------------------------
    steps: int = 300
    """Rollout batches (each followed by ``inner_steps`` optimizer steps)."""
    G: int = 8
    """Samples per prompt per rollout batch."""
    temperature: float = 1.0
    """Sampling temperature applied to pi_old (LAD Fig. 1 uses 1.5; losses still use untempered pi_old)."""
    exact: bool = False
    """Exact-gradient mode: every loss that is a mean over samples y ~ q is replaced by its exact
    expectation sum_y q(y)(...) over all K outputs (TB, LAD, GRPO with raw advantages)."""
    inner_steps: int = 1
    """Optimizer steps per rollout batch (>1: off-policy drift between pi_old and pi_theta)."""
    refresh_every: int = 1
    """pi_old <- pi_theta every this many rollout batches (LAD Fig. 1 refreshes twice in 4000)."""
    optimizer: str = "adam"
    """``adam`` or ``sgd``."""
    lr: float = 0.05
    """Learning rate of the policy logits."""
    logz_lr: float = 0.1
    """Learning rate of a learned log Z."""
    logz_init: str = "zero"
    """Initial value of a learned log Z: ``zero``, or ``frozen`` (from DISA's Stage-1 IS label on pi_ref:
    the label itself for ``anchor=ref``; ``beta * p_ref_hat`` (p_ref_hat from the label, binary rewards) for
    ``anchor=old``, the PACED optimum ``log Z* = beta p_old + KL`` at the start where KL = 0)."""
    init_scale: float = 0.0
    """Initial policy logits = reference logits + N(0, init_scale^2) (0: start at pi_ref)."""
    uniform_init: bool = False
    """Start from the uniform policy instead of pi_ref."""

    # --- PACED ----------------------------------------------------------------------------------
    select_m: int = 0
    """PACED prompt selection: train on the m prompts whose estimated accuracy is nearest ``tau`` (0 = all)."""
    scheduler: str = "logz"
    """Accuracy estimate used for selection: ``logz`` (PACED: clip(log Z_phi / beta)), ``frozen``
    (DISA's frozen Z -> reference pass rate), ``oracle`` (exact p_old), ``random``."""

    # --- bookkeeping ----------------------------------------------------------------------------
    seeds: int = 4
    """Independent training runs, vectorized (policies are [S, P, K])."""
    seed: int = 0
    """Base seed of sampling."""
    log_every: int = 10
    """Record metrics every this many rollout batches."""
    grad_var_every: int = 0
    """Every this many batches estimate the policy-gradient variance from ``grad_var_draws`` fresh batches (0 = off)."""
    grad_var_draws: int = 8
    """Batches drawn for the gradient-variance estimate."""
    progress: bool = False
    """Show a tqdm progress bar."""

    def validate(self) -> None:
        if self.method not in methods():
            raise ValueError(
                f"method must be one of {methods()}, got {self.method!r}{did_you_mean(self.method, methods())}"
            )
        if self.log_z not in LOG_Z_MODES:
            raise ValueError(
                f"log_z must be one of {LOG_Z_MODES}, got {self.log_z!r}{did_you_mean(self.log_z, LOG_Z_MODES)}"
            )
        if self.anchor not in ("ref", "old"):
            raise ValueError(f"anchor must be 'ref' or 'old', got {self.anchor!r}")
        for name in ("steps", "G", "inner_steps", "refresh_every", "seeds", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.exact and self.log_z == "vargrad":
            raise ValueError("exact-gradient mode has no batch log Z (log_z='vargrad' needs samples)")
        if self.exact and self.method in ("flowrl", "gspo", "offrl", "fpa", "dpo", "sft"):
            raise ValueError(f"exact-gradient mode is not defined for method={self.method!r} (group statistics)")
        if self.exact and self.advantage != "raw" and self.method in ("lad", "grpo", "cispo", "sapo"):
            raise ValueError("exact-gradient mode needs advantage='raw' (group statistics need samples)")
        if self.advantage == "group" and self.G < 2 and not self.exact:
            raise ValueError("group-normalized advantages need G >= 2")
        if self.weight_clip not in ("auto", "one", "max", "eps", "ratio"):
            raise ValueError(f"weight_clip must be auto|one|max|eps|ratio, got {self.weight_clip!r}")
        if self.logz_init not in ("zero", "frozen"):
            raise ValueError(f"logz_init must be zero|frozen, got {self.logz_init!r}")
        if self.scheduler not in ("logz", "frozen", "oracle", "random"):
            raise ValueError(f"scheduler must be logz|frozen|oracle|random, got {self.scheduler!r}")
        if self.select_m < 0 or (self.select_m and self.select_m > self.n_prompts()):
            raise ValueError(f"select_m must be in [0, P], got {self.select_m}")
        check_knobs(self, "sim")
        if self.paced_replay and self.paced_replay_mode == "replace":
            if self.exact:
                raise ValueError("paced_replay_mode='replace' needs sampled batches (exact=False)")
            budget = (self.select_m or self.n_prompts()) * self.G
            if self.paced_replay_capacity > budget:
                raise ValueError(
                    f"paced_replay_mode='replace' needs paced_replay_capacity <= select_m * G = {budget} fresh samples "
                    f"to replace, got paced_replay_capacity={self.paced_replay_capacity}"
                )
        if not self.temperature > 0 or not self.tilt_beta > 0 or not self.lad_eta > 0:
            raise ValueError("temperature, tilt_beta and lad_eta must be > 0")
        if not self.cispo_ratio_max > 0:
            raise ValueError(f"cispo_ratio_max must be > 0, got {self.cispo_ratio_max}")
        if not (self.sapo_temp_pos > 0 and self.sapo_temp_neg > 0):
            raise ValueError(
                f"sapo_temp_pos and sapo_temp_neg must be > 0, got {self.sapo_temp_pos}, {self.sapo_temp_neg}"
            )

    def n_prompts(self) -> int:
        return self.P if self.env == "multiprompt" else 1


refuse_old_names(SimConfig, "SimConfig", RENAMED_FIELDS, common=False)


@dataclass
class RunResult:
    """What :func:`run` returns.

    Attributes:
        config: the config that produced it.
        history: metric name -> list over logged steps (``step`` holds the step numbers). Metrics:
            ``tv`` / ``kl`` (mean over seeds and prompts of TV(pi, target) and KL(pi || target)),
            ``tv_ratio`` (TV between LAD's P_pi = normalized pi/pi_old and the tilt distribution),
            ``reward`` (exact E_pi r), ``log_z`` / ``log_z_err`` (log Z in use and |log Z - exact|),
            ``grad_var`` (policy-gradient variance), PACED's ``p_hat_err`` and ``sel_p``.
        logp: final policy log-probs ``[S, P, K]``.
        logp_old: final pi_old log-probs ``[S, P, K]``.
        target_logp: final target ``[S, P, K]`` (pi* for ``anchor=ref``; pi_old e^{beta r} for ``old``).
        seconds: wall time.
        extra: per-run tensors: ``reward_per_seed`` ``[logged steps, S]`` (``history["reward"]`` before the
            mean over seeds); for sampled online methods ``update_terms`` / ``replay_terms`` ``[steps, S]``
            (sample terms with nonzero weight in each rollout batch's loss, and how many of them were
            replayed); ``log_z`` (a learned log Z) and ``frozen_log_z`` where they exist.
    """

    config: SimConfig
    history: dict[str, list[float]]
    logp: torch.Tensor
    logp_old: torch.Tensor
    target_logp: torch.Tensor
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def final(self, key: str) -> float:
        v = self.history.get(key, [])
        return float(v[-1]) if v else math.nan

    def to_json(self) -> dict:
        return {
            "config": asdict(self.config),
            "history": self.history,
            "final_policy": self.logp.exp().mean(0).tolist(),
            "final_target": self.target_logp.exp().mean(0).tolist(),
            "seconds": self.seconds,
        }

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1))
