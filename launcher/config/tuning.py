"""What a hyperparameter tuning job is: the ranges, the objective, the strategy and the limits.

One model for every face: the job file's `tuning:` section is this model, and both SDK shapes'
`HyperparameterTuner` (v2 `estimator=`, v3 `model_trainer=`) build it, so the SageMaker request,
the local and Slurm sweeps, `validate` and `plan` all read one description of a sweep. Field
names are the SDK's (`objective_metric_name` becomes `objective.metric`, the rest keep theirs);
the value rules are those of SageMaker's `CreateHyperParameterTuningJob` (botocore's service
model and the API reference), checked here so that a sweep is refused before any trial runs.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Literal

from pydantic import Field, model_validator

from launcher.wire.terminal import as_data
from launcher.wire.training.base import FiniteNumber, Strict, WholeNumber
from launcher.wire.training.issues import show_value

STRATEGIES = ("Bayesian", "Random", "Hyperband", "Grid")
SCALINGS = ("Auto", "Linear", "Logarithmic", "ReverseLogarithmic")
OBJECTIVE_TYPES = ("Minimize", "Maximize")
WARM_START_TYPES = ("IdenticalDataAndAlgorithm", "TransferLearning")

# SageMaker's limits (service model: each range list and a categorical's Values hold at most 30;
# the developer guide: at most 30 hyperparameters searched in one tuning job; ResourceLimits'
# MaxRuntimeInSeconds 120..15,768,000; at most 5 parent tuning jobs for a warm start).
MAX_TUNED = 30
MAX_CATEGORICAL_VALUES = 30
MIN_TUNING_RUNTIME = 120
MAX_TUNING_RUNTIME = 15_768_000
MAX_WARM_START_PARENTS = 5
MAX_INSTANCE_CONFIGS = 6  # HyperParameterTuningResourceConfig.InstanceConfigs (botocore's service model)
# How many trials: botocore's service model bounds MaxNumberOfTrainingJobs and MaxParallelTrainingJobs
# below only (>= 1); SageMaker's quotas bound them above (the developer guide's "Resource Limits for
# Automatic Model Tuning"): 750 training jobs per tuning job for Bayesian, Hyperband and Grid (a grid's
# count inferred from its combinations too), Random's 750 raisable to 10,000; 100 at once (10 by default).
MAX_TRIALS = 750
MAX_RANDOM_TRIALS = 10_000
MAX_PARALLEL_TRIALS = 100
TUNING_JOB_NAME_PATTERN = r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,31}$"  # 1-32 characters
# The bounds the samplers take (launcher/tune/strategies.py): Optuna's TPE and Python's random draw
# floats between them, so max - min must be a finite float (+-1e308 overflows; 1e300 does not); Optuna
# works on integers as floats, and its TPE's share of one integer underflows past about 2**45 (NaN
# acquisitions; past 1e308 an OverflowError), so integer ranges stay within +-2**40 (~1.1e12).
MAX_CONTINUOUS_BOUND = 1e300
MAX_INTEGER_BOUND = 2**40

Scaling = Literal["Auto", "Linear", "Logarithmic", "ReverseLogarithmic"]
CategoryValue = str | WholeNumber | FiniteNumber | bool


class _Bounded(Strict):
    """min_value..max_value with a scaling; the scaling's own bounds are checked by its range."""

    scaling_type: Scaling = Field("Auto", description="How the search spreads values over the range.")

    @model_validator(mode="after")
    def _ordered(self):
        lo, hi = self.min_value, self.max_value  # type: ignore[attr-defined]
        bound = MAX_INTEGER_BOUND if isinstance(self, IntegerRange) else MAX_CONTINUOUS_BOUND
        for name, value in (("min_value", lo), ("max_value", hi)):
            if abs(value) > bound:
                raise ValueError(f"{name} {show_value(value)} is beyond +-{bound:.16g}, the widest range the sweep's "
                                 "samplers draw from (Optuna's TPE, Python's random); narrow the range")
        if lo > hi:
            raise ValueError(f"min_value {lo} is above max_value {hi}; swap them")
        if self.scaling_type == "Logarithmic" and lo <= 0:
            raise ValueError(f"Logarithmic scaling needs min_value > 0, not {lo}; use Linear or a positive minimum")
        return self


class ContinuousRange(_Bounded):
    """A real-valued hyperparameter (SDK: `ContinuousParameter(min_value, max_value, scaling_type)`)."""

    kind: Literal["continuous"] = "continuous"
    min_value: FiniteNumber
    max_value: FiniteNumber

    @model_validator(mode="after")
    def _reverse_log(self):
        if self.scaling_type == "ReverseLogarithmic" and not 0 <= self.min_value < self.max_value < 1:
            raise ValueError(f"ReverseLogarithmic scaling needs 0 <= min_value < max_value < 1, not "
                             f"{self.min_value}..{self.max_value}; use Linear or Logarithmic")
        return self


class IntegerRange(_Bounded):
    """A whole-number hyperparameter (SDK: `IntegerParameter(min_value, max_value, scaling_type)`)."""

    kind: Literal["integer"] = "integer"
    min_value: WholeNumber
    max_value: WholeNumber

    @model_validator(mode="after")
    def _no_reverse_log(self):
        if self.scaling_type == "ReverseLogarithmic":
            raise ValueError("ReverseLogarithmic scaling is for continuous ranges only (SageMaker); "
                             "use Linear or Logarithmic")
        return self


class CategoricalRange(Strict):
    """One of listed values (SDK: `CategoricalParameter(values)`)."""

    kind: Literal["categorical"] = "categorical"
    values: list[CategoryValue] = Field(min_length=1, max_length=MAX_CATEGORICAL_VALUES)

    @model_validator(mode="after")
    def _distinct(self):
        texts = [json.dumps(v) for v in self.values]
        repeated = sorted({t for t in texts if texts.count(t) > 1})
        if repeated:
            raise ValueError(f"values repeat {repeated}; list each value once")
        return self


ParameterRange = Annotated[ContinuousRange | IntegerRange | CategoricalRange, Field(discriminator="kind")]


class Objective(Strict):
    metric: str = Field(min_length=1, max_length=255,
                        description="The metric the sweep optimizes: smlaunch's (train:loss, validation:loss, ...) "
                                    "or one of the job's metric_definitions.")
    type: Literal["Minimize", "Maximize"] = Field(description="Minimize (a loss) or Maximize (an accuracy).")


class WarmStart(Strict):
    parents: list[str] = Field(min_length=1, max_length=MAX_WARM_START_PARENTS,
                               description="Names of earlier tuning jobs whose trials seed this one.")
    type: Literal["IdenticalDataAndAlgorithm", "TransferLearning"] = Field(
        description="IdenticalDataAndAlgorithm (same data and script) or TransferLearning.")


class Hyperband(Strict):
    min_resource: WholeNumber | None = Field(None, ge=1, description="Fewest epochs a trial gets.")
    max_resource: WholeNumber | None = Field(None, ge=1, description="Most epochs a trial gets.")


class CompletionCriteria(Strict):
    target_objective_value: FiniteNumber | None = Field(
        None, description="Stop the sweep once a trial reaches this objective value.")
    max_jobs_not_improving: WholeNumber | None = Field(
        None, ge=3, description="Stop after this many trials without a better objective (SageMaker: >= 3).")
    complete_on_convergence: bool | None = Field(
        None, description="Let SageMaker stop the sweep when it detects convergence.")


class TuningInstance(Strict):
    """One instance choice for the trials (SDK: `InstanceConfig`, `override_resource_config`)."""

    instance_type: str = Field(min_length=1, description="The trials' instance type, e.g. ml.g5.xlarge.")
    instance_count: WholeNumber = Field(1, ge=1, description="Instances per trial.")
    volume_size_in_gb: WholeNumber | None = Field(None, ge=1, description="Volume per instance (default: the job's).")


class TuningConfig(Strict):
    """A sweep over one job: its trials are that job with the tuned hyperparameters set."""

    objective: Objective
    ranges: dict[Annotated[str, Field(min_length=1, max_length=256)], ParameterRange] = Field(
        min_length=1, max_length=MAX_TUNED, description="Hyperparameter name -> its range.")
    strategy: Literal["Bayesian", "Random", "Hyperband", "Grid"] = Field(
        "Bayesian", description="How trials are chosen (Grid: every combination of categorical values).")
    max_jobs: WholeNumber | None = Field(
        None, ge=1, le=MAX_RANDOM_TRIALS,
        description=f"Trials in all (required except for Grid, where it is the grid's size): at most {MAX_TRIALS}, "
                    f"{MAX_RANDOM_TRIALS} for Random (SageMaker's quotas).")
    max_parallel_jobs: WholeNumber = Field(
        1, ge=1, le=MAX_PARALLEL_TRIALS, description="Trials running at once (SageMaker: at most 100).")
    early_stopping: Literal["Off", "Auto"] = Field(
        "Off", description="Auto: stop trials whose objective is worse than the median of earlier trials "
                           "at the same epoch (SageMaker's median rule).")
    max_runtime_in_seconds: WholeNumber | None = Field(
        None, ge=MIN_TUNING_RUNTIME, le=MAX_TUNING_RUNTIME, description="Time limit of the whole sweep.")
    random_seed: WholeNumber | None = Field(None, ge=0, description="Seed of the search's choices.")
    hyperband: Hyperband | None = Field(None, description="Hyperband strategy only: its resource bounds.")
    completion_criteria: CompletionCriteria | None = Field(None, description="When the sweep may stop early.")
    warm_start: WarmStart | None = Field(None, description="Start from earlier tuning jobs.")
    instance_configs: list[TuningInstance] | None = Field(
        None, min_length=1, max_length=MAX_INSTANCE_CONFIGS,
        description="Instances SageMaker may run each trial on, instead of the job's (every one is validated).")
    base_tuning_job_name: str | None = Field(
        None, max_length=32, pattern=TUNING_JOB_NAME_PATTERN, description="Tuning job name prefix.")

    @model_validator(mode="after")
    def _strategy_rules(self):
        if self.strategy == "Grid":
            ranged = sorted(n for n, r in self.ranges.items() if not isinstance(r, CategoricalRange))
            if ranged:
                raise ValueError(f"strategy Grid takes categorical ranges only; {ranged} are not: list their "
                                 "values as categorical, or use strategy Random or Bayesian")
            if grid_size(self) > MAX_TRIALS:
                raise ValueError(f"strategy Grid over {grid_size(self)} combinations: SageMaker runs at most "
                                 f"{MAX_TRIALS} trials in a tuning job; list fewer values, or use strategy Random "
                                 "or Bayesian with max_jobs")
            if self.max_jobs is not None and self.max_jobs > grid_size(self):
                raise ValueError(f"max_jobs {self.max_jobs} is above the grid's {grid_size(self)} combinations; "
                                 "leave max_jobs out for Grid")
        elif self.max_jobs is None:
            raise ValueError(f"max_jobs is required for strategy {self.strategy}: the number of trials in all")
        elif self.strategy != "Random" and self.max_jobs > MAX_TRIALS:
            raise ValueError(f"max_jobs {self.max_jobs}: SageMaker runs at most {MAX_TRIALS} trials in a "
                             f"{self.strategy} tuning job (Random: {MAX_RANDOM_TRIALS}); lower max_jobs")
        if self.hyperband is not None and self.strategy != "Hyperband":
            raise ValueError(f"hyperband settings apply to strategy Hyperband only, not {self.strategy}; "
                             "remove them or set strategy: Hyperband")
        if self.strategy == "Hyperband" and self.early_stopping != "Off":
            raise ValueError("Hyperband stops trials itself: early_stopping must be Off with it (SageMaker)")
        band = self.hyperband
        if band and band.min_resource and band.max_resource and band.min_resource > band.max_resource:
            raise ValueError(f"hyperband.min_resource {band.min_resource} is above max_resource "
                             f"{band.max_resource}; swap them")
        return self

    def trial_count(self) -> int:
        """How many trials the sweep starts at most."""
        return self.max_jobs if self.max_jobs is not None else grid_size(self)

    def summary(self) -> str:
        """The sweep's size in one line (`smlaunch validate`)."""
        names, metric = ", ".join(map(as_data, self.ranges)), as_data(self.objective.metric)  # the user's: as data
        return (f"{self.trial_count()} trial(s), {self.max_parallel_jobs} at a time, {self.strategy} over "
                f"{len(self.ranges)} hyperparameter(s) ({names}); {self.objective.type} {metric}")


def grid_size(config: TuningConfig) -> int:
    return math.prod(len(r.values) for r in config.ranges.values() if isinstance(r, CategoricalRange))

