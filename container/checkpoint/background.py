"""Asynchronous checkpoint saves (`checkpoint_async_mode`, launcher.wire.training.speed).

The training thread stages the state: DCP's `async_save` copies every tensor of this rank's shards
into host memory and returns; only that copy stalls training. `async` stages as torchtitan's mode
of that name does, with the file writer's own stager: plain copies made at each save, freed once
written. `async_with_pinned_mem` stages with DCP's DefaultStager into pinned memory, which the
stager keeps from save to save (allocating pinned memory is slow; copying into it is fast).

DCP then writes the copy from its own thread, and a second thread here waits for that write and
commits the checkpoint with the manifest and `.complete` protocol (container.checkpoint.checkpointer),
so a checkpoint is complete only once every rank's files are on disk, as with a synchronous save.

At most one save is in flight: `wait` (called before the next save, at SIGTERM and at the end of
training) returns once it is committed, or raises CheckpointWriteError, on every rank alike,
when it could not be (the ranks agree on the outcome before anyone commits or gives up).

The background collectives (DCP's plan exchange, the commit's barriers) run on a gloo group of
their own, created here, with the job's collective timeout: on the training group they would
interleave with the training step's collectives in another thread (and NCCL has no CPU tensors for
the staged state). A failure outside DCP's own steps on one rank (its staging, its storage setup, a
broken collective) is that rank's, raised by `wait` as a synchronous save raises it: an agreement
of ours would wait for peers that wait in DCP's collectives.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

from launcher.wire.training.speed import NO_CUDA_FIX, PINNED, is_async, needs_cuda


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written; the previous complete one is untouched."""


class BackgroundSaves:
    """One rank's asynchronous saves. Collective to create (every rank, same order): it makes the
    gloo group the background collectives use."""

    def __init__(self, mode: str, distributed: bool, timeout: timedelta | None = None):
        if not is_async(mode):
            raise ValueError(f"checkpoint_async_mode {mode!r} is not an asynchronous mode")
        if needs_cuda(mode) and not torch.cuda.is_available():
            raise ValueError(f"checkpoint_async_mode {mode} stages checkpoints in pinned (CUDA page-locked) host "
                             f"memory, and this machine has no CUDA device; {NO_CUDA_FIX}")
        self.mode = mode
        # torch gives a new group its own default (30 min for gloo), not the job's collective_timeout
        self.group = dist.new_group(backend="gloo", timeout=timeout) if distributed else None
        if self.group is None:
            # DCP warns at every save without a process group, a supported mode (the checkpointer
            # silences it around its own calls); here it would come from DCP's writer thread,
            # after any catch_warnings block on this thread has ended
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        # Staged synchronously on the training thread: once async_save returns, training may change
        # the parameters. None: the writer stages (FileSystemWriter is a BlockingAsyncStager).
        self._stager = DefaultStager(StagingOptions(use_pinned_memory=True, use_shared_memory=False,
                                                    use_async_staging=False, use_non_blocking_copy=False)
                                     ) if mode == PINNED else None
        self._commits = ThreadPoolExecutor(max_workers=1, thread_name_prefix="smlaunch-checkpoint")
        self._pending: Future | None = None

    def start(self, state: dict, writer: dcp.FileSystemWriter, commit: Callable[[Future], None]) -> None:
        """Stage `state`, write it with `writer` in the background, then run `commit(write)` in the
        commit thread. The previous save must have been waited for."""
        if self._pending is not None:
            raise RuntimeError("a checkpoint save is still in flight: wait() for it first")
        write = dcp.async_save(state, storage_writer=writer, process_group=self.group, async_stager=self._stager,
                               no_dist=self.group is None)
        self._pending = self._commits.submit(commit, write)

    def wait(self) -> None:
        """Block until the save in flight (if any) is committed; re-raise its failure."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        """Wait for the save in flight, then release the staging buffers and the commit thread."""
        try:
            self.wait()
        finally:
            self._commits.shutdown(wait=True)
            if self._stager is not None:
                self._stager.close()
