"""Why Kueue holds a queued job: its Workload's word, which the job itself does not carry.

Kueue integrates TrainJob directly (kubernetes-sigs/kueue v0.19.2, pkg/controller/jobs/trainjob;
the framework `trainer.kubeflow.org/trainjob` is on in its release manifests' configuration): its
webhook sets spec.suspend on a TrainJob labelled kueue.x-k8s.io/queue-name, so Kubeflow Trainer's
`Suspended` condition says only "TrainJob is suspended"; Kueue's reason (no quota, no matching
flavor, ...) is on the Workload it creates for the job, labelled kueue.x-k8s.io/job-uid with the
TrainJob's uid, as its QuotaReserved (or Admitted) condition while False (apis/kueue/v1beta2,
served since v0.15.0). Admitting the job, Kueue sets spec.suspend back to false and writes its own
runtimePatches entry (manager kueue.x-k8s.io/manager) beside smlaunch's.

So a queued TrainJob is not suspended through its spec: Kueue starts a suspended job whose Workload
it has admitted again (pkg/controller/jobframework/reconciler.go, "handle job is suspended"). It is
paused by deactivating its Workload (spec.active: false), which evicts it: Kueue suspends the
TrainJob, whose pods get SIGTERM and their grace period; spec.active: true queues it again.

A HyperPodPyTorchJob queued by Kueue (HyperPod's task governance) is found and paused the same way:
the job-uid label is Kueue's job framework's, which every integration's Workload carries; only a
HyperPod cluster shows its reasons' words (docs/kubernetes.md).
"""

# Imports inside functions: the kubernetes client is optional and heavy (launcher.kubernetes.cluster).
from __future__ import annotations

import json
from typing import Any

from launcher.backends.base import BackendError
from launcher.kubernetes import cluster
from launcher.kubernetes.cluster import _reaching, _refused  # the client's errors, said as everywhere else
from launcher.kubernetes.kinds import JobKind
from launcher.kubernetes.manifest import QUEUE_LABEL

GROUP, VERSION, PLURAL = "kueue.x-k8s.io", "v1beta2", "workloads"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
WAITING = ("QuotaReserved", "Admitted")  # the first of these that is False says why the job waits


def _workload(api: Any, namespace: str, job: dict) -> dict | None:
    """The job's Workload (None: Kueue has made none yet); ApiException as the client raised it."""
    from kubernetes import client

    found = client.CustomObjectsApi(api).list_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, label_selector=f"{JOB_UID_LABEL}={job['metadata'].get('uid', '')}")
    return next(iter(found.get("items", [])), None)


@_reaching
def why_queued(api: Any, namespace: str, job: dict) -> str:
    """Kueue's reason for holding the job (`reason: message` of its Workload's condition), or
    why it cannot be told ("" while Kueue has not written one yet)."""
    from kubernetes.client.exceptions import ApiException

    try:
        workload = _workload(api, namespace, job)
    except ApiException as exc:
        if exc.status in (403, 404):  # no Kueue (v0.15+) here, or no right to read its Workloads
            return f"Kueue's Workload cannot be read ({_refused(exc, 'listing Workloads')})"
        raise _refused(exc, f"listing the Workload of {namespace}/{job['metadata']['name']}") from None
    conditions = {c["type"]: c for c in (workload or {}).get("status", {}).get("conditions", [])}
    for kind in WAITING:
        if conditions.get(kind, {}).get("status") == "False":
            said = conditions[kind]
            return f"Kueue: {said.get('reason', kind)}: {said.get('message', '')}".rstrip(": ")
    return ""


@_reaching
def suspend(api: Any, kind: JobKind, namespace: str, name: str) -> str:
    """Pause the job so that it can be resumed: its spec's suspension (launcher.kubernetes.kinds), or,
    where Kueue queues it, its Workload's spec.active; how it was paused and how to resume it."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    found = cluster.get_job(api, kind, namespace, name)
    if found is None or QUEUE_LABEL not in (found["metadata"].get("labels") or {}):
        cluster.suspend(api, kind, namespace, name)
        return (f"suspended by smlaunch stop (resume: kubectl patch {kind.plural} {name} -n {namespace} --type merge "
                f"-p '{json.dumps(kind.suspension(False))}')")
    try:
        workload = _workload(api, namespace, found)
        if workload is None:
            raise BackendError(f"Kueue has not made the Workload of {kind.name} {namespace}/{name} yet, and it "
                               "would start a suspended job again once admitted: run smlaunch stop again in a "
                               "moment, or set kubernetes.on_stop: delete")
        wl = workload["metadata"]["name"]
        client.CustomObjectsApi(api).patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, wl,
                                                                    {"spec": {"active": False}})
    except ApiException as exc:
        raise _refused(exc, f"deactivating the Kueue Workload of {kind.name} {namespace}/{name}") from None
    return (f"suspended by smlaunch stop: its Kueue Workload {wl} deactivated, which evicts it (resume: kubectl "
            f"patch workload {wl} -n {namespace} --type merge -p '{{\"spec\": {{\"active\": true}}}}')")
