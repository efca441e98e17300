"""The training loss: each rank's summed token cross-entropy, in chunks of tokens.

A long sequence's fp32 logits are the largest tensor of a step (16,384 tokens x 128,256
vocabulary x 4 B = 7.83 GiB, and backward holds three tensors that size). So the head and the
cross-entropy run over `chunk_tokens` tokens at a time, each chunk under a non-reentrant
activation checkpoint: forward keeps only the chunk's hidden states, and backward recomputes
one chunk's logits at a time. The sum of the chunks' losses is the whole micro-batch's loss.

It runs inside the model's forward (`Transformer.forward(..., labels=...)`), so FSDP2's root
hooks see the head's use in forward and its gradient in backward as they do without chunking.

Under tensor parallelism the logits are vocabulary-sharded DTensors and the cross-entropy runs
vocabulary-parallel (tensor_parallel.loss_context around forward and backward). The head's
sequence-parallel input is gathered once, as the head would gather it, then cut into chunks; each
chunk is a replicated DTensor, a valid input of the column-parallel head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, Replicate
from torch.utils.checkpoint import checkpoint

from container.data.loader import IGNORE_INDEX


def token_loss_sum(model: nn.Module, batch: dict, chunk_tokens: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of token losses, number of label tokens) for one micro-batch on this rank. Under
    tensor parallelism it and the backward run in `loss_context` (vocabulary-sharded logits)."""
    return model(batch["input_ids"], batch.get("positions"), labels=batch["labels"], loss_chunk_tokens=chunk_tokens,
                 documents=batch.get("documents"))


_compiled_loss = None  # torch.compile of `_loss` while `compile` is on (use_compiled)


def use_compiled(on: bool) -> None:
    """Compute each chunk's loss with torch.compile of `_loss` (container.distributed.compile), or
    eagerly. Static shapes: a micro-batch has at most two chunk lengths, each compiled once, and
    torch 2.13 cannot compile the vocabulary-parallel loss with a dynamic one."""
    global _compiled_loss
    _compiled_loss = torch.compile(_loss, fullgraph=True, dynamic=False) if on else None


def _chunk_loss(head: nn.Module, h: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return (_compiled_loss or _loss)(head, h, labels)


def head_loss(head: nn.Module, h: torch.Tensor, labels: torch.Tensor, chunk_tokens: int) -> torch.Tensor:
    """Summed cross-entropy of logits head(h) [B, S, V] against labels [B, S]; over chunks of
    `chunk_tokens` tokens when the micro-batch holds more (0: the whole logits at once)."""
    if not chunk_tokens or labels.numel() <= chunk_tokens:
        return _chunk_loss(head, h, labels)
    if isinstance(h, DTensor):  # one all-gather of the sequence, not one per chunk
        h = h.redistribute(placements=[Replicate()] * h.device_mesh.ndim)
    chunks = zip(h.flatten(0, 1).split(chunk_tokens), labels.flatten().split(chunk_tokens))
    if not torch.is_grad_enabled():  # validation: nothing to recompute, chunks free their logits
        return sum(_chunk_loss(head, hc, lc) for hc, lc in chunks)
    return sum(checkpoint(_chunk_loss, head, hc, lc, use_reentrant=False, preserve_rng_state=False)
               for hc, lc in chunks)


def masked_logits(head: nn.Module, h: torch.Tensor) -> torch.Tensor:
    """head(h), with a padded vocabulary's padding logits at -inf (its `vocab_mask`,
    container.models.llama): they never win, take no probability and get no gradient."""
    logits = head(h)
    mask = getattr(head, "vocab_mask", None)
    return logits if mask is None else logits + mask.to(logits.dtype)


def _loss(head: nn.Module, h: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logits = masked_logits(head, h)
    loss = F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten(), ignore_index=IGNORE_INDEX,
                           reduction="sum")
    if isinstance(loss, DTensor):  # vocabulary-parallel: replicated over tp, autograd kept
        loss = loss.to_local()
    return loss


def label_tokens(labels: torch.Tensor) -> torch.Tensor:
    """How many tokens of `labels` count in the loss."""
    return (labels != IGNORE_INDEX).sum()
