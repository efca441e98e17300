"""`HyperparameterTuner`: the SageMaker SDK v2 tuner's interface over a `launcher.PyTorch` estimator.

    from launcher import HyperparameterTuner, ContinuousParameter
    tuner = HyperparameterTuner(est, "validation:loss", {"lr": ContinuousParameter(1e-5, 1e-3)},
                                objective_type="Minimize", max_jobs=8, max_parallel_jobs=2)
    print(tuner.plan().report())   # cost and time of the sweep, before any trial
    tuner.fit({"train": "s3://bucket/train"})

Every trial is validated before the tuning job exists (launcher.config.tuning_rules), and on
SageMaker the request goes through smlaunch's one request path (launcher.backends.tuning_request).
"""

from __future__ import annotations

# Imports inside functions: the backends (boto3), the planner and the sweep engine load when a
# sweep is planned or started, not when a tuner is built and validated.
import sys
from typing import Any

from launcher.config import ValidatedJob, validate_job
from launcher.config.tuning import TuningConfig
from launcher.sdk.tuner_objects import tuning_config
from launcher.wire.training.issues import ConfigError, Issue

# SDK v2 arguments smlaunch refuses, and why.
_REFUSED = {
    "autotune": ("Autotune lets SageMaker choose the ranges, which smlaunch cannot validate before the trials run",
                 "give hyperparameter_ranges and leave autotune out"),
    "hyperparameters_to_keep_static": ("is an Autotune setting, and Autotune is not supported",
                                       "leave it out; hyperparameters not in hyperparameter_ranges stay static"),
    "estimator_name": ("several estimators in one tuning job (HyperparameterTuner.create) are not supported",
                       "tune each estimator in its own tuning job"),
}


def _estimator_job_args(estimator: Any, field: str) -> dict:
    args = getattr(estimator, "_args", None)
    if not isinstance(args, dict):
        raise ConfigError([Issue(field, type(estimator).__name__, "is not an smlaunch estimator",
                                 "pass launcher.PyTorch(...) (or launcher.ModelTrainer(...) with model_trainer=)")])
    return dict(args)


class HyperparameterTuner:
    """The SDK v2 `sagemaker.tuner.HyperparameterTuner`; validation runs in the constructor."""

    def __init__(self, estimator: Any, objective_metric_name: str, hyperparameter_ranges: dict,
                 metric_definitions: list[dict] | None = None, strategy: str = "Bayesian",
                 objective_type: str = "Maximize", max_jobs: int | None = None, max_parallel_jobs: int = 1,
                 max_runtime_in_seconds: int | None = None, tags: Any = None, base_tuning_job_name: str | None = None,
                 warm_start_config: Any = None, strategy_config: Any = None, completion_criteria_config: Any = None,
                 early_stopping_type: str = "Off", random_seed: int | None = None, **refused: Any):
        issues = [Issue(k, v, *_REFUSED[k]) for k, v in refused.items() if k in _REFUSED and v not in (None, False)]
        issues += [Issue(k, v, "unknown tuner argument", "remove it") for k, v in refused.items() if k not in _REFUSED]
        if issues:
            raise ConfigError(issues)
        self.estimator = estimator
        self._job_args = _estimator_job_args(estimator, "estimator")
        if metric_definitions is not None:  # the trials' metric definitions (the SDK sends the tuner's)
            self._job_args["metric_definitions"] = metric_definitions
        self._session = getattr(estimator, "_session", None)
        self.tuning: TuningConfig = tuning_config(
            objective_metric_name=objective_metric_name, hyperparameter_ranges=hyperparameter_ranges,
            strategy=strategy, objective_type=objective_type, max_jobs=max_jobs, max_parallel_jobs=max_parallel_jobs,
            max_runtime_in_seconds=max_runtime_in_seconds, base_tuning_job_name=base_tuning_job_name,
            warm_start_config=warm_start_config, strategy_config=strategy_config,
            completion_criteria_config=completion_criteria_config, early_stopping_type=early_stopping_type,
            random_seed=random_seed)
        self.tags = _tag_list(tags)
        self.job = self._validated()
        self.latest_tuning_job: str | None = None
        self._sweep = None  # a local or Slurm sweep's handle (launcher.tune)

    # --- the SDK's attributes ---------------------------------------------------------------
    @property
    def objective_metric_name(self) -> str:
        return self.tuning.objective.metric

    @property
    def max_jobs(self) -> int:
        return self.tuning.trial_count()

    @property
    def max_parallel_jobs(self) -> int:
        return self.tuning.max_parallel_jobs

    def hyperparameter_ranges(self) -> dict:
        """ParameterRanges as the request sends them."""
        from launcher.backends.tuning_request import parameter_ranges

        return parameter_ranges(self.tuning)

    def override_resource_config(self, instance_configs: Any) -> None:
        """Let SageMaker run each trial on one of these instances (SDK `InstanceConfig`s, v2 or v3);
        every one is validated with the ranges, as the job's own instance is. None: the job's again."""
        from pydantic import ValidationError

        from launcher.sdk.tuner_objects import instance_configs as as_configs
        from launcher.sdk.tuner_objects import validation_issue

        if isinstance(instance_configs, dict):
            raise ConfigError([Issue("instance_configs", sorted(instance_configs), "is per estimator, and several "
                                     "estimators in one tuning job are not supported", "pass a list")])
        data = {**self.tuning.model_dump(exclude_none=True), "instance_configs": as_configs(instance_configs)}
        try:
            tuning = TuningConfig.model_validate({k: v for k, v in data.items() if v is not None})
        except ValidationError as exc:
            raise ConfigError([validation_issue(e) for e in exc.errors()]) from None
        previous, self.tuning = self.tuning, tuning
        try:
            self.job = self._validated()
        except ConfigError:
            self.tuning = previous
            raise

    # --- before any trial -------------------------------------------------------------------
    def _validated(self, inputs: Any = None) -> ValidatedJob:
        args = dict(self._job_args)
        if inputs is not None:
            from launcher.sdk.estimator import _inputs

            args["inputs"] = _inputs(inputs)
        args["tuning"] = self.tuning.model_dump(exclude_none=True)  # validate_job checks every trial
        job = validate_job(args)
        for warning in job.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        return job

    def plan(self):
        """The sweep's predicted cost and time (`launcher.plan.tuning.SweepPlan`; print `.report()`)."""
        from launcher.plan.tuning import plan_sweep

        return plan_sweep(self.job, self.tuning)

    def dryrun(self, inputs: Any = None, job_name: str | None = None) -> dict:
        """The CreateHyperParameterTuningJob request fit() would send; nothing is sent or uploaded."""
        job = self._validated(inputs) if inputs is not None else self.job
        return self._sagemaker(job).dryrun(job, self.tuning, job_name, self.tags)

    # --- running ----------------------------------------------------------------------------
    def fit(self, inputs: Any = None, job_name: str | None = None, include_cls_metadata: Any = False,
            estimator_kwargs: dict | None = None, wait: bool = True, force: bool = False, **kwargs: Any) -> None:
        """Start the sweep (SageMaker: a tuning job; local/Slurm: smlaunch's sweep). A sweep whose
        costliest trial the planner predicts to run out of memory is refused unless `force=True`."""
        # include_cls_metadata changes nothing for a framework estimator in the SDK either: the class
        # names are always sent (launcher.backends.tuning_request).
        issues = [Issue(k, v, "is not a fit() argument of smlaunch's tuner", "remove it") for k, v in kwargs.items()]
        if estimator_kwargs:
            issues.append(Issue("estimator_kwargs", estimator_kwargs, "is for several estimators, which "
                                "smlaunch's tuner does not support", "leave it out"))
        if issues:
            raise ConfigError(issues)
        job = self._validated(inputs)
        if not force:
            from launcher.plan.tuning import check_sweep_fits

            check_sweep_fits(job, self.tuning)
        if job.config.on_sagemaker:
            self.latest_tuning_job = self._sagemaker(job).create(job, self.tuning, job_name, self.tags)
            print(f"Submitted tuning job {self.latest_tuning_job}", file=sys.stderr)
            if wait:
                self.wait()
            return
        # Function-level: the local/Slurm sweep engine loads only for such a sweep.
        from launcher.tune.sweep import start_sweep

        self._sweep = start_sweep(job.config, self.tuning, name=job_name, wait=wait)
        self.latest_tuning_job = self._sweep.name

    def _sagemaker(self, job: ValidatedJob | None = None):
        from launcher.backends import registry
        from launcher.backends.sagemaker_tuning import SageMakerTuning

        job = job or self.job
        return SageMakerTuning(registry.backend_named("sagemaker", region=job.config.region, session=self._session))

    def _latest(self) -> str:
        if self.latest_tuning_job is None:
            raise RuntimeError("no tuning job yet: call fit() or HyperparameterTuner.attach(name) first")
        return self.latest_tuning_job

    def describe(self) -> dict:
        name = self._latest()
        return self._sweep.describe() if self._sweep is not None else self._sagemaker().describe(name)

    def wait(self) -> None:
        name = self._latest()
        if self._sweep is not None:
            self._sweep.wait()
        else:
            self._sagemaker().wait(name)

    def stop_tuning_job(self) -> None:
        name = self._latest()
        if self._sweep is not None:
            self._sweep.stop()
        else:
            self._sagemaker().stop(name)

    def _best(self) -> dict:
        name = self._latest()
        return self._sweep.best_trial() if self._sweep is not None else self._sagemaker().best_training_job(name)

    def best_training_job(self) -> str:
        return self._best()["TrainingJobName"]

    def best_estimator(self, best_training_job: dict | None = None):
        """An smlaunch `PyTorch` estimator attached to the best trial."""
        best = best_training_job or self._best()
        return type(self.estimator).attach(best["TrainingJobName"], session=self._session)

    def analytics(self):
        return TuningAnalytics(self._latest(), self)

    @classmethod
    def attach(cls, tuning_job_name: str, sagemaker_session: Any = None, session: Any = None,
               region: str | None = None) -> HyperparameterTuner:
        """A tuner for an existing SageMaker tuning job; its estimator is attached to the best trial
        (or the first one), the trials being that estimator with the tuned values set."""
        from launcher.backends import registry
        from launcher.backends.sagemaker_tuning import SageMakerTuning
        from launcher.sdk.estimator import PyTorch

        backend = registry.backend_named("sagemaker", region=region, session=sagemaker_session or session)
        tuning = SageMakerTuning(backend)
        desc = tuning.describe(tuning_job_name)
        trial = desc.get("BestTrainingJob") or next(iter(tuning.trials(tuning_job_name)), None)
        if trial is None:
            raise RuntimeError(f"tuning job {tuning_job_name} has no trial yet to rebuild its estimator from; "
                               "attach once a trial has started")
        estimator = PyTorch.attach(trial["TrainingJobName"], session=tuning.backend.session)
        config = desc["HyperParameterTuningJobConfig"]
        objective = config.get("HyperParameterTuningJobObjective", {})
        out = cls(estimator, objective.get("MetricName"), _ranges_of(config.get("ParameterRanges", {})),
                  strategy=config["Strategy"], objective_type=objective.get("Type", "Maximize"),
                  max_jobs=config["ResourceLimits"]["MaxNumberOfTrainingJobs"],
                  max_parallel_jobs=config["ResourceLimits"]["MaxParallelTrainingJobs"],
                  early_stopping_type=config.get("TrainingJobEarlyStoppingType", "Off"))
        out.latest_tuning_job = tuning_job_name
        return out


class TuningAnalytics:
    """The SDK's HyperparameterTuningJobAnalytics: `dataframe()` is one row per trial (a pandas
    DataFrame when pandas is installed, else a list of dicts with the same columns)."""

    def __init__(self, name: str, tuner: HyperparameterTuner):
        self.name, self._tuner = name, tuner

    def description(self) -> dict:
        return self._tuner.describe()

    def dataframe(self, force_refresh: bool = False):
        from launcher.backends.sagemaker_tuning import trial_rows

        if self._tuner._sweep is not None:
            rows = self._tuner._sweep.describe().get("Trials", [])
        else:
            rows = trial_rows(self._tuner._sagemaker().trials(self.name))
        try:
            import pandas
        except ImportError:
            return rows
        return pandas.DataFrame(rows)


def _tag_list(tags: Any) -> list[dict] | None:
    if tags is None:
        return None
    return [{"Key": k, "Value": v} for k, v in tags.items()] if isinstance(tags, dict) else list(tags)


def _ranges_of(ranges: dict) -> dict:
    """ParameterRanges of a described tuning job back as the tuner's ranges (categorical values
    JSON-decoded, as a framework container reads them)."""
    import json

    out: dict[str, Any] = {}
    for r in ranges.get("CategoricalParameterRanges", []):
        out[r["Name"]] = {"kind": "categorical", "values": [json.loads(v) for v in r["Values"]]}
    for kind in ("Continuous", "Integer"):
        for r in ranges.get(f"{kind}ParameterRanges", []):
            cast = float if kind == "Continuous" else int
            out[r["Name"]] = {"kind": kind.lower(), "min_value": cast(r["MinValue"]), "max_value": cast(r["MaxValue"]),
                              "scaling_type": r.get("ScalingType", "Auto")}
    return out
