"""Context parallelism is exact: the load-balanced cut, its inverse, and attention whose output
and q/k/v gradients equal full causal attention (gloo ranks on CPU; TE's path on GPUs)."""

from __future__ import annotations

import importlib.util
import os
from functools import partial

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

from container.distributed import context_parallel as cpl
from container.models import attention
from container.models.llama import Transformer, TransformerArgs
from tests.support.gloo import spawn


@pytest.mark.parametrize("cp", [1, 2, 3, 4])
def test_split_unsplit_round_trip(cp):
    x = torch.randn(2, 3, 8 * cp * 2, 5)
    parts = [cpl.split(x, cp, r, dim=2) for r in range(cp)]
    assert all(p.shape[2] == 16 for p in parts)  # every rank the same share
    assert torch.equal(cpl.unsplit(parts, dim=2), x)


def test_positions_are_the_load_balanced_chunks():
    assert cpl.positions(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert cpl.positions(8, 2, 1).tolist() == [2, 3, 4, 5]
    assert cpl.positions(16, 4, 1).tolist() == [2, 3, 12, 13]
    assert torch.equal(cpl.unsplit([cpl.positions(64, 4, r) for r in range(4)], dim=0), torch.arange(64))


def test_shard_batch_keeps_labels_with_their_tokens():
    ids = torch.arange(32).view(2, 16)
    labels = ids + 1  # stand-in for the shifted labels: token t's target is t+1
    batch = cpl.shard_batch({"input_ids": ids, "labels": labels}, cp=2, rank=1)
    assert torch.equal(batch["labels"], batch["input_ids"] + 1)
    assert batch["positions"].tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    assert torch.equal(batch["input_ids"][1], 16 + batch["positions"])


def test_uneven_sequence_is_refused():
    with pytest.raises(ValueError, match="multiple of 8"):
        cpl.split(torch.zeros(1, 60), 4, 0)


# Head layouts: grouped-query, odd counts with one key/value head, plain multi-head.
HEADS = [(4, 2), (3, 1), (2, 2)]


def _cp_mesh(cp: int):
    """A (dp, cp) mesh: with world > cp, every cp group is a proper subgroup of the world."""
    return init_device_mesh("cpu", (dist.get_world_size() // cp, cp), mesh_dim_names=("dp", "cp"))["cp"]


def _gather_natural(local: torch.Tensor, group, dim: int) -> torch.Tensor:
    parts = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, local.contiguous(), group=group)
    return cpl.unsplit(parts, dim=dim)


def _check_attention(root: str, cp: int, dtype: torch.dtype, tol: float) -> None:
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
        ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=heads != kv_heads)
        ref.backward(grad)

        local = [cpl.split(t.detach(), cp, rank, dim=2).requires_grad_() for t in (q, k, v)]
        out = fn(*local)
        out.backward(cpl.split(grad, cp, rank, dim=2))
        for name, ours, theirs in [("out", out.detach(), ref.detach()), ("dq", local[0].grad, q.grad),
                                   ("dk", local[1].grad, k.grad), ("dv", local[2].grad, v.grad)]:
            err = ((_gather_natural(ours, group, dim=2) - theirs).abs().max() / theirs.abs().max()).item()
            assert err < tol, f"cp {cp}, heads {heads}/{kv_heads}, {dtype}: {name} off by {err} (relative)"


def _check_both_precisions(root: str, cp: int) -> None:
    _check_attention(root, cp, torch.float64, 1e-10)
    _check_attention(root, cp, torch.float32, 1e-6)


@pytest.mark.parametrize("world,cp", [(2, 2), (4, 4), (4, 2)], ids=["cp2", "cp4", "cp2-in-dp2"])
def test_all_gather_attention_is_exact(tmp_path, world, cp):
    spawn(world, partial(_check_both_precisions, cp=cp), str(tmp_path))


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
    assert (_gather_natural(logits.detach(), group, dim=1) - ref.detach()).abs().max() < 1e-10
    for name, p in model.named_parameters():
        dist.all_reduce(p.grad, group=group)
        assert (p.grad - ref_grads[name]).abs().max() < 1e-10 * ref_grads[name].abs().max(), name


def test_model_with_cp_attention_matches_full_sequence(tmp_path):
    spawn(2, _model_parity, str(tmp_path))


def test_seam_defaults_to_plain_sdpa():
    q = torch.randn(1, 4, 6, 8)
    k, v = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    assert attention.use(None) is None
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert torch.equal(attention.sdpa(q, k, v), expected)


# --- GPUs (run where there are two): TE's context parallelism, and the all-gather path's
# flash lower-right masks, in bf16 against full attention ----------------------------------------

TE = importlib.util.find_spec("transformer_engine") is not None
TWO_GPUS = torch.cuda.is_available() and torch.cuda.device_count() >= 2


def _nccl_worker(rank: int, world: int, port: int, comm_type: str | None) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    try:
        if comm_type is None:
            fn = cpl.AllGatherAttention(dist.group.WORLD)
        else:
            fn = cpl.context_parallel_attention(dist.group.WORLD, torch.device("cuda", rank), comm_type)
            assert isinstance(fn, cpl.TransformerEngineAttention)
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, grad = (torch.randn(2, h, 256 * world, 64, device="cuda", dtype=torch.bfloat16, generator=gen)
                         for h in (8, 2, 2, 8))
        full = [t.clone().requires_grad_() for t in (q, k, v)]
        ref = F.scaled_dot_product_attention(*full, is_causal=True, enable_gqa=True)
        ref.backward(grad)
        local = [cpl.split(t, world, rank, dim=2).requires_grad_() for t in (q, k, v)]
        out = fn(*local)
        out.backward(cpl.split(grad, world, rank, dim=2))
        for ours, theirs in [(out, ref), *((a.grad, b.grad) for a, b in zip(local, full))]:
            torch.testing.assert_close(ours.detach().float(), cpl.split(theirs.detach(), world, rank, dim=2).float(),
                                       atol=2e-2, rtol=2e-2)
    finally:
        dist.destroy_process_group()


def _spawn_nccl(comm_type: str | None) -> None:
    from tests.support.train_runs import free_port

    torch.multiprocessing.spawn(_nccl_worker, args=(2, free_port(), comm_type), nprocs=2, join=True)


@pytest.mark.skipif(not TWO_GPUS or not TE, reason="needs 2 GPUs and Transformer Engine")
@pytest.mark.parametrize("comm_type", ["p2p", "all_gather", "a2a"])
def test_transformer_engine_cp_matches_full_attention(comm_type):
    _spawn_nccl(comm_type)


@pytest.mark.skipif(not TWO_GPUS, reason="needs 2 GPUs")
def test_all_gather_attention_on_gpus():
    _spawn_nccl(None)
