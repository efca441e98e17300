"""The SageMaker SDK v2's objects, given to `launcher.PyTorch`, as the plain settings of a job file.

Code written for `sagemaker.pytorch.PyTorch` passes `DebuggerHookConfig`, `Rule`, `ProfilerConfig`,
`TensorBoardOutputConfig`, `InstanceGroup` and `TrainingInput` objects. They are read by their
attributes (the SDK need not be installed for dicts), so what the estimator validates and sends is
what a job file would hold (launcher.config.aws_settings).
"""

from __future__ import annotations

from typing import Any

from launcher.wire.training.issues import ConfigError, Issue


def _attrs(obj: Any, names: tuple[str, ...]) -> dict[str, Any]:
    return {n: getattr(obj, n) for n in names if getattr(obj, n, None) is not None}


def _collections(configs: Any) -> list[dict] | None:
    if configs is None:
        return None
    return [c if isinstance(c, dict) else _attrs(c, ("name", "parameters")) for c in configs]


def hook_config(value: Any) -> Any:
    if value is None or isinstance(value, (bool, dict)):
        return value
    out = _attrs(value, ("s3_output_path", "container_local_output_path", "hook_parameters"))
    collections = _collections(getattr(value, "collection_configs", None))
    if collections is not None:
        out["collection_configs"] = collections
    return out


def rule(value: Any) -> Any:
    """A `Rule`/`ProfilerRule` (or a dict). Rule actions (StopTraining, Email, SMS) are refused:
    they need the job name the SDK writes into them at fit time."""
    if isinstance(value, dict):
        return value
    if getattr(value, "actions", None) is not None:
        raise ConfigError([Issue("rules", getattr(value, "name", value),
                                 "rule actions (StopTraining, Email, SMS) are not supported by smlaunch",
                                 "create the rule without actions and watch it with `smlaunch logs`")])
    out = _attrs(value, ("name", "instance_type", "volume_size_in_gb", "container_local_output_path",
                         "s3_output_path"))
    out["kind"] = "profiler" if type(value).__name__ == "ProfilerRule" else "debugger"
    image = getattr(value, "image_uri", None)
    if image and image != "DEFAULT_RULE_EVALUATOR_IMAGE":
        out["image_uri"] = image
    params = dict(getattr(value, "rule_parameters", None) or {})
    params.pop("action_json", None)  # the SDK drops it too when a rule has no actions
    out["rule_parameters"] = params
    out["collection_configs"] = _collections(getattr(value, "collection_configs", None)) or []
    return out


def profiler_config(value: Any) -> Any:
    if value is None or isinstance(value, dict):
        return value
    if getattr(value, "framework_profile_params", None) is not None:
        raise ConfigError([Issue("profiler_config.framework_profile_params", "set",
                                 "framework profiling was removed from SageMaker Debugger (PyTorch > 2.0 "
                                 "images have no hook for it)",
                                 "drop framework_profile_params; use the PyTorch profiler in the script")])
    if getattr(value, "profile_params", None) is not None:
        raise ConfigError([Issue("profiler_config.profile_params", "set",
                                 "SageMaker Profiler (profile_params) is not supported by smlaunch",
                                 "drop profile_params, or submit this job with the SageMaker SDK")])
    return _attrs(value, ("s3_output_path", "system_monitor_interval_millis", "disable_profiler"))


def tensorboard_config(value: Any) -> Any:
    if value is None or isinstance(value, dict):
        return value
    return _attrs(value, ("s3_output_path", "container_local_output_path"))


def instance_group(value: Any) -> Any:
    if isinstance(value, (dict, str)):
        return value
    return _attrs(value, ("instance_group_name", "instance_type", "instance_count"))


def distribution(value: Any) -> Any:
    """`distribution["instance_groups"]` holds InstanceGroup objects in SDK code; the request
    carries their names."""
    if not isinstance(value, dict) or "instance_groups" not in value:
        return value
    groups = [g if isinstance(g, str) else instance_group(g).get("instance_group_name")
              for g in value["instance_groups"] or []]
    return {**value, "instance_groups": groups}


CONVERTERS = {
    "debugger_hook_config": hook_config,
    "rules": lambda values: None if values is None else [rule(v) for v in values],
    "profiler_config": profiler_config,
    "tensorboard_output_config": tensorboard_config,
    "instance_groups": lambda values: None if values is None else [instance_group(v) for v in values],
    "distribution": distribution,
}


def plain(args: dict[str, Any]) -> dict[str, Any]:
    """The estimator's arguments with every SDK object replaced by its settings."""
    return {k: CONVERTERS[k](v) if k in CONVERTERS else v for k, v in args.items()}
