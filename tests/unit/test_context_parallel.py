"""Context parallelism is exact: the load-balanced cut, its inverse, and attention whose output
and q/k/v gradients equal full causal attention (gloo ranks on CPU; TE's path on GPUs).
Here the tests that run in one process; those that start processes are tests/integration/test_context_parallel.py."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from container.distributed import context_parallel as cpl
from container.models import attention
from tests.support.context_parallel import TE


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


def test_seam_defaults_to_plain_sdpa():
    q = torch.randn(1, 4, 6, 8)
    k, v = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    assert attention.use(None) is None
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert torch.equal(attention.sdpa(q, k, v), expected)


# --- GPUs (run where there are two): TE's context parallelism, and the all-gather path's
# flash lower-right masks, in bf16 against full attention ----------------------------------------

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


@pytest.mark.gpu
@pytest.mark.skipif(not TWO_GPUS or not TE, reason="needs 2 GPUs and Transformer Engine")
@pytest.mark.parametrize("comm_type", ["p2p", "all_gather", "a2a"])
def test_transformer_engine_cp_matches_full_attention(comm_type):
    _spawn_nccl(comm_type)


@pytest.mark.gpu
@pytest.mark.skipif(not TWO_GPUS, reason="needs 2 GPUs")
def test_all_gather_attention_on_gpus():
    _spawn_nccl(None)
