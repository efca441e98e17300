"""SageMaker hyperparameter tuning jobs: create, describe, list, stop, the trials and the best one.

A sibling of the SageMaker backend, using its account, buckets and code upload (`code_uri`,
`code_uploaded`): the code goes where the SDK puts it (`<bucket>/<tuning job>/source/sourcedir.tar.gz`)
and every trial reads it.
"""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone
from typing import Any

from launcher.backends import registry
from launcher.backends.base import BackendError
from launcher.backends.sagemaker import SageMakerBackend, newest_summaries
from launcher.backends.tuning_request import build_tuning_request
from launcher.config import ValidatedJob
from launcher.config.job_names import default_base_name
from launcher.config.tuning import TUNING_JOB_NAME_PATTERN, TuningConfig
from launcher.wire.training.issues import ConfigError, Issue

TUNING_TERMINAL = ("Completed", "Failed", "Stopped", "DeleteFailed")
MAX_TUNING_NAME = 32


def make_tuning_name(base: str, now: datetime | None = None) -> str:
    """'<base>-<yymmdd-HHMMSS>' in 32 characters (the SDK: name_from_base(..., short=True))."""
    now = now or datetime.now(timezone.utc)
    stamp = now.strftime("%y%m%d-%H%M%S")
    base = re.sub(r"[^a-zA-Z0-9-]+", "-", base).strip("-") or "smlaunch"
    return f"{base[: MAX_TUNING_NAME - len(stamp) - 1].rstrip('-')}-{stamp}"


def check_tuning_name(name: str) -> str:
    if not re.fullmatch(TUNING_JOB_NAME_PATTERN, name or ""):
        raise ConfigError([Issue("job_name", name, "is not a valid tuning job name",
                                 "use 1-32 letters, digits and hyphens, starting and ending with a letter or digit")])
    return name


class SageMakerTuning:
    def __init__(self, backend: SageMakerBackend):
        self.backend = backend

    @property
    def client(self):
        return self.backend.client("sagemaker")

    def dryrun(self, job: ValidatedJob, tuning: TuningConfig, name: str | None = None,
               tags: list[dict] | None = None) -> dict:
        """The request, sending nothing (the default bucket's account is shown as a placeholder)."""
        return self._plan(job, tuning, name, tags, lookup=False)[0]

    def _plan(self, job: ValidatedJob, tuning: TuningConfig, name: str | None, tags: list[dict] | None,
              lookup: bool) -> tuple[dict, str]:
        cfg = job.config
        if not cfg.role:
            raise ConfigError([Issue("role", None, "SageMaker needs an IAM role to run the trials",
                                     "set role: arn:aws:iam::<account>:role/<name>")])
        base = tuning.base_tuning_job_name or default_base_name(cfg.entry_point)
        name = check_tuning_name(name or make_tuning_name(base))
        source_uri = self.backend.code_uri(cfg, name, lookup)
        request = build_tuning_request(job, tuning, name=name, region=self.backend.region, source_uri=source_uri,
                                       output_path=self.backend.output_path(cfg, lookup), tags=tags)
        return request, source_uri

    def create(self, job: ValidatedJob, tuning: TuningConfig, name: str | None = None,
               tags: list[dict] | None = None) -> str:
        """Upload the code and create the tuning job; nothing is written if a check fails first."""
        request, source_uri = self._plan(job, tuning, name, tags, lookup=True)
        name = request["HyperParameterTuningJobName"]
        if self.exists(name):
            raise BackendError(f"job_name {name!r} is already used by a tuning job in {self.backend.region}; "
                               "pick another name or leave it out to get a timestamped one")
        output_path = request["TrainingJobDefinition"]["OutputDataConfig"]["S3OutputPath"]
        with self.backend.code_uploaded(job, source_uri, output_path):
            self.client.create_hyper_parameter_tuning_job(**request)
        return name

    def exists(self, name: str) -> bool:
        try:
            self.describe(name)
            return True
        except BackendError:
            return False

    def describe(self, name: str) -> dict:
        from botocore.exceptions import ClientError

        try:
            return self.client.describe_hyper_parameter_tuning_job(HyperParameterTuningJobName=name)
        except ClientError as exc:
            if exc.response["Error"]["Code"] in ("ValidationException", "ResourceNotFound"):
                raise BackendError(f"no tuning job named {name!r} in {self.backend.region}") from None
            raise

    def stop(self, name: str) -> None:
        self.describe(name)
        self.client.stop_hyper_parameter_tuning_job(HyperParameterTuningJobName=name)

    def list(self, status: str | None = None, name_contains: str | None = None, max_results: int = 50) -> list[dict]:
        return newest_summaries(self.client, "list_hyper_parameter_tuning_jobs", "HyperParameterTuningJobSummaries",
                                status, name_contains, max_results)

    def trials(self, name: str) -> list[dict]:
        """Every trial's TrainingJobSummary (ListTrainingJobsForHyperParameterTuningJob)."""
        pages = self.client.get_paginator("list_training_jobs_for_hyper_parameter_tuning_job").paginate(
            HyperParameterTuningJobName=name)
        return [s for page in pages for s in page["TrainingJobSummaries"]]

    def best_training_job(self, name: str) -> dict:
        best = self.describe(name).get("BestTrainingJob")
        if not best:
            raise BackendError(f"tuning job {name!r} has no best training job yet (no trial has reported "
                               "its objective metric); wait for a trial to complete")
        return best

    def wait(self, name: str, poll: float = 30.0) -> dict:
        while True:
            desc = self.describe(name)
            status = desc["HyperParameterTuningJobStatus"]
            if status in TUNING_TERMINAL:
                if status == "Failed":
                    raise BackendError(f"tuning job {name} failed: {desc.get('FailureReason', '')}")
                return desc
            time.sleep(poll)


# `smlaunch status/stop sagemaker-tuning:NAME`: a SageMaker tuning job as the CLI shows a sweep.
HANDLE_PREFIX = "sagemaker-tuning:"


class SageMakerSweep:
    """A SageMaker tuning job by name, with the face of launcher.tune's SweepHandle: describe() is
    DescribeHyperParameterTuningJob with its trials (`TrainingJobs`) and `Backend`, as a local sweep's."""

    def __init__(self, name: str, region: str | None = None, session: Any = None):
        self.name = name
        self.api = SageMakerTuning(registry.backend_named("sagemaker", region=region, session=session))

    def describe(self) -> dict:
        desc = self.api.describe(self.name)
        return {**desc, "Backend": "sagemaker", "TrainingJobs": self.api.trials(self.name)}

    def stop(self) -> None:
        self.api.stop(self.name)


def as_sweep_row(summary: dict) -> dict:
    """A HyperParameterTuningJobSummary (ListHyperParameterTuningJobs) in the shape `list --tuning`
    prints for every sweep (a describe's fields; a summary names no best trial)."""
    created = summary.get("CreationTime")
    return {"HyperParameterTuningJobName": summary["HyperParameterTuningJobName"],
            "HyperParameterTuningJobStatus": summary["HyperParameterTuningJobStatus"], "Backend": "sagemaker",
            "HyperParameterTuningJobConfig": {"Strategy": summary.get("Strategy"),
                                              "ResourceLimits": summary.get("ResourceLimits") or {}},
            "TrainingJobStatusCounters": summary.get("TrainingJobStatusCounters") or {},
            "CreationTime": created.isoformat() if hasattr(created, "isoformat") else created}


def trial_rows(summaries: list[dict]) -> list[dict]:
    """One row per trial, with the columns of the SDK's HyperparameterTuningJobAnalytics.dataframe()."""
    rows = []
    for summary in summaries:
        row: dict[str, Any] = {}
        for key, value in summary.get("TunedHyperParameters", {}).items():
            try:
                row[key] = float(value)  # as the SDK does: numbers as floats, the rest as given
            except (TypeError, ValueError):
                row[key] = value
        start, end = summary.get("TrainingStartTime"), summary.get("TrainingEndTime")
        row.update(TrainingJobName=summary["TrainingJobName"], TrainingJobStatus=summary["TrainingJobStatus"],
                   FinalObjectiveValue=summary.get("FinalHyperParameterTuningJobObjectiveMetric", {}).get("Value"),
                   TrainingStartTime=start, TrainingEndTime=end)
        if start and end:
            row["TrainingElapsedTimeSeconds"] = (end - start).total_seconds()
        if "TrainingJobDefinitionName" in summary:
            row["TrainingJobDefinitionName"] = summary["TrainingJobDefinitionName"]
        rows.append(row)
    return rows
