"""A trial's objective, read from its own metrics as `smlaunch metrics` reads them
(launcher.backends.jobmetrics): smlaunch's runtime's metrics.jsonl (`validation:loss` is its
`val_loss`, by step), or for a script of the user's own its `metric_definitions` over its log (by
the value's position). A trial's final objective is the last value, as SageMaker's
FinalHyperParameterTuningJobObjectiveMetric is "the latest objective metric emitted"; the values
before it are what the median rule compares (launcher.tune.median).
"""

from __future__ import annotations

from launcher.backends.jobmetrics import NoMetricsError, load
from launcher.backends.log_metrics import POINT
from launcher.wire.metric_lines import METRICS

Series = list[tuple[float, float]]  # (step or position, value), oldest first


def objective_series(backend, name: str, metric: str) -> Series:
    """The objective's values of job `name` so far; [] while it has written none."""
    try:
        metrics = load(backend, name)
    except NoMetricsError:
        return []
    # metrics.jsonl keys smlaunch's metrics by their short names; log records by the definition's Name
    key = metric if metrics.x == POINT else METRICS.get(metric, metric)
    steps, values = metrics.series(key)
    return list(zip(steps, values))


def final(series: Series) -> float | None:
    return series[-1][1] if series else None


def better(a: float, b: float, minimize: bool) -> bool:
    return a < b if minimize else a > b

