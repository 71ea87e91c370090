"""Teacher-forced log-probs of given completions, without ``[B, T, V]`` float32 logits.

``log pi(y_t | x, y_<t)`` at temperature 1 for every completion token: the model *body* runs to
the final hidden states (``model.get_decoder()``), and the output projection + log-softmax +
gather is done by ``objectives.fused.fused_linear_logprobs(hidden[N, H], weight[V, H], ids[N])``,
which streams over token and vocabulary chunks with an online log-sum-exp. Only the ``N`` rows
that predict a completion token are projected. Gradients flow when ``grad=True`` (the fused
functions carry a custom autograd).

Also: FPA's extrapolated log-probs ``log softmax((1+lam) z_theta - lam z_ref)`` of the same
completions under two models (FPA paper §5, ``objectives.fused.fused_linear_future_logprobs``)
and the token entropy of ``pi`` (``objectives.fused.fused_linear_entropy``).

Layout: ``score_completions`` takes lists of prompt / completion token ids and returns
completion-aligned ``[B, T]`` tensors with a float ``mask``; sequence log-prob = masked sum
(``objectives.tb.sequence_logprob``). The lower-level :func:`token_logprobs_padded` takes any
padded batch (left or right padding; positions come from the attention mask).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from tqdm.auto import tqdm

from tiltlab.objectives.fused import (
    fused_linear_future_logprobs,
    fused_linear_logprobs,
    fused_linear_logprobs_and_entropy,
)
from tiltlab.objectives.tb import sequence_logprob

__all__ = [
    "ScoreOutput",
    "body_and_head",
    "build_batch",
    "hidden_states",
    "score_completions",
    "score_future_completions",
    "token_logprobs_padded",
]


# ---------------------------------------------------------------------------------------------
# model plumbing
# ---------------------------------------------------------------------------------------------


def body_and_head(model):
    """``(decoder_body, output_weight [V, H], output_bias [V] or None)`` of a causal LM (PEFT too).

    Raises ValueError for heads this path cannot reproduce exactly (logit soft-capping, logit
    scaling): those need the plain ``model(...).logits`` path.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = base.get_output_embeddings()
    if head is None or not hasattr(head, "weight"):
        raise ValueError(f"{type(base).__name__} has no output embedding (lm_head) weight")
    cfg = getattr(base, "config", None)
    for attr in ("final_logit_softcapping", "logit_scale", "logits_scaling"):
        v = getattr(cfg, attr, None)
        if v not in (None, 1, 1.0):
            raise ValueError(f"model config sets {attr}={v}; fused scoring would not match model(...).logits")
    body = base.get_decoder() if hasattr(base, "get_decoder") else getattr(base, base.base_model_prefix)
    return body, head.weight, getattr(head, "bias", None)


def hidden_states(model, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """Final hidden states ``[B, L, H]`` (after the last norm), positions from the mask (any padding)."""
    body, _, _ = body_and_head(model)
    pos = (attention_mask.long().cumsum(-1) - 1).clamp_min(0)
    out = body(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos, use_cache=False)
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


def token_logprobs_padded(
    model, input_ids: Tensor, attention_mask: Tensor, target_mask: Tensor, *, entropy: bool = False, grad: bool = False
) -> tuple[Tensor, Tensor | None]:
    """Teacher-forced ``log pi(input_ids[:, t] | input_ids[:, :t])`` where ``target_mask`` is 1.

    Args:
        input_ids: ``[B, L]``; attention_mask: ``[B, L]`` (1 = real token; left or right padding);
        target_mask: ``[B, L]`` float, 1 on the tokens to score (never position 0).
    Returns:
        ``(token_logp [B, L], token_entropy [B, L] or None)``, 0 where ``target_mask`` is 0; float32
        (float64 for a float64 model), the fused kernels' accumulation dtype.
        The entropy at ``t`` is that of the next-token distribution that predicts token ``t``.
    """
    if input_ids.dim() != 2 or attention_mask.shape != input_ids.shape or target_mask.shape != input_ids.shape:
        raise ValueError("input_ids, attention_mask and target_mask must all be [B, L]")
    if bool((target_mask[:, 0] > 0).any()):
        raise ValueError("target_mask[:, 0] must be 0: the first token has no context to be scored from")
    if bool(((target_mask > 0) & (attention_mask == 0)).any()):
        raise ValueError("target_mask marks padding positions")
    _, weight, bias = body_and_head(model)
    ctx = torch.enable_grad() if grad else torch.no_grad()
    with ctx:
        h = hidden_states(model, input_ids, attention_mask)[:, :-1]  # [B, L-1, H] predicts tokens 1..L-1
        sel = target_mask[:, 1:] > 0  # [B, L-1]
        ids = input_ids[:, 1:][sel]  # [N]
        hs = h[sel]  # [N, H]
        if entropy:
            lp_sel, e_sel = fused_linear_logprobs_and_entropy(hs, weight, ids, bias=bias, ignore_index=None)
        else:
            lp_sel, e_sel = fused_linear_logprobs(hs, weight, ids, bias=bias, ignore_index=None), None
        lp = torch.zeros(input_ids.shape, dtype=lp_sel.dtype, device=input_ids.device)
        lp[:, 1:] = lp[:, 1:].masked_scatter(sel, lp_sel)
        ent = None
        if entropy:
            ent = torch.zeros(input_ids.shape, dtype=e_sel.dtype, device=input_ids.device)
            ent[:, 1:] = ent[:, 1:].masked_scatter(sel, e_sel)
    return lp, ent


@dataclass
class ScoreOutput:
    """Completion-aligned scores: column ``t`` is completion token ``t``.

    ``token_logprobs``: ``[B, T]``; ``mask``: ``[B, T]`` float; ``seq_logprobs``: ``[B]`` (masked
    sum); ``entropy``: ``[B, T]`` or None.
    """

    token_logprobs: Tensor
    mask: Tensor
    seq_logprobs: Tensor
    entropy: Tensor | None = None


def build_batch(
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    pad_token_id: int,
    padding_side: str = "right",
    device=None,
):
    """Pack ``prompt + completion`` rows into ``(input_ids [B, L], attention_mask [B, L],
    target_mask [B, L], start [B])`` where ``start[b]`` is the column of the first completion token."""
    if len(prompt_ids) != len(completion_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(completion_ids)} completions")
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    rows = []
    for i, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
        if len(p) == 0:
            raise ValueError(f"row {i}: empty prompt (the first completion token needs a context)")
        rows.append((list(p), list(c)))
    width = max(len(p) + len(c) for p, c in rows)
    bsz = len(rows)
    input_ids = torch.full((bsz, width), int(pad_token_id), dtype=torch.long)
    attn = torch.zeros((bsz, width), dtype=torch.long)
    tgt = torch.zeros((bsz, width), dtype=torch.float32)
    start = torch.zeros(bsz, dtype=torch.long)
    for b, (p, c) in enumerate(rows):
        n = len(p) + len(c)
        off = 0 if padding_side == "right" else width - n
        input_ids[b, off : off + n] = torch.tensor(p + c, dtype=torch.long)
        attn[b, off : off + n] = 1
        tgt[b, off + len(p) : off + n] = 1.0
        start[b] = off + len(p)
    if device is not None:
        input_ids, attn, tgt, start = input_ids.to(device), attn.to(device), tgt.to(device), start.to(device)
    return input_ids, attn, tgt, start


def _to_completion_aligned(x: Tensor, start: Tensor, lengths: Tensor, t_max: int) -> Tensor:
    idx = start[:, None] + torch.arange(t_max, device=x.device)[None, :]  # [B, T]
    valid = torch.arange(t_max, device=x.device)[None, :] < lengths[:, None]
    return torch.where(
        valid, x.gather(1, idx.clamp_max(x.shape[1] - 1)), torch.zeros((), dtype=x.dtype, device=x.device)
    )


def score_completions(
    model,
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    *,
    pad_token_id: int = 0,
    batch_size: int = 16,
    padding_side: str = "right",
    entropy: bool = False,
    grad: bool = False,
    show_progress: bool = False,
) -> ScoreOutput:
    """Sequence and per-token log-probs (temperature 1) of ``completion_ids[b]`` given ``prompt_ids[b]``.

    Rows are scored in micro-batches of ``batch_size`` (results do not depend on it, nor on the
    padding side). Returns a :class:`ScoreOutput` on the model's device.
    """

    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    dev = next(model.parameters()).device
    bsz = len(completion_ids)
    t_max = max((len(c) for c in completion_ids), default=0)
    lengths_all = torch.tensor([len(c) for c in completion_ids], dtype=torch.long, device=dev)
    tok, ent = [], []
    for s in tqdm(range(0, bsz, batch_size), desc="scoring", disable=not show_progress, leave=False):
        ids, attn, tgt, start = build_batch(
            prompt_ids[s : s + batch_size], completion_ids[s : s + batch_size], pad_token_id, padding_side, dev
        )
        lp, e = token_logprobs_padded(model, ids, attn, tgt, entropy=entropy, grad=grad)
        lens = lengths_all[s : s + batch_size]
        tok.append(_to_completion_aligned(lp, start, lens, t_max))
        if entropy:
            ent.append(_to_completion_aligned(e, start, lens, t_max))
    token_lp = torch.cat(tok) if tok else torch.zeros(0, t_max, device=dev)
    mask = (torch.arange(t_max, device=dev)[None, :] < lengths_all[:, None]).to(token_lp.dtype)
    seq = sequence_logprob(token_lp, mask, normalize="sum") if t_max > 0 else torch.zeros(bsz, device=dev)
    return ScoreOutput(token_lp, mask, seq, torch.cat(ent) if entropy else None)


def score_future_completions(
    model_theta,
    model_ref,
    prompt_ids,
    completion_ids,
    lam: float,
    *,
    pad_token_id: int = 0,
    batch_size: int = 16,
    grad: bool = False,
) -> ScoreOutput:
    """FPA's extrapolated policy ``pi_hat ∝ exp((1+lam) z_theta - lam z_ref)`` scored on completions.

    FPA paper §5 (``future_policy_logprobs`` in ``objectives.offline`` is the naive
    ``[B, T, V]`` version); both models must share the tokenizer. ``model_ref`` runs without
    gradients; gradients flow into ``model_theta`` when ``grad=True``.
    """
    dev = next(model_theta.parameters()).device
    t_max = max((len(c) for c in completion_ids), default=0)
    lengths_all = torch.tensor([len(c) for c in completion_ids], dtype=torch.long, device=dev)
    _, w_theta, b_theta = body_and_head(model_theta)
    _, w_ref, b_ref = body_and_head(model_ref)
    out = []
    for s in range(0, len(completion_ids), batch_size):
        ids, attn, tgt, start = build_batch(
            prompt_ids[s : s + batch_size], completion_ids[s : s + batch_size], pad_token_id, "right", dev
        )
        sel = tgt[:, 1:] > 0
        with torch.no_grad():
            h_ref = hidden_states(model_ref, ids, attn)[:, :-1][sel]
        with torch.enable_grad() if grad else torch.no_grad():
            h_theta = hidden_states(model_theta, ids, attn)[:, :-1][sel]
            lp_sel = fused_linear_future_logprobs(
                h_theta,
                w_theta,
                h_ref.to(h_theta.dtype),
                w_ref,
                ids[:, 1:][sel],
                lam,
                bias_theta=b_theta,
                bias_ref=b_ref,
                ignore_index=None,
            )
            lp = torch.zeros(ids.shape, dtype=lp_sel.dtype, device=dev)
            lp[:, 1:] = lp[:, 1:].masked_scatter(sel, lp_sel)
        out.append(_to_completion_aligned(lp, start, lengths_all[s : s + batch_size], t_max))
    token_lp = torch.cat(out) if out else torch.zeros(0, t_max, device=dev)
    mask = (torch.arange(t_max, device=dev)[None, :] < lengths_all[:, None]).to(token_lp.dtype)
    return ScoreOutput(token_lp, mask, sequence_logprob(token_lp, mask, normalize="sum"))
