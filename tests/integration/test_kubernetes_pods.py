"""The pods of a smlaunch TrainJob train like one process: the job is submitted to the fake API server
(tests/support/fake_kube.py), and each of its two pods is then started as the kubelet and Kubeflow
Trainer's torch runtime would start it, as a process here: the TrainJob's command and environment (its
Secret's values resolved), the ConfigMap's files where the pod mounts them, the storage claim at a
directory, and the runtime's PET_* variables (the master on 127.0.0.1 in place of the JobSet's
headless service). A HyperPodPyTorchJob's pods are started as hyperpodrun would start its one worker:
the container's environment plus torch elastic's worker variables, which the operator's /start call
decides (the agent itself, and the operator, are not run here). Not run here: a container image and a
cluster network (docs/kubernetes.md)."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from launcher.backends.kubernetes import KubernetesBackend
from launcher.config import validate_job
from launcher.wire.opt_ml import free_port
from tests.support.fake_kube import FakeKube
from tests.support.kube_pods import assert_pods_trained_like_one_process
from tests.support.local_jobs import HP
from tests.support.train_runs import ROOT


@pytest.fixture
def kube(tmp_path, monkeypatch, home):
    server = FakeKube().start()
    monkeypatch.setenv("KUBECONFIG", str(server.kubeconfig(tmp_path / "kubeconfig")))
    yield server
    server.stop()


def _container_env(container: dict, secret: dict | None, mount) -> dict[str, str]:
    """What a pod's container gets: the job's env (secretKeyRefs read from the Secret), the ConfigMap's mount."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "SAGEMAKER_", "SMLAUNCH_", "PET_"))}
    for var in container.get("env", []):
        ref = var.get("valueFrom", {}).get("secretKeyRef")
        env[var["name"]] = secret["stringData"][ref["key"]] if ref else var["value"]
    env.update(SMLAUNCH_POD_CONFIG=str(mount), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def _train_job_pod(kube, secret, mount, rank: int, port: int) -> tuple[list[str], dict[str, str]]:
    """A TrainJob's pod: its command, and Kubeflow Trainer's torch runtime's PET_* variables."""
    trainer = kube.get("trainjobs", "ml", "k-1")["spec"]["trainer"]
    command = [sys.executable if part == "python" else part for part in trainer["command"]]
    assert command[1:] == ["-m", "container", "pod"]
    return command, {**_container_env(trainer, secret, mount), "PET_NNODES": str(trainer["numNodes"]),
                     "PET_NODE_RANK": str(rank), "PET_NPROC_PER_NODE": str(trainer["numProcPerNode"]),
                     "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port)}


def _hyperpod_pod(kube, secret, mount, rank: int, port: int) -> tuple[list[str], dict[str, str]]:
    """A HyperPodPyTorchJob's pod: hyperpodrun's one worker (`--module container pod`, which torchrun's
    parser runs as `python -u -m container pod`) with the variables the agent gives it after the
    operator's /start (rank, nnodes, master): hyperpod_elastic_agent's HyperPodElasticAgent._start_workers."""
    spec = kube.get("hyperpodpytorchjobs", "ml", "k-1")["spec"]
    (container,) = spec["replicaSpecs"][0]["template"]["spec"]["containers"]
    assert container["command"][0] == "hyperpodrun" and "--nproc-per-node=1" in container["command"]
    assert container["command"][-3:] == ["--module", "container", "pod"]
    nodes = spec["replicaSpecs"][0]["replicas"]
    worker = {"LOCAL_RANK": "0", "RANK": str(rank), "GROUP_RANK": str(rank), "ROLE_RANK": str(rank),
              "ROLE_NAME": "default", "LOCAL_WORLD_SIZE": "1", "WORLD_SIZE": str(nodes),
              "GROUP_WORLD_SIZE": str(nodes), "ROLE_WORLD_SIZE": str(nodes), "MASTER_ADDR": "127.0.0.1",
              "MASTER_PORT": str(port), "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
              "TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_USE_AGENT_STORE": "False"}
    return [sys.executable, "-u", "-m", "container", "pod"], {**_container_env(container, secret, mount), **worker}


def _start_pods(tmp_path, kube, claim, train, hyperparameters: dict, kind: str = "TrainJob") -> list[subprocess.Popen]:
    """Submit the job to the fake API server, then start its two pods as the kubelet would."""
    shutil.copytree(train, claim / "data" / "train")
    job = validate_job({"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "instance_type": "local",
                        "instance_count": 2, "processes_per_host": 1, "backend": "kubernetes",
                        "image_uri": "smlaunch:1", "distribution": {"torch_distributed": {"enabled": True}},
                        "hyperparameters": hyperparameters, "inputs": {"train": str(claim / "data" / "train")},
                        "environment": {"HF_TOKEN": "hf_secretvalue123"},
                        "kubernetes": {"namespace": "ml", "kind": kind,
                                       "storage": {"pvc": "claim", "mount_path": str(claim)}}})
    KubernetesBackend(printer=lambda _: None).submit(job, "k-1")
    config_map, secret = kube.get("configmaps", "ml", "k-1-smlaunch"), kube.get("secrets", "ml", "k-1-env")
    mount = tmp_path / "etc-smlaunch"  # the ConfigMap's volume, as the kubelet writes it
    mount.mkdir()
    for key, text in config_map["data"].items():
        (mount / key).write_text(text)
    for key, data in config_map["binaryData"].items():
        (mount / key).write_bytes(base64.b64decode(data))
    port = free_port()
    pods = [(_hyperpod_pod if kind == "HyperPodPyTorchJob" else _train_job_pod)(kube, secret, mount, rank, port)
            for rank in range(2)]
    return [subprocess.Popen(command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True) for command, env in pods]


@pytest.mark.parametrize("kind", ["TrainJob", "HyperPodPyTorchJob"])
def test_two_pods_train_like_one_process(tmp_path, kube, corpus, kind):
    train, _ = corpus
    claim = tmp_path / "claim"
    pods = _start_pods(tmp_path, kube, claim, train, {**HP, "checkpoint_freq": 2}, kind)
    outputs = [pod.communicate(timeout=400)[0] for pod in pods]
    assert [pod.returncode for pod in pods] == [0, 0], "\n".join(out[-3000:] for out in outputs)

    job_dir = assert_pods_trained_like_one_process(claim, train, tmp_path / "ref")
    # both pods' checkpoints in the job's one directory on the claim, as hosts share a checkpoint prefix
    assert sorted(p.name for p in (job_dir / "checkpoints").iterdir()) == ["step-2", "step-4"]
    assert {p.name for p in (job_dir / "checkpoints" / "step-4").glob("__*_0.distcp")} == {
        "__0_0.distcp", "__1_0.distcp"}
    assert "algo-2" in (job_dir / "hosts" / "algo-2" / "input" / "config" / "resourceconfig.json").read_text()


def test_a_stop_sigterms_the_pods_whose_ranks_save_a_checkpoint(tmp_path, kube, corpus):
    """Deleting a TrainJob sends each pod's container SIGTERM, then SIGKILL after the grace period the
    manifest gives (120 s): the bootstrap stops torchrun and every rank saves a checkpoint first."""
    train, _ = corpus
    claim = tmp_path / "claim"
    pods = _start_pods(tmp_path, kube, claim, train, {**HP, "max_steps": 1_000_000, "checkpoint_freq": 1_000_000})
    progress = claim / "smlaunch-jobs" / "k-1" / "hosts" / "algo-1" / "output" / "data" / "progress.json"
    deadline = time.monotonic() + 240
    while not (progress.is_file() and json.loads(progress.read_text())["step"] >= 5):
        assert time.monotonic() < deadline and all(pod.poll() is None for pod in pods), "no step 5 in 240 s"
        time.sleep(0.5)
    for pod in pods:
        pod.send_signal(signal.SIGTERM)
    outputs = [pod.communicate(timeout=120)[0] for pod in pods]  # within the grace period: no SIGKILL needed
    assert [pod.returncode for pod in pods] == [143, 143], "\n".join(out[-3000:] for out in outputs)  # 128 + 15
    saved = int(re.search(r"SIGTERM: saved a checkpoint at step (\d+) and stopping", "".join(outputs)).group(1))
    assert saved >= 5  # the control: at no checkpoint_freq step, so only the stop saved it
    checkpoint = claim / "smlaunch-jobs" / "k-1" / "checkpoints" / f"step-{saved}"
    assert {p.name for p in checkpoint.glob("*.distcp")} == {"__0_0.distcp", "__1_0.distcp"}  # both pods' ranks
