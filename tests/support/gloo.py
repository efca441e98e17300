"""Run a function on several gloo ranks in-process-pool style (for tests of collective code)."""

from __future__ import annotations

import uuid
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.support import forkserver


def spawn(world: int, fn, root: str) -> None:
    """Run fn(root) on `world` gloo ranks; an assertion failing in any rank fails the test."""
    init = Path(root) / f"pg-{uuid.uuid4().hex}"
    args = (world, str(init), fn, root)
    mp.start_processes(_run_worker, args=args, nprocs=world, join=True, start_method=forkserver.start_method())


def _run_worker(rank: int, world: int, init: str, fn, root: str) -> None:
    torch.set_num_threads(1)  # several ranks share few cores
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    try:
        fn(root)
        dist.barrier()  # gloo aborts a peer still in a collective when the group is torn down
    finally:
        dist.destroy_process_group()
