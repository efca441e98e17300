"""Training job names: SageMaker's rule (CreateTrainingJob's TrainingJobName), checked by job
files, the estimator and every backend, and the SDK v2's generated names."""

from __future__ import annotations

import re
from datetime import datetime, timezone

from launcher.wire.training.issues import ConfigError, Issue

MAX_JOB_NAME = 63
# CreateTrainingJob's TrainingJobName; it is also a directory name locally and an S3 key part.
JOB_NAME_PATTERN = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}")
JOB_NAME_FIX = "use 1-63 letters, digits and hyphens, starting and ending with a letter or digit, e.g. my-job-1"


def check_job_name(name: object, field: str = "job_name") -> str:
    """`name` if SageMaker accepts it as a training job name, else ConfigError saying why."""
    if isinstance(name, str) and len(name) <= MAX_JOB_NAME and JOB_NAME_PATTERN.fullmatch(name):
        return name
    raise ConfigError([Issue(field, name, _job_name_problem(name), JOB_NAME_FIX)])


def _job_name_problem(name: object) -> str:
    if not isinstance(name, str):
        return f"is not text ({type(name).__name__})"
    if not name:
        return "is empty"
    if len(name) > MAX_JOB_NAME:
        return f"is {len(name)} characters long; SageMaker allows {MAX_JOB_NAME}"
    bad = sorted(set(re.sub(r"[a-zA-Z0-9-]", "", name)))
    if bad:
        return "contains " + ", ".join(repr(c) for c in bad)
    return "starts or ends with '-'"


def make_job_name(base: str, now: datetime | None = None) -> str:
    """'<base>-<yyyy-mm-dd-HH-MM-SS-mmm>', at most 63 characters of [a-zA-Z0-9-] (SDK v2 style)."""
    now = now or datetime.now(timezone.utc)
    stamp = now.strftime("%Y-%m-%d-%H-%M-%S-") + f"{now.microsecond // 1000:03d}"
    base = re.sub(r"[^a-zA-Z0-9-]+", "-", base).strip("-") or "smlaunch"
    base = base[: MAX_JOB_NAME - len(stamp) - 1].rstrip("-")
    return f"{base}-{stamp}"


def default_base_name(entry_point: str) -> str:
    stem = entry_point.rsplit("/", 1)[-1].rsplit(".", 1)[0]
    return f"smlaunch-{stem}"
