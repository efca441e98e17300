"""Rank 0's metric records in their two forms, each written by the container and read by the
launcher with this module (docs/metrics.md):

- the line the training script prints, and the SageMaker metric definitions that read it:
  `container` prints with `format_metric_line`, SageMaker's MetricDefinitions (and smlaunch's own
  log summaries) parse with `METRIC_REGEXES`;
- metrics.jsonl, a JSON object per line in the output data directory: read by `smlaunch metrics`,
  `status`'s goodput (launcher.wire.goodput) and a sweep's objective, all with `parse_records`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

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
