"""A job: the SageMaker SDK v2 `PyTorch` estimator's arguments plus `inputs` (the channels).

Field-level checks live here; rules that relate fields (degrees against GPUs, FP8 against the
accelerator, ...) live in `launcher.config.rules` so every error is reported at once.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Discriminator, Field, field_validator, model_validator
from pydantic import Tag as UnionTag

from launcher.config.aws_settings import (
    DebuggerHookConfig,
    DebuggerRule,
    GitConfig,
    InstanceGroup,
    ProfilerConfig,
    TensorBoardOutputConfig,
)
from launcher.config.backend_table import default_for, named, with_backends
from launcher.config.distribution import Distribution
from launcher.config.job_names import JOB_NAME_PATTERN
from launcher.config.paths import LocalPathText
from launcher.config.tuning import TuningConfig
from launcher.wire.checkpoints import DEFAULT_CHECKPOINT_PATH
from launcher.wire.faults import MAX_RESTARTS
from launcher.wire.restart_policy import RestartPolicy
from launcher.wire.training.base import (
    ENVIRONMENT_KEY_MAX,
    ENVIRONMENT_MAX,
    ENVIRONMENT_VALUE_MAX,
    KEEP_ALIVE_MAX,
    MAX_INSTANCE_COUNT,
    MAX_PROCESSES_PER_HOST,
    TAG_KEY_MAX,
    TAG_PATTERN,
    TAG_VALUE_MAX,
    TAGS_MAX,
    JsonValue,
    Strict,
    WholeNumber,
)
from launcher.wire.training.catalog import LOCAL_TYPES
from launcher.wire.training.hyperparameters import TrainingHyperparameters

MAX_RUN_LIMIT = 28 * 24 * 3600  # SageMaker's StoppingCondition.MaxRuntimeInSeconds ceiling
ROLE_ARN_RE = r"^arn:aws[a-z\-]*:iam::\d{12}:role/[A-Za-z0-9_+=,.@/-]+$"


def _check_channel_names(names: list[str]) -> None:
    """SageMaker's ChannelName (1-64 of [A-Za-z0-9.-_]), less `.` and `..`: a channel is the
    directory input/data/<name> in the container, which those two would leave."""
    bad = [k for k in names if not re.fullmatch(r"[A-Za-z0-9.\-_]{1,64}", k) or k in (".", "..")]
    if bad:
        raise ValueError(f"invalid channel name(s) {bad}; use 1-64 of [A-Za-z0-9.-_], not '.' or '..'")


class ChannelInput(Strict):
    """One input channel, like `sagemaker.inputs.TrainingInput`."""

    s3_data: LocalPathText = Field(description="s3://bucket/prefix, or a local path / file:// for local runs.")
    distribution: Literal["FullyReplicated", "ShardedByS3Key"] = Field(
        "FullyReplicated", description="Copy everything to every host, or shard objects by key."
    )
    s3_data_type: Literal["S3Prefix", "ManifestFile", "AugmentedManifestFile"] = Field(
        "S3Prefix", description="What s3_data names."
    )
    input_mode: Literal["File", "Pipe", "FastFile"] | None = Field(
        None, description="How the channel reaches the container (default: the job's File mode)."
    )
    content_type: str | None = Field(None, description="MIME type passed to the container.")


class MetricDefinition(Strict):
    Name: str = Field(min_length=1, max_length=255, description="Metric name in SageMaker.")
    Regex: str = Field(min_length=1, max_length=500, description="Regex with one group, matched on logs.")

    @field_validator("Regex")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression ({exc}); check brackets and escapes") from None
        return value


TagKey = Annotated[str, Field(min_length=1, max_length=TAG_KEY_MAX, pattern=TAG_PATTERN)]
TagValue = Annotated[str, Field(max_length=TAG_VALUE_MAX, pattern=TAG_PATTERN)]


class Tag(Strict):
    Key: TagKey
    Value: TagValue


# A list of {Key, Value} or one mapping; the form decides which is checked, so an error in one is
# not reported again as "should be the other".
Tags = Annotated[
    Annotated[list[Tag], Field(max_length=TAGS_MAX), UnionTag("list[Tag]")]
    | Annotated[dict[TagKey, TagValue], Field(max_length=TAGS_MAX), UnionTag("dict[str,str]")],
    Discriminator(lambda value: "dict[str,str]" if isinstance(value, dict) else "list[Tag]"),
]


class _JobHead(Strict):
    """JobConfig's fields before `backend` (the fields from the backend table follow them)."""

    # Built on first use: the CLI validates JobFile and its user-script variant, the SDK JobConfig
    # (launcher.wire.training.base.Strict says why the inner models do not defer).
    model_config = ConfigDict(defer_build=True)

    entry_point: LocalPathText = Field(description="Training script, relative to source_dir when that is set.")
    source_dir: LocalPathText | None = Field(None, description="Directory shipped as sourcedir.tar.gz.")
    dependencies: list[LocalPathText] = Field(
        default_factory=list, description="Extra directories/files added at the code root."
    )
    source_ignore: list[str] = Field(
        default_factory=list,
        description="fnmatch patterns left out of sourcedir.tar.gz, added to the defaults "
        "(.git, .venv, venv, __pycache__, *.pyc, .ipynb_checkpoints, ...); credential files "
        "(.env*, *.pem, *.key, .ssh/, .aws/, ...: docs/secrets.md) are always left out.",
    )
    role: str | None = Field(
        None, pattern=ROLE_ARN_RE, description="IAM role ARN SageMaker assumes (not needed locally)."
    )
    region: str | None = Field(
        None,
        pattern=r"^[a-z]{2}(-gov|-iso[a-z]*)?-[a-z]+-\d$",
        description="AWS region (default: the boto3 chain).",
    )
    instance_type: str = Field(description="ml.p5.48xlarge, ml.p4d.24xlarge, ..., or local / local_gpu.")
    instance_count: WholeNumber = Field(1, ge=1, le=MAX_INSTANCE_COUNT, description="Number of hosts.")
    instance_groups: list[InstanceGroup] | None = Field(
        None, description="Heterogeneous cluster: named groups instead of instance_type/instance_count."
    )


# `backend` and each backend's own section (`slurm:`), from launcher.config.backend_table.
_JobBackends = with_backends("_JobBackends", _JobHead)


class JobConfig(_JobBackends):
    """A training job, as estimator arguments (Python) or a job file (YAML)."""

    tuning: TuningConfig | None = Field(
        None, description="A hyperparameter sweep of this job (`smlaunch tune`): ranges, objective, strategy, "
                          "limits; docs/tuning.md."
    )
    local_runner: Literal["process", "docker"] = Field(
        "process", description="Local mode: simulated hosts as processes here, or as containers (compose)."
    )
    processes_per_host: WholeNumber | None = Field(
        None, ge=1, le=MAX_PROCESSES_PER_HOST,
        description="Processes per host (default: accelerators per instance; 1 on CPU).",
    )
    volume_size: WholeNumber = Field(30, ge=1, le=16384, description="EBS volume per host, in GB.")
    max_run: WholeNumber = Field(
        24 * 3600, ge=1, le=MAX_RUN_LIMIT, description="Stop the job after this many seconds (<= 28 days)."
    )
    max_wait: WholeNumber | None = Field(
        None, ge=1, description="Spot only: seconds to wait for capacity plus run time (>= max_run)."
    )
    max_restarts: WholeNumber = Field(
        0, ge=0, le=MAX_RESTARTS,
        description="Automatic restarts after a failure (torchrun's name), from the newest verified checkpoint "
                    "(docs/faults.md).",
    )
    min_instance_count: WholeNumber | None = Field(
        None, ge=1, le=MAX_INSTANCE_COUNT,
        description="When a host is lost for good and no spare comes, go on with the hosts left, down to this many, "
                    "from the newest verified checkpoint (local and Slurm; needs max_restarts; docs/faults.md).",
    )
    restart_on_exit_codes: list[Annotated[int, Field(ge=1, le=255)]] = Field(
        default_factory=list, max_length=64,
        description="Exit codes of your own script that always mean 'restart me' (SkyPilot's recover_on_exit_codes): "
                    "restarted without counting against max_restarts (docs/faults.md).",
    )
    hang_timeout: WholeNumber | None = Field(
        None, ge=10, le=7 * 24 * 3600,
        description="A script of your own whose ranks use no CPU and write nothing for this many seconds is hung: "
                    "their stacks are collected and the attempt ends as a hang (restarted under max_restarts; "
                    "docs/own-scripts.md). smlaunch's train.py has its step watchdog (step_timeout).",
    )
    restart_on_job_errors: WholeNumber = Field(
        0, ge=0, le=MAX_RESTARTS,
        description="How many errors of the job itself (its code, configuration or data) are retried, each one of "
                    "the max_restarts restarts (default 0: never; docs/faults.md).",
    )
    trace: bool = Field(
        False,
        description="Before submitting, trace one step of smlaunch's runtime at the job's whole world on a fake "
                    "process group (`smlaunch plan --trace`; needs torch) and refuse the job if the trace fails or "
                    "its traced peak does not fit the accelerator's memory.",
    )
    use_spot_instances: bool = Field(False, description="Managed spot training.")
    checkpoint_s3_uri: str | None = Field(
        None, pattern=r"^s3://[^/]+(/.*)?$", description="S3 prefix synced with checkpoint_local_path."
    )
    checkpoint_local_path: LocalPathText | None = Field(
        None, description=f"Checkpoint directory inside the container (default {DEFAULT_CHECKPOINT_PATH})."
    )
    output_path: LocalPathText | None = Field(
        None, description="Where model.tar.gz/output.tar.gz go (s3://..., or a local path for local runs)."
    )
    code_location: str | None = Field(
        None, pattern=r"^s3://[^/]+(/.*)?$", description="S3 prefix for sourcedir.tar.gz."
    )
    base_job_name: str | None = Field(
        None, pattern=f"^{JOB_NAME_PATTERN.pattern}$", description="Job name prefix; a timestamp is appended."
    )
    hyperparameters: TrainingHyperparameters = Field(
        default_factory=TrainingHyperparameters, description="Arguments for the training script."
    )
    distribution: Distribution | None = Field(None, description="The SageMaker distribution dict.")
    environment: dict[str, Annotated[str, Field(max_length=ENVIRONMENT_VALUE_MAX)]] = Field(
        default_factory=dict, max_length=ENVIRONMENT_MAX,
        description="Environment variables for the training container.",
    )
    tags: Tags = Field(default_factory=list, description=f"AWS tags (at most {TAGS_MAX}).")
    image_uri: str | None = Field(None, description="Training image (default: resolved from versions).")
    framework_version: str | None = Field(
        None, pattern=r"^\d+\.\d+(\.\d+)?$", description="PyTorch version of the AWS image (2.4.1)."
    )
    py_version: str | None = Field(None, pattern=r"^py3\d*$", description="Python of the AWS image (py311).")
    keep_alive_period_in_seconds: WholeNumber | None = Field(
        None, ge=0, le=KEEP_ALIVE_MAX,
        description=f"Seconds SageMaker keeps the instances as a warm pool after the job (0-{KEEP_ALIVE_MAX}).",
    )
    metric_definitions: list[MetricDefinition] | None = Field(
        None, description="Metrics parsed from the logs (default: the smlaunch script's metrics)."
    )
    input_mode: Literal["File", "Pipe", "FastFile"] = Field("File", description="Default channel mode.")
    # --- the rest of the SDK v2 estimator's arguments, sent as the SDK sends them ----------------
    subnets: list[str] | None = Field(None, description="VPC subnet ids (with security_group_ids).")
    security_group_ids: list[str] | None = Field(None, description="VPC security group ids (with subnets).")
    encrypt_inter_container_traffic: bool = Field(False, description="Encrypt traffic between hosts.")
    enable_network_isolation: bool = Field(
        False, description="No network in the container; the code arrives as the 'code' channel."
    )
    max_retry_attempts: WholeNumber | None = Field(
        None, ge=1, le=30, description="Retries after an internal SageMaker error (RetryStrategy)."
    )
    disable_output_compression: bool = Field(False, description="Upload model/output files uncompressed.")
    volume_kms_key: str | None = Field(None, description="KMS key for the hosts' EBS volumes.")
    output_kms_key: str | None = Field(None, description="KMS key for the artifacts and the uploaded code.")
    container_log_level: WholeNumber = Field(20, ge=0, le=50, description="Toolkit log level (logging.INFO).")
    enable_sagemaker_metrics: bool | None = Field(
        None, description="Metrics time series (default: on, as the SDK sets it for PyTorch >= 1.3)."
    )
    tensorboard_output_config: TensorBoardOutputConfig | None = Field(
        None, description="Upload TensorBoard files while the job runs."
    )
    debugger_hook_config: DebuggerHookConfig | bool | None = Field(
        None, description="Debugger hook: false turns it off; default as the SDK decides."
    )
    rules: list[DebuggerRule] | None = Field(None, description="Debugger and profiler rules.")
    profiler_config: ProfilerConfig | None = Field(None, description="Debugger profiler settings.")
    disable_profiler: bool | None = Field(None, description="Turn the Debugger profiler off.")
    git_config: GitConfig | None = Field(None, description="Clone the code from git instead of source_dir.")
    training_repository_access_mode: Literal["Platform", "Vpc"] | None = Field(
        None, description="How the image is pulled (Vpc: a private registry in the VPC)."
    )
    training_repository_credentials_provider_arn: str | None = Field(
        None, description="Lambda that gives private-registry credentials (with access mode Vpc)."
    )
    model_uri: str | None = Field(None, description="S3 model artifacts, mounted as the model channel.")
    model_channel_name: str = Field("model", description="Channel name of model_uri.")
    enable_infra_check: bool | None = Field(None, description="Health checks before training (InfraCheckConfig).")
    container_entry_point: list[str] | None = Field(None, description="Overrides the image's entry point.")
    container_arguments: list[str] | None = Field(None, description="Arguments of that entry point.")
    enable_remote_debug: bool | None = Field(None, description="Allow SSM sessions into the container.")
    enable_session_tag_chaining: bool | None = Field(None, description="Chain the role session's tags.")
    training_plan: str | None = Field(None, description="SageMaker training plan ARN for the capacity.")
    experiment_config: dict[
        Literal["ExperimentName", "TrialName", "TrialComponentDisplayName", "RunName"], str
    ] | None = Field(None, description="SageMaker Experiments association (fit's experiment_config).")
    instance_placement_config: dict[str, JsonValue] | None = Field(
        None, description="ResourceConfig.InstancePlacementConfig, as the API takes it."
    )
    inputs: dict[str, LocalPathText | ChannelInput] | LocalPathText | None = Field(
        None, description="Channels: {name: s3://... or local path}, or one URI (channel 'training')."
    )

    @model_validator(mode="before")
    @classmethod
    def _training_group(cls, data: Any) -> Any:
        """With instance_groups, validation sees the group that trains (the distribution's
        `instance_groups`, else the only or first group) as instance_type x instance_count."""
        if not isinstance(data, dict) or not data.get("instance_groups"):
            return data
        if data.get("instance_type") is not None or data.get("instance_count") is not None:
            raise ValueError("instance_groups replaces instance_type and instance_count; set either "
                             "instance_groups or the two of them, as the SageMaker SDK requires")
        groups = [g if isinstance(g, dict) else g.model_dump() for g in data["instance_groups"]]
        dist = data.get("distribution")
        wanted = dist.get("instance_groups") if isinstance(dist, dict) else None
        name = wanted[0] if wanted else groups[0].get("instance_group_name")
        group = next((g for g in groups if g.get("instance_group_name") == name), None)
        if group is None:
            raise ValueError(f"distribution.instance_groups names {name!r}, which is not one of "
                             f"instance_groups {[g.get('instance_group_name') for g in groups]}")
        return {**data, "instance_type": group.get("instance_type"), "instance_count": group.get("instance_count")}

    @field_validator("environment", mode="before")
    @classmethod
    def _env_strings(cls, value: Any) -> Any:
        # YAML turns `NCCL_IB_TIMEOUT: 22` into an int; SageMaker wants strings.
        if isinstance(value, dict):
            return {k: v if isinstance(v, str) else _scalar_str(v) for k, v in value.items()}
        return value

    @field_validator("environment")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        bad = [k for k in value if not re.fullmatch(rf"[A-Za-z_][A-Za-z0-9_]{{0,{ENVIRONMENT_KEY_MAX - 1}}}", k)]
        if bad:
            raise ValueError(f"invalid variable name(s) {bad}; use letters, digits and '_', "
                             f"at most {ENVIRONMENT_KEY_MAX} characters, not starting with a digit")
        return value

    @field_validator("inputs")
    @classmethod
    def _channel_names(cls, value: Any) -> Any:
        if isinstance(value, dict):
            _check_channel_names(list(value))
        return value

    @field_validator("model_channel_name")
    @classmethod
    def _model_channel_name(cls, value: str) -> str:
        _check_channel_names([value])
        return value

    def channels(self) -> dict[str, ChannelInput]:
        """Inputs as named channels (one bare URI becomes the 'training' channel, as in the SDK)."""
        if self.inputs is None:
            return {}
        raw = {"training": self.inputs} if isinstance(self.inputs, str) else self.inputs
        return {k: v if isinstance(v, ChannelInput) else ChannelInput(s3_data=v) for k, v in raw.items()}

    def tag_list(self) -> list[dict[str, str]]:
        if isinstance(self.tags, dict):
            return [{"Key": k, "Value": v} for k, v in self.tags.items()]
        return [t.model_dump() for t in self.tags]

    @property
    def is_local(self) -> bool:
        """The instance type is this machine's own devices (local: CPU, local_gpu: its GPUs)."""
        return self.instance_type in LOCAL_TYPES

    @property
    def backend_name(self) -> str:
        """The backend that runs the job: the one asked for, else what the instance type implies."""
        return self.backend or default_for(self.is_local).name

    @property
    def restart_policy(self) -> RestartPolicy:
        return RestartPolicy(self.max_restarts, tuple(sorted(set(self.restart_on_exit_codes))),
                             self.restart_on_job_errors, self.hang_timeout or 0)

    @property
    def on_sagemaker(self) -> bool:
        """It is a SageMaker training job (S3 channels and artifacts, an image): its backend's row says so
        (backend_table's sagemaker_jobs); the other backends' jobs use paths."""
        return named(self.backend_name).sagemaker_jobs


class JobFile(JobConfig):
    """A YAML job file: the job plus an optional base file it extends."""

    extends: str | None = Field(None, description="Base job file (relative to this one) merged first.")


def _scalar_str(value: Any) -> Any:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return value
