"""What a Kubernetes cluster's controllers will take from a job, checked before anything is sent: the
names JobSet makes of a TrainJob's name (launcher.config.backends.kubernetes_names), what each pod asks
of its node by default from the instance catalog and as `kubernetes.resources` overrides it
(launcher.kubernetes.resources), validated against the published models; the image the pods run, S3
without a service account, and a secret that could only go in clear (launcher.kubernetes.render)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from launcher.backends.base import SettingError
from launcher.config import validate_job
from launcher.config.backends.kubernetes import KubernetesSettings
from launcher.config.backends.kubernetes_names import name_issue, planned_name_issue
from launcher.config.jobfile import validate_job_file
from launcher.kubernetes.hyperpod import hyperpod_job
from launcher.kubernetes.manifest import train_job
from launcher.kubernetes.render import render
from launcher.wire.training.catalog import EFA_INTERFACES, get_instance_type
from launcher.wire.training.issues import ConfigError
from tests.support import hyperpod_reference
from tests.support.train_runs import ROOT
from tests.unit.test_kubernetes_manifest import (
    JOB,
    MIN_KUBERNETES,
    SECTION,
    _pod_template,
    _schema_errors,
    _validated,
)

HYPERPOD = {k: v for k, v in SECTION.items() if k != "runtime_ref"} | {"kind": "HyperPodPyTorchJob"}


def _pods(fields: dict, section: dict = SECTION) -> tuple[dict, dict, dict]:
    """(the TrainJob's trainer, its pods' spec, the HyperPodPyTorchJob's container) of a job, each checked
    against its published models."""
    job = validate_job({**JOB, **fields, "kubernetes": section})
    manifest = train_job(job, "j-1", KubernetesSettings(**section))
    assert _validated(manifest) == manifest
    pod = manifest["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0][
        "template"]["spec"]["template"]["spec"]
    assert _schema_errors(_pod_template(pod), MIN_KUBERNETES) == []
    hyper_section = {k: v for k, v in section.items() if k != "runtime_ref"} | {"kind": "HyperPodPyTorchJob"}
    hyper = hyperpod_job(validate_job({**JOB, **fields, "kubernetes": hyper_section}), "j-1",
                         KubernetesSettings(**hyper_section))
    assert hyperpod_reference.validated(hyper) == hyper
    return manifest["spec"]["trainer"], pod, hyper["spec"]["replicaSpecs"][0]["template"]["spec"]["containers"][0]


def _shm(pod: dict) -> dict | None:
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert ("smlaunch-shm" in volumes) == (mounts.get("smlaunch-shm") == "/dev/shm")
    return volumes.get("smlaunch-shm")


def test_gpu_pods_ask_for_the_catalogs_efa_and_shared_memory():
    p5, pod, hyper = _pods({})  # ml.p5.48xlarge, 2 nodes
    assert p5["resourcesPerNode"] == {"limits": {"nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "32"}}
    assert hyper["resources"]["requests"] == hyper["resources"]["limits"] == p5["resourcesPerNode"]["limits"]
    assert _shm(pod) == {"name": "smlaunch-shm", "emptyDir": {"medium": "Memory"}}
    p4d, _, _ = _pods({"instance_type": "ml.p4d.24xlarge"})
    assert p4d["resourcesPerNode"]["limits"]["vpc.amazonaws.com/efa"] == "4"
    one, pod, _ = _pods({"instance_count": 1})  # one node: no inter-node network to ask for
    assert one["resourcesPerNode"] == {"limits": {"nvidia.com/gpu": "8"}} and _shm(pod)
    cpu, pod, hyper = _pods({"instance_type": "local"})  # the control: a CPU node asks for nothing
    assert "resourcesPerNode" not in cpu and "resources" not in hyper and _shm(pod) is None


def test_the_section_overrides_what_each_pod_asks_for():
    section = {**SECTION, "resources": {"efa": 0, "shared_memory": "256Gi", "cpu": 180, "memory": "1800Gi"}}
    trainer, pod, hyper = _pods({}, section)
    assert trainer["resourcesPerNode"] == {"limits": {"nvidia.com/gpu": "8"},
                                           "requests": {"cpu": "180", "memory": "1800Gi"}}
    assert hyper["resources"] == {"requests": {"nvidia.com/gpu": "8", "cpu": "180", "memory": "1800Gi"},
                                  "limits": {"nvidia.com/gpu": "8"}}
    assert _shm(pod)["emptyDir"] == {"medium": "Memory", "sizeLimit": "256Gi"}
    _, pod, _ = _pods({}, {**SECTION, "resources": {"shared_memory": False}})
    assert _shm(pod) is None
    efa, _, _ = _pods({"instance_type": "ml.g5.48xlarge"}, {**SECTION, "resources": {"efa": 1}})
    assert efa["resourcesPerNode"]["limits"]["vpc.amazonaws.com/efa"] == "1"  # a type the catalog gives none


@pytest.mark.parametrize(("resources", "field"), [
    ({"memory": "lots"}, "memory"), ({"cpu": "1.5 cores"}, "cpu"), ({"efa": -1}, "efa"),
    ({"shared_memory": True}, "shared_memory"), ({"gpus": 8}, "gpus")])
def test_the_resources_name_the_field_they_refuse(resources, field):
    with pytest.raises(ValidationError) as info:
        KubernetesSettings(resources=resources)
    assert {e["loc"][:2] for e in info.value.errors()} == {("resources", field)}


def test_every_efa_figure_is_of_a_catalog_type_with_efa():
    for name, count in EFA_INTERFACES.items():
        assert get_instance_type(name).efa and count > 0, name
    assert get_instance_type("ml.p5.48xlarge").efa_interfaces == 32
    assert get_instance_type("ml.g5.48xlarge").efa_interfaces is None  # the control: no RDMA EFA, no figure


def _said(job: dict) -> dict[str, tuple[str, str]]:
    try:
        validated = validate_job(job)
    except ConfigError as exc:
        return {i.path: (i.level, i.problem) for i in exc.issues}
    return {i.path: (i.level, i.problem) for i in validated.warnings}


def test_validate_refuses_awss_own_image_which_has_no_smlaunch(tmp_path):
    """The seed's p5 job keeps its base file's DLC image when it is rendered for Kubernetes."""
    seed = tmp_path / "p5-kubernetes.yaml"
    seed.write_text(f"extends: {ROOT / 'configs' / 'seed' / 'p5-cp8-fp8.yaml'}\nbackend: kubernetes\n"
                    "kubernetes: {storage: {s3: s3://bucket/jobs}, service_account: trainer}\n")
    with pytest.raises(ConfigError) as info:
        validate_job_file(seed)
    (issue,) = info.value.issues
    assert issue.path == "image_uri" and "AWS's own PyTorch training image, which has no smlaunch" in issue.problem
    assert "make image BASE_IMAGE=763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.8.0" in issue.fix
    own = tmp_path / "own.yaml"  # the control: smlaunch's image built on it, in the user's registry
    own.write_text(seed.read_text() + "image_uri: 111122223333.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:x\n")
    assert validate_job_file(own).config.backend_name == "kubernetes"


def test_s3_without_a_service_account_and_an_efa_type_of_unknown_count_are_said():
    s3 = {**SECTION, "storage": {"s3": "s3://bucket/jobs"}}
    del s3["service_account"]
    on_s3 = {**JOB, "kubernetes": s3, "inputs": {"train": "s3://bucket/data"}}
    assert _said(on_s3)["kubernetes.service_account"][0] == "warning"
    assert "kubernetes.service_account" not in _said({**on_s3, "kubernetes": {**s3, "service_account": "t"}})
    p6 = {**JOB, "instance_type": "ml.p6-b200.48xlarge"}
    assert "does not know how many interfaces" in _said(p6)["kubernetes.resources.efa"][1]
    assert "kubernetes.resources.efa" not in _said({**p6, "kubernetes": {**SECTION, "resources": {"efa": 8}}})
    assert "kubernetes.resources.efa" not in _said(JOB)  # the control: p5's count is known


# The timestamp make_job_name appends is 24 characters ("-2026-11-28-22-12-42-905").
@pytest.mark.parametrize(("name_length", "nodes", "refused"), [
    (48, 2, False), (49, 2, True), (63, 2, True), (47, 11, False), (48, 11, True)])
def test_a_train_jobs_name_is_checked_by_the_pod_names_jobset_makes(name_length, nodes, refused):
    name = "j" * name_length
    issue = name_issue(name, "TrainJob", nodes)
    assert (issue is not None) == refused
    if refused:
        assert f"{name}-node-0-{nodes - 1}-xxxxx" in issue.problem and f"{len(name) + 15 + len(str(nodes - 1)) - 1}" \
            " characters" in issue.problem
    assert name_issue(name, "HyperPodPyTorchJob", nodes) is None  # its operator's names: the job's 63


def test_validate_and_the_dry_run_check_the_names_the_job_will_get():
    assert planned_name_issue("b" * 24, "smlaunch-train", "TrainJob", 2) is None  # the control
    issue = planned_name_issue("b" * 25, "smlaunch-train", "TrainJob", 2)
    assert issue.path == "base_job_name" and "a base_job_name of at most 24" in issue.fix
    assert _said({**JOB, "base_job_name": "b" * 25})["base_job_name"][0] == "error"
    assert "base_job_name" not in _said({**JOB, "base_job_name": "b" * 24})
    job = validate_job(JOB)
    with pytest.raises(ConfigError, match="JobSet names the job's last pod"):
        render(job, "j" * 49)
    assert render(job, "j" * 48).name == "j" * 48


def test_a_secret_that_could_only_go_in_clear_is_refused():
    """What cannot go by reference to the Secret (a password in the storage's S3 URI, which every pod
    is given in pod.json) is refused rather than sent in clear; the control: the same job without it."""
    section = {**SECTION, "storage": {"s3": "s3://u:pw12345@bucket/jobs"}}
    job = validate_job({**JOB, "kubernetes": section, "inputs": {"train": "s3://bucket/data"}})
    with pytest.raises(SettingError, match=r"data\.pod\.json\.s3\.checkpoints of the ConfigMap j-1-smlaunch would "
                                           r"hold a secret in clear \(s3://u:\*\*\*\*@bucket/jobs/j-1/checkpoints\)"):
        render(job, "j-1")
    plain = validate_job({**JOB, "kubernetes": {**section, "storage": {"s3": "s3://bucket/jobs"}},
                          "inputs": {"train": "s3://bucket/data"}})
    assert [o["kind"] for o in render(plain, "j-1").objects] == ["Secret", "ConfigMap", "TrainJob"]
