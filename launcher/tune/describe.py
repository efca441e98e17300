"""A sweep's state as SageMaker's DescribeHyperParameterTuningJob shapes it: status, the counters
of its trials' statuses and objectives, BestTrainingJob, and (as ListTrainingJobsForHyperParameter-
TuningJob would list them) every trial's summary. TunedHyperParameters are strings, as SageMaker's."""

from __future__ import annotations

from typing import Any

from launcher.tune.state import TERMINAL


def trial_summary(state: dict, trial: dict) -> dict[str, Any]:
    tuning = state["Tuning"]
    summary = {
        "TrainingJobName": trial["TrainingJobName"],
        "TuningJobName": state["HyperParameterTuningJobName"],
        "Handle": trial.get("Handle"),
        "CreationTime": trial.get("CreationTime"),
        "TrainingStartTime": trial.get("TrainingStartTime"),
        "TrainingEndTime": trial.get("TrainingEndTime") if trial["TrainingJobStatus"] in TERMINAL else None,
        "TrainingJobStatus": trial["TrainingJobStatus"],
        "TunedHyperParameters": {k: _text(v) for k, v in trial["TunedHyperParameters"].items()},
        "ObjectiveStatus": _objective_status(trial),
    }
    if trial.get("FinalObjective") is not None:
        summary["FinalHyperParameterTuningJobObjectiveMetric"] = {
            "Type": tuning["objective"]["type"], "MetricName": tuning["objective"]["metric"],
            "Value": trial["FinalObjective"]}
    elif trial["TrainingJobStatus"] == "InProgress" and trial.get("Objective"):
        step, value = trial["Objective"][-1]  # a running trial's latest value: what the median rule compares
        summary["LatestObjective"] = {"Step": step, "Value": value}
    if trial.get("FailureReason"):
        summary["FailureReason"] = trial["FailureReason"]
    if trial.get("EarlyStopped"):
        summary["EarlyStopped"] = trial["EarlyStopped"]
    return {k: v for k, v in summary.items() if v is not None}


def _objective_status(trial: dict) -> str:
    if trial.get("FinalObjective") is not None:
        return "Succeeded"
    return "Pending" if trial["TrainingJobStatus"] == "InProgress" else "Failed"


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def best_summary(state: dict) -> dict | None:
    best = state.get("BestTrainingJobName")
    trial = next((t for t in state["Trials"] if t["TrainingJobName"] == best), None)
    return trial_summary(state, trial) if trial else None


def describe_state(state: dict) -> dict[str, Any]:
    tuning, trials = state["Tuning"], state["Trials"]
    statuses = [t["TrainingJobStatus"] for t in trials]
    objectives = [_objective_status(t) for t in trials]
    limits = {"MaxNumberOfTrainingJobs": tuning.get("max_jobs") or len(trials),
              "MaxParallelTrainingJobs": tuning.get("max_parallel_jobs", 1)}
    if tuning.get("max_runtime_in_seconds"):
        limits["MaxRuntimeInSeconds"] = tuning["max_runtime_in_seconds"]
    out = {
        "HyperParameterTuningJobName": state["HyperParameterTuningJobName"],
        "HyperParameterTuningJobStatus": state["Status"],
        "Backend": state["Backend"],
        "HyperParameterTuningJobConfig": {
            "Strategy": tuning.get("strategy", "Bayesian"),
            "HyperParameterTuningJobObjective": {"Type": tuning["objective"]["type"],
                                                 "MetricName": tuning["objective"]["metric"]},
            "ResourceLimits": limits,
            "TrainingJobEarlyStoppingType": tuning.get("early_stopping", "Off"),
            "RandomSeed": state["RandomSeed"],
        },
        "CreationTime": state.get("CreationTime"),
        "HyperParameterTuningEndTime": state.get("EndTime"),
        "LastModifiedTime": state.get("LastModifiedTime"),
        "TrainingJobStatusCounters": {
            "Completed": statuses.count("Completed"), "InProgress": statuses.count("InProgress"),
            "RetryableError": 0, "NonRetryableError": statuses.count("Failed"), "Stopped": statuses.count("Stopped")},
        "ObjectiveStatusCounters": {"Succeeded": objectives.count("Succeeded"),
                                    "Pending": objectives.count("Pending"), "Failed": objectives.count("Failed")},
        "BestTrainingJob": best_summary(state),
        "FailureReason": state.get("FailureReason"),
        "StatusMessage": state.get("StatusMessage"),
        "TrainingJobs": [trial_summary(state, t) for t in trials],
    }
    return {k: v for k, v in out.items() if v is not None}
