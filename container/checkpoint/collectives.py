"""The collectives of a checkpoint save or resume: every rank takes the same branch, and a failure
on one rank reaches all of them as a reason, not as a rank left waiting alone in a barrier.

Each works without a process group (one process: DCP's no-dist mode). `group` is the process group
of the collective; None is the default group. Background saves run theirs on a group of their own
(container.checkpoint.background).
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from container.checkpoint.write_errors import describe


def distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def world() -> int:
    return dist.get_world_size() if distributed() else 1


def barrier(group=None) -> None:
    if distributed():
        dist.barrier(group=group)


def from_rank0(value: Any, group=None) -> Any:
    """Rank 0's value on every rank, so that all ranks take the same branch."""
    if not distributed():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def first_of_all(value: Any, group=None) -> Any:
    """The first value other than None over all ranks, in rank order: the same on every rank."""
    if not distributed():
        return value
    values: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(values, value, group=group)
    return next((v for v in values if v is not None), None)


def together(action, group=None) -> str | None:
    """Run `action` on this rank; why it failed on the first rank where it did (None: on none),
    the same on every rank, so that no rank waits alone in a collective the others left. A failed
    write is told by its cause and file (container.checkpoint.write_errors), not by how torch
    reported it on that rank."""
    try:
        action()
        reason = None
    except CheckpointException as exc:
        reason = _failures(exc)
    except Exception as exc:  # noqa: BLE001 - any failure must reach the other ranks as a reason
        reason = f"rank {dist.get_rank() if distributed() else 0}: {describe(exc)}"
    return first_of_all(reason, group)


def dcp_agreed(action) -> str | None:
    """Run DCP's save (`action`: the save, or the wait for a background one), whose own collectives
    already agree: a failure inside them reaches
    every rank as the same CheckpointException, told here by each failed rank's cause. No collective
    of ours may follow it: a rank that failed outside DCP's steps would wait in ours while the others
    wait in DCP's. Such a failure is that rank's crash, raised; the launcher ends the job with it."""
    try:
        action()
    except CheckpointException as exc:
        return _failures(exc)
    return None


def _failures(exc: CheckpointException) -> str:
    # DCP's exception is a BaseException whose text is every rank's traceback: each rank's cause instead
    return "; ".join(f"rank {rank}: {describe(error)}" for rank, (error, _) in sorted(exc.failures.items()))
