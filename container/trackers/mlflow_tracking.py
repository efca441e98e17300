"""MLflow: one run per training run (a restart continues it: container.trackers.continuity), from rank
0, in mlflow_experiment_name (created if missing), with the job's hyperparameters as its parameters
and the job's facts as `smlaunch.*` tags (the plan's prediction as `smlaunch.plan.*`).

The client is MLflow's own (`MlflowClient(tracking_uri)`): it reads MLFLOW_TRACKING_TOKEN, or
MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, for a server that wants them, and an
`arn:aws:sagemaker:...:mlflow-tracking-server/...` URI with the sagemaker-mlflow plugin installed.
"""

from __future__ import annotations

import json
import logging
import time

from container.trackers.continuity import RunIds, SentSteps
from container.trackers.run_info import RunInfo
from container.trackers.sink import FAILED, FINISHED, STOPPED, TrackerUnavailable, scalars
from launcher.wire.training.hyperparameters import TrainingHyperparameters

log = logging.getLogger("smlaunch")
NAME = "MLflow"
INSTALL = "install it in the image (pip install 'smlaunch[mlflow]', or mlflow) or remove mlflow_tracking_uri"
DEFAULT_EXPERIMENT = "Default"  # the experiment MLflow's own runs go to without one
BATCH = 100  # log_batch takes at most 100 parameters per call (MLflow's REST limit)
KEY = "mlflow"  # its entry in the checkpoint directory's run ids (container.trackers.continuity)
# what every training record and every validation record has: the last step the run logged
SERIES_WITH_EVERY_STEP = ("train/loss", "validation/loss")
STATUS = {FINISHED: "FINISHED", STOPPED: "KILLED", FAILED: "FAILED"}  # MLflow's RunStatus names


def _text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


class MlflowRun:
    def __init__(self, hp: TrainingHyperparameters, info: RunInfo, ids: RunIds):
        try:
            from mlflow import MlflowClient
            from mlflow.entities import RunTag
        except ImportError as exc:
            raise TrackerUnavailable(f"mlflow_tracking_uri is set but the mlflow package is not installed "
                                     f"({exc})", INSTALL) from None
        self.client = MlflowClient(tracking_uri=hp.mlflow_tracking_uri)
        name = hp.mlflow_experiment_name or DEFAULT_EXPERIMENT
        where = {"tracking_uri": hp.mlflow_tracking_uri, "experiment": name}
        self.run_id = self._continued(ids.get(KEY, where))
        if self.run_id is None:
            self.run_id = self._new_run(name, info)
            self.sent = SentSteps(NAME, None)
        else:  # a restart: the same run goes on; its parameters are the job's already
            self.client.update_run(self.run_id, status="RUNNING")
            self.client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in info.flat_facts().items()])
            self.sent = SentSteps(NAME, self._last_step())
        ids.put(KEY, where, self.run_id)

    def _new_run(self, name: str, info: RunInfo) -> str:
        from mlflow.entities import Param

        experiment = self.client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
        run_id = self.client.create_run(experiment_id, run_name=info.job_name, tags=info.flat_facts()).info.run_id
        params = [Param(key, _text(value)) for key, value in info.hyperparameters.items()]
        for at in range(0, len(params), BATCH):
            self.client.log_batch(run_id, params=params[at:at + BATCH])
        return run_id

    def _continued(self, run_id: str | None) -> str | None:
        """The recorded run, where the server still has it (a deleted one: a new run, said so)."""
        if run_id is None:
            return None
        from mlflow.exceptions import MlflowException

        try:
            stage = self.client.get_run(run_id).info.lifecycle_stage
            reason = None if stage == "active" else f"it was {stage}"
        except MlflowException as exc:
            reason = str(exc).splitlines()[0]
        if reason is not None:
            log.warning("metrics: MLflow run %s, which this job started before a restart, cannot be continued (%s): "
                        "starting a new run", run_id, reason)
            return None
        return run_id

    def _last_step(self) -> int | None:
        steps = [m.step for key in SERIES_WITH_EVERY_STEP for m in self.client.get_metric_history(self.run_id, key)]
        return max(steps, default=None)

    def log(self, record: dict) -> None:
        from mlflow.entities import Metric

        if self.sent.already_sent(record):
            return
        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(name, float(value), now, record["step"])
                                                    for name, value in scalars(record).items()])

    def close(self, outcome: str) -> None:
        self.client.set_terminated(self.run_id, status=STATUS[outcome])
