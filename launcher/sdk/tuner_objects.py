"""The SDK's tuning objects (`sagemaker.parameter`, `sagemaker.tuner`), and what they make of a
sweep: `tuning_config` turns a tuner's arguments into the one description of a sweep,
`launcher.config.tuning.TuningConfig`. Objects are read by their attributes, so the official
SDK's `ContinuousParameter`, `WarmStartConfig`, ... work as well as these.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import ValidationError

from launcher.config.tuning import TuningConfig
from launcher.wire.training.issues import ConfigError, Issue


class ContinuousParameter:
    __name__ = "Continuous"

    def __init__(self, min_value: float, max_value: float, scaling_type: str = "Auto"):
        self.min_value, self.max_value, self.scaling_type = min_value, max_value, scaling_type


class IntegerParameter(ContinuousParameter):
    __name__ = "Integer"


class CategoricalParameter:
    __name__ = "Categorical"

    def __init__(self, values: Any):
        # Values keep their types (validation checks them against the hyperparameter's); the
        # request writes them as the SDK does, str()-ed (launcher.backends.tuning_request).
        self.values = list(values) if isinstance(values, (list, tuple)) else [values]


class InstanceConfig:
    def __init__(self, instance_count: int | None = None, instance_type: str | None = None,
                 volume_size: int | None = 30):
        self.instance_count, self.instance_type, self.volume_size = instance_count, instance_type, volume_size


def instance_configs(configs: Any) -> list[dict] | None:
    """SDK v2 `InstanceConfig`s or SDK v3 `HyperParameterTuningInstanceConfig`s as TuningConfig's."""
    if configs is None:
        return None
    return [c if isinstance(c, dict) else {
        "instance_type": _get(c, "instance_type"), "instance_count": _get(c, "instance_count"),
        "volume_size_in_gb": _get(c, "volume_size_in_gb") or _get(c, "volume_size")} for c in configs]


class WarmStartTypes(Enum):
    IDENTICAL_DATA_AND_ALGORITHM = "IdenticalDataAndAlgorithm"
    TRANSFER_LEARNING = "TransferLearning"


class WarmStartConfig:
    def __init__(self, warm_start_type: WarmStartTypes | str, parents: Any):
        self.type, self.parents = warm_start_type, parents


class HyperbandStrategyConfig:
    def __init__(self, max_resource: int, min_resource: int):
        self.max_resource, self.min_resource = max_resource, min_resource


class StrategyConfig:
    def __init__(self, hyperband_strategy_config: HyperbandStrategyConfig):
        self.hyperband_strategy_config = hyperband_strategy_config


class TuningJobCompletionCriteriaConfig:
    def __init__(self, max_number_of_training_jobs_not_improving: int | None = None,
                 complete_on_convergence: bool | None = None, target_objective_metric_value: float | None = None):
        self.max_number_of_training_jobs_not_improving = max_number_of_training_jobs_not_improving
        self.complete_on_convergence = complete_on_convergence
        self.target_objective_metric_value = target_objective_metric_value


def _range(rng: Any) -> Any:
    if isinstance(rng, dict):
        return rng
    kind = getattr(rng, "__name__", type(rng).__name__)
    if kind == "Categorical" or hasattr(rng, "values") and not hasattr(rng, "min_value"):
        return {"kind": "categorical", "values": list(rng.values)}
    return {"kind": "integer" if kind == "Integer" else "continuous", "min_value": rng.min_value,
            "max_value": rng.max_value, "scaling_type": getattr(rng, "scaling_type", "Auto")}


def _get(obj: Any, name: str) -> Any:
    """An attribute of an SDK object, None where absent (SDK v3 shapes mark unset fields `Unassigned`)."""
    value = getattr(obj, name, None)
    return None if type(value).__name__ == "Unassigned" else value


def _warm_start(config: Any) -> Any:
    """SDK v2 `WarmStartConfig(type, parents)` or SDK v3 `HyperParameterTuningJobWarmStartConfig`."""
    if config is None or isinstance(config, dict):
        return config
    if _get(config, "parent_hyper_parameter_tuning_jobs") is not None:  # the v3 shape
        kind = config.warm_start_type
        parents = [_get(p, "hyper_parameter_tuning_job_name") for p in config.parent_hyper_parameter_tuning_jobs]
    else:
        kind, parents = config.type, config.parents
    # The SDK v2 keeps parents as a set (no order); sorted, the request is the same on every run.
    return {"type": getattr(kind, "value", kind), "parents": sorted(parents)}


def _hyperband(strategy_config: Any) -> Any:
    """`StrategyConfig` (v2) or `HyperParameterTuningJobStrategyConfig` (v3): the Hyperband bounds."""
    if strategy_config is None or isinstance(strategy_config, dict):
        return strategy_config
    band = strategy_config.hyperband_strategy_config
    return {"min_resource": _get(band, "min_resource"), "max_resource": _get(band, "max_resource")}


def _completion(config: Any) -> Any:
    """`TuningJobCompletionCriteriaConfig` (v2) or `TuningJobCompletionCriteria` (v3)."""
    if config is None or isinstance(config, dict):
        return config
    if hasattr(config, "max_number_of_training_jobs_not_improving"):  # the v2 shape
        return {"max_jobs_not_improving": config.max_number_of_training_jobs_not_improving,
                "complete_on_convergence": config.complete_on_convergence,
                "target_objective_value": config.target_objective_metric_value}
    improving, converged = _get(config, "best_objective_not_improving"), _get(config, "convergence_detected")
    flag = _get(converged, "complete_on_convergence")
    return {"max_jobs_not_improving": _get(improving, "max_number_of_training_jobs_not_improving"),
            "complete_on_convergence": None if flag is None else flag == "Enabled",
            "target_objective_value": _get(config, "target_objective_metric_value")}


def tuning_config(*, objective_metric_name: str, hyperparameter_ranges: dict, strategy: str = "Bayesian",
                  objective_type: str = "Maximize", max_jobs: int | None = None, max_parallel_jobs: int = 1,
                  max_runtime_in_seconds: int | None = None, base_tuning_job_name: str | None = None,
                  warm_start_config: Any = None, strategy_config: Any = None, completion_criteria_config: Any = None,
                  early_stopping_type: str = "Off", random_seed: int | None = None) -> TuningConfig:
    """A tuner's arguments as a TuningConfig; every wrong one reported at once, by the SDK's name."""
    if max_jobs is None and strategy != "Grid":
        max_jobs = 1  # the SDK's default for every strategy but Grid
    data = {"objective": {"metric": objective_metric_name, "type": objective_type},
            "ranges": {str(k): _range(v) for k, v in (hyperparameter_ranges or {}).items()},
            "strategy": strategy, "max_jobs": max_jobs, "max_parallel_jobs": max_parallel_jobs,
            "max_runtime_in_seconds": max_runtime_in_seconds, "base_tuning_job_name": base_tuning_job_name,
            "warm_start": _warm_start(warm_start_config), "hyperband": _hyperband(strategy_config),
            "completion_criteria": _completion(completion_criteria_config),
            "early_stopping": early_stopping_type, "random_seed": random_seed}
    try:
        return TuningConfig.model_validate({k: v for k, v in data.items() if v is not None})
    except ValidationError as exc:
        raise ConfigError([validation_issue(e) for e in exc.errors()]) from None


# TuningConfig's field -> the tuner argument a user wrote.
_SDK_NAMES = {"objective.metric": "objective_metric_name", "objective.type": "objective_type",
              "ranges": "hyperparameter_ranges", "warm_start": "warm_start_config", "hyperband": "strategy_config",
              "completion_criteria": "completion_criteria_config", "early_stopping": "early_stopping_type",
              "instance_configs": "instance_configs"}


def validation_issue(error: dict) -> Issue:
    path = ".".join(str(p) for p in error["loc"] if str(p) not in ("continuous", "integer", "categorical"))
    for ours, sdk in _SDK_NAMES.items():
        if path == ours or path.startswith(ours + "."):
            path = sdk + path[len(ours):]
            break
    return Issue(path or "tuner", error.get("input"), error["msg"].removeprefix("Value error, "),
                 "see docs/tuning.md for the tuner's arguments")
