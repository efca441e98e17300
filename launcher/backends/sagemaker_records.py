"""A SageMaker job's restarts and goodput, from what the job writes (docs/faults.md, "On SageMaker").

- Once the job has ended: its output.tar.gz, SageMaker's merge of the hosts' output data, holds
  rank 0's host's records (restarts.jsonl, attempts.jsonl, metrics.jsonl). They are read from S3
  as a stream, the other members skipped, so a large archive (diagnostics, a script's own files)
  is neither downloaded nor kept.
- While it runs: the restart record each bootstrap logs (launcher.wire.faults.restart_line),
  found in its CloudWatch streams by a filter pattern, not by reading the whole log. Its goodput
  is measured only once it has ended: the time ledger is in metrics.jsonl.
"""

from __future__ import annotations

import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from launcher.backends.cwlogs import LOG_GROUP
from launcher.local.restarts import merged_restarts
from launcher.wire import faults, s3io
from launcher.wire.metric_lines import METRICS_FILE

RECORD_FILES = (faults.RESTARTS_FILE, faults.ATTEMPTS_FILE, METRICS_FILE)


def archive_records(s3: Any, uri: str) -> dict[str, bytes] | None:
    """The record files of the archive at `uri`, by name; None where it cannot be read: absent (a job
    that failed before SageMaker uploaded one), or not for these credentials (its log then serves)."""
    bucket, key = s3io.split(uri)
    try:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"]
    except s3.exceptions.ClientError:  # NoSuchKey, NoSuchBucket, AccessDenied
        return None
    found = {}
    with tarfile.open(fileobj=body, mode="r|gz") as tar:
        for member in tar:
            name = member.name.removeprefix("./")
            if member.isfile() and name in RECORD_FILES:
                found[name] = tar.extractfile(member).read()
    return found


@contextmanager
def records_dir(records: dict[str, bytes]) -> Iterator[Path]:
    """The records as an output data directory, for the readers local jobs use, gone afterwards."""
    with tempfile.TemporaryDirectory(prefix="smlaunch-records-") as tmp:
        for name, data in records.items():
            (Path(tmp) / name).write_bytes(data)
        yield Path(tmp)


def logged_restarts(logs: Any, name: str) -> list[faults.Restart]:
    """The restart records the job's bootstraps logged, one per failed attempt (merged as a job's
    hosts' records are: launcher.local.restarts.merged_restarts)."""
    found = []
    request = {"logGroupName": LOG_GROUP, "logStreamNamePrefix": f"{name}/",
               "filterPattern": f'"{faults.RESTART_LINE}"'}
    try:
        for page in logs.get_paginator("filter_log_events").paginate(**request):
            found += [r for e in page["events"] if (r := faults.from_restart_line(e["message"])) is not None]
    except logs.exceptions.ResourceNotFoundException:  # no log yet
        return []
    return merged_restarts(found, [])  # attempts.jsonl is not logged: no restart cost until the job ends
