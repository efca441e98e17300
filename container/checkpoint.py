"""Training checkpoints with torch.distributed.checkpoint (DCP) and automatic resume.

Layout of `<directory>/step-<N>/`:
    .metadata, __<rank>_0.distcp   DCP's sharded model and optimizer state (reshardable)
    rng-<rank>.pt                  each rank's torch RNG state
    trainer.pt                     step, world size, scheduler, data position, extra (rank 0)
    .complete                      written last by rank 0

A checkpoint is written as `step-<N>.tmp/` and renamed once every rank has finished, so a job
killed mid-save leaves only a `.tmp` directory, which resume ignores. The rename is done by the
first rank of every host: on SageMaker `/opt/ml/checkpoints` is a per-host disk synced to one S3
prefix, so each host must rename its own shards. Because that sync gives no ordering, resume also
checks that every file DCP's metadata names is present and long enough.

Works with a plain model in one process (no process group: DCP's no-dist mode) and with an
FSDP2-sharded model; DCP reshards on load, so a job may resume on a different number of ranks
(the RNG states are then left alone, as they belong to ranks that no longer exist).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import re
import shutil
import signal
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.optim.lr_scheduler import LRScheduler

log = logging.getLogger(__name__)

MARKER = ".complete"
TRAINER_FILE = "trainer.pt"
_STEP_DIR = re.compile(r"step-(\d+)")
_TMP_DIR = re.compile(r"step-(\d+)\.tmp")


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _barrier() -> None:
    if _distributed():
        dist.barrier()


def _from_rank0(value: Any) -> Any:
    """Rank 0's value on every rank, so that all ranks take the same branch."""
    if not _distributed():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


@contextlib.contextmanager
def _quiet_no_dist():
    # DCP warns on every save/load without a process group; here that is a supported mode.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _sharded_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Each rank's shards (DTensors under FSDP2), which DCP writes and reshards on load."""
    return {
        "model": get_model_state_dict(model),
        "optim": get_optimizer_state_dict(model, optimizer),
    }


def _rng_state() -> dict[str, torch.Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


class Checkpointer:
    """Saves `step-<N>/` checkpoints under `directory`, keeps the newest `keep`, resumes the newest.

    `rank` and `local_rank` default to the process group's rank and torchrun's `LOCAL_RANK`.
    """

    def __init__(
        self,
        directory: str | Path,
        keep: int,
        rank: int | None = None,
        local_rank: int | None = None,
    ):
        if keep < 1:
            raise ValueError(f"keep must be at least 1, not {keep}")
        self.directory = Path(directory)
        self.keep = keep
        self.rank = rank if rank is not None else (dist.get_rank() if _distributed() else 0)
        if local_rank is None:
            local_rank = int(os.environ.get("LOCAL_RANK", self.rank))
        self.local_rank = local_rank

    def path(self, step: int) -> Path:
        return self.directory / f"step-{step}"

    def complete_steps(self, local_shards_only: bool = False) -> list[int]:
        """Steps with a complete checkpoint, oldest first. With `local_shards_only`, shards that are
        absent do not count against a step: right after a save on per-host disks the other hosts'
        shards are not here (they meet in the S3 checkpoint prefix), yet the marker says every
        rank finished writing. Shards that are here must still be whole."""
        if not self.directory.is_dir():
            return []
        names = (_STEP_DIR.fullmatch(p.name) for p in self.directory.iterdir())
        steps = (int(m.group(1)) for m in names if m)
        return sorted(step for step in steps if self._is_complete(self.path(step), local_shards_only))

    def save(
        self,
        step: int,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: LRScheduler | None,
        dataloader_state: dict,
        extra: dict | None = None,
    ) -> Path:
        """Collective: every rank calls it. `dataloader_state` and `extra` are rank 0's (use a
        global data position) and must hold only plain values and tensors (loaded weights_only)."""
        final = self.path(step)
        # Re-saving a complete step (SIGTERM right after a resume) could only lose it.
        if _from_rank0(self.rank == 0 and self._is_complete(final)):
            return final
        tmp = self.directory / f"step-{step}.tmp"
        if self.local_rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(final, ignore_errors=True)
        _barrier()
        tmp.mkdir(parents=True, exist_ok=True)
        # Written before dcp.save, whose completion on rank 0 then implies every rank's file exists.
        torch.save(_rng_state(), tmp / f"rng-{self.rank}.pt")
        state = _sharded_state(model, optimizer)
        with _quiet_no_dist():
            dcp.save(state, checkpoint_id=tmp, no_dist=not _distributed())
        if self.rank == 0:
            trainer = {
                "step": step,
                "world_size": dist.get_world_size() if _distributed() else 1,
                "scheduler": scheduler.state_dict() if scheduler is not None else None,
                "dataloader": dataloader_state,
                "extra": extra or {},
            }
            torch.save(trainer, tmp / TRAINER_FILE)
            (tmp / MARKER).write_text(json.dumps({"step": step}) + "\n")
        _barrier()
        if self.local_rank == 0:
            try:
                tmp.rename(final)
            except FileNotFoundError:  # a shared file system: another host's first rank renamed it
                pass
        _barrier()
        # Rank 0 chooses what to keep, so that hosts with per-host disks (no markers there) agree.
        kept = self.complete_steps(local_shards_only=True) if self.rank == 0 else []
        kept = _from_rank0([s for s in kept if s <= step][-self.keep:])
        if self.local_rank == 0:
            self._prune(step, kept)
        _barrier()
        log.info("saved checkpoint %s", final)
        return final

    def load_latest(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: LRScheduler | None
    ) -> tuple[int, dict, dict] | None:
        """Collective. Restore the newest complete checkpoint into the given (fresh) objects and
        return (step, dataloader_state, extra), or None when there is nothing to resume."""
        steps = self.complete_steps() if self.rank == 0 else []
        step = _from_rank0(steps[-1] if steps else None)
        if step is None:
            return None
        path = self.path(step)
        state = _sharded_state(model, optimizer)
        with _quiet_no_dist():
            dcp.load(state, checkpoint_id=path, no_dist=not _distributed())
        set_model_state_dict(model, state["model"])
        set_optimizer_state_dict(model, optimizer, state["optim"])
        trainer = torch.load(path / TRAINER_FILE, weights_only=True)
        if scheduler is not None and trainer["scheduler"] is not None:
            scheduler.load_state_dict(trainer["scheduler"])
        world = dist.get_world_size() if _distributed() else 1
        rng_file = path / f"rng-{self.rank}.pt"
        if trainer["world_size"] == world and rng_file.is_file():
            _set_rng_state(torch.load(rng_file, weights_only=True))
        else:
            log.warning("checkpoint %s was saved by %d ranks, now %d: RNG states not restored",
                        path, trainer["world_size"], world)
        log.info("resumed from checkpoint %s", path)
        return step, trainer["dataloader"], trainer["extra"]

    def _is_complete(self, path: Path, local_shards_only: bool = False) -> bool:
        if not (path / MARKER).is_file() or not (path / TRAINER_FILE).is_file():
            return False
        try:
            metadata = dcp.FileSystemReader(path).read_metadata()
        except (OSError, EOFError, pickle.UnpicklingError, RuntimeError, ValueError):
            return False  # a metadata file cut short by a kill or an interrupted S3 sync
        ends: dict[str, int] = {}
        for info in metadata.storage_data.values():
            end = info.offset + info.length
            ends[info.relative_path] = max(ends.get(info.relative_path, 0), end)
        for name, size in ends.items():
            shard = path / name
            if not shard.is_file():
                if local_shards_only:
                    continue
                return False
            if shard.stat().st_size < size:
                return False
        return True

    def _prune(self, newest: int, kept: list[int]) -> None:
        """Delete older checkpoints, complete or partial, except `kept`; leave later steps alone."""
        for p in self.directory.iterdir():
            m = _STEP_DIR.fullmatch(p.name) or _TMP_DIR.fullmatch(p.name)
            if m and int(m.group(1)) < newest and int(m.group(1)) not in kept:
                # ignore_errors: on a shared file system another host may delete the same tree.
                shutil.rmtree(p, ignore_errors=True)


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
    if not _distributed():
        return flag.requested
    nccl = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    requested = torch.tensor([int(flag.requested)], device=device)
    dist.all_reduce(requested, op=dist.ReduceOp.MAX)
    return bool(requested.item())
