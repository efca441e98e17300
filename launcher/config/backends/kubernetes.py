"""Backend kubernetes's part of a job (issue 42, section 2; not yet a row of the backend table): its
`kubernetes:` section (the cluster, the namespace, the Kubeflow Trainer runtime the job's TrainJob
references, Kueue's queue and priority, where the pods run, and the storage the job's data lives on)
and the rules that relate the section to the rest of the job.

The job's own fields still decide the rest, as for Slurm: `instance_count` is the TrainJob's
numNodes, `processes_per_host` (or the instance type's accelerators) its numProcPerNode, the instance
type's accelerators the GPUs each node asks for, `max_run` its activeDeadlineSeconds, `image_uri`
the image every pod runs.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field, field_validator, model_validator

from launcher.config import images
from launcher.config.backends.kubernetes_names import planned_name_issue
from launcher.config.job_names import default_base_name
from launcher.config.paths import LocalPathText
from launcher.wire.checkpoints import DEFAULT_CHECKPOINT_PATH
from launcher.wire.pod_config import HYPERPOD_ENV, RESERVED_ENV
from launcher.wire.training.base import Strict, WholeNumber
from launcher.wire.training.issues import Issue

# the rules read a Context, whose module imports the job: the job's backend table loads this module by name
if TYPE_CHECKING:
    from launcher.config.context import Context

# Kubernetes' object names: a DNS-1123 label (namespaces, queues) or subdomain (most other objects).
# (A subdomain's 253 characters at most are each field's max_length: pydantic's regex has no lookahead.)
_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
DNS_SUBDOMAIN = rf"^{_SUBDOMAIN}$"
# A label's key ([prefix/]name) and value, as node selectors and tolerations take them.
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
LABEL_KEY = rf"^({_SUBDOMAIN}/)?{_LABEL_NAME}$"
LABEL_VALUE = rf"^({_LABEL_NAME})?$"
# A resource quantity as a pod's requests take it (a subset of Kubernetes' own: no exponents).
Quantity = Annotated[str, Field(pattern=r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")]


class Toleration(Strict):
    """A taint the job's pods tolerate (core/v1 Toleration)."""

    key: str | None = Field(None, pattern=LABEL_KEY, description="The taint's key (none: every taint, with Exists).")
    operator: Literal["Equal", "Exists"] = Field("Equal", description="Equal: the value must match; Exists: any.")
    value: str | None = Field(None, pattern=LABEL_VALUE, description="The taint's value (with Equal).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="The taint's effect (none: every effect).")
    toleration_seconds: WholeNumber | None = Field(
        None, ge=0, description="NoExecute: how long a pod stays on a node after the taint appears.")

    @model_validator(mode="after")
    def _operator(self) -> Toleration:
        if self.operator == "Exists" and self.value is not None:
            raise ValueError("a toleration with operator Exists takes no value; remove value, or use Equal")
        if self.key is None and self.operator != "Exists":
            raise ValueError("a toleration without a key tolerates every taint only with operator Exists")
        return self


class KubernetesStorage(Strict):
    """Where the job's channels, checkpoints and outputs live for its pods: one PersistentVolumeClaim
    every pod mounts, or an S3 prefix the pods read and write as a SageMaker job does (each pod's
    /opt/ml tree then on its own disk, an emptyDir)."""

    pvc: str | None = Field(None, pattern=DNS_SUBDOMAIN, max_length=253, description="A ReadWriteMany "
                            "PersistentVolumeClaim in the job's namespace, mounted by every pod at mount_path.")
    mount_path: LocalPathText = Field("/mnt/smlaunch", description="Where the claim is mounted in the pods; the "
                                      "job's local paths (inputs, output_path) are paths under it.")
    client_path: LocalPathText | None = Field(
        None, description="With pvc: where this machine sees the same claim (an FSx or EFS mount), so "
        "`status` and `metrics` read the job's records there; none: they cannot read them from here.")
    s3: str | None = Field(None, pattern=r"^s3://[^/]+(/.*)?$", description="An S3 prefix: the job's "
                           "checkpoints, records and outputs go under <s3>/<job>/ (its inputs are s3:// channels; "
                           "the pods reach S3 with their service account's role, never keys in the manifest).")

    @model_validator(mode="after")
    def _one(self) -> KubernetesStorage:
        if (self.pvc is None) == (self.s3 is None):
            raise ValueError("give one of pvc (a claim every pod mounts) or s3 (an s3:// prefix)")
        if self.client_path is not None and self.pvc is None:
            raise ValueError("client_path is where this machine mounts the claim pvc: with s3 the records are "
                             "read from S3; remove client_path")
        return self


class PodResources(Strict):
    """What each pod asks of its node beside the GPUs (the instance type's): EFA interfaces, /dev/shm,
    CPU and memory."""

    efa: WholeNumber | None = Field(
        None, ge=0, description="EFA interfaces each pod asks for (vpc.amazonaws.com/efa, the EFA device "
        "plugin's resource); default: a job of several nodes asks for every interface of its instance type "
        "(the instance catalog's count: p5.48xlarge 32, p4d.24xlarge 4, ...), a one-node job none; 0: none.")
    shared_memory: Literal[False] | Quantity | None = Field(
        None, description="/dev/shm as a memory-backed emptyDir of this size (e.g. 256Gi; NCCL and data "
        "loader workers use it); default on GPU nodes: one without a size limit (bounded by the node's memory); "
        "false: none (the container runtime's 64 MiB).")
    cpu: WholeNumber | Quantity | None = Field(
        None, description="CPUs each pod requests (e.g. 180, or 180500m); default: none (a pod that asks for "
        "every GPU of its node has the node anyway).")
    memory: Quantity | None = Field(None, description="Memory each pod requests (e.g. 1800Gi); default: none.")


class KubernetesSettings(Strict):
    """Where and how the job runs on a Kubernetes cluster (backend: kubernetes), as a Kubeflow Trainer
    TrainJob (trainer.kubeflow.org/v1alpha1) queued by Kueue."""

    context: str | None = Field(None, min_length=1, description="The kubeconfig context (default: its current one).")
    kubeconfig: LocalPathText | None = Field(None, description="The kubeconfig file (default: KUBECONFIG, then "
                                             "~/.kube/config; in a pod, its service account).")
    namespace: str = Field("default", pattern=DNS_LABEL, description="The namespace the TrainJob is created in.")
    runtime_ref: str = Field("torch-distributed", pattern=DNS_SUBDOMAIN, max_length=253,
                             description="The ClusterTrainingRuntime the TrainJob references (Kubeflow Trainer's "
                             "torch-distributed by default); a HyperPodPyTorchJob references none.")
    kind: Literal["TrainJob", "HyperPodPyTorchJob"] = Field(
        "TrainJob", description="The object submitted: Kubeflow Trainer's TrainJob, or HyperPod's "
        "HyperPodPyTorchJob on a SageMaker HyperPod EKS cluster.")
    queue: str | None = Field(None, pattern=DNS_LABEL, description="Kueue's LocalQueue (the label "
                              "kueue.x-k8s.io/queue-name); none: the job is not queued by Kueue.")
    priority_class: str | None = Field(None, pattern=DNS_SUBDOMAIN, max_length=253, description="Kueue's "
                                       "WorkloadPriorityClass (the label kueue.x-k8s.io/priority-class).")
    service_account: str | None = Field(None, pattern=DNS_SUBDOMAIN, max_length=253, description="The pods' "
                                        "service account (e.g. one with an IAM role for S3: IRSA or Pod Identity).")
    node_selector: dict[str, str] = Field(default_factory=dict, description="Node labels the pods need, e.g. "
                                          "{'node.kubernetes.io/instance-type': 'p5.48xlarge'}.")
    tolerations: list[Toleration] = Field(default_factory=list, description="Taints the pods tolerate, e.g. "
                                          "nvidia.com/gpu (Exists, NoSchedule).")
    image_pull_secrets: list[str] = Field(default_factory=list, description="Secrets (in the namespace) the "
                                          "image is pulled with.")
    storage: KubernetesStorage | None = Field(None, description="The volume or S3 prefix the job's data, "
                                              "checkpoints and outputs live on.")
    resources: PodResources = Field(default_factory=PodResources, description="What each pod asks of its node "
                                    "beside its GPUs: EFA interfaces, /dev/shm, CPU and memory.")
    on_stop: Literal["delete", "suspend"] = Field(
        "delete", description="What `smlaunch stop` does: delete the job (with its pods, ConfigMap and "
        "Secret), or suspend it (a TrainJob's spec.suspend, a HyperPodPyTorchJob's spec.runPolicy.suspend, or its "
        "Kueue Workload's spec.active where Kueue queues it; its objects stay, and `kubectl patch` resumes it from "
        "its checkpoint). Either way each pod gets SIGTERM and the grace period to save a checkpoint.")

    # The patterns above, for the keys and items a Field's pattern does not reach.
    @field_validator("node_selector")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        bad = [k for k, v in value.items() if not re.fullmatch(LABEL_KEY, k) or not re.fullmatch(LABEL_VALUE, v)]
        if bad:
            raise ValueError(f"{bad} is not a Kubernetes label: a key is [prefix/]name of up to 63 letters, "
                             "digits, '-', '_' or '.', and so is its value")
        return value

    @field_validator("image_pull_secrets")
    @classmethod
    def _secrets(cls, value: list[str]) -> list[str]:
        bad = [s for s in value if len(s) > 253 or not re.fullmatch(DNS_SUBDOMAIN, s)]
        if bad:
            raise ValueError(f"{bad}: a Secret's name is lower-case letters, digits, '-' and '.'")
        return value


def target(job) -> tuple[str, str]:
    """(kind, label) of script_rules.Target: the pods' image, whose contents smlaunch does not know."""
    return "image", f"the image {job.image_uri} on the cluster"


def image_text(job) -> str:
    """What the pods run (validate's summary): image_uri, which the rules require, whatever the instance type."""
    return f"{job.config.image_uri} (every host runs it on the cluster)"


def check_kubernetes(ctx: Context) -> list[Issue]:
    """The section against the job: what the pods need that a local job does not."""
    job, inst = ctx.job, ctx.instance
    settings = job.kubernetes or KubernetesSettings()
    issues = []
    if not job.image_uri:
        issues.append(Issue("image_uri", None, "is needed with backend kubernetes: every pod runs the image",
                            "set image_uri to an image with smlaunch (`python -m container`) in a registry "
                            "the cluster pulls from"))
    issues += _pod_issues(job, inst, settings)
    if inst is not None and inst.accelerators is None:
        issues.append(Issue("instance_type", job.instance_type, "does not say how many GPUs a node has, which the "
                            "pods' GPU requests need", "use the instance type of the cluster's GPU nodes "
                            "(e.g. ml.p5.48xlarge), or local for CPU nodes"))
    if job.local_runner != "process":
        issues.append(Issue("local_runner", job.local_runner, "is a local-mode setting; on Kubernetes each pod "
                            "runs the bootstrap", "remove it"))
    if settings.kind == "TrainJob" and (reserved := sorted(set(job.environment) & set(RESERVED_ENV))):
        issues.append(Issue("environment", reserved, "are set by Kubeflow Trainer's torch runtime in every pod "
                            "(its webhook refuses a TrainJob that sets them)", "remove them from environment"))
    if settings.kind == "HyperPodPyTorchJob" and (reserved := sorted(set(job.environment) & set(HYPERPOD_ENV))):
        issues.append(Issue("environment", reserved, "are set in every pod of a HyperPodPyTorchJob (hyperpodrun "
                            "reads them)", "remove them from environment"))
    if settings.kind == "HyperPodPyTorchJob" and "runtime_ref" in settings.model_fields_set:
        issues.append(Issue("kubernetes.runtime_ref", settings.runtime_ref, "is a TrainJob's runtime: a "
                            "HyperPodPyTorchJob references none (HyperPod's training operator runs its pods)",
                            "remove runtime_ref, or use kind TrainJob"))
    if settings.kind == "HyperPodPyTorchJob":
        issues.append(Issue("kubernetes.kind", settings.kind, "runs each pod as `hyperpodrun` (HyperPod's elastic "
                            "agent) with smlaunch's pod entry as its worker: image_uri must have "
                            "hyperpod-elastic-agent installed, with a torch it supports (1.1.3: below 2.12) and "
                            "smlaunch's runtime needs (2.6 or newer); smlaunch's own image (torch 2.13) has not",
                            level="info"))
    if job.tensorboard_output_config is not None:
        issues.append(Issue("tensorboard_output_config", "{...}", "is not carried out on Kubernetes: the pods do "
                            "not upload TensorBoard files", "remove it, and write them under SM_OUTPUT_DATA_DIR (the "
                            "host's output/data): on a claim they stay in the job's directory, on S3 the pods "
                            "mirror them to the job's prefix"))
    storage = settings.storage
    if storage is None:
        issues.append(Issue("kubernetes.storage", None, "is needed: the pods' channels, checkpoints and outputs "
                            "live on it", "set kubernetes.storage.pvc to a ReadWriteMany PersistentVolumeClaim in "
                            "the namespace, or kubernetes.storage.s3 to an s3:// prefix"))
    elif storage.s3 is not None:
        issues += check_s3_storage(job)
        return issues
    if job.checkpoint_s3_uri:
        issues.append(Issue("checkpoint_s3_uri", job.checkpoint_s3_uri, "is not synced by pods on a claim: their "
                            "checkpoints are on the claim", "remove checkpoint_s3_uri, or use kubernetes.storage.s3"))
    paths = {f"inputs.{name}": channel.s3_data for name, channel in job.channels().items()}
    paths["output_path"] = job.output_path
    mount = storage.mount_path if storage else None
    for field, where in paths.items():
        if where and not (mount and where.startswith(mount + "/")):
            issues.append(Issue(field, where, "is a path the cluster's pods do not see" + (
                              " (s3:// channels are read with kubernetes.storage.s3)" if where.startswith("s3://")
                              else ""), "give a path under kubernetes.storage.mount_path on the claim "
                              "kubernetes.storage.pvc, or put the data in S3 and use kubernetes.storage.s3"))
    return issues


def _pod_issues(job, inst, settings: KubernetesSettings) -> list[Issue]:
    """What the pods' image, name, resources and S3 access need, as the cluster will make them."""
    issues = []
    if job.image_uri and images.is_aws_training_image(job.image_uri):
        issues.append(Issue("image_uri", job.image_uri, "is AWS's own PyTorch training image, which has no smlaunch: "
                            "every pod runs `python -m container pod`, which it cannot (on SageMaker the code archive "
                            "carries the runtime; a pod starts it before any archive)",
                            f"build smlaunch's image on it (make image BASE_IMAGE={job.image_uri}), push it to a "
                            "registry the cluster pulls from and set image_uri to it"))
    if name := planned_name_issue(job.base_job_name, default_base_name(job.entry_point), settings.kind,
                                  job.instance_count):
        issues.append(name)
    if (inst is not None and inst.efa and inst.efa_interfaces is None and job.instance_count > 1
            and settings.resources.efa is None):
        issues.append(Issue("kubernetes.resources.efa", None, f"{job.instance_type} has EFA, but smlaunch does not "
                            "know how many interfaces its nodes have: the pods ask for none, and NCCL talks between "
                            "nodes over TCP sockets", "set kubernetes.resources.efa to the nodes' EFA interfaces "
                            "(kubectl describe node: vpc.amazonaws.com/efa), or 0 to say none", level="warning"))
    if settings.storage is not None and settings.storage.s3 and not settings.service_account:
        issues.append(Issue("kubernetes.service_account", None, "is not set with kubernetes.storage.s3: the pods run "
                            "as the namespace's `default` service account, and fail at their first S3 download unless "
                            "it (or the node's instance role) may read and write the job's prefixes",
                            "set kubernetes.service_account to one with an IAM role for S3 (IRSA or EKS Pod "
                            "Identity)", level="warning"))
    return issues


def check_s3_storage(job) -> list[Issue]:
    """With kubernetes.storage.s3 the pods download the channels (File mode) and upload checkpoints,
    records and outputs: every path the job names must be in S3."""
    issues = []
    for name, channel in job.channels().items():
        field = f"inputs.{name}"
        if not channel.s3_data.startswith("s3://"):
            issues.append(Issue(field, channel.s3_data, "is a path the cluster's pods do not see: on S3 storage "
                                "they download s3:// channels", "upload the data and give its s3:// prefix"))
        if channel.s3_data_type != "S3Prefix":
            issues.append(Issue(f"{field}.s3_data_type", channel.s3_data_type, "is not read by the pods: they "
                                "download every object under a prefix", "use S3Prefix"))
        if (channel.input_mode or "File") != "File":
            issues.append(Issue(f"{field}.input_mode", channel.input_mode, "is not supported on Kubernetes: the "
                                "pods download each channel before training (File mode)", "use File"))
    if job.input_mode != "File":
        issues.append(Issue("input_mode", job.input_mode, "is not supported on Kubernetes: the pods download each "
                            "channel before training (File mode)", "use File"))
    if job.output_path and not job.output_path.startswith("s3://"):
        issues.append(Issue("output_path", job.output_path, "is a path the cluster's pods do not see: on S3 "
                            "storage the outputs go to S3", "give an s3:// prefix, or leave it out "
                            "(<kubernetes.storage.s3>/<job>/output)"))
    if job.checkpoint_local_path not in (None, DEFAULT_CHECKPOINT_PATH):
        issues.append(Issue("checkpoint_local_path", job.checkpoint_local_path, "is not used on S3 storage: each "
                            "pod keeps its checkpoints on its own disk and syncs them to S3", "remove it (the "
                            "checkpoints' prefix is checkpoint_s3_uri, else <storage.s3>/<job>/checkpoints)"))
    return issues
