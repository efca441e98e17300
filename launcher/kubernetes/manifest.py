"""The Kubeflow Trainer v2 `TrainJob` (trainer.kubeflow.org/v1alpha1) of a validated job, and the
`Secret` its environment's secrets go in: the manifest never holds a secret's value.

From the job: `instance_count` nodes (numNodes), `processes_per_host` processes on each
(numProcPerNode), the instance type's GPUs per node (resourcesPerNode), `max_run`
(activeDeadlineSeconds), `image_uri` and `environment`. From its `kubernetes:` section
(launcher.config.backends.kubernetes): the namespace, the ClusterTrainingRuntime (runtimeRef),
Kueue's queue and priority (labels), and what the pods need from the cluster (service account,
node selector, tolerations, image pull secrets, the storage claim), as smlaunch's runtimePatches
entry for the runtime's trainer pods.

The pods run the image's `python -m container train`. What each pod's /opt/ml tree then needs (the
hosts and the pod's own from the JobSet's index, the hyperparameters, the channels) is the next
part of the Kubernetes backend and is not rendered here yet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.backends.base import BackendError
from launcher.config.backends.kubernetes import KubernetesSettings
from launcher.wire.masking import is_secret_name

if TYPE_CHECKING:
    from launcher.config.validate import ValidatedJob

API_VERSION = "trainer.kubeflow.org/v1alpha1"
RUNTIME_REF = {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime"}
TRAINER = "node"  # the replicated job, and its container, that Kubeflow's torch runtimes train in
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
MANAGED_BY = {"app.kubernetes.io/managed-by": "smlaunch"}
PATCH_MANAGER = "smlaunch"  # whose entry of the TrainJob's runtimePatches this is
STORAGE_VOLUME = "smlaunch-storage"
COMMAND = ["python", "-m", "container", "train"]
GPU_RESOURCE = "nvidia.com/gpu"


def env_secret_name(name: str) -> str:
    """The Secret that holds job `name`'s secret environment values."""
    return f"{name}-env"


def train_job(job: ValidatedJob, name: str, settings: KubernetesSettings) -> dict:
    """The TrainJob that runs `job` as `name`; BackendError for a kind it cannot render."""
    if settings.kind != "TrainJob":
        raise BackendError(f"kubernetes.kind {settings.kind} is not rendered yet: smlaunch renders Kubeflow "
                           "Trainer's TrainJob; remove kind")
    labels = {**MANAGED_BY, **({QUEUE_LABEL: settings.queue} if settings.queue else {}),
              **({PRIORITY_LABEL: settings.priority_class} if settings.priority_class else {})}
    spec = {"runtimeRef": {**RUNTIME_REF, "name": settings.runtime_ref},
            "activeDeadlineSeconds": job.config.max_run, "trainer": _trainer(job, name)}
    pods = _pod_patch(settings)
    if pods:
        spec["runtimePatches"] = [{"manager": PATCH_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {
            "replicatedJobs": [{"name": TRAINER, "template": {"spec": {"template": {"spec": pods}}}}]}}}}]
    return {"apiVersion": API_VERSION, "kind": "TrainJob",
            "metadata": {"name": name, "namespace": settings.namespace, "labels": labels}, "spec": spec}


def env_secret(job: ValidatedJob, name: str, settings: KubernetesSettings) -> dict | None:
    """The Secret of the job's secret environment values (None: it has none), created beside the TrainJob."""
    secrets = {k: v for k, v in job.config.environment.items() if is_secret_name(k)}
    if not secrets:
        return None
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "stringData": secrets,
            "metadata": {"name": env_secret_name(name), "namespace": settings.namespace, "labels": dict(MANAGED_BY)}}


def _trainer(job: ValidatedJob, name: str) -> dict:
    cfg = job.config
    env = [{"name": k, "valueFrom": {"secretKeyRef": {"name": env_secret_name(name), "key": k}}}
           if is_secret_name(k) else {"name": k, "value": v} for k, v in cfg.environment.items()]
    trainer = {"image": cfg.image_uri, "command": COMMAND, "numNodes": cfg.instance_count,
               "numProcPerNode": job.processes_per_host or 1}
    if env:
        trainer["env"] = env
    gpus = job.instance.accelerators if job.instance else 0
    if gpus:  # a CPU node asks for none: the runtime's own requests stand
        trainer["resourcesPerNode"] = {"limits": {GPU_RESOURCE: str(gpus)}}
    return trainer


def _pod_patch(settings: KubernetesSettings) -> dict:
    """What the runtime's trainer pods get from the section; empty when it asks for nothing."""
    pods: dict = {}
    if settings.service_account:
        pods["serviceAccountName"] = settings.service_account
    if settings.node_selector:
        pods["nodeSelector"] = dict(settings.node_selector)
    if settings.tolerations:
        pods["tolerations"] = [{{"toleration_seconds": "tolerationSeconds"}.get(k, k): v
                                for k, v in t.model_dump(exclude_none=True).items()} for t in settings.tolerations]
    if settings.image_pull_secrets:
        pods["imagePullSecrets"] = [{"name": s} for s in settings.image_pull_secrets]
    storage = settings.storage
    if storage and storage.pvc:
        pods["volumes"] = [{"name": STORAGE_VOLUME, "persistentVolumeClaim": {"claimName": storage.pvc}}]
        pods["containers"] = [{"name": TRAINER, "volumeMounts": [{"name": STORAGE_VOLUME,
                                                                   "mountPath": storage.mount_path}]}]
    return pods
