"""The Kubeflow Trainer v2 `TrainJob` (trainer.kubeflow.org/v1alpha1) of a validated job, and the
`Secret` its environment's secrets go in: the manifest never holds a secret's value.

From the job: `instance_count` nodes (numNodes), `processes_per_host` processes on each
(numProcPerNode), what each node asks for (resourcesPerNode: its GPUs and EFA interfaces, CPU and
memory, launcher.kubernetes.resources), `max_run` (activeDeadlineSeconds), `image_uri` and
`environment`. From its `kubernetes:` section (launcher.config.backends.kubernetes): the namespace,
the ClusterTrainingRuntime (runtimeRef), Kueue's queue and priority (labels), and what the pods need
from the cluster (service account, node selector, tolerations, image pull secrets, the storage claim,
/dev/shm), as smlaunch's runtimePatches entry for the runtime's trainer pods.

The pods run the image's `python -m container pod` (container.toolkit.pod), which writes the pod's
/opt/ml tree on the job's storage claim (or, on S3 storage, on the pod's own emptyDir, mirrored to the
job's S3 prefixes: launcher.kubernetes.storage) from the job's ConfigMap (`pod_config_map`: its
hyperparameters, channels and code archive; launcher.wire.pod_config) and the runtime's PET_*
variables, then runs the bootstrap: the SageMaker contract every other backend gives. The job's
hyperparameters and environment values that hold a secret (launcher.wire.masking.carries_secret: a
secret name, or a value such as a URL with a password whatever its name) are in its Secret only.
"""

from __future__ import annotations

import base64
import json
from typing import TYPE_CHECKING

from launcher.backends.base import BackendError
from launcher.backends.sourcedir import program_name
from launcher.config.backends.kubernetes import KubernetesSettings
from launcher.config.job import DEFAULT_CHECKPOINT_PATH
from launcher.config.restarts import restart_environment
from launcher.config.sent_hyperparameters import job_hyperparameters
from launcher.kubernetes import resources
from launcher.kubernetes.kinds import TRAIN_JOB, TRAINER
from launcher.kubernetes.storage import job_dir, s3_locations
from launcher.wire import hyperparameters as wire
from launcher.wire import pod_config
from launcher.wire.masking import carries_secret

if TYPE_CHECKING:
    from launcher.config.validate import ValidatedJob

RUNTIME_REF = {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime"}
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
MANAGED_BY = {"app.kubernetes.io/managed-by": "smlaunch"}
PATCH_MANAGER = "smlaunch"  # whose entry of the TrainJob's runtimePatches this is
STORAGE_VOLUME = "smlaunch-storage"
SCRATCH_VOLUME = "smlaunch-scratch"  # on S3 storage: the pod's own disk for its /opt/ml tree
CONFIG_VOLUME = "smlaunch-config"
COMMAND = ["python", "-m", "container", "pod"]
# A ConfigMap holds at most 1 MiB (etcd's object limit): its JSON and the code archive, base64 encoded.
CONFIG_MAP_LIMIT = 1 << 20
# What a stop gives the pods between SIGTERM and SIGKILL: the bootstrap's shutdown timeout (100 s,
# container.toolkit.bootstrap) and time to write the outcome, as SageMaker's ~120 s.
GRACE_PERIOD_S = 120


def env_secret_name(name: str) -> str:
    """The Secret that holds job `name`'s secret environment values and hyperparameters."""
    return f"{name}-env"


def config_map_name(name: str) -> str:
    """The ConfigMap that holds job `name`'s pod configuration and code archive."""
    return f"{name}-smlaunch"


def hyperparameters(job: ValidatedJob, name: str) -> tuple[dict[str, str], dict[str, str]]:
    """The job's hyperparameters.json (wire-encoded, the code archive at the pods' ConfigMap mount) as
    (what the ConfigMap carries, what the Secret carries): those that hold a secret, by name or by value."""
    cfg = job.config
    encoded = wire.encode(job_hyperparameters(
        cfg, instance_type=cfg.instance_type, program=program_name(cfg), job_name=name, region=cfg.region,
        submit_directory=f"{pod_config.CONFIG_DIR}/{pod_config.SOURCE_ARCHIVE}"))
    decoded = wire.decode(encoded)
    secret = {k for k in encoded if carries_secret(k, decoded[k])}
    return {k: v for k, v in encoded.items() if k not in secret}, {k: encoded[k] for k in secret}


def secret_environment(job: ValidatedJob) -> dict[str, str]:
    """The job's environment values that hold a secret, by name or by value: the Secret's."""
    return {k: v for k, v in job.config.environment.items() if carries_secret(k, v)}


def pod_config_map(job: ValidatedJob, name: str, settings: KubernetesSettings, archive: bytes) -> dict:
    """The ConfigMap every pod mounts at launcher.wire.pod_config.CONFIG_DIR: what its /opt/ml tree is
    written from (no secret: those are in the Secret), and the code archive. BackendError past 1 MiB."""
    cfg = job.config
    config = {"instance_type": cfg.instance_type, "input_mode": cfg.input_mode,
              "channels": {n: c.s3_data for n, c in cfg.channels().items()},
              "distributions": {n: c.distribution for n, c in cfg.channels().items()},
              "hyperparameters": hyperparameters(job, name)[0]}
    if settings.storage.s3:  # each pod's tree on its own disk, mirrored to S3 (container.toolkit.pod_storage)
        config["s3"] = s3_locations(job, name, settings)
    else:
        config["job_dir"] = job_dir(job, name, settings)
        config["checkpoint_dir"] = claim_checkpoint_dir(job, name, settings)
    text, encoded = json.dumps(config, indent=2, sort_keys=True), base64.b64encode(archive).decode()
    if len(text) + len(encoded) > CONFIG_MAP_LIMIT:
        raise BackendError(f"the job's code archive is {len(archive)} bytes, more than the pods' ConfigMap "
                           f"holds (1 MiB with its configuration, base64 encoded): make source_dir smaller "
                           "(leave data and checkpoints out of it; put them on the job's storage)")
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": config_map_name(name), "namespace": settings.namespace, "labels": dict(MANAGED_BY)},
            "data": {pod_config.CONFIG_FILE: text}, "binaryData": {pod_config.SOURCE_ARCHIVE: encoded}}


def claim_checkpoint_dir(job: ValidatedJob, name: str, settings: KubernetesSettings) -> str:
    """The job's checkpoint directory on the claim: checkpoint_local_path (on the claim), else
    <job dir>/checkpoints. BackendError for a path the pods do not see."""
    cfg = job.config
    checkpoints = f"{job_dir(job, name, settings)}/checkpoints"
    if cfg.checkpoint_local_path not in (None, DEFAULT_CHECKPOINT_PATH):
        if not cfg.checkpoint_local_path.startswith(settings.storage.mount_path + "/"):
            raise BackendError(f"checkpoint_local_path {cfg.checkpoint_local_path} is a path the cluster's pods do "
                               f"not see: give a path under kubernetes.storage.mount_path "
                               f"({settings.storage.mount_path}), or leave it out (<job>/checkpoints there)")
        checkpoints = cfg.checkpoint_local_path
    return checkpoints


def train_job(job: ValidatedJob, name: str, settings: KubernetesSettings) -> dict:
    """The TrainJob that runs `job` as `name`."""
    labels = job_labels(settings)
    spec = {"runtimeRef": {**RUNTIME_REF, "name": settings.runtime_ref},
            "activeDeadlineSeconds": job.config.max_run, "trainer": _trainer(job, name, settings)}
    spec["runtimePatches"] = [{"manager": PATCH_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {
        "replicatedJobs": [{"name": TRAINER, "template": {"spec": {"template": {
            "spec": pod_spec(job, name, settings)}}}}]}}}}]
    return {"apiVersion": TRAIN_JOB.api_version, "kind": TRAIN_JOB.name,
            "metadata": {"name": name, "namespace": settings.namespace, "labels": labels}, "spec": spec}


def job_labels(settings: KubernetesSettings) -> dict[str, str]:
    """smlaunch's label and Kueue's queue and priority labels, as the job (and its pods) carry them."""
    return {**MANAGED_BY, **({QUEUE_LABEL: settings.queue} if settings.queue else {}),
            **({PRIORITY_LABEL: settings.priority_class} if settings.priority_class else {})}


def env_secret(job: ValidatedJob, name: str, settings: KubernetesSettings) -> dict | None:
    """The Secret of the job's secret environment values and hyperparameters (None: it has none),
    created beside the TrainJob."""
    secrets = secret_environment(job)
    if hidden := hyperparameters(job, name)[1]:
        secrets[pod_config.SECRET_HYPERPARAMETERS_KEY] = json.dumps(hidden)
    if not secrets:
        return None
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "stringData": secrets,
            "metadata": {"name": env_secret_name(name), "namespace": settings.namespace, "labels": dict(MANAGED_BY)}}


def pod_env(job: ValidatedJob, name: str) -> list[dict]:
    """The trainer container's environment: the job's (those holding a secret from its Secret), the
    restart budget, and the Secret's hyperparameters."""
    cfg = job.config
    secret = secret_environment(job)
    env = [{"name": k, "valueFrom": {"secretKeyRef": {"name": env_secret_name(name), "key": k}}}
           if k in secret else {"name": k, "value": v}
           for k, v in {**cfg.environment, **restart_environment(cfg)}.items()]
    if hyperparameters(job, name)[1]:
        env.append({"name": pod_config.SECRET_HYPERPARAMETERS_ENV, "valueFrom": {"secretKeyRef": {
            "name": env_secret_name(name), "key": pod_config.SECRET_HYPERPARAMETERS_KEY}}})
    return env


def _trainer(job: ValidatedJob, name: str, settings: KubernetesSettings) -> dict:
    cfg = job.config
    env = pod_env(job, name)
    trainer = {"image": cfg.image_uri, "command": COMMAND, "numNodes": cfg.instance_count,
               "numProcPerNode": job.processes_per_host or 1}
    if env:
        trainer["env"] = env
    devices, requests = resources.devices(job, settings), resources.requests(settings)
    if devices or requests:  # a CPU node that asks for nothing: the runtime's own requests stand
        trainer["resourcesPerNode"] = {**({"limits": devices} if devices else {}),
                                       **({"requests": requests} if requests else {})}
    return trainer


def pod_spec(job: ValidatedJob, name: str, settings: KubernetesSettings) -> dict:
    """What the job's trainer pods get (a TrainJob's runtime patch; a HyperPodPyTorchJob's pod template):
    the job's ConfigMap and storage claim mounted, /dev/shm, a stop's grace period, and what the section
    asks of the cluster."""
    pods: dict = {"terminationGracePeriodSeconds": GRACE_PERIOD_S}
    if settings.service_account:
        pods["serviceAccountName"] = settings.service_account
    if settings.node_selector:
        pods["nodeSelector"] = dict(settings.node_selector)
    if settings.tolerations:
        pods["tolerations"] = [{{"toleration_seconds": "tolerationSeconds"}.get(k, k): v
                                for k, v in t.model_dump(exclude_none=True).items()} for t in settings.tolerations]
    if settings.image_pull_secrets:
        pods["imagePullSecrets"] = [{"name": s} for s in settings.image_pull_secrets]
    pods["volumes"] = [{"name": CONFIG_VOLUME, "configMap": {"name": config_map_name(name)}}]
    mounts = [{"name": CONFIG_VOLUME, "mountPath": pod_config.CONFIG_DIR, "readOnly": True}]
    storage = settings.storage
    if storage and storage.pvc:
        pods["volumes"].append({"name": STORAGE_VOLUME, "persistentVolumeClaim": {"claimName": storage.pvc}})
        mounts.append({"name": STORAGE_VOLUME, "mountPath": storage.mount_path})
    elif storage and storage.s3:
        pods["volumes"].append({"name": SCRATCH_VOLUME, "emptyDir": {}})
        mounts.append({"name": SCRATCH_VOLUME, "mountPath": pod_config.SCRATCH_DIR})
    if shm := resources.shared_memory(job, settings):
        pods["volumes"].append(shm[0])
        mounts.append(shm[1])
    pods["containers"] = [{"name": TRAINER, "volumeMounts": mounts}]
    return pods
