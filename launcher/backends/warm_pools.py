"""A SageMaker job's warm pool: what DescribeTrainingJob says of it, the time it has left, changing or
ending it (UpdateTrainingJob's ResourceConfig.KeepAlivePeriodInSeconds; 0 ends it, as AWS documents),
and the Available pool a new request would reuse. The rule that decides reuse is
launcher.config.warm_pools; the facts are in docs/sagemaker-warm-pools.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from launcher.config.warm_pools import mismatches
from launcher.wire.metric_lines import as_datetime, clock
from launcher.wire.training.base import KEEP_ALIVE_MAX

STATUSES = ("Available", "InUse", "Reused", "Terminated")  # botocore: WarmPoolResourceStatus
# How many Available pools submit compares its request with (one DescribeTrainingJob each).
POOLS_COMPARED = 20


class WarmPoolError(ValueError):
    """A warm-pool command that cannot be done as asked (the CLI's exit 2): the message names the
    job or value and the fix."""


@dataclass(frozen=True)
class WarmPool:
    """DescribeTrainingJob's WarmPoolStatus with the fields that give it meaning."""

    job: str
    status: str
    keep_alive: int | None  # ResourceConfig.KeepAlivePeriodInSeconds, as last updated
    ended: datetime | None  # TrainingEndTime: the keep-alive period counts from it
    billable_seconds: int | None  # ResourceRetainedBillableTimeInSeconds: set once Reused or Terminated
    reused_by: str | None
    instance_count: int

    @classmethod
    def of(cls, desc: dict) -> WarmPool | None:
        pool = desc.get("WarmPoolStatus")
        if not pool:
            return None
        resources = desc.get("ResourceConfig") or {}
        return cls(job=desc.get("TrainingJobName", ""), status=pool["Status"],
                   keep_alive=resources.get("KeepAlivePeriodInSeconds"),
                   ended=as_datetime(desc.get("TrainingEndTime")),
                   billable_seconds=pool.get("ResourceRetainedBillableTimeInSeconds"),
                   reused_by=pool.get("ReusedByJob"), instance_count=resources.get("InstanceCount") or 1)

    def seconds_left(self, now: datetime | None = None) -> int | None:
        """An Available pool's keep-alive period less the time since the job ended, never below 0
        (AWS ends it on its own clock, so 0 means 'any moment now'); None for other statuses."""
        if self.status != "Available" or self.keep_alive is None or self.ended is None:
            return None
        now = now or datetime.now(timezone.utc)
        return max(0, self.keep_alive - int((now - self.ended).total_seconds()))

    def to_dict(self, now: datetime | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"Status": self.status, "KeepAlivePeriodInSeconds": self.keep_alive,
                               "SecondsLeft": self.seconds_left(now)}
        if self.billable_seconds is not None:
            out["ResourceRetainedBillableTimeInSeconds"] = self.billable_seconds
            out["BillableInstanceSeconds"] = self.billable_seconds * self.instance_count
        if self.reused_by:
            out["ReusedByJob"] = self.reused_by
        return out


def status_line(pool: dict) -> str:
    """`status`'s line for the WarmPool entry of a job's description (WarmPool.to_dict)."""
    parts = [f"warm pool: {pool['Status']}"]
    if pool.get("SecondsLeft") is not None:
        parts.append(f"{clock(pool['SecondsLeft'])} left of {pool['KeepAlivePeriodInSeconds']} s keep-alive")
    if pool.get("ReusedByJob"):
        parts.append(f"reused by {pool['ReusedByJob']}")
    if pool.get("ResourceRetainedBillableTimeInSeconds") is not None:
        parts.append(f"kept {pool['ResourceRetainedBillableTimeInSeconds']} s billable "
                     f"({pool['BillableInstanceSeconds']} instance-seconds)")
    return ", ".join(parts)


def check_keep_alive(seconds: int, option: str = "--keep-alive") -> int:
    if not isinstance(seconds, int) or isinstance(seconds, bool) or not 0 <= seconds <= KEEP_ALIVE_MAX:
        raise WarmPoolError(f"{option} = {seconds!r}: the keep-alive period is 0 to {KEEP_ALIVE_MAX} seconds; "
                            f"give a whole number in that range (0 ends the pool now)")
    return seconds


def updatable(desc: dict) -> WarmPool:
    """The job's pool, if UpdateTrainingJob may change it: AWS changes an Available pool only."""
    name = desc.get("TrainingJobName", "")
    pool = WarmPool.of(desc)
    if pool is None:
        raise WarmPoolError(f"job {name} has no warm pool: it was created without keep_alive_period_in_seconds, "
                            "or the account has no warm-pool quota for its instance type; set "
                            "keep_alive_period_in_seconds on the next job (and request the quota)")
    if pool.status == "Reused":
        raise WarmPoolError(f"the warm pool of {name} is Reused: it moved to job {pool.reused_by}; "
                            f"update that job's pool instead (smlaunch warm-pool ... {pool.reused_by})")
    if pool.status == "Terminated":
        raise WarmPoolError(f"the warm pool of {name} is Terminated (ended by a user, a patch update or its "
                            "keep-alive period): there is nothing to keep; a new job with "
                            "keep_alive_period_in_seconds starts a new pool")
    if pool.status == "InUse":
        raise WarmPoolError(f"the warm pool of {name} is InUse: the job is still running, and AWS changes a "
                            "pool's keep-alive only once it is Available; run the command again when the job "
                            f"has ended (smlaunch status {name})")
    return pool


def update_request(name: str, seconds: int) -> dict[str, Any]:
    """UpdateTrainingJob's request: only KeepAlivePeriodInSeconds of ResourceConfig may change."""
    return {"TrainingJobName": name, "ResourceConfig": {"KeepAlivePeriodInSeconds": check_keep_alive(seconds)}}


def reusable(client, request: dict) -> tuple[str | None, list[tuple[str, list]]]:
    """(the newest Available pool's job that `request` would reuse, or None; and for the pools it
    would not, each job with its differing fields), from ListTrainingJobs(WarmPoolStatusEquals=Available)."""
    listed = client.list_training_jobs(WarmPoolStatusEquals="Available", SortBy="CreationTime",
                                       SortOrder="Descending", MaxResults=POOLS_COMPARED)
    others = []
    for summary in listed.get("TrainingJobSummaries", []):
        desc = client.describe_training_job(TrainingJobName=summary["TrainingJobName"])
        if (desc.get("WarmPoolStatus") or {}).get("Status") != "Available":
            continue  # it changed since the listing
        differ = mismatches(desc, request)
        if not differ:
            return summary["TrainingJobName"], others
        others.append((summary["TrainingJobName"], differ))
    return None, others
