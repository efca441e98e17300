"""SageMakerBackend against moto (S3, SageMaker, CloudWatch Logs) and botocore's Stubber."""

from __future__ import annotations

import io
import json
import struct
import tarfile
import time
from datetime import datetime, timezone

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws
from moto.core import DEFAULT_ACCOUNT_ID

from launcher.backends.base import BackendError, JobFailedError
from launcher.backends.cwlogs import LOG_GROUP
from launcher.backends.sagemaker import SageMakerBackend
from launcher.wire.training.issues import ConfigError
from tests.support.sagemaker_jobs import (
    BUCKET,
    REGION,
    ROLE,
    ROOT,
    make_job,
    moto_job,
    put_logs,
    set_status,
)

DEFAULT_BUCKET = f"sagemaker-{REGION}-{DEFAULT_ACCOUNT_ID}"


@pytest.fixture(autouse=True)
def _no_network(no_network):
    """Every test here runs with the network refused (conftest.py)."""


@pytest.fixture
def aws(fake_credentials):
    with mock_aws():
        yield boto3.Session(region_name=REGION)


@pytest.fixture
def lines() -> list[str]:
    return []


@pytest.fixture
def backend(aws, lines) -> SageMakerBackend:
    return SageMakerBackend(aws, printer=lines.append)




def smp_job(**fields):
    return make_job(instance_type="ml.p5.48xlarge", distribution={
        "torch_distributed": {"enabled": True},
        "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
            "hybrid_shard_degree": 8, "context_parallel_degree": 8}}},
    }, **fields)


def objects(session, bucket: str) -> list[str]:
    listing = session.client("s3").list_objects_v2(Bucket=bucket)
    return sorted(o["Key"] for o in listing.get("Contents", []))


def buckets(session) -> list[str]:
    return sorted(b["Name"] for b in session.client("s3").list_buckets()["Buckets"])


def job_names(session) -> list[str]:
    return [j["TrainingJobName"] for j in session.client("sagemaker").list_training_jobs()["TrainingJobSummaries"]]








# --- submit -------------------------------------------------------------------------------------
def test_submit_uploads_code_and_creates_job(aws, backend) -> None:
    aws.client("s3").create_bucket(Bucket=BUCKET)
    name = backend.submit(smp_job(), job_name="smp-job-1")
    assert name == "smp-job-1"

    key = "smp-job-1/source/sourcedir.tar.gz"  # s3://<bucket of output_path>/<job>/source/...
    assert objects(aws, BUCKET) == [key]
    body = aws.client("s3").get_object(Bucket=BUCKET, Key=key)["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
        names = tar.getnames()
        assert "train.py" in names and "_smlaunch/container/__init__.py" in names
        script = tar.extractfile("train.py").read()
    assert script == (ROOT / "entrypoints" / "train.py").read_bytes()

    desc = backend.describe(name)
    assert desc["TrainingJobName"] == name
    assert desc["RoleArn"] == ROLE
    assert desc["ResourceConfig"]["InstanceType"] == "ml.p5.48xlarge"
    hp = desc["HyperParameters"]
    assert hp["sagemaker_submit_directory"] == json.dumps(f"s3://{BUCKET}/{key}")
    assert json.loads(hp["mp_parameters"]) == {"hybrid_shard_degree": 8, "context_parallel_degree": 8}
    assert hp["max_steps"] == "3" and hp["model_type"] == '"llama_v2"'


def test_submit_with_a_taken_name_uploads_nothing(aws, backend) -> None:
    aws.client("s3").create_bucket(Bucket=BUCKET)
    backend.submit(make_job(), job_name="taken")
    before = objects(aws, BUCKET)
    with pytest.raises(BackendError, match="taken"):
        backend.submit(make_job(hyperparameters={"max_steps": 99}), job_name="taken")
    assert objects(aws, BUCKET) == before
    assert job_names(aws) == ["taken"]
    assert backend.describe("taken")["HyperParameters"]["max_steps"] == "3"  # the first job is untouched


def test_a_refused_create_training_job_takes_the_uploaded_code_back(aws, backend, monkeypatch) -> None:
    from botocore.exceptions import ClientError

    aws.client("s3").create_bucket(Bucket=BUCKET)

    def refuse(**request):
        assert objects(aws, BUCKET) == ["refused/source/sourcedir.tar.gz"]  # uploaded first, as the SDK does
        raise ClientError({"Error": {"Code": "ResourceLimitExceeded", "Message": "quota for ml.m5.xlarge"}},
                          "CreateTrainingJob")

    monkeypatch.setattr(backend.client("sagemaker"), "create_training_job", refuse)
    with pytest.raises(ClientError, match="ResourceLimitExceeded"):
        backend.submit(make_job(), job_name="refused")
    assert objects(aws, BUCKET) == []


def put_corpus(session, prefix: str, megatron: bool) -> None:
    """A one-document corpus under s3://BUCKET/prefix: a Megatron-Core pair, or smlaunch's shard."""
    from launcher.wire.megatron_index import encode_prefix
    from launcher.wire.token_shards import encode_header

    s3 = session.client("s3")
    index = (encode_prefix("uint16", 1, 1) + struct.pack("<i2q", 4, 0, 0) + struct.pack("<q", 1) if megatron
             else encode_header({"dtype": "uint16"}))  # smlaunch's header: its first bytes are what is read
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}corpus_text_document.idx", Body=index)
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}corpus_text_document.bin", Body=bytes(8))


def test_a_megatron_corpus_on_s3_without_its_tokenizer_named_creates_nothing(aws, backend, lines) -> None:
    """What validate checks of a local Megatron corpus (the job names the tokenizer its files do not
    record), submit checks of one on S3, from the first bytes of its index, before any upload."""
    aws.client("s3").create_bucket(Bucket=BUCKET)
    put_corpus(aws, "data/megatron/", megatron=True)
    put_corpus(aws, "data/smlaunch/", megatron=False)
    before = objects(aws, BUCKET)

    def job(train: str, **hyperparameters):
        return make_job(inputs={"train": f"s3://{BUCKET}/{train}"},
                        hyperparameters={"max_steps": 3, "dataset_type": "indexed", **hyperparameters})

    with pytest.raises(ConfigError) as err:
        backend.submit(job("data/megatron/"), job_name="unnamed")
    assert [(i.path, i.problem.split(",")[0]) for i in err.value.issues] == [
        ("hyperparameters.tokenizer", "inputs.train holds a Megatron MMIDIDX corpus")]
    assert objects(aws, BUCKET) == before and job_names(aws) == []
    # the controls: the vocabulary named, and smlaunch's shards (their header names the tokenizer)
    backend.submit(job("data/megatron/", vocab_size=256), job_name="named")
    backend.submit(job("data/smlaunch/"), job_name="shards")
    assert job_names(aws) == ["named", "shards"]
    backend.submit(job("data/megatron/", dataset_type="jsonl"), job_name="not-indexed")  # not read as a corpus
    backend.submit(make_job(inputs={"train": "s3://elsewhere/data/"}, hyperparameters={"dataset_type": "indexed"}),
                   job_name="unreadable")
    assert any(line.startswith("inputs.train (s3://elsewhere/data/) not read here (NoSuchBucket): the job checks")
               for line in lines), lines


def test_invalid_job_creates_nothing(aws) -> None:
    from launcher.sdk.estimator import PyTorch

    aws.client("s3").create_bucket(Bucket=BUCKET)
    with pytest.raises(ConfigError) as err:
        PyTorch(entry_point="train.py", source_dir=str(ROOT / "entrypoints"), role=ROLE,
                instance_type="ml.p5.48xlarge", instance_count=1, output_path=f"s3://{BUCKET}/output/",
                sagemaker_session=aws,
                distribution={"torch_distributed": {"enabled": True}, "smdistributed": {"modelparallel": {
                    "enabled": True, "parameters": {"hybrid_shard_degree": 8, "context_parallel_degree": 3}}}})
    assert any(i.path.endswith("context_parallel_degree") for i in err.value.issues)
    assert buckets(aws) == [BUCKET]
    assert objects(aws, BUCKET) == []
    assert job_names(aws) == []


def test_job_without_role_creates_nothing(aws, backend) -> None:
    aws.client("s3").create_bucket(Bucket=BUCKET)
    with pytest.raises(ConfigError) as err:
        backend.submit(make_job(role=None), job_name="no-role")
    assert [i.path for i in err.value.issues] == ["role"]
    assert objects(aws, BUCKET) == [] and job_names(aws) == []


def test_missing_user_bucket_fails_before_anything_is_created(aws, backend) -> None:
    with pytest.raises(BackendError, match="no-such-bucket-smlaunch"):
        backend.submit(make_job(output_path="s3://no-such-bucket-smlaunch/out/"), job_name="lost")
    assert buckets(aws) == []  # the user's bucket is not created behind their back
    assert job_names(aws) == []


def test_missing_output_bucket_is_found_when_code_goes_elsewhere(aws, backend) -> None:
    aws.client("s3").create_bucket(Bucket=BUCKET)
    with pytest.raises(BackendError, match="no-such-output-bucket"):
        backend.submit(make_job(code_location=f"s3://{BUCKET}/code", output_path="s3://no-such-output-bucket/out/"),
                       job_name="split")
    assert objects(aws, BUCKET) == [] and job_names(aws) == []


def test_default_bucket_is_created(aws, backend) -> None:
    name = backend.submit(make_job(output_path=None), job_name="default-bucket")
    # SDK v2: sagemaker-<region>-<account>, code under <job>/source/, artifacts at the bucket root
    assert DEFAULT_BUCKET in buckets(aws)
    assert objects(aws, DEFAULT_BUCKET) == [f"{name}/source/sourcedir.tar.gz"]
    desc = backend.describe(name)
    assert desc["OutputDataConfig"]["S3OutputPath"] == f"s3://{DEFAULT_BUCKET}/"


def test_code_location_prefix_is_used_for_upload(aws, backend) -> None:
    aws.client("s3").create_bucket(Bucket=BUCKET)
    backend.submit(make_job(code_location=f"s3://{BUCKET}/code/prefix"), job_name="coded")
    assert objects(aws, BUCKET) == ["code/prefix/coded/source/sourcedir.tar.gz"]


# --- wait and logs ------------------------------------------------------------------------------
def test_wait_prints_both_hosts_merged_by_time(aws, backend, lines) -> None:
    aws.client("s3").create_bucket(Bucket=BUCKET)
    name = backend.submit(make_job(instance_count=2), job_name="two-hosts")
    t = int(time.time() * 1000) - 60_000
    put_logs(aws, name, 1, [(t, "host1 start"), (t + 20, "host1 step 1"), (t + 40, "host1 done")])
    put_logs(aws, name, 2, [(t + 10, "host2 start"), (t + 30, "host2 step 1")])
    put_logs(aws, "other-job", 1, [(t + 5, "not mine")])

    desc = backend.wait(name, logs=True, poll=0)
    assert desc["TrainingJobStatus"] == "Completed"
    log_lines = [line for line in lines if line.startswith("[algo-")]
    assert log_lines == [
        "[algo-1] host1 start",
        "[algo-2] host2 start",
        "[algo-1] host1 step 1",
        "[algo-2] host2 step 1",
        "[algo-1] host1 done",
    ]
    # moto's one secondary status transition is shown too
    assert any(line.startswith(f"[{name}] Starting") for line in lines)


def test_logs_without_follow_prints_once(aws, backend, lines) -> None:
    aws.client("s3").create_bucket(Bucket=BUCKET)
    name = backend.submit(make_job(), job_name="one-host")
    assert lines[0].startswith("sourcedir.tar.gz: ")  # what submit packed (the code bundle's line)
    lines.clear()
    t = int(time.time() * 1000) - 10_000
    put_logs(aws, name, 1, [(t, "a"), (t + 1, "b")])
    backend.logs(name)
    assert lines == ["[algo-1] a", "[algo-1] b"]


def test_wait_on_failed_job_raises_with_reason_and_log_group(aws, backend, lines) -> None:
    aws.client("s3").create_bucket(Bucket=BUCKET)
    name = backend.submit(make_job(), job_name="will-fail")
    reason = "AlgorithmError: ExecuteUserScriptError: CUDA out of memory. Tried to allocate 7.83 GiB"
    set_status(name, "Failed", reason)
    stream = put_logs(aws, name, 1, [(int(time.time() * 1000) - 1000, "Traceback: OOM")])

    with pytest.raises(JobFailedError) as err:
        backend.wait(name, logs=True, poll=0)
    message = str(err.value)
    assert reason in message
    assert LOG_GROUP in message
    assert stream in message
    assert err.value.status == "Failed" and err.value.job_name == name
    assert "[algo-1] Traceback: OOM" in lines  # the logs are shown before the error


def test_wait_on_stopped_job_raises(aws, backend) -> None:
    aws.client("s3").create_bucket(Bucket=BUCKET)
    name = backend.submit(make_job(), job_name="was-stopped")
    set_status(name, "Stopped")
    with pytest.raises(JobFailedError, match="stopped"):
        backend.wait(name, logs=False, poll=0)


def test_keyboard_interrupt_prints_reattach_hint(aws, backend, lines, monkeypatch) -> None:
    aws.client("s3").create_bucket(Bucket=BUCKET)
    name = backend.submit(make_job(), job_name="long-running")
    set_status(name, "InProgress")

    def interrupted(seconds):
        raise KeyboardInterrupt

    monkeypatch.setattr("launcher.backends.sagemaker.time.sleep", interrupted)
    with pytest.raises(KeyboardInterrupt):
        backend.wait(name, logs=True, poll=0)
    hint = "\n".join(lines)
    assert f"smlaunch logs {name} --follow" in hint
    assert f"smlaunch stop {name}" in hint
    assert f"PyTorch.attach({name!r})" in hint
    assert moto_job(name).training_job_status == "InProgress"  # following stops, the job does not


def test_describe_unknown_job(backend) -> None:
    with pytest.raises(BackendError, match="no training job named 'nope'"):
        backend.describe("nope")


# --- stop and list ------------------------------------------------------------------------------
def _describe_response(name: str, status: str = "InProgress") -> dict:
    now = datetime(2025, 1, 1, tzinfo=timezone.utc)
    return {
        "TrainingJobName": name,
        "TrainingJobArn": f"arn:aws:sagemaker:{REGION}:111122223333:training-job/{name}",
        "ModelArtifacts": {"S3ModelArtifacts": ""},
        "TrainingJobStatus": status,
        "SecondaryStatus": "Training",
        "AlgorithmSpecification": {"TrainingInputMode": "File"},
        "ResourceConfig": {"InstanceType": "ml.p5.48xlarge", "InstanceCount": 1, "VolumeSizeInGB": 400},
        "StoppingCondition": {"MaxRuntimeInSeconds": 86400},
        "CreationTime": now,
    }


@pytest.fixture
def stubbed(monkeypatch, tmp_path):
    """A backend whose SageMaker client is stubbed (moto has no StopTrainingJob)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    backend = SageMakerBackend(boto3.Session(region_name=REGION), printer=lambda line: None)
    stubber = Stubber(backend.client("sagemaker"))
    with stubber:
        yield backend, stubber
    stubber.assert_no_pending_responses()


def test_stop_sends_stop_training_job(stubbed) -> None:
    backend, stubber = stubbed
    stubber.add_response("describe_training_job", _describe_response("run-7"), {"TrainingJobName": "run-7"})
    stubber.add_response("stop_training_job", {}, {"TrainingJobName": "run-7"})
    backend.stop("run-7")


def test_stop_unknown_job_sends_no_stop(stubbed) -> None:
    backend, stubber = stubbed
    stubber.add_client_error("describe_training_job", service_error_code="ValidationException",
                             service_message="Requested resource not found.", http_status_code=400)
    with pytest.raises(BackendError, match="ghost"):
        backend.stop("ghost")
    # no stop_training_job response was queued: a call would have raised UnStubbedResponseError


def _summary(name: str, status: str) -> dict:
    return {"TrainingJobName": name, "TrainingJobArn": f"arn:aws:sagemaker:{REGION}:1:training-job/{name}",
            "CreationTime": datetime(2025, 1, 1, tzinfo=timezone.utc), "TrainingJobStatus": status}


def test_list_follows_next_token_and_filters(stubbed) -> None:
    backend, stubber = stubbed
    first = {"SortBy": "CreationTime", "SortOrder": "Descending", "StatusEquals": "Failed", "NameContains": "llama"}
    stubber.add_response("list_training_jobs", {"TrainingJobSummaries": [_summary("llama-1", "Failed"),
                                                                         _summary("llama-2", "Failed")],
                                                "NextToken": "page-2"}, first)
    stubber.add_response("list_training_jobs", {"TrainingJobSummaries": [_summary("llama-3", "Failed")]},
                         {**first, "NextToken": "page-2"})
    jobs = backend.list(status="Failed", name_contains="llama", max_results=50)
    assert [j["TrainingJobName"] for j in jobs] == ["llama-1", "llama-2", "llama-3"]


def test_list_stops_at_max_results(stubbed) -> None:
    backend, stubber = stubbed
    expected = {"SortBy": "CreationTime", "SortOrder": "Descending"}
    stubber.add_response("list_training_jobs", {"TrainingJobSummaries": [_summary("a", "Completed"),
                                                                         _summary("b", "Completed")],
                                                "NextToken": "t2"}, expected)
    stubber.add_response("list_training_jobs", {"TrainingJobSummaries": [_summary("c", "Completed"),
                                                                         _summary("d", "Completed")],
                                                "NextToken": "t3"}, {**expected, "NextToken": "t2"})
    # a third page is never requested: the stubber would raise on an unexpected call
    assert [j["TrainingJobName"] for j in backend.list(max_results=3)] == ["a", "b", "c"]


def test_list_filters_by_status_under_moto(aws, backend) -> None:
    aws.client("s3").create_bucket(Bucket=BUCKET)
    for name in ("job-a", "job-b", "job-c", "other"):
        backend.submit(make_job(), job_name=name)
    set_status("job-b", "Failed", "boom")
    assert [j["TrainingJobName"] for j in backend.list(status="Failed")] == ["job-b"]
    assert sorted(j["TrainingJobName"] for j in backend.list(status="Completed", name_contains="job")) == \
        ["job-a", "job-c"]
    assert len(backend.list(max_results=2)) == 2
