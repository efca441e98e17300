"""A running job's progress, one record for every backend: step of max_steps, loss, tokens/s, ETA.

Rank 0 of smlaunch's runtime rewrites `progress.json` (next to metrics.jsonl, in the output data
directory) at every logged step (container/progress.py), and its `[metrics]` line carries the same
fields (max_steps, elapsed_s, eta_s as well as loss and tokens_per_s). So the launcher reads the
progress of a local or Slurm job from the host's file, and that of a SageMaker job from the last
metric line in CloudWatch; `submit` and `logs --follow` read it from the lines they print.

No torch here: the container writes with this module and the launcher reads with it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from launcher.wire.metric_lines import parse_metric_line

FILE = "progress.json"


@dataclass(frozen=True)
class Progress:
    step: int
    max_steps: int
    loss: float | None = None
    tokens_per_s: float | None = None
    elapsed_s: float | None = None  # since this run's training loop began (a resumed run starts again)
    eta_s: float | None = None
    updated: str | None = None  # when rank 0 wrote it (ISO 8601, UTC); None when read from a log line
    nonfinite_steps: int | None = None  # steps skipped or rolled back so far (nonfinite_policy skip, rollback)

    @classmethod
    def of(cls, values: Mapping) -> Progress | None:
        """From a metrics record, a parsed `[metrics]` line or progress.json; None without a step
        and max_steps (a validation record, or a script that is not smlaunch's runtime)."""
        step, max_steps = values.get("step"), values.get("max_steps")
        if not _number(step) or not _number(max_steps) or max_steps < 1:
            return None
        optional = {k: float(values[k]) for k in ("loss", "tokens_per_s", "elapsed_s", "eta_s")
                    if _number(values.get(k))}
        updated, nonfinite = values.get("updated"), values.get("nonfinite_steps")
        return cls(int(step), int(max_steps), updated=updated if isinstance(updated, str) else None,
                   nonfinite_steps=int(nonfinite) if _number(nonfinite) else None, **optional)

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @property
    def percent(self) -> float:
        return 100.0 * min(self.step, self.max_steps) / self.max_steps

    def text(self, eta: bool = True) -> str:
        """'step 40/200 (20%), loss 2.71, 12,300 tokens/s, 1 non-finite step, ETA 0:03:12' (`eta=False`: a job
        that has ended; the non-finite steps only where there were some)."""
        parts = [f"step {self.step}/{self.max_steps} ({self.percent:.0f}%)"]
        if self.loss is not None:
            parts.append(f"loss {self.loss:.4g}")
        if self.tokens_per_s is not None:
            parts.append(f"{self.tokens_per_s:,.0f} tokens/s")
        if self.nonfinite_steps:
            parts.append(f"{self.nonfinite_steps} non-finite step{'s' if self.nonfinite_steps > 1 else ''}")
        if eta and self.eta_s is not None and self.step < self.max_steps:
            parts.append(f"ETA {clock(self.eta_s)}")
        return ", ".join(parts)


def from_line(line: str) -> Progress | None:
    """The progress a `[metrics]` line carries (a log line, host prefix and all); None for any
    other line, and for a validation step's line."""
    values = parse_metric_line(line)
    return Progress.of(values) if values else None


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def eta_seconds(step: int, max_steps: int, start_step: int, elapsed_s: float) -> float:
    """Seconds left at this run's pace so far: wall time per step (checkpoints and validation
    included) times the steps left."""
    done = step - start_step
    return round(elapsed_s / done * max(max_steps - step, 0), 1) if done > 0 else 0.0


def clock(seconds: float) -> str:
    """H:MM:SS."""
    total = max(round(seconds), 0)
    hours, rest = divmod(total, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"


def as_datetime(value: Any) -> datetime | None:
    """A record's time (boto3 gives datetimes, job.json ISO text) as an aware datetime."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    if isinstance(value, str) and value:
        return as_datetime(datetime.fromisoformat(value))
    return None


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_progress(directory: Path, progress: Progress) -> None:
    """Atomically (a temporary file, then a rename): `status` may read while rank 0 writes."""
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / f".{FILE}.partial"
    partial.write_text(json.dumps(progress.to_dict()) + "\n", encoding="utf-8")
    os.replace(partial, directory / FILE)


def read_progress(directory: Path) -> Progress | None:
    """The progress in `directory`, None if there is none (or none that can be read)."""
    try:
        values = json.loads((directory / FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return Progress.of(values) if isinstance(values, dict) else None
