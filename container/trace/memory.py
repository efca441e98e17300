"""Where a traced rank's step peaks (what it holds: container.holdings, as a real run measures it).

torch's FSDPMemTracker (MemTracker without FSDP)
counts the live tensors' bytes through the step; `PeakTracker` adds where the peak is: the phase
(forward, backward, optimizer) and the innermost module running then.
"""

from __future__ import annotations

from copy import deepcopy

import torch
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker
from torch.distributed.fsdp import FSDPModule
from torch.nn.modules.module import register_module_forward_pre_hook

# what wrappers add to a module's name (activation checkpointing, torch.compile)
WRAPPERS = ("_checkpoint_wrapped_module", "_orig_mod")


def module_name(fqn: str) -> str:
    """A tracked module's name as the model names it: ModTracker's names start with the root's class
    ("FSDPTransformer.layers.1..."), "Global" is outside every module."""
    if fqn == "Global":
        return "outside the model"
    parts = [p for p in fqn.split(".")[1:] if p not in WRAPPERS]
    return ".".join(parts) or "the model's root"


class _NoHook:
    def remove(self) -> None:
        pass


_NO_HOOK = _NoHook()


def _where(base: type[MemTracker]) -> type[MemTracker]:
    class Tracker(base):
        """torch's tracker, noting the phase and innermost module at each new peak, over a step
        that runs the model's root more than once: gradient accumulation's micro-batches, a
        pipeline's microbatches. torch's trackers take a root's second forward for the next
        iteration and refuse it; this one forgets that root's own statistics first (a fresh
        iteration for it: another stage's, whose backward may be pending, stay), while the step's
        peak, the figure the trace reports, goes on."""

        peak_at: dict[str, str] = {"phase": "start of the step", "module": "outside the model"}
        roots: tuple[torch.nn.Module, ...] = ()

        def __enter__(self):
            # global hooks run in the order they were registered: this one before the tracker's own
            self._repeat_hook = register_module_forward_pre_hook(self._root_again)
            return super().__enter__()

        def __exit__(self, *args):
            super().__exit__(*args)
            self._repeat_hook.remove()

        def _root_again(self, module, _args) -> None:
            if module in self.roots and module in self.memory_tracking and not self._mod_tracker.is_bw:
                del self.memory_tracking[module]

        def _track_module_params_and_buffers(self, module, install_grad_hooks: bool = True):
            # torch's hooks every parameter's gradient, and a frozen one (LoRA's base) refuses the hook
            # ("cannot register a hook on a tensor that doesn't require gradient"): it has no gradient to
            # count, so it is marked hooked already, by handles whose removal removes nothing
            for parameter in module.parameters():
                if not parameter.requires_grad and parameter not in self._param_to_grad_hook_handles:
                    self._param_to_grad_hook_handles[parameter] = (_NO_HOOK, _NO_HOOK)
            return super()._track_module_params_and_buffers(module, install_grad_hooks)

        def _update_peak_stats(self, peak_state) -> None:
            # The step's peak only (what peak_kinds reports). torch's own also keeps each module's
            # peak, walking every tracked module at each allocation through weak references whose
            # call probes the module for `_fix_weakref`: a miss that runs Module.__getattr__, twice
            # under a checkpoint wrapper. That walk was half of a 32-block model's trace (BENCHMARKS.md).
            new_peak = False
            for device, snapshot in self._curr_mem_snap.items():
                if self._peak_mem.get(device, 0) < snapshot[_TOTAL_KEY]:
                    self._peak_mem[device] = snapshot[_TOTAL_KEY]
                    self._peak_mem_snap[device] = deepcopy(snapshot)
                    new_peak = True
            if new_peak:
                phase = "optimizer" if self._in_opt else ("backward" if self._mod_tracker.is_bw else "forward")
                innermost = max(self._mod_tracker.parents, key=lambda fqn: (fqn != "Global", fqn.count(".")))
                self.peak_at = {"phase": phase, "module": module_name(innermost)}

    return Tracker


FSDPPeakTracker, PeakTracker = _where(FSDPMemTracker), _where(MemTracker)


def peak_tracker(model: torch.nn.Module, optimizer, roots: tuple[torch.nn.Module, ...] = ()) -> MemTracker:
    """The tracker of a step of `model` (and `roots`, the modules a step calls, when not the model
    itself: a pipeline's stages)."""
    if isinstance(model, FSDPModule):
        tracker = FSDPPeakTracker(model, optimizer)
    else:
        tracker = PeakTracker()
        tracker.track_external(model, optimizer)
    tracker.roots = roots or (model,)
    return tracker


def peak_kinds(tracker: MemTracker, device: torch.device) -> dict[str, int]:
    """The peak's bytes by the tracker's kinds ("Sharded Param", "Temp", ...) and "Total"."""
    peak = tracker.get_tracker_snapshot("peak")[device]
    return {getattr(kind, "value", str(kind)): size for kind, size in peak.items()}
