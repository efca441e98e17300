"""Training checkpoints with torch.distributed.checkpoint (DCP) and verified automatic resume.

Layout of `<directory>/step-<N>/`:
    .metadata, __<rank>_0.distcp   DCP's sharded model and optimizer state (reshardable)
    rng-<rank>.pt                  each rank's torch RNG state
    trainer.pt                     step, world size, scheduler, data position, extra, and what a
                                   resume must keep (launcher.wire.training.resume) (rank 0)
    data-streams.json              the data the position indexes, per channel (launcher.wire.checkpoints)
    manifest-<rank>.json           size and sha256 of every file that rank wrote
    .complete                      written last by rank 0: the step and how many manifest parts

A checkpoint is written as `step-<N>.tmp/` and renamed once every rank has finished, so a job
killed mid-save leaves only a `.tmp` directory, which resume ignores. With `async_mode` the shards
are written in the background (container.checkpoint.background) and the same commit runs there
once they are; a save that fails is given up by every rank together (CheckpointWriteError), its
`.tmp` removed, the checkpoints before it untouched. The rename is done by the
first rank of every host: on SageMaker `/opt/ml/checkpoints` is a per-host disk synced to one S3
prefix, so each host must rename its own shards, and hashes only its own files
(container.checkpoint.manifest).

Resume verifies before it loads: the newest checkpoint whose marker, manifest parts, sizes and
hashes all agree is loaded; a corrupt or partial one is skipped with a log line saying why.
Rank 0 decides (the hashing is spread over the ranks) and every rank takes its decision, so no
rank raises or enters a collective that the others skip. When step-<N> checkpoints exist and
none is usable, resume fails with every reason rather than train from step 1 over them.

Works with a plain model in one process (no process group: DCP's no-dist mode) and with an
FSDP2-sharded model; DCP reshards on load, so a job may resume on a different number of ranks
and other parallel degrees. The RNG states are then left alone, as they belong to ranks that no
longer exist; the runtime draws no random numbers while training (no dropout; synthetic data is
a function of the sample index), so the resumed run is still the uninterrupted one. What may not
change (global batch, sequence length, model, ...) is recorded in trainer.pt and checked before
anything is loaded: launcher.wire.training.resume decides it, and validation explains the same rule. So is
the data itself (data-streams.json): another tokenizer is refused, other shards or files are a
warning saying what that does to the order (launcher.wire.training.resume.compare).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.optim.lr_scheduler import LRScheduler

from container.checkpoint import manifest, write_errors
from container.checkpoint.background import BackgroundSaves, CheckpointWriteError
from container.checkpoint.collectives import (
    barrier,
    dcp_agreed,
    distributed,
    first_of_all,
    from_rank0,
    together,
    world,
)
from container.models import qlora
from launcher.wire import checkpoints
from launcher.wire.checkpoints import STEP_DIR as _STEP_DIR
from launcher.wire.checkpoints import STEP_TMP_DIR as _TMP_DIR
from launcher.wire.training.resume import RunIdentity, compare, may_change
from launcher.wire.training.speed import DISABLED, is_async

log = logging.getLogger(__name__)

TRAINER_FILE = "trainer.pt"
DCP_METADATA = ".metadata"  # written by DCP's coordinator (rank 0) in FileSystemWriter.finish


class CheckpointError(RuntimeError):
    """Checkpoints exist, and none of them can be resumed from, or this run may not continue them."""


@contextlib.contextmanager
def _quiet_no_dist():
    # DCP warns on every save/load without a process group; here that is a supported mode.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


class _RecordingWriter(dcp.FileSystemWriter):
    """DCP's file writer that remembers the files this rank wrote, for its manifest part."""

    written: list[str]

    def __init__(self, path: Path):
        super().__init__(path)
        self.fs = write_errors.NamingFileSystem()  # a failed write says which file and why

    def write_data(self, plan, planner):
        future = super().write_data(plan, planner)
        self.written = [result.storage_data.relative_path for result in future.wait()]
        return future


# The optimizer state is saved flattened, one key per parameter and setting
# (`param_groups.<fqn>.lr`): pipeline stages hold different parameters, and an unflattened
# `param_groups` list under one key would be saved by one rank only (DCP keeps one copy of a key)
# and loaded by all. trainer.pt records the layout; checkpoints written before it was recorded
# hold the unflattened state, and still load.
OPTIMIZER_LAYOUT = "flattened"


def _optim_options(layout: str | None) -> StateDictOptions:
    return StateDictOptions(flatten_optimizer_state_dict=layout == "flattened")


def _sharded_state(model: nn.Module, optimizer: torch.optim.Optimizer, layout: str | None) -> dict[str, Any]:
    """Each rank's shards (DTensors under FSDP2), which DCP writes and reshards on load; QLoRA's NF4
    base left out (container.models.qlora)."""
    with qlora.base_left_out():
        return {
            "model": get_model_state_dict(model),
            "optim": get_optimizer_state_dict(model, optimizer, options=_optim_options(layout)),
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
    """Saves `step-<N>/` checkpoints under `directory`, keeps the newest `keep`, resumes the
    newest usable one.

    `rank` and `local_rank` default to the process group's rank and torchrun's `LOCAL_RANK`.
    `identity` (this run's values of what a resume must keep) is recorded in every save and
    checked at resume; without it nothing is recorded or checked; so is `streams`, the record of
    the data the run reads (launcher.wire.checkpoints; None: synthetic data). `async_mode` (a
    checkpoint_async_mode) other than disabled writes in the background: `wait` or `close`
    before the process ends; its collectives time out after `timeout` (the job's collective_timeout;
    None: torch's default).
    """

    def __init__(
        self,
        directory: str | Path,
        keep: int,
        rank: int | None = None,
        local_rank: int | None = None,
        identity: RunIdentity | None = None,
        async_mode: str = DISABLED,
        streams: dict | None = None,
        timeout: timedelta | None = None,
    ):
        if keep < 1:
            raise ValueError(f"keep must be at least 1, not {keep}")
        self.directory = Path(directory)
        self.keep = keep
        self.rank = rank if rank is not None else (dist.get_rank() if distributed() else 0)
        if local_rank is None:
            local_rank = int(os.environ.get("LOCAL_RANK", self.rank))
        self.local_rank = local_rank
        self.identity, self.streams = identity, streams
        self._good: set[int] = set()  # steps this job saved or verified
        self._bad: set[int] = set()  # steps resume found unusable: never kept in place of good ones
        self._background = BackgroundSaves(async_mode, distributed(), timeout) if is_async(async_mode) else None

    def path(self, step: int) -> Path:
        return self.directory / f"step-{step}"

    def complete_steps(self) -> list[int]:
        """Steps whose marker says every rank wrote its files, oldest first. Their contents are
        verified at resume, not here: right after a save on per-host disks the other hosts'
        shards are not here (they meet in the S3 checkpoint prefix)."""
        return checkpoints.complete_steps(self.directory)

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
        global data position) and must hold only plain values and tensors (loaded weights_only).
        An asynchronous save returns once the state is staged; the previous one is waited for
        first (CheckpointWriteError if it failed)."""
        self.wait()
        final = self.path(step)
        # Re-saving a step this job saved or verified (SIGTERM right after a resume) could only
        # lose it; any other step-<N> of that name (one resume skipped) is replaced.
        if step in self._good:
            return final
        tmp = self.directory / f"step-{step}.tmp"
        if self.local_rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(final, ignore_errors=True)
        barrier()
        written: list[str] = []
        # Every rank agrees that its own files are written before any enters DCP's collectives:
        # a rank whose disk filled up here would otherwise leave the others waiting there.
        reason = together(lambda: written.extend(self._write_own_files(tmp, step, scheduler, dataloader_state, extra)))
        if reason is not None:
            self._give_up(step, reason)
        writer = _RecordingWriter(tmp)
        state = _sharded_state(model, optimizer, OPTIMIZER_LAYOUT)

        def write_part():
            manifest.write_part(tmp, self.rank, [*written, *writer.written])

        if self._background is None:
            def write():
                with _quiet_no_dist():
                    dcp.save(state, storage_writer=writer, no_dist=not distributed())

            self._commit(step, write, write_part)
        else:
            group = self._background.group
            with _quiet_no_dist():
                self._background.start(state, writer, lambda write: self._commit(step, write.result, write_part, group,
                                                                                 background=True))
        return final

    def _write_own_files(self, tmp: Path, step: int, scheduler: LRScheduler | None, dataloader_state: dict,
                         extra: dict | None) -> list[str]:
        """This rank's files beside DCP's shards: its RNG state; on rank 0 trainer.pt and the data
        record. Returns their names, and the DCP metadata's on rank 0 (its coordinator writes it)."""
        tmp.mkdir(parents=True, exist_ok=True)
        rng_file = f"rng-{self.rank}.pt"
        write_errors.save(_rng_state(), tmp / rng_file)
        if self.rank != 0:
            return [rng_file]
        trainer = {
            "step": step,
            "world_size": world(),
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "dataloader": dataloader_state,
            "extra": extra or {},
            "keeps": self.identity.record() if self.identity is not None else None,
            "optimizer_layout": OPTIMIZER_LAYOUT,
        }
        write_errors.save(trainer, tmp / TRAINER_FILE)
        written = [rng_file, TRAINER_FILE]
        if self.streams is not None:
            with write_errors.writing(tmp / checkpoints.DATA_STREAMS_FILE):
                checkpoints.write_data_streams(tmp, self.streams)
            written.append(checkpoints.DATA_STREAMS_FILE)
        return [*written, DCP_METADATA]

    def wait(self) -> None:
        """Collective: return once the save in flight (asynchronous mode) is committed; raise
        CheckpointWriteError, on every rank, if it could not be."""
        if self._background is not None:
            self._background.wait()

    def close(self) -> None:
        """Collective: wait for the save in flight, then free the background saver's buffers."""
        if self._background is not None:
            background, self._background = self._background, None
            background.close()

    def _commit(self, step: int, write, write_part, group=None, background: bool = False) -> None:
        """`write` finishes DCP's write (the save itself, or the wait for a background one); then
        each rank's manifest part, rank 0's marker, the rename, the pruning. Each stage fails on
        every rank together, before the checkpoint is marked complete (the write through DCP's own
        agreement, collectives.dcp_agreed, in the background too: a rank whose background write
        failed outside DCP's steps would wait in our agreement while its peers waited in DCP's)."""
        tmp, final = self.directory / f"step-{step}.tmp", self.path(step)
        reason = dcp_agreed(write)
        reason = reason or together(write_part, group)  # every rank's part is written: only now may the marker say so
        reason = reason or together(lambda: manifest.write_marker(tmp, step, parts=world()) if self.rank == 0 else None,
                                    group)
        if reason is not None:
            self._give_up(step, reason)
        if self.local_rank == 0:
            try:
                tmp.rename(final)
            except FileNotFoundError:  # a shared file system: another host's first rank renamed it
                pass
        barrier(group)
        self._good.add(step)
        self._bad.discard(step)
        # Rank 0 chooses what to keep, so that hosts with per-host disks (no markers there) agree.
        kept = [s for s in self.complete_steps() if s not in self._bad] if self.rank == 0 else []
        kept = from_rank0([s for s in kept if s <= step][-self.keep:], group)
        if self.local_rank == 0:
            self._prune(step, kept)
        barrier(group)
        if self.local_rank == 0:  # once per host: every rank saying it said nothing more (hosts may differ in disks)
            log.info("saved checkpoint %s%s", final, " (written in the background)" if background else "")

    def _give_up(self, step: int, reason: str) -> NoReturn:
        """Every rank, together: remove the save's .tmp and say why it failed."""
        if self.local_rank == 0:  # a disk that filled up gets its space back
            shutil.rmtree(self.directory / f"step-{step}.tmp", ignore_errors=True)
        raise CheckpointWriteError(
            f"checkpoint {self.path(step)} (checkpoint_dir) could not be written: {reason}. The checkpoints saved "
            f"before it are untouched ({self._newest_kept()}); training stops here rather than go on without "
            f"checkpoints. Free space in checkpoint_dir (or lower num_kept_checkpoints) and run the job "
            f"again: it resumes from the newest complete checkpoint.")

    def _newest_kept(self) -> str:
        steps = [s for s in self.complete_steps() if s not in self._bad]
        return f"newest complete: {self.path(steps[-1])}" if steps else "none was complete yet"

    def load_latest(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: LRScheduler | None
    ) -> tuple[int, dict, dict] | None:
        """Collective. Restore the newest usable checkpoint into the given (fresh) objects and
        return (step, dataloader_state, extra); None when there is no checkpoint. Raises
        CheckpointError when checkpoints exist and none is usable."""
        candidates = from_rank0(self._candidates() if self.rank == 0 else None)
        if not candidates:
            return None
        reasons: dict[int, str] = {}
        for step in candidates:
            reason = self._verify(step)
            if reason is None:
                return self._load(step, model, optimizer, scheduler)
            reasons[step] = reason
            self._bad.add(step)
            if self.rank == 0:
                log.warning("checkpoint %s is not usable, trying the one before it: %s", self.path(step), reason)
        listing = "".join(f"\n  {self.path(step).name}: {reason}" for step, reason in reasons.items())
        raise CheckpointError(
            f"no usable checkpoint in {self.directory} (checkpoint_dir), and training does not start over "
            f"from step 1 on top of them. To start fresh, move or delete them (on SageMaker: under "
            f"checkpoint_s3_uri) or point checkpoint_dir elsewhere.{listing}")

    def _steps(self) -> list[int]:
        return checkpoints.step_dirs(self.directory)

    def _candidates(self) -> list[int]:
        """Rank 0: every step-<N> directory, newest first; `.tmp` ones are saves that never finished."""
        if self.directory.is_dir():
            for p in sorted(self.directory.iterdir()):
                if _TMP_DIR.fullmatch(p.name):
                    log.info("ignoring %s: a save that did not finish is not a checkpoint", p)
        return self._steps()[::-1]

    def _verify(self, step: int) -> str | None:
        """Collective: None when `step` is usable, else why not; the same answer on every rank.
        Rank 0 checks the marker, parts and sizes; every rank hashes its share of the files."""
        path = self.path(step)
        entries, reason = from_rank0(
            manifest.inspect(path, step, required=(DCP_METADATA, TRAINER_FILE)) if self.rank == 0 else None)
        if reason is not None:
            return reason
        reason = first_of_all(manifest.first_mismatch(path, manifest.share(entries, self.rank, world())))
        if reason is not None:
            return reason
        return from_rank0(_unlisted_shard(path, entries) if self.rank == 0 else None)

    def _load(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
              scheduler: LRScheduler | None) -> tuple[int, dict, dict]:
        path = self.path(step)
        trainer = torch.load(path / TRAINER_FILE, weights_only=True)
        self._check_continues(path, trainer)
        layout = trainer.get("optimizer_layout")
        state = _sharded_state(model, optimizer, layout)
        with _quiet_no_dist():
            dcp.load(state, checkpoint_id=path, no_dist=not distributed())
        with qlora.base_left_out():  # every key DCP loaded; QLoRA's base is not among them
            set_model_state_dict(model, state["model"], options=StateDictOptions(strict=not qlora.is_quantized(model)))
        set_optimizer_state_dict(model, optimizer, state["optim"], options=_optim_options(layout))
        if scheduler is not None and trainer["scheduler"] is not None:
            scheduler.load_state_dict(trainer["scheduler"])
        rng_file = path / f"rng-{self.rank}.pt"
        if trainer["world_size"] == world() and rng_file.is_file():
            _set_rng_state(torch.load(rng_file, weights_only=True))
        else:
            # smlaunch's training draws no random numbers, so this changes nothing for it; a user
            # script with dropout continues with other random draws (docs/spot.md).
            if self.local_rank == 0:
                log.warning("checkpoint %s was saved by %d ranks, now %d: RNG states not restored",
                            path, trainer["world_size"], world())
        self._good.add(step)
        if self.local_rank == 0:
            log.info("resumed from checkpoint %s", path)
        return step, trainer["dataloader"], trainer["extra"]

    def _check_continues(self, path: Path, trainer: dict) -> None:
        """Every rank reads the same trainer.pt, so all raise together or none does. A checkpoint
        saved before trainer.pt recorded `keeps` is not checked."""
        saved = trainer.get("keeps")
        conflicts = self.identity.conflicts(saved) if saved and self.identity is not None else []
        if conflicts:
            raise CheckpointError(
                f"this run cannot continue checkpoint {path} (checkpoint_dir): resuming would silently give "
                f"another run. A resume may change {may_change()}; not these:"
                + "".join(f"\n  {line}" for line in conflicts)
                + "\nTo start a new run instead, move or delete the checkpoints (on SageMaker: under "
                "checkpoint_s3_uri) or point checkpoint_dir elsewhere.")
        if self.streams is not None:
            self._check_data(path)

    def _check_data(self, path: Path) -> None:
        """The data this run reads against the data the checkpoint was trained on; every rank
        decides alike (the same files), rank 0 says it."""
        saved = checkpoints.read_data_streams(path)
        if saved is None:
            if self.rank == 0:
                log.info("checkpoint %s does not record its data (saved by an earlier smlaunch): the data this run "
                         "reads is not compared with the data it was trained on", path)
            return
        changes = compare(saved, self.streams)
        if changes.refusals:
            raise CheckpointError(f"this run cannot continue checkpoint {path} (checkpoint_dir) on this data:"
                                  + "".join(f"\n  {line}" for line in changes.refusals))
        if self.rank == 0:
            for line in changes.warnings:
                log.warning("resuming from %s: %s", path, line)

    def _prune(self, newest: int, kept: list[int]) -> None:
        """Delete older checkpoints, complete or partial, except `kept`; leave later steps alone."""
        for p in self.directory.iterdir():
            m = _STEP_DIR.fullmatch(p.name) or _TMP_DIR.fullmatch(p.name)
            if m and int(m.group(1)) < newest and int(m.group(1)) not in kept:
                # ignore_errors: on a shared file system another host may delete the same tree.
                shutil.rmtree(p, ignore_errors=True)


def _unlisted_shard(path: Path, entries: list[manifest.Entry]) -> str | None:
    """Why the checkpoint is not whole although every part checked out: a file its DCP metadata
    reads from that no manifest part lists. The marker's own `parts` count is not trusted alone (a
    marker naming fewer parts than ranks saved would leave a rank's shards unchecked). Read after
    the hashing, so the metadata is the one rank 0 saved."""
    listed = {entry.name for entry in entries}
    try:
        metadata = dcp.FileSystemReader(str(path)).read_metadata()
        needed = {info.relative_path for info in metadata.storage_data.values()}
    except Exception as exc:  # noqa: BLE001 - a pickle from disk: any failure means not usable
        return f"{DCP_METADATA} cannot be read ({type(exc).__name__}: {exc})"
    unlisted = sorted(needed - listed)
    if unlisted:
        return (f"{unlisted[0]}, which {DCP_METADATA} reads from, is not listed in any manifest part (the "
                f"{checkpoints.MARKER} marker names too few parts, or a part was edited): its content is unverified")
    return None
