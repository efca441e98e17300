"""The SageMaker HyperPod `HyperPodPyTorchJob` (sagemaker.amazonaws.com/v1) of a validated job: the
second kind the Kubernetes backend submits (kubernetes.kind), for HyperPod clusters orchestrated by
EKS whose training operator runs it. Its ConfigMap, Secret, environment and pod spec are the
TrainJob's (launcher.kubernetes.manifest); what differs is the object around them and the pods' command.

The shape is the CRD's, as the pydantic models AWS generates from it give it (sagemaker-hyperpod
3.12.0, training/config/hyperpod_pytorch_job_unified_config.py): spec.nprocPerNode,
spec.replicaSpecs[{name, replicas, template}], spec.runPolicy. Kueue's queue and priority are labels of
the job and of its pod template, as AWS's CLI template renders them (hyperpod-pytorch-job-template).

The operator gives a pod no rank in its environment: it tells the pod's HyperPod elastic agent
(`hyperpodrun`, a torchrun that serves the operator on port 8080) the node rank, node count and
master at its /start call, and the agent starts its workers with torch elastic's variables
(hyperpod-elastic-agent 1.1.3). So each pod's command is `hyperpodrun` with one worker,
`python -m container pod`, which reads those variables (launcher.wire.pod_config) and runs the
bootstrap, whose torchrun starts the host's processes and meets the other pods at that master.
The image must have hyperpod-elastic-agent installed (`hyperpodrun` on its PATH).

Restarts: the bootstrap's, as on every backend (`max_restarts`: torchrun restarted on every pod
together from the newest checkpoint). The agent restarts nothing itself (--max-restarts=0) and the
operator retries the job no time (runPolicy.jobMaxRetryCount 0): either would restart the bootstrap,
restarts and all, on top of its own budget.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.config.backends.kubernetes import KubernetesSettings
from launcher.kubernetes import resources
from launcher.kubernetes.kinds import HYPERPOD_JOB
from launcher.kubernetes.manifest import GRACE_PERIOD_S, job_labels, pod_env, pod_spec
from launcher.wire import pod_config

if TYPE_CHECKING:
    from launcher.config.validate import ValidatedJob

REPLICAS = "pod"  # the one replica spec (AWS's CLI template names it so)
AGENT_PORT = 8080  # hyperpodrun's server, which the operator calls (the agent's --server-port default)
# hyperpodrun's default sends its workers SIGKILL 15 s after a SIGTERM; the bootstrap needs SIGTERM and
# its 100 s shutdown (container.toolkit.bootstrap) within the pod's grace period.
SHUTDOWN_TIMEOUT_S = GRACE_PERIOD_S - 10
# A finished job is kept (the CRD's TTL, "-1 for infinite") with its pods (cleanPodPolicy None), as a
# TrainJob is: status reads its conditions and logs read its pods until smlaunch stop or kubectl deletes it.
KEEP = {"ttlSecondsAfterFinished": -1, "cleanPodPolicy": "None"}


def hyperpodrun_command(nodes: int) -> list[str]:
    """The pod's command: the HyperPod elastic agent with one worker, smlaunch's pod entry."""
    return ["hyperpodrun", f"--nnodes={nodes}", "--nproc-per-node=1", "--max-restarts=0",
            "--shutdown-signal=SIGTERM", f"--shutdown-timeout={SHUTDOWN_TIMEOUT_S}",
            f"--server-port={AGENT_PORT}", "--module", "container", "pod"]


def hyperpod_job(job: ValidatedJob, name: str, settings: KubernetesSettings) -> dict:
    """The HyperPodPyTorchJob that runs `job` as `name`."""
    cfg = job.config
    labels = job_labels(settings)
    pod = pod_spec(job, name, settings)
    container = pod["containers"][0]
    container.update(image=cfg.image_uri, command=hyperpodrun_command(cfg.instance_count),
                     env=[{"name": pod_config.HYPERPOD_NNODES_ENV, "value": str(cfg.instance_count)},
                          {"name": pod_config.LAUNCHER_ENV, "value": pod_config.HYPERPODRUN}, *pod_env(job, name)],
                     ports=[{"name": "hyperpod-agent", "containerPort": AGENT_PORT}])
    devices, requests = resources.devices(job, settings), resources.requests(settings)
    if devices or requests:  # a device's request equals its limit, as AWS's SDK requires of accelerators
        container["resources"] = {"requests": {**devices, **requests}, **({"limits": devices} if devices else {})}
    spec = {
        # the agent's workers per pod: one, the bootstrap, whose torchrun starts the host's processes
        "nprocPerNode": "1",
        "replicaSpecs": [{"name": REPLICAS, "replicas": cfg.instance_count,
                          "template": {"metadata": {"labels": dict(labels)}, "spec": pod}}],
        "runPolicy": {"jobMaxRetryCount": 0, "activeDeadlineSeconds": cfg.max_run, **KEEP}}
    return {"apiVersion": HYPERPOD_JOB.api_version, "kind": HYPERPOD_JOB.name,
            "metadata": {"name": name, "namespace": settings.namespace, "labels": labels}, "spec": spec}
