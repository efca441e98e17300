"""The start of the Kubernetes backend (issue 42, section 2): the `kubernetes:` section's model and rules
(launcher.config.backends.kubernetes) and the Kubeflow Trainer TrainJob a validated job renders to
(launcher.kubernetes.manifest), validated against Kubeflow Trainer's own typed models
(kubeflow-trainer-api). Not yet a backend: the table has no row for it, so the jobs here validate as
Slurm jobs (the same path rules: no SageMaker request) and the section is given beside them."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import pytest
from kubeflow_trainer_api.models import TrainerV1alpha1TrainJob
from pydantic import ValidationError

from launcher.backends.base import BackendError
from launcher.config import ChannelInput, validate_job
from launcher.config.backends.kubernetes import KubernetesSettings, check_kubernetes
from launcher.kubernetes.manifest import env_secret, train_job
from tests.support.train_runs import ROOT

IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/smlaunch:latest"
JOB = {"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "instance_type": "ml.p5.48xlarge",
       "instance_count": 2, "backend": "slurm", "image_uri": IMAGE, "max_run": 7200,
       "slurm": {"container_image": IMAGE},
       "hyperparameters": {"model_preset": "llama3-tiny"}, "distribution": {"torch_distributed": {"enabled": True}},
       "inputs": {"train": "s3://bucket/train"}, "environment": {"HF_TOKEN": "hf_secretvalue123", "LOG_LEVEL": "info"}}
SECTION = {"namespace": "ml", "runtime_ref": "torch-distributed", "queue": "gpu-queue", "priority_class": "high",
           "service_account": "trainer", "node_selector": {"node.kubernetes.io/instance-type": "p5.48xlarge"},
           "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
           "image_pull_secrets": ["ecr-pull"], "storage": {"pvc": "fsx-claim"}}


@pytest.fixture(scope="module")
def job():
    return validate_job(JOB)


def _validated(manifest: dict) -> dict:
    """The manifest as Kubeflow Trainer's models read and write it: a key they do not know is dropped, a
    value of the wrong type raises, so an equal round trip means every key and value is theirs."""
    return TrainerV1alpha1TrainJob.from_dict(manifest).to_dict()


def test_the_train_job_is_kubeflow_trainers_and_takes_the_jobs_shape(job):
    manifest = train_job(job, "llama-1", KubernetesSettings(**SECTION))
    assert _validated(manifest) == manifest
    assert manifest["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and manifest["kind"] == "TrainJob"
    trainer = manifest["spec"]["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"], trainer["resourcesPerNode"]) == (
        2, 8, {"limits": {"nvidia.com/gpu": "8"}})  # ml.p5.48xlarge: 8 GPUs, a process each
    assert trainer["image"] == IMAGE and manifest["spec"]["activeDeadlineSeconds"] == 7200
    assert manifest["spec"]["runtimeRef"]["name"] == "torch-distributed"
    assert manifest["metadata"]["namespace"] == "ml"
    assert manifest["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
    assert manifest["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "high"
    pods = manifest["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    pod = pods["template"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "trainer" and pod["imagePullSecrets"] == [{"name": "ecr-pull"}]
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["volumes"][0]["persistentVolumeClaim"] == {"claimName": "fsx-claim"}
    assert pod["containers"] == [{"name": "node", "volumeMounts": [{"name": "smlaunch-storage",
                                                                    "mountPath": "/mnt/smlaunch"}]}]


def test_the_round_trip_catches_a_key_kubeflow_does_not_have(job):
    # the control: the check above is not vacuous
    manifest = copy.deepcopy(train_job(job, "llama-1", KubernetesSettings(**SECTION)))
    manifest["spec"]["trainer"]["numNode"] = manifest["spec"]["trainer"].pop("numNodes")
    assert _validated(manifest) != manifest
    manifest = copy.deepcopy(train_job(job, "llama-1", KubernetesSettings()))
    manifest["spec"]["trainer"]["numNodes"] = "2"
    with pytest.raises(ValidationError):
        _validated(manifest)


def test_a_bare_section_asks_the_cluster_for_nothing_more(job):
    manifest = train_job(job, "llama-1", KubernetesSettings())
    assert _validated(manifest) == manifest
    assert "runtimePatches" not in manifest["spec"] and manifest["metadata"]["namespace"] == "default"
    assert manifest["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "smlaunch"}


def test_a_cpu_node_asks_for_no_gpu():
    cpu = validate_job({**JOB, "instance_type": "local", "instance_count": 1})
    trainer = train_job(cpu, "cpu-1", KubernetesSettings())["spec"]["trainer"]
    assert "resourcesPerNode" not in trainer and trainer["numProcPerNode"] == 1


def test_secrets_go_in_a_secret_the_train_job_references(job):
    manifest = train_job(job, "llama-1", KubernetesSettings(namespace="ml"))
    assert "hf_secretvalue123" not in json.dumps(manifest)
    env = {e["name"]: e for e in manifest["spec"]["trainer"]["env"]}
    assert env["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "llama-1-env",
                                                                                  "key": "HF_TOKEN"}}}
    assert env["LOG_LEVEL"] == {"name": "LOG_LEVEL", "value": "info"}  # the control: a plain value stays
    secret = env_secret(job, "llama-1", KubernetesSettings(namespace="ml"))
    assert secret["metadata"]["name"] == "llama-1-env" and secret["metadata"]["namespace"] == "ml"
    assert secret["stringData"] == {"HF_TOKEN": "hf_secretvalue123"}


def test_a_job_without_secrets_has_no_secret():
    plain = validate_job({**JOB, "environment": {"LOG_LEVEL": "info"}})
    assert env_secret(plain, "p-1", KubernetesSettings()) is None
    assert "valueFrom" not in json.dumps(train_job(plain, "p-1", KubernetesSettings()))


def test_hyperpods_kind_is_refused_not_rendered_as_a_train_job(job):
    with pytest.raises(BackendError, match="HyperPodPyTorchJob is not rendered yet"):
        train_job(job, "llama-1", KubernetesSettings(kind="HyperPodPyTorchJob"))


@pytest.mark.parametrize(("section", "field"), [
    ({"namespace": "ML"}, "namespace"), ({"queue": "gpu_queue"}, "queue"),
    ({"node_selector": {"bad key": "x"}}, "node_selector"), ({"image_pull_secrets": ["Ecr"]}, "image_pull_secrets"),
    ({"storage": {"pvc": "a", "s3": "s3://b/c"}}, "storage"), ({"storage": {}}, "storage"),
    ({"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}, "tolerations.0"),
    ({"tolerations": [{"value": "v"}]}, "tolerations.0"), ({"runtime_ref": "x" * 254}, "runtime_ref"),
    ({"kind": "PyTorchJob"}, "kind"), ({"zone": "a"}, "zone"),
])
def test_the_section_names_the_field_it_refuses(section, field):
    with pytest.raises(ValidationError) as info:
        KubernetesSettings(**section)
    assert [".".join(map(str, e["loc"])) for e in info.value.errors()] == [field]


def test_a_full_section_is_accepted():
    settings = KubernetesSettings(**SECTION, context="eks-prod", kubeconfig="~/.kube/config")
    assert settings.storage.pvc == "fsx-claim" and settings.tolerations[0].operator == "Exists"


class _WithSection:
    """A validated job's config with a `kubernetes:` section, as the job file will have it once the
    backend is a row of the table (today the job model has no such field)."""

    def __init__(self, config, section: dict | None, channels: dict | None):
        self._config, self.kubernetes = config, KubernetesSettings(**section) if section is not None else None
        if channels is not None:  # paths on the cluster's storage, which validation here cannot find
            self.channels = lambda: {k: ChannelInput(s3_data=v) for k, v in channels.items()}

    def __getattr__(self, name):
        return getattr(self._config, name)


def _issues(fields: dict, section: dict | None = None, channels: dict | None = None) -> list[tuple[str, str]]:
    validated = validate_job({**JOB, **fields})
    ctx = SimpleNamespace(job=_WithSection(validated.config, section, channels), instance=validated.instance)
    return [(i.path, i.problem) for i in check_kubernetes(ctx)]


def test_the_rules_accept_a_job_the_pods_can_run():
    assert _issues({}) == []  # the control: s3 channels, an image, a GPU instance type
    assert _issues({"output_path": "/mnt/smlaunch/out"}, {"storage": {"pvc": "fsx-claim"}},
                   {"train": "/mnt/smlaunch/data/train"}) == []


def test_the_rules_refuse_what_the_pods_cannot_run(tmp_path):
    assert ("image_uri", "is needed with backend kubernetes: every pod runs the image") in _issues(
        {"image_uri": None, "slurm": None})
    assert ("inputs.train", "is a path the cluster's pods do not see") in _issues({"inputs": {"train": str(tmp_path)}})
    assert ("inputs.train", "is a path the cluster's pods do not see") in _issues(
        {}, {"storage": {"s3": "s3://bucket/jobs"}}, {"train": "/mnt/smlaunch/data/train"})  # no claim to be on
    assert ("output_path", "is a path the cluster's pods do not see") in _issues(
        {"output_path": str(tmp_path)}, {"storage": {"pvc": "fsx-claim"}})  # not under the claim's mount path
    assert [p for p, _ in _issues({"instance_type": "local_gpu", "slurm": {"gpus_per_node": 8}})] == ["instance_type"]
    assert [p for p, _ in _issues({}, {"kind": "HyperPodPyTorchJob"})] == ["kubernetes.kind"]
