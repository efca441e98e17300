"""The CreateHyperParameterTuningJob request for a validated job and its sweep, as the SDK v2 sends it.

The trials' `TrainingJobDefinition` is cut from the CreateTrainingJob request of the same job
(launcher.backends.request.build_request), so spot, checkpoints, KMS keys, VPC, distribution,
network isolation and the driver's hyperparameters arrive exactly as a training job sends them:
the SDK's tuner rebuilds them from the estimator and has dropped them in turn (SDK issues #5184,
#5610, #1011). What a training job may have and a tuning job's trials cannot is refused by name,
never dropped. Sources (SDK 2.257.7): `sagemaker.tuner._TuningJob._get_tuner_args` and
`_prepare_training_config`, `sagemaker.session.Session._get_tuning_request`, `_map_tuning_config`
and `_map_training_config`; `sagemaker.parameter` for the ranges.
"""

from __future__ import annotations

import json
from typing import Any

from launcher.backends.request import build_request
from launcher.config import ValidatedJob
from launcher.config.tuning import CategoricalRange, ContinuousRange, TuningConfig
from launcher.wire.training.issues import ConfigError, Issue

# The SDK writes these for a Framework estimator so that its HyperparameterTuner.attach finds the
# estimator class again; smlaunch writes the SDK's own names, so either SDK can attach the job.
ESTIMATOR_CLASS_KEY = "sagemaker_estimator_class_name"
ESTIMATOR_MODULE_KEY = "sagemaker_estimator_module"
ESTIMATOR_CLASS = "PyTorch"
ESTIMATOR_MODULE = "sagemaker.pytorch.estimator"

# CreateTrainingJob fields with no place in a tuning job's TrainingJobDefinition (botocore's
# HyperParameterTrainingJobDefinition), and the job setting that produces each.
_NOT_IN_TUNING = {
    "TensorBoardOutputConfig": "tensorboard_output_config",
    "DebugHookConfig": "debugger_hook_config",
    "DebugRuleConfigurations": "rules",
    "ProfilerConfig": "profiler_config",
    "ProfilerRuleConfigurations": "rules",
    "ExperimentConfig": "experiment_config",
    "InfraCheckConfig": "enable_infra_check",
    "RemoteDebugConfig": "enable_remote_debug",
    "SessionChainingConfig": "enable_session_tag_chaining",
}
_NOT_IN_TUNING_RESOURCES = {"KeepAlivePeriodInSeconds": "keep_alive_period_in_seconds",
                            "InstanceGroups": "instance_groups", "TrainingPlanArn": "training_plan",
                            "InstancePlacementConfig": "instance_placement_config"}
_NOT_IN_TUNING_ALGORITHM = {"TrainingImageConfig": "training_repository_access_mode",
                            "ContainerEntrypoint": "container_entry_point",
                            "ContainerArguments": "container_arguments"}
# Debugger and profiler fields the SDK v2 itself adds to every training job when the user set
# none; a tuning job has no place for them and the SDK's tuner leaves them out as well.
_SDK_DEFAULTS = ("DebugHookConfig", "ProfilerConfig", "ProfilerRuleConfigurations", "DebugRuleConfigurations")


def parameter_ranges(tuning: TuningConfig) -> dict[str, list[dict[str, Any]]]:
    """ParameterRanges as `HyperparameterTuner._prepare_parameter_ranges_for_tuning` writes them for a
    Framework estimator: bounds as str(), categorical values str()-ed then JSON-encoded
    (`CategoricalParameter.as_json_range`), since framework containers JSON-decode every hyperparameter."""
    out: dict[str, list[dict[str, Any]]] = {"ContinuousParameterRanges": [], "CategoricalParameterRanges": [],
                                            "IntegerParameterRanges": []}
    for name, rng in tuning.ranges.items():
        if isinstance(rng, CategoricalRange):
            out["CategoricalParameterRanges"].append({"Name": name, "Values": [json.dumps(_sdk_str(v))
                                                                                for v in rng.values]})
        else:
            kind = "Continuous" if isinstance(rng, ContinuousRange) else "Integer"
            out[f"{kind}ParameterRanges"].append({"Name": name, "MinValue": _sdk_str(rng.min_value),
                                                  "MaxValue": _sdk_str(rng.max_value),
                                                  "ScalingType": rng.scaling_type})
    return out


def _sdk_str(value: Any) -> str:
    """sagemaker.utils.to_string: str() of the value (True -> 'True', 1e-05 -> '1e-05')."""
    return str(value)


def tuning_job_config(tuning: TuningConfig) -> dict[str, Any]:
    """HyperParameterTuningJobConfig (`Session._map_tuning_config`)."""
    limits: dict[str, Any] = {"MaxParallelTrainingJobs": tuning.max_parallel_jobs}
    # Grid without max_jobs: SageMaker runs the whole grid. The SDK sends None here, which botocore
    # refuses before anything is sent (docs/tuning.md).
    if tuning.max_jobs is not None:
        limits["MaxNumberOfTrainingJobs"] = tuning.max_jobs
    if tuning.max_runtime_in_seconds is not None:
        limits["MaxRuntimeInSeconds"] = tuning.max_runtime_in_seconds
    config: dict[str, Any] = {"Strategy": tuning.strategy, "ResourceLimits": limits,
                              "TrainingJobEarlyStoppingType": tuning.early_stopping}
    if tuning.random_seed is not None:
        config["RandomSeed"] = tuning.random_seed
    config["HyperParameterTuningJobObjective"] = {"Type": tuning.objective.type, "MetricName": tuning.objective.metric}
    config["ParameterRanges"] = parameter_ranges(tuning)
    if tuning.hyperband is not None:
        config["StrategyConfig"] = {"HyperbandStrategyConfig": {
            "MinResource": tuning.hyperband.min_resource, "MaxResource": tuning.hyperband.max_resource}}
    criteria = tuning.completion_criteria
    if criteria is not None:
        done: dict[str, Any] = {}
        if criteria.max_jobs_not_improving is not None:
            done["BestObjectiveNotImproving"] = {"MaxNumberOfTrainingJobsNotImproving": criteria.max_jobs_not_improving}
        if criteria.target_objective_value is not None:
            done["TargetObjectiveMetricValue"] = criteria.target_objective_value
        if criteria.complete_on_convergence is not None:
            done["ConvergenceDetected"] = {"CompleteOnConvergence":
                                           "Enabled" if criteria.complete_on_convergence else "Disabled"}
        config["TuningJobCompletionCriteria"] = done
    return config


def build_tuning_request(job: ValidatedJob, tuning: TuningConfig, *, name: str, region: str, source_uri: str,
                         output_path: str, tags: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """The whole request; `name` is the tuning job's, which the SDK also sends as sagemaker_job_name
    and under which the code is uploaded. `tags` are the tuner's; the job's own follow them."""
    training = build_request(job, job_name=name, region=region, source_uri=source_uri, output_path=output_path)
    request: dict[str, Any] = {"HyperParameterTuningJobName": name,
                               "HyperParameterTuningJobConfig": tuning_job_config(tuning),
                               "TrainingJobDefinition": training_job_definition(job, tuning, training)}
    if tuning.warm_start is not None:
        request["WarmStartConfig"] = {"WarmStartType": tuning.warm_start.type, "ParentHyperParameterTuningJobs": [
            {"HyperParameterTuningJobName": p} for p in tuning.warm_start.parents]}
    all_tags = list(tags or [])
    all_tags += [t for t in training.get("Tags", []) if t not in all_tags]  # _prepare_tags_for_tuning
    if all_tags:
        request["Tags"] = all_tags
    return request


def training_job_definition(job: ValidatedJob, tuning: TuningConfig, training: dict[str, Any]) -> dict[str, Any]:
    """TrainingJobDefinition from the training job's own request; see the module's docstring."""
    _refuse_untunable(job, training)
    static = {k: v for k, v in training["HyperParameters"].items() if k not in tuning.ranges}
    static[ESTIMATOR_CLASS_KEY] = json.dumps(ESTIMATOR_CLASS)
    static[ESTIMATOR_MODULE_KEY] = json.dumps(ESTIMATOR_MODULE)
    algorithm = {k: v for k, v in training["AlgorithmSpecification"].items()
                 if k in ("TrainingImage", "TrainingInputMode", "MetricDefinitions")}
    resources = {k: v for k, v in training["ResourceConfig"].items()
                 if k in ("InstanceCount", "InstanceType", "VolumeSizeInGB", "VolumeKmsKeyId")}
    if tuning.instance_configs:  # `_TuningJob._prepare_hp_resource_config`: the choices replace the job's
        volume = resources.pop("VolumeSizeInGB")
        resources = {k: v for k, v in resources.items() if k == "VolumeKmsKeyId"}
        resources["InstanceConfigs"] = [{"InstanceCount": i.instance_count, "InstanceType": i.instance_type,
                                         "VolumeSizeInGB": i.volume_size_in_gb or volume}
                                        for i in tuning.instance_configs]
    definition: dict[str, Any] = {"StaticHyperParameters": static, "RoleArn": training["RoleArn"],
                                  "OutputDataConfig": training["OutputDataConfig"],
                                  "StoppingCondition": training["StoppingCondition"],
                                  "HyperParameterTuningResourceConfig": resources,
                                  "AlgorithmSpecification": algorithm}
    for key in ("InputDataConfig", "VpcConfig", "EnableNetworkIsolation", "EnableInterContainerTrafficEncryption",
                "EnableManagedSpotTraining", "CheckpointConfig", "RetryStrategy", "Environment"):
        if key in training:
            definition[key] = training[key]
    return definition


def _refuse_untunable(job: ValidatedJob, training: dict[str, Any]) -> None:
    cfg = job.config
    fields = [f for key, f in _NOT_IN_TUNING.items() if key in training and not _sdk_default(cfg, key)]
    fields += [f for key, f in _NOT_IN_TUNING_RESOURCES.items() if key in training["ResourceConfig"]]
    fields += [f for key, f in _NOT_IN_TUNING_ALGORITHM.items() if key in training["AlgorithmSpecification"]]
    if cfg.enable_sagemaker_metrics is False:  # on for every trial: the API has no switch for it
        fields.append("enable_sagemaker_metrics")
    issues = [Issue(f, getattr(cfg, f, None), "has no place in a SageMaker tuning job's trials "
                    "(CreateHyperParameterTuningJob's TrainingJobDefinition lacks it)",
                    "remove it from the job to tune it, or run the trials as training jobs")
              for f in dict.fromkeys(fields)]
    if issues:
        raise ConfigError(issues)


def _sdk_default(cfg, key: str) -> bool:
    """Whether a debugger/profiler field is only the SDK's default (the job set no debugger settings)."""
    if key not in _SDK_DEFAULTS:
        return False
    hook, profiler = cfg.debugger_hook_config, cfg.profiler_config
    custom_hook = hook is not None and not isinstance(hook, bool)
    return not (custom_hook or cfg.rules or (profiler is not None and not profiler.disable_profiler))
