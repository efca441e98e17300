"""Optimizer groups, AnyPrecisionAdamW (Kahan), LR schedule, DTensor-safe gradient clipping.
Here the tests that start processes; the rest are tests/unit/test_optim.py."""


import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from container.optim import (
    clip_grad_norm_,
)
from tests.support.gloo import spawn

# --- DTensor: one process here; two processes below ----------------------------------------


def _two_rank_clip(root: str) -> None:
    mesh_1d = init_device_mesh("cpu", (2,), mesh_dim_names=("dp_shard",))
    mesh_2d = init_device_mesh("cpu", (1, 2), mesh_dim_names=("dp_replicate", "dp_shard"))
    g = torch.Generator().manual_seed(0)  # same full gradients on both ranks
    full_w, full_b, full_c = (torch.randn(4, 3, generator=g), torch.randn(6, generator=g),
                              torch.randn(2, generator=g))
    w = torch.nn.Parameter(distribute_tensor(torch.zeros(4, 3), mesh_1d, [Shard(0)]))
    b = torch.nn.Parameter(distribute_tensor(torch.zeros(6), mesh_2d, [Replicate(), Shard(0)]))
    c = torch.nn.Parameter(torch.zeros(2))  # a plain (replicated) parameter as well
    w.grad = distribute_tensor(full_w, mesh_1d, [Shard(0)])
    b.grad = distribute_tensor(full_b, mesh_2d, [Replicate(), Shard(0)])
    c.grad = full_c.clone()
    expected = torch.cat([full_w.flatten(), full_b, full_c]).norm()
    norm = clip_grad_norm_([w, b, c], 0.5)
    assert not isinstance(norm, DTensor)
    torch.testing.assert_close(norm, expected)
    scale = 0.5 / (expected + 1e-6)
    torch.testing.assert_close(w.grad.full_tensor(), full_w * scale)
    torch.testing.assert_close(b.grad.full_tensor(), full_b * scale)
    torch.testing.assert_close(c.grad, full_c * scale)


def test_clip_grad_norm_across_two_ranks_and_mixed_meshes(tmp_path):
    """torch.nn.utils.clip_grad_norm_ raises here ("must have the same mesh")."""
    # forked ranks (tests/support/gloo.py), which leave without interpreter finalization: a
    # spawned one (mp.spawn) destructs the meshes' process groups there, and a gloo thread still
    # alive then aborts it now and then (SIGABRT, 1 run in 80; container.distributed.runtime.run_rank)
    spawn(2, _two_rank_clip, str(tmp_path))
