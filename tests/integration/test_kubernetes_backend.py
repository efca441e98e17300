"""The Kubernetes backend end to end against an API server on 127.0.0.1 (tests/support/fake_kube.py),
driven by the real `kubernetes` client through the `smlaunch` CLI and the backend: submit creates the
job's objects as rendered, a queued (Suspended) job reads Pending with its Kueue Workload's reason, a failed pod
fails the job with its reason, two pods' logs come merged, stop deletes; each with its control. The
tests that apply to both kinds run for a TrainJob and a HyperPodPyTorchJob (`kind`).
What only a real cluster proves (Kubeflow Trainer, JobSet, HyperPod's operator, Kueue, the pods'
network) is in docs/kubernetes.md."""

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
from launcher.kubernetes.hyperpod import hyperpod_job
from launcher.kubernetes.manifest import env_secret, pod_env, train_job
from tests.support.fake_kube import KUEUE_0_14, TRAINER_2_1, FakeKube
from tests.support.train_runs import ROOT

NS = "ml"
IMAGE = "registry.example/smlaunch:1"
PLURALS = {"TrainJob": "trainjobs", "HyperPodPyTorchJob": "hyperpodpytorchjobs"}
RENDER = {"TrainJob": train_job, "HyperPodPyTorchJob": hyperpod_job}


@pytest.fixture
def kube(tmp_path, monkeypatch, home):
    server = FakeKube().start()
    monkeypatch.setenv("KUBECONFIG", str(server.kubeconfig(tmp_path / "kubeconfig")))
    yield server
    server.stop()


@pytest.fixture(params=list(PLURALS))
def kind(request) -> str:
    return request.param


# What the masker treats as secret, by its name or by its value (a URL's password whatever the name).
SECRET_ENV = {"HF_TOKEN": "hf_secretvalue123", "DATABASE_URL": "postgres://user:dbpw1234@db.example:5432/x",
              "HTTPS_PROXY": "http://u:proxypw99@proxy:3128"}
SECRET_SOURCE = "https://u:srcpw777@host/x"  # a hyperparameter's value (data_source)
SECRET_VALUES = ("hf_secretvalue123", "dbpw1234", "proxypw99", "srcpw777")


def _job(secrets: bool = True, kind: str = "TrainJob") -> dict:
    return {"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "instance_type": "local",
           "instance_count": 2, "backend": "kubernetes", "image_uri": IMAGE,
           "hyperparameters": {"model_preset": "llama3-tiny", **({"data_source": SECRET_SOURCE} if secrets else {})},
           "distribution": {"torch_distributed": {"enabled": True}},
           "inputs": {"train": "/mnt/smlaunch/data/train"},
           "environment": {**SECRET_ENV, "LOG_LEVEL": "info"} if secrets else {"LOG_LEVEL": "info"},
           "kubernetes": {"namespace": NS, "queue": "gpu-queue", "storage": {"pvc": "fsx-claim"}, "kind": kind}}


def _job_file(tmp_path, secrets: bool = True, kind: str = "TrainJob"):
    path = tmp_path / f"{'job' if secrets else 'plain'}-{kind}.json"
    path.write_text(json.dumps(_job(secrets, kind)))
    return path


def _cli(*args: str):
    return CliRunner().invoke(main, list(args))


def _submitted(tmp_path, name: str = "k-1", secrets: bool = True, kind: str = "TrainJob"):
    result = _cli("submit", str(_job_file(tmp_path, secrets, kind)), "--job-name", name, "--no-wait")
    assert result.exit_code == 0, result.output
    return result


def test_submit_creates_the_secret_config_map_and_job_as_rendered(kube, tmp_path, home, kind):
    """The objects as rendered, in order; every value the masker hides, whatever its name (a URL's password
    in DATABASE_URL, HTTPS_PROXY and a hyperparameter), in the Secret and nowhere else the cluster received
    or smlaunch wrote, the plain values where they were (the control); the dry run is what was sent, the
    Secret's values masked."""
    result = _submitted(tmp_path, kind=kind)
    assert f"created {kind} ml/k-1" in result.output
    job = validate_job(_job(kind=kind))
    settings = KubernetesSettings(**_job(kind=kind)["kubernetes"])
    created = kube.get(PLURALS[kind], NS, "k-1")
    rendered = RENDER[kind](job, "k-1", settings)
    assert {k: v for k, v in created.items() if k != "metadata"} == {
        k: v for k, v in rendered.items() if k != "metadata"}
    assert created["metadata"]["labels"] == rendered["metadata"]["labels"]
    assert kube.get("secrets", NS, "k-1-env")["stringData"] == env_secret(job, "k-1", settings)["stringData"]
    pod = json.loads(kube.get("configmaps", NS, "k-1-smlaunch")["data"]["pod.json"])
    assert pod["job_dir"] == "/mnt/smlaunch/smlaunch-jobs/k-1"
    assert pod["channels"] == {"train": "/mnt/smlaunch/data/train"}
    # the order: what the job's pods reference exists before the job
    assert [p.rsplit("/", 1)[-1] for m, p, _ in kube.requests if m == "POST"] == [
        "secrets", "configmaps", PLURALS[kind]]
    received = {key: json.dumps(obj) for key, obj in kube.objects.items()}
    for value in SECRET_VALUES:
        assert [key for key, text in received.items() if value in text] == [("secrets", NS, "k-1-env")], value
    assert not any(value in path.read_text() for path in home.rglob("*.json") for value in SECRET_VALUES)
    env = {e["name"]: e for e in pod_env(job, "k-1")}
    assert env["LOG_LEVEL"] == {"name": "LOG_LEVEL", "value": "info"}  # the control: a plain value, in clear
    assert env["DATABASE_URL"]["valueFrom"] == {"secretKeyRef": {"name": "k-1-env", "key": "DATABASE_URL"}}
    assert json.loads(pod["hyperparameters"]["model_preset"]) == "llama3-tiny"  # the control, in the ConfigMap
    assert "data_source" not in pod["hyperparameters"]
    secret = kube.get("secrets", NS, "k-1-env")["stringData"]
    assert json.loads(json.loads(secret["hyperparameters.json"])["data_source"]) == SECRET_SOURCE
    dry = KubernetesBackend().dryrun(job, "k-1")
    shown = dry.request["KubernetesJob"]["Manifests"]
    sent = [kube.get(plural, NS, name) for plural, name in (("secrets", "k-1-env"), ("configmaps", "k-1-smlaunch"),
                                                             (PLURALS[kind], "k-1"))]
    assert [_as_shown(o) for o in shown] == [_as_shown(o) for o in sent]
    assert shown[0]["stringData"] == {**dict.fromkeys(SECRET_ENV, "****"),
                                      "hyperparameters.json": '{"data_source": "****"}'}
    assert not any(value in dry.render() for value in SECRET_VALUES)
    # the control: a job without secrets creates no Secret
    _submitted(tmp_path, "k-2", secrets=False, kind=kind)
    assert kube.get("secrets", NS, "k-2-env") is None and kube.get(PLURALS[kind], NS, "k-2") is not None


def _as_shown(obj: dict) -> dict:
    """What a dry run shows as sent: all but the Secret's values, the code archive and the server's metadata."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "stringData", "binaryData")}


def test_a_name_the_cluster_has_already_is_refused(kube, tmp_path):
    _submitted(tmp_path)
    again = KubernetesBackend()
    with pytest.raises(Exception, match="already exists|exists already"):
        again.submit(validate_job(_job()), "k-1")


@pytest.mark.parametrize(("kind", "fix"), [("TrainJob", "install Kubeflow Trainer v2"),
                                           ("HyperPodPyTorchJob", "install the SageMaker HyperPod training operator")])
def test_a_cluster_without_the_jobs_resource_leaves_nothing_behind(kube, tmp_path, kind, fix):
    kube.refuse.add(PLURALS[kind])
    result = _cli("submit", str(_job_file(tmp_path, kind=kind)), "--job-name", "k-1", "--no-wait")
    assert result.exit_code != 0 and f"the cluster has no {kind} resource" in result.output and fix in result.output
    assert "Traceback" not in result.output
    # the objects created before the refusal are deleted; the control: they had been created
    assert [p.rsplit("/", 1)[-1] for m, p, _ in kube.requests if m == "POST"] == [
        "secrets", "configmaps", PLURALS[kind]]
    assert kube.get("secrets", NS, "k-1-env") is None and kube.get("configmaps", NS, "k-1-smlaunch") is None


@pytest.mark.parametrize(("installed", "message"), [
    ({"trainjobs.trainer.kubeflow.org": TRAINER_2_1},
     "Kubeflow Trainer v2.1.0 has no TrainJob spec.runtimePatches (Trainer 2.1 or older)"),
    ({"trainjobs.trainer.kubeflow.org": None}, "the cluster has no TrainJob resource (trainjobs.trainer.kubeflow.org)"),
    ({"workloads.kueue.x-k8s.io": KUEUE_0_14}, "Kueue v0.14.4 serves Workloads as v1beta1, not v1beta2"),
    ({"workloads.kueue.x-k8s.io": None}, "kubernetes.queue is set, and the cluster has no Kueue")])
def test_a_cluster_whose_trainer_or_kueue_cannot_run_the_job_is_refused_before_anything_is_created(
        kube, tmp_path, installed, message):
    for name, definition in installed.items():
        kube.crds.pop(name)
        if definition is not None:
            kube.crds[name] = definition
    result = _cli("submit", str(_job_file(tmp_path)), "--job-name", "k-1", "--no-wait")
    assert result.exit_code != 0 and message in result.output and "install" in result.output, result.output
    assert "Traceback" not in result.output
    assert not [p for m, p, _ in kube.requests if m == "POST"]  # nothing created


def test_the_versions_are_checked_where_they_matter_and_said_where_they_cannot_be_read(kube, tmp_path):
    kube.crds["workloads.kueue.x-k8s.io"] = KUEUE_0_14
    plain = _job()
    plain["kubernetes"].pop("queue")  # the control: a job Kueue does not queue needs no Kueue
    (tmp_path / "plain.json").write_text(json.dumps(plain))
    assert _cli("submit", str(tmp_path / "plain.json"), "--job-name", "k-1", "--no-wait").exit_code == 0
    kube.crds_forbidden = True  # a namespace's user: not refused, and said
    result = _cli("submit", str(_job_file(tmp_path)), "--job-name", "k-2", "--no-wait")
    assert result.exit_code == 0, result.output
    assert "versions were not checked: this user may not read CustomResourceDefinitions" in result.output


def _status(name: str = "k-1") -> dict:
    result = _cli("status", f"kubernetes:{name}", "--json")
    return json.loads(result.stdout) | {"exit_code": result.exit_code}


# The conditions as Kubeflow Trainer v2.3.0 writes them (pkg/controller/trainjob_controller.go, and
# pkg/runtime/framework/plugins/jobset/jobset.go copying JobSet v0.12.0's, pkg/constants/constants.go).
SUSPENDED = ("Suspended", "Suspended", "TrainJob is suspended")
FAILED = ("Failed", "FailedJobs", "jobset failed due to one or more job failures (first failed job: k-1-node-0)")
COMPLETE = ("Complete", "AllJobsCompleted", "jobset completed successfully")


def test_a_queued_job_is_pending_with_kueues_reason(kube, tmp_path):
    """Kueue's webhook suspends a TrainJob with a queue label; why it waits is on Kueue's Workload."""
    _submitted(tmp_path)
    before = _status()  # the control: neither queued nor running yet
    assert (before["TrainingJobStatus"], before["SecondaryStatus"]) == ("InProgress", "Starting")
    kube.set_conditions(NS, "k-1", SUSPENDED)
    queued = _status()
    assert (queued["TrainingJobStatus"], queued["SecondaryStatus"]) == ("InProgress", "Pending")
    assert queued["StatusMessage"] == "queued: Suspended: TrainJob is suspended"  # Kueue has no Workload yet
    kube.add_workload(NS, "k-1", ("QuotaReserved", "False", "Pending",
                                  "couldn't assign flavors to pod set node: insufficient quota for nvidia.com/gpu"))
    assert _status()["StatusMessage"] == ("queued: Suspended: TrainJob is suspended; Kueue: Pending: couldn't assign "
                                          "flavors to pod set node: insufficient quota for nvidia.com/gpu")
    kube.set_conditions(NS, "k-1")  # admitted: Suspended is no longer True (False, reason Resumed)
    kube.add_pod(NS, "k-1", 0)
    running = _status()
    assert (running["TrainingJobStatus"], running["SecondaryStatus"]) == ("InProgress", "Training")


def test_a_job_kueue_suspended_before_the_trainer_saw_it_is_pending(kube, tmp_path):
    _submitted(tmp_path)
    kube.objects[("trainjobs", NS, "k-1")]["spec"]["suspend"] = True  # Kueue's webhook, at creation
    assert _status()["SecondaryStatus"] == "Pending"
    kube.objects[("trainjobs", NS, "k-1")]["spec"]["suspend"] = False  # the control: admitted
    assert _status()["SecondaryStatus"] == "Starting"


def test_a_cluster_without_kueues_workloads_says_so_and_still_answers(kube, tmp_path):
    _submitted(tmp_path)
    kube.refuse.add("workloads")
    kube.set_conditions(NS, "k-1", SUSPENDED)
    queued = _status()
    assert queued["exit_code"] == 0 and queued["SecondaryStatus"] == "Pending"
    assert "Kueue's Workload cannot be read" in queued["StatusMessage"] and "404" in queued["StatusMessage"]


def test_only_the_trainer_pods_are_hosts(kube, tmp_path):
    _submitted(tmp_path)
    kube.add_pod(NS, "k-1", 0, replicated_job="dataset-initializer")  # running, before the trainer starts
    assert _status()["SecondaryStatus"] == "Starting"  # an initializer's pod is not a host
    kube.add_pod(NS, "k-1", 0)
    assert _status()["SecondaryStatus"] == "Training"  # the control: a trainer pod runs


def test_a_hyperpod_job_held_by_kueue_is_pending_then_training(kube, tmp_path):
    """Kueue holds a HyperPodPyTorchJob by its spec.runPolicy.suspend until its queue admits it; the
    operator's newest condition, whatever its type, is quoted while it runs."""
    _submitted(tmp_path, kind="HyperPodPyTorchJob")
    assert _status()["SecondaryStatus"] == "Starting"  # the control: not held, no pod yet
    job = kube.get("hyperpodpytorchjobs", NS, "k-1")
    job["spec"]["runPolicy"]["suspend"] = True  # as Kueue sets it
    queued = _status()
    assert (queued["TrainingJobStatus"], queued["SecondaryStatus"]) == ("InProgress", "Pending")
    assert "spec.runPolicy.suspend" in queued["StatusMessage"]
    job["spec"]["runPolicy"]["suspend"] = False  # admitted
    kube.set_conditions(NS, "k-1", ("Created", "JobCreated", "created"), ("Running", "PodsRunning", "2 pods up"))
    kube.add_pod(NS, "k-1", 0)
    running = _status()
    assert running["SecondaryStatus"] == "Training" and "Running: PodsRunning: 2 pods up" in running["StatusMessage"]


def test_a_failed_pod_fails_the_job_with_its_reason(kube, tmp_path, kind):
    _submitted(tmp_path, "k-1", kind=kind)
    _submitted(tmp_path, "k-2", kind=kind)
    good = kube.add_pod(NS, "k-1", 0, phase="Succeeded", exit_code=0)
    bad = kube.add_pod(NS, "k-1", 1, phase="Failed", exit_code=1)
    kube.set_conditions(NS, "k-1", FAILED)
    failed = _status("k-1")
    assert failed["TrainingJobStatus"] == "Failed" and failed["exit_code"] == 1
    assert "FailedJobs: jobset failed due to one or more job failures (first failed job: k-1-node-0)" in failed[
        "FailureReason"]
    # a HyperPod pod carries no rank label: it is named by its pod name
    host = "algo-2 " if kind == "TrainJob" else f"{bad} "
    assert f"{host}(pod {bad})" in failed["FailureReason"] and "exit code 1 (Error)" in failed["FailureReason"]
    assert good not in failed["FailureReason"]  # the pod that succeeded is not blamed
    kube.set_conditions(NS, "k-2", COMPLETE)  # the control
    done = _status("k-2")
    assert done["TrainingJobStatus"] == "Completed" and done["exit_code"] == 0
    # an ended job is recorded once: the cluster is not asked again
    asked = len(kube.requests)
    assert _status("k-2")["TrainingJobStatus"] == "Completed" and len(kube.requests) == asked


def test_two_pods_logs_come_merged_and_followed(kube, tmp_path, kind):
    _submitted(tmp_path, kind=kind)
    first, second = kube.add_pod(NS, "k-1", 0), kube.add_pod(NS, "k-1", 1, started=False)
    one, two = ("algo-1", "algo-2") if kind == "TrainJob" else (first, second)  # HyperPod's pods: by name
    kube.log(NS, first, "step 1 loss 4.2")
    printed = _cli("logs", "kubernetes:k-1").output.splitlines()
    assert printed == [f"{one} | step 1 loss 4.2"]  # the control: a pod not started has no log yet
    lines: list[str] = []
    follower = threading.Thread(target=lambda: KubernetesBackend(printer=lines.append).logs("k-1", follow=True,
                                                                                            poll=0.2))
    follower.start()
    time.sleep(0.5)
    kube.log(NS, second, "rank 1 ready")
    kube.log(NS, first, "step 2 loss 3.9")
    kube.end_pod(NS, first)
    kube.end_pod(NS, second)
    kube.set_conditions(NS, "k-1", COMPLETE)
    follower.join(30)
    assert not follower.is_alive()
    assert [line for line in lines if line.startswith(f"{one} |")] == [
        f"{one} | step 1 loss 4.2", f"{one} | step 2 loss 3.9"]
    assert [line for line in lines if line.startswith(f"{two} |")] == [f"{two} | rank 1 ready"]


def test_stop_deletes_the_job_and_its_objects(kube, tmp_path, kind):
    _submitted(tmp_path, kind=kind)
    pod = kube.add_pod(NS, "k-1", 0)
    result = _cli("stop", "kubernetes:k-1")
    assert result.exit_code == 0, result.output
    assert (PLURALS[kind], NS, "k-1", "Foreground") in kube.deleted  # its pods go with it: SIGTERM
    assert {(p, n) for p, _, n, _ in kube.deleted} == {(PLURALS[kind], "k-1"), ("configmaps", "k-1-smlaunch"),
                                                      ("secrets", "k-1-env")}
    # deleted in the foreground: the TrainJob stays, marked, until its pods are gone
    assert kube.get(PLURALS[kind], NS, "k-1")["metadata"]["finalizers"] == ["foregroundDeletion"]
    assert _status()["TrainingJobStatus"] == "Stopped"
    kube.collect_garbage()
    assert kube.get(PLURALS[kind], NS, "k-1") is None and kube.get("pods", NS, pod) is None
    assert _status()["TrainingJobStatus"] == "Stopped"
    again = _cli("stop", "kubernetes:k-1")  # the control: an ended job is not stopped twice
    assert again.exit_code != 0 and "has already ended (Stopped)" in again.output


def test_list_shows_the_clusters_jobs(kube, tmp_path):
    _submitted(tmp_path, "k-1")
    _submitted(tmp_path, "k-2", kind="HyperPodPyTorchJob")  # both kinds, each read as its own
    kube.set_conditions(NS, "k-2", COMPLETE)
    result = _cli("list", "--backend", "kubernetes", "--json")
    assert result.exit_code == 0, result.output
    jobs = {j["Handle"]: j["TrainingJobStatus"] for j in json.loads(result.stdout)["jobs"]}
    assert jobs == {"kubernetes:k-1": "InProgress", "kubernetes:k-2": "Completed"}


def test_waiting_hears_of_the_jobs_end_through_a_watch(kube, tmp_path, kind):
    _submitted(tmp_path, kind=kind)
    ended: list[dict] = []
    waiter = threading.Thread(target=lambda: ended.append(KubernetesBackend().wait("k-1", logs=False, poll=60)))
    waiter.start()
    time.sleep(1.0)
    assert waiter.is_alive() and not ended  # the control: nothing has changed, it waits
    kube.set_conditions(NS, "k-1", COMPLETE)
    waiter.join(15)  # well before the 60 s a poll would take: the watch's event ends the wait
    assert not waiter.is_alive() and ended[0]["TrainingJobStatus"] == "Completed"
    watches = [q for m, p, q in kube.requests if p.endswith(f"/{PLURALS[kind]}") and q.get("watch") in ("true", "True")]
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


def test_a_scripts_metric_definitions_are_read_from_its_pods_logs(kube, tmp_path, kind):
    """A script of the user's own writes no metrics.jsonl: its metric_definitions are applied to its pods'
    logs, as SageMaker applies them to its hosts' (the claim is not mounted here: only the logs are read)."""
    job = _job(kind=kind)
    job["metric_definitions"] = [{"Name": "train:loss", "Regex": r"loss ([0-9.]+)"}]
    (tmp_path / "defined.json").write_text(json.dumps(job))
    assert _cli("submit", str(tmp_path / "defined.json"), "--job-name", "k-1", "--no-wait").exit_code == 0
    first, second = kube.add_pod(NS, "k-1", 0), kube.add_pod(NS, "k-1", 1)
    kube.log(NS, second, "rank 1 ready")
    kube.log(NS, first, "step 1 loss 4.25", "step 2 loss 3.5", "step 3 no number")
    result = _cli("metrics", "kubernetes:k-1", "--json")
    assert result.exit_code == 0, result.output
    (shown,) = json.loads(result.stdout)
    assert [r["train:loss"] for r in shown["records"]] == [4.25, 3.5]
    assert "pod logs (metric_definitions: train:loss)" in shown["source"]
    _submitted(tmp_path, "k-2", kind=kind)  # the control: no definitions, a claim not mounted here: exit 2
    kube.log(NS, kube.add_pod(NS, "k-2", 0), "step 1 loss 4.25")
    assert _cli("metrics", "kubernetes:k-2").exit_code == 2


def _submit_suspending(tmp_path, queue: bool, kind: str = "TrainJob") -> None:
    job = _job(kind=kind)
    job["kubernetes"] = {**job["kubernetes"], "on_stop": "suspend"}
    if not queue:
        del job["kubernetes"]["queue"]
    (tmp_path / "suspend.json").write_text(json.dumps(job))
    assert _cli("submit", str(tmp_path / "suspend.json"), "--job-name", "k-1", "--no-wait").exit_code == 0


def _at(obj: dict, keys: tuple[str, ...]):
    for key in keys:
        obj = (obj or {}).get(key)
    return obj


@pytest.mark.parametrize(("kind", "field", "resume"), [
    ("TrainJob", ("suspend",), "kubectl patch trainjobs k-1 -n ml --type merge -p '{\"spec\": {\"suspend\": false}}'"),
    ("HyperPodPyTorchJob", ("runPolicy", "suspend"), "kubectl patch hyperpodpytorchjobs k-1 -n ml --type merge "
                                                     "-p '{\"spec\": {\"runPolicy\": {\"suspend\": false}}}'")])
def test_stop_suspends_where_the_section_says_so(kube, tmp_path, kind, field, resume):
    _submit_suspending(tmp_path, queue=False, kind=kind)
    assert _at(kube.get(PLURALS[kind], NS, "k-1")["spec"], field) is None  # the control: submitted running
    result = _cli("stop", "kubernetes:k-1")
    assert result.exit_code == 0, result.output
    assert kube.deleted == []  # kept: the job, its ConfigMap and Secret
    assert _at(kube.get(PLURALS[kind], NS, "k-1")["spec"], field) is True  # its controller SIGTERMs the pods
    assert kube.patches[0][3] == "application/merge-patch+json"
    assert kube.get("configmaps", NS, "k-1-smlaunch") is not None
    assert kube.get("secrets", NS, "k-1-env") is not None
    stopped = _status()
    assert stopped["TrainingJobStatus"] == "Stopped"
    assert resume in stopped["SecondaryStatusTransitions"][-1]["StatusMessage"]


def test_a_queued_job_is_suspended_through_its_kueue_workload(kube, tmp_path, kind):
    """Kueue starts a suspended job it has admitted again (kueue v0.19.2,
    pkg/controller/jobframework/reconciler.go): its Workload is deactivated instead."""
    _submit_suspending(tmp_path, queue=True, kind=kind)
    early = _cli("stop", "kubernetes:k-1")  # Kueue has made no Workload yet: nothing is done, and it says why
    assert early.exit_code == 1 and "run smlaunch stop again in a moment" in early.output
    assert kube.patches == [] and _status()["TrainingJobStatus"] == "InProgress"
    kube.add_workload(NS, "k-1", ("Admitted", "True", "Admitted", "The workload is admitted"))
    result = _cli("stop", "kubernetes:k-1")
    assert result.exit_code == 0, result.output
    (plural, _, workload, content, patch), = kube.patches
    assert (plural, content, patch) == ("workloads", "application/merge-patch+json", {"spec": {"active": False}})
    suspension = ("suspend",) if kind == "TrainJob" else ("runPolicy", "suspend")
    # not suspended through its spec: Kueue suspends it, evicting the Workload
    assert _at(kube.get(PLURALS[kind], NS, "k-1")["spec"], suspension) is None
    stopped = _status()
    assert stopped["TrainingJobStatus"] == "Stopped" and kube.deleted == []
    assert f"kubectl patch workload {workload} -n ml" in stopped["SecondaryStatusTransitions"][-1]["StatusMessage"]


def test_a_job_name_kubernetes_refuses_is_a_usage_error_before_anything_is_sent(kube, tmp_path):
    result = _cli("submit", str(_job_file(tmp_path)), "--job-name", "Llama-1", "--no-wait")
    assert result.exit_code == 2 and "job_name" in result.output and "lower-case letters" in result.output
    assert kube.requests == [] and "Traceback" not in result.output
    assert _cli("submit", str(_job_file(tmp_path)), "--job-name", "llama-1", "--no-wait").exit_code == 0  # control
