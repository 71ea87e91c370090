"""DISA Stage 2: amortize the Stage-1 labels with a small prompt regressor (eq. 9).

``min_psi sum_x (log Z_psi(x) - log Z_hat_M(x))^2`` with ``log Z_psi`` an MLP on a frozen prompt
embedding; held-out validation MSE is the diagnostic (``docs/math.md`` §1). Used on simulator
features and on LLM prompt embeddings alike. Inputs and targets are standardized inside the
module (buffers), so predictions come out in label units.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from tiltlab.objectives._checks import ndim, no_nan_at, nonempty, same_shape
from tiltlab.objectives.output import LossOutput

__all__ = ["FitResult", "PartitionRegressor", "fit_regressor", "r2_score", "regressor_loss"]


class PartitionRegressor(nn.Module):
    """MLP ``[N, D] -> [N]`` predicting ``log Z``: ``n_layers`` hidden layers (Linear, GELU), then Linear.

    Args:
        in_dim: embedding width D.
        hidden: hidden width.
        n_layers: number of hidden layers (DISA: a 2-layer MLP).
        dropout: dropout after each hidden activation.
    """

    # standardization buffers (registered in __init__; declared here for the type checker)
    x_mean: Tensor
    x_std: Tensor
    y_mean: Tensor
    y_std: Tensor

    def __init__(self, in_dim: int, hidden: int = 256, n_layers: int = 2, dropout: float = 0.0) -> None:
        super().__init__()
        if in_dim <= 0 or hidden <= 0 or n_layers < 1:
            raise ValueError("need in_dim > 0, hidden > 0, n_layers >= 1")
        self.in_dim, self.hidden, self.n_layers, self.dropout = in_dim, hidden, n_layers, dropout
        layers: list[nn.Module] = []
        d = in_dim
        for _ in range(n_layers):
            layers += [nn.Linear(d, hidden), nn.GELU()]
            if dropout:
                layers.append(nn.Dropout(dropout))
            d = hidden
        layers.append(nn.Linear(d, 1))
        self.net = nn.Sequential(*layers)
        self.register_buffer("x_mean", torch.zeros(in_dim))
        self.register_buffer("x_std", torch.ones(in_dim))
        self.register_buffer("y_mean", torch.zeros(()))
        self.register_buffer("y_std", torch.ones(()))

    def config(self) -> dict[str, int | float]:
        return {"in_dim": self.in_dim, "hidden": self.hidden, "n_layers": self.n_layers, "dropout": self.dropout}

    def set_normalization(self, x: Tensor, y: Tensor) -> None:
        self.x_mean.copy_(x.mean(0))
        self.x_std.copy_(x.std(0, unbiased=False).clamp_min(1e-6))
        self.y_mean.copy_(y.mean())
        self.y_std.copy_(y.std(unbiased=False).clamp_min(1e-6))

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 2 or x.shape[1] != self.in_dim:
            raise ValueError(f"features must be [N, {self.in_dim}], got {tuple(x.shape)}")
        z = (x - self.x_mean) / self.x_std
        out: Tensor = self.net(z)
        return out.squeeze(-1) * self.y_std + self.y_mean


def regressor_loss(pred: Tensor, target: Tensor) -> LossOutput:
    """DISA eq. (9) per batch: ``mean_x (log Z_psi(x) - log Z_hat_M(x))^2``; the label is detached. No metrics."""
    nonempty("pred", pred, 0)
    same_shape("pred", pred, "target", target)
    no_nan_at(None, pred=pred, target=target)
    return LossOutput(((pred - target.detach()) ** 2).mean())


def r2_score(pred: Tensor, target: Tensor) -> float:
    """Coefficient of determination ``1 - SS_res / SS_tot`` (NaN when the target is constant)."""
    ss_res = float(((pred - target) ** 2).sum())
    ss_tot = float(((target - target.mean()) ** 2).sum())
    return 1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan")


@dataclass
class FitResult:
    """Result of :func:`fit_regressor`.

    Attributes:
        model: the fitted regressor (eval mode), best validation epoch restored.
        train_mse, val_mse, val_r2: at the restored epoch.
        baseline_val_mse: MSE of predicting the training-label mean (what R² = 0 means).
        history: per-epoch ``train_mse`` / ``val_mse`` lists.
        train_idx, val_idx: the split.
    """

    model: PartitionRegressor
    train_mse: float
    val_mse: float
    val_r2: float
    baseline_val_mse: float
    best_epoch: int
    history: dict[str, list[float]] = field(default_factory=dict)
    train_idx: Tensor | None = None
    val_idx: Tensor | None = None


def fit_regressor(
    features: Tensor,
    targets: Tensor,
    val_fraction: float = 0.2,
    epochs: int = 300,
    lr: float = 3e-3,
    weight_decay: float = 1e-4,
    hidden: int = 256,
    n_layers: int = 2,
    batch_size: int | None = None,
    seed: int = 0,
    progress: bool = False,
    on_epoch: Callable[[int, float, float], None] | None = None,
) -> FitResult:
    """Fit :class:`PartitionRegressor` by least squares (DISA eq. 9) with a held-out split.

    Args:
        features: ``[N, D]`` frozen prompt embeddings / features (float).
        targets: ``[N]`` Stage-1 labels ``log Z_hat_M`` (finite).
        val_fraction: fraction held out (at least one example each side).
        epochs: full passes; the epoch with the lowest validation MSE is restored (early stopping).
        batch_size: mini-batch size (None = full batch).
        on_epoch: called as ``on_epoch(epoch, train_mse, val_mse)`` after each epoch (progress reporting).
    """
    ndim("features", features, 2, "[N, D]")
    ndim("targets", targets, 1, "[N]")
    n = features.shape[0]
    if targets.shape[0] != n:
        raise ValueError(f"{n} feature rows but {targets.shape[0]} targets")
    if not torch.isfinite(targets).all():
        raise ValueError("targets must be finite (drop prompts whose label is -inf: no weight reached them)")
    if not 0.0 < val_fraction < 1.0:
        raise ValueError("val_fraction must be in (0, 1)")
    n_val = max(1, round(val_fraction * n))
    if n - n_val < 2:
        raise ValueError(f"need at least 3 examples to fit with a held-out split, got {n}")
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n, generator=gen)
    val_idx, train_idx = perm[:n_val], perm[n_val:]
    x = features.detach().float()
    y = targets.detach().float()
    xt, yt, xv, yv = x[train_idx], y[train_idx], x[val_idx], y[val_idx]

    torch.manual_seed(seed)
    model = PartitionRegressor(x.shape[1], hidden, n_layers)
    model.set_normalization(xt, yt)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    bs = batch_size or xt.shape[0]
    hist: dict[str, list[float]] = {"train_mse": [], "val_mse": []}
    best_val, best_epoch, best_state = math.inf, 0, {k: v.clone() for k, v in model.state_dict().items()}
    it: Iterable[int] = range(epochs)
    if progress:
        from tqdm.auto import tqdm  # type: ignore[import-untyped]  # tqdm ships no type stubs

        it = tqdm(it, desc="stage2 fit", unit="epoch")
    for ep in it:
        model.train()
        order = torch.randperm(xt.shape[0], generator=gen)
        for s in range(0, xt.shape[0], bs):
            idx = order[s : s + bs]
            loss = regressor_loss(model(xt[idx]), yt[idx]).loss
            opt.zero_grad()
            torch.autograd.backward(loss)
            opt.step()
        model.eval()
        with torch.no_grad():
            tr = float(((model(xt) - yt) ** 2).mean())
            va = float(((model(xv) - yv) ** 2).mean())
        hist["train_mse"].append(tr)
        hist["val_mse"].append(va)
        if on_epoch is not None:
            on_epoch(ep, tr, va)
        if va < best_val:
            best_val, best_epoch, best_state = va, ep, {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(best_state)
    model.eval()
    with torch.no_grad():
        pv = model(xv)
        train_mse = float(((model(xt) - yt) ** 2).mean())
    return FitResult(
        model=model,
        train_mse=train_mse,
        val_mse=float(((pv - yv) ** 2).mean()),
        val_r2=r2_score(pv, yv),
        baseline_val_mse=float(((yt.mean() - yv) ** 2).mean()),
        best_epoch=best_epoch,
        history=hist,
        train_idx=train_idx,
        val_idx=val_idx,
    )
