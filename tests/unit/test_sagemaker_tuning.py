"""SageMaker tuning jobs from the tuner (launcher.backends.sagemaker_tuning): created and listed
against moto; stopped, listed trials and the best trial through botocore's Stubber (moto implements
neither StopHyperParameterTuningJob nor ListTrainingJobsForHyperParameterTuningJob)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import boto3
import pytest
from botocore.stub import Stubber

from launcher import ContinuousParameter, HyperparameterTuner, IntegerParameter, PyTorch
from launcher.backends.base import BackendError

ROLE = "arn:aws:iam::111122223333:role/SageMakerRole"
METRICS = [{"Name": "val:acc", "Regex": r"val_acc=([0-9.]+)"}]


@pytest.fixture
def aws(monkeypatch):
    from moto import mock_aws

    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="tune-bucket")
        yield boto3.Session(region_name="us-east-1")


def make_tuner(tmp_path, session, **changes) -> HyperparameterTuner:
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "cifar.py").write_text("print('val_acc=0.5')\n")
    est = PyTorch(entry_point="cifar.py", source_dir=str(code), role=ROLE, instance_type="ml.g5.xlarge",
                  framework_version="2.5.1", py_version="py311", hyperparameters={"epochs": 2},
                  output_path="s3://tune-bucket/out/", session=session)
    args = {"objective_metric_name": "val:acc", "metric_definitions": METRICS, "max_jobs": 4, "max_parallel_jobs": 2,
            "hyperparameter_ranges": {"lr": ContinuousParameter(1e-4, 1e-1, "Logarithmic"),
                                      "layers": IntegerParameter(2, 6)}}
    args.update(changes)
    return HyperparameterTuner(est, **args)


def test_fit_creates_the_tuning_job_with_its_code_and_lists_it(tmp_path, aws):
    tuner = make_tuner(tmp_path, aws)
    tuner.fit("s3://tune-bucket/train", job_name="cifar-sweep-1", wait=False)
    desc = tuner.describe()
    assert desc["HyperParameterTuningJobName"] == "cifar-sweep-1"
    assert desc["HyperParameterTuningJobConfig"]["ResourceLimits"]["MaxNumberOfTrainingJobs"] == 4
    definition = desc["TrainingJobDefinition"]
    assert definition["StaticHyperParameters"]["sagemaker_submit_directory"] == (
        '"s3://tune-bucket/cifar-sweep-1/source/sourcedir.tar.gz"')
    keys = [o["Key"] for o in aws.client("s3").list_objects_v2(Bucket="tune-bucket")["Contents"]]
    assert keys == ["cifar-sweep-1/source/sourcedir.tar.gz"]
    listed = tuner._sagemaker().list()
    assert [j["HyperParameterTuningJobName"] for j in listed] == ["cifar-sweep-1"]
    with pytest.raises(BackendError, match="already used by a tuning job"):  # the name is taken: nothing sent
        make_tuner(tmp_path, aws).fit(job_name="cifar-sweep-1", wait=False)


def test_a_refused_sweep_creates_and_uploads_nothing(tmp_path, aws):
    from launcher.config import ConfigError

    with pytest.raises(ConfigError, match="objective_metric_name|tuning.objective.metric"):
        make_tuner(tmp_path, aws, objective_metric_name="val:accuracy").fit(wait=False)
    assert "Contents" not in aws.client("s3").list_objects_v2(Bucket="tune-bucket")
    assert make_tuner(tmp_path, aws)._sagemaker().list() == []  # control: the same tuner, its objective right


def test_a_refused_create_tuning_job_takes_the_uploaded_code_back(tmp_path, aws, monkeypatch):
    # the code upload is the training job's (SageMakerBackend.code_uploaded), taken back the same way
    from botocore.exceptions import ClientError

    tuner = make_tuner(tmp_path, aws)
    sagemaker = tuner._sagemaker()
    tuner._sagemaker = lambda job=None: sagemaker

    def refuse(**request):
        assert [o["Key"] for o in aws.client("s3").list_objects_v2(Bucket="tune-bucket")["Contents"]] == [
            "refused-sweep/source/sourcedir.tar.gz"]  # uploaded first, as the SDK does
        raise ClientError({"Error": {"Code": "ResourceLimitExceeded", "Message": "tuning jobs"}},
                          "CreateHyperParameterTuningJob")

    monkeypatch.setattr(sagemaker.client, "create_hyper_parameter_tuning_job", refuse)
    with pytest.raises(ClientError, match="ResourceLimitExceeded"):
        tuner.fit("s3://tune-bucket/train", job_name="refused-sweep", wait=False)
    assert "Contents" not in aws.client("s3").list_objects_v2(Bucket="tune-bucket")


def _stubbed(tuner: HyperparameterTuner, name: str):
    backend = tuner._sagemaker()
    client = backend.client
    tuner._sagemaker = lambda job=None: backend  # one client, so the Stubber sees every call
    tuner.latest_tuning_job = name
    return Stubber(client)


def _describe(name: str, **extra) -> dict:
    return {"HyperParameterTuningJobName": name, "HyperParameterTuningJobArn": f"arn:aws:sagemaker:us-east-1:1:"
            f"hyper-parameter-tuning-job/{name}", "HyperParameterTuningJobConfig": {"Strategy": "Bayesian",
            "ResourceLimits": {"MaxNumberOfTrainingJobs": 4, "MaxParallelTrainingJobs": 2}},
            "HyperParameterTuningJobStatus": "InProgress", "CreationTime": datetime(2026, 1, 1),
            "TrainingJobStatusCounters": {}, "ObjectiveStatusCounters": {}, **extra}


def test_stop_best_training_job_and_analytics(tmp_path, aws):
    tuner = make_tuner(tmp_path, aws)
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    best = {"TrainingJobName": "sweep-2-002-b", "TrainingJobArn": "arn:aws:sagemaker:us-east-1:1:training-job/b",
            "CreationTime": start, "TrainingJobStatus": "Completed", "TunedHyperParameters": {"lr": "0.01"},
            "FinalHyperParameterTuningJobObjectiveMetric": {"MetricName": "val:acc", "Value": 0.9}}
    other = dict(best, TrainingJobName="sweep-2-001-a", TunedHyperParameters={"lr": "0.0003", "layers": "3"},
                 TrainingStartTime=start, TrainingEndTime=start + timedelta(seconds=90),
                 FinalHyperParameterTuningJobObjectiveMetric={"MetricName": "val:acc", "Value": 0.7})
    with _stubbed(tuner, "sweep-2") as stub:
        stub.add_response("describe_hyper_parameter_tuning_job", _describe("sweep-2"))
        stub.add_response("stop_hyper_parameter_tuning_job", {}, {"HyperParameterTuningJobName": "sweep-2"})
        tuner.stop_tuning_job()
        stub.add_response("describe_hyper_parameter_tuning_job", _describe("sweep-2"))  # no best trial yet
        with pytest.raises(BackendError, match="has no best training job yet"):
            tuner.best_training_job()
        stub.add_response("describe_hyper_parameter_tuning_job", _describe("sweep-2", BestTrainingJob=best))
        assert tuner.best_training_job() == "sweep-2-002-b"
        stub.add_response("list_training_jobs_for_hyper_parameter_tuning_job",
                          {"TrainingJobSummaries": [other, best]})
        table = tuner.analytics().dataframe()
        stub.assert_no_pending_responses()
    rows = table.to_dict("records") if hasattr(table, "to_dict") else table
    assert rows[0]["TrainingJobName"] == "sweep-2-001-a" and rows[0]["lr"] == 0.0003 and rows[0]["layers"] == 3.0
    assert rows[0]["TrainingElapsedTimeSeconds"] == 90.0 and rows[0]["FinalObjectiveValue"] == 0.7
    assert rows[1]["FinalObjectiveValue"] == 0.9



class _OneClient:
    """A boto3-Session stand-in whose SageMaker client is the one the Stubber holds."""

    region_name = "us-east-1"

    def __init__(self, client):
        self._client = client

    def client(self, name, region_name=None):
        assert name == "sagemaker", name
        return self._client


def test_attach_rebuilds_the_tuner_from_the_tuning_job_and_its_best_trial(aws):
    client = aws.client("sagemaker")
    name = "cifar-sweep-9"
    config = {"Strategy": "Random", "ResourceLimits": {"MaxNumberOfTrainingJobs": 5, "MaxParallelTrainingJobs": 2},
              "HyperParameterTuningJobObjective": {"Type": "Minimize", "MetricName": "val:loss"},
              "TrainingJobEarlyStoppingType": "Auto",
              "ParameterRanges": {"ContinuousParameterRanges": [{"Name": "lr", "MinValue": "0.0001",
                                                                  "MaxValue": "0.1", "ScalingType": "Logarithmic"}],
                                  "IntegerParameterRanges": [], "CategoricalParameterRanges": [
                                      {"Name": "arch", "Values": ['"resnet18"', '"resnet50"']}]}}
    best = {"TrainingJobName": f"{name}-003-c", "TrainingJobArn": "arn:aws:sagemaker:us-east-1:1:training-job/c",
            "CreationTime": datetime(2026, 1, 1), "TrainingJobStatus": "Completed", "TunedHyperParameters": {}}
    trial = {"TrainingJobName": best["TrainingJobName"], "TrainingJobArn": best["TrainingJobArn"],
             "TrainingJobStatus": "Completed", "CreationTime": datetime(2026, 1, 1),
             "AlgorithmSpecification": {"TrainingInputMode": "File", "TrainingImage":
                                        "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.5.1-gpu-py311",
                                        "MetricDefinitions": [{"Name": "val:loss", "Regex": "loss=([0-9.]+)"}]},
             "HyperParameters": {"sagemaker_program": '"cifar.py"', "epochs": "2", "lr": '"0.01"',
                                 "sagemaker_submit_directory": '"s3://tune-bucket/cifar-sweep-9/source/sourcedir.tar.gz"'},
             "RoleArn": ROLE, "OutputDataConfig": {"S3OutputPath": "s3://tune-bucket/out/"},
             "ResourceConfig": {"InstanceType": "ml.g5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 30},
             "StoppingCondition": {"MaxRuntimeInSeconds": 86400}, "ModelArtifacts": {"S3ModelArtifacts": "s3://m"},
             "SecondaryStatus": "Completed"}
    with Stubber(client) as stub:
        stub.add_response("describe_hyper_parameter_tuning_job", _describe(name, BestTrainingJob=best,
                                                                          HyperParameterTuningJobConfig=config))
        stub.add_response("describe_training_job", trial)
        tuner = HyperparameterTuner.attach(name, session=_OneClient(client))
        stub.assert_no_pending_responses()
    assert tuner.latest_tuning_job == name
    assert (tuner.tuning.strategy, tuner.tuning.early_stopping, tuner.max_jobs) == ("Random", "Auto", 5)
    assert tuner.tuning.objective.metric == "val:loss" and tuner.tuning.objective.type == "Minimize"
    assert tuner.tuning.ranges["arch"].values == ["resnet18", "resnet50"]
    assert tuner.tuning.ranges["lr"].scaling_type == "Logarithmic" and tuner.tuning.ranges["lr"].max_value == 0.1
    assert tuner.estimator.config.instance_type == "ml.g5.xlarge"
    assert tuner.hyperparameter_ranges() == config["ParameterRanges"]  # what attach read, a new sweep sends


def test_status_and_stop_of_a_sagemaker_tuning_job_from_the_cli(aws, monkeypatch):
    import boto3 as boto3_module
    from click.testing import CliRunner

    from launcher.cli.app import main

    client = aws.client("sagemaker")
    monkeypatch.setattr(boto3_module, "Session", lambda **_: _OneClient(client))
    trial = {"TrainingJobName": "sweep-3-001-a", "TrainingJobArn": "arn:aws:sagemaker:us-east-1:1:training-job/a",
             "CreationTime": datetime(2026, 1, 1), "TrainingJobStatus": "Completed",
             "TunedHyperParameters": {"lr": "0.01"},
             "FinalHyperParameterTuningJobObjectiveMetric": {"MetricName": "val:acc", "Value": 0.875}}
    config = {"Strategy": "Random", "ResourceLimits": {"MaxNumberOfTrainingJobs": 2, "MaxParallelTrainingJobs": 1},
              "HyperParameterTuningJobObjective": {"Type": "Maximize", "MetricName": "val:acc"}}
    counters = {"Completed": 1, "InProgress": 0, "RetryableError": 0, "NonRetryableError": 0, "Stopped": 0}
    described = _describe("sweep-3", BestTrainingJob=trial, HyperParameterTuningJobConfig=config,
                          TrainingJobStatusCounters=counters)
    with Stubber(client) as stub:
        stub.add_response("describe_hyper_parameter_tuning_job", described, {"HyperParameterTuningJobName": "sweep-3"})
        stub.add_response("list_training_jobs_for_hyper_parameter_tuning_job", {"TrainingJobSummaries": [trial]},
                          {"HyperParameterTuningJobName": "sweep-3"})
        shown = CliRunner().invoke(main, ["status", "sagemaker-tuning:sweep-3"], catch_exceptions=False)
        stub.add_response("describe_hyper_parameter_tuning_job", described, {"HyperParameterTuningJobName": "sweep-3"})
        stub.add_response("stop_hyper_parameter_tuning_job", {}, {"HyperParameterTuningJobName": "sweep-3"})
        stopped = CliRunner().invoke(main, ["stop", "sagemaker-tuning:sweep-3"], catch_exceptions=False)
        stub.assert_no_pending_responses()
    assert shown.exit_code == 0, shown.output
    assert "sweep-3-001-a *" in shown.stdout and "0.875" in shown.stdout and "backend sagemaker" in shown.stdout
    assert stopped.exit_code == 0 and "stopping tuning job sweep-3" in stopped.stdout
    # control: a name that is no tuning job's is an exit-2 error before any call
    bad = CliRunner().invoke(main, ["status", "sagemaker-tuning:no_such_name!"])
    assert bad.exit_code == 2 and "sagemaker-tuning:NAME" in bad.stderr


def test_list_tuning_with_backend_sagemaker_lists_its_tuning_jobs(tmp_path, aws, home):
    from click.testing import CliRunner

    from launcher.cli.app import main

    make_tuner(tmp_path, aws).fit("s3://tune-bucket/train", job_name="cifar-sweep-4", wait=False)
    listed = CliRunner().invoke(main, ["list", "--tuning", "--backend", "sagemaker", "--json"], catch_exceptions=False)
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.stdout)["tuning_jobs"]
    assert [(r["HyperParameterTuningJobName"], r["Backend"]) for r in rows] == [("cifar-sweep-4", "sagemaker")]
    assert rows[0]["HyperParameterTuningJobConfig"]["ResourceLimits"]["MaxNumberOfTrainingJobs"] == 4
    table = CliRunner().invoke(main, ["list", "--tuning", "--backend", "sagemaker"], catch_exceptions=False)
    assert table.exit_code == 0 and "cifar-sweep-4" in table.stdout
    # control: without --backend sagemaker only this machine's sweeps are listed (none here)
    local = CliRunner().invoke(main, ["list", "--tuning", "--json"], catch_exceptions=False)
    assert json.loads(local.stdout)["tuning_jobs"] == []
