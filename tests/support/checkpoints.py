"""Checkpoints made in one process (or on a gloo mesh), for tests of what is saved and verified, and
two_rank_checkpoint: one saved by two FSDP2 ranks, a fixture for every test (tests/conftest.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from container.checkpoint.checkpointer import Checkpointer
from container.models.llama import build_model
from launcher.wire.training.models import PRESETS
from tests.support.gloo import spawn

SPEC = replace(PRESETS["llama3-tiny"], max_position_embeddings=32)
SEQ = 16


def _warmup(step: int) -> float:
    return min(1.0, (step + 1) / 4)


def make_model(seed: int, mesh=None, spec=SPEC):
    torch.manual_seed(seed)
    model = build_model(spec, SEQ)
    model.init_weights()
    if mesh is not None:
        for block in model.layers.values():
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    return model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, _warmup)


def train_step(model, optimizer, scheduler, step: int) -> None:
    # The same batch on every rank: FSDP's averaged gradient then equals the single-process one.
    generator = torch.Generator().manual_seed(step)
    tokens = torch.randint(0, SPEC.vocab_size, (2, SEQ + 1), generator=generator)
    tokens = tokens.to(next(model.parameters()).device)  # the same tokens on a GPU (drawn on the CPU)
    logits = model(tokens[:, :-1])
    F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
    optimizer.step()
    optimizer.zero_grad()
    scheduler.step()


def full_state(model) -> dict[str, torch.Tensor]:
    if dist.is_initialized():
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(model, options=options)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_states_close(got: dict, want: dict, atol: float) -> None:
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
    saved = full_state(model)
    train_step(model, optimizer, scheduler, 3)
    after = full_state(model)
    if dist.get_rank() == 0:
        torch.save({"saved": saved, "after": after}, Path(root) / "reference.pt")

    fresh = make_model(seed=1, mesh=mesh)
    assert checkpointer.load_latest(*fresh) == (3, {"position": 3}, {})
    loaded = full_state(fresh[0])
    train_step(*fresh, 3)
    if dist.get_rank() == 0:
        assert_states_close(loaded, saved, atol=0)
        assert_states_close(full_state(fresh[0]), after, atol=1e-6)
    else:
        full_state(fresh[0])  # the gather is a collective


@pytest.fixture(scope="module")
def two_rank_checkpoint(tmp_path_factory) -> Path:
    """A checkpoint saved by 2 FSDP2 ranks, which also check that they resume from it exactly."""
    root = tmp_path_factory.mktemp("fsdp")
    spawn(2, _fsdp_save_then_load, str(root))
    return root
