"""A Kubernetes pod of a smlaunch TrainJob becomes one SageMaker host (container.toolkit.pod): its
/opt/ml tree is written from the job's ConfigMap and Secret and Kubeflow Trainer's PET_* variables.
(tests/integration/test_kubernetes_pods.py runs two such pods as processes and trains.)"""

from __future__ import annotations

import base64
import json
import stat

import pytest

from container.toolkit.pod import prepare_host
from launcher.config import validate_job
from launcher.config.backends.kubernetes import KubernetesSettings
from launcher.kubernetes.manifest import env_secret, pod_config_map
from launcher.wire.pod_config import PodEnvError, pod_hosts
from tests.support.train_runs import ROOT


def _kubelet(tmp_path, hyperparameters: dict) -> tuple[dict, dict]:
    """(the pod's variables from the job's Secret and the ConfigMap's mount, as the kubelet gives them;
    the claim's directory)."""
    claim = tmp_path / "claim"
    settings = KubernetesSettings(storage={"pvc": "claim", "mount_path": str(claim)})
    job = validate_job({"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "instance_type": "local",
                        "instance_count": 2, "backend": "kubernetes", "image_uri": "smlaunch:1",
                        "hyperparameters": hyperparameters, "inputs": {"train": str(claim / "data" / "train")},
                        "distribution": {"torch_distributed": {"enabled": True}},
                        "kubernetes": settings.model_dump()})
    config_map = pod_config_map(job, "k-1", settings, b"archive")
    (claim / "data" / "train").mkdir(parents=True)  # the channel on the claim, as the pod sees it
    (claim / "data" / "train" / "train.jsonl").write_text('{"input_ids": [1, 2]}\n')
    mount = tmp_path / "etc-smlaunch"
    mount.mkdir()
    (mount / "pod.json").write_text(config_map["data"]["pod.json"])
    (mount / "sourcedir.tar.gz").write_bytes(base64.b64decode(config_map["binaryData"]["sourcedir.tar.gz"]))
    secret = env_secret(job, "k-1", settings) or {"stringData": {}}
    env = {"SMLAUNCH_POD_CONFIG": str(mount), "PET_NNODES": "2", "PET_MASTER_ADDR": "k-1-node-0-0.k-1",
           "PET_MASTER_PORT": "29500"}
    if "hyperparameters.json" in secret["stringData"]:
        env["SMLAUNCH_SECRET_HYPERPARAMETERS"] = secret["stringData"]["hyperparameters.json"]
    return env, {"claim": claim, "mount": mount}


def test_each_pod_writes_its_hosts_tree_on_the_claim(tmp_path):
    env, where = _kubelet(tmp_path, {"model_preset": "llama3-tiny", "api_key": "sk-hidden12345",
                                     "data_source": "https://u:srcpw777@host/x"})  # a secret by its value
    base, variables, mirror = prepare_host({**env, "PET_NODE_RANK": "1"})
    assert mirror is None  # on the claim: nothing to mirror
    assert base == where["claim"] / "smlaunch-jobs" / "k-1" / "hosts" / "algo-2"
    config = base / "input" / "config"
    resource = json.loads((config / "resourceconfig.json").read_text())
    assert (resource["current_host"], resource["hosts"]) == ("algo-2", ["algo-1", "algo-2"])
    hyper = json.loads((config / "hyperparameters.json").read_text())
    assert hyper["api_key"] == '"sk-hidden12345"'  # from the Secret, in the file as SageMaker's holds it
    assert hyper["data_source"] == '"https://u:srcpw777@host/x"' and "srcpw777" not in (
        where["mount"] / "pod.json").read_text()  # the real value where the runtime reads it, from the Secret only
    assert json.loads(hyper["model_preset"]) == "llama3-tiny"  # the control: from the ConfigMap
    assert stat.S_IMODE(config.stat().st_mode) == 0o700
    assert stat.S_IMODE((config / "hyperparameters.json").stat().st_mode) == 0o600
    assert json.loads(hyper["sagemaker_submit_directory"]) == str(where["mount"] / "sourcedir.tar.gz")
    assert (base / "input" / "data" / "train" / "train.jsonl").read_text() == '{"input_ids": [1, 2]}\n'
    assert json.loads((config / "inputdataconfig.json").read_text())["train"]["TrainingInputMode"] == "File"
    assert variables == {"SAGEMAKER_BASE_DIR": str(base),
                         "SMLAUNCH_CHECKPOINT_DIR": str(where["claim"] / "smlaunch-jobs" / "k-1" / "checkpoints"),
                         "SMLAUNCH_MASTER_ADDR": "k-1-node-0-0.k-1", "SMLAUNCH_MASTER_PORT": "29500"}
    # the control: rank 0 is algo-1, whose tree is its own
    first, _, _ = prepare_host({**env, "PET_NODE_RANK": "0"})
    assert json.loads((first / "input" / "config" / "resourceconfig.json").read_text())["current_host"] == "algo-1"


def test_a_job_without_secret_hyperparameters_needs_no_secret(tmp_path):
    env, _ = _kubelet(tmp_path, {"model_preset": "llama3-tiny"})
    assert "SMLAUNCH_SECRET_HYPERPARAMETERS" not in env
    base, _, _ = prepare_host({**env, "PET_NODE_RANK": "0"})
    assert "api_key" not in json.loads((base / "input" / "config" / "hyperparameters.json").read_text())


@pytest.mark.parametrize(("env", "host"), [
    ({"PET_NNODES": "3", "PET_NODE_RANK": "2"}, "algo-3"),
    ({"PET_NNODES": "2", "JOB_COMPLETION_INDEX": "1"}, "algo-2"),  # the JobSet's index, where PET_NODE_RANK is not set
])
def test_the_pods_host_is_its_node_rank(env, host):
    hosts, current = pod_hosts(env)
    assert current == host and hosts == [f"algo-{i + 1}" for i in range(int(env["PET_NNODES"]))]


@pytest.mark.parametrize(("env", "named"), [
    ({}, "PET_NNODES"), ({"PET_NNODES": "2"}, "JOB_COMPLETION_INDEX"),
    ({"PET_NNODES": "2", "PET_NODE_RANK": "2"}, "PET_NODE_RANK=2 is not a node of PET_NNODES=2"),
    ({"PET_NNODES": "x", "PET_NODE_RANK": "0"}, "PET_NNODES='x'"),
])
def test_a_pod_outside_a_train_job_is_told_what_is_missing(env, named):
    with pytest.raises(PodEnvError, match=named):
        pod_hosts(env)
