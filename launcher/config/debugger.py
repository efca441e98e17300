"""SageMaker Debugger and profiler parts of CreateTrainingJob, decided as the SDK v2 decides them.

Sources (SageMaker Python SDK 2.257.7): `EstimatorBase._prepare_rules`,
`_prepare_debugger_for_training`, `_validate_and_set_debugger_configs` and
`_prepare_profiler_for_training` in `sagemaker/estimator.py`, `Framework.
_validate_and_set_debugger_configs` (the hook is turned off when checkpoints go to S3 from a
given local path), `DEBUGGER_UNSUPPORTED_REGIONS`/`PROFILER_UNSUPPORTED_REGIONS` in
`sagemaker/fw_utils.py`, and the rule evaluator images of `image_uri_config/debugger.json`.
In short: unless the job says otherwise, the SDK asks for a Debugger hook writing to output_path
and for system profiling, in every region that supports them.
"""

from __future__ import annotations

from typing import Any

from launcher.config.aws_settings import DebuggerHookConfig, DebuggerRule, ProfilerConfig

UNSUPPORTED_REGIONS = frozenset({
    "us-iso-east-1", "us-isob-east-1", "ap-southeast-3", "ap-southeast-4", "eu-south-2",
    "me-central-1", "ap-south-2", "eu-central-2", "us-gov-east-1",
})  # fmt: skip  (the two tuples are the same in 2.257.7)

# debugger.json: the built-in rule evaluator, <account>.dkr.ecr.<region>/sagemaker-debugger-rules:latest
RULE_EVALUATOR_ACCOUNTS = {
    "af-south-1": "314341159256", "ap-east-1": "199566480951", "ap-northeast-1": "430734990657",
    "ap-northeast-2": "578805364391", "ap-northeast-3": "479947661362", "ap-south-1": "904829902805",
    "ap-southeast-1": "972752614525", "ap-southeast-2": "184798709955", "ca-central-1": "519511493484",
    "cn-north-1": "618459771430", "cn-northwest-1": "658757709296", "eu-central-1": "482524230118",
    "eu-north-1": "314864569078", "eu-south-1": "563282790590", "eu-west-1": "929884845733",
    "eu-west-2": "250201462417", "eu-west-3": "447278800020", "me-south-1": "986000313247",
    "sa-east-1": "818342061345", "us-east-1": "503895931360", "us-east-2": "915447279597",
    "us-gov-west-1": "515509971035", "us-west-1": "685455198987", "us-west-2": "895741380848",
}  # fmt: skip


class DebuggerSettingError(ValueError):
    def __init__(self, field: str, value: Any, problem: str, fix: str):
        super().__init__(f"{field}: {problem}")
        self.field, self.value, self.problem, self.fix = field, value, problem, fix


def rule_evaluator_image(region: str) -> str:
    if region not in RULE_EVALUATOR_ACCOUNTS:
        raise DebuggerSettingError("rules", region, f"region {region} has no built-in Debugger rule evaluator",
                                   "give each rule its own image_uri, or drop the rules")
    domain = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"
    return f"{RULE_EVALUATOR_ACCOUNTS[region]}.dkr.ecr.{region}.{domain}/sagemaker-debugger-rules:latest"


def _rule_dict(rule: DebuggerRule, region: str) -> dict[str, Any]:
    out: dict[str, Any] = {"RuleConfigurationName": rule.name,
                           "RuleEvaluatorImage": rule.image_uri or rule_evaluator_image(region)}
    if rule.image_uri:  # a built-in rule runs where AWS puts it: no instance settings
        if rule.instance_type:
            out["InstanceType"] = rule.instance_type
        if rule.volume_size_in_gb:
            out["VolumeSizeInGB"] = rule.volume_size_in_gb
    if rule.container_local_output_path:
        out["LocalPath"] = rule.container_local_output_path
    if rule.s3_output_path:
        out["S3OutputPath"] = rule.s3_output_path
    if rule.rule_parameters:
        out["RuleParameters"] = dict(rule.rule_parameters)
    return out


def _collection_dicts(configs) -> list[dict[str, Any]]:
    unique = {(c.name, tuple(sorted((c.parameters or {}).items()))): c for c in configs}
    out = []
    for key in sorted(unique):
        c = unique[key]
        out.append({"CollectionName": c.name, **({"CollectionParameters": dict(c.parameters)}
                                                   if c.parameters is not None else {})})
    return out


def debugger_fields(cfg, *, region: str, output_path: str) -> dict[str, Any]:
    """DebugHookConfig and DebugRuleConfigurations for a job (cfg: JobConfig)."""
    rules = [r for r in cfg.rules or [] if r.kind == "debugger"]
    hook = cfg.debugger_hook_config
    if hook is True:
        hook = None  # "on" is the default the SDK picks anyway
    if rules and hook is None:
        hook = DebuggerHookConfig(s3_output_path=output_path)
    out: dict[str, Any] = {}
    if rules:
        out["DebugRuleConfigurations"] = [_rule_dict(r, region) for r in rules]
    if region in UNSUPPORTED_REGIONS:
        if hook:
            raise DebuggerSettingError("debugger_hook_config", region, f"region {region} has no SageMaker Debugger",
                                       "set debugger_hook_config: false, or pick another region")
        return out
    if hook is None:
        hook = DebuggerHookConfig(s3_output_path=output_path)
    if hook is False:
        return out
    # sagemaker.estimator.Framework: no hook when checkpoints sync from an explicit local path.
    if cfg.checkpoint_s3_uri and cfg.checkpoint_local_path:
        return out
    request: dict[str, Any] = {"S3OutputPath": hook.s3_output_path or output_path}
    if hook.container_local_output_path is not None:
        request["LocalPath"] = hook.container_local_output_path
    if hook.hook_parameters is not None:
        request["HookParameters"] = dict(hook.hook_parameters)
    collections = [c for r in rules for c in r.collection_configs] + list(hook.collection_configs or [])
    request["CollectionConfigurations"] = _collection_dicts(collections)
    out["DebugHookConfig"] = request
    return out


def profiler_fields(cfg, *, region: str, output_path: str) -> dict[str, Any]:
    """ProfilerConfig and ProfilerRuleConfigurations for a job (cfg: JobConfig)."""
    rules = [r for r in cfg.rules or [] if r.kind == "profiler"]
    config = cfg.profiler_config
    if cfg.disable_profiler:
        if config is not None and not config.disable_profiler:
            raise DebuggerSettingError("profiler_config.disable_profiler", False,
                                       "contradicts disable_profiler: true", "drop one of the two")
        if rules:
            raise DebuggerSettingError("rules", [r.name for r in rules],
                                       "profiler rules need the profiler, which disable_profiler turns off",
                                       "drop the profiler rules or disable_profiler")
    elif region not in UNSUPPORTED_REGIONS and config is None:
        config = ProfilerConfig(s3_output_path=output_path)
    out: dict[str, Any] = {}
    if rules:
        out["ProfilerRuleConfigurations"] = [_rule_dict(r, region) for r in rules]
    if config is None:
        config = ProfilerConfig(disable_profiler=True)
    request: dict[str, Any] = {}
    if not config.disable_profiler:
        request["S3OutputPath"] = config.s3_output_path or output_path
    request["DisableProfiler"] = config.disable_profiler
    if config.system_monitor_interval_millis is not None:
        request["ProfilingIntervalInMilliseconds"] = config.system_monitor_interval_millis
    out["ProfilerConfig"] = request
    return out
