"""What every backend shares: the interface, job names and the errors a running job can end with."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Protocol

from launcher.issues import ConfigError, Issue

if TYPE_CHECKING:
    from launcher.checkpoints import Checkpoint
    from launcher.progress import Progress

TERMINAL_STATUSES = ("Completed", "Failed", "Stopped")
MAX_JOB_NAME = 63
# CreateTrainingJob's TrainingJobName; it is also a directory name locally and an S3 key part.
JOB_NAME_PATTERN = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}")
JOB_NAME_FIX = "use 1-63 letters, digits and hyphens, starting and ending with a letter or digit, e.g. my-job-1"


class DryRunResult(Protocol):
    def to_dict(self, masked: bool = True) -> dict: ...

    def render(self) -> str:
        """What `smlaunch submit --dry-run` prints."""


class Backend(Protocol):
    """What the estimator and the CLI call, whichever engine runs the job (torchx's scheduler
    interface, with SageMaker's words: a job is described by a DescribeTrainingJob-shaped dict)."""

    name: str  # "sagemaker", "local" or "slurm": the prefix of the job's handle

    def dryrun(self, job, job_name: str | None = None) -> DryRunResult:
        """What submit would send or start; nothing is sent, uploaded or written."""

    def submit(self, job, job_name: str | None = None, *, detach: bool = False) -> str:
        """Start the job and return its name. `detach=False` promises that `wait` follows (local
        mode then runs the job in this process); jobs of remote engines run detached anyway."""

    def describe(self, name: str) -> dict: ...

    def wait(self, name: str, logs: bool = True, poll: float = 5.0) -> dict:
        """Follow to the end; JobFailedError unless it completed."""

    def logs(self, name: str, follow: bool = False, poll: float = 5.0) -> None: ...

    def stop(self, name: str) -> None:
        """Ask the job to stop: SIGTERM first, so the ranks can save a checkpoint."""

    def list(self, status: str | None = None, name_contains: str | None = None,
             max_results: int = 50) -> list[dict]: ...

    def exists(self, name: str) -> bool: ...

    def artifacts(self, name: str) -> dict[str, str]:
        """{"model.tar.gz": where, "output.tar.gz": where} for what the job has stored."""

    def progress(self, name: str) -> Progress | None:
        """The job's last progress record (launcher.progress); None before its first logged step,
        or for a script that writes none."""

    def checkpoint(self, name: str) -> Checkpoint | None:
        """The job's newest complete checkpoint (launcher.checkpoints); None if it has none."""


@dataclass
class JobDryRun:
    """A dry run as data (`request`) and, where the engine has one, as the text it reads (`text`)."""

    backend: str
    request: dict[str, Any]
    text: str | None = None

    def to_dict(self, masked: bool = True) -> dict:
        from launcher.masking import mask_secrets

        return mask_secrets(self.request) if masked else self.request

    def render(self) -> str:
        from launcher.masking import Masker

        if self.text is not None:  # the request's secrets, wherever the text quotes them
            return Masker.of(self.request)(self.text)
        return json.dumps(self.to_dict(), indent=2, default=str)


class BackendError(RuntimeError):
    """A backend could not do what was asked (missing bucket, name taken, AWS error, ...)."""


class SourceDirError(ValueError):
    """The source bundle cannot be built; the message names the path or field and the fix."""


class JobFailedError(RuntimeError):
    """A job ended Failed or Stopped. Carries what the user needs to find out why."""

    def __init__(self, job_name: str, status: str, reason: str = "", where: str = ""):
        self.job_name, self.status, self.reason, self.where = job_name, status, reason, where
        text = f"job {job_name} {status.lower()}"
        if reason:
            text += f": {reason}"
        if where:
            text += f"\n  logs: {where}"
        super().__init__(text)


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
