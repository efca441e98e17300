"""Context parallelism: every sequence is spread over the mesh's cp ranks (SMP's context_parallel_degree).

Load balance: a sequence is cut into 2·cp chunks and cp rank r keeps chunks r and 2·cp−1−r, so
under causal attention every rank does the same work (one early chunk with little history, one
late chunk with much). data.py shifts the labels before this cut, so each label stays with its
input token; RoPE gets the kept tokens' global positions.

Attention goes through the model's seam (`container.models.attention.use`):
- on GPUs with Transformer Engine installed, TE's DotProductAttention with the cp group
  (`cp_comm_type` p2p | all_gather | a2a), which expects exactly this chunk layout;
- elsewhere, and always on CPU, `AllGatherAttention`: K/V are all-gathered over the cp group and
  every local query chunk attends causally, by global position, to the keys before it.

Document masking (docs/data.md): a packed row's RoPE positions (restarting at each document)
are cut like the tokens; its document ids stay whole on every rank, and the job's document kernel
(container.models.document_kernels: dense mask, FlexAttention block mask or varlen segments)
plans this rank's query positions against the all-gathered keys (`AllGatherAttention.document_mask`),
so a document may span chunks and ranks. TE's context-parallel kernels take no document mask here:
masked rows go through the all-gather path on GPUs too (said once in the job log).

Sliding windows (Mistral's `window`): each query chunk attends to the gathered keys from its first
position's window start to its last position, under the causal mask narrowed to the window; a
document plan holds the window already. TE's path is not used with a window (the all-gather
path runs instead, said once in the log).

The loss needs nothing more: every rank counts only its own label tokens, the trainer divides by
the token count over the dp×cp `loss_group`, FSDP sums gradients over dp_shard×cp, and the K/V
gradients that other ranks' queries produce come home through the all-gather's backward (a
reduce-scatter sum).
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from functools import partial

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from container.distributed.runtime import Runtime
from container.models import attention

log = logging.getLogger("smlaunch")
SEQUENCE_KEYS = ("input_ids", "labels")


def _chunks(x: torch.Tensor, cp: int, dim: int) -> tuple[torch.Tensor, ...]:
    if x.shape[dim] % (2 * cp):
        raise ValueError(f"sequence length {x.shape[dim]} is not divisible by 2 x context_parallel_degree "
                         f"= {2 * cp}: set max_context_width to a multiple of {2 * cp}")
    return x.chunk(2 * cp, dim)


def split(x: torch.Tensor, cp: int, rank: int, dim: int = 1) -> torch.Tensor:
    """cp rank `rank`'s part of x along the sequence dimension `dim`: chunks rank and 2·cp−1−rank."""
    chunks = _chunks(x, cp, dim)
    return torch.cat((chunks[rank], chunks[2 * cp - 1 - rank]), dim)


def unsplit(parts: list[torch.Tensor] | tuple[torch.Tensor, ...], dim: int = 1) -> torch.Tensor:
    """The inverse of `split`: every cp rank's part, in rank order -> the sequence in natural order."""
    halves = [part.chunk(2, dim) for part in parts]
    return torch.cat([first for first, _ in halves] + [second for _, second in reversed(halves)], dim)


def positions(seq_len: int, cp: int, rank: int) -> torch.Tensor:
    """Global positions of the tokens cp rank `rank` keeps (RoPE follows the cut)."""
    return split(torch.arange(seq_len), cp, rank, dim=0)


def shard_batch(batch: dict[str, torch.Tensor], cp: int, rank: int) -> dict[str, torch.Tensor]:
    """A micro-batch ([B, S] input_ids and already-shifted labels) cut for one cp rank, with the
    RoPE positions of what it keeps: the global positions, or a packed row's per-document ones
    (cut like the tokens). Document ids stay whole: the attention masks by them."""
    out = {key: split(value, cp, rank) if key in SEQUENCE_KEYS else value for key, value in batch.items()}
    if "positions" in batch:
        out["positions"] = split(batch["positions"], cp, rank)
    else:
        out["positions"] = positions(batch["input_ids"].shape[1], cp, rank)
    return out


class AllGatherAttention:
    """Exact causal attention for q/k/v holding a cp rank's two chunks ([B, H, 2c, D], K/V with
    H_kv heads). Exact on gloo because the gather is the autograd-registered functional
    all-gather; torch.distributed.nn's all_gather silently gets K/V gradients wrong there."""

    def __init__(self, group: dist.ProcessGroup):
        self.group = group
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
        self._masks: dict[tuple, torch.Tensor] = {}

    def document_mask(self, documents: torch.Tensor, window: int | None = None):
        """The document kernel's plan for this rank's query positions (its two chunks) against
        the whole rows' keys ([B, S] document ids, natural order), which `__call__` gathers."""
        return attention.kernel().plan(documents, positions(documents.shape[1], self.size, self.rank),
                                       window=window)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan=None,
                 window: int | None = None) -> torch.Tensor:
        keys, values = self._gather(k, v)
        if plan is not None:
            return attention.kernel().attend(q, keys, values, plan)
        c = q.shape[2] // 2
        outs = []
        for half, chunk in enumerate((self.rank, 2 * self.size - 1 - self.rank)):
            end = (chunk + 1) * c  # keys of every position up to this chunk's last token
            # with a window, the keys from the chunk's first query's window start on
            start = 0 if window is None else max(0, chunk * c - window + 1)
            outs.append(self._causal(q[:, :, half * c:(half + 1) * c], keys[:, :, start:end],
                                     values[:, :, start:end], window))
        return torch.cat(outs, dim=2)

    def _gather(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole sequence's K and V in natural order: one collective, K/V heads only (GQA
        expands inside SDPA). The raw gather buffer dies on return; only the reordered copy
        lives on, as far as SDPA saves it for backward."""
        local = torch.stack((k, v))  # [2, B, H_kv, 2c, D]
        gathered = funcol.all_gather_single(local, 0, self.group)
        parts = gathered.view(self.size, *local.shape).unbind(0)
        return unsplit(parts, dim=3).unbind(0)

    def _causal(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None = None) -> torch.Tensor:
        """q: the last q_len positions of keys k (lower-right aligned causal mask), with a sliding
        `window` the latest `window` of them only."""
        gqa = k.shape[1] != q.shape[1]
        q_len, kv_len = q.shape[2], k.shape[2]
        if window is not None and window < kv_len:
            key = (q_len, kv_len, window, q.device)
            if key not in self._masks:  # query i is at key position kv_len - q_len + i
                offset = kv_len - q_len + torch.arange(q_len, device=q.device)[:, None]
                distance = offset - torch.arange(kv_len, device=q.device)[None, :]
                self._masks[key] = (distance >= 0) & (distance < window)
            if q.is_cuda and gqa:  # as the dense kernel: a mask and grouped K/V take the math kernel on CUDA
                k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
                gqa = False
            return F.scaled_dot_product_attention(q, k, v, attn_mask=self._masks[key], enable_gqa=gqa)
        if q_len == kv_len:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        if q.device.type != "cpu":  # flash attention applies a lower-right mask without materialising it
            return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(q_len, kv_len),
                                                  enable_gqa=gqa)
        # CPU SDPA turns a lower-right mask into a float [q_len, kv_len] tensor on every call and
        # saves it for backward, once per layer; one cached mask per shape serves every layer.
        key = (q_len, kv_len, q.dtype)
        if key not in self._masks:
            allowed = torch.ones(q_len, kv_len, dtype=torch.bool).tril(kv_len - q_len)
            self._masks[key] = torch.zeros(q_len, kv_len, dtype=q.dtype).masked_fill(~allowed, float("-inf"))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self._masks[key], enable_gqa=gqa)


class TransformerEngineAttention:
    """TE's DotProductAttention over the cp group (bshd layout, causal; TE expects the same
    2·cp-chunk load balance). TE's context-parallel kernels are flash/cuDNN ones, half precision
    only, so fp32 calls take the all-gather path."""

    def __init__(self, group: dist.ProcessGroup, comm_type: str):
        self.group, self.comm_type = group, comm_type
        self.ranks = dist.get_process_group_ranks(group)
        self.fallback = AllGatherAttention(group)
        self.stream = torch.cuda.Stream()  # TE overlaps the ring's attention steps on a second stream
        self._modules: dict[tuple[int, int, int], torch.nn.Module] = {}
        self._said_documents = self._said_window = False

    def _module(self, heads: int, kv_heads: int, head_dim: int) -> torch.nn.Module:
        key = (heads, kv_heads, head_dim)
        if key not in self._modules:
            import transformer_engine.pytorch as te

            if self.comm_type == "a2a" and kv_heads % len(self.ranks):
                raise ValueError(f"cp_comm_type a2a scatters heads over the cp group: {kv_heads} key/value "
                                 f"heads do not divide by context_parallel_degree {len(self.ranks)}")
            module = te.DotProductAttention(heads, head_dim, num_gqa_groups=kv_heads, qkv_format="bshd",
                                            attn_mask_type="causal")
            module.set_context_parallel_group(self.group, self.ranks, self.stream, self.comm_type)
            self._modules[key] = module
        return self._modules[key]

    def document_mask(self, documents: torch.Tensor, window: int | None = None):
        if not self._said_documents:
            self._said_documents = True
            log.info("document masking under context parallelism: the all-gathered K/V path with the %s "
                     "kernel (Transformer Engine's context-parallel attention here takes no document mask)",
                     attention.kernel().name)
        return self.fallback.document_mask(documents, window)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan=None,
                 window: int | None = None) -> torch.Tensor:
        if window is not None and not self._said_window:
            self._said_window = True
            log.info("sliding-window attention under context parallelism: the all-gathered K/V path "
                     "(Transformer Engine's context-parallel attention is used without a window only)")
        if plan is not None or window is not None or q.dtype not in (torch.bfloat16, torch.float16):
            return self.fallback(q, k, v, plan, window)
        bsz, heads, seq, head_dim = q.shape
        module = self._module(heads, k.shape[1], head_dim)
        # The model's q/k/v are [B, S, H, D] in memory already (transposed views): no copies here.
        out = module(*(t.transpose(1, 2).contiguous() for t in (q, k, v)))  # [B, S, H·D]
        return out.reshape(bsz, seq, heads, head_dim).transpose(1, 2)


def context_parallel_attention(group: dist.ProcessGroup, device: torch.device,
                               comm_type: str = "p2p") -> Callable[..., torch.Tensor]:
    """Transformer Engine's attention on CUDA when it is installed, else the all-gather path."""
    if device.type == "cuda" and importlib.util.find_spec("transformer_engine") is not None:
        return TransformerEngineAttention(group, comm_type)
    return AllGatherAttention(group)


def apply_context_parallel(rt: Runtime, comm_type: str | None = None) -> Callable[[dict], dict]:
    """Route the model's attention over rt.mesh["cp"] (cp > 1); returns what cuts a micro-batch
    for this rank (the identity at cp 1, where nothing changes)."""
    cp = rt.layout.cp
    if cp == 1:
        return lambda batch: batch
    mesh = rt.mesh["cp"]
    fn = context_parallel_attention(mesh.get_group(), rt.device, comm_type or "p2p")
    attention.use(fn)
    if rt.is_main:
        log.info("applied context parallelism over %d ranks (%s)", cp,
                 f"Transformer Engine, cp_comm_type {fn.comm_type}" if isinstance(fn, TransformerEngineAttention)
                 else "all-gathered K/V")
    return partial(shard_batch, cp=cp, rank=mesh.get_local_rank())
