"""Memory-lean fused linear + softmax statistics (per-token log-probs, FPA log-probs, entropy).

Scoring a completion under a causal LM needs, per token ``n``, statistics of
``softmax(z_n)`` where the logits are a linear read-out of the final hidden state,

    z_n = (h_n W^T + b) / T                                  # [V] per token, W: [V, H]

Materializing ``z`` for ``N`` tokens costs ``N * V`` floats -- 2.5 GB in float32 at
``N = 4096`` tokens and Qwen's ``V = 151,936`` -- plus as much again for the log-softmax and
for its gradient. The functions here never build ``[N, V]``: they stream over token chunks
(``token_chunk`` rows of ``h``) and vocabulary chunks (``vocab_chunk`` rows of ``W``), keep an
online log-sum-exp per token (running max ``m``, ``s = sum exp(z - m)`` and, for the entropy,
``t = sum exp(z - m) (z - m)``) in float32 (float64 for float64 inputs), and read the target
logit with a per-token dot product ``h_n . W[ids_n]``. The largest temporary is one
``[token_chunk, vocab_chunk]`` tile (plus one more of the same size).

Backward is a custom :class:`torch.autograd.Function` (in :mod:`._fused_kernel`) that recomputes each tile from the
saved inputs and the saved per-token ``lse`` (and entropy), so it also never holds ``[N, V]``:

    d log p(y_n) / d z_n   = onehot(y_n) - p_n
    d H_n        / d z_n   = -p_n * (log p_n + H_n)            (H_n = -sum_v p log p)
    dz_n/dh_n = W^T / T,  dz_n/dW = h_n / T,  dz_n/db = 1 / T  (times each term's coefficient)

It is the pure-PyTorch analogue of Liger-Kernel's chunked fused-linear losses,
written for *per-token* outputs (a scalar-loss fused kernel can
pre-compute gradients in the forward pass; a per-token output cannot, hence recomputation).

The FPA variant (FPA Sec. 2.3, eqs. 4-5) streams two read-outs
at once: ``z = (1 + lam) h_theta W_theta^T - lam h_ref W_ref^T`` and
``pi_hat = softmax(z) ∝ pi_theta^(1+lam) pi_ref^(-lam)``.

Precision: tiles, running statistics and gradient accumulators are float32 for float32,
bfloat16 and float16 inputs (float64 for float64). On CPU, low-precision operands are upcast
chunk by chunk; on CUDA the matmul keeps bf16/fp16 operands and asks for a float32 result
(``torch.mm(..., out_dtype=torch.float32)``, falling back to an upcast). Outputs are in that
accumulation dtype (float32 for bf16 inputs); gradients come back in each input's dtype.

Shapes: ``hidden`` is ``[N, H]`` (or ``[B, T, H]``, flattened), ``weight`` ``[V, H]``,
``ids`` ``[N]`` (or ``[B, T]``), outputs ``[N]`` (or ``[B, T]``). Positions excluded by
``mask`` (float/bool, nonzero = keep) or with ``ids == ignore_index`` are not computed; their
output is 0 and they receive no gradient.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from tiltlab.objectives._fused_kernel import _acc_dtype, _FusedLinearSoftmax

__all__ = [
    "DEFAULT_CUDA_TOKEN_CHUNK",
    "DEFAULT_CUDA_VOCAB_CHUNK",
    "DEFAULT_TOKEN_CHUNK",
    "DEFAULT_VOCAB_CHUNK",
    "fused_linear_entropy",
    "fused_linear_future_logprobs",
    "fused_linear_logprobs",
    "fused_linear_logprobs_and_entropy",
]

#: Default CPU tile: 256 tokens x 4096 vocabulary entries = 4 MiB per float32 tile (cache
#: friendly). Tuned on a 2-core AVX2 CPU at V = 151,936, H = 512 (benchmarks/README.md:
#: process CPU time 8.6 s vs 9.6 s for 1024 x 8192 at N = 1024).
DEFAULT_TOKEN_CHUNK = 256
DEFAULT_VOCAB_CHUNK = 4096
#: Default CUDA tile: 2048 x 16384 = 128 MiB float32 (fewer, larger kernels). Not tuned on
#: hardware; pass token_chunk / vocab_chunk to override.
DEFAULT_CUDA_TOKEN_CHUNK = 2048
DEFAULT_CUDA_VOCAB_CHUNK = 16384


# ----------------------------------------------------------------------------------------------
# input handling


def _check_chunk(name: str, x: int | None, device: torch.device) -> int:
    if x is None:
        cuda = device.type == "cuda"
        if name == "token_chunk":
            return DEFAULT_CUDA_TOKEN_CHUNK if cuda else DEFAULT_TOKEN_CHUNK
        return DEFAULT_CUDA_VOCAB_CHUNK if cuda else DEFAULT_VOCAB_CHUNK
    if isinstance(x, bool) or not isinstance(x, int) or x < 1:
        raise ValueError(f"{name} must be a positive int; got {x!r}")
    return x


def _check_pair(tag: str, hidden: Tensor, weight: Tensor, bias: Tensor | None) -> None:
    if not isinstance(hidden, Tensor) or not isinstance(weight, Tensor):
        raise ValueError(f"{tag}: hidden and weight must be tensors")
    if not hidden.is_floating_point() or hidden.dtype not in (
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
    ):
        raise ValueError(f"{tag}: hidden must be float16/bfloat16/float32/float64; got {hidden.dtype}")
    if hidden.dim() not in (2, 3):
        raise ValueError(f"{tag}: hidden must be [N, H] or [B, T, H]; got shape {tuple(hidden.shape)}")
    if weight.dim() != 2:
        raise ValueError(f"{tag}: weight must be [V, H]; got shape {tuple(weight.shape)}")
    if weight.shape[1] != hidden.shape[-1]:
        raise ValueError(
            f"{tag}: hidden size mismatch: hidden [..., {hidden.shape[-1]}] vs weight [V, {weight.shape[1]}]"
        )
    if weight.shape[0] < 1:
        raise ValueError(f"{tag}: weight has an empty vocabulary")
    if weight.dtype != hidden.dtype:
        raise ValueError(f"{tag}: hidden ({hidden.dtype}) and weight ({weight.dtype}) must share a dtype")
    if weight.device != hidden.device:
        raise ValueError(f"{tag}: hidden ({hidden.device}) and weight ({weight.device}) must be on one device")
    if bias is not None:
        if not isinstance(bias, Tensor) or bias.shape != (weight.shape[0],):
            raise ValueError(f"{tag}: bias must be [V] = [{weight.shape[0]}]; got {getattr(bias, 'shape', bias)}")
        if bias.dtype != hidden.dtype or bias.device != hidden.device:
            raise ValueError(f"{tag}: bias must match hidden's dtype and device")


def _flatten_and_select(
    hiddens: Sequence[Tensor],
    ids: Tensor | None,
    mask: Tensor | None,
    ignore_index: int | None,
    vocab: int,
) -> tuple[list[Tensor], Tensor | None, Tensor | None, tuple[int, ...]]:
    """Flatten ``[B, T, H]`` to ``[N, H]``; return (hiddens, ids, keep_idx or None, lead_shape)."""
    lead = tuple(hiddens[0].shape[:-1])
    for h in hiddens[1:]:
        if tuple(h.shape[:-1]) != lead:
            raise ValueError(f"hidden states disagree on leading shape: {lead} vs {tuple(h.shape[:-1])}")
    n = math.prod(lead)
    if n == 0:
        raise ValueError("no tokens: hidden has an empty leading dimension")
    flat = [h.reshape(n, h.shape[-1]) for h in hiddens]
    keep = None
    if ids is not None:
        if not isinstance(ids, Tensor) or ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
            raise ValueError(f"ids must be an integer tensor; got {getattr(ids, 'dtype', type(ids))}")
        if tuple(ids.shape) != lead:
            raise ValueError(f"ids must have shape {lead} (hidden's leading shape); got {tuple(ids.shape)}")
        if ids.device != flat[0].device:
            raise ValueError(f"ids ({ids.device}) must be on hidden's device ({flat[0].device})")
        ids = ids.reshape(n).long()
        if ignore_index is not None:
            keep = ids != ignore_index
    if mask is not None:
        if not isinstance(mask, Tensor) or tuple(mask.shape) != lead:
            raise ValueError(f"mask must have shape {lead}; got {tuple(getattr(mask, 'shape', ()))}")
        m = mask.reshape(n).to(flat[0].device)
        if m.dtype != torch.bool:
            if bool(((m != 0) & (m != 1)).any()):
                raise ValueError("mask must be boolean or 0/1 (nonzero = keep); got other values")
            m = m != 0
        keep = m if keep is None else keep & m
    keep_idx = None
    if keep is not None and not bool(keep.all()):
        keep_idx = keep.nonzero().squeeze(1)
        flat = [h.index_select(0, keep_idx) for h in flat]
        if ids is not None:
            ids = ids.index_select(0, keep_idx)
    if ids is not None and ids.numel():
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= vocab:
            raise ValueError(
                f"ids out of range [0, {vocab}) at kept positions (min {lo}, max {hi}); "
                f"mask them or set them to ignore_index={ignore_index}"
            )
    return flat, ids, keep_idx, lead


def _scatter_back(x: Tensor, keep_idx: Tensor | None, lead: tuple[int, ...]) -> Tensor:
    n = math.prod(lead)
    if keep_idx is not None:
        x = x.new_zeros(n).index_copy(0, keep_idx, x)
    return x.reshape(lead)


def _run(
    pairs: Sequence[tuple[Tensor, Tensor, Tensor | None]],
    coefs: Sequence[float],
    ids: Tensor | None,
    mask: Tensor | None,
    ignore_index: int | None,
    want_logp: bool,
    want_entropy: bool,
    token_chunk: int | None,
    vocab_chunk: int | None,
) -> tuple[Tensor, Tensor]:
    """Validate, flatten, run the fused kernel and scatter back; an output not asked for is empty."""
    dev = pairs[0][0].device
    tc = _check_chunk("token_chunk", token_chunk, dev)
    vc = _check_chunk("vocab_chunk", vocab_chunk, dev)
    vocab = pairs[0][1].shape[0]
    for _, w, _b in pairs[1:]:
        if w.shape[0] != vocab:
            raise ValueError(f"weights disagree on vocabulary size: {vocab} vs {w.shape[0]}")
    hiddens, ids, keep_idx, lead = _flatten_and_select([p[0] for p in pairs], ids, mask, ignore_index, vocab)
    acc = _acc_dtype(hiddens[0].dtype)
    if hiddens[0].shape[0] == 0:  # everything masked
        zero = torch.zeros(lead, dtype=acc, device=hiddens[0].device)
        # keep the graph connected so .backward() works and yields zero gradients
        z = torch.stack([p[0].sum() * 0 + p[1].sum() * 0 for p in pairs]).sum()
        return zero + z.to(acc), zero + z.to(acc)
    if ids is None:
        ids = torch.zeros(hiddens[0].shape[0], dtype=torch.long, device=hiddens[0].device)
    flat: list[Tensor | None] = []
    for h, (_, w, b) in zip(hiddens, pairs):
        flat += [h, w, b]
    logp, ent = _FusedLinearSoftmax.apply(ids, tuple(coefs), want_logp, want_entropy, tc, vc, *flat)  # type: ignore[no-untyped-call]  # Function.apply is untyped in torch
    logp = _scatter_back(logp, keep_idx, lead) if want_logp else logp
    ent = _scatter_back(ent, keep_idx, lead) if want_entropy else ent
    return logp, ent


def _check_temperature(temperature: float) -> float:
    t = float(temperature)
    if not (t > 0 and math.isfinite(t)):
        raise ValueError(f"temperature must be a finite number > 0; got {temperature!r}")
    return t


# ----------------------------------------------------------------------------------------------
# public API


def fused_linear_logprobs(
    hidden: Tensor,
    weight: Tensor,
    ids: Tensor,
    *,
    bias: Tensor | None = None,
    temperature: float = 1.0,
    mask: Tensor | None = None,
    ignore_index: int | None = -100,
    token_chunk: int | None = None,
    vocab_chunk: int | None = None,
) -> Tensor:
    """Per-token log-probs ``log softmax((h W^T + b) / T)[ids]`` without materializing ``[N, V]``.

    Teacher-forced scoring: ``logp_n = z_n[y_n] - LSE_v z_n[v]`` with
    ``z_n = (h_n W^T + b) / T``; the sequence log-prob is the masked sum over ``T``
    (``objectives.tb.sequence_logprob``). Gradients flow to ``hidden``, ``weight`` and ``bias``
    through a chunk-recomputing backward.

    Args:
        hidden: ``[N, H]`` or ``[B, T, H]`` final hidden states (already shifted so position
            ``n`` predicts ``ids[n]``).
        weight: ``[V, H]`` output embedding (``lm_head.weight``).
        ids: ``[N]`` or ``[B, T]`` target token ids.
        bias: optional ``[V]`` output bias.
        temperature: ``T > 0``; logits are divided by it.
        mask: optional ``[N]`` / ``[B, T]`` bool or 0/1 float; zero positions are skipped.
        ignore_index: positions with this id are skipped (``None`` disables).
        token_chunk, vocab_chunk: tile size (None: the CPU or CUDA default above); peak extra
            memory is about ``2 * token_chunk * vocab_chunk`` floats plus ``[N, H]`` and
            ``[vocab_chunk, H]`` float32 gradient accumulators.

    Returns:
        ``[N]`` or ``[B, T]`` log-probs, float32 (float64 for float64 inputs); 0 at skipped
        positions.
    """
    _check_pair("fused_linear_logprobs", hidden, weight, bias)
    t = _check_temperature(temperature)
    logp, _ = _run([(hidden, weight, bias)], [1.0 / t], ids, mask, ignore_index, True, False, token_chunk, vocab_chunk)
    return logp


def fused_linear_future_logprobs(
    h_theta: Tensor,
    w_theta: Tensor,
    h_ref: Tensor,
    w_ref: Tensor,
    ids: Tensor,
    lam: float,
    *,
    bias_theta: Tensor | None = None,
    bias_ref: Tensor | None = None,
    temperature: float = 1.0,
    mask: Tensor | None = None,
    ignore_index: int | None = -100,
    token_chunk: int | None = None,
    vocab_chunk: int | None = None,
) -> Tensor:
    """FPA future-policy log-probs, streamed: ``log softmax((1+lam) z_theta - lam z_ref)[ids]``.

    FPA (Sec. 2.3): eq. (4)
    ``pi_hat = softmax((1 + lam) h_theta - lam h_ref)`` on next-token logits, equivalently
    eq. (5) ``pi_hat ∝ pi_theta^(1+lam) pi_ref^(-lam)``. Here the logits are read out of two
    hidden-state/weight pairs, ``z_theta = (h_theta W_theta^T + b_theta) / T`` and
    ``z_ref = (h_ref W_ref^T + b_ref) / T``. ``lam = 0`` gives ``fused_linear_logprobs`` of
    the theta pair. The reference is frozen: ``h_ref``, ``w_ref`` and ``bias_ref`` are detached,
    gradients flow to the theta side only (FPA itself uses ``pi_hat`` detached, as a weight,
    eq. 3; detach the result for that).

    Args:
        h_theta: ``[N, H]`` or ``[B, T, H]``; w_theta: ``[V, H]``.
        h_ref: same leading shape as ``h_theta`` (its own hidden size ``H'``); w_ref: ``[V, H']``.
        ids: ``[N]`` / ``[B, T]``; lam: extrapolation strength ``>= 0``.
        Other arguments as in :func:`fused_linear_logprobs`.

    Returns:
        ``[N]`` / ``[B, T]`` log pi_hat(ids), float32 (float64 for float64 inputs).
    """
    _check_pair("fused_linear_future_logprobs (theta)", h_theta, w_theta, bias_theta)
    _check_pair("fused_linear_future_logprobs (ref)", h_ref, w_ref, bias_ref)
    if h_ref.dtype != h_theta.dtype:
        raise ValueError(f"h_theta ({h_theta.dtype}) and h_ref ({h_ref.dtype}) must share a dtype")
    lam = float(lam)
    if not (lam >= 0 and math.isfinite(lam)):
        raise ValueError(f"lam must be a finite number >= 0 (FPA eq. 4); got {lam!r}")
    t = _check_temperature(temperature)
    pairs = [(h_theta, w_theta, bias_theta)]
    coefs = [(1.0 + lam) / t]
    if lam != 0.0:
        pairs.append((h_ref.detach(), w_ref.detach(), None if bias_ref is None else bias_ref.detach()))
        coefs.append(-lam / t)
    elif tuple(h_ref.shape[:-1]) != tuple(h_theta.shape[:-1]) or w_ref.shape[0] != w_theta.shape[0]:
        raise ValueError("h_ref / w_ref shapes do not match h_theta / w_theta")
    logp, _ = _run(pairs, coefs, ids, mask, ignore_index, True, False, token_chunk, vocab_chunk)
    return logp


def fused_linear_entropy(
    hidden: Tensor,
    weight: Tensor,
    *,
    bias: Tensor | None = None,
    temperature: float = 1.0,
    mask: Tensor | None = None,
    token_chunk: int | None = None,
    vocab_chunk: int | None = None,
) -> Tensor:
    """Per-token entropy ``H_n = -sum_v p_nv log p_nv`` of ``p_n = softmax((h_n W^T + b) / T)``.

    Streamed with an online (max, sum exp, sum exp * shifted logit) so that
    ``H = log s - t / s`` (see ``_fused_kernel._online_stats``); differentiable, with
    ``dH/dz = -p (log p + H)`` recomputed tile by tile in backward.

    Args / shapes as in :func:`fused_linear_logprobs` (no ``ids``). Returns ``[N]`` /
    ``[B, T]`` entropies in nats; 0 at masked positions.
    """
    _check_pair("fused_linear_entropy", hidden, weight, bias)
    t = _check_temperature(temperature)
    _, ent = _run([(hidden, weight, bias)], [1.0 / t], None, mask, None, False, True, token_chunk, vocab_chunk)
    return ent


def fused_linear_logprobs_and_entropy(
    hidden: Tensor,
    weight: Tensor,
    ids: Tensor,
    *,
    bias: Tensor | None = None,
    temperature: float = 1.0,
    mask: Tensor | None = None,
    ignore_index: int | None = -100,
    token_chunk: int | None = None,
    vocab_chunk: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Both :func:`fused_linear_logprobs` and :func:`fused_linear_entropy` in one streamed pass.

    Returns ``(logp, entropy)``, each ``[N]`` / ``[B, T]``; a position skipped through
    ``mask`` or ``ignore_index`` is 0 in both. Gradients of both flow (one backward pass).
    """
    _check_pair("fused_linear_logprobs_and_entropy", hidden, weight, bias)
    t = _check_temperature(temperature)
    return _run([(hidden, weight, bias)], [1.0 / t], ids, mask, ignore_index, True, True, token_chunk, vocab_chunk)
