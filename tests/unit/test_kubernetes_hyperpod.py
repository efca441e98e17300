"""SageMaker HyperPod's HyperPodPyTorchJob as the Kubernetes backend renders and reads it
(launcher.kubernetes.hyperpod, .kinds, .status): every rendered job validated against the models AWS
generates from the CRD (sagemaker-hyperpod 3.12.0, tests/support/hyperpod_reference.py), the API
facts against AWS's own SDK source, the status mapping, and a pod under hyperpodrun becoming its host."""

from __future__ import annotations

import ast
import copy
import os

import pytest
from pydantic import ValidationError

from container.toolkit.pod import prepare_host
from launcher.config import validate_job
from launcher.config.backends.kubernetes import KubernetesSettings
from launcher.kubernetes.hyperpod import SHUTDOWN_TIMEOUT_S, hyperpod_job
from launcher.kubernetes.kinds import HYPERPOD_JOB, TRAIN_JOB
from launcher.kubernetes.manifest import GRACE_PERIOD_S, train_job
from launcher.kubernetes.status import job_status
from launcher.wire.pod_config import PodEnvError, pod_place
from tests.support import hyperpod_reference
from tests.unit.test_kubernetes_manifest import JOB, SECTION
from tests.unit.test_kubernetes_pod import _kubelet

HYPERPOD = {k: v for k, v in SECTION.items() if k != "runtime_ref"} | {"kind": "HyperPodPyTorchJob"}


def _job(**fields):
    return validate_job({**JOB, "kubernetes": HYPERPOD, **fields})


def _rendered(**fields) -> dict:
    return hyperpod_job(_job(**fields), "llama-1", KubernetesSettings(**HYPERPOD))


def test_the_job_is_the_crds_and_takes_the_jobs_shape():
    manifest = _rendered(max_restarts=2)
    assert hyperpod_reference.validated(manifest) == manifest
    assert (manifest["apiVersion"], manifest["kind"]) == ("sagemaker.amazonaws.com/v1", "HyperPodPyTorchJob")
    spec = manifest["spec"]
    (replicas,) = spec["replicaSpecs"]
    assert replicas["replicas"] == 2  # instance_count
    labels = {"app.kubernetes.io/managed-by": "smlaunch", "kueue.x-k8s.io/queue-name": "gpu-queue",
              "kueue.x-k8s.io/priority-class": "high"}
    assert manifest["metadata"]["labels"] == labels == replicas["template"]["metadata"]["labels"]
    (container,) = replicas["template"]["spec"]["containers"]
    assert container["command"] == [
        "hyperpodrun", "--nnodes=2", "--nproc-per-node=1", "--max-restarts=0", "--shutdown-signal=SIGTERM",
        f"--shutdown-timeout={SHUTDOWN_TIMEOUT_S}", "--server-port=8080", "--module", "container", "pod"]
    assert SHUTDOWN_TIMEOUT_S < GRACE_PERIOD_S  # the bootstrap gets SIGTERM before the kubelet's SIGKILL
    # ml.p5.48xlarge: 8 GPUs and 32 EFA interfaces, asked for and limited alike; the agent runs one worker
    devices = {"nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "32"}
    assert container["resources"] == {"requests": devices, "limits": devices}
    assert spec["nprocPerNode"] == "1"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NNODES"] == "2" and env["SMLAUNCH_POD_LAUNCHER"] == "hyperpodrun"
    assert env["SMLAUNCH_MAX_RESTARTS"] == "2"  # the bootstrap's restarts; nobody else restarts
    assert spec["runPolicy"] == {"jobMaxRetryCount": 0, "activeDeadlineSeconds": JOB["max_run"],
                                 "ttlSecondsAfterFinished": -1, "cleanPodPolicy": "None"}


def test_the_pods_are_a_train_jobs_pods_but_for_the_command():
    """The ConfigMap, the claim, the grace period and the section's pod settings are the TrainJob's own
    (launcher.kubernetes.manifest), not a copy: the pod specs differ only in what HyperPod's pods add."""
    hyperpod = _rendered()["spec"]["replicaSpecs"][0]["template"]["spec"]
    trained = train_job(validate_job({**JOB, "kubernetes": SECTION}), "llama-1", KubernetesSettings(**SECTION))
    patch = trained["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    pod = patch["template"]["spec"]["template"]["spec"]
    own = ("image", "command", "env", "ports", "resources")
    assert {**hyperpod, "containers": [{k: v for k, v in hyperpod["containers"][0].items() if k not in own}]} == pod
    env = {e["name"]: e for e in hyperpod["containers"][0]["env"]}
    assert all(env[e["name"]] == e for e in trained["spec"]["trainer"]["env"])  # the same secret references


def test_a_cpu_job_asks_for_no_gpus():
    manifest = _rendered(instance_type="local")
    assert hyperpod_reference.validated(manifest) == manifest
    assert "resources" not in manifest["spec"]["replicaSpecs"][0]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize("where", [("spec",), ("spec", "runPolicy"), ("spec", "replicaSpecs", 0)])
def test_the_models_refuse_a_key_the_crd_does_not_have(where):
    """The control for the round trips above: a misspelt key anywhere is refused, not dropped."""
    manifest = copy.deepcopy(_rendered())
    target = manifest
    for key in where:
        target = target[key]
    target["replicass"] = 2
    with pytest.raises((ValidationError, ValueError), match="replicass"):
        hyperpod_reference.validated(manifest)


def test_the_kind_is_where_awss_sdk_creates_and_finds_it():
    """Group, version, plural, kind and the pods' label as sagemaker-hyperpod's HyperPodPytorchJob uses
    them (read from its source: the module imports the kubernetes client and boto3)."""
    source = (hyperpod_reference.MODULE.parents[1] / "hyperpod_pytorch_job.py").read_text()
    constants = {t.id: node.value.value for node in ast.parse(source).body if isinstance(node, ast.Assign)
                 for t in node.targets if isinstance(t, ast.Name) and isinstance(node.value, ast.Constant)}
    assert (HYPERPOD_JOB.group, HYPERPOD_JOB.version, HYPERPOD_JOB.plural, HYPERPOD_JOB.name) == (
        constants["TRAINING_GROUP"], constants["API_VERSION"], constants["PLURAL"], constants["KIND"])
    assert f'label_selector=f"{HYPERPOD_JOB.pod_label}={{self.metadata.name}}"' in source
    run_policy = hyperpod_reference.models().RunPolicy.model_fields
    assert HYPERPOD_JOB.suspend_field == ("spec", "runPolicy", "suspend") and "suspend" in run_policy


def _status(conditions=(), suspended=None, pods=()) -> dict:
    """A HyperPodPyTorchJob as the cluster returns it (checked against the status model), read by smlaunch."""
    job = copy.deepcopy(_rendered())
    job["status"] = {"conditions": [{"type": t, "status": "True", "reason": r, "message": m,
                                     "lastTransitionTime": f"2026-11-27T12:00:0{i}Z"}
                                    for i, (t, r, m) in enumerate(conditions)]}
    if suspended is not None:
        job["spec"]["runPolicy"]["suspend"] = suspended
    assert hyperpod_reference.validated(job) == job
    return job_status(job, list(pods), HYPERPOD_JOB)


def _pod(phase: str, exit_code: int | None = None) -> dict:
    state = {"terminated": {"exitCode": exit_code, "reason": "Error"}} if exit_code is not None else {"running": {}}
    return {"metadata": {"name": "llama-1-pod-0", "labels": {"HPJob": "llama-1"}},
            "status": {"phase": phase, "containerStatuses": [{"state": state}]}}


def test_the_jobs_conditions_and_suspension_map_to_smlaunchs_statuses():
    assert _status()["SecondaryStatus"] == "Starting"  # the control: created, nothing more
    queued = _status(suspended=True)  # Kueue holds the job by its runPolicy.suspend until admitted
    assert (queued["TrainingJobStatus"], queued["SecondaryStatus"]) == ("InProgress", "Pending")
    assert "spec.runPolicy.suspend" in queued["StatusMessage"]
    assert _status(suspended=False)["SecondaryStatus"] == "Starting"
    running = _status([("Created", "", "created"), ("Running", "AllPodsRunning", "2 pods")], pods=[_pod("Running")])
    assert running["SecondaryStatus"] == "Training"
    assert "Running: AllPodsRunning: 2 pods" in running["StatusMessage"]  # the newest condition, whatever it is
    failed = _status([("Created", "", "created"), ("Failed", "JobFailed", "rank 3 exited")],
                     pods=[_pod("Failed", exit_code=1)])
    assert failed["TrainingJobStatus"] == "Failed"
    assert failed["FailureReason"] == ("JobFailed: rank 3 exited; llama-1-pod-0 (pod llama-1-pod-0): exit code 1 "
                                       "(Error)")
    assert _status([("Complete", "JobCompleted", "done")])["TrainingJobStatus"] == "Completed"
    # the control: a TrainJob's suspension is its spec.suspend, not a runPolicy it does not have
    assert TRAIN_JOB.suspended({"spec": {"runPolicy": {"suspend": True}}}) is False
    assert TRAIN_JOB.suspended({"spec": {"suspend": True}}) is True


WORKER = {"SMLAUNCH_POD_LAUNCHER": "hyperpodrun", "GROUP_WORLD_SIZE": "2", "MASTER_ADDR": "10.1.2.3",
          "MASTER_PORT": "23456", "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}


def test_a_pod_under_hyperpodrun_is_the_host_of_its_group_rank(tmp_path):
    env, where = _kubelet(tmp_path, {"model_preset": "llama3-tiny"})
    env = {k: v for k, v in env.items() if not k.startswith("PET_")} | WORKER
    base, variables, _ = prepare_host({**env, "GROUP_RANK": "1"})
    assert base == where["claim"] / "smlaunch-jobs" / "k-1" / "hosts" / "algo-2"
    assert (variables["SMLAUNCH_MASTER_ADDR"], variables["SMLAUNCH_MASTER_PORT"]) == ("10.1.2.3", "23456")
    # the control: Kubeflow's variables, where a pod has both, are not what a hyperpodrun worker reads
    place = pod_place({**WORKER, "GROUP_RANK": "0", "PET_NNODES": "3", "PET_NODE_RANK": "2"})
    assert (place.hosts, place.host) == (["algo-1", "algo-2"], "algo-1")


@pytest.mark.parametrize(("env", "named"), [
    ({**WORKER}, "GROUP_RANK=None"),
    ({**WORKER, "GROUP_RANK": "2"}, "GROUP_RANK=2 is not a node of GROUP_WORLD_SIZE=2"),
    ({**WORKER, "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "x"}, "GROUP_WORLD_SIZE='x'"),
])
def test_a_pod_outside_hyperpodrun_is_told_what_is_missing(env, named):
    with pytest.raises(PodEnvError, match=named) as info:
        pod_place(env)
    assert "hyperpodrun" in str(info.value)


def test_a_pod_of_several_needs_the_agents_master(tmp_path):
    env, _ = _kubelet(tmp_path, {"model_preset": "llama3-tiny"})
    worker = {k: v for k, v in {**env, **WORKER, "GROUP_RANK": "0"}.items() if k != "MASTER_ADDR"}
    with pytest.raises(PodEnvError, match="no master address"):
        prepare_host(worker)


def test_the_bootstrap_sees_a_pods_environment_not_the_agents_worker(tmp_path, monkeypatch):
    """hyperpodrun's worker variables are read for the pod's place, then removed: the bootstrap (and a
    script it runs without torchrun) would otherwise take the pod for rank GROUP_RANK of a world of pods."""
    from container.toolkit import bootstrap, pod

    env, _ = _kubelet(tmp_path, {"model_preset": "llama3-tiny"})
    worker = {k: v for k, v in env.items() if not k.startswith("PET_")} | WORKER | {
        "GROUP_RANK": "1", "TORCHELASTIC_RUN_ID": "none", "HYPERPOD_SIGNAL_COORDINATION": "disabled"}
    for name in [n for n in os.environ if n.startswith(("PET_", "SMLAUNCH_", "SM_"))]:
        monkeypatch.delenv(name)
    for name, value in worker.items():
        monkeypatch.setenv(name, value)
    seen = {}
    monkeypatch.setattr(bootstrap, "train", lambda base: seen.update(os.environ) or 0)
    before = dict(os.environ)
    try:
        assert pod.main() == 0
    finally:  # pod.main becomes the host: it sets the bootstrap's variables in its own environment
        os.environ.clear()
        os.environ.update(before)
    assert not {"RANK", "WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"} & set(seen)
    # the control: what the bootstrap needs is there, the master as smlaunch's own variable
    assert (seen["SMLAUNCH_MASTER_ADDR"], seen["SMLAUNCH_MASTER_PORT"]) == ("10.1.2.3", "23456")
    assert seen["SAGEMAKER_BASE_DIR"].endswith("/hosts/algo-2") and seen["HYPERPOD_SIGNAL_COORDINATION"] == "disabled"
