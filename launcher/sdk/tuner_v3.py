"""`HyperparameterTuner` in the SageMaker SDK v3 shape (`sagemaker.train.tuner`): over a `ModelTrainer`.

    from launcher import ModelTrainer
    from launcher.sdk.tuner_v3 import HyperparameterTuner   # instead of: from sagemaker.train.tuner import ...
    tuner = HyperparameterTuner(model_trainer=trainer, objective_metric_name="validation:loss",
                                hyperparameter_ranges={"lr": ContinuousParameter(1e-5, 1e-3)},
                                objective_type="Minimize", max_jobs=8)
    tuner.tune(wait=False)

The trials are the ModelTrainer's job (its estimator's, launcher.sdk.model_trainer), so the sweep is
validated, planned and sent exactly as the SDK v2 face's (launcher.sdk.tuner); the SDK v3's config
shapes (`HyperParameterTuningJobWarmStartConfig`, `HyperParameterTuningJobStrategyConfig`,
`TuningJobCompletionCriteria`, `HyperParameterTuningInstanceConfig`) are read by their attributes.
"""

from __future__ import annotations

from typing import Any

from launcher.sdk import tuner as v2
from launcher.wire.training.issues import ConfigError, Issue


class HyperparameterTuner(v2.HyperparameterTuner):
    """The SDK v3 tuner; validation runs in the constructor, as the v2 face's."""

    def __init__(self, model_trainer: Any, objective_metric_name: str, hyperparameter_ranges: dict,
                 metric_definitions: list[dict] | None = None, strategy: str = "Bayesian",
                 objective_type: str = "Maximize", max_jobs: int | None = None, max_parallel_jobs: int = 1,
                 max_runtime_in_seconds: int | None = None, tags: Any = None, base_tuning_job_name: str | None = None,
                 warm_start_config: Any = None, strategy_config: Any = None, completion_criteria_config: Any = None,
                 early_stopping_type: str = "Off", model_trainer_name: str | None = None,
                 random_seed: int | None = None, **refused: Any):
        estimator = getattr(model_trainer, "estimator", None)
        if estimator is None:
            raise ConfigError([Issue("model_trainer", type(model_trainer).__name__, "is not an smlaunch ModelTrainer",
                                     "pass launcher.ModelTrainer(...)")])
        if model_trainer_name is not None:
            refused["estimator_name"] = model_trainer_name  # the v2 name of the same refusal
        self.model_trainer = model_trainer
        super().__init__(estimator, objective_metric_name, hyperparameter_ranges, metric_definitions, strategy,
                         objective_type, max_jobs, max_parallel_jobs, max_runtime_in_seconds, _tags(tags),
                         base_tuning_job_name, warm_start_config, strategy_config, completion_criteria_config,
                         early_stopping_type, random_seed, **refused)

    def tune(self, inputs: Any = None, job_name: str | None = None, model_trainer_kwargs: dict | None = None,
             wait: bool = True, force: bool = False, **kwargs: Any) -> None:
        """Start the sweep. `inputs`: an S3 URI, a {channel: URI} dict, or a list of `InputData`/
        `Channel` (laid over the ModelTrainer's channels by name, as its train() does)."""
        if model_trainer_kwargs:
            raise ConfigError([Issue("model_trainer_kwargs", model_trainer_kwargs, "is for several model "
                                     "trainers, which smlaunch's tuner does not support", "leave it out")])
        if isinstance(inputs, list):
            inputs = self.model_trainer._inputs(inputs)
        self.fit(inputs, job_name=job_name, wait=wait, force=force, **kwargs)


def _tags(tags: Any) -> Any:
    """SDK v3 `Tag` shapes (key, value) as the request's {Key, Value}."""
    if tags is None or isinstance(tags, dict):
        return tags
    return [t if isinstance(t, dict) else {"Key": t.key, "Value": t.value} for t in tags]
