"""`profile_steps`: torch.profiler over a window of training steps (docs/speed.md, "Profiling steps").

torchtitan's `profiling` and Megatron's `--profile-step-start/end` do the same: the profiler runs
from the start of the window's first step to the end of its last (each step ends with its device
work done: the loop synchronises there), so the window holds whole steps and nothing else.
Every rank writes two files into `<output_data_dir>/profile/`:
- `rank-R.trace.json.gz`: the trace (CPU ops, and on a GPU its kernels and memcpys; each step a
  range named `smlaunch step N`), for Perfetto (ui.perfetto.dev) or chrome://tracing;
- `rank-R.txt`: its ops by self time (on a GPU, device time: where the step's time goes), the
  window's steps named in the first line.
A run that ends or stops (SIGTERM) inside the window writes what it recorded. A resumed attempt
whose first step is inside the window profiles the rest of it; one past it profiles nothing. The
write is timed as a section of its own by the step watchdog (container.resilience.step_watch), as
a checkpoint save is: a long trace's write is not a hung step.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from container.resilience import step_watch
from launcher.wire.training.speed import profile_window

log = logging.getLogger("smlaunch")
TABLE_ROWS = 40


class StepProfiler:
    """The profiler of one rank's window of steps; a no-op without `profile_steps`."""

    def __init__(self, profile_steps: str | None, output_dir: Path, rank: int, device: torch.device):
        self.window = profile_window(profile_steps) if profile_steps else None
        self.directory, self.rank, self.device = output_dir / "profile", rank, device
        self.profiler, self.steps, self.label = None, [], None

    def before(self, step: int) -> None:
        """At the start of `step`: start the profiler at the window's first step (or a resumed
        attempt's first step inside it)."""
        if self.window and self.profiler is None and not self.steps and self.window[0] <= step <= self.window[1]:
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
            self.profiler = profile(activities=activities, record_shapes=True, profile_memory=True)
            self.profiler.start()
        if self.profiler is not None:  # each step a named range in the trace
            self.label = record_function(f"smlaunch step {step}")
            self.label.__enter__()

    def after(self, step: int) -> None:
        """At the end of `step` (its device work done): write the profile after the window's last."""
        if self.profiler is not None:
            self.label.__exit__(None, None, None)
            self.steps.append(step)
            if step >= self.window[1]:
                self.close()

    def close(self) -> None:
        """Stop and write what was recorded (also when the run ends inside the window)."""
        if self.profiler is None:
            return
        profiler, self.profiler = self.profiler, None
        with step_watch.section("the profile's write"):
            profiler.stop()
            self._write(profiler)

    def _write(self, profiler: profile) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        trace = self.directory / f"rank-{self.rank}.trace.json.gz"
        profiler.export_chrome_trace(str(trace))
        by = "self_device_time_total" if self.device.type == "cuda" else "self_cpu_time_total"
        steps = f"{self.steps[0]}-{self.steps[-1]}" if self.steps else "none (stopped before a step ended)"
        table = profiler.key_averages().table(sort_by=by, row_limit=TABLE_ROWS)
        (self.directory / f"rank-{self.rank}.txt").write_text(
            f"rank {self.rank}, steps {steps}, ops by {by}\n{table}\n")
        if self.rank == 0:
            log.info("profile: steps %s written to %s (every rank's rank-R.trace.json.gz for Perfetto or "
                     "chrome://tracing, and rank-R.txt, its ops by time)", steps, self.directory)
