"""Early stopping `Auto`: SageMaker's median rule (docs/tuning.md).

After each value of its objective at step k, a running trial is compared with the earlier trials:
for each, the running average of its objective up to step k; if the trial's value is worse than the
median of those averages (higher when minimizing, lower when maximizing), it is stopped. The
earlier trials are those that ended with objective values (completed, or stopped by this rule).
SageMaker does not say how many earlier trials it waits for; smlaunch waits for MIN_EARLIER, so
that one early trial cannot stop every later one.
"""

from __future__ import annotations

import statistics

from launcher.tune.objective import Series, better

MIN_EARLIER = 3


def running_average(series: Series, upto: float) -> float | None:
    values = [v for x, v in series if x <= upto]
    return sum(values) / len(values) if values else None


def median_stop(current: Series, earlier: list[Series], minimize: bool) -> str | None:
    """Why the running trial should stop now (its value, step and the median), or None."""
    if not current:
        return None
    step, value = current[-1]
    averages = [a for a in (running_average(s, step) for s in earlier) if a is not None]
    if len(averages) < MIN_EARLIER:
        return None
    median = statistics.median(averages)
    if not better(median, value, minimize):
        return None
    return (f"objective {value:.6g} at step {step:g} is worse than the median {median:.6g} of {len(averages)} "
            "earlier trials' running averages there")
