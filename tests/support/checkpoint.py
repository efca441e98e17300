"""What the unit and integration tests of checkpoint share (tests/{unit,integration}/test_checkpoint.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh

from container.checkpoint.checkpointer import (
    Checkpointer,
)
from tests.support.checkpoints import make_model, train_step
from tests.support.gloo import spawn


def _full_state(model) -> dict[str, torch.Tensor]:
    if dist.is_initialized():
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(model, options=options)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_close(got: dict, want: dict, atol: float) -> None:
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        torch.testing.assert_close(got[name], tensor, atol=atol, rtol=0, msg=name)


def _fsdp_save_then_load(root: str) -> None:
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model, optimizer, scheduler = make_model(seed=0, mesh=mesh)
    for step in range(3):
        train_step(model, optimizer, scheduler, step)
    checkpointer = Checkpointer(Path(root) / "ckpt", keep=2)
    checkpointer.save(3, model, optimizer, scheduler, {"position": 3}, {})
    saved = _full_state(model)
    train_step(model, optimizer, scheduler, 3)
    after = _full_state(model)
    if dist.get_rank() == 0:
        torch.save({"saved": saved, "after": after}, Path(root) / "reference.pt")

    fresh = make_model(seed=1, mesh=mesh)
    assert checkpointer.load_latest(*fresh) == (3, {"position": 3}, {})
    loaded = _full_state(fresh[0])
    train_step(*fresh, 3)
    if dist.get_rank() == 0:
        _assert_close(loaded, saved, atol=0)
        _assert_close(_full_state(fresh[0]), after, atol=1e-6)
    else:
        _full_state(fresh[0])  # the gather is a collective


@pytest.fixture(scope="module")
def two_rank_checkpoint(tmp_path_factory) -> Path:
    """A checkpoint saved by 2 FSDP2 ranks, which also check that they resume from it exactly."""
    root = tmp_path_factory.mktemp("fsdp")
    spawn(2, _fsdp_save_then_load, str(root))
    return root
