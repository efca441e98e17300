"""Where a traced rank's step peaks (what it holds: container.holdings, as a real run measures it).

torch's FSDPMemTracker (MemTracker without FSDP)
counts the live tensors' bytes through the step; `PeakTracker` adds where the peak is: the phase
(forward, backward, optimizer) and the innermost module running then.
"""

from __future__ import annotations

import torch
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.fsdp import FSDPModule

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
