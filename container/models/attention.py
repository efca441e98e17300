"""The attention seam: every attention call of the model goes through `sdpa`.

Context parallelism replaces this function for its ranks (all-gathered K/V with global causal
masks, or Transformer Engine's attention on GPUs); the model code does not change.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention. q: [B, H, S, D]; k, v: [B, H_kv, S, D] (grouped-query when H_kv < H)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1])
