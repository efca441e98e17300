"""The example Kubernetes job files (configs/kubernetes/) validate, say which image their pods run, and
dry-run to manifests the published models accept: Kubeflow Trainer's for the TrainJob, AWS's (generated
from HyperPod's CRD) for the HyperPodPyTorchJob, the kubernetes client's for the ConfigMap."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from launcher.cli.app import main
from tests.support import hyperpod_reference
from tests.support.train_runs import ROOT
from tests.unit.test_kubernetes_manifest import MIN_KUBERNETES, _core, _schema_errors, _validated

EXAMPLES = {"demo.yaml": "TrainJob", "hyperpod-s3.yaml": "HyperPodPyTorchJob"}


def _cli(*args: str):
    return CliRunner().invoke(main, list(args))


@pytest.mark.parametrize(("example", "kind"), EXAMPLES.items())
def test_the_example_validates_and_names_the_image_its_pods_run(example, kind, tmp_path):
    path = ROOT / "configs" / "kubernetes" / example
    result = _cli("validate", str(path), "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)["summary"]
    image = yaml.safe_load(path.read_text())["image_uri"]
    assert summary["image"] == f"{image} (every host runs it on the cluster)"  # not this machine's Python
    # the control: a local job (its data need not exist, unlike the demo's) runs on this machine's Python
    local = tmp_path / "local.yaml"
    local.write_text(yaml.safe_dump({"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"),
                                     "instance_type": "local", "hyperparameters": {"model_preset": "llama3-tiny"}}))
    shown = json.loads(_cli("validate", str(local), "--json").stdout)["summary"]
    assert "this machine's Python" in shown["image"]


@pytest.mark.parametrize(("example", "kind"), EXAMPLES.items())
def test_the_examples_dry_run_is_manifests_the_published_models_accept(example, kind, home):
    result = _cli("submit", str(ROOT / "configs" / "kubernetes" / example), "--dry-run", "--job-name", "demo-1")
    assert result.exit_code == 0, result.output
    objects = {o["kind"]: o for o in yaml.safe_load_all(result.stdout)}
    assert set(objects) == {"ConfigMap", kind}  # the examples set no secret
    job = objects[kind]
    if kind == "TrainJob":
        assert _validated(job) == job
    else:
        assert hyperpod_reference.validated(job) == job
    assert _core(objects["ConfigMap"], "V1ConfigMap") == objects["ConfigMap"]
    pod = json.loads(objects["ConfigMap"]["data"]["pod.json"])
    assert ("s3" in pod) == (kind == "HyperPodPyTorchJob")  # the HyperPod example keeps its files in S3



@pytest.mark.parametrize("version", [MIN_KUBERNETES, "1.37"])
def test_the_clusters_objects_serve_the_examples_and_the_claim_is_kubernetes_own(version):
    """configs/kubernetes/cluster.yaml (docs/kubernetes.md): the LocalQueues the examples name, the
    ClusterQueue covering every resource their pods ask for, the claim demo.yaml mounts; the claim against
    Kubernetes' schemas (Kueue's objects are not in kubernetes-validate), a misspelt one as the control."""
    objects = list(yaml.safe_load_all((ROOT / "configs" / "kubernetes" / "cluster.yaml").read_text()))
    named = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    for example in EXAMPLES:
        section = yaml.safe_load((ROOT / "configs" / "kubernetes" / example).read_text())["kubernetes"]
        assert ("LocalQueue", section["queue"]) in named
    covered = named[("ClusterQueue", "smlaunch")]["spec"]["resourceGroups"][0]["coveredResources"]
    assert {"nvidia.com/gpu", "vpc.amazonaws.com/efa"} <= set(covered)  # what a p5 job's pods ask for
    claim = named[("PersistentVolumeClaim", "smlaunch-data")]
    demo = yaml.safe_load((ROOT / "configs" / "kubernetes" / "demo.yaml").read_text())
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"] and demo["kubernetes"]["storage"]["pvc"] == "smlaunch-data"
    assert _schema_errors(claim, version) == []
    assert _schema_errors({**claim, "spec": {**claim["spec"], "accessMode": ["ReadWriteMany"]}}, version)
    docs = (ROOT / "docs" / "kubernetes.md").read_text().split("```yaml\n")[1:]
    assert objects in [list(yaml.safe_load_all(block.split("```")[0])) for block in docs]  # the docs show the file
