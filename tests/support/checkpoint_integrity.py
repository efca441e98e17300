"""What the unit and integration tests of checkpoint_integrity share.

See tests/{unit,integration}/test_checkpoint_integrity.py.
"""

from __future__ import annotations

import os
from pathlib import Path

from container.checkpoint.checkpointer import Checkpointer
from tests.support.checkpoints import make_model, train_step


def _garbage(path: Path, offset: int | None = None, length: int = 4096) -> None:
    """`length` random bytes over the file's content from `offset` (default: its middle), size unchanged."""
    data = bytearray(path.read_bytes())
    length = min(length, len(data))
    start = max(0, len(data) // 2 - length // 2) if offset is None else offset
    data[start:start + length] = os.urandom(length)
    path.write_bytes(bytes(data))


def _two_checkpoints(directory: Path, mesh=None) -> Checkpointer:
    model, optimizer, scheduler = make_model(seed=0, mesh=mesh)
    checkpointer = Checkpointer(directory, keep=2)
    for step in (1, 2):
        train_step(model, optimizer, scheduler, step)
        checkpointer.save(step, model, optimizer, scheduler, {"position": step}, {"tag": step})
    return checkpointer


def _shard(step_dir: Path) -> Path:
    return step_dir / "__0_0.distcp"
