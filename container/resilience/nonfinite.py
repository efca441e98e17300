"""Non-finite steps (`nonfinite_policy`, launcher.wire.training.nonfinite; docs/faults.md).

The trainer asks the guard, after a step's backward and gradient clipping and before its update,
whether the update applies (`NonFiniteGuard.__call__`). The step is non-finite when its loss
(all-reduced: the same on every data-parallel rank) or its gradient norm (the whole model's) is
not finite on any rank; one all-reduce of a flag makes every rank take the same branch.

- fail: FloatingPointError, before the update.
- skip: no update (no optimizer step, no learning-rate schedule step); the batch is spent and the
  step number goes on, so a run of max_steps with k skipped steps makes max_steps - k updates.
  The skipped steps are kept in each checkpoint, so a restart counts them once.
- rollback: the step's data position goes into the skip file (launcher.wire.training.nonfinite) and the
  rank leaves with EXIT_NONFINITE_ROLLBACK; the next attempt resumes from the newest checkpoint
  and `before_step` moves the loader past those samples. The step numbers stay: the step that
  was non-finite trains on the batch after the skipped one.
Both count towards nonfinite_max; the one past it fails the job, naming every non-finite step.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import torch
import torch.distributed as dist

from container.checkpoint.collectives import from_rank0
from container.resilience.attempt import record_failure
from launcher.wire.faults import EXIT_NONFINITE_ROLLBACK, attempt
from launcher.wire.training.nonfinite import (
    FAIL,
    ROLLBACK,
    SKIP_FILE,
    SkipFileError,
    SkippedBatch,
    read_skips,
    write_skips,
)
from launcher.wire.training.run_settings import RunSettings

log = logging.getLogger("smlaunch")
CHECKPOINT_KEY = "nonfinite_skipped"  # the checkpoint's `extra`: the steps skipped in place up to it


class NonFiniteRollback(SystemExit):
    """Leaving for a restart that rolls back: run_rank exits with EXIT_NONFINITE_ROLLBACK, no traceback."""

    def __init__(self, message: str):
        super().__init__(EXIT_NONFINITE_ROLLBACK)
        self.message = message

    def __str__(self) -> str:
        return self.message


class NonFiniteGuard:
    def __init__(self, s: RunSettings, rank: int, local_rank: int, device: torch.device,
                 checkpoint_dir: Path | None, skipped: list[int], rollbacks: list[SkippedBatch]):
        self.policy, self.max = s.nonfinite_policy, s.nonfinite_max
        self.rank, self.local_rank, self.device, self.directory = rank, local_rank, device, checkpoint_dir
        self.skipped, self.rollbacks = skipped, rollbacks
        self._first_sample, self._samples, self._last_skipped = 0, 0, None

    @property
    def count(self) -> int:
        return len(self.skipped) + len(self.rollbacks)

    def before_step(self, loader) -> None:
        """Between steps: move `loader` past the samples a rollback skips; note where this step's
        batches begin (its data position, for a rollback)."""
        position = loader.state_dict()["next_sample"]
        moved = True
        while moved:  # skipped batches may follow each other
            moved = False
            for skip in self.rollbacks:
                if skip.covers(position):
                    position, moved = skip.first_sample + skip.samples, True
                    if self.rank == 0:
                        log.warning("data: training past the samples of non-finite %s (rolled back)", skip.text())
        if position != loader.state_dict()["next_sample"]:
            loader.load_state_dict({"next_sample": position})
        self._first_sample, self._samples = position, loader.global_batch_size

    def agreed_finite(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> torch.Tensor:
        """1 when every rank's loss and gradient norm are finite, else 0 (int32, on the device): the
        guard's one collective per step (`plan --trace` issues it without reading the flag)."""
        finite = (torch.isfinite(loss.to(self.device)) & torch.isfinite(grad_norm.to(self.device))).to(torch.int32)
        if dist.is_initialized() and dist.get_world_size() > 1:  # a stage without the loss agrees too
            dist.all_reduce(finite, op=dist.ReduceOp.MIN)
        return finite

    def __call__(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> bool:
        """Whether `step`'s update applies: True for a finite step, False for one skipped; raises
        under fail or past nonfinite_max, and leaves the process under rollback."""
        # the flag is made on the device and read once: one host sync per step, and the values
        # themselves only for a non-finite step's message
        if self.agreed_finite(loss, grad_norm).item():
            return True
        loss_value, norm_value = loss.item(), float(grad_norm)
        what = (f"loss is {loss_value}" if not math.isfinite(loss_value)
                else f"gradient norm is {norm_value} (loss {loss_value:.6g})")
        if self.policy == FAIL:
            raise FloatingPointError(f"{what} at step {step}: lower lr or check the data")
        steps = sorted([*self.skipped, *(r.step for r in self.rollbacks), step])
        if len(steps) > self.max:
            raise FloatingPointError(
                f"{what} at step {step}: non-finite step {len(steps)} of this run, more than nonfinite_max="
                f"{self.max} allows (non-finite steps: {', '.join(map(str, steps))}); lower lr or check the data, "
                "or raise nonfinite_max")
        if self.policy == ROLLBACK:
            self._leave_for_rollback(step, loss_value, norm_value, what)
        self.skipped.append(step)
        self._last_skipped = step
        if self.rank == 0:
            log.warning("non-finite step %d (%s): skipped, no update; the learning-rate schedule does not step and "
                        "the batch is spent (non-finite step %d of at most %d)", step, what, len(steps), self.max)
        return False

    def _leave_for_rollback(self, step: int, loss: float, norm: float, what: str) -> None:
        self.rollbacks.append(SkippedBatch(step, self._first_sample, self._samples, attempt(), str(loss), str(norm)))
        if self.local_rank == 0:  # each host's copy of the checkpoint directory (SageMaker syncs every host's)
            write_skips(self.directory, self.rollbacks)
        exc = NonFiniteRollback(
            f"{what} at step {step}: rolling back (nonfinite_policy rollback, non-finite step {self.count} of at "
            f"most {self.max}): samples {self._first_sample}..{self._first_sample + self._samples - 1} are recorded "
            f"in {self.directory / SKIP_FILE}; leaving with exit code {EXIT_NONFINITE_ROLLBACK} so that the job "
            "restarts from its newest checkpoint and trains past them")
        record_failure(exc, in_collective=False)  # for the bootstrap's restart decision
        log.error("rank %d: %s", self.rank, exc)
        raise exc

    def skipped_now(self, step: int) -> bool:
        """Whether `step` was skipped (the trainer then records it, not its loss)."""
        return self._last_skipped == step

    def fields(self) -> dict:
        """What a metrics record (and so progress.json) carries: the run's non-finite steps so far."""
        return {} if self.policy == FAIL else {"nonfinite_steps": self.count}

    def checkpoint_extra(self) -> dict:
        return {} if self.policy == FAIL else {CHECKPOINT_KEY: list(self.skipped)}


def nonfinite_guard(s: RunSettings, rank: int, local_rank: int, device: torch.device,
                    checkpoint_dir: Path | None, extra: dict | None) -> NonFiniteGuard:
    """Collective where the job writes checkpoints: rank 0 reads the skip file, every rank gets its
    records (a host's own copy may lag). `extra`: the resumed checkpoint's (None: no checkpoint)."""
    rollbacks: list[SkippedBatch] = []
    if checkpoint_dir is not None:
        read = _read(checkpoint_dir) if rank == 0 else None
        rollbacks, problem = from_rank0(read)
        if problem:
            raise SkipFileError(problem)
        if rollbacks and rank == 0:
            log.info("nonfinite: %d rollback(s) recorded in %s: %s", len(rollbacks), checkpoint_dir / SKIP_FILE,
                     "; ".join(r.text() for r in rollbacks))
    skipped = [int(step) for step in (extra or {}).get(CHECKPOINT_KEY, [])]
    return NonFiniteGuard(s, rank, local_rank, device, checkpoint_dir, skipped, rollbacks)


def _read(checkpoint_dir: Path) -> tuple[list[SkippedBatch], str | None]:
    try:
        return read_skips(checkpoint_dir), None
    except SkipFileError as exc:
        return [], str(exc)
