"""Rank 0's metric records in their three forms, each written by the container and read by the
launcher with this module (docs/metrics.md):

- the line the training script prints, and the SageMaker metric definitions that read it:
  `container` prints with `format_metric_line`, SageMaker's MetricDefinitions (and smlaunch's own
  log summaries) parse with `METRIC_REGEXES`;
- metrics.jsonl, a JSON object per line in the output data directory: read by `smlaunch metrics`,
  `status`'s goodput (launcher.wire.goodput) and a sweep's objective, all with `parse_records`;
- progress.json, a running job's progress (`Progress`: step of max_steps, loss, tokens/s, ETA), one
  record for every backend: rank 0 rewrites it next to metrics.jsonl at every logged step
  (container/progress.py), and its `[metrics]` line carries the same fields (max_steps, elapsed_s,
  eta_s as well as loss and tokens_per_s). So the launcher reads the progress of a local or Slurm
  job from the host's file, and that of a SageMaker job from the last metric line in CloudWatch;
  `submit` and `logs --follow` read it from the lines they print.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

PREFIX = "[metrics]"
METRICS_FILE = "metrics.jsonl"
_NUMBER = r"([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"

# name in SageMaker -> key in the metric line
METRICS = {
    "train:loss": "loss",
    "train:grad_norm": "grad_norm",
    "train:samples_per_sec": "samples_per_s",
    "train:tokens_per_sec": "tokens_per_s",
    "train:tokens_per_sec_per_gpu": "tokens_per_s_per_gpu",
    "train:tflops_per_gpu": "tflops_per_gpu",
    "train:mfu": "mfu",
    "validation:loss": "val_loss",  # the line of a validation step: `[metrics] step=40 val_loss=...`
}

# `\b` keeps `loss=` from matching inside `val_loss=` or `aux_loss=`.
METRIC_REGEXES = {name: rf"\[metrics\].*\b{key}={_NUMBER}" for name, key in METRICS.items()}

DEFAULT_METRIC_DEFINITIONS = [{"Name": name, "Regex": regex} for name, regex in METRIC_REGEXES.items()]


def format_metric_line(step: int, **values: float) -> str:
    """'[metrics] step=3 loss=2.5 ...': what the script prints once per logged step."""
    fields = " ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())
    return f"{PREFIX} step={step} {fields}"


def parse_metric_line(line: str) -> dict[str, int | float] | None:
    """The values of a metric line, wherever it sits in `line` (after a host prefix such as
    'algo-1 | ' or '[algo-1] '); None if `line` has none. Values that are not numbers are left out."""
    at = line.find(PREFIX)
    if at < 0:
        return None
    values: dict[str, int | float] = {}
    for pair in line[at + len(PREFIX):].split():
        key, sep, text = pair.partition("=")
        if not sep:
            continue
        try:
            values[key] = int(text)
        except ValueError:
            try:
                values[key] = float(text)
            except ValueError:
                continue
    return values if "step" in values else None


class DamagedMetrics(ValueError):
    """A line of metrics.jsonl before its last is not a JSON object."""


def parse_records(text: str, where: str) -> list[dict]:
    """The records of metrics.jsonl's `text` (read from `where`), oldest first.

    Rank 0 appends whole lines, and an attempt drops a last line a crash cut before it appends
    (drop_cut_line), so only the last line can be unfinished: while it lacks its newline it is
    being written, and it is left out unless it parses already. Any other line that is not a JSON
    object was damaged after it was written: DamagedMetrics, naming the file and the line, rather
    than a table, an objective or a goodput that quietly lacks a record."""
    *whole, last = text.split("\n")  # `last` is "" once the last line has its newline
    records = []
    for number, line in enumerate(whole, 1):
        if not line.strip():
            continue
        record = _object(line)
        if record is None:
            raise DamagedMetrics(f"{where}: line {number} is not a JSON object ({line[:80]!r}); the file is damaged: "
                                 "restore it, or delete that line to read the others")
        records.append(record)
    if (record := _object(last)) is not None:
        records.append(record)
    return records


def read_records(output_data: Path) -> list[dict]:
    """parse_records of metrics.jsonl in an output data directory; none where it cannot be read."""
    path = Path(output_data) / METRICS_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return []
    return parse_records(text, str(path))


def drop_cut_line(path: Path) -> int:
    """Remove the last line of `path` if it lacks its newline: a record cut by the end of an
    earlier attempt (a host lost in the middle of a write, a full disk), which the next append
    would make a damaged line in the middle. Returns how many bytes it removed."""
    try:
        f = open(path, "rb+")
    except FileNotFoundError:
        return 0
    with f:
        size = f.seek(0, os.SEEK_END)
        keep = size
        while keep > 0:  # back to the last newline, a block at a time: a record is far smaller than the file
            start = max(keep - 4096, 0)
            f.seek(start)
            block = f.read(keep - start)
            if b"\n" in block:
                keep = start + block.rindex(b"\n") + 1
                break
            keep = start
        if keep < size:
            f.truncate(keep)
        return size - keep


def _object(line: str) -> dict | None:
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


# --- progress.json: a running job's progress, one record for every backend ------------------------
PROGRESS_FILE = "progress.json"


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
    partial = directory / f".{PROGRESS_FILE}.partial"
    partial.write_text(json.dumps(progress.to_dict()) + "\n", encoding="utf-8")
    os.replace(partial, directory / PROGRESS_FILE)


def read_progress(directory: Path) -> Progress | None:
    """The progress in `directory`, None if there is none (or none that can be read)."""
    try:
        values = json.loads((directory / PROGRESS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return Progress.of(values) if isinstance(values, dict) else None


# --- the time ledger's fields in a metrics record (container/resilience/ledger.py; goodput.py reads them)
ATTEMPT = "attempt"
START_STEP = "start_step"
LOOP_START = "loop_start"  # ISO 8601, UTC: when this attempt's training loop began
STEPS, DATA, CHECKPOINT, VALIDATION = "steps", "data", "checkpoint", "validation"
TIME_FIELDS = {STEPS: "time_steps_s", DATA: "time_data_s", CHECKPOINT: "time_checkpoint_s",
               VALIDATION: "time_validation_s"}


def ledger_fields(attempt: int, start_step: int, loop_start: datetime, seconds: Mapping[str, float]) -> dict:
    """What rank 0 adds to a metrics record (cumulative seconds of this attempt's loop)."""
    return {ATTEMPT: attempt, START_STEP: start_step, LOOP_START: loop_start.isoformat(timespec="milliseconds"),
            **{TIME_FIELDS[k]: round(seconds[k], 3) for k in TIME_FIELDS}}
