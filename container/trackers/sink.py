"""What every metrics tracker shares: the series a record becomes, and how a tracker's failures are
handled (a warning, once, and training goes on; an error where the job set metrics_required).

A sink has `log(record)` (one record of metrics.jsonl: a step's `{"step", "loss", ...}` or a
validation's `{"step", "val_loss"}`) and `close(outcome)`: how the job's training ended, which each
tracker shows as its run's state. TensorBoard, W&B, MLflow and SageMaker Experiments name the
series alike: train/<key>, validation/loss.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger("smlaunch")
NO_TRACKER_FIX = "metrics.jsonl and the [metrics] log lines still have every record"

# how training ended, as a run's state shows it
FINISHED = "finished"  # every step trained and the model exported
STOPPED = "stopped"  # SIGTERM (a spot interruption, a stop): checkpointed, to be resumed
FAILED = "failed"  # an error on this rank; the job fails


class Sink(Protocol):
    def log(self, record: dict) -> None: ...

    def close(self, outcome: str) -> None: ...


class TrackerUnavailable(RuntimeError):
    """A tracker the job names cannot start: the reason, and what to do about it."""

    def __init__(self, problem: str, fix: str):
        super().__init__(f"{problem}; {fix}")


def series_name(key: str) -> str:
    """Trackers group series by their prefix: train/loss, train/grad_norm, ..., validation/loss."""
    return "validation/loss" if key == "val_loss" else f"train/{key}"


def scalars(record: dict) -> dict[str, float]:
    """The record's numbers by series name; its step is the x axis, not a series."""
    return {series_name(key): value for key, value in record.items()
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)}


class Tracker:
    """A started sink behind the metrics writer. Its first failure is a warning and the sink is
    dropped for the rest of the run (a server that is down would otherwise stall every logged step
    for its client's retries), or, where the job requires its trackers, the job's error."""

    def __init__(self, name: str, sink: Sink, required: bool):
        self.name, self.sink, self.required = name, sink, required

    def log(self, record: dict) -> None:
        self._call("log", record, f"logging step {record['step']}")

    def close(self, outcome: str) -> None:
        self._call("close", outcome, f"marking its run {outcome}")
        self.sink = None

    def _call(self, method: str, argument, what: str) -> None:
        if self.sink is None:  # dropped after a failure
            return
        try:
            getattr(self.sink, method)(argument)
        except Exception as exc:  # noqa: BLE001 - a tracker's client may raise anything; training must not care
            if self.required:
                raise RuntimeError(f"{self.name}: {what} failed ({type(exc).__name__}: {exc}); the job stops, as "
                                   "metrics_required asks (remove it to train on without the tracker)") from exc
            log.warning("%s: %s failed (%s: %s): nothing more goes to %s in this run; training goes on (%s)",
                        self.name, what, type(exc).__name__, exc, self.name, NO_TRACKER_FIX)
            self.sink = None


def start(name: str, opener: Callable[[], Sink | None], required: bool) -> Tracker | None:
    """The tracker `opener` starts (None: it has nothing to log to, and said so); where it cannot
    start, a warning and None, or the job's error before training where the job requires its trackers."""
    try:
        sink = opener()
    except Exception as exc:  # noqa: BLE001 - see Tracker._call
        reason = str(exc) if isinstance(exc, TrackerUnavailable) else f"{type(exc).__name__}: {exc}"
        if required:
            raise RuntimeError(f"{name} could not start: {reason} (metrics_required: the job stops before "
                               "training; remove metrics_required to train without it)") from None
        log.warning("%s could not start: %s. Training goes on without it (%s)", name, reason, NO_TRACKER_FIX)
        return None
    if sink is None:
        return None
    log.info("metrics: sending every record to %s", name)
    return Tracker(name, sink, required)
