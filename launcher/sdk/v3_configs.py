"""The SageMaker SDK v3 `ModelTrainer`'s config shapes, by their v3 names and defaults.

They stand for `sagemaker.train.configs` (`sagemaker.core.training.configs`) and
`sagemaker.train.distributed` of sagemaker-train 1.27 (the same classes are
`sagemaker.modules.configs` / `sagemaker.modules.distributed` in SDK v2, e.g. 2.257). Values are only
typed here; what they may hold (degrees against the instance, URIs, limits) is decided by the
estimator `launcher.sdk.model_trainer.ModelTrainer` builds from them, whose errors are named back in
these shapes' terms. An unknown field is an error with a did-you-mean, as everywhere in smlaunch.

`as_shape` takes ours, a dict, or the official SDK's pydantic object of the same name (read field
by field, as `launcher.sdk.estimator` reads the SDK v2's TrainingInput through `.config`).
"""

from __future__ import annotations

from dataclasses import replace
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

from pydantic import Discriminator, Field, ValidationError
from pydantic import Tag as UnionTag

from launcher.config import safe_yaml
from launcher.config.aws_settings import InstanceGroup
from launcher.config.validate import issue_from_pydantic
from launcher.wire.training.base import JsonValue, Strict, WholeNumber
from launcher.wire.training.degrees import model_with_degrees
from launcher.wire.training.issues import ConfigError, Issue

# sagemaker.core.training.configs.SourceCode.ignore_patterns
DEFAULT_IGNORE_PATTERNS = [".env", ".git", "__pycache__", ".DS_Store", ".cache", ".ipynb_checkpoints"]


class Mode(str, Enum):
    """sagemaker.train.model_trainer.Mode."""

    LOCAL_CONTAINER = "LOCAL_CONTAINER"
    SAGEMAKER_TRAINING_JOB = "SAGEMAKER_TRAINING_JOB"


# Union members pydantic names in an error's location; no field of these shapes has such a name.
UNION_TAGS = ("str", "S3DataSource")


def _issues(cls: type, exc: ValidationError, where: str) -> list[Issue]:
    """`exc`'s errors as issues under `where`. pydantic builds a nested shape through its own
    __init__, so a nested shape's errors arrive as one ConfigError: its issues are moved under
    the nesting field."""
    out = []
    for err in exc.errors(include_url=False):
        loc = tuple(p for p in err["loc"] if p not in UNION_TAGS)
        at = where + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)
        inner = err.get("ctx", {}).get("error")
        if isinstance(inner, ConfigError):
            out += [replace(i, path=at + i.path[len(i.path.split(".")[0]):]) for i in inner.issues]
        else:
            out.append(replace(issue_from_pydantic(cls, {**err, "loc": loc}), path=at))
    return out


class V3Config(Strict):
    """A v3 shape: constructing one with a wrong field raises ConfigError naming `Class.field`."""

    def __init__(self, **data: Any):
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise ConfigError(_issues(type(self), exc, type(self).__name__)) from None


class SourceCode(V3Config):
    source_dir: str | None = Field(None, description="Local directory shipped as the job's code.")
    requirements: str | None = Field(
        None, description="requirements.txt at the top of source_dir (the image's toolkit installs it)."
    )
    entry_script: str | None = Field(None, description="The training script, relative to source_dir.")
    command: str | None = Field(None, description="Refused: a shell command needs the SDK v3's driver scripts.")
    args: list[str | int | float] | None = Field(None, description="Refused: the arguments of `command`.")
    ignore_patterns: list[str] | None = Field(
        default_factory=lambda: list(DEFAULT_IGNORE_PATTERNS),
        description="fnmatch patterns left out of the code archive (added to smlaunch's defaults).",
    )


class Compute(V3Config):
    instance_type: str | None = Field(None, description="ml.p5.48xlarge, ..., or local / local_cpu / local_gpu.")
    instance_count: WholeNumber | None = Field(None, description="Number of hosts (default 1).")
    volume_size_in_gb: WholeNumber | None = Field(30, description="EBS volume per host, in GB.")
    volume_kms_key_id: str | None = Field(None, description="KMS key for the hosts' volumes.")
    keep_alive_period_in_seconds: WholeNumber | None = Field(None, description="Warm pool keep-alive.")
    instance_groups: list[InstanceGroup] | None = Field(None, description="Heterogeneous cluster.")
    training_plan_arn: str | None = Field(None, description="SageMaker training plan for the capacity.")
    instance_placement_config: dict[str, JsonValue] | None = Field(
        None, description="UltraServer placement (enable_multiple_jobs, placement_specifications)."
    )
    instance_preferences: list[JsonValue] | None = Field(None, description="Refused: one instance type is validated.")
    enable_managed_spot_training: bool | None = Field(None, description="Managed spot training.")


class Networking(V3Config):
    security_group_ids: list[str] | None = Field(None, description="VPC security group ids.")
    subnets: list[str] | None = Field(None, description="VPC subnet ids.")
    enable_network_isolation: bool | None = Field(None, description="No network in the container.")
    enable_inter_container_traffic_encryption: bool | None = Field(None, description="Encrypt traffic between hosts.")


class StoppingCondition(V3Config):
    max_runtime_in_seconds: WholeNumber | None = Field(None, description="Stop after this many seconds (default 3600).")
    max_wait_time_in_seconds: WholeNumber | None = Field(None, description="Spot: capacity wait plus run time.")
    max_pending_time_in_seconds: WholeNumber | None = Field(None, description="Refused: not in the SDK v2 contract.")


class OutputDataConfig(V3Config):
    s3_output_path: str | None = Field(None, description="Where model.tar.gz and output.tar.gz go.")
    kms_key_id: str | None = Field(None, description="KMS key for the artifacts and the uploaded code.")
    compression_type: str | None = Field(None, description="GZIP (the default) or NONE.")


class CheckpointConfig(V3Config):
    s3_uri: str | None = Field(None, description="S3 prefix kept in sync with local_path (required here).")
    local_path: str | None = Field("/opt/ml/checkpoints", description="Checkpoint directory in the container.")


class TrainingRepositoryAuthConfig(V3Config):
    training_repository_credentials_provider_arn: str = Field(description="Lambda giving registry credentials.")


class TrainingImageConfig(V3Config):
    training_repository_access_mode: str = Field(description="Platform, or Vpc for a registry in the VPC.")
    training_repository_auth_config: TrainingRepositoryAuthConfig | None = Field(
        None, description="Registry credentials.")


class Tag(V3Config):
    key: str = Field(description="Tag key.")
    value: str = Field(description="Tag value.")


class S3DataSource(V3Config):
    s3_data_type: str = Field(description="S3Prefix, ManifestFile or AugmentedManifestFile.")
    s3_uri: str = Field(description="s3://bucket/prefix.")
    s3_data_distribution_type: str | None = Field(None, description="FullyReplicated or ShardedByS3Key.")
    attribute_names: list[str] | None = Field(None, description="Refused: augmented manifest attributes.")
    instance_group_names: list[str] | None = Field(None, description="Refused: per-group channels.")


class InputData(V3Config):
    channel_name: str = Field(description="The channel: /opt/ml/input/data/<channel_name> in the container.")
    data_source: Annotated[
        Annotated[str, UnionTag("str")] | Annotated[S3DataSource, UnionTag("S3DataSource")],
        Discriminator(lambda v: "str" if isinstance(v, str) else "S3DataSource"),
    ] = Field(description="s3:// URI, local path (local mode) or S3DataSource.")
    content_type: str | None = Field(None, description="MIME type passed to the container.")


class SMP(model_with_degrees("_SMPDegrees", V3Config, "smp_v3", kind=WholeNumber, optional=True)):
    """SageMaker model parallelism v2's parameters (the SDK v3 checks none of them; smlaunch checks
    all of them against the instance and the model); the degrees come from launcher.wire.training.degrees."""

    sm_activation_offloading: bool | None = Field(None, description="Offload checkpointed activations.")
    activation_loading_horizon: WholeNumber | None = Field(None, description="Offloaded layers on the GPU at once.")
    fsdp_cache_flush_warnings: bool | None = Field(None, description="Warn on CUDA cache flushes.")
    allow_empty_shards: bool | None = Field(None, description="Allow uneven shards.")
    random_seed: WholeNumber | None = Field(None, description="Seed for tensor/expert-parallel random ops.")


class Torchrun(V3Config):
    process_count_per_node: WholeNumber | None = Field(None, description="Processes per host (default: GPUs).")
    smp: SMP | None = Field(None, description="SageMaker model parallelism v2.")


class MPI(V3Config):
    process_count_per_node: WholeNumber | None = Field(None, description="Processes per host (default: GPUs).")
    mpi_additional_options: list[str] | None = Field(None, description="Extra mpirun options.")


def _unset(value: Any) -> bool:
    return value is None or type(value).__name__ == "Unassigned"  # sagemaker-core's "not given"


def plain(value: Any) -> Any:
    """An SDK object's settings as plain data, field by field (its model_dump() would turn
    sagemaker-core's Unassigned() into {}), without the fields it leaves unset."""
    fields = getattr(type(value), "model_fields", None)
    if fields is not None and hasattr(value, "model_dump"):
        value = {name: getattr(value, name, None) for name in fields}
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items() if not _unset(v)}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def as_shape(value: Any, classes: tuple[type[V3Config], ...], where: str) -> tuple[V3Config | None, list[Issue]]:
    """`value` as one of `classes`: ours as it is, a dict (for the first class), or the official
    SDK's object whose class has the same name."""
    if value is None or isinstance(value, classes):
        return value, []
    names = " or ".join(c.__name__ for c in classes)
    if isinstance(value, dict):
        cls = classes[0] if len(classes) == 1 else None
    else:
        cls = next((c for c in classes if c.__name__ == type(value).__name__ and hasattr(value, "model_dump")), None)
    if cls is None:
        return None, [Issue(where, value, f"is of type {type(value).__name__}, not {names}",
                            f"pass {names}(...) from launcher.sdk.model_trainer (or the SageMaker SDK's own)")]
    try:
        return cls.model_validate(plain(value)), []
    except ValidationError as exc:
        return None, _issues(cls, exc, where)


def channels(values: list | None, where: str) -> tuple[list[InputData] | None, list[Issue]]:
    """InputData (ours, the SDK's, or dicts), each channel named once."""
    if values is None:
        return None, []
    if not isinstance(values, (list, tuple)):
        return None, [Issue(where, values, f"is of type {type(values).__name__}, not a list of InputData",
                            "pass [InputData(channel_name=..., data_source=...), ...]")]
    out, issues, seen = [], [], set()
    for i, value in enumerate(values):
        source = getattr(value, "data_source", None)
        kind = type(source).__name__
        if kind in ("FileSystemDataSource", "DatasetSource"):
            issues.append(Issue(f"{where}[{i}].data_source", kind, "EFS/FSx file systems and SageMaker datasets "
                                "are not channels smlaunch sends", "copy the data to S3 and give its s3:// URI"))
            continue
        channel, found = as_shape(value, (InputData,), f"{where}[{i}]")
        issues += found
        if channel is not None and channel.channel_name in seen:
            issues.append(Issue(f"{where}[{i}].channel_name", channel.channel_name, "names a channel a second time",
                                "give each channel its own name"))
        elif channel is not None:
            seen.add(channel.channel_name)
            out.append(channel)
    return out, issues


def hyperparameters(value: Any) -> tuple[dict, list[Issue]]:
    """A dict, or a JSON/YAML file of one (as the SDK v3 reads it)."""
    if value is None or isinstance(value, dict):
        return dict(value or {}), []
    if not isinstance(value, str):
        return {}, [Issue("hyperparameters", value, f"is of type {type(value).__name__}, not a dict or a file path",
                          "pass a dict, or the path of a JSON/YAML file holding one")]
    try:
        data = safe_yaml.loads(Path(value).read_text())
    except OSError as exc:
        return {}, [Issue("hyperparameters", value, f"cannot be read ({exc.strerror})", "give an existing file")]
    except safe_yaml.YamlProblem as exc:
        return {}, [Issue("hyperparameters", value, exc.problem, exc.fix)]
    if not isinstance(data, dict):
        return {}, [Issue("hyperparameters", value, "does not hold a mapping", "write name: value lines")]
    return data, []


def tags(values: list | None) -> tuple[list[dict] | None, list[Issue]]:
    """Tag objects (or {key, value} dicts) as the estimator's [{Key, Value}]."""
    if values is None:
        return None, []
    out, issues = [], []
    for i, value in enumerate(values):
        tag, found = as_shape(value, (Tag,), f"tags[{i}]")
        issues += found
        if tag is not None:
            out.append({"Key": tag.key, "Value": tag.value})
    return out, issues


def estimator_inputs(given: list[InputData] | None) -> dict[str, dict] | None:
    """Channels as the estimator's inputs. A URI or path channel gets InputMode File, as the SDK v3
    writes it; an S3DataSource channel is sent as given."""
    if not given:
        return None
    out = {}
    for channel in given:
        source = channel.data_source
        if isinstance(source, str):
            entry = {"s3_data": source, "input_mode": "File"}
        else:
            entry = {"s3_data": source.s3_uri, "s3_data_type": source.s3_data_type}
            if source.s3_data_distribution_type is not None:
                entry["distribution"] = source.s3_data_distribution_type
        if channel.content_type is not None:
            entry["content_type"] = channel.content_type
        out[channel.channel_name] = entry
    return out


def repository(image: str) -> str:
    """sagemaker.train.utils._get_repo_name_from_image: the default base_job_name's stem."""
    return image.split("/")[-1].split(":")[0].split("@")[0]

