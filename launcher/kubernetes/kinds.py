"""The job objects the Kubernetes backend submits (`kubernetes.kind`), each as the API serves it: its
group, version and plural (the custom object's URL), the label every pod of the job carries with the
job's name (the pods' selector for logs and status), and the merge patch that suspends it.

TrainJob: Kubeflow Trainer v2 (launcher.kubernetes.manifest); its pods are its JobSet's, which
labels them `jobset.sigs.k8s.io/jobset-name`. HyperPodPyTorchJob: SageMaker HyperPod's training
operator (launcher.kubernetes.hyperpod); group, version, plural and the pods' `HPJob` label are
those AWS's own SDK uses (sagemaker-hyperpod 3.12.0, sagemaker/hyperpod/training/
hyperpod_pytorch_job.py: TRAINING_GROUP, API_VERSION, PLURAL, list_pods), and its suspension is the
CRD's spec.runPolicy.suspend (the unified config's RunPolicy.suspend).
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.config.backends.kubernetes_names import TRAINER


@dataclass(frozen=True)
class JobKind:
    name: str
    group: str
    version: str
    plural: str
    pod_label: str  # the label whose value is the job's name on each of its pods
    suspend_field: tuple[str, ...]  # where its spec says it is suspended (its pods deleted, the object kept)
    installs: str  # what a cluster without the resource lacks
    hosts_only: str = ""  # more of the pods' selector: only the pods that are the job's hosts

    def pod_selector(self, name: str) -> str:
        """The label selector of the job's host pods."""
        return ",".join(x for x in (f"{self.pod_label}={name}", self.hosts_only) if x)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    def suspended(self, job: dict) -> bool:
        """Whether the job's spec says it is suspended (by Kueue until admitted, or by a stop)."""
        value = job
        for key in self.suspend_field:
            value = value.get(key) if isinstance(value, dict) else None
        return value is True

    def suspension(self, suspended: bool) -> dict:
        """The merge patch that suspends (or resumes) the job."""
        patch: dict = {self.suspend_field[-1]: suspended}
        for key in reversed(self.suspend_field[:-1]):
            patch = {key: patch}
        return patch


# JobSet labels every pod of its jobs with its name (the TrainJob's) and its replicated job's
# (kubernetes-sigs/jobset v0.12.0, pkg/controllers/jobset_controller.go labelAndAnnotateObject); the
# trainer pods are the replicated job `node` (an initializer's pods are not hosts).
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
TRAIN_JOB = JobKind("TrainJob", "trainer.kubeflow.org", "v1alpha1", "trainjobs", JOBSET_LABEL,
                    ("spec", "suspend"), "install Kubeflow Trainer v2 (docs/kubernetes.md)",
                    hosts_only=f"{REPLICATED_JOB_LABEL}={TRAINER}")
HYPERPOD_JOB = JobKind("HyperPodPyTorchJob", "sagemaker.amazonaws.com", "v1", "hyperpodpytorchjobs", "HPJob",
                       ("spec", "runPolicy", "suspend"),
                       "install the SageMaker HyperPod training operator (an EKS add-on; docs/kubernetes.md)")
KINDS = {kind.name: kind for kind in (TRAIN_JOB, HYPERPOD_JOB)}


def kind_named(name: str | None) -> JobKind:
    """The kind of a job record (a record from before `kind` was kept is a TrainJob's)."""
    return KINDS[name or TRAIN_JOB.name]
