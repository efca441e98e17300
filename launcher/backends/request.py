"""The CreateTrainingJob request for a validated job, field by field as the SDK v2 sends it.

Sources (SageMaker Python SDK 2.257.7): `sagemaker.session.Session._get_train_request`,
`sagemaker.job._Job._load_config` (output, resource, stopping, VPC, model and code channels),
`sagemaker.estimator._TrainingJob._get_train_args` and `sagemaker.pytorch.PyTorch` (metrics time
series on for PyTorch >= 1.3). tests/integration/test_sdk_parity.py compares the two requests field by field;
the differences are intended and listed in docs/sagemaker-request.md. `max_restarts`, which the SDK
lacks, changes three hyperparameters (launcher.wire.restart_loop) and nothing else.
"""

from __future__ import annotations

from typing import Any

from launcher.backends.sourcedir import RESTART_LOOP_PROGRAM, program_name, uses_restart_loop
from launcher.config import ValidatedJob
from launcher.config.debugger import debugger_fields, profiler_fields
from launcher.config.images import job_image
from launcher.config.sent_hyperparameters import job_hyperparameters
from launcher.wire import hyperparameters as wire
from launcher.wire import restart_loop
from launcher.wire.metric_lines import DEFAULT_METRIC_DEFINITIONS

# Where the container finds the code when network isolation delivers it as the `code` channel
# (sagemaker.estimator.EstimatorBase.CONTAINER_CODE_CHANNEL_SOURCEDIR_PATH).
CODE_CHANNEL = "code"
CODE_CHANNEL_ARCHIVE = "/opt/ml/input/data/code/sourcedir.tar.gz"
MODEL_CONTENT_TYPE = "application/x-sagemaker-model"


def build_request(job: ValidatedJob, *, job_name: str, region: str, source_uri: str, output_path: str) -> dict:
    cfg = job.config
    instance_type = job.instance.name if job.instance else cfg.instance_type
    submit_directory = CODE_CHANNEL_ARCHIVE if cfg.enable_network_isolation else source_uri
    hyperparameters = job_hyperparameters(cfg, instance_type=instance_type, program=program_name(cfg),
                                               submit_directory=submit_directory, job_name=job_name,
                                               region=region)
    if uses_restart_loop(cfg):  # the one difference max_restarts makes (launcher.wire.restart_loop)
        hyperparameters = restart_loop.loop_hyperparameters(hyperparameters, cfg.restart_policy, RESTART_LOOP_PROGRAM)
    request: dict[str, Any] = {
        "TrainingJobName": job_name,
        "AlgorithmSpecification": _algorithm(job, instance_type, region),
        "RoleArn": cfg.role,
        "OutputDataConfig": _output(cfg, output_path),
        "ResourceConfig": _resources(cfg, instance_type),
        "StoppingCondition": _stopping(cfg),
        "HyperParameters": wire.encode(hyperparameters),
    }
    channels = _channels(cfg, source_uri)
    if channels:
        request["InputDataConfig"] = channels
    optional = {
        "Environment": dict(cfg.environment) if cfg.environment else None,
        "Tags": cfg.tag_list() or None,
        "VpcConfig": {"Subnets": cfg.subnets, "SecurityGroupIds": cfg.security_group_ids}
        if cfg.subnets and cfg.security_group_ids else None,
        "ExperimentConfig": dict(cfg.experiment_config) if cfg.experiment_config else None,
        "EnableNetworkIsolation": True if cfg.enable_network_isolation else None,
        "EnableInterContainerTrafficEncryption": True if cfg.encrypt_inter_container_traffic else None,
        "EnableManagedSpotTraining": True if cfg.use_spot_instances else None,
        "CheckpointConfig": _checkpoint(cfg),
        "TensorBoardOutputConfig": tensorboard_config(cfg),
        "RetryStrategy": {"MaximumRetryAttempts": cfg.max_retry_attempts}
        if cfg.max_retry_attempts is not None else None,
        "InfraCheckConfig": {"EnableInfraCheck": cfg.enable_infra_check}
        if cfg.enable_infra_check is not None else None,
        "RemoteDebugConfig": {"EnableRemoteDebug": cfg.enable_remote_debug}
        if cfg.enable_remote_debug is not None else None,
        "SessionChainingConfig": {"EnableSessionTagChaining": cfg.enable_session_tag_chaining}
        if cfg.enable_session_tag_chaining is not None else None,
    }
    request.update({k: v for k, v in optional.items() if v is not None})
    request.update(debugger_fields(cfg, region=region, output_path=output_path))
    request.update(profiler_fields(cfg, region=region, output_path=output_path))
    return request


def _algorithm(job: ValidatedJob, instance_type: str, region: str) -> dict[str, Any]:
    cfg = job.config
    spec: dict[str, Any] = {"TrainingImage": job_image(cfg, instance_type, region),
                            "TrainingInputMode": cfg.input_mode}
    # smlaunch's own metric definitions are the one intended addition, and only for its runtime,
    # whose log lines they match.
    if cfg.metric_definitions is not None:
        spec["MetricDefinitions"] = [m.model_dump() for m in cfg.metric_definitions]
    elif job.kind.runtime:
        spec["MetricDefinitions"] = DEFAULT_METRIC_DEFINITIONS
    metrics = _metrics_time_series(cfg)
    if metrics is not None:
        spec["EnableSageMakerMetricsTimeSeries"] = metrics
    if cfg.training_repository_access_mode is not None:
        image_config: dict[str, Any] = {"TrainingRepositoryAccessMode": cfg.training_repository_access_mode}
        if cfg.training_repository_credentials_provider_arn is not None:
            image_config["TrainingRepositoryAuthConfig"] = {
                "TrainingRepositoryCredentialsProviderArn": cfg.training_repository_credentials_provider_arn}
        spec["TrainingImageConfig"] = image_config
    if cfg.container_entry_point is not None:
        spec["ContainerEntrypoint"] = list(cfg.container_entry_point)
    if cfg.container_arguments is not None:
        spec["ContainerArguments"] = list(cfg.container_arguments)
    return spec


def _metrics_time_series(cfg) -> bool | None:
    """sagemaker.pytorch.PyTorch turns it on for framework_version >= 1.3; an image_uri without a
    framework_version leaves it unset. A job naming neither runs smlaunch's default DLC (>= 2)."""
    if cfg.enable_sagemaker_metrics is not None:
        return cfg.enable_sagemaker_metrics
    if cfg.framework_version is None:
        return None if cfg.image_uri else True
    major, minor = (int(p) for p in cfg.framework_version.split(".")[:2])
    return True if (major, minor) >= (1, 3) else None


def _output(cfg, output_path: str) -> dict[str, Any]:
    out: dict[str, Any] = {"S3OutputPath": output_path}
    if cfg.output_kms_key is not None:
        out["KmsKeyId"] = cfg.output_kms_key
    if cfg.disable_output_compression:
        out["CompressionType"] = "NONE"
    return out


def _resources(cfg, instance_type: str) -> dict[str, Any]:
    out: dict[str, Any] = {"VolumeSizeInGB": cfg.volume_size}
    if cfg.volume_kms_key is not None:
        out["VolumeKmsKeyId"] = cfg.volume_kms_key
    if cfg.keep_alive_period_in_seconds is not None:
        out["KeepAlivePeriodInSeconds"] = cfg.keep_alive_period_in_seconds
    if cfg.instance_groups:
        out["InstanceGroups"] = [{"InstanceGroupName": g.instance_group_name, "InstanceType": g.instance_type,
                                  "InstanceCount": g.instance_count} for g in cfg.instance_groups]
    else:
        out.update(InstanceCount=cfg.instance_count, InstanceType=instance_type)
    if cfg.training_plan is not None:
        out["TrainingPlanArn"] = cfg.training_plan
    if cfg.instance_placement_config is not None:
        out["InstancePlacementConfig"] = cfg.instance_placement_config
    return out


def _stopping(cfg) -> dict[str, Any]:
    out: dict[str, Any] = {"MaxRuntimeInSeconds": cfg.max_run}
    # The SDK sends MaxWaitTimeInSeconds only when max_wait is set, and CreateTrainingJob then
    # refuses a spot job without it; smlaunch fills in max_run (docs/sagemaker-request.md).
    if cfg.use_spot_instances:
        out["MaxWaitTimeInSeconds"] = cfg.max_wait or cfg.max_run
    return out


def _channel(name: str, uri: str, *, data_type: str = "S3Prefix", distribution: str = "FullyReplicated",
             content_type: str | None = None, input_mode: str | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"ChannelName": name, "DataSource": {"S3DataSource": {
        "S3DataType": data_type, "S3Uri": uri, "S3DataDistributionType": distribution}}}
    if content_type:
        entry["ContentType"] = content_type
    if input_mode:
        entry["InputMode"] = input_mode
    return entry


def _channels(cfg, source_uri: str) -> list[dict[str, Any]]:
    out = [_channel(name, ch.s3_data, data_type=ch.s3_data_type, distribution=ch.distribution,
                    content_type=ch.content_type, input_mode=ch.input_mode)
           for name, ch in cfg.channels().items()]
    if cfg.model_uri:
        out.append(_channel(cfg.model_channel_name, cfg.model_uri, content_type=MODEL_CONTENT_TYPE,
                            input_mode="File"))
    if cfg.enable_network_isolation:
        out.append(_channel(CODE_CHANNEL, source_uri))
    return out


def _checkpoint(cfg) -> dict[str, Any] | None:
    if not cfg.checkpoint_s3_uri:
        return None
    out = {"S3Uri": cfg.checkpoint_s3_uri}
    if cfg.checkpoint_local_path:
        out["LocalPath"] = cfg.checkpoint_local_path
    return out


def tensorboard_config(cfg) -> dict[str, Any] | None:
    """TensorBoardOutputConfig as sent; local mode hands the same to the container."""
    tb = cfg.tensorboard_output_config
    if tb is None:
        return None
    out = {"S3OutputPath": tb.s3_output_path}
    if tb.container_local_output_path is not None:
        out["LocalPath"] = tb.container_local_output_path
    return out
