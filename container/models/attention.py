"""The attention seam: every attention call of the model goes through `sdpa`.

Context parallelism replaces the implementation for its ranks (`use`: all-gathered K/V with
global causal masks, or Transformer Engine's attention on GPUs); the model code does not change.

Document masking (docs/data.md): when a packed row's documents are known, `document_mask` gives
each query the keys of its own document up to itself, so a packed row attends exactly as its
documents would one by one. This is the exact path: a dense [B, 1, S, S] boolean mask (S^2 bytes
per row: 256 MiB at 16K tokens), which CPU SDPA applies; GPU kernels that take the boundaries
without a dense mask (FlexAttention's block masks, varlen) are for the GPU path.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
_impl: Attention | None = None  # None: plain causal SDPA


def use(fn: Attention | None) -> Attention | None:
    """Route every attention call through fn (None: back to plain SDPA); returns the previous one."""
    global _impl
    previous, _impl = _impl, fn
    return previous


def document_mask(documents: torch.Tensor) -> torch.Tensor:
    """documents: [B, S], the index of each token's document in its row -> [B, 1, S, S] boolean,
    True where query i may attend to key j: the same document and j <= i."""
    seq = documents.shape[-1]
    causal = torch.ones(seq, seq, dtype=torch.bool, device=documents.device).tril()
    return ((documents[:, :, None] == documents[:, None, :]) & causal)[:, None]


def mask_for(documents: torch.Tensor | None) -> torch.Tensor | None:
    """What `sdpa` takes to keep attention within documents ([B, S] document ids of the tokens a
    forward holds), computed once per forward for every layer: `document_mask`'s dense mask, or
    what the routed implementation takes instead (its own `document_mask`: context parallelism
    masks a rank's queries against the whole sequence's keys)."""
    if documents is None:
        return None
    if _impl is None:
        return document_mask(documents)
    own = getattr(_impl, "document_mask", None)
    if own is None:
        raise NotImplementedError(f"document masking is not implemented for {type(_impl).__name__}")
    return own(documents)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention. q: [B, H, S, D]; k, v: [B, H_kv, S, D] (grouped-query when H_kv < H);
    `mask` (mask_for's) narrows the causal mask to each token's own document."""
    if _impl is not None:
        return _impl(q, k, v) if mask is None else _impl(q, k, v, mask)
    gqa = k.shape[1] != q.shape[1]
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
