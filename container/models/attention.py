"""The attention seam: every attention call of the model goes through `sdpa`.

Context parallelism replaces the implementation for its ranks (`use`: all-gathered K/V with
global causal masks, or Transformer Engine's attention on GPUs); the model code does not change.
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


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention. q: [B, H, S, D]; k, v: [B, H_kv, S, D] (grouped-query when H_kv < H)."""
    if _impl is not None:
        return _impl(q, k, v)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1])
