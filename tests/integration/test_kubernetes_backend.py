"""The Kubernetes backend end to end against an API server on 127.0.0.1 (tests/support/fake_kube.py),
driven by the real `kubernetes` client through the `smlaunch` CLI and the backend: submit creates the
job's objects as rendered, a queued (Suspended) job reads Pending with Kueue's reason, a failed pod
fails the job with its reason, two pods' logs come merged, stop deletes; each with its control.
What only a real cluster proves (Kubeflow Trainer, JobSet, Kueue, the pods' network) is in
docs/kubernetes.md."""

from __future__ import annotations

import json
import threading
import time

import pytest
from click.testing import CliRunner

from launcher.backends.kubernetes import KubernetesBackend
from launcher.cli.app import main
from launcher.config import validate_job
from launcher.config.backends.kubernetes import KubernetesSettings
from launcher.kubernetes.manifest import env_secret, train_job
from tests.support.fake_kube import FakeKube
from tests.support.train_runs import ROOT

NS = "ml"
IMAGE = "registry.example/smlaunch:1"


@pytest.fixture
def kube(tmp_path, monkeypatch, home):
    server = FakeKube().start()
    monkeypatch.setenv("KUBECONFIG", str(server.kubeconfig(tmp_path / "kubeconfig")))
    yield server
    server.stop()


def _job(secrets: bool = True) -> dict:
    return {"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "instance_type": "local",
           "instance_count": 2, "backend": "kubernetes", "image_uri": IMAGE,
           "hyperparameters": {"model_preset": "llama3-tiny"},
           "distribution": {"torch_distributed": {"enabled": True}},
           "inputs": {"train": "/mnt/smlaunch/data/train"},
           "environment": {"HF_TOKEN": "hf_secretvalue123"} if secrets else {"LOG_LEVEL": "info"},
           "kubernetes": {"namespace": NS, "queue": "gpu-queue", "storage": {"pvc": "fsx-claim"}}}


def _job_file(tmp_path, secrets: bool = True):
    path = tmp_path / ("job.json" if secrets else "plain.json")
    path.write_text(json.dumps(_job(secrets)))
    return path


def _cli(*args: str):
    return CliRunner().invoke(main, list(args))


def _submitted(tmp_path, name: str = "k-1", secrets: bool = True):
    result = _cli("submit", str(_job_file(tmp_path, secrets)), "--job-name", name, "--no-wait")
    assert result.exit_code == 0, result.output
    return result


def test_submit_creates_the_secret_config_map_and_train_job_as_rendered(kube, tmp_path):
    result = _submitted(tmp_path)
    assert "created TrainJob ml/k-1" in result.output
    job = validate_job(_job())
    settings = KubernetesSettings(**_job()["kubernetes"])
    created = kube.get("trainjobs", NS, "k-1")
    rendered = train_job(job, "k-1", settings)
    assert {k: v for k, v in created.items() if k != "metadata"} == {
        k: v for k, v in rendered.items() if k != "metadata"}
    assert created["metadata"]["labels"] == rendered["metadata"]["labels"]
    assert kube.get("secrets", NS, "k-1-env")["stringData"] == env_secret(job, "k-1", settings)["stringData"]
    pod = json.loads(kube.get("configmaps", NS, "k-1-smlaunch")["data"]["pod.json"])
    assert pod["job_dir"] == "/mnt/smlaunch/smlaunch-jobs/k-1"
    assert pod["channels"] == {"train": "/mnt/smlaunch/data/train"}
    # the order: what the TrainJob's pods reference exists before the TrainJob
    assert [p.rsplit("/", 1)[-1] for m, p, _ in kube.requests if m == "POST"] == ["secrets", "configmaps", "trainjobs"]
    # the control: a job without secrets creates no Secret
    _submitted(tmp_path, "k-2", secrets=False)
    assert kube.get("secrets", NS, "k-2-env") is None and kube.get("trainjobs", NS, "k-2") is not None


def test_a_name_the_cluster_has_already_is_refused(kube, tmp_path):
    _submitted(tmp_path)
    again = KubernetesBackend()
    with pytest.raises(Exception, match="already exists|exists already"):
        again.submit(validate_job(_job()), "k-1")


def test_a_cluster_without_kubeflow_trainer_leaves_nothing_behind(kube, tmp_path):
    kube.refuse.add("trainjobs")
    result = _cli("submit", str(_job_file(tmp_path)), "--job-name", "k-1", "--no-wait")
    assert result.exit_code != 0 and "install Kubeflow Trainer v2" in result.output
    assert "Traceback" not in result.output
    # the objects created before the refusal are deleted; the control: they had been created
    assert [p.rsplit("/", 1)[-1] for m, p, _ in kube.requests if m == "POST"] == ["secrets", "configmaps", "trainjobs"]
    assert kube.get("secrets", NS, "k-1-env") is None and kube.get("configmaps", NS, "k-1-smlaunch") is None


def _status(name: str = "k-1") -> dict:
    result = _cli("status", f"kubernetes:{name}", "--json")
    return json.loads(result.stdout) | {"exit_code": result.exit_code}


def test_a_queued_job_is_pending_with_kueues_reason(kube, tmp_path):
    _submitted(tmp_path)
    before = _status()  # the control: neither queued nor running yet
    assert (before["TrainingJobStatus"], before["SecondaryStatus"]) == ("InProgress", "Starting")
    kube.set_conditions(NS, "k-1", ("Created", "JobSetCreated", "JobSet created"),
                        ("Suspended", "Suspended", "Workload ml/trainjob-k-1 is waiting for quota in ClusterQueue gpu"))
    queued = _status()
    assert (queued["TrainingJobStatus"], queued["SecondaryStatus"]) == ("InProgress", "Pending")
    assert "waiting for quota in ClusterQueue gpu" in queued["StatusMessage"]
    kube.set_conditions(NS, "k-1", ("Created", "JobSetCreated", "JobSet created"))
    kube.add_pod(NS, "k-1", 0)
    running = _status()
    assert (running["TrainingJobStatus"], running["SecondaryStatus"]) == ("InProgress", "Training")


def test_a_failed_pod_fails_the_job_with_its_reason(kube, tmp_path):
    _submitted(tmp_path, "k-1")
    _submitted(tmp_path, "k-2")
    kube.add_pod(NS, "k-1", 0, phase="Succeeded", exit_code=0)
    kube.add_pod(NS, "k-1", 1, phase="Failed", exit_code=1)
    kube.set_conditions(NS, "k-1", ("Failed", "FailedJobs", "jobset failed: job k-1-node-0 failed"))
    failed = _status("k-1")
    assert failed["TrainingJobStatus"] == "Failed" and failed["exit_code"] == 1
    assert "FailedJobs: jobset failed" in failed["FailureReason"]
    assert "algo-2 (pod k-1-node-0-1-" in failed["FailureReason"] and "exit code 1 (Error)" in failed["FailureReason"]
    assert "algo-1" not in failed["FailureReason"]  # the pod that succeeded is not blamed
    kube.set_conditions(NS, "k-2", ("Complete", "JobSetCompleted", "jobset completed"))  # the control
    done = _status("k-2")
    assert done["TrainingJobStatus"] == "Completed" and done["exit_code"] == 0
    # an ended job is recorded once: the cluster is not asked again
    asked = len(kube.requests)
    assert _status("k-2")["TrainingJobStatus"] == "Completed" and len(kube.requests) == asked


def test_two_pods_logs_come_merged_and_followed(kube, tmp_path):
    _submitted(tmp_path)
    first, second = kube.add_pod(NS, "k-1", 0), kube.add_pod(NS, "k-1", 1, started=False)
    kube.log(NS, first, "step 1 loss 4.2")
    printed = _cli("logs", "kubernetes:k-1").output.splitlines()
    assert printed == ["algo-1 | step 1 loss 4.2"]  # the control: a pod not started has no log yet
    lines: list[str] = []
    follower = threading.Thread(target=lambda: KubernetesBackend(printer=lines.append).logs("k-1", follow=True,
                                                                                            poll=0.2))
    follower.start()
    time.sleep(0.5)
    kube.log(NS, second, "rank 1 ready")
    kube.log(NS, first, "step 2 loss 3.9")
    kube.end_pod(NS, first)
    kube.end_pod(NS, second)
    kube.set_conditions(NS, "k-1", ("Complete", "JobSetCompleted", "jobset completed"))
    follower.join(30)
    assert not follower.is_alive()
    assert [line for line in lines if line.startswith("algo-1")] == [
        "algo-1 | step 1 loss 4.2", "algo-1 | step 2 loss 3.9"]
    assert [line for line in lines if line.startswith("algo-2")] == ["algo-2 | rank 1 ready"]


def test_stop_deletes_the_train_job_and_its_objects(kube, tmp_path):
    _submitted(tmp_path)
    kube.add_pod(NS, "k-1", 0)
    result = _cli("stop", "kubernetes:k-1")
    assert result.exit_code == 0, result.output
    assert ("trainjobs", NS, "k-1", "Foreground") in kube.deleted  # its JobSet and pods go with it: SIGTERM
    assert {(p, n) for p, _, n, _ in kube.deleted} == {("trainjobs", "k-1"), ("configmaps", "k-1-smlaunch"),
                                                      ("secrets", "k-1-env")}
    assert _status()["TrainingJobStatus"] == "Stopped"
    again = _cli("stop", "kubernetes:k-1")  # the control: an ended job is not stopped twice
    assert again.exit_code != 0 and "has already ended (Stopped)" in again.output


def test_list_shows_the_clusters_jobs(kube, tmp_path):
    _submitted(tmp_path, "k-1")
    _submitted(tmp_path, "k-2")
    kube.set_conditions(NS, "k-2", ("Complete", "JobSetCompleted", "done"))
    result = _cli("list", "--backend", "kubernetes", "--json")
    assert result.exit_code == 0, result.output
    jobs = {j["Handle"]: j["TrainingJobStatus"] for j in json.loads(result.stdout)["jobs"]}
    assert jobs == {"kubernetes:k-1": "InProgress", "kubernetes:k-2": "Completed"}


def test_waiting_hears_of_the_jobs_end_through_a_watch(kube, tmp_path):
    _submitted(tmp_path)
    ended: list[dict] = []
    waiter = threading.Thread(target=lambda: ended.append(KubernetesBackend().wait("k-1", logs=False, poll=60)))
    waiter.start()
    time.sleep(1.0)
    assert waiter.is_alive() and not ended  # the control: nothing has changed, it waits
    kube.set_conditions(NS, "k-1", ("Complete", "JobSetCompleted", "jobset completed"))
    waiter.join(15)  # well before the 60 s a poll would take: the watch's event ends the wait
    assert not waiter.is_alive() and ended[0]["TrainingJobStatus"] == "Completed"
    watches = [q for m, p, q in kube.requests if p.endswith("/trainjobs") and q.get("watch") in ("true", "True")]
    assert watches and watches[0]["fieldSelector"] == "metadata.name=k-1"


def test_a_claim_this_machine_does_not_mount_is_said_with_the_fix(kube, tmp_path):
    """Without kubernetes.storage.client_path nothing on the claim is readable here: metrics is a usage
    error naming the field and the fix; status shows the job, no progress, and a note saying why."""
    _submitted(tmp_path)
    result = _cli("metrics", "kubernetes:k-1")
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "kubernetes.storage.client_path" in result.output and "fsx-claim" in result.output
    assert "/mnt/smlaunch/smlaunch-jobs/k-1" in result.output
    status = _cli("status", "kubernetes:k-1")
    assert status.exit_code == 0, status.output  # the control: the job itself is there
    assert "note: no progress or checkpoint shown: the job's files are on the claim fsx-claim" in status.output
    assert "progress:" not in status.output and "last checkpoint" not in status.output


def test_stop_suspends_where_the_section_says_so(kube, tmp_path):
    job = _job()
    job["kubernetes"] = {**job["kubernetes"], "on_stop": "suspend"}
    (tmp_path / "suspend.json").write_text(json.dumps(job))
    assert _cli("submit", str(tmp_path / "suspend.json"), "--job-name", "k-1", "--no-wait").exit_code == 0
    result = _cli("stop", "kubernetes:k-1")
    assert result.exit_code == 0, result.output
    assert kube.deleted == []  # kept: the TrainJob, its ConfigMap and Secret
    assert kube.get("trainjobs", NS, "k-1")["spec"]["suspend"] is True  # the runtime then SIGTERMs the pods
    assert kube.patches[0][3] == "application/merge-patch+json"
    assert kube.get("configmaps", NS, "k-1-smlaunch") is not None
    assert kube.get("secrets", NS, "k-1-env") is not None
    stopped = _status()
    assert stopped["TrainingJobStatus"] == "Stopped"
    assert "kubectl patch trainjob k-1 -n ml" in stopped["SecondaryStatusTransitions"][-1]["StatusMessage"]


def test_a_job_name_kubernetes_refuses_is_a_usage_error_before_anything_is_sent(kube, tmp_path):
    result = _cli("submit", str(_job_file(tmp_path)), "--job-name", "Llama-1", "--no-wait")
    assert result.exit_code == 2 and "job_name" in result.output and "lower-case letters" in result.output
    assert kube.requests == [] and "Traceback" not in result.output
    assert _cli("submit", str(_job_file(tmp_path)), "--job-name", "llama-1", "--no-wait").exit_code == 0  # control
