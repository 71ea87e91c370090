"""The streaming kernel behind :mod:`tiltlab.objectives.fused` (private; the public functions and their input
checks live there).

Per token chunk and vocabulary chunk it builds one ``[token_chunk, vocab_chunk]`` tile of
``z = sum_k coef_k (h_k W_k^T + b_k) / T``, keeps an online log-sum-exp per token (running max ``m``,
``s = sum exp(z - m)`` and, for the entropy, ``t = sum exp(z - m) (z - m)``) and reads the target logit with a
per-token dot product. Backward (:class:`_FusedLinearSoftmax`) recomputes each tile from the saved inputs and
the saved per-token ``lse`` (and entropy):

    d log p(y_n) / d z_n   = onehot(y_n) - p_n
    d H_n        / d z_n   = -p_n * (log p_n + H_n)            (H_n = -sum_v p log p)
    dz_n/dh_n = W^T / T,  dz_n/dW = h_n / T,  dz_n/db = 1 / T  (times each term's coefficient)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor


def _unflatten(flat: Sequence[Tensor | None]) -> tuple[list[Tensor], list[Tensor], list[Tensor | None]]:
    """``(h_0, W_0, b_0, h_1, ...)`` -> hiddens, weights, biases (only biases may be None)."""
    hs, ws = list(flat[0::3]), list(flat[1::3])
    if any(x is None for x in hs + ws):
        raise ValueError("hidden states and weights must be tensors")
    return [h for h in hs if h is not None], [w for w in ws if w is not None], list(flat[2::3])


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype: float64 for float64 inputs, float32 otherwise."""
    return torch.float64 if dtype == torch.float64 else torch.float32


_CUDA_OUT_DTYPE_MM: bool | None = None  # whether torch.mm(..., out_dtype=) works on CUDA


def _mm(a: Tensor, b: Tensor, acc: torch.dtype) -> Tensor:
    """``a @ b`` with an ``acc``-dtype result; ``b``'s dtype decides the operand dtype.

    Equal dtypes: a plain matmul. Otherwise (CUDA, low-precision ``b``): ``a`` is cast to
    ``b``'s dtype and the product is accumulated and returned in ``acc``.
    """
    global _CUDA_OUT_DTYPE_MM
    if a.dtype != b.dtype:
        a = a.to(b.dtype)
    if a.dtype == acc:
        return torch.mm(a, b)
    if _CUDA_OUT_DTYPE_MM is not False:
        try:
            out = torch.mm(a, b, out_dtype=acc)
            _CUDA_OUT_DTYPE_MM = True
            return out
        except (RuntimeError, TypeError, NotImplementedError):
            _CUDA_OUT_DTYPE_MM = False
    return torch.mm(a, b).to(acc)


def _operand(x: Tensor, acc: torch.dtype) -> Tensor:
    """Operand as used by the tile matmuls: upcast to ``acc`` except low precision on CUDA."""
    if x.dtype == acc or (x.is_cuda and acc == torch.float32):
        return x
    return x.to(acc)


def _chunks(n: int, size: int) -> Iterator[tuple[int, int]]:
    for start in range(0, n, size):
        yield start, min(start + size, n)


class _Terms:
    """The read-out ``z = sum_k c_k (h_k W_k^T + b_k)``; ``c_k`` already includes ``1/T``."""

    def __init__(
        self,
        hiddens: Sequence[Tensor],
        weights: Sequence[Tensor],
        biases: Sequence[Tensor | None],
        coefs: Sequence[float],
        acc: torch.dtype,
    ) -> None:
        self.h = list(hiddens)
        self.w = list(weights)
        self.b = list(biases)
        self.c = [float(c) for c in coefs]
        self.acc = acc
        # operands for the tile matmuls (upcast once for h, per vocab chunk for W)
        self.h_op = [_operand(h, acc) for h in self.h]
        bias: Tensor | None = None
        for b, c in zip(self.b, self.c):
            if b is not None:
                bias = b.to(acc) * c if bias is None else bias.add(b.to(acc), alpha=c)
        self.bias = bias  # [V] combined, acc dtype, or None

    def weight_ops(self, v0: int, v1: int) -> list[Tensor]:
        """Transposed weight chunks ``[H, vc]`` as tile operands."""
        return [_operand(w[v0:v1], self.acc).t() for w in self.w]

    def tile(self, t0: int, t1: int, v0: int, v1: int, w_ops: Sequence[Tensor]) -> Tensor:
        """Logits tile ``z[t0:t1, v0:v1]`` in the accumulation dtype, ``[tc, vc]``."""
        tile: Tensor | None = None
        for h_op, w_t, c in zip(self.h_op, w_ops, self.c):
            h_t = h_op[t0:t1]
            if tile is None:
                tile = _mm(h_t, w_t, self.acc)
                if c != 1.0:
                    tile.mul_(c)
            elif h_t.dtype == self.acc and w_t.dtype == self.acc:
                tile.addmm_(h_t, w_t, alpha=c)
            else:
                tile.add_(_mm(h_t, w_t, self.acc), alpha=c)
        assert tile is not None  # at least one read-out term (checked at entry)
        if self.bias is not None:
            tile.add_(self.bias[v0:v1])
        return tile

    def target_logit(self, ids: Tensor) -> Tensor:
        """``z_n[ids_n]`` by per-token dot products, ``[N]`` in the accumulation dtype."""
        out: Tensor | None = None
        for h, w, b, c in zip(self.h, self.w, self.b, self.c):
            z = (h.to(self.acc) * w.index_select(0, ids).to(self.acc)).sum(-1)
            if b is not None:
                z = z + b.index_select(0, ids).to(self.acc)
            out = z * c if out is None else out.add(z, alpha=c)
        assert out is not None
        return out


def _online_stats(terms: _Terms, n: int, v: int, want_entropy: bool, tc: int, vc: int) -> tuple[Tensor, Tensor | None]:
    """Stream all tiles; return ``lse [N]`` and (if asked) ``entropy [N]``.

    Per token, after every vocabulary chunk the running (m, s, t) hold the max ``m``,
    ``s = sum exp(z - m)`` and ``t = sum exp(z - m)(z - m)`` over the chunks seen so far;
    merging a chunk with (m', s', t') at the new max M uses
    ``s <- s e^{m-M} + s' e^{m'-M}``, ``t <- e^{m-M}(t + (m-M)s) + e^{m'-M}(t' + (m'-M)s')``.
    At the end ``lse = m + log s`` and ``H = log s - t/s`` (no cancellation for large logits).
    """
    acc = terms.acc
    dev = terms.h[0].device
    m = torch.empty(n, dtype=acc, device=dev)
    s = torch.empty(n, dtype=acc, device=dev)
    t = torch.empty(n if want_entropy else 0, dtype=acc, device=dev)  # empty unless the entropy is asked for
    first = True
    for v0, v1 in _chunks(v, vc):
        w_ops = terms.weight_ops(v0, v1)
        for t0, t1 in _chunks(n, tc):
            tile = terms.tile(t0, t1, v0, v1, w_ops)  # [tc, vc]
            m_c = tile.amax(dim=1)  # [tc]
            tile.sub_(m_c[:, None])  # z - m_c
            if want_entropy:
                e = tile.exp()
                s_c = e.sum(dim=1)
                t_c = e.mul_(tile).sum(dim=1)
                del e
            else:
                s_c = tile.exp_().sum(dim=1)
            del tile
            if first:
                m[t0:t1], s[t0:t1] = m_c, s_c
                if want_entropy:
                    t[t0:t1] = t_c
                continue
            m_old = m[t0:t1]
            m_new = torch.maximum(m_old, m_c)
            a_old = (m_old - m_new).exp_()
            a_c = (m_c - m_new).exp_()
            s_old = s[t0:t1]
            if want_entropy:
                t[t0:t1] = a_old * (t[t0:t1] + (m_old - m_new) * s_old) + a_c * (t_c + (m_c - m_new) * s_c)
            s[t0:t1] = s_old * a_old + s_c * a_c
            m[t0:t1] = m_new
        first = False
    log_s = s.log()
    lse = m + log_s
    entropy = (log_s - t / s) if want_entropy else None
    return lse, entropy


class _FusedLinearSoftmax(torch.autograd.Function):
    """Per-token ``log softmax(z)[ids]`` and/or entropy of ``softmax(z)``, ``z = sum_k c_k(h_k W_k^T + b_k)``.

    forward(ctx, ids, coefs, want_logp, want_entropy, token_chunk, vocab_chunk, *flat)
    with ``flat = (h_0, W_0, b_0, h_1, W_1, b_1, ...)`` (``b_k`` may be None).
    Returns ``(logp [N], entropy [N])``; an output not asked for is an empty tensor.
    """

    @staticmethod
    def forward(
        ctx: Any,
        ids: Tensor,
        coefs: tuple[float, ...],
        want_logp: bool,
        want_entropy: bool,
        tc: int,
        vc: int,
        *flat: Tensor | None,
    ) -> tuple[Tensor, Tensor]:
        hs, ws, bs = _unflatten(flat)
        acc = _acc_dtype(hs[0].dtype)
        n, v = hs[0].shape[0], ws[0].shape[0]
        terms = _Terms(hs, ws, bs, coefs, acc)
        with torch.no_grad():
            lse, entropy = _online_stats(terms, n, v, want_entropy, tc, vc)
            logp = terms.target_logit(ids) - lse if want_logp else lse.new_empty(0)
        if entropy is None:
            entropy = lse.new_empty(0)
        ctx.save_for_backward(ids, lse, entropy if want_entropy else None, *flat)
        ctx.cfg = (tuple(coefs), want_logp, want_entropy, tc, vc)
        if not want_logp:
            ctx.mark_non_differentiable(logp)
        if not want_entropy:
            ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, g_logp: Tensor | None, g_ent: Tensor | None) -> tuple[Tensor | None, ...]:
        ids, lse, entropy, *flat = ctx.saved_tensors
        coefs, want_logp, want_entropy, tc, vc = ctx.cfg
        hs, ws, bs = _unflatten(flat)
        n_fixed = 6
        need = ctx.needs_input_grad[n_fixed:]
        need_h, need_w, need_b = need[0::3], need[1::3], need[2::3]
        acc = _acc_dtype(hs[0].dtype)
        n, v = hs[0].shape[0], ws[0].shape[0]
        terms = _Terms(hs, ws, bs, coefs, acc)
        g1 = g_logp.to(acc) if (want_logp and g_logp is not None) else None  # [N]
        g2 = g_ent.to(acc) if (want_entropy and g_ent is not None) else None  # [N]
        K = len(hs)
        out: list[Tensor | None] = [None] * (3 * K)
        if g1 is None and g2 is None:
            return (None,) * n_fixed + tuple(out)
        gh: list[Tensor | None] = [
            torch.zeros(hs[k].shape, dtype=acc, device=hs[k].device) if need_h[k] else None for k in range(K)
        ]
        # weight grads are written chunk by chunk in the weight's dtype; a float32 [vc, H]
        # accumulator is used per chunk when that dtype is lower precision
        gw: list[Tensor | None] = [torch.empty_like(ws[k]) if need_w[k] else None for k in range(K)]
        gb: list[Tensor | None] = [
            torch.zeros(v, dtype=acc, device=ws[k].device) if (need_b[k] and bs[k] is not None) else None
            for k in range(K)
        ]
        any_w = any(g is not None for g in gw)
        # The one-hot part of d logp/dz: grad += c_k * g1 * (W_k[ids] for h; h_k for W row ids; 1 for b).
        # For W we add it per vocabulary chunk (tokens sorted by id) so accumulation stays in acc.
        if g1 is not None and any_w:
            order = torch.argsort(ids)
            sorted_ids = ids.index_select(0, order)
            bounds = torch.searchsorted(
                sorted_ids, torch.arange(0, v + vc, vc, device=ids.device).clamp_(max=v)
            ).tolist()

        with torch.no_grad():
            for ci, (v0, v1) in enumerate(_chunks(v, vc)):
                w_ops = terms.weight_ops(v0, v1)  # [H, vc] each
                gw_c: list[Tensor | None] = [
                    None
                    if g is None
                    else (
                        g[v0:v1].zero_()
                        if g.dtype == acc
                        else torch.zeros(v1 - v0, g.shape[1], dtype=acc, device=g.device)
                    )
                    for g in gw
                ]  # [vc, H]
                for t0, t1 in _chunks(n, tc):
                    tile = terms.tile(t0, t1, v0, v1, w_ops)  # z
                    tile.sub_(lse[t0:t1, None])  # log p
                    p = tile.exp()
                    if g2 is not None:
                        assert entropy is not None
                        # -p * (g1 + g2 * (log p + H))
                        coef = tile.add_(entropy[t0:t1, None]).mul_(g2[t0:t1, None])
                        if g1 is not None:
                            coef.add_(g1[t0:t1, None])
                        gz = p.mul_(coef).neg_()
                    else:
                        assert g1 is not None
                        gz = p.mul_(g1[t0:t1, None].neg())
                    del tile
                    for k in range(K):
                        c = coefs[k]
                        gh_k, gw_ck, gb_k = gh[k], gw_c[k], gb[k]
                        if gh_k is not None:  # [tc, H] += c gz @ W_k[v0:v1]
                            w_k = w_ops[k].t()
                            if gz.dtype == w_k.dtype:
                                gh_k[t0:t1].addmm_(gz, w_k, alpha=c)
                            else:
                                gh_k[t0:t1].add_(_mm(gz, w_k, acc), alpha=c)
                        if gw_ck is not None:  # [vc, H] += c gz^T @ h_k[t0:t1]
                            h_k = terms.h_op[k][t0:t1]
                            if gz.dtype == h_k.dtype:
                                gw_ck.addmm_(gz.t(), h_k, alpha=c)
                            else:
                                gw_ck.add_(_mm(gz.t(), h_k, acc), alpha=c)
                        if gb_k is not None:
                            gb_k[v0:v1].add_(gz.sum(0), alpha=c)
                    del gz, p
                if g1 is not None and any_w:
                    sel = order[bounds[ci] : bounds[ci + 1]]
                    if sel.numel():
                        rows = ids.index_select(0, sel) - v0
                        gsel = g1.index_select(0, sel)[:, None]
                        for k in range(K):
                            gw_ck = gw_c[k]
                            if gw_ck is not None:
                                gw_ck.index_add_(0, rows, hs[k].index_select(0, sel).to(acc) * gsel, alpha=coefs[k])
                for k in range(K):
                    gw_ck, gw_k = gw_c[k], gw[k]
                    if gw_ck is not None and gw_k is not None and gw_k.dtype != acc:
                        gw_k[v0:v1].copy_(gw_ck)
                del gw_c
            if g1 is not None:
                for k in range(K):
                    gh_k, gb_k = gh[k], gb[k]
                    if gh_k is not None:
                        gh_k.add_(ws[k].index_select(0, ids).to(acc) * g1[:, None], alpha=coefs[k])
                    if gb_k is not None:
                        gb_k.index_add_(0, ids, g1, alpha=coefs[k])
        for k in range(K):
            gh_k, gb_k, b_k = gh[k], gb[k], bs[k]
            out[3 * k] = gh_k.to(hs[k].dtype) if gh_k is not None else None
            out[3 * k + 1] = gw[k]
            out[3 * k + 2] = gb_k.to(b_k.dtype) if (gb_k is not None and b_k is not None) else None
        return (None,) * n_fixed + tuple(out)
