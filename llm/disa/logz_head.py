"""The learned partition function ``log Z_phi(x)`` of FlowRL / PACED, as a submodule of the policy.

FlowRL's code (``docs/math.md`` §2): ``log Z = MLP(masked mean of last-layer prompt hidden states)``,
3 layers, GELU, LayerNorm, dropout 0.1, input not detached. The head is attached to the policy
(``model.log_z_head``) so that the trainer's optimizer, DDP/FSDP/DeepSpeed wrapping and
checkpoints see it like any other parameter.

Shapes: prompt ids / mask ``[B, L]`` (left or right padding), hidden ``[B, L, H]``, pooled
``[B, H]``, output ``[B]``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch
from torch import Tensor, nn

from tiltlab.llm.base.models import masked_mean_pool
from tiltlab.llm.base.scoring import hidden_states

__all__ = [
    "LogZHead",
    "attach_log_z_head",
    "get_log_z_head",
    "is_log_z_head_param",
    "policy_only_dir",
    "prompt_log_z",
    "without_log_z_head",
]

HEAD_NAME = "log_z_head"


class LogZHead(nn.Module):
    """MLP ``[B, H] -> [B]``: ``n_layers - 1`` blocks (Linear, LayerNorm, GELU, Dropout), then Linear.

    The last layer is zero-initialized with bias ``init`` so that training starts from
    ``log Z = init`` (0 by default) for every prompt.

    Args:
        in_dim: hidden size H of the policy.
        hidden: width of the hidden layers.
        n_layers: number of Linear layers (FlowRL: 3).
        dropout: dropout after each hidden block (FlowRL: 0.1; TRL's ``disable_dropout`` zeroes it).
        init: initial value of ``log Z``.
    """

    def __init__(
        self, in_dim: int, hidden: int = 256, n_layers: int = 3, dropout: float = 0.1, init: float = 0.0
    ) -> None:
        super().__init__()
        if in_dim <= 0 or hidden <= 0 or n_layers < 1:
            raise ValueError("LogZHead needs in_dim > 0, hidden > 0 and n_layers >= 1")
        layers: list[nn.Module] = []
        d = in_dim
        for _ in range(n_layers - 1):
            layers += [nn.Linear(d, hidden), nn.LayerNorm(hidden), nn.GELU(), nn.Dropout(dropout)]
            d = hidden
        last = nn.Linear(d, 1)
        nn.init.zeros_(last.weight)
        nn.init.constant_(last.bias, float(init))
        layers.append(last)
        self.net = nn.Sequential(*layers)

    def forward(self, pooled: Tensor) -> Tensor:  # [B, H] -> [B]
        if pooled.dim() != 2:
            raise ValueError(f"LogZHead expects pooled features [B, H], got {tuple(pooled.shape)}")
        w = self.net[0].weight
        return self.net(pooled.to(w.dtype)).squeeze(-1).float()


def attach_log_z_head(
    model: nn.Module, hidden: int = 256, n_layers: int = 3, dropout: float = 0.1, init: float = 0.0
) -> LogZHead:
    """Create a :class:`LogZHead` sized to ``model.config.hidden_size`` and register it as
    ``model.log_z_head`` (idempotent: an existing head is returned unchanged)."""
    existing = get_log_z_head(model, required=False)
    if existing is not None:
        return existing
    h = getattr(getattr(model, "config", None), "hidden_size", None)
    if h is None:
        raise ValueError("cannot size the log Z head: model.config.hidden_size is missing")
    p = next(model.parameters())
    head = LogZHead(int(h), hidden, n_layers, dropout, init).to(device=p.device)
    model.add_module(HEAD_NAME, head)
    return head


def get_log_z_head(model: nn.Module, required: bool = True) -> LogZHead | None:
    """The attached head (also through PEFT / DDP wrappers)."""
    seen = model
    for _ in range(4):
        head = getattr(seen, HEAD_NAME, None) if isinstance(seen, nn.Module) else None
        saved = getattr(head, "modules_to_save", None)  # PEFT's ModulesToSaveWrapper: the trained copy
        if isinstance(saved, nn.ModuleDict) and not isinstance(head, LogZHead):
            active = [a for a in getattr(head, "active_adapters", []) if a in saved]
            head = saved[active[0]] if active else None
        if isinstance(head, LogZHead):
            return head
        seen = getattr(seen, "module", None) or getattr(seen, "base_model", None) or getattr(seen, "model", None)
        if seen is None:
            break
    if required:
        raise ValueError("the model has no log_z_head; call llm.disa.logz_head.attach_log_z_head(model) first")
    return None


def is_log_z_head_param(name: str) -> bool:
    """True for a parameter name inside the head, under any wrapper prefix (``log_z_head.net.0.weight``,
    ``base_model.model.log_z_head.modules_to_save.default.net.0.weight``, ...)."""
    return HEAD_NAME in name.split(".")


def without_log_z_head(named_params):
    """``(name, tensor)`` pairs minus the head's: the head is a training-side module (it stays in the
    policy's state dict and checkpoints) that an inference engine's model does not have — vLLM's
    ``load_weights`` rejects the name ("There is no module or parameter named 'log_z_head'")."""
    for name, param in named_params:
        if not is_log_z_head_param(name):
            yield name, param


def policy_only_dir(model_dir, out_dir=None):
    """A directory an inference engine can load from a saved FlowRL / PACED policy: ``model_dir`` itself
    when its ``model.safetensors`` has no head weights; otherwise ``out_dir`` (default
    ``<model_dir>/policy``) holding the same files with the head's tensors left out of
    ``model.safetensors`` (vLLM refuses unknown parameter names; transformers would only warn). Written
    atomically (a temporary directory renamed into place); an existing up-to-date copy is reused."""

    from safetensors import safe_open
    from safetensors.torch import save_file

    src = Path(model_dir)
    weights = src / "model.safetensors"
    if not weights.is_file():
        raise FileNotFoundError(f"{str(src)!r} has no model.safetensors (a sharded or adapter-only save?)")
    with safe_open(str(weights), "pt") as f:
        keys = list(f.keys())
        head = [k for k in keys if is_log_z_head_param(k)]
        if not head:
            return src
        tensors = {k: f.get_tensor(k) for k in keys if k not in head}
        meta = f.metadata()
    dst = Path(out_dir) if out_dir is not None else src / "policy"
    if (dst / "model.safetensors").is_file() and os.path.getmtime(dst / "model.safetensors") >= os.path.getmtime(
        weights
    ):
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dst.parent, prefix=f".{dst.name}."))
    try:
        for item in src.iterdir():
            if item.is_file() and item.name != "model.safetensors" and not item.name.startswith("."):
                shutil.copy2(item, tmp / item.name)
        save_file(tensors, str(tmp / "model.safetensors"), metadata=meta)
        if dst.exists():
            shutil.rmtree(dst)
        os.replace(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dst


def prompt_log_z(model: nn.Module, prompt_ids: Tensor, prompt_mask: Tensor, detach_input: bool = False) -> Tensor:
    """``log Z_phi(x) = head(masked mean of the final hidden states over prompt tokens)`` -> ``[B]``.

    ``detach_input=True`` stops the gradient of the log Z loss from reaching the backbone (only
    the head learns from it); FlowRL's code leaves it attached (the default).
    """

    head = get_log_z_head(model)
    ctx = torch.no_grad() if detach_input else torch.enable_grad() if torch.is_grad_enabled() else torch.no_grad()
    with ctx:
        h = hidden_states(model, prompt_ids, prompt_mask)  # [B, L, H]
        pooled = masked_mean_pool(h, prompt_mask)  # [B, H]
    if detach_input:
        pooled = pooled.detach()
    return head(pooled)
