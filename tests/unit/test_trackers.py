"""Metrics trackers, the in-process half: the hyperparameters' rules (validation and the container),
what a missing package or a failing tracker does, the credentials' masking in what smlaunch prints,
and SageMaker Experiments against moto's SageMaker and SageMaker Metrics. The runs of train.py that
log to W&B (offline) and MLflow (a file store) are tests/integration/test_trackers.py."""

from __future__ import annotations

import json
import logging
import sys
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from container.trackers import open_trackers
from container.trackers.sink import Tracker, start
from launcher.cli.app import main
from launcher.config import TrainingHyperparameters
from launcher.wire.masking import is_secret_name
from launcher.wire.training.tracker_rules import tracker_issues
from tests.support.cli import ROOT

CREDENTIALS = ("WANDB_API_KEY", "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_PASSWORD")


def hp(**values) -> TrainingHyperparameters:
    return TrainingHyperparameters(**values)


def run_cli(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


# --- the hyperparameters' rules ---------------------------------------------------------------------

def test_a_trackers_setting_without_the_one_that_turns_it_on_is_an_error():
    assert [(i.path, i.problem) for i in tracker_issues(hp(wandb_entity="team", mlflow_experiment_name="e"))] == [
        ("hyperparameters.wandb_entity", "does nothing without wandb_project"),
        ("hyperparameters.mlflow_experiment_name", "does nothing without mlflow_tracking_uri")]
    assert [i.path for i in tracker_issues(hp(metrics_required=True))] == ["hyperparameters.metrics_required"]
    # control: with the switches, no issue
    assert tracker_issues(hp(wandb_project="p", wandb_entity="team", wandb_tags="a,b", metrics_required=True,
                             mlflow_tracking_uri="file:///x", mlflow_experiment_name="e")) == []


def test_validate_refuses_a_tracker_setting_that_would_do_nothing(tmp_path):
    job = ROOT / "configs" / "seed" / "p4d-cp8.yaml"
    result = run_cli("validate", job, "--set", "hyperparameters.wandb_run_name=r1")
    assert result.exit_code == 2
    assert "hyperparameters.wandb_run_name" in result.stderr and "wandb_project" in result.stderr
    assert run_cli("validate", job, "--set", "hyperparameters.wandb_project=p",
                   "--set", "hyperparameters.wandb_run_name=r1").exit_code == 0


def test_a_wandb_api_key_hyperparameter_is_refused_naming_the_variable_and_masked(tmp_path):
    """W&B's SageMaker integration read wandb_api_key from the hyperparameters; it is off in the
    runtime (it copied every secret into the run), so the key would be silently unused."""
    job = ROOT / "configs" / "seed" / "p4d-cp8.yaml"
    result = run_cli("validate", job, "--set", "hyperparameters.wandb_project=p",
                     "--set", "hyperparameters.wandb_api_key=k3y-s3cr3t-value")
    assert result.exit_code == 2, result.output
    assert "hyperparameters.wandb_api_key" in result.stderr and "WANDB_API_KEY" in result.stderr
    assert "k3y-s3cr3t-value" not in result.output
    # control: without W&B the name is a hyperparameter like another (a warning at most)
    assert run_cli("validate", job, "--set", "hyperparameters.wandb_api_key=k3y-s3cr3t-value").exit_code == 0


def test_the_container_refuses_them_before_anything_is_built():
    from container.trainer import refuse_unimplemented

    with pytest.raises(ValueError, match="metrics_required"):
        refuse_unimplemented(hp(metrics_required=True))


# --- credentials ------------------------------------------------------------------------------------

def test_the_trackers_credentials_are_masked_in_the_printed_request(monkeypatch, tmp_path):
    assert all(map(is_secret_name, CREDENTIALS))
    assert not is_secret_name("MLFLOW_TRACKING_USERNAME")  # a user name is not a secret
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    secrets = {"WANDB_API_KEY": "wandbSecret0123", "MLFLOW_TRACKING_TOKEN": "mlflowToken0123",
               "MLFLOW_TRACKING_PASSWORD": "mlflowPassw0rd"}
    sets = [f"environment.{k}={v}" for k, v in secrets.items()]
    sets += ["hyperparameters.mlflow_tracking_uri=https://me:uriPassw0rd@mlflow.example.com",
             "hyperparameters.wandb_project=p"]
    result = run_cli("submit", ROOT / "configs" / "seed" / "p4d-cp8.yaml", "--dry-run", "--job-name", "t-1",
                     *[arg for s in sets for arg in ("--set", s)])
    assert result.exit_code == 0, result.output
    request = json.loads(result.stdout)["CreateTrainingJob"]
    assert {k: request["Environment"][k] for k in secrets} == dict.fromkeys(secrets, "****")
    assert request["HyperParameters"]["mlflow_tracking_uri"] == '"https://me:****@mlflow.example.com"'
    assert not [s for s in [*secrets.values(), "uriPassw0rd"] if s in result.output]


# --- a tracker that cannot start, or fails ----------------------------------------------------------

def test_a_missing_package_is_a_warning_or_with_metrics_required_an_error(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    monkeypatch.setitem(sys.modules, "mlflow", None)
    monkeypatch.delenv("TRAINING_JOB_ARN", raising=False)
    with caplog.at_level(logging.WARNING, logger="smlaunch"):
        assert open_trackers(hp(wandb_project="p", mlflow_tracking_uri="file:///x"), 1, None, None) == []
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2
    assert "Weights & Biases could not start" in warnings[0] and "smlaunch[wandb]" in warnings[0]
    assert "MLflow could not start" in warnings[1] and "smlaunch[mlflow]" in warnings[1]
    with pytest.raises(RuntimeError, match=r"Weights & Biases could not start.*smlaunch\[wandb\].*metrics_required"):
        open_trackers(hp(wandb_project="p", metrics_required=True), 1, None, None)


class Flaky:
    """A sink whose second call fails, as a tracking server that goes away mid-run."""

    def __init__(self):
        self.logged = []

    def log(self, record):
        if len(self.logged) == 1:
            raise ConnectionError("server gone")
        self.logged.append(record)

    def close(self, outcome):
        self.logged.append(outcome)


def test_a_failure_mid_run_warns_once_and_training_goes_on(caplog):
    sink = Flaky()
    tracker = start("Tracker X", lambda: sink, required=False)
    with caplog.at_level(logging.WARNING, logger="smlaunch"):
        for step in (1, 2, 3, 4):
            tracker.log({"step": step, "loss": 1.0})
        tracker.close("finished")
    assert sink.logged == [{"step": 1, "loss": 1.0}]  # dropped after its failure: no retry stalls each step
    assert [r.getMessage() for r in caplog.records] == [
        "Tracker X: logging step 2 failed (ConnectionError: server gone): nothing more goes to Tracker X in this "
        "run; training goes on (metrics.jsonl and the [metrics] log lines still have every record)"]


def test_a_failure_mid_run_with_metrics_required_fails_the_job():
    tracker = Tracker("Tracker X", Flaky(), required=True)
    tracker.log({"step": 1, "loss": 1.0})
    with pytest.raises(RuntimeError, match="Tracker X: logging step 2 failed .*metrics_required"):
        tracker.log({"step": 2, "loss": 1.0})


# --- SageMaker Experiments (moto) -------------------------------------------------------------------

ROLE = "arn:aws:iam::123456789012:role/r"


def training_job(sm, name: str, experiment_config: dict | None) -> str:
    return sm.create_training_job(
        TrainingJobName=name, RoleArn=ROLE, AlgorithmSpecification={"TrainingImage": "i", "TrainingInputMode": "File"},
        OutputDataConfig={"S3OutputPath": "s3://b/o"}, StoppingCondition={"MaxRuntimeInSeconds": 60},
        ResourceConfig={"InstanceType": "ml.p4d.24xlarge", "InstanceCount": 1, "VolumeSizeInGB": 10},
        **({"ExperimentConfig": experiment_config} if experiment_config else {}))["TrainingJobArn"]


def test_sagemaker_experiments_gets_the_records_of_metrics_jsonl(aws, monkeypatch, tmp_path, caplog):
    pytest.importorskip("sagemaker.experiments.run", reason="the SageMaker SDK (smlaunch[sagemaker]) is not installed")
    from moto.sagemaker.models import sagemaker_backends
    from sagemaker.experiments.run import Run
    from sagemaker.session import Session

    from container.metrics import MetricsWriter

    monkeypatch.setenv("SAGEMAKER_SUPPRESS_V2_WARNING", "1")
    sm = aws.client("sagemaker")
    with Run(experiment_name="exp", run_name="run-1", sagemaker_session=Session(aws)):  # as a notebook would
        pass
    monkeypatch.setenv("TRAINING_JOB_ARN", training_job(sm, "job-1", {"ExperimentName": "exp", "RunName": "exp-run-1"}))
    writer = MetricsWriter(SimpleNamespace(is_main=True), tmp_path, trackers=open_trackers(hp(), 1, None, None))
    records = [{"step": 1, "loss": 2.5, "grad_norm": 0.75, "lr": 0.001, "tokens_per_s": 1000.0},
               {"step": 2, "loss": 2.25, "grad_norm": 0.5, "lr": 0.002, "tokens_per_s": 1100.5, "mfu": 0.4},
               {"step": 2, "val_loss": 2.75}]
    for record in records:
        writer.write(record)
    writer.close()

    logged = sagemaker_backends[aws.client("sts").get_caller_identity()["Account"]][aws.region_name]
    metrics = logged.trial_components["exp-run-1"].metrics
    written = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    expected = {}
    for record in written:
        for key, value in record.items():
            if key != "step":
                expected.setdefault("validation/loss" if key == "val_loss" else f"train/{key}", {})[
                    record["step"]] = value
    assert {name: {step: v["Value"] for step, v in m["Values"].items()} for name, m in metrics.items()} == expected
    assert logged.trial_components["exp-run-1"].status["PrimaryStatus"] == "Completed"

    # a rank 0 that fails marks the run Failed (the SDK's context manager, given the error)
    monkeypatch.setenv("TRAINING_JOB_ARN", training_job(sm, "job-3", {"ExperimentName": "exp", "RunName": "exp-run-1"}))
    failing = MetricsWriter(SimpleNamespace(is_main=True), tmp_path / "failing",
                            trackers=open_trackers(hp(), 1, None, None))
    failing.write(records[0])
    failing.fail()
    assert logged.trial_components["exp-run-1"].status["PrimaryStatus"] == "Failed"

    # control: a job without an experiment config has no run; that is said, not warned
    caplog.clear()
    monkeypatch.setenv("TRAINING_JOB_ARN", training_job(sm, "job-2", None))
    with caplog.at_level(logging.INFO, logger="smlaunch"):
        assert open_trackers(hp(), 1, None, None) == []
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "metrics: this job has no SageMaker Experiments run (no experiment_config), so nothing goes there")]
