"""SageMaker Experiments: the records also go to the Run that the job's ExperimentConfig names
(the estimator's `experiment_config`, `fit(experiment_config=...)`), where the SageMaker SDK is
in the image.

The SDK's `load_run()` finds the run itself: it reads TRAINING_JOB_ARN (set by SageMaker in every
training container), describes the job and loads the run of its ExperimentConfig's RunName. Each
record's numbers go to that run with `log_metric(name, value, step=step)` (BatchPutMetrics to the
run's trial component, sent in batches of 10 and at the end). The job's hyperparameters are not
logged again: SageMaker records them with the job.
"""

from __future__ import annotations

import contextlib
import logging
import os

from container.trackers.sink import FAILED, scalars

NAME = "SageMaker Experiments"
JOB_ARN_VARIABLE = "TRAINING_JOB_ARN"  # what the SDK's _RunEnvironment reads
log = logging.getLogger("smlaunch")


def load_run_function():
    """The SDK's load_run, or None where this is no SageMaker training job or the SDK is not in
    the image (said once, at info level: nothing was asked of smlaunch)."""
    if not os.environ.get(JOB_ARN_VARIABLE):
        return None
    try:
        from sagemaker.experiments.run import load_run
    except ImportError:
        log.info("metrics: the sagemaker SDK is not in this image, so nothing goes to a SageMaker Experiments "
                 "run (the metric definitions still send train:loss, ... to CloudWatch)")
        return None
    return load_run


class ExperimentsRun:
    def __init__(self, load_run):
        self._stack = contextlib.ExitStack()
        self.run = self._stack.enter_context(load_run())  # log_metric is allowed inside the run's context only

    def log(self, record: dict) -> None:
        for name, value in scalars(record).items():
            self.run.log_metric(name=name, value=float(value), step=record["step"])

    def close(self, outcome: str) -> None:
        # the SDK sends what is still buffered and records the run's end: Failed, with the message,
        # where its context manager sees an exception, else Completed (a stop too: SageMaker's own
        # job record says Stopped or restarts it)
        if outcome == FAILED:
            self._stack.__exit__(RuntimeError, RuntimeError("the training job failed: see its logs"), None)
        else:
            self._stack.close()


def open_run(load_run) -> ExperimentsRun | None:
    """The job's run, or None for a job without one: the SDK refuses a job whose ExperimentConfig
    has no RunName with a RuntimeError naming it (sagemaker.experiments._utils)."""
    try:
        return ExperimentsRun(load_run)
    except RuntimeError as exc:
        if "RunName" not in str(exc):
            raise
        log.info("metrics: this job has no SageMaker Experiments run (no experiment_config), so nothing goes there")
        return None
