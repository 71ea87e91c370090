"""Online RL on TRL's ``GRPOTrainer``: GRPO, GSPO, CISPO, SAPO, LUSPO, VESPO, FlowRL, DISA Stage 3,
VarGrad, LAD, PACED.

One trainer, one ``objective`` option. TRL does the rollouts (transformers ``generate`` on CPU,
vLLM colocate/server on GPUs), the reward calls, the reference forward, the optimizer and the
distributed plumbing (accelerate: DDP, DeepSpeed, FSDP). This package only

1. adds per-completion fields in :meth:`TiltGRPOTrainer._generate_and_score_completions`, where
   whole groups are present (gathered across processes): the raw reward, the transformed reward
   ``r~`` of the TB objectives (identity, or the group-normalized plug-in), the frozen DISA
   ``log Z_psi(x)``, the batch-optimal VarGrad ``log Z``, the behaviour log-probs; PACED's prompt
   selection and replay also live there;
2. gathers current log-probs in :meth:`TiltGRPOTrainer._compute_loss` and calls the objective's
   entry of :data:`LOSSES` (one small function per objective, each calling ``objectives/``: no
   formula is written here), with TRL's vLLM importance-sampling ratio
   ``inputs["importance_sampling_ratio"]`` as a per-sequence weight
   (:func:`objectives.correction.sequence_is_weight`);
3. logs loss, reward, log Z mean/std, residual, weight-clip fraction, entropy and KL to the
   reference through TRL's metrics (so ``report_to`` sees them).

Objectives (``docs/math.md`` §1-§6):

* ``grpo``  — :func:`objectives.pg.grpo_loss` (token ratio, clip ``epsilon``/``epsilon_high``,
  KL to ref with coefficient ``beta`` = TRL's KL coefficient). With ``kl_in_reward=True`` the KL
  goes into the reward instead: ``r - beta * (log pi_old(y|x) - log pi_ref(y|x))``
  (:func:`objectives.pg.kl_in_reward`) before the advantages, recomputed here with TRL's
  ``scale_rewards`` rule, and no KL term in the loss; of the KL placements it is the one whose
  fixed point is the tilted target ``pi_ref e^{r / beta} / Z`` (``docs/math.md`` §6).
* ``gspo``  — :func:`objectives.pg.gspo_loss` (sequence ratio).
* ``cispo`` / ``sapo`` / ``luspo`` / ``vespo`` — TRL's loss types of those names
  (:func:`objectives.pg.cispo_loss` etc.) with TRL's options (``epsilon_high`` as CISPO's ratio
  cap, ``sapo_temperature_pos/neg``, ``vespo_k_pos`` ..., ``epsilon``/``epsilon_high`` as LUSPO's
  clip) and normalization.
* ``flowrl`` — :func:`objectives.tb.flowrl_loss` with a learned ``log Z`` head
  (:mod:`llm.disa.logz_head`); coded defaults: length-normalized log-probs, group-normalized
  reward, ``tilt_beta = 15``, weight ``clamp(exp(sum log-ratio), max=10)``; the paper's
  ``[1-eps, 1+eps]`` clip via ``weight_clip="eps"``.
* ``disa``  — :func:`objectives.tb.disa_loss`: the frozen Stage-2 ``log Z_psi(x)``, no gradient,
  with the SAME reward transform, ``beta``, residual scale and prompt format as Stage 1 (checked,
  see :func:`tiltlab.llm.disa.labels.check_label_compat`).
* ``vargrad`` — TB at the per-group batch-optimal ``log Z`` (:func:`objectives.tb.vargrad_log_z`),
  computed at generation time where the whole group is present.
* ``lad``   — :func:`objectives.lad.lad_loss` with any of the six divergences, ``lad_eta``.
* ``paced`` — TB anchored on ``pi_old`` with tilt ``r / paced_kl_coef`` and a learned ``log Z``
  head; prompts selected by ``|p_hat - tau|`` (:func:`objectives.paced.select_prompts`) from the
  learned or the DISA-frozen partition function; correct samples replayed by accuracy-error
  priority (:class:`objectives.paced.ReplayBuffer`); the glue is :mod:`tiltlab.llm.train.paced`.

Loss normalization: ``grpo`` implements TRL's ``loss_type`` values ``dapo`` (TRL's default: the
token sum over the token count of the whole accumulation window, across processes), ``grpo``,
``bnpo`` and ``dr_grpo`` (divided by ``max_completion_length``) with TRL's normalization;
``gspo`` is TRL's ``loss_type="grpo"`` at ``importance_sampling_level="sequence"``; ``cispo``,
``sapo``, ``luspo`` and ``vespo`` are TRL's loss types of the same name (``loss_type`` defaults to
it; ``cispo``/``vespo`` normalized like ``dapo``, ``sapo`` like ``grpo``, ``luspo`` by the
sequence mean of token sums, at ``importance_sampling_level="sequence"``); the other objectives
take no ``loss_type``. Any other value, and every TRL loss option the objectives do not
implement, is refused by :class:`TiltGRPOConfig` (:func:`~.config.loss_types`). TRL's
``off_policy_mask_threshold`` (DeepSeek-V3.2's off-policy sequence mask, from vLLM's
``sampling_per_token_logps`` when present, else ``pi_old``'s) is honoured by the GRPO family
(:func:`grpo_family`: the objectives declared with tag ``off_policy_mask``) and refused for the others; ``use_bias_correction_kl`` is honoured where the
KL term is TRL's per-token one (:func:`bias_corrected_kl`).

Groups and micro-batches: TRL shuffles a generation batch and splits it over gradient-
accumulation micro-batches and processes, so a group's G completions are usually NOT together in
``_compute_loss``. Every group-level quantity (group normalization, VarGrad ``log Z``, PACED's
accuracy) is therefore computed in ``_generate_and_score_completions`` on gathered tensors and
carried per completion; the losses in ``_compute_loss`` are then per-sequence and split-invariant.
The VarGrad ``log Z`` is computed from the behaviour log-probs (``logp_old``) and held fixed:
its gradient contribution is zero at the minimizer anyway (``dL/dlog Z = 0``), and on-policy
``logp = logp_old`` numerically, so the loss equals TB at the batch-optimal ``log Z``.

Modules: :mod:`.config` (:class:`TiltGRPOConfig` and the tables of what each objective implements),
:mod:`.losses` (the loss function of each objective, :func:`loss_function`), :mod:`.trainer`
(:class:`TiltGRPOTrainer`); the public names are re-exported here.
"""

from __future__ import annotations

from .config import TiltGRPOConfig, bias_corrected_kl, grpo_family, kl_in_reward, objectives
from .losses import LOSSES, LossBatch, loss_function
from .trainer import TiltGRPOTrainer, informative_groups

__all__ = [
    "LOSSES",
    "LossBatch",
    "TiltGRPOConfig",
    "TiltGRPOTrainer",
    "bias_corrected_kl",
    "grpo_family",
    "informative_groups",
    "kl_in_reward",
    "loss_function",
    "objectives",
]
