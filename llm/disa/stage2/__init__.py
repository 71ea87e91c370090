"""DISA Stage 2: regress the Stage-1 labels on frozen prompt embeddings; ``predict_log_z``.

DISA §3.1 eq. (9) (``docs/math.md`` §1): fit ``log Z_psi(x)`` by
least squares ``min_psi sum_x (log Z_psi(x) - log Z_hat_M(x))^2`` with a held-out split; the
validation MSE is the separable diagnostic. Here:

* features: frozen embeddings from pi_ref (by default the Stage-1 reference model) -- the
  mean over prompt tokens of the final hidden state (``llm.base.scoring.hidden_states`` pooled with
  ``tiltlab.llm.base.models.masked_mean_pool``), ``[N, H]`` float32, of the same text the
  policy is conditioned on (chat template as in Stage 1), cached on disk keyed by a model
  fingerprint and the prompt texts;
* regressor and fit: ``objectives.regressor.PartitionRegressor`` / ``fit_regressor`` (input and
  target standardization live inside the module's buffers);
* outputs in ``out_dir``: ``regressor.safetensors`` + ``regressor.json`` (architecture, the
  embedding model and prompt format, the label column, beta, metrics, history, and ``signal``:
  the :mod:`tiltlab.llm.base.learning_signal` findings, e.g. constant labels),
  ``loss_curve.png``.

Later stages load it with :func:`load_log_z_predictor` and call ``predict_log_z(prompts)``
(raw user-turn prompts; the recorded prompt format is applied).

Import-light (torch etc. are imported inside functions) so the CLI parser builds quickly.

The package, one module per concern: :mod:`.config` (:class:`Stage2Config` and the output file names),
:mod:`.run` (the embeddings and their cache, :func:`run_stage2`, :class:`LogZPredictor` and
:func:`annotate_log_z`) and :mod:`.cli` (``tiltlab llm stage2`` and ``tiltlab llm stage2-annotate``). This
module re-exports what the rest of the project uses.
"""

from __future__ import annotations

from tiltlab.llm.disa.stage2.cli import add_cli
from tiltlab.llm.disa.stage2.config import CONFIG_FILE, REGRESSOR_FILE, Stage2Config
from tiltlab.llm.disa.stage2.run import (
    POOLING,
    LogZPredictor,
    annotate_log_z,
    cached_embeddings,
    embed_prompts,
    load_log_z_predictor,
    model_fingerprint,
    predict_log_z,
    run_stage2,
)

__all__ = [
    "CONFIG_FILE",
    "POOLING",
    "REGRESSOR_FILE",
    "LogZPredictor",
    "Stage2Config",
    "add_cli",
    "annotate_log_z",
    "cached_embeddings",
    "embed_prompts",
    "load_log_z_predictor",
    "model_fingerprint",
    "predict_log_z",
    "run_stage2",
]
