"""Context parallelism is exact: the load-balanced cut, its inverse, and attention whose output
and q/k/v gradients equal full causal attention (gloo ranks on CPU; TE's path on GPUs).
Here the tests that start processes; the rest are tests/unit/test_context_parallel.py."""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

from container.distributed import context_parallel as cpl
from container.models import attention
from container.models.llama import Transformer, TransformerArgs
from tests.support.close import assert_close
from tests.support.document_kernels import assert_attention_close
from tests.support.gloo import spawn

# Head layouts: grouped-query, odd counts with one key/value head, plain multi-head.
HEADS = [(4, 2), (3, 1), (2, 2)]


def _cp_mesh(cp: int):
    """A (dp, cp) mesh: with world > cp, every cp group is a proper subgroup of the world."""
    return init_device_mesh("cpu", (dist.get_world_size() // cp, cp), mesh_dim_names=("dp", "cp"))["cp"]


def _gather_natural(local: torch.Tensor, group, dim: int) -> torch.Tensor:
    parts = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, local.contiguous(), group=group)
    return cpl.unsplit(parts, dim=dim)


def _check_attention(root: str, cp: int, dtype: torch.dtype, window: int | None = None) -> None:
    mesh = _cp_mesh(cp)
    group, rank = mesh.get_group(), mesh.get_local_rank()
    fn = cpl.AllGatherAttention(group)
    seq, batch, head_dim = 8 * cp, 2, 8
    for heads, kv_heads in HEADS:
        gen = torch.Generator().manual_seed(heads * 10 + kv_heads)  # same tensors on every rank
        q = torch.randn(batch, heads, seq, head_dim, generator=gen, dtype=dtype, requires_grad=True)
        k = torch.randn(batch, kv_heads, seq, head_dim, generator=gen, dtype=dtype, requires_grad=True)
        v = torch.randn(batch, kv_heads, seq, head_dim, generator=gen, dtype=dtype, requires_grad=True)
        grad = torch.randn(batch, heads, seq, head_dim, generator=gen, dtype=dtype)
        distance = torch.arange(seq)[:, None] - torch.arange(seq)[None, :]
        allowed = (distance >= 0) & (distance < (window or seq))  # transformers' sliding-window mask
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=heads != kv_heads)
        ref.backward(grad)

        local = [cpl.split(t.detach(), cp, rank, dim=2).requires_grad_() for t in (q, k, v)]
        out = fn(*local) if window is None else fn(*local, window=window)
        out.backward(cpl.split(grad, cp, rank, dim=2))
        # at the inputs' scale (tests/support/document_kernels.attention_tolerance): in a one-token
        # window each query attends to itself alone, dq's and dk's terms cancel, and the reference
        # is rounding noise (max |dq| 9e-16 on one machine, exactly 0 under MKL_CBWR=COMPATIBLE)
        inputs = (q, k, v, grad)
        for name, ours, theirs, power in [("out", out.detach(), ref.detach(), 1), ("dq", local[0].grad, q.grad, 3),
                                          ("dk", local[1].grad, k.grad, 3), ("dv", local[2].grad, v.grad, 1)]:
            assert_attention_close(_gather_natural(ours, group, dim=2), theirs, inputs, power,
                                   what=f"cp {cp}, heads {heads}/{kv_heads}, {dtype}, window {window}: {name}")


def _check_both_precisions(root: str, cp: int) -> None:
    _check_attention(root, cp, torch.float64)
    _check_attention(root, cp, torch.float32)


@pytest.mark.parametrize("world,cp", [(2, 2), (4, 4), (4, 2)], ids=["cp2", "cp4", "cp2-in-dp2"])
def test_all_gather_attention_is_exact(tmp_path, world, cp):
    spawn(world, partial(_check_both_precisions, cp=cp), str(tmp_path))


def _check_windows(root: str, cp: int) -> None:
    # windows shorter than a chunk (8 tokens), spanning chunks, and as long as the sequence
    for window in (1, 3, 8, 13, 8 * cp):
        _check_attention(root, cp, torch.float64, window)


@pytest.mark.parametrize("world,cp", [(2, 2), (4, 4)], ids=["cp2", "cp4"])
def test_all_gather_attention_keeps_a_sliding_window(tmp_path, world, cp):
    """Mistral's window under context parallelism: each chunk's queries against the gathered keys
    from their window's start, output and q/k/v gradients equal to the whole sequence's."""
    spawn(world, partial(_check_windows, cp=cp), str(tmp_path))


def _model_parity(root: str) -> None:
    """The whole model: CP logits and summed parameter gradients equal one full-sequence pass."""
    cp, seq = dist.get_world_size(), 32
    args = TransformerArgs(dim=24, n_layers=2, n_heads=3, n_kv_heads=1, vocab_size=50, ffn_dim=40,
                           max_seq_len=seq)
    torch.manual_seed(0)
    model = Transformer(args).double()
    model.init_weights()
    tokens = torch.randint(0, args.vocab_size, (2, seq), generator=torch.Generator().manual_seed(1))
    ref = model(tokens)
    ref.pow(2).sum().backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()

    group, rank = dist.group.WORLD, dist.get_rank()
    batch = cpl.shard_batch({"input_ids": tokens}, cp, rank)
    previous = attention.use(cpl.AllGatherAttention(group))
    try:
        logits = model(batch["input_ids"], batch["positions"])
        logits.pow(2).sum().backward()
    finally:
        attention.use(previous)
    # The additions on a gradient's way: per layer a product over dim, attention's over the keys and
    # the feed-forward's over ffn_dim, the head's over the vocabulary, then the sum over the tokens.
    terms = args.n_layers * (args.dim + seq + args.ffn_dim) + args.vocab_size + tokens.numel()
    assert_close(_gather_natural(logits.detach(), group, dim=1), ref, terms=terms, what="logits")
    for name, p in model.named_parameters():
        dist.all_reduce(p.grad, group=group)
        assert_close(p.grad, ref_grads[name], terms=terms, what=name)  # each gradient is O(1) as a whole


def test_model_with_cp_attention_matches_full_sequence(tmp_path):
    spawn(2, _model_parity, str(tmp_path))


# --- GPUs (run where there are two): TE's context parallelism, and the all-gather path's
# flash lower-right masks, in bf16 against full attention ----------------------------------------


