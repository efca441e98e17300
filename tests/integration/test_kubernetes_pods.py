"""The pods of a smlaunch TrainJob train like one process: the job is submitted to the fake API server
(tests/support/fake_kube.py), and each of its two pods is then started as the kubelet and Kubeflow
Trainer's torch runtime would start it, as a process here: the TrainJob's command and environment (its
Secret's values resolved), the ConfigMap's files where the pod mounts them, the storage claim at a
directory, and the runtime's PET_* variables (the master on 127.0.0.1 in place of the JobSet's
headless service); on S3 storage each pod's own disk, and S3 a moto server. A HyperPodPyTorchJob's
pods are started as hyperpodrun would start its one worker: the container's environment plus torch
elastic's worker variables, which the operator's /start call decides (the agent itself, and the
operator, are not run here). Not run here: a container image and a cluster network (docs/kubernetes.md)."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from datetime import datetime, timezone

import pytest
from click.testing import CliRunner

from launcher.backends.kubernetes import KubernetesBackend
from launcher.cli.app import main
from launcher.config import validate_job
from launcher.wire.opt_ml import free_port
from tests.conftest import LOCAL_S3_BUCKET, REGION
from tests.support.fake_kube import FakeKube
from tests.support.kube_pods import assert_losses_like_one_process, assert_pods_trained_like_one_process
from tests.support.local_jobs import HP
from tests.support.train_runs import ROOT, series


@pytest.fixture
def kube(tmp_path, monkeypatch, home):
    server = FakeKube().start()
    monkeypatch.setenv("KUBECONFIG", str(server.kubeconfig(tmp_path / "kubeconfig")))
    yield server
    server.stop()


def _container_env(container: dict, secret: dict | None, mount, rank: int) -> dict[str, str]:
    """What pod `rank`'s container gets: the job's env (secretKeyRefs read from the Secret), the ConfigMap's
    mount, its own disk."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "SAGEMAKER_", "SMLAUNCH_", "PET_"))}
    for var in container.get("env", []):
        ref = var.get("valueFrom", {}).get("secretKeyRef")
        env[var["name"]] = secret["stringData"][ref["key"]] if ref else var["value"]
    env.update(SMLAUNCH_POD_CONFIG=str(mount), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               # each pod's own disk (its emptyDir on S3 storage): no file is shared but through S3
               SMLAUNCH_POD_SCRATCH=str(mount.parent / f"pod-{rank}"))
    return env


def _train_job_pod(kube, secret, mount, rank: int, port: int) -> tuple[list[str], dict[str, str]]:
    """A TrainJob's pod: its command, and Kubeflow Trainer's torch runtime's PET_* variables."""
    trainer = kube.get("trainjobs", "ml", "k-1")["spec"]["trainer"]
    command = [sys.executable if part == "python" else part for part in trainer["command"]]
    assert command[1:] == ["-m", "container", "pod"]
    return command, {**_container_env(trainer, secret, mount, rank), "PET_NNODES": str(trainer["numNodes"]),
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
    env = {**_container_env(container, secret, mount, rank), **worker}
    return [sys.executable, "-u", "-m", "container", "pod"], env


def _job(claim, train, hyperparameters: dict, kind: str = "TrainJob", **fields) -> dict:
    """The job file: the data on the claim, or (fields) as the S3 tests give it."""
    shutil.copytree(train, claim / "data" / "train")
    return {"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "instance_type": "local",
            "instance_count": 2, "processes_per_host": 1, "backend": "kubernetes", "image_uri": "smlaunch:1",
            "distribution": {"torch_distributed": {"enabled": True}}, "hyperparameters": hyperparameters,
            "inputs": {"train": str(claim / "data" / "train")}, "environment": {"HF_TOKEN": "hf_secretvalue123"},
            "kubernetes": {"namespace": "ml", "kind": kind, "storage": {
                "pvc": "claim", "mount_path": str(claim), "client_path": str(claim)}}, **fields}


def _s3_job(s3, train, prefix: str) -> dict:
    """The job on S3 storage under `prefix` (moto's state outlives its server: a prefix per test), its
    channel uploaded to the moto server the pods reach (AWS_ENDPOINT_URL)."""
    client, _ = s3
    for path in sorted(train.iterdir()):
        client.upload_file(str(path), LOCAL_S3_BUCKET, f"{prefix}/data/train/{path.name}")
    return {"inputs": {"train": f"s3://{LOCAL_S3_BUCKET}/{prefix}/data/train"}, "region": REGION,
            "kubernetes": {"namespace": "ml", "storage": {"s3": f"s3://{LOCAL_S3_BUCKET}/{prefix}/jobs"}}}


def _start_pods(tmp_path, kube, job_file: dict) -> list[subprocess.Popen]:
    """Submit the job to the fake API server, then start its two pods as the kubelet would."""
    KubernetesBackend(printer=lambda _: None).submit(validate_job(job_file), "k-1")
    kind = job_file["kubernetes"].get("kind", "TrainJob")
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
    started = []
    for rank, (command, env) in enumerate(pods):
        # the pod's output to a file, as a kubelet keeps a container's log: a pipe nobody read while
        # the test polled for step 5 filled at 64 KiB and blocked the bootstrap, and with it the ranks
        path = tmp_path / f"pod-{rank}.log"
        with open(path, "w") as log:
            pod = subprocess.Popen(command, env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
        pod.log_path = path
        started.append(pod)
    _RUNNING.extend(started)
    return started


def _output(pod: subprocess.Popen, timeout: float) -> str:
    """The pod's output, once it has exited (within `timeout` seconds)."""
    pod.wait(timeout=timeout)
    return pod.log_path.read_text(errors="replace")


# The pods a test started: one that fails mid-run stops them (they trained on, steps without end,
# beside the rest of the suite). SIGTERM first, as a pod's deletion: the bootstrap stops torchrun's
# process group, which runs in a session of its own.
_RUNNING: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _no_pod_left():
    yield
    for pod in _RUNNING:
        if pod.poll() is None:
            pod.terminate()
    for pod in _RUNNING:
        try:
            pod.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pod.kill()
            pod.wait()
    _RUNNING.clear()


def _cli(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("kind", ["TrainJob", "HyperPodPyTorchJob"])
def test_two_pods_train_like_one_process(tmp_path, kube, corpus, kind):
    train, _ = corpus
    claim = tmp_path / "claim"
    pods = _start_pods(tmp_path, kube, _job(claim, train, {**HP, "checkpoint_freq": 2}, kind))
    outputs = [_output(pod, timeout=400) for pod in pods]
    assert [pod.returncode for pod in pods] == [0, 0], "\n".join(out[-3000:] for out in outputs)
    # the client reads the claim where this machine mounts it (storage.client_path)
    status = _cli("status", "kubernetes:k-1")
    assert "progress: step 4/4" in status
    assert f"last checkpoint: step 4, {claim}/smlaunch-jobs/k-1/checkpoints/step-4" in status
    shown = json.loads(_cli("metrics", "kubernetes:k-1", "--json"))[0]
    assert series(shown["records"], "loss") == series([json.loads(line) for line in (
        claim / "smlaunch-jobs" / "k-1" / "hosts" / "algo-1" / "output" / "data" / "metrics.jsonl").open()], "loss")

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
    pods = _start_pods(tmp_path, kube, _job(claim, train, {**HP, "max_steps": 1_000_000,
                                                          "checkpoint_freq": 1_000_000}))
    progress = claim / "smlaunch-jobs" / "k-1" / "hosts" / "algo-1" / "output" / "data" / "progress.json"
    deadline = time.monotonic() + 240
    while not (progress.is_file() and json.loads(progress.read_text())["step"] >= 5):
        assert time.monotonic() < deadline and all(pod.poll() is None for pod in pods), "no step 5 in 240 s"
        time.sleep(0.5)
    for pod in pods:
        pod.send_signal(signal.SIGTERM)
    outputs = [_output(pod, timeout=120) for pod in pods]  # within the grace period: no SIGKILL needed
    assert [pod.returncode for pod in pods] == [143, 143], "\n".join(out[-3000:] for out in outputs)  # 128 + 15
    saved = int(re.search(r"SIGTERM: saved a checkpoint at step (\d+) and stopping", "".join(outputs)).group(1))
    assert saved >= 5  # the control: at no checkpoint_freq step, so only the stop saved it
    checkpoint = claim / "smlaunch-jobs" / "k-1" / "checkpoints" / f"step-{saved}"
    assert {p.name for p in checkpoint.glob("*.distcp")} == {"__0_0.distcp", "__1_0.distcp"}  # both pods' ranks


def test_pods_on_s3_storage_train_like_one_process_and_the_client_reads_the_job_back(tmp_path, kube, corpus, s3):
    """S3 storage: each pod downloads its channel, trains on its own disk and mirrors its checkpoints and
    records; the first stores output.tar.gz and model.tar.gz; status and metrics read them from S3."""
    train, _ = corpus
    pods = _start_pods(tmp_path, kube, _job(tmp_path / "claim", train, {**HP, "checkpoint_freq": 2},
                                            **_s3_job(s3, train, "trained")))
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    for rank in range(2):  # the pods as the API server lists them: their start is the job's training start
        kube.add_pod("ml", "k-1", rank, start_time=started)
    outputs = [_output(pod, timeout=400) for pod in pods]
    assert [pod.returncode for pod in pods] == [0, 0], "\n".join(out[-3000:] for out in outputs)
    assert not (tmp_path / "claim" / "smlaunch-jobs").exists()  # the control: nothing written on a claim
    shown = json.loads(_cli("metrics", "kubernetes:k-1", "--json"))[0]
    assert shown["source"] == f"s3://{LOCAL_S3_BUCKET}/trained/jobs/k-1/hosts/algo-1/output/data/metrics.jsonl"
    assert_losses_like_one_process(shown["records"], train, tmp_path / "ref")
    client, _ = s3
    job = "trained/jobs/k-1"
    keys = {o["Key"] for o in client.list_objects_v2(Bucket=LOCAL_S3_BUCKET, Prefix=f"{job}/")["Contents"]}
    for step in (2, 4):  # both pods' shards in the job's one prefix, as SageMaker syncs each host's
        assert {f"{job}/checkpoints/step-{step}/{n}" for n in ("__0_0.distcp", "__1_0.distcp", ".complete")} <= keys
    assert {f"{job}/output/model.tar.gz", f"{job}/output/output.tar.gz"} <= keys
    body = client.get_object(Bucket=LOCAL_S3_BUCKET, Key=f"{job}/output/output.tar.gz")["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        assert "metrics.jsonl" in tar.getnames()
    status = _cli("status", "kubernetes:k-1")
    assert "progress: step 4/4" in status
    assert f"last checkpoint: step 4, s3://{LOCAL_S3_BUCKET}/{job}/checkpoints/step-4" in status
    assert re.search(r"^goodput \d+%", status, re.M)  # from the pods' start and the mirrored records


def test_a_stop_on_s3_storage_uploads_the_checkpoint_the_sigterm_saved(tmp_path, kube, corpus, s3):
    """The client sees a running job's progress in S3 (the pods mirror their records as they train); a
    stop's SIGTERM checkpoint is in S3 when the pods exit, within the grace period."""
    train, _ = corpus
    pods = _start_pods(tmp_path, kube, _job(tmp_path / "claim", train, {**HP, "max_steps": 1_000_000,
                                                                      "checkpoint_freq": 1_000_000},
                                            **_s3_job(s3, train, "stopped")))
    backend = KubernetesBackend(printer=lambda _: None)
    deadline = time.monotonic() + 240
    while (progress := backend.progress("k-1")) is None or progress.step < 5:
        assert time.monotonic() < deadline and all(pod.poll() is None for pod in pods), "no step 5 in S3 in 240 s"
        time.sleep(2)
    assert backend.checkpoint("k-1") is None  # the control: no checkpoint before the stop
    for pod in pods:
        pod.send_signal(signal.SIGTERM)
    outputs = [_output(pod, timeout=120) for pod in pods]
    assert [pod.returncode for pod in pods] == [143, 143], "\n".join(out[-3000:] for out in outputs)
    saved = int(re.search(r"SIGTERM: saved a checkpoint at step (\d+) and stopping", "".join(outputs)).group(1))
    assert saved >= 5
    found = backend.checkpoint("k-1")
    checkpoints = "stopped/jobs/k-1/checkpoints"
    assert (found.step, found.where) == (saved, f"s3://{LOCAL_S3_BUCKET}/{checkpoints}/step-{saved}")
    client, _ = s3
    listed = client.list_objects_v2(Bucket=LOCAL_S3_BUCKET, Prefix=f"{checkpoints}/")["Contents"]
    assert {f"{checkpoints}/step-{saved}/__{r}_0.distcp" for r in (0, 1)} <= {o["Key"] for o in listed}
