"""Asynchronous checkpoints: the modes of `checkpoint_async_mode` and what each needs, written once
for validation, the planner and the runtime (container/checkpoint/background.py).

The names are torchtitan's `checkpoint.async_mode`: `disabled` saves while every rank waits;
`async` copies the model and optimizer state to host memory and writes it in a background thread
while training goes on; `async_with_pinned_mem` stages into pinned (page-locked) host memory, which
a GPU copies into faster, and keeps that buffer from save to save.
"""

from __future__ import annotations

DISABLED = "disabled"
ASYNC = "async"
PINNED = "async_with_pinned_mem"
ASYNC_MODES = (DISABLED, ASYNC, PINNED)


def is_async(mode: str | None) -> bool:
    return mode not in (None, DISABLED)


def needs_cuda(mode: str | None) -> bool:
    """Pinned memory is CUDA's page-locked host memory: without a CUDA device there is none."""
    return mode == PINNED


NO_CUDA_FIX = "use checkpoint_async_mode: async (plain host copies), or run on a GPU instance"
