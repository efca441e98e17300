"""The Kubernetes backend's job (issue 42, section 2): the `kubernetes:` section's model and rules
(launcher.config.backends.kubernetes) and what a validated job renders to (launcher.kubernetes.manifest):
the Kubeflow Trainer TrainJob, validated against Kubeflow Trainer's own typed models
(kubeflow-trainer-api), its ConfigMap (the pods' configuration and code) and its Secret, validated
against the kubernetes client's models and Kubernetes' own OpenAPI schemas (kubernetes-validate) at
the oldest version docs/kubernetes.md supports and the newest bundled."""

from __future__ import annotations

import base64
import copy
import io
import json
import tarfile
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from launcher.backends.base import BackendError
from launcher.config import validate_job
from launcher.config.backends.kubernetes import KubernetesSettings, check_kubernetes
from launcher.kubernetes.manifest import env_secret, pod_config_map, train_job
from launcher.wire.training.issues import ConfigError
from tests.support.train_runs import ROOT

IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/smlaunch:latest"
SECTION = {"namespace": "ml", "runtime_ref": "torch-distributed", "queue": "gpu-queue", "priority_class": "high",
           "service_account": "trainer", "node_selector": {"node.kubernetes.io/instance-type": "p5.48xlarge"},
           "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
           "image_pull_secrets": ["ecr-pull"], "storage": {"pvc": "fsx-claim"}}
JOB = {"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "instance_type": "ml.p5.48xlarge",
       "instance_count": 2, "backend": "kubernetes", "image_uri": IMAGE, "max_run": 7200, "kubernetes": SECTION,
       "hyperparameters": {"model_preset": "llama3-tiny"}, "distribution": {"torch_distributed": {"enabled": True}},
       "inputs": {"train": "/mnt/smlaunch/data/train"},  # on the claim: not on this machine, and not looked for
       "environment": {"HF_TOKEN": "hf_secretvalue123", "LOG_LEVEL": "info"}}


@pytest.fixture(scope="module")
def job():
    return validate_job(JOB)


def _validated(manifest: dict) -> dict:
    """The manifest as Kubeflow Trainer's models read and write it: a key they do not know is dropped, a
    value of the wrong type raises, so an equal round trip means every key and value is theirs."""
    from kubeflow_trainer_api.models import TrainerV1alpha1TrainJob  # here, not at collection: ~0.35 s
    return TrainerV1alpha1TrainJob.from_dict(manifest).to_dict()


def test_the_train_job_is_kubeflow_trainers_and_takes_the_jobs_shape(job):
    manifest = train_job(job, "llama-1", KubernetesSettings(**SECTION))
    assert _validated(manifest) == manifest
    assert manifest["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and manifest["kind"] == "TrainJob"
    trainer = manifest["spec"]["trainer"]
    # ml.p5.48xlarge: 8 GPUs, a process each, and on 2 nodes its 32 EFA interfaces (the catalog's)
    assert (trainer["numNodes"], trainer["numProcPerNode"], trainer["resourcesPerNode"]) == (
        2, 8, {"limits": {"nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "32"}})
    assert trainer["image"] == IMAGE and manifest["spec"]["activeDeadlineSeconds"] == 7200
    assert manifest["spec"]["runtimeRef"]["name"] == "torch-distributed"
    assert manifest["metadata"]["namespace"] == "ml"
    assert manifest["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
    assert manifest["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "high"
    pods = manifest["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    pod = pods["template"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "trainer" and pod["imagePullSecrets"] == [{"name": "ecr-pull"}]
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["volumes"] == [{"name": "smlaunch-config", "configMap": {"name": "llama-1-smlaunch"}},
                              {"name": "smlaunch-storage", "persistentVolumeClaim": {"claimName": "fsx-claim"}},
                              {"name": "smlaunch-shm", "emptyDir": {"medium": "Memory"}}]  # a GPU node's /dev/shm
    assert pod["containers"] == [{"name": "node", "volumeMounts": [
        {"name": "smlaunch-config", "mountPath": "/etc/smlaunch", "readOnly": True},
        {"name": "smlaunch-storage", "mountPath": "/mnt/smlaunch"}, {"name": "smlaunch-shm", "mountPath": "/dev/shm"}]}]
    assert pod["terminationGracePeriodSeconds"] == 120  # a stop's SIGTERM leaves the ranks time to checkpoint
    assert trainer["command"] == ["python", "-m", "container", "pod"]


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
    assert manifest["metadata"]["namespace"] == "default"
    assert manifest["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "smlaunch"}
    patch = manifest["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    pod = patch["template"]["spec"]["template"]["spec"]
    assert set(pod) == {"terminationGracePeriodSeconds", "volumes", "containers"}
    assert [v["name"] for v in pod["volumes"]] == ["smlaunch-config", "smlaunch-shm"]  # its ConfigMap, /dev/shm


def test_the_config_map_holds_what_each_pod_writes_its_opt_ml_tree_from(job):
    config_map = pod_config_map(job, "llama-1", KubernetesSettings(**SECTION), _archive({"train.py": b"print(1)"}))
    assert config_map["metadata"] == {"name": "llama-1-smlaunch", "namespace": "ml",
                                      "labels": {"app.kubernetes.io/managed-by": "smlaunch"}}
    pod = json.loads(config_map["data"]["pod.json"])
    assert pod["job_dir"] == "/mnt/smlaunch/smlaunch-jobs/llama-1"  # on the claim, as <output_path>/<job> would be
    assert pod["checkpoint_dir"] == "/mnt/smlaunch/smlaunch-jobs/llama-1/checkpoints"
    assert pod["channels"] == {"train": "/mnt/smlaunch/data/train"} and pod["instance_type"] == "ml.p5.48xlarge"
    hyper = pod["hyperparameters"]
    assert json.loads(hyper["sagemaker_program"]) == "train.py"
    assert hyper["sagemaker_torch_distributed_enabled"] == "true"
    assert json.loads(hyper["sagemaker_submit_directory"]) == "/etc/smlaunch/sourcedir.tar.gz"
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(config_map["binaryData"]["sourcedir.tar.gz"]))) as tar:
        assert tar.extractfile("train.py").read() == b"print(1)"
    out = validate_job({**JOB, "output_path": "/mnt/smlaunch/runs"})
    assert json.loads(pod_config_map(out, "llama-1", KubernetesSettings(**SECTION), b"")["data"]["pod.json"])[
        "job_dir"] == "/mnt/smlaunch/runs/llama-1"


def test_a_code_archive_past_what_a_config_map_holds_is_refused(job):
    pod_config_map(job, "llama-1", KubernetesSettings(**SECTION), b"x" * 700_000)  # the control: it fits
    with pytest.raises(BackendError, match="more than the pods' ConfigMap holds"):
        pod_config_map(job, "llama-1", KubernetesSettings(**SECTION), b"x" * 800_000)  # 1.07 MB in base64


def test_a_checkpoint_path_off_the_claim_is_refused():
    on = validate_job({**JOB, "checkpoint_local_path": "/mnt/smlaunch/ckpt"})
    assert json.loads(pod_config_map(on, "j-1", KubernetesSettings(**SECTION), b"")["data"]["pod.json"])[
        "checkpoint_dir"] == "/mnt/smlaunch/ckpt"
    off = validate_job({**JOB, "checkpoint_local_path": "/data/ckpt"})
    with pytest.raises(BackendError, match="checkpoint_local_path /data/ckpt is a path the cluster's pods do not see"):
        pod_config_map(off, "j-1", KubernetesSettings(**SECTION), b"")


def _archive(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


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


def test_secret_hyperparameters_go_in_the_secret_not_the_config_map():
    hidden = validate_job({**JOB, "hyperparameters": {"model_preset": "llama3-tiny", "api_key": "sk-hidden12345"}})
    settings = KubernetesSettings(**SECTION)
    config_map = pod_config_map(hidden, "h-1", settings, b"")
    assert "sk-hidden12345" not in json.dumps(config_map) and "sk-hidden12345" not in json.dumps(
        train_job(hidden, "h-1", settings))
    assert "model_preset" in json.loads(config_map["data"]["pod.json"])["hyperparameters"]  # the control
    secret = env_secret(hidden, "h-1", settings)
    assert json.loads(secret["stringData"]["hyperparameters.json"]) == {"api_key": '"sk-hidden12345"'}
    env = {e["name"]: e for e in train_job(hidden, "h-1", settings)["spec"]["trainer"]["env"]}
    assert env["SMLAUNCH_SECRET_HYPERPARAMETERS"]["valueFrom"] == {"secretKeyRef": {
        "name": "h-1-env", "key": "hyperparameters.json"}}


def test_a_job_without_secrets_has_no_secret():
    plain = validate_job({**JOB, "environment": {"LOG_LEVEL": "info"}})
    assert env_secret(plain, "p-1", KubernetesSettings()) is None
    assert "valueFrom" not in json.dumps(train_job(plain, "p-1", KubernetesSettings()))


@pytest.mark.parametrize(("section", "field"), [
    ({"namespace": "ML"}, "namespace"), ({"queue": "gpu_queue"}, "queue"),
    ({"node_selector": {"bad key": "x"}}, "node_selector"), ({"image_pull_secrets": ["Ecr"]}, "image_pull_secrets"),
    ({"storage": {"pvc": "a", "s3": "s3://b/c"}}, "storage"), ({"storage": {}}, "storage"),
    ({"tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]}, "tolerations.0"),
    ({"tolerations": [{"value": "v"}]}, "tolerations.0"), ({"runtime_ref": "x" * 254}, "runtime_ref"),
    ({"kind": "PyTorchJob"}, "kind"), ({"zone": "a"}, "zone"), ({"on_stop": "pause"}, "on_stop"),
])
def test_the_section_names_the_field_it_refuses(section, field):
    with pytest.raises(ValidationError) as info:
        KubernetesSettings(**section)
    assert [".".join(map(str, e["loc"])) for e in info.value.errors()] == [field]


def test_a_full_section_is_accepted():
    settings = KubernetesSettings(**SECTION, context="eks-prod", kubeconfig="~/.kube/config")
    assert settings.storage.pvc == "fsx-claim" and settings.tolerations[0].operator == "Exists"


def _issues(fields: dict, section: dict | None = None) -> list[tuple[str, str]]:
    job = {**JOB, **fields, "kubernetes": SECTION if section is None else section}
    try:
        validated = validate_job(job)
    except ConfigError as exc:  # the rules run in validation too: the same issues
        return [(i.path, i.problem) for i in exc.issues if i.level == "error"]
    return [(i.path, i.problem) for i in check_kubernetes(SimpleNamespace(job=validated.config,
                                                                          instance=validated.instance))
            if i.level == "error"]


def test_the_rules_accept_a_job_the_pods_can_run():
    assert _issues({}) == []  # the control: channels on the claim, an image, a GPU instance type
    assert _issues({"output_path": "/mnt/smlaunch/out"}) == []


def test_the_rules_refuse_what_the_pods_cannot_run(tmp_path):
    assert ("image_uri", "is needed with backend kubernetes: every pod runs the image") in _issues({"image_uri": None})
    assert ("inputs.train", "is a path the cluster's pods do not see") in _issues({"inputs": {"train": str(tmp_path)}})
    assert ("inputs.train", "is a path the cluster's pods do not see (s3:// channels are read with "
            "kubernetes.storage.s3)") in _issues({"inputs": {"train": "s3://bucket/train"}})
    assert ("output_path", "is a path the cluster's pods do not see") in _issues(
        {"output_path": str(tmp_path)})  # not under the claim's mount path
    assert [p for p, _ in _issues({}, {**SECTION, "storage": {"s3": "s3://bucket/jobs"}})] == [
        "inputs.train"]  # a path on a claim the pods no longer mount
    assert [p for p, _ in _issues({}, {})] == ["kubernetes.storage", "inputs.train"]
    assert [p for p, _ in _issues({"instance_type": "local_gpu"})] == ["instance_type"]
    assert [p for p, _ in _issues({"tensorboard_output_config": {"s3_output_path": "s3://bucket/tb"}})] == [
        "tensorboard_output_config"]  # the pods upload no TensorBoard files: refused, not ignored
    hyperpod = {k: v for k, v in SECTION.items() if k != "runtime_ref"} | {"kind": "HyperPodPyTorchJob"}
    assert _issues({}, hyperpod) == []  # the control: a HyperPodPyTorchJob runs what a TrainJob runs
    assert [p for p, _ in _issues({}, {**hyperpod, "runtime_ref": "torch-distributed"})] == ["kubernetes.runtime_ref"]


def test_the_torch_runtimes_own_variables_are_refused_in_environment():
    """kubeflow/trainer v2.3.0 pkg/constants/constants.go TorchRunReservedEnvNames: its webhook refuses a
    TrainJob whose trainer env sets one, so validate says so first."""
    refused = _issues({"environment": {"PET_MASTER_PORT": "1234", "PET_NNODES": "4", "LOG_LEVEL": "info"}})
    assert refused == [("environment", "are set by Kubeflow Trainer's torch runtime in every pod (its webhook "
                                       "refuses a TrainJob that sets them)")]
    assert _issues({"environment": {"PETS": "1", "LOG_LEVEL": "info"}}) == []  # the control: other names pass


def _core(obj: dict, model: str) -> dict:
    """`obj` read into the official client's model and written back: an unknown key is dropped, a value
    of the wrong type or a missing required field raises."""
    from kubernetes.client import ApiClient

    api = ApiClient()
    return api.sanitize_for_serialization(api._ApiClient__deserialize(copy.deepcopy(obj), model))


def test_the_core_objects_are_kubernetes_own(job):
    settings = KubernetesSettings(**SECTION)
    for obj, model in ((env_secret(job, "llama-1", settings), "V1Secret"),
                       (pod_config_map(job, "llama-1", settings, b"code"), "V1ConfigMap")):
        assert _core(obj, model) == obj
    patch = train_job(job, "llama-1", settings)["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]
    pod = patch["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert _core(pod, "V1PodSpec") == pod
    # the control: a misspelt key does not survive the round trip
    misspelt = {**pod_config_map(job, "llama-1", settings, b"code"), "binarydata": {}}
    assert _core(misspelt, "V1ConfigMap") != misspelt


# docs/kubernetes.md's minimum: the oldest Kubernetes EKS supports (1.32, in extended support to
# 2027-03-23), newer than Kubeflow Trainer v2.3.0's own minimum (1.31); and the newest schema bundled.
MIN_KUBERNETES = "1.32"


def _schema_errors(obj: dict, version: str) -> list[str]:
    """What Kubernetes' own OpenAPI schema for `version` (kubernetes-validate, bundled, offline) says is
    wrong with `obj`; strict: a key the schema does not have is wrong too."""
    from kubernetes_validate import ValidationError
    from kubernetes_validate.utils import validate

    try:
        validate(copy.deepcopy(obj), version, strict=True)
    except ValidationError as exc:
        return [exc.message]
    return []


def _pod_template(pod_spec: dict) -> dict:
    """The runtimePatches' pod spec as the PodTemplate it patches (the schema of a PodTemplateSpec)."""
    return {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "llama-1-node"},
            "template": {"spec": pod_spec}}


@pytest.mark.parametrize("version", [MIN_KUBERNETES, "1.37"])
def test_the_core_objects_pass_kubernetes_schemas(job, version):
    settings = KubernetesSettings(**SECTION)
    patch = train_job(job, "llama-1", settings)["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]
    pod = patch["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["tolerations"] and pod["imagePullSecrets"] and pod["volumes"]  # every kind of field is there
    for obj in (env_secret(job, "llama-1", settings), pod_config_map(job, "llama-1", settings, b"code"),
                _pod_template(pod)):
        assert _schema_errors(obj, version) == [], obj["kind"]


def test_kubernetes_schemas_catch_a_broken_object(job):
    """The control: what the API server would refuse fails the same check."""
    settings = KubernetesSettings(**SECTION)
    config_map = pod_config_map(job, "llama-1", settings, b"code")
    assert "'binarydata' was unexpected" in _schema_errors({**config_map, "binarydata": {}}, MIN_KUBERNETES)[0]
    pod = train_job(job, "llama-1", settings)["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"][
        "spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert _schema_errors(_pod_template({**pod, "terminationGracePeriodSeconds": "120"}), MIN_KUBERNETES)
    unnamed = {**pod, "containers": [{"volumeMounts": pod["containers"][0]["volumeMounts"]}]}
    assert "'name' is a required property" in _schema_errors(_pod_template(unnamed), MIN_KUBERNETES)[0]



def test_a_warm_pool_setting_is_said_to_keep_nothing_on_the_clusters_nodes():
    warned = {i.path: i.problem for i in validate_job({**JOB, "keep_alive_period_in_seconds": 600}).warnings}
    assert "kubernetes's own nodes" in warned["keep_alive_period_in_seconds"]
    assert "this machine" not in warned["keep_alive_period_in_seconds"]  # it said so before
    assert "keep_alive_period_in_seconds" not in {i.path for i in validate_job(JOB).warnings}  # the control
