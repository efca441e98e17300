"""The pods of a smlaunch TrainJob as containers, as Kubernetes would start them: the job is submitted
to the fake API server (tests/support/fake_kube.py); each of its two pods is then a container of the
smlaunch image on one network (the engine of the docker runner's tests), started with the TrainJob's
command and environment (its Secret's values resolved), the ConfigMap's files at /etc/smlaunch, the
storage claim at /mnt/smlaunch and Kubeflow Trainer's PET_* variables, the master named by the first
pod's name on the network as the JobSet's headless service names it. The job trains like one process,
and a stop (SIGTERM to each container, as a pod's deletion sends it) checkpoints every rank.

The image's smlaunch is the one it was built with: the checkout's packages are mounted over it
(PYTHONPATH), as a fresh `make image` would hold them.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from launcher.backends.kubernetes import KubernetesBackend
from launcher.config import validate_job
from launcher.kubernetes.manifest import GRACE_PERIOD_S
from launcher.local.docker import SHM_SIZE, ULIMIT_FLAGS
from tests.support.docker_runner import engine_image  # noqa: F401 - the fixture
from tests.support.fake_kube import FakeKube
from tests.support.kube_pods import assert_pods_trained_like_one_process
from tests.support.local_jobs import HP
from tests.support.train_runs import ROOT

CLAIM, CONFIG = "/mnt/smlaunch", "/etc/smlaunch"


@pytest.fixture
def kube(tmp_path, monkeypatch, home):
    server = FakeKube().start()
    monkeypatch.setenv("KUBECONFIG", str(server.kubeconfig(tmp_path / "kubeconfig")))
    yield server
    server.stop()


def _env(trainer: dict, secret: dict | None, rank: int, master: str) -> dict[str, str]:
    env = {}
    for var in trainer.get("env", []):
        ref = var.get("valueFrom", {}).get("secretKeyRef")
        env[var["name"]] = secret["stringData"][ref["key"]] if ref else var["value"]
    return {**env, "PET_NNODES": str(trainer["numNodes"]), "PET_NODE_RANK": str(rank),
            "PET_NPROC_PER_NODE": str(trainer["numProcPerNode"]), "PET_MASTER_ADDR": master,
            "PET_MASTER_PORT": "29500", "JOB_COMPLETION_INDEX": str(rank), "OMP_NUM_THREADS": "1",
            "PYTHONPATH": "/src"}


@contextlib.contextmanager
def _pods(tmp_path, kube, engine, image, train, hyperparameters: dict):
    """Submit the job, start its two pods as containers on one network; yield (the `run` processes, the
    containers' names, the claim); remove the containers and the network after."""
    claim = tmp_path / "claim"
    shutil.copytree(train, claim / "data" / "train")
    job = validate_job({"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "instance_type": "local",
                        "instance_count": 2, "processes_per_host": 1, "backend": "kubernetes", "image_uri": image,
                        "distribution": {"torch_distributed": {"enabled": True}}, "hyperparameters": hyperparameters,
                        "inputs": {"train": f"{CLAIM}/data/train"}, "environment": {"HF_TOKEN": "hf_secretvalue123"},
                        "kubernetes": {"namespace": "ml", "storage": {"pvc": "claim"}}})
    KubernetesBackend(printer=lambda _: None).submit(job, "k-1")
    trainer = kube.get("trainjobs", "ml", "k-1")["spec"]["trainer"]
    config_map, secret = kube.get("configmaps", "ml", "k-1-smlaunch"), kube.get("secrets", "ml", "k-1-env")
    mount = tmp_path / "config"
    mount.mkdir()
    for key, text in config_map["data"].items():
        (mount / key).write_text(text)
    for key, data in config_map["binaryData"].items():
        (mount / key).write_bytes(base64.b64decode(data))

    network, pods = f"smlaunch-k8s-{uuid.uuid4().hex[:8]}", [f"k-1-node-0-{rank}" for rank in range(2)]
    subprocess.run([*engine.cli, "network", "create", network], check=True, capture_output=True)
    try:
        started = []
        for rank, pod in enumerate(pods):
            env = [arg for k, v in _env(trainer, secret, rank, pods[0]).items() for arg in ("-e", f"{k}={v}")]
            # the container's output to a file, as a kubelet keeps its log: a pipe the test does not
            # read while it polls for step 5 fills at 64 KiB and blocks the pod (test_kubernetes_pods.py)
            with open(tmp_path / f"pod-{rank}.log", "w") as log:
                started.append(subprocess.Popen(
                    [*engine.cli, "run", "--name", pod, "--hostname", pod, "--network", network, "--shm-size",
                     SHM_SIZE, *ULIMIT_FLAGS,  # the docker runner's: podman's defaults exceed this host's hard limits
                     "-v", f"{claim}:{CLAIM}", "-v", f"{mount}:{CONFIG}:ro", "-v", f"{ROOT}:/src:ro", *env,
                     "--entrypoint", trainer["command"][0], image, *trainer["command"][1:]],
                    stdout=log, stderr=subprocess.STDOUT))
        yield started, pods, claim
    finally:
        subprocess.run([*engine.cli, "rm", "-f", *pods], capture_output=True, check=False)
        subprocess.run([*engine.cli, "network", "rm", "-f", network], capture_output=True, check=False)


def _outputs(tmp_path: Path, started: list[subprocess.Popen], timeout: float) -> list[str]:
    """Each pod's output, once it has exited (within `timeout` seconds)."""
    for pod in started:
        pod.wait(timeout=timeout)
    return [(tmp_path / f"pod-{rank}.log").read_text(errors="replace") for rank in range(len(started))]


def test_two_pods_in_containers_train_like_one_process(tmp_path, kube, corpus, engine_image):  # noqa: F811
    engine, image = engine_image
    train, _ = corpus
    with _pods(tmp_path, kube, engine, image, train, HP) as (started, _, claim):
        outputs = _outputs(tmp_path, started, timeout=500)
        assert [pod.returncode for pod in started] == [0, 0], "\n".join(out[-3000:] for out in outputs)
    assert_pods_trained_like_one_process(claim, train, tmp_path / "ref")


def test_a_stop_of_the_containers_checkpoints_every_rank(tmp_path, kube, corpus, engine_image):  # noqa: F811
    """Deleting a pod stops its container as `podman stop -t 120` does: SIGTERM to the container's first
    process (the pod entry, which is the bootstrap), SIGKILL after the grace period the manifest gives.
    Both containers exit 143 well within it, each rank having saved the stop's checkpoint on the claim."""
    engine, image = engine_image
    train, _ = corpus
    grace = str(GRACE_PERIOD_S)
    with _pods(tmp_path, kube, engine, image, train, {**HP, "max_steps": 1_000_000,
                                                      "checkpoint_freq": 1_000_000}) as (started, pods, claim):
        progress = claim / "smlaunch-jobs" / "k-1" / "hosts" / "algo-1" / "output" / "data" / "progress.json"
        deadline = time.monotonic() + 300
        while not (progress.is_file() and json.loads(progress.read_text())["step"] >= 5):
            assert time.monotonic() < deadline and all(p.poll() is None for p in started), "no step 5 in 300 s"
            time.sleep(0.5)
        subprocess.run([*engine.cli, "stop", "-t", grace, *pods], check=True, capture_output=True, timeout=200)
        outputs = _outputs(tmp_path, started, timeout=60)
    assert [pod.returncode for pod in started] == [143, 143], "\n".join(out[-3000:] for out in outputs)  # 128 + 15
    saved = int(re.search(r"SIGTERM: saved a checkpoint at step (\d+) and stopping", "".join(outputs)).group(1))
    assert saved >= 5  # the control: at no checkpoint_freq step, so only the stop saved it
    checkpoint = claim / "smlaunch-jobs" / "k-1" / "checkpoints" / f"step-{saved}"
    assert {p.name for p in checkpoint.glob("*.distcp")} == {"__0_0.distcp", "__1_0.distcp"}  # both pods' ranks
