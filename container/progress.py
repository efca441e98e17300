"""Rank 0's progress record (launcher.wire.metric_lines): what `smlaunch status` shows of a running job.

At every logged step the metrics record gains `max_steps`, `elapsed_s` and `eta_s` (so the
`[metrics]` line a SageMaker job leaves in CloudWatch says how far it is), and `progress.json`
next to metrics.jsonl is rewritten, where the supervisor of a local or Slurm job reads it.
"""

from __future__ import annotations

import time
from pathlib import Path

from launcher.wire import metric_lines


class ProgressWriter:
    def __init__(self, is_main: bool, directory: Path, max_steps: int, start_step: int):
        self.enabled = is_main
        self.directory, self.max_steps, self.start_step = directory, max_steps, start_step
        self.started = time.monotonic()  # the loop's start: a resumed run's pace is its own

    def fields(self, step: int) -> dict:
        """What the metrics record of `step` carries for the launcher."""
        elapsed = round(time.monotonic() - self.started, 1)
        return {"max_steps": self.max_steps, "elapsed_s": elapsed,
                "eta_s": metric_lines.eta_seconds(step, self.max_steps, self.start_step, elapsed)}

    def write(self, record: dict) -> None:
        """progress.json from a metrics record that has `fields`."""
        if not self.enabled:
            return
        current = metric_lines.Progress.of({**record, "updated": metric_lines.now()})
        if current is not None:
            metric_lines.write_progress(self.directory, current)
