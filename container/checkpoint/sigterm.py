"""A SIGTERM (SageMaker's warning before it stops an instance: a spot interruption,
StopTrainingJob) becomes a flag the training loop polls at each step boundary, so every rank
saves a checkpoint and stops at the same step (container/loop.py)."""

from __future__ import annotations

import signal
from dataclasses import dataclass

import torch
import torch.distributed as dist

from container.checkpoint.collectives import world


@dataclass
class StopFlag:
    """Set by the SIGTERM handler; the training loop polls it through `should_stop`."""

    requested: bool = False


def install_sigterm_flag() -> StopFlag:
    """SageMaker sends SIGTERM before stopping an instance (spot interruption, StopTrainingJob):
    turn it into a flag, so the loop can save a checkpoint and exit at a step boundary."""
    flag = StopFlag()

    def _handler(signum: int, frame: object) -> None:
        flag.requested = True

    signal.signal(signal.SIGTERM, _handler)
    return flag


def should_stop(flag: StopFlag) -> bool:
    """True on every rank once any rank got SIGTERM: a rank that stops alone hangs the others."""
    if world() == 1:  # nobody to agree with: no collective (a host sync every step)
        return flag.requested
    nccl = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    requested = torch.tensor([int(flag.requested)], device=device)
    dist.all_reduce(requested, op=dist.ReduceOp.MAX)
    return bool(requested.item())
