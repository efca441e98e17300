"""A sweep's trials as ordinary jobs: the base job with the tuned hyperparameters set, validated
as any job is (the trial's job file would be the same file with those values), its name, and its stop."""

from __future__ import annotations

import copy
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from launcher.backends.base import BackendError
from launcher.config import JobConfig, ValidatedJob, validate_job
from launcher.config.job_names import default_base_name
from launcher.config.tuning import TUNING_JOB_NAME_PATTERN
from launcher.local.spec import STOP_REASON
from launcher.wire.training.issues import ConfigError, Issue

MAX_SWEEP_NAME = 32  # SageMaker's HyperParameterTuningJobName; a trial adds -NNN (a job name takes 63)


def base_job_data(job: JobConfig) -> dict[str, Any]:
    """The job as a mapping validate_job reads, without its tuning section (a trial is no sweep).
    Hyperparameters are kept as written: the wire sends those (TrainingHyperparameters.raw)."""
    raw = job.model_dump(mode="json", exclude_unset=True)
    raw["hyperparameters"] = job.hyperparameters.raw()
    for key in ("tuning", "extends"):
        raw.pop(key, None)
    return raw


def trial_job(base: dict[str, Any], base_dir: str | Path, values: dict[str, Any]) -> ValidatedJob:
    """The base job with `values` set in its hyperparameters, validated (ConfigError if refused).
    The values keep their range's type (a float for a continuous range, an int for an integer one),
    so the typed hyperparameters check them as they would a job file's."""
    data = copy.deepcopy(base)
    data["hyperparameters"] = {**(data.get("hyperparameters") or {}), **values}
    return validate_job(data, base_dir=base_dir)


def stop_trial(backend, name: str, reason: str) -> str | None:
    """Stop a running trial through its backend's own stop (SIGTERM: it checkpoints), with the reason
    its record keeps; None, or why it was not stopped (it had ended, or its directory is gone)."""
    try:
        directory = backend.job_dir(name)
        if directory is not None:  # the supervisor records it with the job's end
            (directory / STOP_REASON).write_text(reason + "\n", encoding="utf-8")
        backend.stop(name)
    except (BackendError, OSError) as exc:
        return str(exc)
    return None


def trial_name(sweep: str, index: int) -> str:
    """`<sweep>-001`, `<sweep>-002`, ...: SageMaker's trial names also start with the tuning job's."""
    return f"{sweep}-{index + 1:03d}"


def sweep_name(prefix: str | None, job: JobConfig, now: datetime | None = None) -> str:
    """`<prefix>-<yymmdd-HHMMSS>` within 32 characters; the prefix is base_tuning_job_name, else the
    job's base_job_name, else the entry point's."""
    now = now or datetime.now(timezone.utc)
    stamp = now.strftime("%y%m%d-%H%M%S")
    base = prefix or job.base_job_name or default_base_name(job.entry_point)
    base = re.sub(r"[^a-zA-Z0-9-]+", "-", base).strip("-") or "sweep"
    return f"{base[: MAX_SWEEP_NAME - len(stamp) - 1].rstrip('-')}-{stamp}"


def check_sweep_name(name: str, field: str = "name") -> str:
    if isinstance(name, str) and re.fullmatch(TUNING_JOB_NAME_PATTERN, name):
        return name
    raise ConfigError([Issue(field, name, "is not a tuning job name (SageMaker's rule: 1-32 letters, digits "
                             "and hyphens, starting and ending with a letter or digit)", "e.g. lr-sweep-1")])
