"""Local jobs on disk: where they live and their status record (`job.json`).

The record has DescribeTrainingJob's shape (TrainingJobName, TrainingJobStatus, SecondaryStatus,
SecondaryStatusTransitions, FailureReason, the times, ModelArtifacts, ...), so `smlaunch status`
and the estimator read a local job as they read a SageMaker one. Writes are atomic (write a
temporary file, then rename), since `status` may read while the supervisor writes, and the file
is 0600: it holds the job's hyperparameters and environment in clear, as DescribeTrainingJob
returns them (`status --json` masks them, launcher.wire.masking).
"""

from __future__ import annotations

import errno
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from launcher.backends.errors import BackendError
from launcher.config.job_names import check_job_name
from launcher.config.paths import smlaunch_home
from launcher.wire.opt_ml import write_private

RECORD = "job.json"
# Space kept for the record's last writes: a job whose logs fill the disk must still be able to say
# so. Created with the record; given up (deleted) by a write that finds the disk full.
RESERVE = ".record-reserve"
RESERVE_BYTES = 256 * 1024
# The fields every command reads, and their types: a record without them is damaged.
_REQUIRED = {"TrainingJobName": str, "TrainingJobStatus": str}
_TYPED = {"Backend": str, "CreationTime": str, "TrainingStartTime": str, "TrainingEndTime": str,
          "FailureReason": str, "SecondaryStatus": str, "SecondaryStatusTransitions": list,
          "SupervisorPid": int, "WatchdogPid": int, "SupervisorProcess": dict, "WatchdogProcess": dict,
          "HyperParameters": dict, "Environment": dict, "OutputArtifacts": dict, "CheckpointConfig": dict}


class DamagedRecord(LookupError):
    """A job.json that is not a job record (not JSON, not an object, a field of the wrong type)."""


def jobs_root() -> Path:
    """Where local and Slurm jobs live: <home>/jobs/<job name>/ (SMLAUNCH_HOME, default ~/.smlaunch)."""
    return smlaunch_home() / "jobs"


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
    """The job's record; LookupError if there is none, DamagedRecord if it is not a record."""
    path = job_dir(name, root) / RECORD
    try:
        return _load(path)
    except FileNotFoundError:
        raise LookupError(f"no local job named {name!r} (looked in {path.parent.parent})") from None


def _load(path: Path) -> dict[str, Any]:
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        record = json.loads(text)
    except ValueError as exc:
        raise DamagedRecord(f"{path} is damaged: not JSON ({exc}); restore it, or delete the job's "
                            "directory") from None
    problem = _damage(record)
    if problem:
        raise DamagedRecord(f"{path} is damaged: {problem}; restore it, or delete the job's directory")
    return record


def _damage(record: Any) -> str | None:
    """What makes `record` no job record, or None."""
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not an object"
    return fields_damage(record, _REQUIRED, _TYPED)


def fields_damage(record: dict, required: dict[str, type], typed: dict[str, type]) -> str | None:
    """The first of `required` that `record` lacks, or the first field of the wrong type, or None
    (a boolean is no number here, though Python makes it an int)."""
    for key in required:
        if key not in record:
            return f"no {key}"
    for key, kind in {**required, **typed}.items():
        value = record.get(key)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            return f"{key} is {json.dumps(value)[:60]}, not a {kind.__name__}"
    return None


def write(directory: Path, record: dict[str, Any]) -> None:
    """Create the job's directory (if need be) and its record."""
    directory.mkdir(parents=True, exist_ok=True)
    _replace(directory, record)


def reserve(directory: Path) -> None:
    """Set aside the space the record's last writes need (see RESERVE)."""
    with open(directory / RESERVE, "wb") as f:
        f.write(b"\0" * RESERVE_BYTES)  # written, not truncated to size: a sparse file reserves nothing


def _replace(directory: Path, record: dict[str, Any], outcome: bool = False) -> None:
    """Rewrite the record of an existing job directory (never re-created: a job deleted meanwhile
    stays deleted). For the job's `outcome`, a full disk gives up the reserve and tries once more."""
    text = json.dumps(record, indent=2, default=str) + "\n"
    try:
        write_private(directory / RECORD, text)
    except OSError as exc:
        if not outcome or exc.errno != errno.ENOSPC or not (directory / RESERVE).exists():
            raise
        (directory / RESERVE).unlink()
        write_private(directory / RECORD, text)


def merged(directory: Path, **fields: Any) -> dict[str, Any]:
    """The record with `fields` merged in (as `update` would write it), without writing it."""
    return _merge(_load(directory / RECORD), fields)


def update(directory: Path, *, outcome: bool = False, **fields: Any) -> dict[str, Any]:
    """Merge `fields` into the record; `SecondaryStatus` changes are appended to the transitions.
    `outcome`: the job's end is being recorded, which may use the reserve."""
    record = merged(directory, **fields)
    _replace(directory, record, outcome)
    return record


def _merge(record: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    fields = dict(fields)
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
    return record


def backend_of(record: dict[str, Any]) -> str:
    """Which backend runs the job of this record ("local" or "slurm"; records before Slurm are local)."""
    return record.get("Backend", "local")


def owns(backend: str, name: str, root: Path | None = None) -> bool:
    """Whether job `name` is in the store and `backend`'s."""
    return exists(name, root) and backend_of(read(name, root)) == backend


def owned_record(backend: str, name: str, root: Path | None = None) -> dict[str, Any]:
    """The record of job `name` if `backend` runs it; BackendError naming where it looked, or the
    backend that runs it. A damaged record raises DamagedRecord: bad input, not a missing job (the
    CLI says so with exit code 2)."""
    try:
        record = read(name, root)
    except DamagedRecord:
        raise
    except LookupError as exc:
        raise BackendError(str(exc)) from None
    if backend_of(record) != backend:
        raise BackendError(f"job {name} is a {backend_of(record)} job, not a {backend} one: "
                           f"use {backend_of(record)}:{name}")
    return record


def list_jobs(root: Path | None = None, status: str | None = None, name_contains: str | None = None,
              max_results: int | None = 50, damaged: list[str] | None = None) -> list[dict[str, Any]]:
    """Newest first, as ListTrainingJobs sorts by CreationTime descending. A record that vanishes
    while it is read (its job deleted) is left out; a damaged one too, its path added to `damaged`."""
    base = root or jobs_root()
    records = []
    for path in base.glob(f"*/{RECORD}") if base.is_dir() else ():
        try:
            record = _load(path)
        except FileNotFoundError:
            continue
        except (OSError, DamagedRecord):
            if damaged is not None:
                damaged.append(str(path))
            continue
        if status and record.get("TrainingJobStatus") != status:
            continue
        if name_contains and name_contains not in record.get("TrainingJobName", ""):
            continue
        records.append(record)
    records.sort(key=lambda r: r.get("CreationTime", ""), reverse=True)
    return records[:max_results]
