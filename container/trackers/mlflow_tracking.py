"""MLflow: one run per job, from rank 0, in mlflow_experiment_name (created if missing), with the
job's hyperparameters as its parameters and the job's facts as `smlaunch.*` tags.

The client is MLflow's own (`MlflowClient(tracking_uri)`): it reads MLFLOW_TRACKING_TOKEN, or
MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, for a server that wants them, and an
`arn:aws:sagemaker:...:mlflow-tracking-server/...` URI with the sagemaker-mlflow plugin installed.
"""

from __future__ import annotations

import json
import time

from container.trackers.run_info import RunInfo
from container.trackers.sink import TrackerUnavailable, scalars
from launcher.config import TrainingHyperparameters

NAME = "MLflow"
INSTALL = "install it in the image (pip install 'smlaunch[mlflow]', or mlflow) or remove mlflow_tracking_uri"
DEFAULT_EXPERIMENT = "Default"  # the experiment MLflow's own runs go to without one
BATCH = 100  # log_batch takes at most 100 parameters per call (MLflow's REST limit)


def _text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


class MlflowRun:
    def __init__(self, hp: TrainingHyperparameters, info: RunInfo):
        try:
            from mlflow import MlflowClient
            from mlflow.entities import Param
        except ImportError as exc:
            raise TrackerUnavailable(f"mlflow_tracking_uri is set but the mlflow package is not installed "
                                     f"({exc})", INSTALL) from None
        self.client = MlflowClient(tracking_uri=hp.mlflow_tracking_uri)
        name = hp.mlflow_experiment_name or DEFAULT_EXPERIMENT
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
        run = self.client.create_run(experiment_id, run_name=info.job_name,
                                     tags={f"smlaunch.{k}": str(v) for k, v in info.facts.items()})
        self.run_id = run.info.run_id
        params = [Param(key, _text(value)) for key, value in info.hyperparameters.items()]
        for at in range(0, len(params), BATCH):
            self.client.log_batch(self.run_id, params=params[at:at + BATCH])

    def log(self, record: dict) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(name, float(value), now, record["step"])
                                                    for name, value in scalars(record).items()])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)
