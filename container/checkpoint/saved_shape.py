"""The vocabulary rows the newest checkpoint was saved with, read before the model is built.

Tensor parallelism pads a vocabulary it cannot split (launcher.wire.training.models.vocab_rows), and
DCP restores tensors only into the shapes they were saved with. So a run that resumes builds its
embedding and head with the saved rows wherever its degree splits them: a checkpoint of tp 2
(50257 entries in 50304 rows) resumes at tp 1, 4 or 8. Where the degree cannot split them, the
resume's identity check (launcher.wire.training.resume, `vocab_rows`) says so before anything is loaded.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from container.checkpoint.checkpointer import TRAINER_FILE
from launcher.wire import checkpoints


def _read(directory: Path) -> int | None:
    complete = checkpoints.complete_steps(directory) if directory.is_dir() else []
    if not complete:
        return None
    try:
        saved = torch.load(directory / f"step-{complete[-1]}" / TRAINER_FILE, map_location="cpu",
                           weights_only=True).get("keeps") or {}
    except Exception:  # noqa: BLE001 - an unreadable checkpoint is load_latest's to report, with its reason
        return None
    # before padding existed (or when it was not needed) the rows were the vocabulary's
    return saved.get("vocab_rows") or (saved.get("model") or {}).get("vocab_size")


def saved_vocab_rows(directory: str | Path) -> int | None:
    """Collective when a process group is up: rank 0 reads, every rank gets its answer. None
    without a complete checkpoint (or one that recorded no model)."""
    rows = _read(Path(directory)) if not dist.is_initialized() or dist.get_rank() == 0 else None
    if dist.is_initialized():
        box = [rows]
        dist.broadcast_object_list(box, src=0)
        rows = box[0]
    return rows
