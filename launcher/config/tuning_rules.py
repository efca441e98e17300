"""A sweep's rules: every trial is a training job of the same validated kind, checked before any runs.

A trial is the job with the tuned values set. The ranges are tried at their extremes (min and
max, whatever the scaling) and at every categorical value, one tuned name at a time, then all
at their minima and all at their maxima together (the worst combination for memory and
divisibility rules); each variant goes through the job's own validation (`check_trial`, which
validate.py supplies), and an error names the range, the value that fails and why. A value
only some trials can use is an error here rather than a share of the trials failing at run time.
Memory is the planner's (launcher.plan.tuning checks every variant's fit).
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any

from launcher.config.trainer_names import known_name_hint
from launcher.config.tuning import CategoricalRange, ContinuousRange, TuningConfig
from launcher.wire.metric_lines import METRICS
from launcher.wire.training.hyperparameters import TrainingHyperparameters
from launcher.wire.training.issues import Issue, did_you_mean

RESERVED_PREFIX = "sagemaker_"
# validate.py's check of one trial's job (its settings as a job file holds them): its errors.
TrialCheck = Callable[[dict], list[Issue]]


def range_values(rng) -> list[Any]:
    """The values a trial can get that decide whether it is valid: the extremes, or every category.
    Categorical values as a trial receives them: the SDK str()s them (launcher.backends.tuning_request)."""
    if isinstance(rng, CategoricalRange):
        return [str(v) if not isinstance(v, str) else v for v in rng.values]
    return list(dict.fromkeys((rng.min_value, rng.max_value)))


def trial_variants(tuning: TuningConfig) -> list[dict[str, Any]]:
    """The tuned values of each trial that is checked (see the module's docstring)."""
    variants = [{name: value} for name, rng in tuning.ranges.items() for value in range_values(rng)]
    if len(tuning.ranges) > 1:
        variants.append({n: range_values(r)[0] for n, r in tuning.ranges.items()})
        variants.append({n: range_values(r)[-1] for n, r in tuning.ranges.items()})
    return variants


def trial_instances(tuning: TuningConfig) -> list[dict[str, Any]]:
    """The job settings of each instance a trial may run on ({}: the job's own)."""
    if not tuning.instance_configs:
        return [{}]
    return [{"instance_type": i.instance_type, "instance_count": i.instance_count,
             **({"volume_size": i.volume_size_in_gb} if i.volume_size_in_gb else {})} for i in tuning.instance_configs]


def trial_settings(job, values: dict[str, Any], instance: dict[str, Any] | None = None) -> dict:
    """The trial's job as settings: the job's, with the tuned hyperparameters (and the instance) set
    and no sweep."""
    raw = job.config.model_dump(exclude_unset=True)
    raw.pop("tuning", None)
    raw["hyperparameters"] = {**job.config.hyperparameters.raw(), **values}
    raw.update(instance or {})
    return raw


def tuning_issues(job, tuning: TuningConfig, check_trial: TrialCheck) -> list[Issue]:
    """Errors and warnings of a sweep over `job` (a ValidatedJob)."""
    issues = _name_issues(job, tuning) + _objective_issues(job, tuning)
    if any(i.level == "error" for i in issues):
        return issues  # the trials would fail for these reasons first
    return issues + _trial_issues(job, tuning, check_trial)


def _name_issues(job, tuning: TuningConfig) -> list[Issue]:
    issues = []
    known = TrainingHyperparameters.model_fields
    static = job.config.hyperparameters.raw()
    for name, rng in tuning.ranges.items():
        where = f"tuning.ranges.{name}"
        if name.startswith(RESERVED_PREFIX):
            issues.append(Issue(where, name, "is a name SageMaker's toolkit reserves for itself",
                                "tune a hyperparameter of the script, not a sagemaker_* setting"))
            continue
        if job.kind.runtime and name not in known:
            issues.append(Issue(where, name, "is not a hyperparameter smlaunch's train.py reads, so every trial "
                                "would train alike", known_name_hint(name, known) or "tune one of its "
                                "hyperparameters (smlaunch schema lists them)"))
            continue
        if name in static:
            issues.append(Issue(where, static[name], "is also a static hyperparameter; the trials get the tuned "
                                "value (the static one is dropped, as the SDK does)",
                                f"remove {name} from hyperparameters", level="warning"))
        if job.kind.runtime:  # a user script's hyperparameters are its own to type
            issues += _type_issues(where, known[name].annotation, rng)
    return issues


def _type_issues(where: str, annotation: Any, rng) -> list[Issue]:
    types = {_base_type(t) for t in typing.get_args(annotation) or (annotation,)}
    if isinstance(rng, ContinuousRange) and int in types and float not in types:
        return [Issue(where, f"{rng.min_value}..{rng.max_value}", "is a continuous range of a whole-number "
                      "hyperparameter: trials would get fractions", "use an IntegerParameter (kind: integer)")]
    if not isinstance(rng, CategoricalRange) and not types & {int, float}:
        return [Issue(where, f"{rng.min_value}..{rng.max_value}", "is a numeric range of a hyperparameter that "
                      "is not a number", "list its values in a CategoricalParameter (kind: categorical)")]
    return []


def _base_type(annotation: Any) -> Any:
    """float of Annotated[float, ...] (FiniteFloat), Literal's value types, the type itself otherwise."""
    if typing.get_origin(annotation) is typing.Annotated:
        return _base_type(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) is typing.Literal:
        return str
    return annotation


def _objective_issues(job, tuning: TuningConfig) -> list[Issue]:
    metric = tuning.objective.metric
    defined = job.config.metric_definitions
    if defined is not None:
        names = [m.Name for m in defined]
    elif job.kind.runtime:
        names = list(METRICS)
    else:
        return [Issue("tuning.objective.metric", metric, "cannot be read: the job's script has no "
                      "metric_definitions to find it in its log",
                      "give metric_definitions=[{'Name': ..., 'Regex': ...}] (to the tuner or the estimator)")]
    if metric in names:
        return []
    return [Issue("tuning.objective.metric", metric, f"is not among the job's metric definitions {names}",
                  did_you_mean(metric, names) or "name one of them, or add its definition to metric_definitions")]


def _trial_issues(job, tuning: TuningConfig, check_trial: TrialCheck) -> list[Issue]:
    failing: dict[str, list[tuple[dict, list[Issue]]]] = {}
    issues = []
    for index, instance in enumerate(trial_instances(tuning)):
        errors = check_trial(trial_settings(job, {}, instance)) if instance else []
        if errors:  # no trial can run there, whatever its tuned values
            issues.append(Issue(f"tuning.instance_configs[{index}]", instance["instance_type"],
                                "makes the job invalid: " + "; ".join(str(e) for e in errors[:2]),
                                "choose an instance the job can run on"))
            continue
        for values in trial_variants(tuning):
            errors = check_trial(trial_settings(job, values, instance))
            if errors:
                key = ",".join(values) if len(values) == 1 else "combined"
                failing.setdefault(key, []).append(({**values, **instance}, errors))
    if len(failing) > 1:  # a combination fails anyway where one value alone does
        failing.pop("combined", None)
    for key, cases in failing.items():
        where = f"tuning.ranges.{key}" if key != "combined" else "tuning.ranges"
        shown = "; ".join(f"{_values(v)} fails: " + "; ".join(str(e) for e in errs[:2]) for v, errs in cases)
        issues.append(Issue(where, [_values(v) for v, _ in cases], f"would make trials that are invalid jobs: {shown}",
                            "narrow the range (or drop the values) to those every trial can run"))
    return issues


def _values(values: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items())
