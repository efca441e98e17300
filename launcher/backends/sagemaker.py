"""Amazon SageMaker training jobs through boto3 (imported lazily: the CLI starts without it).

torchx-style: `dryrun` builds the exact CreateTrainingJob request and sends nothing; `submit`
checks the name, packs and uploads the code, then creates the job; `wait`/`logs` follow it.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.backends import jobmetrics, sagemaker_records
from launcher.backends.base import TERMINAL_STATUSES, BackendError, FilesElsewhere, JobFailedError, Options
from launcher.backends.cwlogs import LOG_GROUP, LogTailer, newest
from launcher.backends.live import active
from launcher.backends.request import build_request
from launcher.backends.sourcedir import SourceBundle, build_job_sourcedir
from launcher.backends.warm_pools import WarmPool, reusable, updatable, update_request
from launcher.config import ValidatedJob
from launcher.config.data_rules import indexed_s3_channels
from launcher.config.job_names import check_job_name, default_base_name, make_job_name
from launcher.config.megatron_rules import vocabulary_given
from launcher.local.restarts import job_restarts
from launcher.wire import restart_loop, s3io
from launcher.wire.checkpoints import latest_in_s3
from launcher.wire.faults import Restart
from launcher.wire.goodput import Goodput, measure
from launcher.wire.hyperparameters import decode
from launcher.wire.masking import Masker, mask_secrets
from launcher.wire.megatron_index import megatron_on_s3
from launcher.wire.metric_lines import from_line
from launcher.wire.terminal import printable
from launcher.wire.training.issues import ConfigError, Issue

if TYPE_CHECKING:
    from launcher.backends.metric_records import JobMetrics
    from launcher.wire.checkpoints import Checkpoint
    from launcher.wire.metric_lines import Progress

# What a dry run shows for the account of the default bucket: finding it takes credentials and STS.
DEFAULT_ACCOUNT_PLACEHOLDER = "<account-id>"


@dataclass
class DryRun:
    """What submit would do: the request, the code archive and where it would be uploaded."""

    request: dict
    source_uri: str
    bundle: SourceBundle | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self, masked: bool = True) -> dict:
        out = {"CreateTrainingJob": self.request, "SourceUpload": self.source_uri}
        if self.bundle is not None:
            out["SourceBundle"] = self.bundle.to_dict()
        return mask_secrets(out) if masked else out

    def render(self) -> str:
        return dumps(self.to_dict())


class SageMakerBackend:
    """One AWS account and region. `session` may be a boto3.Session or a sagemaker.Session."""

    name = "sagemaker"

    def __init__(self, session: Any = None, region: str | None = None, printer: Callable[[str], None] | None = None):
        import boto3  # lazy: keeps `smlaunch --help` and `validate` free of boto3

        boto_session = getattr(session, "boto_session", session)
        if boto_session is None:
            boto_session = boto3.Session(region_name=region) if region else boto3.Session()
        self.session = boto_session
        self.region = region or boto_session.region_name
        if not self.region:
            raise ConfigError([Issue("region", None, "no AWS region is configured",
                                     "set region: us-east-1 in the job (or --set region=...), "
                                     "or AWS_DEFAULT_REGION")])
        self._clients: dict[str, Any] = {}
        self._records: dict[str, dict[str, bytes] | None] = {}  # an ended job's, read from S3 once
        self.print = printer or print

    @classmethod
    def create(cls, options: Options) -> SageMakerBackend:
        return cls(options.session, region=options.region, printer=options.printer)

    def client(self, name: str):
        if name not in self._clients:
            self._clients[name] = self.session.client(name, region_name=self.region)
        return self._clients[name]

    # --- building the request ------------------------------------------------------------
    def dryrun(self, job: ValidatedJob, job_name: str | None = None, build: bool = True) -> DryRun:
        """The CreateTrainingJob request, sending nothing: where the job names no bucket, the default
        one is shown as `sagemaker-<region>-<account-id>` (DEFAULT_ACCOUNT_PLACEHOLDER), since its
        account would take an STS call with credentials; submit looks it up."""
        return self._plan(job, job_name, build, lookup=False)

    def _plan(self, job: ValidatedJob, job_name: str | None, build: bool, lookup: bool) -> DryRun:
        cfg = job.config
        issues = []
        if not cfg.on_sagemaker:
            issues.append(Issue("backend", cfg.backend_name, "is not SageMaker, and this is the SageMaker backend",
                                "submit it with the backend it names (smlaunch submit, or the estimator's fit), or "
                                "set backend: sagemaker with an ml.* instance type"))
        if not cfg.role:
            issues.append(Issue("role", None, "SageMaker needs an IAM role to run the job",
                                "set role: arn:aws:iam::<account>:role/<name>"))
        if issues:
            raise ConfigError(issues)
        name = check_job_name(job_name or make_job_name(cfg.base_job_name or default_base_name(cfg.entry_point)))
        source_uri = self.code_uri(cfg, name, lookup)
        bundle = None
        if build:
            with tempfile.TemporaryDirectory() as tmp:
                bundle = self._bundle(job, Path(tmp))
        request = build_request(job, job_name=name, region=self.region, source_uri=source_uri,
                                output_path=self.output_path(cfg, lookup))
        return DryRun(request=request, source_uri=source_uri, bundle=bundle)

    def _bundle(self, job: ValidatedJob, dest_dir: Path) -> SourceBundle:
        return build_job_sourcedir(job, dest_dir / "sourcedir.tar.gz")

    def code_uri(self, cfg, name: str, lookup: bool) -> str:
        """Where the code bundle of the job (or tuning job) `name` goes, as the SDK puts it:
        `s3://<bucket>/<prefix>/<name>/source/sourcedir.tar.gz`; every trial of a tuning job reads it."""
        bucket, prefix = self._code_location(cfg, lookup)
        return "s3://" + "/".join(p for p in (bucket, prefix, name, "source", "sourcedir.tar.gz") if p)

    def output_path(self, cfg, lookup: bool) -> str:
        return cfg.output_path or f"s3://{self._default_bucket(lookup)}/"

    def _code_location(self, cfg, lookup: bool) -> tuple[str, str]:
        if cfg.code_location:
            return s3io.split(cfg.code_location.rstrip("/"))
        if cfg.output_path and cfg.output_path.startswith("s3://"):
            return s3io.split(cfg.output_path)[0], ""
        return self._default_bucket(lookup), ""

    def _account(self) -> str:
        if not hasattr(self, "_account_id"):
            self._account_id = self.client("sts").get_caller_identity()["Account"]
        return self._account_id

    def _default_bucket(self, lookup: bool = True) -> str:
        """The SDK's default bucket; without `lookup` (a dry run), the account is a placeholder
        unless it is known already."""
        if not hasattr(self, "_default_bucket_name"):
            if not lookup:
                return f"sagemaker-{self.region}-{DEFAULT_ACCOUNT_PLACEHOLDER}"
            self._default_bucket_name = f"sagemaker-{self.region}-{self._account()}"
        return self._default_bucket_name

    # --- submitting ----------------------------------------------------------------------
    def submit(self, job: ValidatedJob, job_name: str | None = None, *, detach: bool = False) -> str:
        """Create the job; nothing is uploaded or created if any check fails first. It runs on
        SageMaker whether or not it is followed, so `detach` changes nothing."""
        plan = self._plan(job, job_name, build=False, lookup=True)
        name = plan.request["TrainingJobName"]
        if self.exists(name):
            raise BackendError(f"job_name {name!r} is already used by a training job in {self.region}; "
                               "pick another name or drop job_name to get a timestamped one")
        self._check_s3_corpora(job)
        self._note_warm_pool(plan.request)
        with self.code_uploaded(job, plan.source_uri, plan.request["OutputDataConfig"]["S3OutputPath"]):
            self.client("sagemaker").create_training_job(**plan.request)
        return name

    def _check_s3_corpora(self, job: ValidatedJob) -> None:
        """A Megatron-Core corpus in an indexed S3 channel needs the tokenizer it was made with named
        (its files record none), as validate checks of a local one (launcher.config.megatron_rules):
        found from the first bytes of its first .idx, before anything is uploaded or paid for. A
        channel these credentials cannot read is said and left to the job, which checks it too."""
        from botocore.exceptions import ClientError

        issues = []
        for name, uri in indexed_s3_channels(job.config):
            try:
                megatron = megatron_on_s3(self.client("s3"), uri)
            except ClientError as exc:
                self.print(f"inputs.{name} ({uri}) not read here ({exc.response['Error'].get('Code')}): the job "
                           "checks its format and tokenizer before training")
                continue
            if megatron:
                issues += vocabulary_given(f"inputs.{name}", job.config)
        if issues:
            raise ConfigError(issues)

    @contextmanager
    def code_uploaded(self, job: ValidatedJob, source_uri: str, output_path: str) -> Iterator[None]:
        """The job's code bundle built and uploaded to `source_uri` (`code_uri`), for the body to
        create what reads it: a training job, or a tuning job's trials. The code's bucket and the
        output's exist before anything is written (the default one is made); the code is taken back
        if the body fails or is interrupted, as nothing will read it."""
        bucket, key = s3io.split(source_uri)
        output_bucket = s3io.split(output_path)[0]
        default = getattr(self, "_default_bucket_name", None)
        for needed in dict.fromkeys((bucket, output_bucket)):
            self._ensure_bucket(needed, created_ok=needed == default)
        with tempfile.TemporaryDirectory() as tmp:
            bundle = self._bundle(job, Path(tmp))
            self.print(bundle.summary())
            self.client("s3").upload_file(str(bundle.path), bucket, key,
                                          ExtraArgs=self._upload_settings(job.config, bucket, output_bucket))
        try:
            yield
        except BaseException:
            self.client("s3").delete_object(Bucket=bucket, Key=key)
            raise

    def _upload_settings(self, cfg, code_bucket: str, output_bucket: str) -> dict[str, str]:
        """As the SDK's `tar_and_upload_dir`: the code is encrypted at rest with KMS, with
        output_kms_key when it goes to the output bucket, and the default bucket must be ours."""
        kms_key = cfg.output_kms_key if (cfg.code_location is None or code_bucket == output_bucket) else None
        extra = {"ServerSideEncryption": "aws:kms"}
        if kms_key:
            extra["SSEKMSKeyId"] = kms_key
        if code_bucket == getattr(self, "_default_bucket_name", None):
            extra["ExpectedBucketOwner"] = self._account()
        return extra

    def exists(self, name: str) -> bool:
        """Whether a training job of that name exists in this account and region."""
        from botocore.exceptions import ClientError

        try:
            self.client("sagemaker").describe_training_job(TrainingJobName=name)
            return True
        except ClientError as exc:
            if exc.response["Error"]["Code"] in ("ValidationException", "ResourceNotFound"):
                return False
            raise

    def _ensure_bucket(self, bucket: str, created_ok: bool) -> None:
        from botocore.exceptions import ClientError

        s3 = self.client("s3")
        try:
            s3.head_bucket(Bucket=bucket)
            return
        except ClientError as exc:
            if exc.response["Error"]["Code"] not in ("404", "NoSuchBucket", "NotFound"):
                raise BackendError(f"bucket {bucket!r} is not accessible: {exc}") from None
        if not created_ok:
            raise BackendError(f"bucket {bucket!r} (from code_location/output_path) does not exist; "
                               "create it or point output_path at an existing bucket")
        kwargs = {} if self.region == "us-east-1" else {
            "CreateBucketConfiguration": {"LocationConstraint": self.region}}
        s3.create_bucket(Bucket=bucket, **kwargs)

    # --- following a job ------------------------------------------------------------------
    def attach_fields(self, desc: dict) -> dict[str, Any]:
        return {}  # DescribeTrainingJob's fields say it all

    def how(self, record: dict) -> str:
        return self.name

    def describe(self, name: str) -> dict:
        from botocore.exceptions import ClientError

        try:
            desc = self.client("sagemaker").describe_training_job(TrainingJobName=name)
        except ClientError as exc:
            if exc.response["Error"]["Code"] == "ValidationException":
                raise BackendError(f"no training job named {name!r} in {self.region}") from None
            raise
        pool = WarmPool.of(desc)
        if pool is not None:  # WarmPoolStatus with its time left (launcher.backends.warm_pools)
            desc["WarmPool"] = pool.to_dict()
        return {**desc, **_restart_rules(desc)}

    def update_keep_alive(self, name: str, seconds: int) -> WarmPool:
        """Change the keep-alive period of a job's Available warm pool; 0 ends the pool. The value
        and the pool's status are checked before UpdateTrainingJob is sent."""
        request = update_request(name, seconds)
        pool = updatable(self.describe(name))
        self.client("sagemaker").update_training_job(**request)
        return pool

    def _note_warm_pool(self, request: dict) -> None:
        """Which Available warm pool the job will start on, if one matches (AWS's rule,
        launcher.config.warm_pools), and what keeps the others from matching."""
        from botocore.exceptions import ClientError

        try:
            reused, others = reusable(self.client("sagemaker"), request)
        except ClientError as exc:  # a role without ListTrainingJobs: the job is still submitted
            self.print(f"note: the Available warm pools could not be listed ({exc}); the job starts on one "
                       "only if it matches")
            return
        if reused:
            self.print(f"note: {request['TrainingJobName']} will start on the Available warm pool of {reused}")
            return
        for job, differ in others[:3]:
            fields = "; ".join(f"{name} {theirs!r} there, {ours!r} here" for name, theirs, ours in differ)
            self.print(f"note: the Available warm pool of {job} does not match: {fields}")

    def wait(self, name: str, logs: bool = True, poll: float = 5.0) -> dict:
        """Follow a job to its end; raise JobFailedError if it fails or is stopped."""
        # Stock images print the command line, hyperparameters included: mask the job's secrets.
        masker = Masker.of(self.describe(name))
        tailer = LogTailer(self.client("logs"), name, masker=masker) if logs else None
        shown = 0
        try:
            with _status_line(name) as status:
                while True:
                    desc = self.describe(name)
                    transitions = desc.get("SecondaryStatusTransitions", [])
                    for t in transitions[shown:]:
                        self.print(f"[{name}] {t.get('Status')}: {t.get('StatusMessage', '')}".rstrip(": "))
                    shown = len(transitions)
                    if status is not None:
                        status.update(f"{name}: {desc['TrainingJobStatus']} ({desc.get('SecondaryStatus', '')})")
                    if tailer:
                        self._print_events(tailer)
                    if desc["TrainingJobStatus"] in TERMINAL_STATUSES:
                        if tailer:
                            self._print_events(tailer)  # drain what arrived after the last poll
                        break
                    time.sleep(poll)
        except KeyboardInterrupt:
            self.print(f"\nStopped following; job {name} keeps running.\n"
                       f"  follow again: smlaunch logs {name} --follow   (or PyTorch.attach({name!r}))\n"
                       f"  stop it:      smlaunch stop {name}")
            raise
        status = desc["TrainingJobStatus"]
        if status != "Completed":
            streams = ", ".join(sorted(tailer.streams)) if tailer else ""
            where = f"log group {LOG_GROUP}, streams {streams or name + '/*'}"
            raise JobFailedError(name, status, masker(desc.get("FailureReason", "")), where)
        return desc

    def interrupted(self, name: str) -> None:
        return None  # the job runs on in the cluster

    def logs(self, name: str, follow: bool = False, poll: float = 5.0) -> None:
        if follow:
            self.wait(name, logs=True, poll=poll)
        else:
            self._print_events(LogTailer(self.client("logs"), name, masker=Masker.of(self.describe(name))))

    def _print_events(self, tailer: LogTailer) -> None:
        for event in tailer.poll():
            self.print(f"[{event.host}] {printable(event.message)}")

    def artifacts(self, name: str) -> dict[str, str]:
        """model.tar.gz as DescribeTrainingJob gives it; output.tar.gz next to it, where SageMaker puts it."""
        return _artifacts_of(self.describe(name), name)

    def progress(self, name: str) -> Progress | None:
        """From the job's last `[metrics]` line in CloudWatch (rank 0 prints them; they carry
        max_steps and the ETA)."""
        return newest(self.client("logs"), name, from_line)

    def checkpoint(self, name: str) -> Checkpoint | None:
        """The newest complete step-<N>/ under the job's checkpoint_s3_uri, where SageMaker syncs
        /opt/ml/checkpoints."""
        uri = (self.describe(name).get("CheckpointConfig") or {}).get("S3Uri")
        return latest_in_s3(self.client("s3"), uri) if uri else None

    def metrics(self, name: str, logs: dict | None = None) -> JobMetrics:
        """metrics.jsonl in the job's output.tar.gz once it has ended, else CloudWatch's (jobmetrics)."""
        return jobmetrics.from_sagemaker(self, name)

    def restarts(self, name: str) -> list[Restart]:
        """An ended job's from its output.tar.gz (restarts.jsonl), a running one's from the records
        its bootstraps log (launcher.backends.sagemaker_records)."""
        records = self._output_records(name, self.describe(name))
        if records is None:
            return sagemaker_records.logged_restarts(self.client("logs"), name)
        with sagemaker_records.records_dir(records) as directory:
            return job_restarts([directory])

    def goodput(self, name: str) -> Goodput | None:
        """Measured once the job has ended, from its output.tar.gz's time ledger (metrics.jsonl)."""
        desc = self.describe(name)
        records = self._output_records(name, desc)
        if not records or not desc.get("TrainingStartTime"):
            return None
        with sagemaker_records.records_dir(records) as directory:
            return measure([directory], desc["TrainingStartTime"], desc.get("TrainingEndTime"))

    def _output_records(self, name: str, desc: dict) -> dict[str, bytes] | None:
        """The record files of an ended job's output.tar.gz (`desc`: its description), read once;
        None while it runs or where it has no archive."""
        if name not in self._records:
            uri = _artifacts_of(desc, name).get("output.tar.gz")
            if uri is None:
                return None
            self._records[name] = sagemaker_records.archive_records(self.client("s3"), uri)
        return self._records[name]

    def job_dir(self, name: str) -> None:
        """None: SageMaker runs the job from its own storage."""
        return None

    def output_data_dirs(self, name: str) -> dict[str, Path]:
        """None here: every host's output data is in the job's output.tar.gz, which is not downloaded."""
        where = self.artifacts(name).get("output.tar.gz") or "the job's output.tar.gz (once the job has ended)"
        raise FilesElsewhere(f"job {name} runs on SageMaker: its hosts' output data (diagnostics/ among it) is in "
                             f"{where} (one directory per host's archive); download and extract it to read it")

    def stop(self, name: str) -> None:
        self.describe(name)
        self.client("sagemaker").stop_training_job(TrainingJobName=name)

    def list(self, status: str | None = None, name_contains: str | None = None, max_results: int = 50) -> list[dict]:
        return newest_summaries(self.client("sagemaker"), "list_training_jobs", "TrainingJobSummaries", status,
                                name_contains, max_results)


def newest_summaries(client, operation: str, key: str, status: str | None, name_contains: str | None,
           max_results: int) -> list[dict]:
    """The newest `max_results` summaries a SageMaker List* operation pages through (training jobs,
    tuning jobs), filtered by status and name as its StatusEquals and NameContains do."""
    kwargs: dict[str, Any] = {"SortBy": "CreationTime", "SortOrder": "Descending"}
    if status:
        kwargs["StatusEquals"] = status
    if name_contains:
        kwargs["NameContains"] = name_contains
    found: list[dict] = []
    for page in client.get_paginator(operation).paginate(**kwargs):
        found += page[key]
        if len(found) >= max_results:
            break
    return found[:max_results]

@contextmanager
def _status_line(name: str):
    """A live status line on a terminal (rich); nothing when output goes to a file or notebook log.
    Under the CLI's progress bar (launcher.backends.live), the bar shows it: one live display at a time."""
    bar = active()
    if bar is not None:
        yield bar
        return
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console

    with Console(stderr=True).status(f"{name}: waiting") as status:
        yield status


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=False, default=str)


def _artifacts_of(desc: dict, name: str) -> dict[str, str]:
    out = {}
    model = desc.get("ModelArtifacts", {}).get("S3ModelArtifacts")
    if model:
        out["model.tar.gz"] = model
    if desc["TrainingJobStatus"] in TERMINAL_STATUSES:
        base = desc.get("OutputDataConfig", {}).get("S3OutputPath", "").rstrip("/")
        out["output.tar.gz"] = f"{base}/{name}/output/output.tar.gz"
    return out


def _restart_rules(desc: dict) -> dict:
    """MaxRestarts, as a local job's record has it, from the restart loop's hyperparameter (a job
    with max_restarts; launcher.wire.restart_loop); nothing for a job without, or one not smlaunch's."""
    try:
        policy = restart_loop.sdk_hyperparameters(decode(desc.get("HyperParameters") or {}))[1]
    except ValueError:
        return {}
    return {"MaxRestarts": policy.max_restarts} if policy.max_restarts else {}
