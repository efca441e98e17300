"""`PyTorch`: the SageMaker SDK v2 estimator's interface, validated before anything is paid for.

    from launcher import PyTorch          # instead of: from sagemaker.pytorch import PyTorch
    est = PyTorch(entry_point="train.py", instance_type="ml.p5.48xlarge", distribution={...})
    est.fit(inputs={"train": "s3://bucket/train/"})
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from launcher import wire
from launcher.config import JobConfig, ValidatedJob, validate_job
from launcher.issues import ConfigError, Issue, did_you_mean

# Accepted for compatibility with SDK code; they change nothing in the job smlaunch builds.
SDK_ONLY_ARGUMENTS = frozenset({
    "debugger_hook_config", "disable_profiler", "profiler_config", "enable_sagemaker_metrics",
    "rules", "container_log_level", "wait", "disable_output_compression", "enable_network_isolation",
})


def _channel(value: Any) -> Any:
    """Accept strings, dicts, our ChannelInput and the SDK's TrainingInput (via its .config)."""
    config = getattr(value, "config", None)
    if isinstance(config, dict) and "DataSource" in config:
        s3 = config["DataSource"]["S3DataSource"]
        out = {"s3_data": s3["S3Uri"], "s3_data_type": s3.get("S3DataType", "S3Prefix"),
               "distribution": s3.get("S3DataDistributionType", "FullyReplicated")}
        if config.get("ContentType"):
            out["content_type"] = config["ContentType"]
        if config.get("InputMode"):
            out["input_mode"] = config["InputMode"]
        return out
    if hasattr(value, "model_dump"):
        return value.model_dump(exclude_none=True)
    return value


def _inputs(inputs: Any) -> Any:
    if inputs is None or isinstance(inputs, str):
        return inputs
    if isinstance(inputs, dict):
        return {k: _channel(v) for k, v in inputs.items()}
    return {"training": _channel(inputs)}


class TrainingJob:
    """A submitted job: its name and the backend that follows it."""

    def __init__(self, name: str, backend):
        self.name, self.backend = name, backend

    def __repr__(self) -> str:
        return f"TrainingJob({self.name!r})"


class PyTorch:
    """SageMaker SDK v2 `PyTorch` estimator arguments; validation runs in the constructor."""

    def __init__(self, entry_point: str, source_dir: str | None = None, hyperparameters: dict | None = None,
                 distribution: dict | None = None, *, sagemaker_session: Any = None, session: Any = None,
                 **kwargs: Any):
        allowed = set(JobConfig.model_fields) | SDK_ONLY_ARGUMENTS
        unknown = sorted(set(kwargs) - allowed)
        if unknown:
            raise ConfigError([Issue(k, kwargs[k], "unknown estimator argument",
                                     did_you_mean(k, allowed) or "remove it") for k in unknown])
        args = {k: v for k, v in kwargs.items() if k not in SDK_ONLY_ARGUMENTS and v is not None}
        args.update(entry_point=entry_point, hyperparameters=dict(hyperparameters or {}))
        if source_dir is not None:
            args["source_dir"] = source_dir
        if distribution is not None:
            args["distribution"] = distribution
        if "inputs" in args:
            args["inputs"] = _inputs(args["inputs"])
        self._args = args
        self._session = sagemaker_session or session
        self.job: ValidatedJob = validate_job(args)
        for warning in self.job.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        self.latest_training_job: TrainingJob | None = None

    @property
    def config(self) -> JobConfig:
        return self.job.config

    def _backend(self):
        if self.config.is_local:
            from launcher.backends.local import LocalBackend

            return LocalBackend(runner=self.config.local_runner)
        from launcher.backends.sagemaker import SageMakerBackend

        return SageMakerBackend(self._session, region=self.config.region)

    def dryrun(self, inputs: Any = None, job_name: str | None = None) -> dict:
        """The CreateTrainingJob request fit() would send; nothing is sent or uploaded."""
        if self.config.is_local:
            raise ConfigError([Issue("instance_type", self.config.instance_type,
                                     "a local job sends no CreateTrainingJob request",
                                     "call fit() to run it here, or pick an ml.* instance type")])
        job = self._with_inputs(inputs)
        return self._backend().dryrun(job, job_name).to_dict()

    def plan(self):
        """Memory per GPU, speed and cost of this job before launch (`launcher.plan.PlanResult`):
        `.fits`, `.memory.peak_gib`, `.memory.largest_allocation`, `.tokens_per_s`,
        `.usd_per_billion_tokens`; `print(launcher.plan.explain_oom(result.memory))` says why."""
        from launcher.plan import plan

        return plan(self.job)

    def fit(self, inputs: Any = None, wait: bool = True, logs: bool = True, job_name: str | None = None,
            force: bool = False) -> None:
        """Submit the job and (by default) follow it to its end. A local job (instance_type local or
        local_gpu) runs on this machine: in this process with `wait`, detached without.

        A job the planner predicts to run out of accelerator memory is refused
        (`launcher.plan.PredictedOOMError`, which says what fixes it) unless `force=True`."""
        job = self._with_inputs(inputs)
        if not force:
            from launcher.plan import check_fits

            check_fits(job)
        backend = self._backend()
        if self.config.is_local:
            name = backend.submit(job, job_name, detach=not wait)
        else:
            name = backend.submit(job, job_name)
        self.latest_training_job = TrainingJob(name, backend)
        print(f"Submitted training job {name}", file=sys.stderr)
        if wait:
            backend.wait(name, logs=logs)

    def _with_inputs(self, inputs: Any) -> ValidatedJob:
        if inputs is None:
            return self.job
        return validate_job({**self._args, "inputs": _inputs(inputs)})

    def _latest(self) -> TrainingJob:
        if self.latest_training_job is None:
            raise RuntimeError("no training job yet: call fit() or PyTorch.attach(job_name) first")
        return self.latest_training_job

    def wait(self, logs: bool = True) -> dict:
        job = self._latest()
        return job.backend.wait(job.name, logs=logs)

    def logs(self) -> None:
        job = self._latest()
        job.backend.logs(job.name, follow=True)

    def describe(self) -> dict:
        job = self._latest()
        return job.backend.describe(job.name)

    def stop(self) -> None:
        job = self._latest()
        job.backend.stop(job.name)

    @property
    def model_data(self) -> str | None:
        return self.describe().get("ModelArtifacts", {}).get("S3ModelArtifacts")

    @classmethod
    def attach(cls, training_job_name: str, sagemaker_session: Any = None, session: Any = None,
               region: str | None = None) -> PyTorch:
        """Rebuild an estimator (distribution included) from an existing job (or a local one)."""
        from launcher.local import store

        if store.exists(training_job_name):
            from launcher.backends.local import LocalBackend

            backend = LocalBackend()
        else:
            from launcher.backends.sagemaker import SageMakerBackend

            backend = SageMakerBackend(sagemaker_session or session, region=region)
        desc = backend.describe(training_job_name)
        decoded = wire.decode(desc.get("HyperParameters", {}))
        user, reserved = wire.split_reserved(decoded)
        resource, stopping = desc["ResourceConfig"], desc.get("StoppingCondition", {})
        args: dict[str, Any] = {
            "entry_point": reserved.get("sagemaker_program", "train.py"),
            "source_dir": reserved.get("sagemaker_submit_directory"),
            "hyperparameters": user,
            "distribution": wire.distribution_from_hyperparameters(decoded),
            "role": desc.get("RoleArn"),
            "region": getattr(backend, "region", None),
            "instance_type": resource["InstanceType"],
            "instance_count": resource["InstanceCount"],
            "volume_size": resource.get("VolumeSizeInGB"),
            "keep_alive_period_in_seconds": resource.get("KeepAlivePeriodInSeconds"),
            "processes_per_host": reserved.get(wire.PROCESSES_PER_HOST),
            "max_run": stopping.get("MaxRuntimeInSeconds"),
            "use_spot_instances": desc.get("EnableManagedSpotTraining", False),
            "output_path": desc.get("OutputDataConfig", {}).get("S3OutputPath"),
            "image_uri": desc.get("AlgorithmSpecification", {}).get("TrainingImage"),
            "environment": desc.get("Environment") or None,
        }
        if args["use_spot_instances"]:
            args["max_wait"] = stopping.get("MaxWaitTimeInSeconds")
        checkpoint = desc.get("CheckpointConfig")
        if checkpoint:
            args["checkpoint_s3_uri"] = checkpoint["S3Uri"]
            args["checkpoint_local_path"] = checkpoint.get("LocalPath", "/opt/ml/checkpoints")
        metrics = desc.get("AlgorithmSpecification", {}).get("MetricDefinitions")
        if metrics:
            args["metric_definitions"] = metrics
        if "LocalJobDir" in desc:  # a local job: its runner, and the code as the first host got it
            args.update(local_runner=desc.get("LocalRunner", "process"),
                        source_dir=str(Path(desc["LocalJobDir"]) / "hosts" / "algo-1" / "code"))
        est = cls(session=getattr(backend, "session", None), **{k: v for k, v in args.items() if v is not None})
        est.latest_training_job = TrainingJob(training_job_name, backend)
        return est
