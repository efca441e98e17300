"""Local mode with S3: channels downloaded, artifacts and checkpoints uploaded, against a moto
server reached through AWS_ENDPOINT_URL (as a MinIO or AWS itself would be)."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from launcher.backends.base import BackendError
from launcher.config import validate_job
from launcher.local.prepare import prepare
from launcher.local.process import ProcessRunner
from tests.conftest import LOCAL_S3_BUCKET, REGION
from tests.support.local_jobs import HP, cli_env, job_file, smlaunch
from tests.support.train_runs import ROOT, series

BUCKET = LOCAL_S3_BUCKET




def upload_dir(client, directory, prefix: str) -> None:
    for path in directory.iterdir():
        client.upload_file(str(path), BUCKET, f"{prefix}/{path.name}")


def test_s3_inputs_outputs_and_checkpoints(tmp_path, s3, corpus, monkeypatch):
    client, endpoint = s3
    train, validation = corpus
    upload_dir(client, train, "data/train")
    upload_dir(client, validation, "data/validation")
    # two hosts (each uploads its own checkpoint part) of one rank each: what S3 adds is per host
    spec = job_file(tmp_path / "job.yaml", base_job_name="s3job", output_path=f"s3://{BUCKET}/out",
                    checkpoint_s3_uri=f"s3://{BUCKET}/ckpt", processes_per_host=1,
                    distribution={"torch_distributed": {"enabled": True}},
                    inputs={"train": f"s3://{BUCKET}/data/train/", "validation": f"s3://{BUCKET}/data/validation"},
                    hyperparameters={**HP, "checkpoint_freq": 4})
    home = tmp_path / "home"
    env = {**cli_env(home), "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION,
           "AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}
    proc = smlaunch("submit", str(spec), env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    name = next(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("submitted "))
    assert "channel train: 1 object(s)" in proc.stdout

    model_key = f"out/{name}/output/model.tar.gz"
    assert f"model artifact:  s3://{BUCKET}/{model_key}" in proc.stdout
    with tarfile.open(fileobj=io.BytesIO(client.get_object(Bucket=BUCKET, Key=model_key)["Body"].read())) as tar:
        assert {"model.safetensors", "config.json"} <= set(tar.getnames())
    body = client.get_object(Bucket=BUCKET, Key=f"out/{name}/output/output.tar.gz")["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        records = [json.loads(x) for x in tar.extractfile("metrics.jsonl").read().decode().splitlines()]
    losses = series(records, "loss")
    assert len(losses) == 4 and losses[-1] < losses[0]
    keys = {o["Key"] for o in client.list_objects_v2(Bucket=BUCKET, Prefix="ckpt/")["Contents"]}
    assert "ckpt/step-4/.complete" in keys and {f"ckpt/step-4/__{r}_0.distcp" for r in range(2)} <= keys

    # A re-run with the same checkpoint_s3_uri gets the checkpoints back and resumes from step 4.
    again = smlaunch("submit", str(spec), "--set", "hyperparameters.max_steps=6", env=env)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "checkpoints: " in again.stdout and "resumed" in again.stdout.lower()
    assert "[metrics] step=5 " in again.stdout and "[metrics] step=1 " not in again.stdout


def test_sharded_channel_gives_each_host_its_part(tmp_path, s3, monkeypatch):
    client, _ = s3
    for i in range(4):
        client.put_object(Bucket=BUCKET, Key=f"shards/part-{i}.jsonl", Body=b"{}\n")
    monkeypatch.setenv("SMLAUNCH_HOME", str(tmp_path / "home"))
    job = validate_job({"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "instance_type": "local",
                        "instance_count": 2, "region": REGION, "hyperparameters": {"model_preset": "llama3-tiny"},
                        "inputs": {"train": {"s3_data": f"s3://{BUCKET}/shards/", "distribution": "ShardedByS3Key"}}})
    spec = prepare(job, ProcessRunner(), job_name="sharded", log=lambda _: None)
    parts = {h: sorted(p.name for p in (spec.host_dir(h) / "input" / "data" / "train").iterdir()) for h in spec.hosts}
    assert parts == {"algo-1": ["part-0.jsonl", "part-2.jsonl"], "algo-2": ["part-1.jsonl", "part-3.jsonl"]}
    config = json.loads((spec.host_dir("algo-2") / "input" / "config" / "inputdataconfig.json").read_text())
    assert config["train"]["S3DistributionType"] == "ShardedByS3Key"


def test_a_missing_output_bucket_fails_before_the_job_exists(tmp_path, s3, monkeypatch):
    monkeypatch.setenv("SMLAUNCH_HOME", str(tmp_path / "home"))
    job = validate_job({"entry_point": "train.py", "source_dir": str(ROOT / "entrypoints"), "instance_type": "local",
                        "output_path": "s3://no-such-bucket/out", "hyperparameters": {"model_preset": "llama3-tiny"}})
    with pytest.raises(BackendError,
                       match="output_path 's3://no-such-bucket/out': bucket 'no-such-bucket' does not exist"):
        prepare(job, ProcessRunner(), job_name="nobucket", log=lambda _: None)
    assert not (tmp_path / "home" / "jobs" / "nobucket").exists()
