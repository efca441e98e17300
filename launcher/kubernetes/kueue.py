"""Why Kueue holds a queued TrainJob: its Workload's word, which the TrainJob itself does not carry.

Kueue integrates TrainJob directly (kubernetes-sigs/kueue v0.19.2, pkg/controller/jobs/trainjob;
the framework `trainer.kubeflow.org/trainjob` is on in its release manifests' configuration): its
webhook sets spec.suspend on a TrainJob labelled kueue.x-k8s.io/queue-name, so Kubeflow Trainer's
`Suspended` condition says only "TrainJob is suspended"; Kueue's reason (no quota, no matching
flavor, ...) is on the Workload it creates for the job, labelled kueue.x-k8s.io/job-uid with the
TrainJob's uid, as its QuotaReserved (or Admitted) condition while False (apis/kueue/v1beta2,
served since v0.15.0). Admitting the job, Kueue sets spec.suspend back to false and writes its own
runtimePatches entry (manager kueue.x-k8s.io/manager) beside smlaunch's.
"""

# Imports inside functions: the kubernetes client is optional and heavy (launcher.kubernetes.cluster).
from __future__ import annotations

from typing import Any

from launcher.kubernetes.cluster import _reaching, _refused  # the client's errors, said as everywhere else

GROUP, VERSION, PLURAL = "kueue.x-k8s.io", "v1beta2", "workloads"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
WAITING = ("QuotaReserved", "Admitted")  # the first of these that is False says why the job waits


@_reaching
def why_queued(api: Any, namespace: str, train_job: dict) -> str:
    """Kueue's reason for holding the TrainJob (`reason: message` of its Workload's condition), or
    why it cannot be told ("" while Kueue has not written one yet)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    uid = train_job["metadata"].get("uid", "")
    try:
        found = client.CustomObjectsApi(api).list_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, label_selector=f"{JOB_UID_LABEL}={uid}")
    except ApiException as exc:
        if exc.status in (403, 404):  # no Kueue (v0.15+) here, or no right to read its Workloads
            return f"Kueue's Workload cannot be read ({_refused(exc, 'listing Workloads')})"
        raise _refused(exc, f"listing the Workload of {namespace}/{train_job['metadata']['name']}") from None
    for workload in found.get("items", []):
        conditions = {c["type"]: c for c in workload.get("status", {}).get("conditions", [])}
        for kind in WAITING:
            if conditions.get(kind, {}).get("status") == "False":
                said = conditions[kind]
                return f"Kueue: {said.get('reason', kind)}: {said.get('message', '')}".rstrip(": ")
    return ""
