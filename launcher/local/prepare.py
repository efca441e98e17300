"""Turn a validated job into a local job directory, checking everything that can fail first.

Nothing is written until the name, the runner, the GPUs, the places the job writes to (a probe
file and some free space in each), the code archive and the S3 locations have passed their
checks; then the job directory gets its record, the code archive, the channels (downloaded from
S3 if need be) and one `/opt/ml` tree per host, written as SageMaker writes them
(launcher.wire.opt_ml.write_opt_ml). A failure on the way leaves no job stuck "Starting": the
directory goes if the record is not written yet, else the record says Failed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from launcher.backends.base import BackendError
from launcher.backends.metric_records import algorithm_record
from launcher.backends.request import tensorboard_config
from launcher.backends.sourcedir import build_job_sourcedir, program_name
from launcher.config import ValidatedJob
from launcher.config.job import DEFAULT_CHECKPOINT_PATH
from launcher.config.job_names import check_job_name, default_base_name, make_job_name
from launcher.config.job_rules import resolve_path
from launcher.config.paths import HOME_ENV
from launcher.config.requirements import runtime_constraints
from launcher.config.restarts import restart_environment
from launcher.config.sent_hyperparameters import job_hyperparameters
from launcher.local import s3io, store
from launcher.local.spec import LocalJobSpec, Runner
from launcher.wire import hyperparameters as wire
from launcher.wire.opt_ml import host_names, write_opt_ml
from launcher.wire.training.issues import ConfigError, Issue

MIN_FREE_BYTES = 1 << 20  # less, and not even the job's record, code archive and logs fit


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
    spec = checked_spec(job, runner, job_name, root)
    try:
        _write(job, spec, runner, log)
    except OSError as exc:  # a full disk, a directory that turned read-only: nothing half-made is left
        raise BackendError(f"could not prepare local job {spec.name} in {spec.job_dir}: {exc}") from exc
    return spec


def checked_spec(job: ValidatedJob, runner: Runner, job_name: str | None, root: Path | None) -> LocalJobSpec:
    """The job's spec once every check has passed (hyperparameters included); nothing is written."""
    cfg = job.config
    name = check_job_name(job_name or make_job_name(cfg.base_job_name or default_base_name(cfg.entry_point)))
    directory = store.job_dir(name, root)
    if directory.exists():  # early, before the code archive is built; _create_job_dir settles races
        raise _name_taken(name, directory)
    hosts = host_names(cfg.instance_count)
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
        processes_per_host=per_host, hyperparameters={}, channels={},
        environment={**cfg.environment, **restart_environment(cfg)},
        checkpoint_dir=checkpoint_dir, max_run=cfg.max_run, max_restarts=cfg.max_restarts, image=cfg.image_uri,
        min_instance_count=cfg.min_instance_count or 0,
        gpus_per_host=gpus_per_host,
        runner=runner.name, output_path=output_path, checkpoint_s3_uri=cfg.checkpoint_s3_uri,
        region=cfg.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION"),
        runner_settings=dict(getattr(runner, "settings", {})), tensorboard=tensorboard_config(cfg),
        envs_root=str(store.envs_root(root)), runtime_constraints=runtime_constraints() if job.kind.runtime else [],
    )
    spec.hyperparameters = wire.encode(job_hyperparameters(
        cfg, instance_type=cfg.instance_type, program=program_name(cfg),
        submit_directory=runner.submit_directory(spec), job_name=spec.name, region=spec.region))
    runner.check(spec)
    _check_writable(job, spec)
    tensorboard_s3 = spec.tensorboard["S3OutputPath"] if spec.tensorboard else None
    for field, uri in (("output_path", output_path), ("checkpoint_s3_uri", cfg.checkpoint_s3_uri),
                       ("tensorboard_output_config.s3_output_path", tensorboard_s3),
                       *((f"inputs.{n}", c.s3_data) for n, c in cfg.channels().items())):
        if uri and uri.startswith("s3://"):
            s3io.check_bucket(uri, field, spec.region)
    return spec


def _check_writable(job: ValidatedJob, spec: LocalJobSpec) -> None:
    """Where the job writes on this machine: the jobs root, a local output_path and a
    checkpoint_local_path; all refused at once, before training is paid for with minutes."""
    cfg = job.config
    places = [(HOME_ENV, str(spec.job_dir.parent), spec.job_dir.parent)]
    if spec.output_path and not spec.output_path.startswith("s3://"):
        places.append(("output_path", cfg.output_path, Path(spec.output_path)))
    if spec.checkpoint_dir != spec.job_dir / "checkpoints":
        places.append(("checkpoint_local_path", cfg.checkpoint_local_path, spec.checkpoint_dir))
    issues = [issue for place in places if (issue := _writable_issue(*place))]
    if issues:
        raise ConfigError(issues)


def _writable_issue(field: str, value: str, directory: Path) -> Issue | None:
    """Why the job could not write in `directory` (created if missing), or None: a probe file is
    written in it, or in the nearest directory that exists, and free space is checked."""
    try:
        existing = directory
        while not existing.exists():
            existing = existing.parent
        if not existing.is_dir():
            return Issue(field, value, f"{existing} is a file, not a directory", "give a directory")
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".smlaunch-probe-")
        try:
            os.write(fd, b"probe")
        finally:
            os.close(fd)
            os.unlink(probe)
        free = shutil.disk_usage(existing).free
    except OSError as exc:
        return Issue(field, value, f"{directory} cannot be written ({exc.strerror})",
                     "fix its permissions or pick a writable directory")
    if free < MIN_FREE_BYTES:
        return Issue(field, value, f"{existing} has {free:,} bytes free", "free some space or pick another disk")
    return None


def _name_taken(name: str, directory: Path) -> BackendError:
    return BackendError(f"job_name {name!r} is already used by a local job ({directory}); pick another "
                        "name, drop job_name to get a timestamped one, or delete that directory")


def _create_job_dir(directory: Path) -> None:
    """Make the job directory itself in one step, so that of two jobs of one name exactly one gets it."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    try:
        directory.mkdir(mode=0o700)
    except FileExistsError:
        raise _name_taken(directory.name, directory) from None


def _write(job: ValidatedJob, spec: LocalJobSpec, runner: Runner, log: Callable[[str], None]) -> None:
    """The job directory, its record, inputs and /opt/ml trees. Until the record exists a failure
    removes the directory (which would block the name); after, the record says Failed."""
    cfg = job.config
    with tempfile.TemporaryDirectory() as tmp:  # a broken source_dir fails before the job exists
        bundle = build_job_sourcedir(job, Path(tmp) / "sourcedir.tar.gz")
        log(bundle.summary())
        _create_job_dir(spec.job_dir)
        try:
            shutil.move(str(bundle.path), spec.source_archive)
            store.write(spec.job_dir, _record(job, spec, runner))
            store.reserve(spec.job_dir)
        except BaseException:
            shutil.rmtree(spec.job_dir, ignore_errors=True)
            raise
    try:
        _fetch_inputs(job, spec, log)
        distributions = {n: c.distribution for n, c in cfg.channels().items()}
        for host in spec.hosts:
            write_opt_ml(spec.host_dir(host), hyperparameters=spec.hyperparameters, current_host=host,
                         hosts=spec.hosts, instance_type=cfg.instance_type, channels=spec.channels_of(host),
                         input_mode=cfg.input_mode, distributions=distributions,
                         network_interface_name=runner.network_interface_name, tensorboard=spec.tensorboard)
        spec.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        (spec.job_dir / "logs").mkdir(exist_ok=True)
        spec.save()
    except BaseException as exc:  # Ctrl-C during a download too: the record must not stay InProgress
        _record_end(spec.job_dir, exc)
        raise


def _record_end(directory: Path, exc: BaseException) -> None:
    stopped = isinstance(exc, KeyboardInterrupt)
    try:
        store.update(directory, outcome=True, TrainingJobStatus="Stopped" if stopped else "Failed",
                     SecondaryStatus="Stopped" if stopped else "Failed",
                     FailureReason="" if stopped else f"ClientError: {exc}", TrainingEndTime=store.now())
    except OSError:  # the record cannot be written either (a full disk): no job is better than one stuck Starting
        shutil.rmtree(directory, ignore_errors=True)


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


def _record(job: ValidatedJob, spec: LocalJobSpec, runner: Runner) -> dict:
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
        "AlgorithmSpecification": algorithm_record(job.config, spec.image),
        "ResourceConfig": {"InstanceType": cfg.instance_type, "InstanceCount": cfg.instance_count},
        "StoppingCondition": {"MaxRuntimeInSeconds": cfg.max_run},
        "OutputDataConfig": {"S3OutputPath": spec.output_path or str(spec.job_dir / "output")},
        "InputDataConfig": [{"ChannelName": n, "DataSource": {"S3DataSource": {
            "S3Uri": c.s3_data, "S3DataType": c.s3_data_type, "S3DataDistributionType": c.distribution}}}
            for n, c in cfg.channels().items()],
        "Backend": runner.backend,
        "LocalRunner": spec.runner,
        "LocalJobDir": str(spec.job_dir),
        "ProcessesPerHost": spec.processes_per_host,
    }
    if cfg.environment:
        record["Environment"] = dict(cfg.environment)
    if cfg.max_restarts:
        record["MaxRestarts"] = cfg.max_restarts
    if cfg.min_instance_count:
        record["MinInstanceCount"] = cfg.min_instance_count
    if cfg.restart_on_exit_codes:
        record["RestartOnExitCodes"] = list(cfg.restart_policy.exit_codes)
    if cfg.restart_on_job_errors:
        record["RestartOnJobErrors"] = cfg.restart_on_job_errors
    if cfg.checkpoint_s3_uri or cfg.checkpoint_local_path not in (None, DEFAULT_CHECKPOINT_PATH):
        record["CheckpointConfig"] = {"S3Uri": cfg.checkpoint_s3_uri or "", "LocalPath": str(spec.checkpoint_dir)}
    return record
