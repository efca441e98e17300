"""container/trace/memory.py's tracker keeps the step's peak alone (not torch's per-module peaks, whose
walk of every module at each allocation was half of a 32-block trace): its peak, kind by kind, is
torch's own MemTracker's over the same step, and it says where the peak was."""

from __future__ import annotations

import torch
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from container.trace.memory import PeakTracker, peak_kinds


def _step(tracker_of) -> tuple[MemTracker, dict[str, int], torch.nn.Module]:
    torch.manual_seed(0)
    # checkpoint-wrapped blocks: the wrapper's attribute misses were the walk's cost
    model = torch.nn.Sequential(*(checkpoint_wrapper(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(),
                                                                          torch.nn.Linear(256, 64)))
                                  for _ in range(3)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tracker = tracker_of(model, optimizer)
    with tracker:  # one step (torch's tracker refuses a root's second forward): AdamW's state made in it
        model(torch.randn(32, 64)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return tracker, peak_kinds(tracker, torch.device("cpu")), model  # the model: its modules' stats stay


def _torch_own(model, optimizer) -> MemTracker:
    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    return tracker


def _ours(model, optimizer) -> PeakTracker:
    tracker = PeakTracker()
    tracker.track_external(model, optimizer)
    tracker.roots = (model,)
    return tracker


def test_the_peak_is_torch_trackers_kind_by_kind_and_placed():
    torch_tracker, theirs, _model = _step(_torch_own)
    tracker, ours, _other = _step(_ours)
    assert ours == theirs and ours["Total"] > 0
    assert tracker.peak_at["phase"] in ("forward", "backward", "optimizer")
    # the control: torch's tracker raised each module's peak as its forward allocated; this one leaves
    # them where the module's hooks set them
    def local(t):
        return {stats.mod_fqn: dict(stats.local_peak) for stats in t.memory_tracking.values()}

    assert local(torch_tracker) != local(tracker) and local(torch_tracker).keys() == local(tracker).keys()
