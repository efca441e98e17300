"""Warm pools: the keep-alive limit and matching fields against botocore's model, validate's words,
DescribeTrainingJob's WarmPoolStatus read with its time left, and UpdateTrainingJob through botocore's
Stubber (moto has no UpdateTrainingJob; the Stubber checks each request against the service model)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import boto3
import botocore.loaders
import pytest
from botocore.stub import Stubber

from launcher.backends.request import build_request
from launcher.backends.sagemaker import SageMakerBackend
from launcher.backends.warm_pools import WarmPool, WarmPoolError, reusable, status_line
from launcher.config import validate_job
from launcher.config.warm_pools import MATCH_FIELDS, mismatches
from launcher.wire.training.base import KEEP_ALIVE_MAX
from tests.support.config_checks import issues_of, only_issue, paths
from tests.unit.test_config_rules import make_job

REGION = "us-west-2"
ROLE = "arn:aws:iam::111122223333:role/SageMakerRole"
ENDED = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def model():
    return botocore.loaders.Loader().load_service_model("sagemaker", "service-2")["shapes"]


# --- the limit and the matching rule, against botocore's service model ---------------------------

def test_keep_alive_limit_is_the_service_models(model) -> None:
    create = model["ResourceConfig"]["members"]["KeepAlivePeriodInSeconds"]["shape"]
    update = model["ResourceConfigForUpdate"]["members"]["KeepAlivePeriodInSeconds"]["shape"]
    assert create == update
    assert (model[create]["min"], model[create]["max"]) == (0, KEEP_ALIVE_MAX)


def _has(model, shape: str, path: tuple[str, ...]) -> bool:
    for key in path:
        members = model[shape].get("members", {})
        if key not in members:
            return False
        shape = members[key]["shape"]
    return True


def test_matching_fields_are_request_and_description_fields(model) -> None:
    for path, _, _ in MATCH_FIELDS:
        assert _has(model, "CreateTrainingJobRequest", path), path
        assert _has(model, "DescribeTrainingJobResponse", path), path
    assert not _has(model, "CreateTrainingJobRequest", ("ResourceConfig", "NoSuchField"))  # control


def _request(runtime_dir, **fields) -> dict:
    job = validate_job(make_job(runtime_dir, role=ROLE, keep_alive_period_in_seconds=600, **fields))
    return build_request(job, job_name="run-1", region=REGION, source_uri="s3://b/code.tar.gz",
                         output_path="s3://b/out/")


def test_a_job_of_the_same_shape_matches_and_a_bigger_one_does_not(runtime_dir) -> None:
    pool_job = _request(runtime_dir, instance_count=2, subnets=["subnet-a", "subnet-b"],
                        security_group_ids=["sg-1"])
    same = _request(runtime_dir, instance_count=2, subnets=["subnet-b", "subnet-a"], security_group_ids=["sg-1"],
                    hyperparameters={"bf16": 1, "max_context_width": 8192, "lr": 0.001,
                                     "hf_pretrained_model_name_or_dir": "meta-llama/Llama-3.1-8B"})
    assert mismatches(pool_job, same) == []  # hyperparameters and the order of subnets do not matter
    bigger = _request(runtime_dir, instance_count=4, subnets=["subnet-a", "subnet-b"], security_group_ids=["sg-1"],
                      volume_size=500)
    assert mismatches(pool_job, bigger) == [("instance_count", 2, 4), ("volume_size", 30, 500)]


# --- validate ------------------------------------------------------------------------------------

def test_validate_states_the_reuse_rule_for_a_sagemaker_job(runtime_dir) -> None:
    notes = [i for i in validate_job(make_job(runtime_dir, keep_alive_period_in_seconds=1800)).notes
             if i.path == "keep_alive_period_in_seconds"]
    assert len(notes) == 1
    assert "1800 s" in notes[0].problem and "instance_type, instance_count" in notes[0].problem
    assert "smlaunch warm-pool" in notes[0].fix
    control = validate_job(make_job(runtime_dir)).notes
    assert not [i for i in control if i.path == "keep_alive_period_in_seconds"]


def test_keep_alive_beyond_the_limit_is_refused(runtime_dir) -> None:
    assert paths(make_job(runtime_dir, keep_alive_period_in_seconds=KEEP_ALIVE_MAX + 1)) == [
        "keep_alive_period_in_seconds"]
    assert paths(make_job(runtime_dir, keep_alive_period_in_seconds=KEEP_ALIVE_MAX)) == []


def test_keep_alive_on_local_is_explained_by_name(runtime_dir) -> None:
    local = make_job(runtime_dir, instance_type="local", keep_alive_period_in_seconds=600, hp={"bf16": 0})
    warned = only_issue(local, "keep_alive_period_in_seconds", "warning")
    assert "SageMaker's" in warned[0].problem and "backend local" in warned[0].problem
    local.pop("keep_alive_period_in_seconds")
    assert "keep_alive_period_in_seconds" not in paths(local, "warning")


def test_spot_and_heterogeneous_clusters_keep_no_pool(runtime_dir) -> None:
    assert only_issue(make_job(runtime_dir, keep_alive_period_in_seconds=600, use_spot_instances=True,
                               checkpoint_s3_uri="s3://b/c"), "keep_alive_period_in_seconds")
    groups = [{"instance_group_name": "train", "instance_type": "ml.p4d.24xlarge", "instance_count": 1}]
    hetero = make_job(runtime_dir, keep_alive_period_in_seconds=600, instance_groups=groups,
                      distribution={"mpi": {"enabled": True}, "instance_groups": ["train"]})
    hetero.pop("instance_type")
    found = [str(i) for i in issues_of(hetero) if i.path == "keep_alive_period_in_seconds"]
    assert found and "heterogeneous" in found[0]
    hetero["keep_alive_period_in_seconds"] = 0  # control: no pool asked for
    assert not [i for i in issues_of(hetero) if i.path == "keep_alive_period_in_seconds"]


# --- reading DescribeTrainingJob -----------------------------------------------------------------

def _describe(name: str = "run-1", pool: dict | None = None, keep_alive: int | None = 1800, count: int = 2,
              ended: datetime | None = ENDED, **more) -> dict:
    resources = {"InstanceType": "ml.p4d.24xlarge", "InstanceCount": count, "VolumeSizeInGB": 30}
    if keep_alive is not None:
        resources["KeepAlivePeriodInSeconds"] = keep_alive
    desc = {"TrainingJobName": name, "TrainingJobArn": f"arn:aws:sagemaker:{REGION}:111122223333:training-job/{name}",
            "ModelArtifacts": {"S3ModelArtifacts": ""}, "TrainingJobStatus": "Completed",
            "SecondaryStatus": "Completed", "AlgorithmSpecification": {"TrainingInputMode": "File"},
            "ResourceConfig": resources, "StoppingCondition": {"MaxRuntimeInSeconds": 86400},
            "CreationTime": ENDED - timedelta(hours=1), "RoleArn": ROLE, **more}
    if ended is not None:
        desc["TrainingEndTime"] = ended
    if pool is not None:
        desc["WarmPoolStatus"] = pool
    return desc


def test_an_available_pool_has_its_keep_alive_less_the_time_since_the_job_ended() -> None:
    pool = WarmPool.of(_describe(pool={"Status": "Available"}))
    assert pool.seconds_left(ENDED + timedelta(seconds=600)) == 1200
    assert pool.seconds_left(ENDED + timedelta(seconds=1800 + 60)) == 0  # AWS's clock ends it, never negative
    shown = pool.to_dict(ENDED + timedelta(seconds=600))
    assert shown == {"Status": "Available", "KeepAlivePeriodInSeconds": 1800, "SecondsLeft": 1200}
    assert status_line(shown) == "warm pool: Available, 0:20:00 left of 1800 s keep-alive"


def test_a_reused_pool_names_its_job_and_its_billable_time() -> None:
    pool = WarmPool.of(_describe(pool={"Status": "Reused", "ResourceRetainedBillableTimeInSeconds": 300,
                                       "ReusedByJob": "run-2"}, count=4))
    shown = pool.to_dict(ENDED + timedelta(seconds=600))
    assert shown["SecondsLeft"] is None and shown["ReusedByJob"] == "run-2"
    assert shown["BillableInstanceSeconds"] == 1200  # 300 s x 4 instances, as AWS documents the bill
    assert status_line(shown) == ("warm pool: Reused, reused by run-2, kept 300 s billable "
                                  "(1200 instance-seconds)")
    assert WarmPool.of(_describe()) is None  # control: a job without a pool


# --- UpdateTrainingJob through the Stubber -------------------------------------------------------

@pytest.fixture
def stubbed(monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    printed: list[str] = []
    backend = SageMakerBackend(boto3.Session(region_name=REGION), printer=printed.append)
    stubber = Stubber(backend.client("sagemaker"))
    with stubber:
        yield backend, stubber, printed
    stubber.assert_no_pending_responses()


def _update_sent(stubber, name: str, seconds: int) -> None:
    stubber.add_response("update_training_job",
                         {"TrainingJobArn": f"arn:aws:sagemaker:{REGION}:111122223333:training-job/{name}"},
                         {"TrainingJobName": name, "ResourceConfig": {"KeepAlivePeriodInSeconds": seconds}})


@pytest.mark.parametrize("seconds", [600, 0, KEEP_ALIVE_MAX])
def test_update_and_terminate_send_the_keep_alive_of_an_available_pool(stubbed, seconds) -> None:
    backend, stubber, _ = stubbed
    stubber.add_response("describe_training_job", _describe(pool={"Status": "Available"}),
                         {"TrainingJobName": "run-1"})
    _update_sent(stubber, "run-1", seconds)
    assert backend.update_keep_alive("run-1", seconds).keep_alive == 1800


@pytest.mark.parametrize("pool,words", [
    ({"Status": "Terminated", "ResourceRetainedBillableTimeInSeconds": 10}, ["Terminated", "new pool"]),
    ({"Status": "Reused", "ReusedByJob": "run-2"}, ["Reused", "run-2"]),
    ({"Status": "InUse"}, ["InUse", "ended"]),
    (None, ["has no warm pool", "keep_alive_period_in_seconds"]),
])
def test_a_pool_that_is_not_available_is_refused_before_any_update(stubbed, pool, words) -> None:
    backend, stubber, _ = stubbed
    stubber.add_response("describe_training_job", _describe(pool=pool), {"TrainingJobName": "run-1"})
    with pytest.raises(WarmPoolError) as exc:
        backend.update_keep_alive("run-1", 600)  # no update_training_job queued: sending one would fail
    assert "run-1" in str(exc.value) and all(w in str(exc.value) for w in words)


@pytest.mark.parametrize("seconds", [-1, KEEP_ALIVE_MAX + 1])
def test_a_keep_alive_out_of_range_is_refused_before_any_call(stubbed, seconds) -> None:
    backend, _, _ = stubbed
    with pytest.raises(WarmPoolError, match=f"{seconds}.*0 to {KEEP_ALIVE_MAX}"):
        backend.update_keep_alive("run-1", seconds)


def test_describe_adds_the_pool_with_its_time_left(stubbed) -> None:
    backend, stubber, _ = stubbed
    ended = datetime.now(timezone.utc) - timedelta(seconds=600)
    stubber.add_response("describe_training_job", _describe(pool={"Status": "Available"}, ended=ended),
                         {"TrainingJobName": "run-1"})
    pool = backend.describe("run-1")["WarmPool"]
    assert pool["Status"] == "Available" and 1800 - 600 - 60 <= pool["SecondsLeft"] <= 1800 - 600


def _listed(*names: str) -> dict:
    return {"TrainingJobSummaries": [
        {"TrainingJobName": n, "TrainingJobArn": f"arn:aws:sagemaker:{REGION}:1:training-job/{n}",
         "CreationTime": ENDED, "TrainingJobStatus": "Completed", "WarmPoolStatus": {"Status": "Available"}}
        for n in names]}


def test_submit_names_the_available_pool_a_request_reuses(stubbed) -> None:
    backend, stubber, printed = stubbed
    query = {"WarmPoolStatusEquals": "Available", "SortBy": "CreationTime", "SortOrder": "Descending",
             "MaxResults": 20}
    stubber.add_response("list_training_jobs", _listed("four-hosts", "two-hosts"), query)
    stubber.add_response("describe_training_job", _describe("four-hosts", {"Status": "Available"}, count=4),
                         {"TrainingJobName": "four-hosts"})
    stubber.add_response("describe_training_job", _describe("two-hosts", {"Status": "Available"}),
                         {"TrainingJobName": "two-hosts"})
    request = _describe("new-run", keep_alive=600)  # CreateTrainingJob's fields have the same names
    assert reusable(backend.client("sagemaker"), request) == ("two-hosts", [("four-hosts", [("instance_count", 4, 2)])])
    stubber.add_response("list_training_jobs", _listed("four-hosts"), query)
    stubber.add_response("describe_training_job", _describe("four-hosts", {"Status": "Available"}, count=4),
                         {"TrainingJobName": "four-hosts"})
    backend._note_warm_pool(request)
    assert printed == ["note: the Available warm pool of four-hosts does not match: instance_count 4 there, 2 here"]


# --- the SDK faces: latest_training_job.update / describe -----------------------------------------

def test_the_sdk_training_job_updates_its_pool_as_both_sdks_spell_it(stubbed) -> None:
    from types import SimpleNamespace

    from launcher.sdk.estimator import TrainingJob

    backend, stubber, _ = stubbed
    job = TrainingJob("run-1", backend)
    # SDK v2's Session.update_training_job takes the dict; SDK v3's TrainingJob.update a ResourceConfigForUpdate
    for resource_config, seconds in (({"KeepAlivePeriodInSeconds": 300}, 300),
                                     (SimpleNamespace(keep_alive_period_in_seconds=0), 0)):
        stubber.add_response("describe_training_job", _describe(pool={"Status": "Available"}),
                             {"TrainingJobName": "run-1"})
        _update_sent(stubber, "run-1", seconds)
        assert job.update(resource_config=resource_config) is job
    with pytest.raises(WarmPoolError, match="only KeepAlivePeriodInSeconds"):  # nothing sent
        job.update(resource_config={"KeepAlivePeriodInSeconds": 300, "InstanceCount": 4})
    stubber.add_response("describe_training_job", _describe(pool={"Status": "Available"}), {"TrainingJobName": "run-1"})
    assert job.describe()["WarmPool"]["Status"] == "Available"


def test_the_sdk_training_job_of_a_local_job_has_no_pool_to_update() -> None:
    from types import SimpleNamespace

    from launcher.sdk.estimator import TrainingJob

    local = TrainingJob("run-1", SimpleNamespace(name="local"))  # no call reaches a backend
    with pytest.raises(WarmPoolError, match="runs on local: warm pools are SageMaker's"):
        local.update(resource_config={"KeepAlivePeriodInSeconds": 300})
