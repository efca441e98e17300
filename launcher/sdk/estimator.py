"""`PyTorch`: the SageMaker SDK v2 estimator's interface, validated before anything is paid for.

    from launcher import PyTorch          # instead of: from sagemaker.pytorch import PyTorch
    est = PyTorch(entry_point="train.py", instance_type="ml.p5.48xlarge", distribution={...})
    est.fit(inputs={"train": "s3://bucket/train/"})
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

# Imports inside functions: constructing an estimator validates without the backends or the planner;
# they load when a job is planned, run or attached.
from launcher.config import JobConfig, ValidatedJob, validate_job
from launcher.config.sent_hyperparameters import distribution_from_hyperparameters
from launcher.sdk import sdk_objects
from launcher.wire import hyperparameters as wire
from launcher.wire import restart_loop
from launcher.wire.training.issues import ConfigError, Issue, did_you_mean

_RECIPES = ("SageMaker HyperPod recipes are launched by the SageMaker SDK's recipe machinery",
            "submit recipes with the SageMaker SDK, or give entry_point a training script")
# SDK v2 arguments smlaunch refuses, and why; every other SDK argument is a JobConfig field.
REFUSED_ARGUMENTS = {
    "compiler_config": ("SageMaker Training Compiler runs only on its own PyTorch 1.13/2.0 images",
                        "remove compiler_config (torch.compile in the script does the same on any image)"),
    "training_recipe": _RECIPES,
    "recipe_overrides": _RECIPES,
}
# Accepted by the SDK's constructor through **kwargs and ignored there; said out loud here.
IGNORED_ARGUMENTS = {"wait": "is a fit() argument; the SDK's constructor ignores it too, so pass it to fit()"}


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


def _aws_settings(desc: dict, reserved: dict) -> dict[str, Any]:
    """The SDK settings a DescribeTrainingJob answer carries back (attach)."""
    vpc, output = desc.get("VpcConfig") or {}, desc.get("OutputDataConfig", {})
    resource, tensorboard = desc.get("ResourceConfig", {}), desc.get("TensorBoardOutputConfig")
    groups = resource.get("InstanceGroups")
    out = {
        "subnets": vpc.get("Subnets"),
        "security_group_ids": vpc.get("SecurityGroupIds"),
        "enable_network_isolation": desc.get("EnableNetworkIsolation") or None,
        "encrypt_inter_container_traffic": desc.get("EnableInterContainerTrafficEncryption") or None,
        "max_retry_attempts": (desc.get("RetryStrategy") or {}).get("MaximumRetryAttempts"),
        "output_kms_key": output.get("KmsKeyId"),
        "disable_output_compression": output.get("CompressionType") == "NONE" or None,
        "volume_kms_key": resource.get("VolumeKmsKeyId"),
        "container_log_level": reserved.get("sagemaker_container_log_level"),
        "tensorboard_output_config": {"s3_output_path": tensorboard["S3OutputPath"],
                                      "container_local_output_path": tensorboard.get("LocalPath")}
        if tensorboard else None,
        "instance_groups": [{"instance_group_name": g["InstanceGroupName"], "instance_type": g["InstanceType"],
                             "instance_count": g["InstanceCount"]} for g in groups] if groups else None,
    }
    return out


def _argument_types(hyperparameters: Any, sagemaker_session: Any, session: Any) -> list[Issue]:
    """The arguments the constructor itself reads (the rest are validated as the job's fields)."""
    issues = []
    if hyperparameters is not None and not isinstance(hyperparameters, Mapping):
        issues.append(Issue("hyperparameters", hyperparameters,
                            f"is of type {type(hyperparameters).__name__}; the estimator takes a dict of names to "
                            "values, as the SageMaker SDK does",
                            "pass a dict, e.g. hyperparameters={'lr': 1e-4, 'epochs': 2}"))
    for name, value in (("sagemaker_session", sagemaker_session), ("session", session)):
        boto_session = getattr(value, "boto_session", value)  # a sagemaker.Session wraps a boto3.Session
        if value is not None and not callable(getattr(boto_session, "client", None)):
            issues.append(Issue(name, value, f"is of type {type(value).__name__}, not a sagemaker.Session or a "
                                "boto3.Session", "pass sagemaker.Session() or boto3.Session(region_name=...), or "
                                "leave it out to use the default AWS credentials and region"))
    if sagemaker_session is not None and session is not None and sagemaker_session is not session:
        issues.append(Issue("session", session, "and sagemaker_session are both given",
                            "pass one of them"))
    return issues


class TrainingJob:
    """A submitted job: its name and the backend that follows it."""

    def __init__(self, name: str, backend):
        self.name, self.backend = name, backend

    def __repr__(self) -> str:
        return f"TrainingJob({self.name!r})"

    def describe(self) -> dict:
        """DescribeTrainingJob (the SDK v2's `latest_training_job.describe()`); a SageMaker job's
        `WarmPool` entry adds its pool's time left (docs/sagemaker-warm-pools.md)."""
        return self.backend.describe(self.name)

    def update(self, resource_config: Any) -> TrainingJob:
        """The SDK v3's `TrainingJob.update(resource_config=ResourceConfigForUpdate(keep_alive_period_in_seconds=N))`,
        or the dict `{"KeepAlivePeriodInSeconds": N}` of the SDK v2's `Session.update_training_job`: the
        job's Available warm pool is kept N s from the job's end; 0 ends it. Nothing else may change."""
        from launcher.backends.warm_pools import WarmPoolError
        from launcher.config.backend_table import named

        if isinstance(resource_config, dict):  # ResourceConfigForUpdate has this one member
            only = set(resource_config) == {"KeepAlivePeriodInSeconds"}
            seconds = resource_config["KeepAlivePeriodInSeconds"] if only else None
        else:
            seconds = getattr(resource_config, "keep_alive_period_in_seconds", None)
        if seconds is None:
            raise WarmPoolError(f"resource_config = {resource_config!r}: only KeepAlivePeriodInSeconds may be updated; "
                                "pass {'KeepAlivePeriodInSeconds': N} (or ResourceConfigForUpdate("
                                "keep_alive_period_in_seconds=N))")
        if not named(self.backend.name).sagemaker_jobs:
            raise WarmPoolError(f"job {self.name} runs on {self.backend.name}: warm pools are SageMaker's, so there "
                                "is no pool to update; run the job on SageMaker to keep one")
        self.backend.update_keep_alive(self.name, seconds)
        return self


class PyTorch:
    """SageMaker SDK v2 `PyTorch` estimator arguments; validation runs in the constructor."""

    def __init__(self, entry_point: str, source_dir: str | None = None, hyperparameters: dict | None = None,
                 distribution: dict | None = None, *, sagemaker_session: Any = None, session: Any = None,
                 **kwargs: Any):
        allowed = set(JobConfig.model_fields)
        refused = [Issue(k, kwargs[k], *REFUSED_ARGUMENTS[k]) for k in kwargs
                   if k in REFUSED_ARGUMENTS and kwargs[k] is not None]
        unknown = [Issue(k, kwargs[k], "unknown estimator argument", did_you_mean(k, allowed) or "remove it")
                   for k in sorted(set(kwargs) - allowed - set(REFUSED_ARGUMENTS) - set(IGNORED_ARGUMENTS))]
        wrong = _argument_types(hyperparameters, sagemaker_session, session)
        if refused or unknown or wrong:
            raise ConfigError(refused + unknown + wrong)
        for name in set(kwargs) & set(IGNORED_ARGUMENTS):
            print(f"warning: {name}: {IGNORED_ARGUMENTS[name]}", file=sys.stderr)
        args = sdk_objects.plain({k: v for k, v in kwargs.items() if v is not None and k not in IGNORED_ARGUMENTS})
        args.update(entry_point=entry_point, hyperparameters=dict(hyperparameters or {}))
        if source_dir is not None:
            args["source_dir"] = source_dir
        if distribution is not None:
            args["distribution"] = sdk_objects.distribution(distribution)
        if "inputs" in args:
            args["inputs"] = _inputs(args["inputs"])
        self._args = args
        self._session = sagemaker_session or session
        self.job: ValidatedJob = validate_job(args)
        for warning in self.job.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        for note in self.job.notes:
            print(f"note: {note}", file=sys.stderr)
        self.latest_training_job: TrainingJob | None = None

    @property
    def config(self) -> JobConfig:
        return self.job.config

    def _backend(self):
        from launcher.backends import registry

        return registry.for_job(self.job, session=self._session)

    def dryrun(self, inputs: Any = None, job_name: str | None = None) -> dict:
        """What fit() would submit, as data (SageMaker: the CreateTrainingJob request; Slurm: the
        batch script and job; local: the hosts and settings); nothing is sent, uploaded or written."""
        job = self._with_inputs(inputs)
        return self._backend().dryrun(job, job_name).to_dict()

    def plan(self):
        """Memory per GPU, speed and cost of this job before launch (`launcher.plan.PlanResult`):
        `.fits`, `.memory.peak_gib`, `.memory.largest_allocation`, `.tokens_per_s`,
        `.usd_per_billion_tokens`; `print(launcher.plan.explain_oom(result.memory))` says why."""
        from launcher.plan import plan

        return plan(self.job)

    def fit(self, inputs: Any = None, wait: bool = True, logs: bool | str = True, job_name: str | None = None,
            experiment_config: dict | None = None, force: bool = False) -> None:
        """Submit the job and (by default) follow it to its end. A local job (instance_type local or
        local_gpu) runs on this machine: in this process with `wait`, detached without.
        `experiment_config` ({"ExperimentName", "TrialName", ...}) is sent as the SDK sends it;
        `logs` may be the SDK's "All"/"None" as well as a bool.

        A job the planner predicts to run out of accelerator memory is refused
        (`launcher.plan.PredictedOOMError`, which says what fixes it) unless `force=True`; a job with
        `trace=True` is traced first and refused (`launcher.plan.TraceRefusal`) when its trace fails or its
        traced peak does not fit."""
        logs = logs not in (False, "None")
        job = self._with_inputs(inputs, experiment_config)
        if not force:
            from launcher.plan import check_fits

            check_fits(job)
        if job.config.trace:
            from launcher.plan import check_trace

            check_trace(job)
        backend = self._backend()
        name = backend.submit(job, job_name, detach=not wait)
        self.latest_training_job = TrainingJob(name, backend)
        print(f"Submitted training job {name}", file=sys.stderr)
        if wait:
            backend.wait(name, logs=logs)

    def _with_inputs(self, inputs: Any, experiment_config: dict | None = None) -> ValidatedJob:
        if inputs is None and not experiment_config:
            return self.job
        args = dict(self._args)
        if inputs is not None:
            args["inputs"] = _inputs(inputs)
        if experiment_config:
            args["experiment_config"] = experiment_config
        return validate_job(args)

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
        from launcher.backends import registry
        from launcher.local import store

        kind, name = registry.parse_handle(training_job_name, "training_job_name")
        wrong = _argument_types(None, sagemaker_session, session)
        if wrong:
            raise ConfigError(wrong)
        if kind is None:  # a bare name: a job of smlaunch's store (local or Slurm), else SageMaker's
            kind = store.backend_of(store.read(name)) if store.exists(name) else "sagemaker"
        backend = registry.backend_named(kind, region=region, session=sagemaker_session or session)
        desc = backend.describe(name)
        training_job_name = desc.get("TrainingJobName", name)
        # a SageMaker job with max_restarts names smlaunch's restart loop as its program: the job's own is kept
        decoded, policy = restart_loop.sdk_hyperparameters(wire.decode(desc.get("HyperParameters", {})))
        user, reserved = wire.split_reserved(decoded)
        resource, stopping = desc["ResourceConfig"], desc.get("StoppingCondition", {})
        args: dict[str, Any] = {
            "entry_point": reserved.get("sagemaker_program", "train.py"),
            "source_dir": reserved.get("sagemaker_submit_directory"),
            "hyperparameters": user,
            "distribution": distribution_from_hyperparameters(decoded),
            "role": desc.get("RoleArn"),
            "region": getattr(backend, "region", None),
            "instance_type": resource.get("InstanceType"),
            "instance_count": resource.get("InstanceCount"),
            "volume_size": resource.get("VolumeSizeInGB"),
            "keep_alive_period_in_seconds": resource.get("KeepAlivePeriodInSeconds"),
            "processes_per_host": reserved.get(wire.PROCESSES_PER_HOST),
            "max_run": stopping.get("MaxRuntimeInSeconds"),
            "use_spot_instances": desc.get("EnableManagedSpotTraining", False),
            "output_path": desc.get("OutputDataConfig", {}).get("S3OutputPath"),
            "image_uri": desc.get("AlgorithmSpecification", {}).get("TrainingImage"),
            "environment": desc.get("Environment") or None,
            # SageMaker's rules are in the restart loop's hyperparameter, a local job's in its record
            "max_restarts": policy.max_restarts or desc.get("MaxRestarts") or None,
            "restart_on_exit_codes": list(policy.exit_codes) or desc.get("RestartOnExitCodes") or None,
            "restart_on_job_errors": policy.job_errors or desc.get("RestartOnJobErrors") or None,
            "min_instance_count": desc.get("MinInstanceCount"),
        }
        if args["use_spot_instances"]:
            args["max_wait"] = stopping.get("MaxWaitTimeInSeconds")
        checkpoint = desc.get("CheckpointConfig")
        if checkpoint:
            args["checkpoint_s3_uri"] = checkpoint["S3Uri"]
            args["checkpoint_local_path"] = checkpoint.get("LocalPath")
        args.update(_aws_settings(desc, reserved))
        metrics = desc.get("AlgorithmSpecification", {}).get("MetricDefinitions")
        if metrics:
            args["metric_definitions"] = metrics
        args.update(backend.attach_fields(desc))  # a local or Slurm job's backend, its code as the first host got it
        est = cls(session=getattr(backend, "session", None), **{k: v for k, v in args.items() if v is not None})
        est.latest_training_job = TrainingJob(training_job_name, backend)
        return est
