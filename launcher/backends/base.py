"""What every backend shares: job names and the errors a running job can end with."""

from __future__ import annotations

import re
from datetime import datetime, timezone

TERMINAL_STATUSES = ("Completed", "Failed", "Stopped")
MAX_JOB_NAME = 63


class BackendError(RuntimeError):
    """A backend could not do what was asked (missing bucket, name taken, AWS error, ...)."""


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
