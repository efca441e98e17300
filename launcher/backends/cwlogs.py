"""Tail the CloudWatch logs of a SageMaker training job across all of its hosts.

SageMaker writes one stream per host, ``<job>/algo-<i>-<epoch seconds>``, in the group
``/aws/sagemaker/TrainingJobs``. Streams appear as hosts start, so every poll lists them again
(paginated: a page holds at most 50 streams) and reads each from where the last poll stopped.
The caller passes a ``logs`` client, so this module never imports boto3.

A message is masked before it is returned (launcher.wire.masking): URL passwords always, and the
secrets of the job when the caller passes its masker (``Masker.of(describe_training_job(...))``:
its secret-named hyperparameters and environment), since on AWS's own images the toolkit prints
the script's command line, hyperparameters included.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from launcher.wire.masking import Masker

LOG_GROUP = "/aws/sagemaker/TrainingJobs"
T = TypeVar("T")

# 10 digits: epoch seconds until the year 2286, never a host index.
_EPOCH_SUFFIX = re.compile(r"(.+)-\d{10}")


@dataclass(frozen=True)
class LogEvent:
    timestamp: int
    """Milliseconds since the epoch, as CloudWatch stores it."""
    stream: str
    host: str
    """``algo-<i>``: the host that wrote the event."""
    message: str


def host_of(stream_name: str) -> str:
    """``"<job>/algo-3-1700000000"`` -> ``"algo-3"``."""
    leaf = stream_name.rsplit("/", 1)[-1]
    match = _EPOCH_SUFFIX.fullmatch(leaf)
    return match.group(1) if match else leaf


class LogTailer:
    """Returns, on each ``poll``, the events written since the previous poll."""

    def __init__(self, logs_client: Any, job_name: str, masker: Masker | None = None) -> None:
        self._client = logs_client
        self._mask = masker or Masker()
        self._prefix = f"{job_name}/"
        self._tokens: dict[str, str] = {}  # stream -> nextForwardToken where reading stopped
        self._seen: set[str] = set()

    @property
    def streams(self) -> list[str]:
        """Every stream of the job found so far, sorted: where to look when a job fails."""
        return sorted(self._seen)

    def poll(self) -> list[LogEvent]:
        """New events of every host, ordered by (timestamp, stream)."""
        streams = self._streams()
        self._seen.update(streams)
        events = [event for stream in streams for event in self._read(stream)]
        # sort is stable, so events sharing a timestamp keep their order within a stream.
        events.sort(key=lambda e: (e.timestamp, e.stream))
        return events

    def _streams(self) -> list[str]:
        return job_streams(self._client, self._prefix)

    def _read(self, stream: str) -> list[LogEvent]:
        request = {"logGroupName": LOG_GROUP, "logStreamName": stream, "startFromHead": True}
        if stream in self._tokens:
            request["nextToken"] = self._tokens[stream]
        host = host_of(stream)
        events: list[LogEvent] = []
        while True:
            try:
                page = self._client.get_log_events(**request)
            except self._client.exceptions.ResourceNotFoundException:
                break  # listed, then deleted: nothing to read
            events.extend(
                LogEvent(e["timestamp"], stream, host, self._mask(e["message"])) for e in page["events"]
            )
            token = page["nextForwardToken"]
            # CloudWatch marks the end of a stream by handing back the token it was given.
            if token == request.get("nextToken"):
                break
            request["nextToken"] = token
        if "nextToken" in request:
            self._tokens[stream] = request["nextToken"]
        return events


def job_streams(client: Any, prefix: str) -> list[str]:
    """The names of the streams that start with `prefix` (`<job>/`); [] before the log group exists."""
    request = {"logGroupName": LOG_GROUP, "logStreamNamePrefix": prefix}
    names: list[str] = []
    while True:
        try:
            page = client.describe_log_streams(**request)
        except client.exceptions.ResourceNotFoundException:
            return []  # the job has not created its log group yet
        names.extend(s["logStreamName"] for s in page.get("logStreams", []))
        token = page.get("nextToken")
        if not token or token == request.get("nextToken"):
            return names
        request["nextToken"] = token


def newest(client: Any, job_name: str, read: Callable[[str], T | None], max_events: int = 20_000) -> T | None:
    """What `read` makes of the newest message of the job's logs it accepts (returns something
    for), reading each stream backwards from its end, at most `max_events` events per stream:
    `smlaunch status` wants the last `[metrics]` line, not the whole log."""
    best: tuple[int, T] | None = None
    for stream in job_streams(client, f"{job_name}/"):
        found = _newest_in(client, stream, read, max_events)
        if found is not None and (best is None or found[0] > best[0]):
            best = found
    return best[1] if best else None


def _newest_in(client: Any, stream: str, read: Callable[[str], T | None], max_events: int) -> tuple[int, T] | None:
    request = {"logGroupName": LOG_GROUP, "logStreamName": stream, "startFromHead": False}
    seen = 0
    while seen < max_events:
        try:
            page = client.get_log_events(**request)
        except client.exceptions.ResourceNotFoundException:
            return None
        for event in reversed(page["events"]):  # a page is in time order; its newest event is last
            value = read(event["message"])
            if value is not None:
                return event["timestamp"], value
        seen += len(page["events"])
        token = page.get("nextBackwardToken")
        # as forwards: the start of the stream hands back the token it was given
        if not page["events"] or not token or token == request.get("nextToken"):
            return None
        request["nextToken"] = token
    return None
