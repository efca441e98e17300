"""A trial's objective, read from its own metrics as `smlaunch metrics` reads them
(launcher.backends.jobmetrics): smlaunch's runtime's metrics.jsonl (`validation:loss` is its
`val_loss`, by step), or for a script of the user's own its `metric_definitions` over its log (by
the value's position). A trial's final objective is the last value, as SageMaker's
FinalHyperParameterTuningJobObjectiveMetric is "the latest objective metric emitted"; the values
before it are what the median rule compares (launcher.tune.median).
"""

from __future__ import annotations

from launcher.backends.jobmetrics import NoMetricsError
from launcher.backends.log_metrics import POINT, LogMetrics
from launcher.wire.metric_lines import METRICS

Series = list[tuple[float, float]]  # (step or position, value), oldest first


class ObjectiveUnreadable(Exception):
    """The trial's objective can no longer be read from its log: why."""


def objective_series(backend, name: str, metric: str, logs: dict[str, LogMetrics] | None = None) -> Series:
    """The objective's values of job `name` so far; [] while it has written none. `logs`: the readers
    of the trials' logs by name, each reading on from where it stopped (launcher.backends.jobmetrics)."""
    try:
        metrics = backend.metrics(name, logs)
    except NoMetricsError:
        metrics = None
    given_up = (logs or {}).get(name, LogMetrics([])).given_up.get(metric)
    if given_up:
        raise ObjectiveUnreadable(f"its objective {metric} cannot be read from its log: {given_up}")
    if metrics is None:
        return []
    # metrics.jsonl keys smlaunch's metrics by their short names; log records by the definition's Name
    key = metric if metrics.x == POINT else METRICS.get(metric, metric)
    steps, values = metrics.series(key)
    return list(zip(steps, values))


def final(series: Series) -> float | None:
    return series[-1][1] if series else None


def better(a: float, b: float, minimize: bool) -> bool:
    return a < b if minimize else a > b

