"""The metrics trackers a job's records also go to, beside metrics.jsonl, the [metrics] lines and
TensorBoard (container/trainer.py's MetricsWriter, rank 0 only): Weights & Biases (wandb_project),
MLflow (mlflow_tracking_uri), and SageMaker Experiments where the SDK is in the image and the job
has a run. docs/metrics.md says what each receives and what happens when it fails.
"""

from __future__ import annotations

from pathlib import Path

from container.trackers import mlflow_tracking, sagemaker_experiments, weights_and_biases
from container.trackers.continuity import RunIds
from container.trackers.run_info import run_info
from container.trackers.sink import Sink, Tracker, start
from launcher.wire.training.hyperparameters import TrainingHyperparameters

__all__ = ["Sink", "Tracker", "open_trackers"]


def open_trackers(hp: TrainingHyperparameters, world_size: int, instance_type: str | None,
                  checkpoints: Path | None) -> list[Tracker]:
    """Start the trackers the job names (rank 0 calls this once, before training); `checkpoints`:
    the job's checkpoint directory, where the runs' ids are kept for a restart (None without checkpoints)."""
    # what W&B and MLflow are told (SageMaker's run has the job's own record): read only for them
    info = run_info(hp, world_size, instance_type) if hp.wandb_project or hp.mlflow_tracking_uri else None
    required = bool(hp.metrics_required)
    ids = RunIds(checkpoints)
    trackers = []
    if hp.wandb_project:
        trackers.append(start(weights_and_biases.NAME, lambda: weights_and_biases.WandbRun(hp, info, ids), required))
    if hp.mlflow_tracking_uri:
        trackers.append(start(mlflow_tracking.NAME, lambda: mlflow_tracking.MlflowRun(hp, info, ids), required))
    load_run = sagemaker_experiments.load_run_function()
    if load_run is not None:  # the job's own run: never required, as no hyperparameter asks for it
        trackers.append(start(sagemaker_experiments.NAME, lambda: sagemaker_experiments.open_run(load_run), False))
    return [tracker for tracker in trackers if tracker is not None]
