"""`ModelTrainer`: the SageMaker SDK v3 front-end, validated and launched by smlaunch's estimator.

    from launcher import ModelTrainer      # instead of: from sagemaker.train import ModelTrainer
    from launcher.sdk.model_trainer import SourceCode, Compute, Torchrun, SMP, InputData
    trainer = ModelTrainer(training_image=IMAGE, role=ROLE, source_code=SourceCode(...),
                           compute=Compute(instance_type="ml.p5.48xlarge"), distributed=Torchrun(smp=SMP(...)))
    trainer.train(input_data_config=[InputData(channel_name="train", data_source="s3://...")])

The arguments become those of `launcher.sdk.estimator.PyTorch` (the SDK v2 estimator's), which the
trainer holds: every smlaunch rule applies, and errors name the v3 field. The job is sent as the SDK
v2 contract (sagemaker_program, sagemaker_submit_directory, the distribution hyperparameters) that
the image's sagemaker-training toolkit runs, not as SDK v3's driver scripts; docs/sdk-v3.md says what
maps to what and what is refused.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Any

from launcher.config import backend_table
from launcher.config.requirements import REQUIREMENTS
from launcher.sdk import v3_configs
from launcher.sdk.estimator import PyTorch
from launcher.sdk.v3_configs import (
    MPI,
    SMP,
    CheckpointConfig,
    Compute,
    InputData,
    InstanceGroup,
    Mode,
    Networking,
    OutputDataConfig,
    S3DataSource,
    SourceCode,
    StoppingCondition,
    Tag,
    Torchrun,
    TrainingImageConfig,
    TrainingRepositoryAuthConfig,
    as_shape,
)
from launcher.wire.training.issues import ConfigError, Issue, did_you_mean

__all__ = ["MPI", "SMP", "CheckpointConfig", "Compute", "InputData", "InstanceGroup", "Mode", "ModelTrainer",
           "Networking", "OutputDataConfig", "S3DataSource", "SourceCode", "StoppingCondition", "Tag", "Torchrun",
           "TrainingImageConfig", "TrainingRepositoryAuthConfig"]

# sagemaker.train.defaults: what ModelTrainer fills in when an argument is left out.
DEFAULT_INSTANCE_TYPE = "ml.m5.xlarge"
DEFAULT_MAX_RUNTIME = 3600
# Compute.instance_type values that run the job on this machine, and smlaunch's name for each.
LOCAL_TYPES = {"local": "local", "local_cpu": "local", "local_gpu": "local_gpu"}
SHAPES = {"source_code": (SourceCode,), "compute": (Compute,), "networking": (Networking,),
          "stopping_condition": (StoppingCondition,), "output_data_config": (OutputDataConfig,),
          "checkpoint_config": (CheckpointConfig,), "training_image_config": (TrainingImageConfig,),
          "distributed": (Torchrun, MPI)}

_NO_DRIVERS = "smlaunch sends the SDK v2 contract the image's toolkit runs, not the SDK v3's driver scripts"
# ModelTrainer arguments and fields smlaunch refuses when set, and why (docs/sdk-v3.md).
REFUSED = {
    "algorithm_name": ("AWS Marketplace algorithms bring their own code; smlaunch launches training scripts",
                       "give training_image and source_code, or submit with the SageMaker SDK"),
    "model_package_config": ("Nova model-package (RMP) jobs are the SageMaker SDK's recipe machinery",
                             "submit them with the SageMaker SDK"),
    "input_s3_key_prefix": ("smlaunch uploads the code where the SDK v2 does (s3://<bucket>/<job>/source/)",
                            "remove it (code_location has no ModelTrainer field)"),
    "local_container_root": ("smlaunch keeps local jobs under $SMLAUNCH_HOME/jobs (default ~/.smlaunch)",
                             "remove it; set SMLAUNCH_HOME to move them"),
    "source_code.command": (f"a shell command runs through the SDK v3's sm_train.sh driver; {_NO_DRIVERS}",
                            "put the command in a script and give it as entry_script"),
    "source_code.args": ("only applies to source_code.command, which smlaunch refuses",
                         "pass script arguments as hyperparameters"),
    "compute.instance_preferences": ("smlaunch validates a job against one instance type",
                                     "set instance_type"),
    "stopping_condition.max_pending_time_in_seconds": ("is not sent by the SDK v2 estimator smlaunch follows",
                                                       "remove it"),
    "s3_data_source.attribute_names": ("augmented manifest attributes are not in smlaunch's channels",
                                       "remove it, or submit with the SageMaker SDK"),
    "s3_data_source.instance_group_names": ("per-group channels are not in smlaunch's channels",
                                            "remove it; every host gets every channel"),
}
# Estimator argument (an error's path) -> the ModelTrainer field it came from; the longest match wins.
V3_NAMES = {
    "entry_point": "source_code.entry_script", "source_dir": "source_code.source_dir",
    "source_ignore": "source_code.ignore_patterns",
    "instance_type": "compute.instance_type", "instance_count": "compute.instance_count",
    "volume_size": "compute.volume_size_in_gb", "volume_kms_key": "compute.volume_kms_key_id",
    "keep_alive_period_in_seconds": "compute.keep_alive_period_in_seconds",
    "instance_groups": "compute.instance_groups", "training_plan": "compute.training_plan_arn",
    "instance_placement_config": "compute.instance_placement_config",
    "use_spot_instances": "compute.enable_managed_spot_training",
    "processes_per_host": "distributed.process_count_per_node",
    "distribution.smdistributed.modelparallel.parameters": "distributed.smp",
    "distribution.mpi.processes_per_host": "distributed.process_count_per_node",
    "distribution.mpi.custom_mpi_options": "distributed.mpi_additional_options",
    "distribution": "distributed",
    "max_run": "stopping_condition.max_runtime_in_seconds", "max_wait": "stopping_condition.max_wait_time_in_seconds",
    "output_path": "output_data_config.s3_output_path", "output_kms_key": "output_data_config.kms_key_id",
    "disable_output_compression": "output_data_config.compression_type",
    "checkpoint_s3_uri": "checkpoint_config.s3_uri", "checkpoint_local_path": "checkpoint_config.local_path",
    "subnets": "networking.subnets", "security_group_ids": "networking.security_group_ids",
    "enable_network_isolation": "networking.enable_network_isolation",
    "encrypt_inter_container_traffic": "networking.enable_inter_container_traffic_encryption",
    "image_uri": "training_image", "input_mode": "training_input_mode",
    "training_repository_access_mode": "training_image_config.training_repository_access_mode",
    "training_repository_credentials_provider_arn":
        "training_image_config.training_repository_auth_config.training_repository_credentials_provider_arn",
    "inputs": "input_data_config",
}


def v3_path(path: str) -> str:
    """An estimator error's path in ModelTrainer's terms (unchanged where the names agree)."""
    for old in sorted(V3_NAMES, key=len, reverse=True):
        if path == old or path.startswith((old + ".", old + "[")):
            return V3_NAMES[old] + path[len(old):]
    return path


@contextmanager
def v3_errors() -> Iterator[None]:
    """Re-raise the estimator's ConfigError with every path in ModelTrainer's terms."""
    try:
        yield
    except ConfigError as exc:
        found = [replace(i, path=v3_path(i.path)) for i in exc.issues + exc.warnings]
        raise ConfigError(found, exc.source) from None


class ModelTrainer:
    """The SDK v3 `ModelTrainer`'s arguments; validation (all of smlaunch's rules) runs here.

    smlaunch's additions: `backend` (a name of launcher.config.backend_table: "sagemaker", "local", "slurm",
    ...) and its section of the job file as a keyword of its name (`slurm={...}`, docs/slurm.md;
    `kubernetes={...}`, docs/kubernetes.md), `local_runner` ("process" or "docker") for local jobs, `plan()`,
    `dryrun()`, and `train(force=True)` to submit a job the planner predicts to run out of memory."""

    def __init__(self, *, training_mode: Any = Mode.SAGEMAKER_TRAINING_JOB, sagemaker_session: Any = None,
                 role: str | None = None, base_job_name: str | None = None, source_code: Any = None,
                 distributed: Any = None, compute: Any = None, networking: Any = None,
                 stopping_condition: Any = None, training_image: str | None = None,
                 training_image_config: Any = None, output_data_config: Any = None,
                 input_data_config: list | None = None, checkpoint_config: Any = None,
                 training_input_mode: str | None = "File", environment: dict | None = None,
                 hyperparameters: dict | str | None = None, tags: list | None = None,
                 local_runner: str = "process", backend: str | None = None, max_restarts: int = 0,
                 restart_on_exit_codes: list[int] | None = None, restart_on_job_errors: int = 0,
                 min_instance_count: int | None = None, **kwargs: Any):
        given = {"source_code": source_code, "distributed": distributed, "compute": compute,
                 "networking": networking, "stopping_condition": stopping_condition,
                 "training_image_config": training_image_config, "output_data_config": output_data_config,
                 "checkpoint_config": checkpoint_config}
        # each backend's section of the job file (slurm=, kubernetes=, ...: the backend table's)
        self.sections = {row.name: kwargs.pop(row.name) for row in backend_table.with_sections() if row.name in kwargs}
        issues = _unknown_and_refused(kwargs)
        for name, value in given.items():
            shape, found = as_shape(value, SHAPES[name], name)
            setattr(self, name, shape)
            issues += found
        self.input_data_config, found = v3_configs.channels(input_data_config, "input_data_config")
        issues += found
        self.hyperparameters, found = v3_configs.hyperparameters(hyperparameters)
        issues += found
        self.tags, found = v3_configs.tags(tags)
        issues += found
        self.training_image, self.role, self.environment = training_image, role, environment
        self.training_input_mode, self.local_runner = training_input_mode, local_runner
        self.backend, self.max_restarts = backend, max_restarts
        self.restart_on_exit_codes, self.restart_on_job_errors = restart_on_exit_codes, restart_on_job_errors
        self.min_instance_count = min_instance_count
        self.local = _local_mode(training_mode, self.compute, issues)
        self.base_job_name = base_job_name or (
            f"{v3_configs.repository(training_image)}-job" if training_image else None)
        issues += _refused_fields(self, failed={i.path.split(".")[0].split("[")[0] for i in issues})
        if any(i.level == "error" for i in issues):
            raise ConfigError(issues)
        for warning in issues:
            print(f"warning: {warning}", file=sys.stderr)
        self._args = self._estimator_args()
        with v3_errors():
            self.estimator = PyTorch(sagemaker_session=sagemaker_session, **self._args)

    # --- what the SDK v3 does with the arguments, as estimator arguments ---------------------------
    def _estimator_args(self) -> dict[str, Any]:
        code, compute = self.source_code, self.compute or Compute(instance_type=DEFAULT_INSTANCE_TYPE)
        stopping = self.stopping_condition or StoppingCondition()
        args: dict[str, Any] = {
            "entry_point": code.entry_script, "source_dir": code.source_dir,
            "source_ignore": code.ignore_patterns or [],
            "hyperparameters": self.hyperparameters, "role": self.role, "base_job_name": self.base_job_name,
            "image_uri": self.training_image, "input_mode": self.training_input_mode,
            "environment": self.environment, "tags": self.tags,
            "max_run": DEFAULT_MAX_RUNTIME if stopping.max_runtime_in_seconds is None
            else stopping.max_runtime_in_seconds,
            "max_wait": stopping.max_wait_time_in_seconds,
            "inputs": v3_configs.estimator_inputs(self.input_data_config),
            # The SDK v3 configures neither Debugger nor the profiler; the SDK v2 turns both on.
            "debugger_hook_config": False, "disable_profiler": True,
        }
        args.update(_compute_args(compute, self.local), local_runner=self.local_runner, backend=self.backend,
                    max_restarts=self.max_restarts or None, restart_on_exit_codes=self.restart_on_exit_codes or None,
                    restart_on_job_errors=self.restart_on_job_errors or None,
                    min_instance_count=self.min_instance_count, **self.sections)
        args.update(_distribution_args(self.distributed))
        args.update(_aws_args(self))
        return {k: v for k, v in args.items() if v is not None}

    # --- the SDK v3's methods, and smlaunch's -----------------------------------------------------
    def train(self, input_data_config: list | None = None, wait: bool = True, logs: bool = True,
              dry_run: bool = False, force: bool = False) -> None:
        """Submit the job (local mode: run it here) and, with `wait`, follow it to its end.
        `input_data_config` channels replace the constructor's of the same name, as in the SDK v3.
        `dry_run` validates everything, the channels included, and sends nothing."""
        inputs = self._inputs(input_data_config)
        with v3_errors():
            if dry_run:
                self.estimator.dryrun(inputs)
                return
            self.estimator.fit(inputs, wait=wait, logs=logs, force=force)

    def dryrun(self, input_data_config: list | None = None, job_name: str | None = None) -> dict:
        """What train() would submit (SageMaker: the CreateTrainingJob request and the code upload;
        local: the hosts and settings; Slurm: the batch script); nothing is sent or written."""
        inputs = self._inputs(input_data_config)
        with v3_errors():
            return self.estimator.dryrun(inputs, job_name)

    def plan(self):
        """Memory per GPU, speed and cost before launch (`launcher.plan.PlanResult`)."""
        return self.estimator.plan()

    @property
    def latest_training_job(self):
        """The last job train() submitted (its `.name`), or None."""
        return self.estimator.latest_training_job

    def _inputs(self, input_data_config: list | None) -> dict | None:
        """The constructor's channels with train()'s laid over them by name; None: unchanged."""
        if input_data_config is None:
            return None
        channels, issues = v3_configs.channels(input_data_config, "input_data_config")
        if issues:
            raise ConfigError(issues)
        merged = {c.channel_name: c for c in self.input_data_config or []}
        merged.update({c.channel_name: c for c in channels})
        return v3_configs.estimator_inputs(list(merged.values()))


def _unknown_and_refused(kwargs: dict[str, Any]) -> list[Issue]:
    allowed = [p for p in inspect.signature(ModelTrainer).parameters if p != "kwargs"]
    allowed += [row.name for row in backend_table.with_sections()]
    out = []
    for name, value in kwargs.items():
        if name in REFUSED:
            if value is not None:
                out.append(Issue(name, value, *REFUSED[name]))
        else:
            out.append(Issue(name, value, "unknown ModelTrainer argument", did_you_mean(name, allowed) or "remove it"))
    return out


def _refused_fields(trainer: ModelTrainer, failed: set[str]) -> list[Issue]:
    """The fields of the given shapes that smlaunch refuses, and what the v3 rules require
    (`failed`: the arguments already reported, whose shapes are None)."""
    issues = []
    for path, (problem, fix) in REFUSED.items():
        shape, _, field = path.partition(".")
        value = getattr(getattr(trainer, shape, None), field, None) if field else None
        if value is not None:
            issues.append(Issue(path, value, problem, fix))
    for i, channel in enumerate(trainer.input_data_config or []):
        source = channel.data_source
        for field in ("attribute_names", "instance_group_names"):
            if isinstance(source, S3DataSource) and getattr(source, field) is not None:
                problem, fix = REFUSED[f"s3_data_source.{field}"]
                issues.append(Issue(f"input_data_config[{i}].data_source.{field}", getattr(source, field),
                                    problem, fix))
    if "source_code" not in failed:
        issues += _source_code_issues(trainer.source_code, trainer.distributed)
    return issues + _image_issues(trainer) + _output_issues(trainer)


def _source_code_issues(code: SourceCode | None, distributed: Any) -> list[Issue]:
    """The SDK v3's own rules (ModelTrainer._validate_source_code), and requirements as the toolkit
    installs them: requirements.txt at the top of the code, by that name only."""
    if code is None:
        return [Issue("source_code", None, "is required: smlaunch runs a training script (without one the "
                      "SDK v3 would run the image's own entry point)",
                      "pass SourceCode(source_dir=..., entry_script=...)")]
    issues = []
    if code.entry_script is None and code.command is None:
        need = "distributed needs it" if distributed is not None else "smlaunch runs a training script"
        issues.append(Issue("source_code.entry_script", None, f"is required: {need}", "name the script in source_dir"))
    if (code.entry_script or code.requirements) and code.source_dir is None:
        issues.append(Issue("source_code.source_dir", None, "is required with entry_script or requirements "
                            "(as in the SDK v3)", "give the directory that holds them"))
    if code.requirements is not None and code.source_dir is not None:
        issues += _requirements_issues(code.source_dir, code.requirements)
    elif code.source_dir is not None and (Path(code.source_dir) / REQUIREMENTS).is_file():
        issues.append(Issue("source_code.requirements", None, f"is not set, and the image's toolkit installs "
                            f"{REQUIREMENTS} from source_dir all the same (the SDK v2 contract); the SDK v3 would not",
                            f"set requirements='{REQUIREMENTS}' to say so, or remove the file", "warning"))
    return issues


def _requirements_issues(source_dir: str, requirements: str) -> list[Issue]:
    if PurePosixPath(requirements.removeprefix("./")) != PurePosixPath(REQUIREMENTS):
        return [Issue("source_code.requirements", requirements,
                      f"the image's toolkit installs only {REQUIREMENTS} at the top of source_dir (the SDK v2 "
                      "contract smlaunch sends)", f"name the file {REQUIREMENTS} at the top of source_dir")]
    if not (Path(source_dir) / REQUIREMENTS).is_file():
        return [Issue("source_code.requirements", requirements, f"{source_dir}/{REQUIREMENTS} is not a file",
                      "create it, or remove requirements")]
    return []


def _image_issues(trainer: ModelTrainer) -> list[Issue]:
    if trainer.training_image or trainer.local:
        return []
    return [Issue("training_image", None, "is required (the SDK v3 requires it, or algorithm_name)",
                  "give the training image URI, e.g. an AWS PyTorch training image")]


def _output_issues(trainer: ModelTrainer) -> list[Issue]:
    issues = []
    output, checkpoint = trainer.output_data_config, trainer.checkpoint_config
    if output is not None and output.compression_type not in (None, "GZIP", "NONE"):
        issues.append(Issue("output_data_config.compression_type", output.compression_type,
                            "not an allowed value", "use GZIP (the default) or NONE"))
    if checkpoint is not None and checkpoint.s3_uri is None:
        issues.append(Issue("checkpoint_config.s3_uri", None, "is required here: the SDK v3 derives "
                            "s3://<default bucket>/<base_job_name>/<job>/checkpoints from AWS calls smlaunch "
                            "makes only when it submits", "give the S3 prefix for the checkpoints"))
    options = trainer.distributed.mpi_additional_options if isinstance(trainer.distributed, MPI) else None
    spaced = [o for o in options or [] if len(o.split()) != 1]
    if spaced:
        issues.append(Issue("distributed.mpi_additional_options", spaced, "the image's toolkit splits the "
                            "options on whitespace, so an option cannot hold a space", "drop the spaces or quotes"))
    return issues


def _local_mode(training_mode: Any, compute: Compute | None, issues: list[Issue]) -> bool:
    """Local mode: a local instance type, or Mode.LOCAL_CONTAINER (which then needs one)."""
    mode = str(getattr(training_mode, "value", training_mode))
    instance = compute.instance_type if compute else None
    if mode not in Mode.__members__:
        issues.append(Issue("training_mode", mode, "not an allowed value", did_you_mean(mode, list(Mode.__members__))))
        return False
    if mode == Mode.LOCAL_CONTAINER.value and instance is not None and instance not in LOCAL_TYPES:
        issues.append(Issue("compute.instance_type", instance, "is not a local instance type, and training_mode "
                            "LOCAL_CONTAINER runs the job on this machine", "use local_cpu or local_gpu"))
    return mode == Mode.LOCAL_CONTAINER.value or instance in LOCAL_TYPES


def _compute_args(compute: Compute, local: bool) -> dict[str, Any]:
    instance_type = compute.instance_type
    if local:
        instance_type = LOCAL_TYPES.get(instance_type or "local", instance_type)
    elif not compute.instance_groups:
        instance_type = instance_type or DEFAULT_INSTANCE_TYPE
    placement = compute.instance_placement_config
    return {
        "instance_type": instance_type,
        "instance_count": None if compute.instance_groups else
        (1 if compute.instance_count is None else compute.instance_count),
        "instance_groups": [g.model_dump() for g in compute.instance_groups] if compute.instance_groups else None,
        "volume_size": compute.volume_size_in_gb, "volume_kms_key": compute.volume_kms_key_id,
        "keep_alive_period_in_seconds": compute.keep_alive_period_in_seconds,
        "training_plan": compute.training_plan_arn, "use_spot_instances": compute.enable_managed_spot_training,
        "instance_placement_config": _pascal(placement) if placement is not None else None,
    }


def _pascal(value: Any) -> Any:
    """sagemaker-core's snake_case shape as the API's PascalCase (how the estimator takes it)."""
    if isinstance(value, dict):
        return {"".join(p.capitalize() for p in k.split("_")): _pascal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_pascal(v) for v in value]
    return value


def _distribution_args(distributed: Any) -> dict[str, Any]:
    """Torchrun -> torch_distributed (with SMP v2's modelparallel), MPI -> mpi, as SDK v2 writes them."""
    if isinstance(distributed, Torchrun):
        dist: dict[str, Any] = {"torch_distributed": {"enabled": True}}
        if distributed.smp is not None:
            dist["smdistributed"] = {"modelparallel": {
                "enabled": True, "parameters": distributed.smp.model_dump(exclude_none=True)}}
        return {"distribution": dist, "processes_per_host": distributed.process_count_per_node}
    if isinstance(distributed, MPI):
        mpi: dict[str, Any] = {"enabled": True}
        if distributed.process_count_per_node is not None:
            mpi["processes_per_host"] = distributed.process_count_per_node
        if distributed.mpi_additional_options:
            mpi["custom_mpi_options"] = " ".join(distributed.mpi_additional_options)
        return {"distribution": {"mpi": mpi}}
    return {}


def _aws_args(trainer: ModelTrainer) -> dict[str, Any]:
    net, out, ckpt = trainer.networking, trainer.output_data_config, trainer.checkpoint_config
    image = trainer.training_image_config
    auth = image.training_repository_auth_config if image else None
    return {
        "subnets": net.subnets if net else None, "security_group_ids": net.security_group_ids if net else None,
        "enable_network_isolation": net.enable_network_isolation if net else None,
        "encrypt_inter_container_traffic": net.enable_inter_container_traffic_encryption if net else None,
        "output_path": out.s3_output_path if out else None, "output_kms_key": out.kms_key_id if out else None,
        "disable_output_compression": (out.compression_type == "NONE") or None if out else None,
        "checkpoint_s3_uri": ckpt.s3_uri if ckpt else None, "checkpoint_local_path": ckpt.local_path if ckpt else None,
        "training_repository_access_mode": image.training_repository_access_mode if image else None,
        "training_repository_credentials_provider_arn": auth.training_repository_credentials_provider_arn
        if auth else None,
    }
