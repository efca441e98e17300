"""The kernels that keep attention within documents (docs/data.md, "The attention path").

One contract for all three: `plan(documents, q_positions, window)` turns the whole rows' document
ids ([B, S], each token's document in its row; documents are contiguous runs, as the loader
numbers them) and the positions of the queries this forward holds ([Lq]; None: all of 0..S-1)
into what the kernel takes, once per forward for every layer; `attend(q, k, v, plan)` then
attends q [B, H, Lq, D] to k, v [B, H_kv, S, D] (grouped-query when H_kv < H): the query at
position p sees key j when both are in one document and j <= p, and with a sliding `window`
(Mistral's) also p - j < window (documents are contiguous, so that is the distance within the
document too). Context parallelism passes a rank's
load-balanced positions and the all-gathered K/V (container.distributed.context_parallel), so
each kernel also shards its mask for context parallelism without a second implementation.

- `DenseKernel`: a boolean [B, 1, Lq, S] mask that SDPA applies. Exact everywhere; the CPU path.
- `FlexKernel`: FlexAttention with a block mask of the same rule (torchtitan's document
  masking): blocks no query of a document sees are skipped, so a row of short documents costs
  less than a causal row. The blocks come from the documents' extents (`document_blocks`), not
  from a compiled `create_block_mask`. Compiled on CUDA; PyTorch has no FlexAttention backward
  on CPU.
- `VarlenKernel`: flash attention over the documents as variable-length sequences
  (`torch.nn.attention.varlen`; Megatron/TE's `cu_seqlens`): a segment is one document's queries
  within one contiguous run of positions, attending to its document's keys up to its last query
  (flash's causal mask is bottom-right aligned, which is exactly that). Half precision, CUDA.

`build` picks one from the resolved `attention_kernel` (launcher.wire.training.models decides).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from launcher.wire.training.models import attention_kernel_problem, resolve_attention_kernel


def _query_positions(documents: torch.Tensor, q_positions: torch.Tensor | None) -> torch.Tensor:
    if q_positions is None:
        return torch.arange(documents.shape[1], device=documents.device)
    return q_positions.to(documents.device)


class DenseKernel:
    name = "dense"

    def plan(self, documents: torch.Tensor, q_positions: torch.Tensor | None = None,
             window: int | None = None) -> torch.Tensor:
        """[B, 1, Lq, S] booleans: True where the query may attend to the key."""
        pos = _query_positions(documents, q_positions)
        keys = torch.arange(documents.shape[1], device=documents.device)
        same = documents[:, pos, None] == documents[:, None, :]
        seen = pos[:, None] >= keys[None, :]
        if window is not None:
            seen &= pos[:, None] - keys[None, :] < window
        return (same & seen)[:, None]

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if q.is_cuda and k.shape[1] != q.shape[1]:
            # On CUDA only the math kernel takes a mask and grouped-query K/V together: it would
            # materialise [B, H, Lq, S] scores. Whole K/V heads let the memory-efficient kernel run.
            k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=k.shape[1] != q.shape[1])


class FlexKernel:
    name = "flex"

    def __init__(self, compiled: bool, block: int = 128):
        from torch.nn.attention.flex_attention import flex_attention

        # Compiled, FlexAttention runs its fused kernels; eager, it is PyTorch's reference (it
        # materialises the scores: what the CPU tests use, forward only).
        self._attend = torch.compile(flex_attention, dynamic=False) if compiled else flex_attention
        self.block = block

    def plan(self, documents: torch.Tensor, q_positions: torch.Tensor | None = None, window: int | None = None):
        """A BlockMask over this forward's queries and the rows' keys, its blocks found from the
        documents' extents (`document_blocks`), the rule applied within the blocks it keeps."""
        pos = _query_positions(documents, q_positions)

        def within(b, h, q, kv):
            p = pos[q]
            return (documents[b, p] == documents[b, kv]) & (p >= kv)

        def within_window(b, h, q, kv):
            p = pos[q]
            return (documents[b, p] == documents[b, kv]) & (p >= kv) & (p - kv < window)

        return document_blocks(documents, pos, within if window is None else within_window, self.block, window)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask) -> torch.Tensor:
        return self._attend(q, k, v, block_mask=block_mask, enable_gqa=k.shape[1] != q.shape[1])


def document_blocks(documents: torch.Tensor, pos: torch.Tensor, rule, block: int, window: int | None = None):
    """FlexAttention's BlockMask for queries at `pos` of rows whose documents are contiguous runs,
    from each block's extent of positions and document ids ([B, Lq/block, S/block] tensor work):
    what `create_block_mask` finds by evaluating `rule` on every query-key pair, which at 16K
    tokens took 165 s of compilation on a cold H100 before the first step (BENCHMARKS.md).

    A block pair is skipped when no query can see a key of it: their document ranges do not
    meet, or the keys start after the last query. It is full (the rule is not evaluated in it)
    when both blocks are whole, lie in one document, and every key precedes every query.
    Everything else is partial (the rule decides each pair), so a block this keeps that has no
    visible pair only costs time; one with a visible pair is never skipped. With a sliding
    `window` a pair is also skipped when its nearest query and key are `window` or more apart,
    and full only when its farthest are less."""
    from torch.nn.attention.flex_attention import BlockMask

    batch, seq = documents.shape
    q_len = pos.numel()
    q_blocks, k_blocks = -(-q_len // block), -(-seq // block)

    def extents(x: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Each block's min and max of x ([..., L] -> [..., n]), the last block padded with its last value."""
        padded = torch.cat((x, x[..., -1:].expand(*x.shape[:-1], n * block - x.shape[-1])), dim=-1)
        blocks = padded.unflatten(-1, (n, block))
        return blocks.amin(-1), blocks.amax(-1)

    q_lo, q_hi = extents(documents[:, pos], q_blocks)  # [B, Qb]
    k_lo, k_hi = extents(documents, k_blocks)  # [B, Kb]
    first_q, last_q = extents(pos, q_blocks)  # [Qb]
    k_index = torch.arange(k_blocks, device=documents.device)
    first_k, last_k = k_index * block, ((k_index + 1) * block).clamp(max=seq) - 1
    meet = (q_lo[:, :, None] <= k_hi[:, None, :]) & (k_lo[:, None, :] <= q_hi[:, :, None])
    seen = meet & (first_k[None, None, :] <= last_q[None, :, None])
    whole_q = (torch.arange(q_blocks, device=documents.device) + 1) * block <= q_len
    whole_k = (k_index + 1) * block <= seq
    one_document = ((q_lo == q_hi)[:, :, None] & (k_lo == k_hi)[:, None, :]
                    & (q_lo[:, :, None] == k_lo[:, None, :]))
    full = one_document & (last_k[None, None, :] < first_q[None, :, None]) & whole_q[None, :, None] & whole_k
    if window is not None:
        seen &= (first_q[:, None] - last_k[None, :] < window)[None]
        full &= (last_q[:, None] - first_k[None, :] < window)[None]
    partial = seen & ~full

    def ordered(dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, Qb, Kb] -> BlockMask's (count, indices) per query block, kept blocks first."""
        dense = dense[:, None].to(torch.int32)  # one head dimension: every head masks alike
        return dense.sum(-1, dtype=torch.int32), torch.argsort(dense, dim=-1, descending=True, stable=True).int()

    return BlockMask.from_kv_blocks(*ordered(partial), *ordered(full), BLOCK_SIZE=block, mask_mod=rule,
                                    seq_lengths=(q_len, seq))


@dataclass(frozen=True)
class VarlenPlan:
    """The documents as flash attention's variable-length batch: segment i's queries are rows
    cu_q[i]:cu_q[i+1] of the flattened [B*Lq] queries, its keys rows cu_k[i]:cu_k[i+1] of the
    flattened keys, taken from the [B*S] keys at `key_index` (None: the keys are the queries'
    own tokens in order, as without context parallelism)."""

    cu_q: torch.Tensor  # int32 [segments + 1]
    cu_k: torch.Tensor  # int32 [segments + 1]
    max_q: int
    max_k: int
    key_index: torch.Tensor | None
    window: int | None = None  # a query sees itself and the window - 1 keys before it


def varlen_plan(documents: torch.Tensor, q_positions: torch.Tensor | None = None,
                window: int | None = None) -> VarlenPlan:
    """The segments of `documents`' rows for the queries at `q_positions` (see VarlenPlan)."""
    batch, seq = documents.shape
    device = documents.device
    pos = _query_positions(documents, q_positions)
    q_len = pos.numel()
    q_docs = documents[:, pos]
    # A segment starts at each row's first query, where the document changes, and where the
    # positions jump (context parallelism's two chunks).
    starts = torch.ones(batch, q_len, dtype=torch.bool, device=device)
    starts[:, 1:] = (q_docs[:, 1:] != q_docs[:, :-1]) | (pos[1:] != pos[:-1] + 1)[None, :]
    segment = starts.flatten().cumsum(0) - 1
    q_lens = torch.bincount(segment)
    last = q_lens.cumsum(0) - 1  # each segment's last query, in the flattened queries
    rows, last_pos = last // q_len, pos[last % q_len]
    # each token's document's first position: the last document start at or before it
    keys = torch.arange(seq, device=device)
    doc_starts = torch.ones(batch, seq, dtype=torch.bool, device=device)
    doc_starts[:, 1:] = documents[:, 1:] != documents[:, :-1]
    first = torch.where(doc_starts, keys, 0).cummax(dim=1).values[rows, last_pos]
    k_lens = last_pos - first + 1
    cu_q = F.pad(q_lens.cumsum(0), (1, 0)).to(torch.int32)
    cu_k = F.pad(k_lens.cumsum(0), (1, 0)).to(torch.int32)
    key_index = None
    if q_positions is not None:
        owner = torch.repeat_interleave(torch.arange(len(k_lens), device=device), k_lens)
        offset = torch.arange(owner.numel(), device=device) - cu_k[:-1].long()[owner]
        key_index = (rows * seq + first)[owner] + offset
    max_q, max_k = torch.stack((q_lens.max(), k_lens.max())).tolist()  # one host sync a forward
    return VarlenPlan(cu_q, cu_k, max_q, max_k, key_index, window)


class VarlenKernel:
    name = "varlen"

    def __init__(self):
        from torch.nn.attention.varlen import varlen_attn

        self._attn = varlen_attn
        # torch 2.10-2.12's varlen_attn takes grouped-query K/V as they are; later releases ask
        # for enable_gqa. Causal is window_size (-1, 0) in both (no is_causal before 2.13).
        self._gqa = "enable_gqa" in inspect.signature(varlen_attn).parameters

    plan = staticmethod(varlen_plan)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: VarlenPlan) -> torch.Tensor:
        batch, heads, q_len, head_dim = q.shape
        flat_q = q.transpose(1, 2).reshape(batch * q_len, heads, head_dim)
        flat_k, flat_v = (t.transpose(1, 2).reshape(-1, t.shape[1], head_dim) for t in (k, v))
        if plan.key_index is not None:  # overlapping segments: index's backward sums their gradients
            flat_k, flat_v = flat_k[plan.key_index], flat_v[plan.key_index]
        extra = {"enable_gqa": True} if self._gqa and k.shape[1] != heads else {}
        # flash attention's window (left, 0) lets a query see `left` keys before it (bottom-right
        # aligned): a sliding window of W tokens, itself included, is (W - 1, 0)
        left = -1 if plan.window is None else plan.window - 1
        out = self._attn(flat_q, flat_k, flat_v, plan.cu_q, plan.cu_k, plan.max_q, plan.max_k,
                         window_size=(left, 0), **extra)
        return out.view(batch, q_len, heads, head_dim).transpose(1, 2)


def build(kernel: str, device: torch.device, bf16: bool):
    """The kernel the job's `attention_kernel` asks for on `device` (auto resolved here); a
    kernel that cannot train here is an error naming the hyperparameter, before training."""
    found = attention_kernel_problem(kernel, bf16, device.type == "cuda")
    if found is not None:
        raise ValueError(f"attention_kernel {kernel}: {found[0]}. Fix: {found[1]}")
    name = resolve_attention_kernel(kernel, device.type == "cuda")
    if name == "flex":
        return FlexKernel(compiled=device.type == "cuda")
    if name == "varlen":
        try:
            return VarlenKernel()
        except ImportError as exc:
            raise ValueError(f"attention_kernel varlen: torch {torch.__version__} has no torch.nn.attention.varlen "
                             "(torch >= 2.10). Fix: use attention_kernel: flex, or a newer image") from exc
    return DenseKernel()
