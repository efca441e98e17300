"""A job's state (a TrainJob's or a HyperPodPyTorchJob's) as smlaunch's (DescribeTrainingJob's)
statuses, from its conditions, its spec's suspension and its pods.

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

HyperPod's CRD documents its conditions' type as "Complete or Failed" (sagemaker-hyperpod 3.12.0, the
unified config's Conditions.type), beside others its operator sets while the job runs (the newest is
shown); Kueue holds it by spec.runPolicy.suspend.
"""

from __future__ import annotations

from launcher.kubernetes.kinds import TRAIN_JOB, JobKind
from launcher.wire.opt_ml import host_name

# A pod's index in its Indexed Job, which is the TrainJob's node rank: Kubernetes' Job controller sets
# the annotation on every pod (PET_NODE_RANK is read from it), and the label of the same name too
# where the PodIndexLabel feature is on (beta from 1.28, on by default).
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


def host_of(pod: dict) -> str:
    """algo-<rank + 1> of a pod of the job (its name where it has no index)."""
    meta = pod["metadata"]
    index = ((meta.get("annotations") or {}).get(COMPLETION_INDEX)
             or (meta.get("labels") or {}).get(COMPLETION_INDEX, ""))
    return host_name(int(index)) if index.isdigit() else meta["name"]


def job_status(job: dict, pods: list[dict], kind: JobKind = TRAIN_JOB) -> dict:
    """TrainingJobStatus, SecondaryStatus and StatusMessage (FailureReason for a failure)."""
    conditions = [c for c in (job.get("status") or {}).get("conditions") or [] if c.get("status") == "True"]
    true = {c["type"]: c for c in conditions}
    if "Failed" in true:
        reason = _said(true["Failed"])
        failed = _pod_failures(pods)
        return {"TrainingJobStatus": "Failed", "SecondaryStatus": "Failed", "StatusMessage": reason,
                "FailureReason": reason + (f"; {failed}" if failed else "")}
    if "Complete" in true:
        return {"TrainingJobStatus": "Completed", "SecondaryStatus": "Completed",
                "StatusMessage": _said(true["Complete"])}
    if "Suspended" in true or kind.suspended(job):  # Kueue's webhook may set the spec before the Trainer's condition
        said = _said(true["Suspended"]) if "Suspended" in true else f"{'.'.join(kind.suspend_field)} is true"
        return {"TrainingJobStatus": "InProgress", "SecondaryStatus": "Pending", "StatusMessage": f"queued: {said}"}
    newest = max(conditions, key=lambda c: c.get("lastTransitionTime") or "", default=None)
    said = f" ({newest['type']}: {_said(newest)})" if newest and newest["type"] != "Created" else ""
    running = sum(1 for p in pods if p.get("status", {}).get("phase") == "Running")
    if running:
        return {"TrainingJobStatus": "InProgress", "SecondaryStatus": "Training",
                "StatusMessage": f"{running} pod(s) running{said}"}
    return {"TrainingJobStatus": "InProgress", "SecondaryStatus": "Starting",
            "StatusMessage": f"waiting for the pods{said}"}


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
