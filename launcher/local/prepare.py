"""Turn a validated job into a local job directory, checking everything that can fail first.

Nothing is written until the name, the runner, the GPUs, the code archive and the S3 locations
have passed their checks; then the job directory gets its record, the code archive, the
channels (downloaded from S3 if need be) and one `/opt/ml` tree per host, written as
SageMaker writes them (launcher.contract.write_opt_ml).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from launcher import wire
from launcher.backends.base import BackendError, default_base_name, make_job_name
from launcher.backends.sourcedir import build_job_sourcedir, program_name
from launcher.config import ValidatedJob
from launcher.config.job_rules import resolve_path
from launcher.contract import write_opt_ml
from launcher.local import s3io, store
from launcher.local.spec import LocalJobSpec, Runner

DEFAULT_CHECKPOINT_PATH = "/opt/ml/checkpoints"


def visible_gpus() -> list[int]:
    """NVIDIA devices this machine offers: CUDA_VISIBLE_DEVICES if set, else `nvidia-smi -L`."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [int(x) for x in visible.split(",") if x.strip().isdigit()]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return list(range(sum(line.startswith("GPU ") for line in out.stdout.splitlines())))


def _gpu_layout(job: ValidatedJob, hosts: list[str]) -> tuple[int, list[list[int]]]:
    """(processes per host, device indices per host) for local_gpu: the GPUs split over the hosts."""
    gpus = visible_gpus()
    if not gpus:
        raise BackendError("instance_type 'local_gpu': no NVIDIA GPU found (nvidia-smi -L lists none); "
                           "use instance_type: local to run on the CPU")
    per_host = job.config.processes_per_host or len(gpus) // len(hosts)
    if per_host < 1 or per_host * len(hosts) > len(gpus):
        raise BackendError(
            f"instance_count {len(hosts)} x processes_per_host {per_host} needs {per_host * len(hosts)} GPUs; "
            f"this machine has {len(gpus)} ({gpus}): lower instance_count or processes_per_host")
    return per_host, [gpus[i * per_host:(i + 1) * per_host] for i in range(len(hosts))]


def _resolve(job: ValidatedJob, path: str) -> Path:
    return resolve_path(job.base_dir, path).resolve()


def prepare(job: ValidatedJob, runner: Runner, *, job_name: str | None = None, root: Path | None = None,
            log: Callable[[str], None] = print) -> LocalJobSpec:
    cfg = job.config
    name = job_name or make_job_name(cfg.base_job_name or default_base_name(cfg.entry_point))
    directory = store.job_dir(name, root)
    if directory.exists():
        raise BackendError(f"job_name {name!r} is already used by a local job ({directory}); pick another "
                           "name, drop job_name to get a timestamped one, or delete that directory")
    hosts = [f"algo-{i + 1}" for i in range(cfg.instance_count)]
    gpus_per_host: list[list[int]] = []
    if cfg.instance_type == "local_gpu":
        per_host, gpus_per_host = _gpu_layout(job, hosts)
    else:
        per_host = job.processes_per_host or 1
    if cfg.checkpoint_local_path not in (None, DEFAULT_CHECKPOINT_PATH):
        checkpoint_dir = _resolve(job, cfg.checkpoint_local_path)  # shared by re-runs: they resume
    else:
        checkpoint_dir = directory / "checkpoints"
    output_path = cfg.output_path
    if output_path and not output_path.startswith("s3://"):
        output_path = str(_resolve(job, output_path))
    spec = LocalJobSpec(
        name=name, job_dir=directory, hosts=hosts, instance_type=cfg.instance_type,
        processes_per_host=per_host, hyperparameters={}, channels={}, environment=dict(cfg.environment),
        checkpoint_dir=checkpoint_dir, max_run=cfg.max_run, image=cfg.image_uri, gpus_per_host=gpus_per_host,
        runner=runner.name, output_path=output_path, checkpoint_s3_uri=cfg.checkpoint_s3_uri,
        region=cfg.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION"),
    )
    runner.check(spec)
    for field, uri in (("output_path", output_path), ("checkpoint_s3_uri", cfg.checkpoint_s3_uri),
                       *((f"inputs.{n}", c.s3_data) for n, c in cfg.channels().items())):
        if uri and uri.startswith("s3://"):
            s3io.check_bucket(uri, field, spec.region)

    with tempfile.TemporaryDirectory() as tmp:  # a broken source_dir fails before the job exists
        bundle = build_job_sourcedir(job, Path(tmp) / "sourcedir.tar.gz")
        directory.mkdir(parents=True)
        shutil.move(str(bundle.path), spec.source_archive)
    spec.hyperparameters = wire.encode(wire.job_hyperparameters(
        cfg, instance_type=cfg.instance_type, program=program_name(cfg),
        submit_directory=runner.submit_directory(spec), job_name=name, region=spec.region))
    store.write(directory, _record(job, spec))
    try:
        _fetch_inputs(job, spec, log)
        distributions = {n: c.distribution for n, c in cfg.channels().items()}
        for host in hosts:
            write_opt_ml(spec.host_dir(host), hyperparameters=spec.hyperparameters, current_host=host,
                         hosts=hosts, instance_type=cfg.instance_type, channels=spec.channels_of(host),
                         input_mode=cfg.input_mode, distributions=distributions,
                         network_interface_name=runner.network_interface_name)
        spec.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        (directory / "logs").mkdir(exist_ok=True)
        spec.save()
    except BaseException as exc:  # Ctrl-C during a download too: the record must not stay InProgress
        stopped = isinstance(exc, KeyboardInterrupt)
        store.update(directory, TrainingJobStatus="Stopped" if stopped else "Failed",
                     SecondaryStatus="Stopped" if stopped else "Failed",
                     FailureReason="" if stopped else f"ClientError: {exc}", TrainingEndTime=store.now())
        raise
    return spec


def _fetch_inputs(job: ValidatedJob, spec: LocalJobSpec, log: Callable[[str], None]) -> None:
    cfg = job.config
    remote = {n: c for n, c in cfg.channels().items() if c.s3_data.startswith("s3://")}
    if remote or spec.checkpoint_s3_uri:
        store.update(spec.job_dir, SecondaryStatus="Downloading",
                     StatusMessage="Downloading input data and checkpoints from S3")
    for name, channel in cfg.channels().items():
        if name not in remote:
            spec.channels[name] = _resolve(job, channel.s3_data)
        elif channel.distribution == "ShardedByS3Key":
            for i, host in enumerate(spec.hosts):
                dest = spec.job_dir / "data" / name / host
                count = s3io.download_prefix(channel.s3_data, dest, spec.region, shard=(i, len(spec.hosts)))
                spec.host_channels.setdefault(host, {})[name] = dest
                log(f"channel {name} ({host}): {count} object(s) from {channel.s3_data}")
        else:
            dest = spec.job_dir / "data" / name
            count = s3io.download_prefix(channel.s3_data, dest, spec.region)
            spec.channels[name] = dest
            log(f"channel {name}: {count} object(s) from {channel.s3_data}")
    if spec.checkpoint_s3_uri:
        count = s3io.download_prefix(spec.checkpoint_s3_uri, spec.checkpoint_dir, spec.region, required=False)
        log(f"checkpoints: {count} file(s) from {spec.checkpoint_s3_uri}")


def _record(job: ValidatedJob, spec: LocalJobSpec) -> dict:
    """The initial job.json: DescribeTrainingJob's fields that mean something locally."""
    cfg = job.config
    stamp = store.now()
    record = {
        "TrainingJobName": spec.name,
        "TrainingJobStatus": "InProgress",
        "SecondaryStatus": "Starting",
        "SecondaryStatusTransitions": [{"Status": "Starting", "StartTime": stamp,
                                        "StatusMessage": "Preparing the local job"}],
        "CreationTime": stamp,
        "LastModifiedTime": stamp,
        "HyperParameters": spec.hyperparameters,
        "AlgorithmSpecification": {"TrainingImage": spec.image or "", "TrainingInputMode": cfg.input_mode},
        "ResourceConfig": {"InstanceType": cfg.instance_type, "InstanceCount": cfg.instance_count},
        "StoppingCondition": {"MaxRuntimeInSeconds": cfg.max_run},
        "OutputDataConfig": {"S3OutputPath": spec.output_path or str(spec.job_dir / "output")},
        "InputDataConfig": [{"ChannelName": n, "DataSource": {"S3DataSource": {
            "S3Uri": c.s3_data, "S3DataType": c.s3_data_type, "S3DataDistributionType": c.distribution}}}
            for n, c in cfg.channels().items()],
        "LocalRunner": spec.runner,
        "LocalJobDir": str(spec.job_dir),
        "ProcessesPerHost": spec.processes_per_host,
    }
    if cfg.environment:
        record["Environment"] = dict(cfg.environment)
    if cfg.checkpoint_s3_uri or cfg.checkpoint_local_path not in (None, DEFAULT_CHECKPOINT_PATH):
        record["CheckpointConfig"] = {"S3Uri": cfg.checkpoint_s3_uri or "", "LocalPath": str(spec.checkpoint_dir)}
    return record
