"""SageMaker tuning jobs from the tuner (launcher.backends.sagemaker_tuning): created and listed
against moto; stopped, listed trials and the best trial through botocore's Stubber (moto implements
neither StopHyperParameterTuningJob nor ListTrainingJobsForHyperParameterTuningJob)."""

from __future__ import annotations

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

