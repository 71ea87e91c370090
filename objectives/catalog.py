"""The declaration of every objective: its name, loss function, batch needs, family, the trainers that
run it, its capabilities and its documentation, in one table (:data:`SPECS`).

This module imports nothing (no torch), so a config check, a CLI's ``--help`` or the simulator's
config can read the names without loading a tensor library. :mod:`tiltlab.objectives.registry` pairs
each entry with its adapter (the loss call on a common batch); every trainer's list of objective
names, CLI choices and config schema is :func:`names` of this table, so adding an objective is its loss
function, one :class:`Spec` here, its adapter in the registry and its OpInfo entry in the tests.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field, make_dataclass
from typing import Any

__all__ = [
    "FAMILIES",
    "LAD_DIVERGENCES",
    "RENAMED",
    "SPECS",
    "TAGS",
    "TB_OPTIONS",
    "TRAINERS",
    "Option",
    "Spec",
    "check_knobs",
    "knob_fields",
    "names",
    "options_dataclass",
    "renamed",
    "section_keys",
]

TRAINERS = ("online", "offline", "sim", "verl")
"""The dispatchers of the registry: ``online`` (the TRL trainer, ``llm/train/online/``), ``offline``
(``llm/train/offline.py``), ``sim`` (the simulator, ``sim/train.py``), ``verl`` (the veRL plug-in,
``llm/verl/``)."""

FAMILIES = ("pg", "lad", "tb", "offline")
"""What a trainer builds for an entry: ``pg`` (the GRPO family: advantages, ``pi_old``, clip options),
``lad`` (advantages, an f-divergence), ``tb`` (the trajectory-balance family: a transformed reward,
log Z, the rollout weight), ``offline`` (a fixed dataset: the FPA setting)."""

TAGS = {
    "trl_loss_type": "the objective is one of TRL's own loss_type values (its name is the loss_type)",
    "off_policy_mask": "honours TRL's off_policy_mask_threshold (DeepSeek-V3.2's off-policy sequence mask)",
    "bias_corrected_kl": "its KL term is TRL's per-token one and honours use_bias_correction_kl",
    "kl_in_reward": "implements kl_in_reward (TRL's beta as the sequence-level k1 penalty in the reward)",
    "needs_ref": "reads the reference policy's log-probs (TRL's beta = 0 does not skip the reference model)",
    "learned_log_z": "log Z is learned jointly (a log Z head on the policy, or a per-prompt parameter)",
    "frozen_log_z": "log Z is a frozen per-prompt label (DISA's Stage 2)",
    "sim_tb": "the simulator reaches it as method='tb' with its log_z mode (sim.train.tb_objective_name)",
}
"""The capability tags an entry may carry (:attr:`Spec.tags`), each in words."""


@dataclass(frozen=True)
class Option:
    """One knob, under the one name it has in the registry's options, the TRL trainer's config
    (``TiltGRPOConfig``), the veRL plug-in's ``TBSettings`` and a run config's objective section.

    Attributes:
        name: the knob's name everywhere.
        type: its annotation (a dataclass field built from it gets this type).
        default: its default.
        doc: what it is (the fields' ``help``).
        choices: the values it takes, when it is one of a few.
        trainers: for an objective's own knob (:attr:`Spec.knobs`), the trainers whose config has it
            (empty: every trainer of the objective).
        trainer_defaults: a trainer's own default where it differs (``{"sim": 32}``: the simulator's
            toy scale).
    """

    name: str
    type: Any
    default: Any
    doc: str
    choices: tuple[Any, ...] = ()
    trainers: frozenset[str] = frozenset()
    trainer_defaults: Mapping[str, Any] = field(default_factory=dict)

    def check(self, value: Any) -> None:
        """A one-line ValueError when ``value`` is not one of :attr:`choices`."""
        if self.choices and value not in self.choices:
            raise ValueError(f"{self.name} must be one of {self.choices}, got {value!r}")


TB_OPTIONS: tuple[Option, ...] = (
    Option("tilt_beta", float, 15.0, "beta multiplying the transformed reward r~ (DISA convention; FlowRL: 15)"),
    Option("reward_scale", float, 1.0, "a in the fixed transform r~ = a r + c (a > 0; DISA: Stage 1's)"),
    Option("reward_shift", float, 0.0, "c in the fixed transform r~ = a r + c"),
    Option(
        "logprob_scale",
        str | None,
        None,
        "the sequence log-prob in the TB residual: sum (DISA eq. 6) | mean (FlowRL's code); "
        "None: the objective's default (mean for flowrl, sum otherwise)",
        ("sum", "mean", None),
    ),
    Option(
        "weight_clip",
        str,
        "max",
        "TB rollout weight w = pi/pi_old (detached): max (FlowRL's code: min(w, max_weight)) | eps (FlowRL's "
        "paper: clip to [1 - weight_eps, 1 + weight_eps_high]) | ratio (unclipped) | one (w = 1, no correction)",
        ("max", "eps", "ratio", "one"),
    ),
    Option("max_weight", float, 10.0, "cap of the TB rollout weight for weight_clip=max"),
    Option("weight_eps", float, 0.2, "lower eps of the [1 - weight_eps, 1 + weight_eps_high] weight clip"),
    Option(
        "weight_eps_high", float | None, None, "upper eps of the weight clip (None = weight_eps; FlowRL recipe: 0.28)"
    ),
)
"""The trajectory-balance family's shared knobs: the fields of ``TiltGRPOConfig`` and ``TBSettings`` that
carry them are built from this tuple, and the registry's TB adapters take these names."""

RENAMED = {
    "length_normalize": "logprob_scale ('mean' for true, 'sum' for false)",
    "eps": "weight_eps",
    "eps_high": "weight_eps_high",
}
"""Old knob name -> the one name it has now (refused with a one-line error naming the new one)."""


def options_dataclass(name: str, options: tuple[Option, ...]) -> type:
    """A dataclass whose fields are ``options`` (name, type, default, ``help`` metadata): the base that
    puts the declared knobs into a trainer's config class (TRL's ``HfArgumentParser`` reads the help)."""
    return make_dataclass(name, [(o.name, o.type, field(default=o.default, metadata={"help": o.doc})) for o in options])


def default_logprob_scale(objective: str) -> str:
    """``logprob_scale`` when a config leaves it None: the declared default of ``objective`` (``mean`` for
    flowrl, FlowRL's code), else ``sum`` (DISA eq. 6)."""
    return str(SPECS[objective].defaults.get("logprob_scale", "sum"))


def tb_loss_options(settings: Any) -> dict[str, Any]:
    """The TB knobs a trainer config (``settings``: fields named as :data:`TB_OPTIONS`) passes to the
    registry's TB adapters: all but ``reward_scale`` / ``reward_shift``, which the trainer applies to the
    reward before the loss."""
    return {o.name: getattr(settings, o.name) for o in TB_OPTIONS if o.name not in ("reward_scale", "reward_shift")}


def refuse_old_names(cls: type, where: str, extra: Mapping[str, str] | None = None, *, common: bool = True) -> type:
    """``cls`` (a config dataclass) with its ``__init__`` refusing the old knob names (:func:`renamed`; with
    ``common=False`` only ``extra``) in one line naming the new, before the dataclass would say only
    "unexpected keyword argument"."""
    declared = cls.__init__  # type: ignore[misc]

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        renamed(kwargs, where, extra, common=common)
        declared(self, *args, **kwargs)

    __init__.__doc__, __init__.__signature__ = declared.__doc__, inspect.signature(declared)  # type: ignore[attr-defined]
    cls.__init__ = __init__  # type: ignore[misc]
    return cls


def renamed(given: Any, where: str, extra: Mapping[str, str] | None = None, *, common: bool = True) -> None:
    """Refuse the old knob names among ``given`` (names; :data:`RENAMED` unless ``common`` is false, and
    ``extra``, a caller's own renames), in one line naming the new ones."""
    table = {**(RENAMED if common else {}), **(extra or {})}
    old = [k for k in given if k in table]
    if old:
        raise TypeError(f"{where}: " + "; ".join(f"{k!r} is now {table[k]}" for k in old))


@dataclass(frozen=True)
class Spec:
    """The declaration of one objective.

    Attributes:
        name: the registry key (the trainers' ``objective`` / ``method`` names).
        loss: the function of this package the adapter calls (``"pg.grpo_loss"``: module.function;
            the OpInfo registry of the tests names it the same way).
        needs: the batch fields the adapter reads (checked before the call).
        family: one of :data:`FAMILIES`: what a trainer builds for it.
        trainers: the dispatchers of :data:`TRAINERS` that run it.
        tags: capabilities from :data:`TAGS`.
        doc: one line on what it is (CLI help, docs).
        options: the adapter's own options (beyond the loss function's keyword arguments), in words.
        defaults: option values used where the caller gives none.
        knobs: the objective's own settings (:class:`Option`), each the field ``<name>_<knob>`` of every
            trainer config that has it (:func:`knob_fields`) and the key ``<knob>`` of a run config's
            ``<name>:`` section.
    """

    name: str
    loss: str
    needs: tuple[str, ...]
    family: str
    trainers: frozenset[str]
    tags: frozenset[str] = frozenset()
    doc: str = ""
    options: str = ""
    defaults: Mapping[str, Any] = field(default_factory=dict)
    knobs: tuple[Option, ...] = ()

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"objective {self.name!r}: family must be one of {FAMILIES}, got {self.family!r}")
        bad = sorted(set(self.trainers) - set(TRAINERS)) + sorted(set(self.tags) - set(TAGS))
        if bad:
            raise ValueError(f"objective {self.name!r}: unknown trainers/tags {bad}; known {TRAINERS}, {sorted(TAGS)}")
        for k in self.knobs:
            bad = sorted(set(k.trainers) - set(TRAINERS)) + sorted(set(k.trainer_defaults) - set(TRAINERS))
            if bad:
                raise ValueError(f"objective {self.name!r}: knob {k.name!r}: unknown trainers {bad}; known {TRAINERS}")

    def knob_trainers(self, knob: Option) -> frozenset[str]:
        """The trainers whose config has ``knob`` (its own list, else the objective's)."""
        return knob.trainers or self.trainers


_POLICY_NEEDS = ("token_logp_old", "advantages")
_TB_OPTS = (
    "tilt_beta; logprob_scale ('sum' | 'mean'); anchor ('ref' | 'old'); weight_clip ('one', the default: only "
    "is_weight; 'max' | 'eps' | 'ratio': tb_importance_weight on pi_old), max_weight, weight_eps, weight_eps_high"
)
_ON, _OFF, _SIM, _VERL = (frozenset({t}) for t in TRAINERS)
_PG_TAGS = frozenset({"off_policy_mask", "bias_corrected_kl"})
_TRL_LOSS = frozenset({"trl_loss_type", *_PG_TAGS})


LAD_DIVERGENCES = ("kl", "rkl", "jeffreys", "tv", "hellinger", "js")
"""The names of :data:`tiltlab.objectives.lad.F_DIVERGENCES` (LAD Table 5; a test pins them equal)."""

_LAD_KNOBS = (
    Option("eta", float, 1.0, "LAD's temperature eta > 0 (target pi_old e^{A/eta})", trainers=_ON | _SIM),
    Option("divergence", str, "js", "LAD's f-divergence (LAD Table 5)", LAD_DIVERGENCES, trainers=_ON | _SIM),
    Option(
        "level",
        str,
        "token",
        "the ratio in the LAD loss: token | sequence (length-normalised)",
        ("token", "sequence"),
        trainers=_ON,
    ),
)
_PACED_KNOBS = (
    Option("kl_coef", float, 1.0, "PACED's beta, a KL coefficient > 0: the TB tilt is r / kl_coef", trainers=_ON),
    Option("tau", float, 0.5, "PACED's target accuracy in [0, 1] of the prompt selection", trainers=_ON | _SIM),
    Option("pool_factor", int, 4, "candidates per selected prompt (0 = no selection)", trainers=_ON),
    Option(
        "select_from",
        str,
        "learned",
        "the log Z the selection reads: learned | disa (the frozen Stage-2 log Z)",
        ("learned", "disa"),
        trainers=_ON,
    ),
    Option(
        "replay",
        bool,
        True,
        "PACED's replay: a buffer of correct samples with priority |N_correct/N - p_hat| added to the batch",
        trainers=_ON | _SIM,
        trainer_defaults={"sim": False},
    ),
    Option(
        "replay_capacity",
        int,
        128,
        "replay buffer capacity (PACED: 128; the simulator's per seed: 32)",
        trainers=_ON | _SIM,
        trainer_defaults={"sim": 32},
    ),
    Option(
        "replay_add",
        int,
        64,
        "correct samples pushed into the buffer per step (PACED: 64; the simulator: 16)",
        trainers=_ON | _SIM,
        trainer_defaults={"sim": 16},
    ),
    Option("replay_max", int | None, None, "at most this many replayed rows per batch", trainers=_ON),
    Option(
        "replay_mode",
        str,
        "add",
        "add: the valid buffer entries are added to the batch (an update then has more sample terms than one "
        "without replay); replace: each valid buffer entry takes the place of one fresh sample of the selected "
        "prompts (dropped from the highest sample index down, round-robin over prompts), so every update has "
        "exactly select_m * G sample terms (P * G without selection); fresh samples are drawn either way",
        ("add", "replace"),
        trainers=_SIM,
    ),
    Option(
        "embeddings",
        str,
        "frozen_ref",
        "PACED's Z_phi input: frozen_ref (paper Sec. 4.3: an MLP on frozen pi_ref prompt embeddings, precomputed "
        "once) | live (the head on the live policy's hidden states)",
        ("frozen_ref", "live"),
        trainers=_ON,
    ),
)


def _pg(name: str, trainers: frozenset[str], tags: frozenset[str], doc: str) -> Spec:
    return Spec(name, f"pg.{name}_loss", _POLICY_NEEDS, "pg", trainers, tags, doc, f"{name}_loss's keywords")


SPECS: dict[str, Spec] = {
    s.name: s
    for s in (
        _pg(
            "grpo", _ON | _SIM | _VERL, _PG_TAGS | {"kl_in_reward"}, "GRPO's clipped surrogate (PPO clip, optional KL)"
        ),
        _pg("gspo", _ON | _SIM | _VERL, frozenset({"off_policy_mask"}), "GSPO: the sequence-level ratio"),
        _pg("cispo", _ON | _SIM | _VERL, _TRL_LOSS, "CISPO: the clipped stop-gradient IS weight (MiniMax-M1)"),
        _pg("sapo", _ON | _SIM | _VERL, _TRL_LOSS, "SAPO: the sigmoid-gated ratio (Qwen)"),
        _pg("luspo", _ON, _TRL_LOSS, "LUSPO: the length-unbiased sequence ratio"),
        _pg("vespo", _ON, _TRL_LOSS, "VESPO (TRL's loss_type='vespo')"),
        Spec(
            "flowrl",
            "tb.flowrl_loss",
            ("token_logp_ref", "token_logp_old", "rewards", "log_z"),
            "tb",
            _ON | _SIM | _VERL,
            frozenset({"needs_ref", "learned_log_z"}),
            "FlowRL: TB with a learned log Z and its code's choices (length-normalised, group-normalised reward)",
            "flowrl_loss's keywords",
            {"logprob_scale": "mean"},
        ),
        Spec(
            "disa",
            "tb.disa_loss",
            ("rewards", "log_z"),
            "tb",
            _ON | _SIM | _VERL,
            frozenset({"needs_ref", "frozen_log_z", "sim_tb"}),
            "DISA Stage 3: TB with the frozen Stage-2 log Z",
            _TB_OPTS + " (log Z detached)",
        ),
        Spec(
            "vargrad",
            "tb.tb_loss",
            ("rewards",),
            "tb",
            _ON | _SIM,
            frozenset({"needs_ref", "sim_tb"}),
            "VarGrad: TB at the per-group batch-optimal log Z",
            _TB_OPTS + "; group_size (log Z = tb.vargrad_log_z of the batch when batch.log_z is None; detached)",
        ),
        Spec(
            "lad",
            "lad.lad_loss",
            _POLICY_NEEDS,
            "lad",
            _ON | _SIM | _VERL,
            frozenset(),
            "LAD: f-divergence matching of the advantage distribution",
            "eta, divergence; level ('sequence': logprob_scale, default 'mean' | 'token': loss_agg, max_len, num_tokens)",
            knobs=_LAD_KNOBS,
        ),
        Spec(
            "paced",
            "tb.tb_loss",
            ("token_logp_old", "rewards", "log_z"),
            "tb",
            _ON | _VERL,
            frozenset({"learned_log_z"}),
            "PACED-RL: TB anchored on pi_old with a learned log Z that schedules prompts",
            "kl_coef (tilt r / kl_coef, anchor pi_old); " + _TB_OPTS.split("; ", 1)[1],
            knobs=_PACED_KNOBS,
        ),
        Spec(
            "tb",
            "tb.tb_loss",
            ("rewards", "log_z"),
            "tb",
            _SIM,
            frozenset({"learned_log_z", "sim_tb"}),
            "TB with a learned per-prompt log Z (the simulator's log_z='learned')",
            _TB_OPTS + " (log Z attached: a learned one)",
        ),
        Spec(
            "offrl",
            "offline.offrl_loss",
            ("rewards",),
            "offline",
            _OFF | _SIM,
            doc="Off-RL: offline policy gradient on R = 2r - 1 (FPA eq. 1)",
            options="kl_tau (needs token_logp_ref)",
            knobs=(
                Option("kl_tau", float, 0.0, "Off-RL forward-KL penalty tau on the offline data (FPA App. B.6: 0.04)"),
            ),
        ),
        Spec(
            "fpa",
            "offline.fpa_loss",
            ("token_logp_future", "rewards"),
            "offline",
            _OFF | _SIM,
            doc="FPA: Off-RL with the logit-extrapolated future policy",
            knobs=(
                Option(
                    "lam", float, 1.0, "FPA extrapolation lambda >= 0 (pi_hat ∝ pi^{1+lam} pi_ref^{-lam}, FPA eq. 4-5)"
                ),
                Option(
                    "apply_to",
                    str,
                    "all",
                    "all | correct | incorrect: the rows whose weight uses pi_hat",
                    ("all", "correct", "incorrect"),
                    trainers=_OFF,
                ),
            ),
        ),
        Spec(
            "dpo",
            "offline.dpo_loss",
            ("token_logp_ref", "rejected"),
            "offline",
            _OFF | _SIM,
            doc="DPO on (winner, loser) pairs",
            options="beta",
            knobs=(Option("beta", float, 0.1, "DPO's (and RPO's) beta (FPA App. B.2: 0.1)"),),
        ),
        Spec(
            "rpo",
            "offline.rpo_loss",
            ("token_logp_ref", "rejected"),
            "offline",
            _OFF,
            doc="RPO: DPO plus the winners' length-normalised NLL",
            options="beta (dpo_beta), alpha",
            knobs=(Option("alpha", float, 1.0, "RPO's NLL weight alpha (paper: 1); its beta is dpo_beta"),),
        ),
        Spec(
            "kto",
            "offline.kto_loss",
            ("token_logp_ref", "rewards"),
            "offline",
            _OFF,
            doc="KTO on desirable / undesirable rows",
            options="beta, lambda_w, lambda_l, z0",
            knobs=(
                Option("beta", float, 0.1, "KTO's beta"),
                Option("lambda_w", float, 1.0, "KTO's lambda of the correct rows (paper: 1)"),
                Option("lambda_l", float, 1.0, "KTO's lambda of the incorrect rows (paper: 1)"),
            ),
        ),
        Spec(
            "simper",
            "offline.simper_loss",
            ("rejected",),
            "offline",
            _OFF,
            doc="SimPER: reference-free inverse perplexity on pairs",
        ),
        Spec(
            "apo",
            "offline.apo_loss",
            ("token_logp_ref", "rewards", "values"),
            "offline",
            _OFF,
            doc="A*-PO: regression onto the estimated optimal value",
            options="beta2",
            knobs=(
                Option("beta1", float, 0.5, "A*-PO's value temperature beta1 > 0 (paper: 0.5)"),
                Option("beta2", float, 1e-3, "A*-PO's regression scale beta2 (paper: 1e-3)"),
            ),
        ),
        Spec("sft", "offline.sft_loss", (), "offline", _OFF | _SIM, doc="SFT: the negative log-likelihood of the rows"),
    )
}
"""Objective name -> :class:`Spec`, in the documented order (every list derived from it keeps it)."""


def names(trainer: str | None = None, *, family: str | None = None, tag: str | None = None) -> tuple[str, ...]:
    """The declared names, in the table's order, that ``trainer`` (one of :data:`TRAINERS`) runs, of
    ``family`` (:data:`FAMILIES`) and carrying ``tag`` (:data:`TAGS`); None selects all. Read at call
    time, so an entry added by :func:`tiltlab.objectives.registry.registered` is in every list derived
    from it."""
    for value, known, what in ((trainer, TRAINERS, "trainer"), (family, FAMILIES, "family"), (tag, tuple(TAGS), "tag")):
        if value is not None and value not in known:
            raise ValueError(f"unknown {what} {value!r}; known: {list(known)}")
    return tuple(
        n
        for n, s in SPECS.items()
        if (trainer is None or trainer in s.trainers)
        and (family is None or s.family == family)
        and (tag is None or tag in s.tags)
    )


def knob_fields(trainer: str) -> tuple[Option, ...]:
    """Every declared objective knob that ``trainer``'s config has, as the field ``<objective>_<knob>``
    with ``trainer``'s default (:attr:`Option.trainer_defaults`), in the table's order: the base of
    ``TiltGRPOConfig`` (``online``), ``OfflineConfig`` (``offline``) and ``SimConfig`` (``sim``)."""
    names(trainer)  # a clear error for an unknown trainer
    return tuple(
        Option(
            f"{s.name}_{k.name}",
            k.type,
            k.trainer_defaults.get(trainer, k.default),
            k.doc,
            k.choices,
            frozenset({trainer}),
        )
        for s in SPECS.values()
        for k in s.knobs
        if trainer in s.knob_trainers(k)
    )


def section_keys(objective: str, trainer: str) -> dict[str, str]:
    """A run config's ``<objective>:`` section keys that ``trainer`` reads -> its config fields
    (``{"eta": "lad_eta", ...}``)."""
    s = SPECS[objective]
    return {k.name: f"{s.name}_{k.name}" for k in s.knobs if trainer in s.knob_trainers(k)}


def check_knobs(config: Any, trainer: str) -> None:
    """A one-line ValueError for the first field of ``config`` (a trainer config built on
    :func:`knob_fields`) outside its declared choices."""
    for o in knob_fields(trainer):
        o.check(getattr(config, o.name))


def describe(trainer: str) -> str:
    """``"grpo, gspo, ..."``: the names ``trainer`` runs, for a help text."""
    return ", ".join(names(trainer))
