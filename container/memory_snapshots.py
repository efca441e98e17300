"""`memory_snapshot_steps`: the CUDA caching allocator's history over a window of training steps
(docs/speed.md, "Memory snapshots").

torchtitan's MemoryProfiler does the same: `torch.cuda.memory._record_memory_history` records
every allocation and free with its Python stack from the start of the window's first step, and
`_dump_snapshot` writes the allocator's segments with that history at the end of its last step,
one pickle per rank in `<output_data_dir>/memory/rank-R-steps-A-B.pickle`, which
pytorch.org/memory_viz reads. A CUDA out-of-memory error inside the window writes what was recorded
up to it as `rank-R-oom-step-N.pickle` before the error ends the rank: the picture of that OOM.
Without CUDA the allocator has no history: the window logs so on rank 0 and records nothing
(validate warns of it first: launcher/config/runtime_rules.py). The write is timed as a section of
its own by the step watchdog, as the profile's is.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from container.resilience import step_watch
from launcher.wire.training.speed import profile_window

log = logging.getLogger("smlaunch")
MAX_ENTRIES = 100_000  # the newest allocations and frees kept (torchtitan's figure): a few hundred MB at most


class MemorySnapshots:
    """One rank's recording over a window of steps; a no-op without `memory_snapshot_steps` or CUDA."""

    def __init__(self, memory_snapshot_steps: str | None, output_dir: Path, rank: int, device: torch.device):
        self.window = profile_window(memory_snapshot_steps) if memory_snapshot_steps else None
        self.directory, self.rank = output_dir / "memory", rank
        self.recording, self.first = False, None
        if self.window and device.type != "cuda":
            if rank == 0:
                log.warning("memory_snapshot_steps %s: no CUDA device (%s), so no allocator history to record; "
                            "no snapshot will be written", memory_snapshot_steps, device)
            self.window = None

    def before(self, step: int) -> None:
        """At the start of `step`: start recording at the window's first step (or a resumed attempt's
        first step inside it)."""
        if self.window and self.first is None and self.window[0] <= step <= self.window[1]:
            torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python",
                                                     max_entries=MAX_ENTRIES)
            self.recording, self.first = True, step

    def after(self, step: int) -> None:
        """At the end of `step`: the window's last step writes the snapshot and stops recording."""
        if self.recording and step >= self.window[1]:
            self._write(f"rank-{self.rank}-steps-{self.first}-{step}.pickle", f"steps {self.first}-{step}")

    def out_of_memory(self, step: int) -> None:
        """A CUDA OOM in `step`: what was recorded up to it, before the error ends the rank."""
        if self.recording:
            self._write(f"rank-{self.rank}-oom-step-{step}.pickle", f"the out-of-memory error at step {step}")

    def close(self) -> None:
        """The run ended or stopped inside the window: write what was recorded."""
        if self.recording:
            self._write(f"rank-{self.rank}-steps-{self.first}-stopped.pickle", f"steps from {self.first}, stopped")

    def _write(self, name: str, what: str) -> None:
        self.recording = False
        with step_watch.section("the memory snapshot's write"):
            self.directory.mkdir(parents=True, exist_ok=True)
            torch.cuda.memory._dump_snapshot(str(self.directory / name))
            torch.cuda.memory._record_memory_history(enabled=None)
        if self.rank == 0:
            log.info("memory snapshot of %s written to %s (every rank's; open one at pytorch.org/memory_viz)",
                     what, self.directory / name)
