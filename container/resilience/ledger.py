"""Where an attempt's training loop spends its time, for goodput (launcher.wire.goodput).

The trainer times each step's batches (`timing(DATA)`), its checkpoint saves and validation, and
says each step's time (`step`): what a step took beyond its batches is the step's own work. Rank 0
puts the cumulative seconds into every metrics record (`fields`), with the attempt, the step it
started from and when its loop began, so the launcher can split the job's wall time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone

from launcher.wire.faults import attempt
from launcher.wire.metric_lines import CHECKPOINT, DATA, STEPS, TIME_FIELDS, VALIDATION, ledger_fields

__all__ = ["CHECKPOINT", "DATA", "VALIDATION", "TimeLedger"]


class TimeLedger:
    def __init__(self, start_step: int):
        self.start_step = start_step
        self.loop_start = datetime.now(timezone.utc)
        self.seconds = dict.fromkeys(TIME_FIELDS, 0.0)
        self._step_data = 0.0  # the batches' time within the step under way

    @contextmanager
    def timing(self, category: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            spent = time.perf_counter() - start
            self.seconds[category] += spent
            if category == DATA:
                self._step_data += spent

    def step(self, elapsed: float) -> None:
        """A step took `elapsed` seconds, its batches included."""
        self.seconds[STEPS] += max(elapsed - self._step_data, 0.0)
        self._step_data = 0.0

    def fields(self) -> dict:
        return ledger_fields(attempt(), self.start_step, self.loop_start, self.seconds)
