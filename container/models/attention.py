"""The attention seam: every attention call of the model goes through `sdpa`.

Context parallelism replaces the implementation for its ranks (`use`: all-gathered K/V with
global causal masks, or Transformer Engine's attention on GPUs); the model code does not change.

Document masking (docs/data.md): when a packed row's documents are known, `mask_for` makes the
document kernel's plan once per forward (`use_kernel`: the dense mask, FlexAttention's block mask
or flash attention's variable-length segments; container.models.document_kernels), and every
layer's `sdpa` attends by it, so a packed row attends exactly as its documents would one by one.
Rows without documents, and batches whose every row is one document, are plain causal SDPA
whatever the kernel.

Sliding windows (Mistral, Mixtral; transformers' sliding-window mask): with `window` W a query at
position p sees the keys at p - W + 1 .. p only. Every path applies it: the document kernels'
plans (`mask_for(documents, window)`), context parallelism's implementation (its `window`
argument), and rows without documents, which the job's kernel attends with the plan of one
document per row and the window (built once per shape, not per layer). A window at least as long
as the sequence is causal attention, and takes the causal kernels.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from container.models.document_kernels import DenseKernel

Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
_impl: Attention | None = None  # None: plain causal SDPA
_kernel = DenseKernel()  # what attends within documents (the trainer sets the job's)


def use(fn: Attention | None) -> Attention | None:
    """Route every attention call through fn (None: back to plain SDPA); returns the previous one."""
    global _impl
    previous, _impl = _impl, fn
    return previous


def use_kernel(kernel):
    """Attend within documents with `kernel` (a document_kernels kernel); returns the previous one."""
    global _kernel
    previous, _kernel = _kernel, kernel
    return previous


def kernel():
    """The document kernel in use (context parallelism attends its ranks' chunks with it too)."""
    return _kernel


def mask_for(documents: torch.Tensor | None, window: int | None = None):
    """What `sdpa` takes to keep attention within documents ([B, S] document ids of the tokens a
    forward holds) and, with `window`, within the sliding window, computed once per forward for
    every layer: the kernel's plan, or what the routed implementation takes instead (its own
    `document_mask`: context parallelism plans a rank's queries against the whole sequence's keys)."""
    if documents is None or not documents.any():
        # Every row one document (ids all 0; its positions start at 0): that is causal attention
        # exactly, and the causal kernels are the fastest there are (one host sync a forward).
        # A window is then `sdpa`'s to apply.
        return None
    if window is not None and window >= documents.shape[1]:
        window = None
    if _impl is None:
        return _kernel.plan(documents, window=window)
    own = getattr(_impl, "document_mask", None)
    if own is None:
        raise NotImplementedError(f"document masking is not implemented for {type(_impl).__name__}")
    return own(documents) if window is None else own(documents, window=window)


_window_plans: dict[tuple, object] = {}  # the last shape's plan of one document per row and a window


def _window_plan(batch: int, seq: int, window: int, device: torch.device):
    """The job's kernel's plan for rows of one document each within a sliding window: the same
    for every layer and step of one shape, so it is made once."""
    key = (id(_kernel), batch, seq, window, device)
    if key not in _window_plans:
        _window_plans.clear()
        _window_plans[key] = _kernel.plan(torch.zeros(batch, seq, dtype=torch.long, device=device), window=window)
    return _window_plans[key]


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask=None, window: int | None = None) -> torch.Tensor:
    """Causal attention. q: [B, H, S, D]; k, v: [B, H_kv, S, D] (grouped-query when H_kv < H);
    `mask` (mask_for's) narrows the causal mask to each token's own document, and already holds
    the window; without one, `window` (None: the whole context) narrows it to the latest keys."""
    if _impl is not None:
        if window is not None:
            return _impl(q, k, v, mask, window=window)
        return _impl(q, k, v) if mask is None else _impl(q, k, v, mask)
    if mask is None:
        if window is not None and window < k.shape[2]:
            return _kernel.attend(q, k, v, _window_plan(q.shape[0], k.shape[2], window, q.device))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1])
    return _kernel.attend(q, k, v, mask)
