"""One tracker run per training run, across restarts: a job that resumes from its checkpoints (a
spot restart, a retry, a new job on the same checkpoint_s3_uri, at any world size) goes on with the
W&B and MLflow runs it started, rather than opening a second run of the same name.

The runs' ids are kept in the checkpoint directory, as W&B's own guide to resuming advises: it
is what a restart gets back (SageMaker downloads checkpoint_s3_uri to every host before the
container starts), and it ties the tracker's run to the checkpoints its curve continues. A job
without checkpoints cannot resume, so its runs are always new. An id is reused only for the same
W&B project and entity, or the same MLflow server and experiment (recorded as a digest: a
tracking URI may hold a credential, and the checkpoint directory goes to S3).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path

log = logging.getLogger("smlaunch")
FILE = "trackers.json"


class RunIds:
    """The run ids recorded in a checkpoint directory (rank 0 only; None: the job has no checkpoints)."""

    def __init__(self, directory: Path | None):
        self.path = None if directory is None else directory / FILE
        self.recorded = self._read()

    def get(self, tracker: str, where: dict) -> str | None:
        """The run id this tracker recorded for the same `where`, or None."""
        entry = self.recorded.get(tracker)
        return entry.get("id") if isinstance(entry, dict) and entry.get("where") == _digest(where) else None

    def put(self, tracker: str, where: dict, run_id: str) -> None:
        """Record the run's id (written at once: a job may be stopped before its first checkpoint)."""
        if self.path is None:
            return
        self.recorded[tracker] = {"id": run_id, "where": _digest(where)}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=f".{FILE}.", dir=self.path.parent)
        with os.fdopen(handle, "w") as f:
            json.dump(self.recorded, f, indent=1, sort_keys=True)
        os.replace(temporary, self.path)

    def _read(self) -> dict:
        if self.path is None or not self.path.is_file():
            return {}
        try:
            value = json.loads(self.path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            value = exc
        if not isinstance(value, dict):
            log.warning("metrics: %s cannot be read (%s), so the trackers start new runs rather than continue the "
                        "ones this job started; it is rewritten with the new runs' ids", self.path, value)
            return {}
        return value


def _digest(where: dict) -> str:
    return hashlib.sha256(json.dumps(where, sort_keys=True).encode()).hexdigest()


class SentSteps:
    """Which records a continued run already has: those of steps up to the last one it logged,
    which the resumed job trains again from its checkpoint (with the same values: a resume is
    exact) and which W&B would refuse and MLflow store twice. Said once, when the first is skipped."""

    def __init__(self, tracker: str, last_step: int | None):
        self.tracker, self.last_step, self.said = tracker, last_step, False

    def already_sent(self, record: dict) -> bool:
        if self.last_step is None or record["step"] > self.last_step:
            return False
        if not self.said:
            log.info("metrics: %s's run already has steps up to %d from before the restart; this job's records of "
                     "those steps are not sent again", self.tracker, self.last_step)
            self.said = True
        return True
