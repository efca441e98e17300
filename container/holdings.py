"""What a rank holds: the bytes of its parameters, gradients and optimizer state, measured as the
storage of its local tensors (a DTensor's local shard; FSDP2 pads each shard to an equal size, and
its reduce-scattered gradients are views of one padded buffer), each storage counted once.

A run logs it on every rank after its first optimizer step (the optimizer's state exists from then),
so a user can compare a real run with `smlaunch plan --trace`, which measures the same way
(container/trace/memory.py)."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

log = logging.getLogger("smlaunch")
GIB = 2**30


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """The bytes of the distinct storages under `tensors` (a DTensor's: its local shard's; a tensor
    subclass's, QLoRA's NF4: its inner tensors')."""
    seen: dict[int, int] = {}
    for local in _plain(tensors):
        storage = local.untyped_storage()
        seen[storage._cdata] = storage.nbytes()
    return sum(seen.values())


def _plain(tensors: Iterable[torch.Tensor]) -> Iterable[torch.Tensor]:
    for t in tensors:
        local = t.to_local() if isinstance(t, DTensor) else t
        if is_traceable_wrapper_subclass(local):
            names, _ = local.__tensor_flatten__()
            yield from _plain(getattr(local, name) for name in names)
        else:
            yield local


def optimizer_tensors(optimizer) -> list[torch.Tensor]:
    return [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]


class Holdings:
    """The rank's parameters, gradients (as the optimizer step finds them) and optimizer state
    (after the step), from the optimizer's own hooks: the step's code runs unchanged. `once`: the
    hooks go after the first step."""

    def __init__(self, model: torch.nn.Module, optimizer, once: bool = False, on_step=None) -> None:
        self.parameter_bytes = storage_bytes(model.parameters())
        self.gradient_bytes = self.optimizer_bytes = 0
        self._once, self._on_step = once, on_step
        params = [p for group in optimizer.param_groups for p in group["params"]]
        self._hooks = [
            optimizer.register_step_pre_hook(lambda *_: self._grads(params)),
            optimizer.register_step_post_hook(lambda *_: self._state(optimizer)),
        ]

    def _grads(self, params: list[torch.Tensor]) -> None:
        self.gradient_bytes = storage_bytes(p.grad for p in params if p.grad is not None)

    def _state(self, optimizer) -> None:
        self.optimizer_bytes = storage_bytes(optimizer_tensors(optimizer))
        if self._on_step is not None:
            self._on_step(self)
        if self._once:
            self.remove()

    def remove(self) -> None:
        for hook in self._hooks:
            hook.remove()

    def text(self, rank: int) -> str:
        return (f"rank {rank} holds {self.parameter_bytes / GIB:.2f} GiB of parameters, "
                f"{self.gradient_bytes / GIB:.2f} GiB of gradients, {self.optimizer_bytes / GIB:.2f} GiB of "
                f"optimizer state ({self.parameter_bytes:,} / {self.gradient_bytes:,} / {self.optimizer_bytes:,} B)")


def log_after_first_step(rank: int, model: torch.nn.Module, optimizer) -> Holdings:
    """Log what this rank holds once its first optimizer step has run."""
    return Holdings(model, optimizer, once=True, on_step=lambda held: log.info("%s", held.text(rank)))
