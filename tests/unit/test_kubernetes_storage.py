"""A Kubernetes job's storage (kubernetes.storage): S3's rules and what it renders (the pods' emptyDir,
the job's prefixes in pod.json), a pod's S3 mirror of its checkpoints and records
(container.toolkit.pod_storage), and the client's read-back from S3 or from a claim it mounts
(launcher.kubernetes.readback), S3 through moto in this process."""

from __future__ import annotations

import json
import os
import shutil
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from container.toolkit.pod_storage import Mirror
from launcher.backends.base import SettingError
from launcher.config import validate_job
from launcher.config.backends.kubernetes import KubernetesSettings, KubernetesStorage, check_kubernetes
from launcher.kubernetes import readback
from launcher.kubernetes.manifest import pod_config_map, train_job
from launcher.wire.training.issues import ConfigError
from tests.unit.test_kubernetes_manifest import JOB, SECTION, _core, _validated

S3_SECTION = {**SECTION, "storage": {"s3": "s3://bucket/jobs"}}
S3_JOB = {**JOB, "kubernetes": S3_SECTION, "inputs": {"train": "s3://bucket/data/train"}}


def _issues(fields: dict) -> list[tuple[str, str]]:
    job = {**S3_JOB, **fields}
    try:
        validated = validate_job(job)
    except ConfigError as exc:
        return [(i.path, i.problem) for i in exc.issues if i.level == "error"]
    return [(i.path, i.problem) for i in check_kubernetes(SimpleNamespace(job=validated.config,
                                                                          instance=validated.instance))]


def test_s3_storage_takes_s3_channels_and_refuses_what_the_pods_cannot_read(tmp_path):
    assert _issues({}) == []  # the control: an s3:// channel, outputs under the storage prefix
    assert _issues({"output_path": "s3://other/out", "checkpoint_s3_uri": "s3://other/ckpt"}) == []
    assert [p for p, _ in _issues({"inputs": {"train": str(tmp_path)}})] == ["inputs.train"]
    assert [p for p, _ in _issues({"inputs": {"train": "/mnt/smlaunch/data/train"}})] == ["inputs.train"]
    assert [p for p, _ in _issues({"input_mode": "Pipe"})] == ["input_mode"]
    assert [p for p, _ in _issues({"inputs": {"train": {"s3_data": "s3://bucket/data", "input_mode": "FastFile"}}})
            ] == ["inputs.train.input_mode"]
    assert [p for p, _ in _issues({"inputs": {"train": {"s3_data": "s3://bucket/m", "s3_data_type": "ManifestFile"}}})
            ] == ["inputs.train.s3_data_type"]
    assert [p for p, _ in _issues({"output_path": "/mnt/smlaunch/runs"})] == ["output_path"]
    assert [p for p, _ in _issues({"checkpoint_local_path": "/data/ckpt"})] == ["checkpoint_local_path"]
    assert _issues({"checkpoint_local_path": "/opt/ml/checkpoints"}) == []  # SageMaker's default is no change


def test_a_claim_refuses_checkpoint_s3_uri_it_would_not_sync():
    job = validate_job({**JOB, "kubernetes": SECTION})
    assert check_kubernetes(SimpleNamespace(job=job.config, instance=job.instance)) == []  # the control
    with pytest.raises(ConfigError) as info:
        validate_job({**JOB, "checkpoint_s3_uri": "s3://bucket/ckpt"})
    assert [i.path for i in info.value.issues] == ["checkpoint_s3_uri"]


def test_client_path_belongs_to_a_claim():
    assert KubernetesStorage(pvc="fsx", client_path="/fsx").client_path == "/fsx"  # the control
    with pytest.raises(ValidationError, match="client_path is where this machine mounts the claim"):
        KubernetesStorage(s3="s3://bucket/jobs", client_path="/fsx")


def test_on_s3_the_pods_get_their_own_disk_and_the_jobs_prefixes():
    job = validate_job({**S3_JOB, "region": "us-west-2"})
    settings = KubernetesSettings(**S3_SECTION)
    manifest = train_job(job, "llama-1", settings)
    assert _validated(manifest) == manifest
    patch = manifest["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    pod = patch["template"]["spec"]["template"]["spec"]
    assert _core(pod, "V1PodSpec") == pod
    assert pod["volumes"][1] == {"name": "smlaunch-scratch", "emptyDir": {}}
    assert pod["containers"][0]["volumeMounts"][1] == {"name": "smlaunch-scratch", "mountPath": "/opt/smlaunch"}
    assert "persistentVolumeClaim" not in json.dumps(manifest) and "AWS_" not in json.dumps(manifest)
    config = json.loads(pod_config_map(job, "llama-1", settings, b"")["data"]["pod.json"])
    assert config["s3"] == {"job": "s3://bucket/jobs/llama-1", "checkpoints": "s3://bucket/jobs/llama-1/checkpoints",
                            "output": "s3://bucket/jobs/llama-1/output", "region": "us-west-2"}
    assert "job_dir" not in config and config["channels"] == {"train": "s3://bucket/data/train"}
    given = validate_job({**S3_JOB, "output_path": "s3://out/runs", "checkpoint_s3_uri": "s3://ck/llama"})
    s3 = json.loads(pod_config_map(given, "llama-1", settings, b"")["data"]["pod.json"])["s3"]
    assert (s3["output"], s3["checkpoints"]) == ("s3://out/runs/llama-1/output", "s3://ck/llama")


def _keys(client, prefix: str) -> list[str]:
    return sorted(o["Key"] for o in client.list_objects_v2(Bucket="bucket", Prefix=prefix).get("Contents", []))


def test_the_mirror_uploads_complete_checkpoints_marker_last_and_changed_records_only(tmp_path, aws, monkeypatch):
    client = aws.client("s3")
    client.create_bucket(Bucket="bucket")
    uploaded = []
    from launcher.wire import s3io
    real = s3io.upload_file
    monkeypatch.setattr(s3io, "upload_file", lambda path, uri, region: (uploaded.append(uri), real(path, uri, region)))
    base, checkpoints = tmp_path / "hosts" / "algo-2", tmp_path / "checkpoints"
    (base / "output" / "data").mkdir(parents=True)
    (checkpoints / "step-2").mkdir(parents=True)
    (checkpoints / "step-4.tmp").mkdir()  # a save in progress: not mirrored
    for name in (".complete", "__1_0.distcp", "manifest-1.json"):
        (checkpoints / "step-2" / name).write_text(name)
    (checkpoints / "step-4.tmp" / "__1_0.distcp").write_text("half")
    (base / "output" / "data" / "metrics.jsonl").write_text('{"step": 1}\n')
    s3 = {"job": "s3://bucket/jobs/j", "checkpoints": "s3://bucket/jobs/j/checkpoints", "region": None}
    mirror = Mirror("algo-2", base, checkpoints, s3)
    assert mirror.sync() == 4
    assert uploaded[2] == "s3://bucket/jobs/j/checkpoints/step-2/.complete"  # after the step's files
    assert _keys(client, "jobs/j/") == ["jobs/j/checkpoints/step-2/.complete", "jobs/j/checkpoints/step-2/__1_0.distcp",
                                        "jobs/j/checkpoints/step-2/manifest-1.json",
                                        "jobs/j/hosts/algo-2/output/data/metrics.jsonl"]
    assert mirror.sync() == 0  # nothing changed: nothing sent again
    with open(base / "output" / "data" / "metrics.jsonl", "a") as f:
        f.write('{"step": 2}\n')
    os.utime(base / "output" / "data" / "metrics.jsonl", ns=(1, 1))  # a new stamp even within the clock's tick
    assert mirror.sync() == 1
    body = client.get_object(Bucket="bucket", Key="jobs/j/hosts/algo-2/output/data/metrics.jsonl")["Body"].read()
    assert body.decode().splitlines() == ['{"step": 1}', '{"step": 2}']



def test_the_mirror_uploads_what_a_restart_needs_beside_the_steps_as_sagemaker_syncs_the_directory(tmp_path, aws):
    """/opt/ml/checkpoints is synced whole: the tracker runs' ids and the non-finite rollbacks' record
    (which smlaunch keeps beside its step-<N>/ directories) and a user script's own checkpoint file
    reach S3, so a restarted pod downloads them; a save in progress (step-<N>.tmp/) does not (the control)."""
    from container.trackers.continuity import FILE as TRACKERS
    from launcher.wire.training.nonfinite import SKIP_FILE

    client = aws.client("s3")
    client.create_bucket(Bucket="bucket")
    base, checkpoints = tmp_path / "hosts" / "algo-1", tmp_path / "checkpoints"
    (base / "output" / "data").mkdir(parents=True)
    (checkpoints / "step-4.tmp").mkdir(parents=True)
    (checkpoints / "step-4.tmp" / "__0_0.distcp").write_text("half")
    (checkpoints / "mine").mkdir()
    for name in (TRACKERS, SKIP_FILE, "mine/model.pt"):
        (checkpoints / name).write_text(name)
    s3 = {"job": "s3://bucket/jobs/j", "checkpoints": "s3://bucket/jobs/j/checkpoints", "region": None}
    assert Mirror("algo-1", base, checkpoints, s3).sync() == 3
    assert _keys(client, "jobs/j/checkpoints/") == sorted(
        f"jobs/j/checkpoints/{name}" for name in (TRACKERS, SKIP_FILE, "mine/model.pt"))


def test_a_checkpoint_pruned_here_is_deleted_in_s3_after_the_newer_one_is_there(tmp_path, aws):
    client = aws.client("s3")
    client.create_bucket(Bucket="bucket")
    base, checkpoints = tmp_path / "hosts" / "algo-1", tmp_path / "checkpoints"
    (base / "output" / "data").mkdir(parents=True)
    for step in (2, 4):
        (checkpoints / f"step-{step}").mkdir(parents=True)
        for name in (".complete", "__0_0.distcp"):
            (checkpoints / f"step-{step}" / name).write_text(name)
    s3 = {"job": "s3://bucket/jobs/j", "checkpoints": "s3://bucket/jobs/j/checkpoints", "region": None}
    mirror = Mirror("algo-1", base, checkpoints, s3)
    assert mirror.sync() == 4
    (checkpoints / "step-6").mkdir()
    for name in (".complete", "__0_0.distcp"):
        (checkpoints / "step-6" / name).write_text(name)
    shutil.rmtree(checkpoints / "step-2")  # the checkpointer keeps two
    assert mirror.sync() == 2
    assert _keys(client, "jobs/j/checkpoints/") == [  # step-4 kept: the control
        f"jobs/j/checkpoints/step-{s}/{n}" for s in (4, 6) for n in (".complete", "__0_0.distcp")]
    assert mirror.sync() == 0 and len(_keys(client, "jobs/j/checkpoints/")) == 4  # nothing more to do


def test_the_client_reads_an_s3_jobs_records_and_checkpoint(tmp_path, aws):
    client = aws.client("s3")
    client.create_bucket(Bucket="bucket")
    put = {"jobs/j/hosts/algo-1/output/data/progress.json": '{"step": 3, "max_steps": 10}',
           "jobs/j/checkpoints/step-2/.complete": "", "jobs/j/checkpoints/step-4/__0_0.distcp": "",  # 4: no marker
           "jobs/j/output/output.tar.gz": ""}
    for key, body in put.items():
        client.put_object(Bucket="bucket", Key=key, Body=body.encode())
    storage = {"s3": {"job": "s3://bucket/jobs/j", "checkpoints": "s3://bucket/jobs/j/checkpoints",
                      "output": "s3://bucket/jobs/j/output", "region": None}}
    assert readback.unreadable(storage) is None
    files = readback.job_dir(storage, tmp_path)
    assert json.loads((files / "hosts" / "algo-1" / "output" / "data" / "progress.json").read_text())["step"] == 3
    assert readback.checkpoint(storage).where == "s3://bucket/jobs/j/checkpoints/step-2"
    assert readback.artifacts(storage) == {"output.tar.gz": "s3://bucket/jobs/j/output/output.tar.gz"}
    # a job whose pods have uploaded nothing yet: no records, no checkpoint, no archive, and no error
    empty = {"s3": {k: v.replace("/j", "/k") if v else v for k, v in storage["s3"].items()}}
    assert list((readback.job_dir(empty, tmp_path / "k") / "hosts").iterdir()) == []
    assert (readback.checkpoint(empty), readback.artifacts(empty)) == (None, {})


def test_a_claim_is_read_where_this_machine_mounts_it_and_not_without(tmp_path):
    storage = {"pvc": "fsx", "mount_path": "/mnt/smlaunch", "client_path": str(tmp_path / "fsx"),
               "job_dir": "/mnt/smlaunch/smlaunch-jobs/j",
               "checkpoint_dir": "/mnt/smlaunch/smlaunch-jobs/j/checkpoints"}
    (tmp_path / "fsx" / "smlaunch-jobs" / "j" / "checkpoints" / "step-6").mkdir(parents=True)
    (tmp_path / "fsx" / "smlaunch-jobs" / "j" / "checkpoints" / "step-6" / ".complete").write_text("")
    assert readback.job_dir(storage, tmp_path / "store") == tmp_path / "fsx" / "smlaunch-jobs" / "j"
    assert readback.checkpoint(storage).step == 6
    assert readback.artifacts(storage) == {"model": "/mnt/smlaunch/smlaunch-jobs/j/hosts/algo-1/model",
                                           "output": "/mnt/smlaunch/smlaunch-jobs/j/hosts/algo-1/output/data"}
    unmounted = {**storage, "client_path": None}
    assert "does not mount" in readback.unreadable(unmounted)
    with pytest.raises(SettingError, match=r"claim fsx .*does not mount.*set kubernetes.storage.client_path"):
        readback.job_dir(unmounted, tmp_path / "store")


def test_a_pod_downloads_its_shard_of_a_sharded_channel_and_every_checkpoint(tmp_path, aws):
    from container.toolkit.pod_storage import download_inputs

    client = aws.client("s3")
    client.create_bucket(Bucket="bucket")
    for i in range(4):
        client.put_object(Bucket="bucket", Key=f"data/part-{i}.jsonl", Body=b"{}\n")
    for key in ("jobs/j/checkpoints/step-2/__0_0.distcp", "jobs/j/checkpoints/step-2/__1_0.distcp"):
        client.put_object(Bucket="bucket", Key=key, Body=b"shard")
    s3 = {"job": "s3://bucket/jobs/j", "checkpoints": "s3://bucket/jobs/j/checkpoints", "region": None}
    channels = {"train": "s3://bucket/data", "full": "s3://bucket/data"}
    local = download_inputs(s3, channels, {"train": "ShardedByS3Key"}, ["algo-1", "algo-2"], "algo-2",
                            tmp_path, tmp_path / "checkpoints")
    assert sorted(p.name for p in local["train"].iterdir()) == ["part-1.jsonl", "part-3.jsonl"]  # every 2nd from 1
    assert len(list(local["full"].iterdir())) == 4  # the control: FullyReplicated, every object
    assert sorted(p.name for p in (tmp_path / "checkpoints" / "step-2").iterdir()) == ["__0_0.distcp",
                                                                                       "__1_0.distcp"]
    assert not (tmp_path / "hosts" / "algo-2" / "output" / "data").exists()  # a first start: no records
    client.put_object(Bucket="bucket", Key="jobs/j/hosts/algo-2/output/data/restarts.jsonl", Body=b"{}\n")
    download_inputs(s3, channels, {}, ["algo-1", "algo-2"], "algo-2", tmp_path, tmp_path / "checkpoints")
    assert (tmp_path / "hosts" / "algo-2" / "output" / "data" / "restarts.jsonl").read_bytes() == b"{}\n"  # again
    with pytest.raises(LookupError, match="holds no objects"):
        download_inputs(s3, {"train": "s3://bucket/nothing"}, {}, ["algo-1"], "algo-1", tmp_path, tmp_path / "c")


@pytest.mark.parametrize(("artifacts", "shown", "not_shown"), [
    ({"model": "/mnt/j/hosts/algo-1/model", "output": "/mnt/j/hosts/algo-1/output/data"},
     "  model: /mnt/j/hosts/algo-1/model", "model artifact:  none"),
    ({"output.tar.gz": "s3://b/j/output/output.tar.gz"}, "model artifact:  none", "  model: "),  # the control
])
def test_a_completed_jobs_summary_names_a_claims_unpacked_directories(capsys, artifacts, shown, not_shown):
    from launcher.cli.app import _report_completed

    backend = SimpleNamespace(artifacts=lambda name: artifacts, restarts=lambda name: [], goodput=lambda name: None,
                              job_dir=lambda name: None)  # a Kubernetes job's: no job directory here
    _report_completed(backend, "j", {"TrainingJobStatus": "Completed"})
    out = capsys.readouterr().out
    assert shown in out and not_shown not in out


def test_progress_restarts_and_goodput_share_one_download_of_the_records(tmp_path, monkeypatch):
    """`status` asks for all three: the S3 records are downloaded once, not three times; a read older
    than RECORDS_FRESH_S downloads again (the control)."""
    from launcher.backends import kubernetes as backend_module
    from launcher.local import store

    downloads = []

    def job_dir(storage, store_dir):
        downloads.append(store_dir)
        (store_dir / "records" / "hosts" / "algo-1" / "output" / "data").mkdir(parents=True, exist_ok=True)
        return store_dir / "records"

    monkeypatch.setattr(readback, "job_dir", job_dir)
    s3 = {"job": "s3://bucket/jobs/j", "checkpoints": "s3://bucket/jobs/j/checkpoints",
          "output": "s3://bucket/jobs/j/output", "region": None}
    store.write(store.job_dir("j", tmp_path), {
        "TrainingJobName": "j", "TrainingJobStatus": "Completed", "Backend": "kubernetes",
        "TrainingStartTime": "2026-11-27T12:00:00+00:00", "TrainingEndTime": "2026-11-27T12:10:00+00:00",
        "Kubernetes": {"namespace": "ml", "storage": {"s3": s3}}})
    backend = backend_module.KubernetesBackend(root=tmp_path)
    backend.progress("j"), backend.restarts("j"), backend.goodput("j")
    assert len(downloads) == 1
    now = backend_module.time.monotonic()
    monkeypatch.setattr(backend_module.time, "monotonic", lambda: now + backend_module.RECORDS_FRESH_S + 1)
    backend.progress("j")
    assert len(downloads) == 2
