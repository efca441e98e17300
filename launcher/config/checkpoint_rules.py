"""What `checkpoint_async_mode` asks of the job: checkpoints to write, and CUDA for pinned staging
(launcher.wire.training.speed; docs/checkpoints.md)."""

from __future__ import annotations

from launcher.config.context import Context
from launcher.config.rules import HP
from launcher.wire.training.issues import Issue
from launcher.wire.training.speed import NO_CUDA_FIX, is_async, needs_cuda

FIELD = f"{HP}.checkpoint_async_mode"


def check_async_checkpoint(ctx: Context) -> list[Issue]:
    """Errors for an asynchronous mode that could not do what it says; a user script's own
    hyperparameter of that name means what the script makes of it."""
    mode = ctx.hp.checkpoint_async_mode
    if not ctx.runtime or not is_async(mode):
        return []
    issues = []
    if not ctx.hp.checkpoint_freq:
        issues.append(Issue(FIELD, mode, "asks for asynchronous checkpoints, but checkpoint_freq is unset, so no "
                            "checkpoint is written", "set checkpoint_freq: N (steps between saves), or drop "
                            "checkpoint_async_mode"))
    inst = ctx.instance
    if needs_cuda(mode) and inst is not None and inst.accelerators == 0:
        issues.append(Issue(FIELD, mode, f"stages checkpoints in pinned (CUDA page-locked) host memory, and "
                            f"{inst.name} has no GPU", NO_CUDA_FIX))
    return issues
