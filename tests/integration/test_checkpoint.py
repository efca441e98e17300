"""DCP checkpoints: exact resume (plain and FSDP2 models), resharding, partial saves, SIGTERM.
Here the tests that start processes; the rest are tests/unit/test_checkpoint.py."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from container.checkpoint.checkpointer import (
    Checkpointer,
    StopFlag,
    should_stop,
)
from tests.support.checkpoints import assert_states_close, full_state, make_model, train_step
from tests.support.gloo import spawn


def _fsdp_load(root: str) -> None:
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    reference = torch.load(Path(root) / "reference.pt")
    model, optimizer, scheduler = make_model(seed=1, mesh=mesh)
    checkpointer = Checkpointer(Path(root) / "ckpt", keep=2)
    assert checkpointer.load_latest(model, optimizer, scheduler)[0] == 3
    loaded = full_state(model)
    train_step(model, optimizer, scheduler, 3)
    after = full_state(model)
    if dist.get_rank() == 0:
        assert_states_close(loaded, reference["saved"], atol=0)
        assert_states_close(after, reference["after"], atol=1e-6)


def test_fsdp_checkpoint_reshards_to_four_ranks(two_rank_checkpoint):
    spawn(4, _fsdp_load, str(two_rank_checkpoint))


def _agree_on_stop(root: str) -> None:
    flag = StopFlag(requested=dist.get_rank() == 1)
    assert should_stop(flag)
    assert not should_stop(StopFlag())


def test_should_stop_agrees_across_ranks(tmp_path):
    spawn(2, _agree_on_stop, str(tmp_path))
