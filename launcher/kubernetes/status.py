"""A job's state (a TrainJob's or a HyperPodPyTorchJob's) as smlaunch's (DescribeTrainingJob's)
statuses, from its conditions, its spec's suspension and its pods.

Kubeflow Trainer v2 sets the conditions Created, Suspended (Kueue holds the job until its queue
admits it), Complete and Failed. HyperPod's CRD documents its conditions' type as "Complete or
Failed" (the unified config's Conditions.type), beside others its operator sets while the job runs
(Created, and whatever else: the newest is shown); Kueue holds it by spec.runPolicy.suspend. A job
neither suspended nor ended is starting until a pod runs.
A failure names the pods that failed and how (exit code, reason), as the bootstrap's own failure
report is in the pod's log.
"""

from __future__ import annotations

from launcher.kubernetes.kinds import TRAIN_JOB, JobKind

COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"  # a pod's node rank in its indexed Job


def host_of(pod: dict) -> str:
    """algo-<rank + 1> of a pod of the job (its name where it has no index)."""
    index = pod["metadata"].get("labels", {}).get(COMPLETION_INDEX_LABEL, "")
    return f"algo-{int(index) + 1}" if index.isdigit() else pod["metadata"]["name"]


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
    if "Suspended" in true:
        return {"TrainingJobStatus": "InProgress", "SecondaryStatus": "Pending",
                "StatusMessage": f"queued (suspended): {_said(true['Suspended'])}"}
    if kind.suspended(job):
        return {"TrainingJobStatus": "InProgress", "SecondaryStatus": "Pending",
                "StatusMessage": f"suspended ({'.'.join(kind.suspend_field)}): queued by Kueue until admitted"}
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
