"""A TrainJob's state as smlaunch's (DescribeTrainingJob's) statuses, from its conditions and pods.

Kubeflow Trainer v2.3.0 sets three condition types (kubeflow/trainer v2.3.0,
pkg/apis/trainer/v1alpha1/trainjob_types.go; pkg/controller/trainjob_controller.go):
`Suspended` (True, reason `Suspended`, "TrainJob is suspended", while spec.suspend is true: Kueue's
webhook sets it on a queued job until its queue admits it; False, reason `Resumed`, after), and
`Complete` and `Failed`, copied from its JobSet's `Completed` and `Failed` conditions with their
reasons (JobSet v0.12.0 pkg/constants/constants.go: `AllJobsCompleted`, `FailedJobs` "... (first failed
job: <job>)", `ReachedMaxRestarts`), or `Failed` with the Trainer's own `DeadlineExceeded`
(activeDeadlineSeconds) or `TrainingRuntimeNotSupported`. A job neither suspended nor ended is
starting until a pod runs. A failure names the pods that failed and how (exit code, reason), as the
bootstrap's own failure report is in the pod's log.
"""

from __future__ import annotations

# A pod's index in its Indexed Job, which is the TrainJob's node rank: Kubernetes' Job controller sets
# the annotation on every pod (PET_NODE_RANK is read from it), and the label of the same name too
# where the PodIndexLabel feature is on (beta from 1.28, on by default).
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


def host_of(pod: dict) -> str:
    """algo-<rank + 1> of a pod of the job (its name where it has no index)."""
    meta = pod["metadata"]
    index = ((meta.get("annotations") or {}).get(COMPLETION_INDEX)
             or (meta.get("labels") or {}).get(COMPLETION_INDEX, ""))
    return f"algo-{int(index) + 1}" if index.isdigit() else meta["name"]


def job_status(train_job: dict, pods: list[dict]) -> dict:
    """TrainingJobStatus, SecondaryStatus and StatusMessage (FailureReason for a failure)."""
    true = {c["type"]: c for c in train_job.get("status", {}).get("conditions", []) if c.get("status") == "True"}
    if "Failed" in true:
        reason = _said(true["Failed"])
        failed = _pod_failures(pods)
        return {"TrainingJobStatus": "Failed", "SecondaryStatus": "Failed", "StatusMessage": reason,
                "FailureReason": reason + (f"; {failed}" if failed else "")}
    if "Complete" in true:
        return {"TrainingJobStatus": "Completed", "SecondaryStatus": "Completed",
                "StatusMessage": _said(true["Complete"])}
    if "Suspended" in true or train_job.get("spec", {}).get("suspend"):  # Kueue's webhook set it before the Trainer
        said = _said(true["Suspended"]) if "Suspended" in true else "spec.suspend is true"
        return {"TrainingJobStatus": "InProgress", "SecondaryStatus": "Pending", "StatusMessage": f"queued: {said}"}
    running = sum(1 for p in pods if p.get("status", {}).get("phase") == "Running")
    if running:
        return {"TrainingJobStatus": "InProgress", "SecondaryStatus": "Training",
                "StatusMessage": f"{running} pod(s) running"}
    return {"TrainingJobStatus": "InProgress", "SecondaryStatus": "Starting", "StatusMessage": "waiting for the pods"}


def _said(condition: dict) -> str:
    return ": ".join(part for part in (condition.get("reason"), condition.get("message")) if part) or condition["type"]


def _pod_failures(pods: list[dict]) -> str:
    """`algo-2 (pod ...): exit code 1 (Error)` for each container that ended with a failure."""
    out = []
    for pod in sorted(pods, key=host_of):
        for status in pod.get("status", {}).get("containerStatuses") or []:
            ended = (status.get("state") or {}).get("terminated") or {}
            if ended.get("exitCode"):
                out.append(f"{host_of(pod)} (pod {pod['metadata']['name']}): exit code {ended['exitCode']}"
                           + (f" ({ended['reason']})" if ended.get("reason") else ""))
    return "; ".join(out)
