"""The SageMaker SDK v2 estimator's nested settings, as plain fields a job file can hold.

Each model takes the constructor arguments of the SDK class it stands for (`sagemaker.debugger.
DebuggerHookConfig`, `CollectionConfig`, `Rule`/`ProfilerRule`, `ProfilerConfig`,
`TensorBoardOutputConfig`, `sagemaker.instance_group.InstanceGroup`, the `git_config` dict);
`launcher.sdk.sdk_objects` turns the SDK's objects into these, and `launcher.backends.request` writes
them into CreateTrainingJob as the SDK does (docs/sagemaker-request.md).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from launcher.wire.training.base import MAX_INSTANCE_COUNT, Strict, WholeNumber

S3_URI = r"^s3://[^/]+(/.*)?$"


class CollectionConfig(Strict):
    name: str = Field(min_length=1, description="Tensor collection (weights, gradients, losses, ...).")
    parameters: dict[str, str] | None = Field(None, description="Collection parameters (save_interval, ...).")


class DebuggerHookConfig(Strict):
    s3_output_path: str | None = Field(None, pattern=S3_URI, description="Where tensors go (default: output_path).")
    container_local_output_path: str | None = Field(None, description="Tensor directory inside the container.")
    hook_parameters: dict[str, str] | None = Field(None, description="smdebug hook parameters.")
    collection_configs: list[CollectionConfig] | None = Field(None, description="Tensor collections to save.")


class DebuggerRule(Strict):
    """A Debugger or profiler rule (the SDK's `Rule.sagemaker(...)`, `Rule.custom(...)`,
    `ProfilerRule.sagemaker(...)`): `image_uri` None means AWS's rule evaluator in the job's region."""

    kind: Literal["debugger", "profiler"] = Field("debugger", description="Debugger rule or profiler rule.")
    name: str = Field(min_length=1, description="RuleConfigurationName.")
    image_uri: str | None = Field(None, description="Rule evaluator image (default: AWS's built-in one).")
    instance_type: str | None = Field(None, description="Custom rules: instance that evaluates the rule.")
    volume_size_in_gb: WholeNumber | None = Field(None, ge=1, description="Custom rules: volume of that instance.")
    container_local_output_path: str | None = Field(None, description="Rule output inside its container.")
    s3_output_path: str | None = Field(None, pattern=S3_URI, description="Where rule output goes.")
    rule_parameters: dict[str, str] = Field(default_factory=dict, description="RuleParameters.")
    collection_configs: list[CollectionConfig] = Field(
        default_factory=list, description="Collections the rule needs the hook to save."
    )


class ProfilerConfig(Strict):
    s3_output_path: str | None = Field(None, pattern=S3_URI, description="Where profiles go (default: output_path).")
    system_monitor_interval_millis: Literal[100, 200, 500, 1000, 5000, 60000] | None = Field(
        None, description="System metrics sampling interval."
    )
    disable_profiler: bool = Field(False, description="Turn the profiler off.")


class TensorBoardOutputConfig(Strict):
    s3_output_path: str = Field(pattern=S3_URI, description="Where TensorBoard files are uploaded.")
    container_local_output_path: str | None = Field(
        None, description="Directory the script writes them to (default /opt/ml/output/tensorboard)."
    )


class InstanceGroup(Strict):
    """One group of a heterogeneous cluster."""

    instance_group_name: str = Field(min_length=1, max_length=64, pattern=r"^.+$", description="Group name.")
    instance_type: str = Field(description="Instance type of the group.")
    instance_count: WholeNumber = Field(ge=1, le=MAX_INSTANCE_COUNT, description="Hosts in the group.")


class GitConfig(Strict):
    """Where the code comes from instead of a local source_dir (cloned before packing)."""

    repo: str = Field(min_length=1, description="Repository URL (https://..., git@..., or a local path).")
    branch: str | None = Field(None, description="Branch to check out (default: the remote's HEAD).")
    commit: str | None = Field(None, description="Commit to check out.")
    token: str | None = Field(None, description="HTTPS token (GitHub personal access token, ...).")
    username: str | None = Field(None, description="HTTPS user name.")
    password: str | None = Field(None, description="HTTPS password.")
    two_factor: bool = Field(False, alias="2FA_enabled", description="Account uses two-factor authentication.")

    @model_validator(mode="after")
    def _credentials(self) -> GitConfig:
        if self.password is not None and self.username is None:
            raise ValueError("password needs username; or use token")
        return self
