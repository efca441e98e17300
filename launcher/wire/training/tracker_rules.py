"""The metrics trackers' hyperparameters, checked together: a setting of a tracker the job does not
turn on would be ignored, and a job that requires trackers must name one. Validation runs these
for smlaunch's train.py (launcher.config.runtime_rules); the container runs them again before
anything is built (container/trackers)."""

from __future__ import annotations

from launcher.wire.training.hyperparameters import TrainingHyperparameters
from launcher.wire.training.issues import Issue

HP = "hyperparameters"
# the hyperparameter that turns a tracker on -> the settings that mean something only with it
TRACKER_SETTINGS = {
    "wandb_project": ("wandb_entity", "wandb_run_name", "wandb_tags"),
    "mlflow_tracking_uri": ("mlflow_experiment_name",),
}


def tracker_issues(hp: TrainingHyperparameters) -> list[Issue]:
    issues = []
    for switch, settings in TRACKER_SETTINGS.items():
        if getattr(hp, switch):
            continue
        for name in settings:
            if getattr(hp, name) is not None:
                issues.append(Issue(f"{HP}.{name}", getattr(hp, name), f"does nothing without {switch}",
                                    f"set {switch} to send the metrics there, or remove {name}"))
    if hp.wandb_project and "wandb_api_key" in (hp.model_extra or {}):
        # W&B's SageMaker integration, which read this hyperparameter, is off in smlaunch's runtime:
        # it copied every hyperparameter and the training environment, secrets too, into the run.
        issues.append(Issue(f"{HP}.wandb_api_key", hp.model_extra["wandb_api_key"],
                            "is not read: smlaunch's runtime turns W&B's SageMaker integration off (it copied the "
                            "job's secrets into the run), and a hyperparameter is sent and logged in clear",
                            "give the key as WANDB_API_KEY in the job's environment (masked everywhere)"))
    if hp.metrics_required and not any(getattr(hp, switch) for switch in TRACKER_SETTINGS):
        issues.append(Issue(f"{HP}.metrics_required", hp.metrics_required,
                            f"requires the trackers the job names, and it names none ({', '.join(TRACKER_SETTINGS)})",
                            "set wandb_project or mlflow_tracking_uri, or remove metrics_required"))
    return issues
