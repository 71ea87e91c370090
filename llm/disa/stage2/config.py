"""Stage 2's settings: :class:`Stage2Config` (one field = one ``tiltlab llm stage2`` flag) and the names of the
files a run writes."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CONFIG_FILE", "REGRESSOR_FILE", "Stage2Config"]

REGRESSOR_FILE = "regressor.safetensors"
CONFIG_FILE = "regressor.json"


@dataclass
class Stage2Config:
    """Configuration of ``tiltlab llm stage2`` (one field = one CLI flag, its docstring = the help)."""

    labels: str
    """Stage 1 output directory (manifest.json + labels-*.parquet)."""
    out_dir: str
    """Where the regressor, its config, metrics and the loss-curve PNG are written."""
    embed_model: str | None = None
    """Frozen embedding model (default: the Stage 1 reference pi_ref)."""
    target: str = "log_z"
    """Label column to regress: "log_z" (DISA's LSE label) or "log_z_bias_corrected"."""
    chat_template: bool | None = None
    """Embed the chat-templated prompt (default: as Stage 1 formatted it)."""
    val_fraction: float = 0.2
    """Held-out fraction of prompts for the validation MSE / R^2."""
    epochs: int = 300
    """Training epochs (the best validation epoch is restored)."""
    lr: float = 3e-3
    """AdamW learning rate."""
    weight_decay: float = 1e-4
    """AdamW weight decay."""
    hidden: int = 256
    """Regressor hidden width."""
    n_layers: int = 2
    """Regressor hidden layers (DISA: a 2-layer MLP)."""
    fit_batch_size: int | None = None
    """Regressor mini-batch size (default: full batch)."""
    seed: int = 0
    """Seed of the split and the initialization."""
    embed_batch_size: int = 16
    """Prompts per embedding forward pass."""
    cache_dir: str | None = None
    """Embedding cache directory (default: <out_dir>/embed_cache)."""
    dtype: str = "auto"
    """Embedding-model dtype ("auto": bf16 on GPU, fp32 on CPU)."""
    device: str | None = None
    """Device of the embedding model (default: cuda if available)."""

    def __post_init__(self) -> None:
        if self.target not in ("log_z", "log_z_bias_corrected"):
            raise ValueError(f"target must be 'log_z' or 'log_z_bias_corrected', got {self.target!r}")
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must lie in (0, 1), got {self.val_fraction}")
        if self.epochs < 1 or self.embed_batch_size < 1:
            raise ValueError("epochs and embed_batch_size must be >= 1")
