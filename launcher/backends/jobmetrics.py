"""A job's metric records, wherever its backend keeps them (docs/metrics.md).

Local and Slurm jobs: rank 0's `metrics.jsonl` in the job directory (`hosts/algo-1/output/data`, and
another host's after a shrink that lost algo-1),
readable while the job runs; a script that writes none (a user's own) gets its
`metric_definitions` applied to the job's log, as SageMaker applies them
(launcher.backends.log_metrics). SageMaker jobs: the same metrics.jsonl inside the job's
`output.tar.gz` once the job has ended; while it runs (or when the archive has none), the values
SageMaker's metric definitions read from the logs into CloudWatch (one averaged point per minute,
no step numbers). The records themselves are launcher.backends.metric_records.
"""

from __future__ import annotations

import io
import tarfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

from launcher.backends import registry
from launcher.backends.base import TERMINAL_STATUSES, BackendError, SettingError
from launcher.backends.log_metrics import POINT, LogMetrics
from launcher.backends.metric_records import JOBDIR_METRICS, JobMetrics, jobdir_metrics, jobdir_records
from launcher.wire import s3io
from launcher.wire.metric_lines import METRICS, METRICS_FILE, parse_records

# sagemaker.analytics.TrainingJobAnalytics: the namespace, dimension and period SageMaker uses.
CLOUDWATCH_NAMESPACE = "/aws/sagemaker/TrainingJobs"
CLOUDWATCH_PERIOD_S = 60


class NoMetricsError(BackendError):
    """The job exists but has written no metrics yet; the message names the job and where it looked."""


def job_metrics(handle: str, region: str | None = None) -> JobMetrics:
    """The metrics of the job a handle names (local:NAME, slurm:JOBID, sagemaker:NAME or a bare name)."""
    backend, name = registry.find(handle, region=region)
    return backend.metrics(name)


def from_job_dir(backend, name: str, logs: dict[str, LogMetrics] | None = None) -> JobMetrics:
    """Rank 0's metrics.jsonl in the job's directory here (a local or Slurm job's); for a script of the user's
    own, its metric_definitions over the job's log. `logs`: readers of jobs' logs by job name, which read on
    from where they stopped (a sweep's controller's)."""
    handle = f"{backend.name}:{name}"
    record = backend.describe(name)
    records, files = jobdir_records(record)
    if records:
        return JobMetrics(handle, " + ".join(map(str, files)), records)
    path = jobdir_metrics(record)[-1]  # the current attempt's rank 0's
    definitions = (record.get("AlgorithmSpecification") or {}).get("MetricDefinitions") or []
    log = Path(record["LocalJobDir"]) / "logs" / "job.log"
    ended = record["TrainingJobStatus"] in TERMINAL_STATUSES
    found = LogMetrics(definitions)
    if definitions:  # a script of the user's own: its metric_definitions over the log, as SageMaker does
        found = logs.setdefault(name, found) if logs is not None else found
        found.read(log, final=logs is None or ended)
        if found.records:
            return JobMetrics(handle, f"{log} (metric_definitions: {', '.join(d['Name'] for d in definitions)}"
                                      f"{found.note()})", list(found.records), x=POINT)
    looked = f"{path} does not exist" if not path.is_file() else f"{path} is empty"
    if definitions:
        looked += f", and its metric_definitions match no line of {log}{found.note()}"
    elif not path.is_file():
        looked += (" (rank 0 of smlaunch's train.py writes it at the first logged step; a script of your own "
                   "gets metrics from the log with metric_definitions)")
    raise NoMetricsError(f"job {handle} ({record['TrainingJobStatus']}) has no metrics{'' if ended else ' yet'}: "
                         f"{looked}")


def from_job_files(backend, name: str) -> JobMetrics:
    """Rank 0's metrics.jsonl in a job directory the backend reads back (a Kubernetes job's S3 records,
    or its claim where this machine mounts it: launcher.kubernetes.readback); for a script of the user's
    own, its metric_definitions over the pods' logs, as SageMaker applies them to the hosts' logs."""
    handle, record = f"{backend.name}:{name}", backend.describe(name)
    definitions = (record.get("AlgorithmSpecification") or {}).get("MetricDefinitions") or []
    try:
        files, source = backend.job_files(name)
    except SettingError:  # a claim not mounted here: only the logs are readable, if the job reads metrics there
        if not definitions:
            raise
        return _from_pod_logs(backend, name, handle, record, definitions, "")
    path = files / JOBDIR_METRICS
    shown = f"{source.rstrip('/')}/{JOBDIR_METRICS.as_posix()}"
    records = parse_records(path.read_text(encoding="utf-8"), shown) if path.is_file() else []
    if records:
        return JobMetrics(handle, shown, records)
    looked = f"{shown} {'is empty' if path.is_file() else 'does not exist'}"
    if definitions:
        return _from_pod_logs(backend, name, handle, record, definitions, looked + ", and ")
    ended = record["TrainingJobStatus"] in TERMINAL_STATUSES
    raise NoMetricsError(f"job {handle} ({record['TrainingJobStatus']}) has no metrics{'' if ended else ' yet'}: "
                         f"{looked} (rank 0 of smlaunch's train.py writes it at the first logged step; the pods "
                         "upload it every few seconds; a script of your own gets metrics from its pods' logs with "
                         "metric_definitions)")


def _from_pod_logs(backend, name: str, handle: str, record: dict, definitions: list[dict],
                   looked: str) -> JobMetrics:
    found = LogMetrics(definitions)
    found.feed(line for _, line in backend.log_lines(name))
    names = ", ".join(d["Name"] for d in definitions)
    if found.records:
        return JobMetrics(handle, f"{handle}'s pod logs (metric_definitions: {names}{found.note()})", found.records,
                          x=POINT)
    ended = record["TrainingJobStatus"] in TERMINAL_STATUSES
    raise NoMetricsError(f"job {handle} ({record['TrainingJobStatus']}) has no metrics{'' if ended else ' yet'}: "
                         f"{looked}its metric_definitions ({names}) match no line of its pods' logs{found.note()} "
                         "(a pod's log goes with the pod: a job deleted from the cluster has none)")


def from_sagemaker(backend, name: str) -> JobMetrics:
    """metrics.jsonl in the job's output.tar.gz once it has ended, else CloudWatch's averages of its log's values."""
    handle, desc = f"{backend.name}:{name}", backend.describe(name)
    looked = []
    if desc["TrainingJobStatus"] in TERMINAL_STATUSES:
        uri = backend.artifacts(name).get("output.tar.gz")
        records, why = _from_output_archive(backend, uri) if uri else ([], "the job stored no output.tar.gz")
        if records:
            return JobMetrics(handle, f"{uri} ({METRICS_FILE})", records)
        looked.append(f"{uri}: {why}" if uri else why)
    records = _from_cloudwatch(backend, name, desc)
    if records:
        note = f" ({looked[0]})" if looked else f" (job {desc['TrainingJobStatus']}: no output.tar.gz yet)"
        return JobMetrics(handle, f"CloudWatch {CLOUDWATCH_NAMESPACE}{note}", records, x="elapsed_s")
    looked.append(f"CloudWatch {CLOUDWATCH_NAMESPACE}: no datapoints for TrainingJobName={name}")
    raise NoMetricsError(f"job {handle} ({desc['TrainingJobStatus']}) has no metrics yet: " + "; ".join(looked))


def _from_output_archive(backend, uri: str) -> tuple[list[dict], str]:
    """(records of metrics.jsonl in the archive, or [] and why not)."""
    from botocore.exceptions import ClientError

    bucket, key = s3io.split(uri)
    try:
        body = backend.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as exc:
        if exc.response["Error"]["Code"] in ("NoSuchKey", "404", "NoSuchBucket"):
            return [], "does not exist"
        raise
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
        try:
            member = tar.extractfile(METRICS_FILE)
        except KeyError:
            return [], f"holds no {METRICS_FILE}"
        return parse_records(member.read().decode("utf-8"), f"{uri}:{METRICS_FILE}"), ""


def _from_cloudwatch(backend, name: str, desc: dict) -> list[dict]:
    """One record per minute: the averages of every smlaunch metric SageMaker published for the job."""
    start = desc.get("TrainingStartTime") or desc["CreationTime"]
    # CloudWatch drops the seconds of EndTime: a minute more keeps the last point (as the SDK does).
    end = (desc.get("TrainingEndTime") or datetime.now(timezone.utc)) + timedelta(minutes=1)
    names = list(METRICS)
    queries = [{"Id": f"m{i}", "ReturnData": True, "MetricStat": {
        "Metric": {"Namespace": CLOUDWATCH_NAMESPACE, "MetricName": metric,
                   "Dimensions": [{"Name": "TrainingJobName", "Value": name}]},
        "Period": CLOUDWATCH_PERIOD_S, "Stat": "Average"}} for i, metric in enumerate(names)]
    by_time: dict[datetime, dict] = {}
    paginator = backend.client("cloudwatch").get_paginator("get_metric_data")
    for page in paginator.paginate(MetricDataQueries=queries, StartTime=start, EndTime=end,
                                   ScanBy="TimestampAscending"):
        for result in page["MetricDataResults"]:
            key = METRICS[names[int(result["Id"][1:])]]
            for when, value in zip(result["Timestamps"], result["Values"]):
                by_time.setdefault(when, {})[key] = value
    return [{"elapsed_s": max(round((when - start).total_seconds()), 0), "time": when.isoformat(), **values}
            for when, values in sorted(by_time.items())]
