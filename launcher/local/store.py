"""Local jobs on disk: where they live and their status record (`job.json`).

The record has DescribeTrainingJob's shape (TrainingJobName, TrainingJobStatus, SecondaryStatus,
SecondaryStatusTransitions, FailureReason, the times, ModelArtifacts, ...), so `smlaunch status`
and the estimator read a local job as they read a SageMaker one. Writes are atomic (write a
temporary file, then rename), since `status` may read while the supervisor writes, and the file
is 0600: it holds the job's hyperparameters and environment in clear, as DescribeTrainingJob
returns them (`status --json` masks them, launcher.wire.masking).
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from launcher.config.job_names import check_job_name
from launcher.wire.opt_ml import write_private

HOME_ENV = "SMLAUNCH_HOME"  # default ~/.smlaunch; jobs live in <home>/jobs/<job name>/
RECORD = "job.json"


def jobs_root() -> Path:
    return Path(os.environ.get(HOME_ENV) or Path.home() / ".smlaunch").expanduser() / "jobs"


def envs_root(root: Path | None = None) -> Path:
    """Where local jobs' Python environments for their requirements.txt are kept and reused
    (launcher.local.jobenv): `<home>/envs/`, beside the jobs root."""
    return (root or jobs_root()).parent / "envs"


def job_dir(name: str, root: Path | None = None) -> Path:
    """The job's directory; a name that is not a valid job name (`../x`, `a/b`) never becomes a path."""
    return (root or jobs_root()) / check_job_name(name)


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def exists(name: str, root: Path | None = None) -> bool:
    return (job_dir(name, root) / RECORD).is_file()


def read(name: str, root: Path | None = None) -> dict[str, Any]:
    path = job_dir(name, root) / RECORD
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LookupError(f"no local job named {name!r} (looked in {path.parent.parent})") from None


def write(directory: Path, record: dict[str, Any]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    write_private(directory / RECORD, json.dumps(record, indent=2, default=str) + "\n")


def update(directory: Path, **fields: Any) -> dict[str, Any]:
    """Merge `fields` into the record; `SecondaryStatus` changes are appended to the transitions."""
    record = json.loads((directory / RECORD).read_text(encoding="utf-8"))
    secondary = fields.get("SecondaryStatus")
    if secondary and secondary != record.get("SecondaryStatus"):
        stamp = now()
        transitions = record.setdefault("SecondaryStatusTransitions", [])
        if transitions and "EndTime" not in transitions[-1]:
            transitions[-1]["EndTime"] = stamp
        transitions.append({"Status": secondary, "StartTime": stamp,
                            "StatusMessage": fields.pop("StatusMessage", "")})
    fields.pop("StatusMessage", None)
    record.update(fields)
    record["LastModifiedTime"] = now()
    write(directory, record)
    return record


def backend_of(record: dict[str, Any]) -> str:
    """Which backend runs the job of this record ("local" or "slurm"; records before Slurm are local)."""
    return record.get("Backend", "local")


def list_jobs(root: Path | None = None, status: str | None = None, name_contains: str | None = None,
              max_results: int | None = 50) -> list[dict[str, Any]]:
    """Newest first, as ListTrainingJobs sorts by CreationTime descending."""
    base = root or jobs_root()
    records = []
    for path in base.glob(f"*/{RECORD}") if base.is_dir() else ():
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # a job directory being created, or damaged: not a job to list
        if status and record.get("TrainingJobStatus") != status:
            continue
        if name_contains and name_contains not in record.get("TrainingJobName", ""):
            continue
        records.append(record)
    records.sort(key=lambda r: r.get("CreationTime", ""), reverse=True)
    return records[:max_results]
