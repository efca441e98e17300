"""What the unit and integration tests of the document kernels share: random packed rows, the
reference (every document attended alone, plain causal SDPA from its first token), and context
parallelism's ranks simulated in one process (each rank's queries against the whole keys, as
the all-gather path hands them to the kernel)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from container.distributed import context_parallel as cpl
from tests.support.close import assert_close, order_tolerance


def random_documents(batch: int, seq: int, per_row: int, seed: int = 0) -> torch.Tensor:
    """[batch, seq] document ids: each row cut at per_row - 1 random places (ids 0, 1, ... per row)."""
    g = torch.Generator().manual_seed(seed)
    docs = torch.empty(batch, seq, dtype=torch.long)
    for row in range(batch):
        cuts = torch.randperm(seq - 1, generator=g)[:per_row - 1].add(1).sort().values.tolist()
        for d, (start, end) in enumerate(zip([0, *cuts], [*cuts, seq])):
            docs[row, start:end] = d
    return docs


def documents_alone(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, documents: torch.Tensor,
                    window: int | None = None) -> torch.Tensor:
    """Each document of each row attended on its own (causal SDPA over its tokens only; with a
    sliding `window`, transformers' mask: each token and the window - 1 before it), in the rows'
    order: what a packed row must equal."""
    out = torch.empty_like(q)
    for row in range(q.shape[0]):
        ids = documents[row]
        bounds = [0, *(torch.nonzero(ids[1:] != ids[:-1]).flatten() + 1).tolist(), ids.numel()]
        for start, end in zip(bounds, bounds[1:]):
            n = end - start
            steps = torch.arange(n, device=q.device)
            distance = steps[:, None] - steps[None, :]
            allowed = (distance >= 0) & (distance < (window or n))
            out[row:row + 1, :, start:end] = F.scaled_dot_product_attention(
                q[row:row + 1, :, start:end], k[row:row + 1, :, start:end], v[row:row + 1, :, start:end],
                attn_mask=allowed, enable_gqa=k.shape[1] != q.shape[1])
    return out


def attend_as_cp_ranks(kernel, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, documents: torch.Tensor,
                       cp: int, window: int | None = None) -> torch.Tensor:
    """The packed rows attended by `kernel` as `cp` context-parallel ranks would (cp 1: one
    process, no positions), put back in natural order."""
    if cp == 1:
        return kernel.attend(q, k, v, kernel.plan(documents, window=window))
    parts = []
    for rank in range(cp):
        plan = kernel.plan(documents, cpl.positions(documents.shape[1], cp, rank), window=window)
        parts.append(kernel.attend(cpl.split(q, cp, rank, dim=2), k, v, plan))
    return cpl.unsplit(parts, dim=2)


def attention_tolerance(inputs, power: int = 1) -> float:
    """How far two attentions of the same `inputs` (q, k, v[, the output's gradient]) may be apart
    when they add their terms in other orders: q.k over head_dim, the softmax's sum over the keys,
    then the sum over keys (out, dq) or queries (dk, dv), at a scale from the inputs (out and dv
    sum one input weighted by probabilities: power 1; dq and dk products of three: power 3). Not
    the reference's own size: where a document or window leaves a query one key, dq's and dk's
    terms cancel and the reference is rounding noise (tests/support/close.py)."""
    return order_tolerance(_terms(inputs), inputs[0].dtype) * _scale(inputs, power)


def assert_attention_close(got: torch.Tensor, want: torch.Tensor, inputs, power: int = 1, what: str = "") -> None:
    """`got` within attention_tolerance of `want`, element by element."""
    assert_close(got, want, terms=_terms(inputs), scale=_scale(inputs, power), dtype=inputs[0].dtype, what=what)


def _terms(inputs) -> int:
    keys = inputs[1]
    return keys.shape[-1] + 2 * keys.shape[-2]


def _scale(inputs, power: int) -> float:
    return max(t.abs().max().item() for t in inputs) ** power
