"""What a traced rank holds and where its step peaks.

Held bytes are measured, not computed: the storage of the local tensors the rank holds (a DTensor's
local shard; FSDP2 pads each shard to an equal size, and its reduce-scattered gradients are views of
one padded buffer), each storage counted once. torch's FSDPMemTracker (MemTracker without FSDP)
counts the live tensors' bytes through the step; `PeakTracker` adds where the peak is: the phase
(forward, backward, optimizer) and the innermost module running then.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """The bytes of the distinct storages under `tensors` (a DTensor's: its local shard's)."""
    seen: dict[int, int] = {}
    for t in tensors:
        local = t.to_local() if isinstance(t, DTensor) else t
        storage = local.untyped_storage()
        seen[storage._cdata] = storage.nbytes()
    return sum(seen.values())


def optimizer_tensors(optimizer) -> list[torch.Tensor]:
    return [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]


class HeldBytes:
    """The rank's parameters, gradients (as the optimizer step finds them) and optimizer state
    (after the step), from the optimizer's own hooks: the step's code runs unchanged."""

    def __init__(self, model: torch.nn.Module, optimizer) -> None:
        self.parameter_bytes = storage_bytes(model.parameters())
        self.gradient_bytes = self.optimizer_bytes = 0
        params = [p for group in optimizer.param_groups for p in group["params"]]
        self._hooks = [
            optimizer.register_step_pre_hook(lambda *_: self._grads(params)),
            optimizer.register_step_post_hook(lambda *_: self._state(optimizer)),
        ]

    def _grads(self, params: list[torch.Tensor]) -> None:
        self.gradient_bytes = storage_bytes(p.grad for p in params if p.grad is not None)

    def _state(self, optimizer) -> None:
        self.optimizer_bytes = storage_bytes(optimizer_tensors(optimizer))

    def remove(self) -> None:
        for hook in self._hooks:
            hook.remove()


# what wrappers add to a module's name (activation checkpointing, torch.compile)
WRAPPERS = ("_checkpoint_wrapped_module", "_orig_mod")


def module_name(fqn: str) -> str:
    """A tracked module's name as the model names it: ModTracker's names start with the root's class
    ("FSDPTransformer.layers.1..."), "Global" is outside every module."""
    if fqn == "Global":
        return "outside the model"
    parts = [p for p in fqn.split(".")[1:] if p not in WRAPPERS]
    return ".".join(parts) or "the model's root"


def _where(base: type[MemTracker]) -> type[MemTracker]:
    class Tracker(base):
        """torch's tracker, noting the phase and innermost module at each new peak."""

        peak_at: dict[str, str] = {"phase": "start of the step", "module": "outside the model"}

        def _update_peak_stats(self, peak_state) -> None:
            before = dict(self._peak_mem)
            super()._update_peak_stats(peak_state)
            if self._peak_mem != before:
                phase = "optimizer" if self._in_opt else ("backward" if self._mod_tracker.is_bw else "forward")
                innermost = max(self._mod_tracker.parents, key=lambda fqn: (fqn != "Global", fqn.count(".")))
                self.peak_at = {"phase": phase, "module": module_name(innermost)}

    return Tracker


FSDPPeakTracker, PeakTracker = _where(FSDPMemTracker), _where(MemTracker)


def peak_tracker(model: torch.nn.Module, optimizer) -> MemTracker:
    if isinstance(model, FSDPModule):
        return FSDPPeakTracker(model, optimizer)
    tracker = PeakTracker()
    tracker.track_external(model, optimizer)
    return tracker


def peak_kinds(tracker: MemTracker, device: torch.device) -> dict[str, int]:
    """The peak's bytes by the tracker's kinds ("Sharded Param", "Temp", ...) and "Total"."""
    peak = tracker.get_tracker_snapshot("peak")[device]
    return {getattr(kind, "value", str(kind)): size for kind, size in peak.items()}
