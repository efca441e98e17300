"""smlaunch's `HyperparameterTuner` against the official SageMaker SDK v2's (2.257.x): the same
estimator and tuner arguments, one moto account, and the CreateHyperParameterTuningJob requests
compared field by field (the code upload's S3 parameters too).

Where the requests differ, the test names the difference and why smlaunch's is right
(docs/tuning.md, "On SageMaker: what is sent"); no difference passes unnamed.
"""

from __future__ import annotations

import copy
import importlib.util
import json
from datetime import datetime, timedelta, timezone

import boto3
import pytest

# found here, imported by the worker that runs these tests, not at every worker's collection (~2.5 CPU s)
for _package in ("sagemaker", "moto"):
    if importlib.util.find_spec(_package) is None:
        pytest.skip(f"{_package} (the sagemaker and test extras) is not installed", allow_module_level=True)

from launcher.backends.sagemaker_tuning import trial_rows  # noqa: E402
from tests.integration.test_sdk_parity import BUCKET, seed_run, user_job  # noqa: E402
from tests.support.sdk_reference import aws, differences, ours_tune, sdk_tune  # noqa: E402

METRICS = [{"Name": "val:acc", "Regex": r"val_acc=([0-9.]+)"}]


def sdk_classes() -> dict:
    from sagemaker import tuner
    from sagemaker.parameter import CategoricalParameter, ContinuousParameter, IntegerParameter

    return {"Continuous": ContinuousParameter, "Integer": IntegerParameter, "Categorical": CategoricalParameter,
            "WarmStartConfig": tuner.WarmStartConfig, "WarmStartTypes": tuner.WarmStartTypes,
            "StrategyConfig": tuner.StrategyConfig, "Hyperband": tuner.HyperbandStrategyConfig,
            "Completion": tuner.TuningJobCompletionCriteriaConfig, "InstanceConfig": tuner.InstanceConfig}


def our_classes() -> dict:
    import launcher
    from launcher.sdk import tuner_objects

    return {"Continuous": launcher.ContinuousParameter, "Integer": launcher.IntegerParameter,
            "Categorical": launcher.CategoricalParameter, "WarmStartConfig": launcher.WarmStartConfig,
            "WarmStartTypes": launcher.WarmStartTypes, "StrategyConfig": launcher.StrategyConfig,
            "Hyperband": launcher.HyperbandStrategyConfig, "Completion": launcher.TuningJobCompletionCriteriaConfig,
            "InstanceConfig": tuner_objects.InstanceConfig}


def tuner(o: dict, ranges: dict | None = None, **changes) -> dict:
    out = {"objective_metric_name": "val:acc", "metric_definitions": METRICS, "max_jobs": 6, "max_parallel_jobs": 2,
           "hyperparameter_ranges": ranges or {"lr": o["Continuous"](1e-5, 1e-2, "Logarithmic")}}
    out.update(changes)
    return out


# name -> (estimator arguments, tuner arguments, fit inputs); `o` holds one SDK's classes.
CASES = {
    "continuous-scalings": lambda o, tmp: (user_job(tmp), tuner(o, {
        "lr": o["Continuous"](1e-5, 1e-2, "Logarithmic"), "momentum": o["Continuous"](0.8, 0.99, "ReverseLogarithmic"),
        "weight_decay": o["Continuous"](0.0, 0.1, "Linear")}), f"{BUCKET}/cifar"),
    "integer-and-categorical": lambda o, tmp: (user_job(tmp), tuner(o, {
        "batch_size": o["Integer"](16, 256, "Logarithmic"), "layers": o["Integer"](2, 8),
        "arch": o["Categorical"](["resnet18", "resnet50"]), "width": o["Categorical"]([1, 2.5, True])}), None),
    "static-and-tuned": lambda o, tmp: (user_job(tmp), tuner(o, {
        "momentum": o["Continuous"](0.5, 0.99), "optimizer": o["Categorical"](["sgd", "adam"])}), None),
    "torchrun": lambda o, tmp: (user_job(tmp, instance_type="ml.g5.12xlarge", instance_count=2,
                                         distribution={"torch_distributed": {"enabled": True}}), tuner(o), None),
    "smdistributed-dataparallel": lambda o, tmp: (
        user_job(tmp, instance_type="ml.p4d.24xlarge", instance_count=2, framework_version="2.2.0",
                 py_version="py310", distribution={"smdistributed": {"dataparallel": {"enabled": True}}}),
        tuner(o), None),
    "spot-checkpoints": lambda o, tmp: (
        user_job(tmp, use_spot_instances=True, max_wait=7200, max_run=3600, checkpoint_s3_uri=f"{BUCKET}/ckpt",
                 checkpoint_local_path="/opt/ml/checkpoints"), tuner(o), None),
    "vpc-isolation-encryption": lambda o, tmp: (
        user_job(tmp, subnets=["subnet-1", "subnet-2"], security_group_ids=["sg-1"], enable_network_isolation=True,
                 encrypt_inter_container_traffic=True), tuner(o), {"train": f"{BUCKET}/train"}),
    "kms-keys": lambda o, tmp: (
        user_job(tmp, volume_kms_key="arn:aws:kms:us-east-1:111122223333:key/v",
                 output_kms_key="arn:aws:kms:us-east-1:111122223333:key/o"), tuner(o), None),
    "environment-retries-tags": lambda o, tmp: (
        user_job(tmp, environment={"NCCL_DEBUG": "INFO"}, max_retry_attempts=2, volume_size=100,
                 tags=[{"Key": "team", "Value": "nlp"}], input_mode="FastFile"),
        tuner(o, tags=[{"Key": "sweep", "Value": "lr"}], base_tuning_job_name="cifar-lr"), {"train": f"{BUCKET}/t"}),
    "warm-start": lambda o, tmp: (user_job(tmp), tuner(o, warm_start_config=o["WarmStartConfig"](
        o["WarmStartTypes"].IDENTICAL_DATA_AND_ALGORITHM, parents={"parent-sweep-1"})), None),
    "early-stopping-random": lambda o, tmp: (user_job(tmp), tuner(
        o, strategy="Random", early_stopping_type="Auto", random_seed=7, max_runtime_in_seconds=36000,
        objective_type="Minimize"), None),
    "hyperband": lambda o, tmp: (user_job(tmp), tuner(o, strategy="Hyperband", strategy_config=o["StrategyConfig"](
        o["Hyperband"](max_resource=30, min_resource=2))), None),
    "completion-criteria": lambda o, tmp: (user_job(tmp), tuner(o, completion_criteria_config=o["Completion"](
        max_number_of_training_jobs_not_improving=5, complete_on_convergence=True,
        target_objective_metric_value=0.95)), None),
    "grid": lambda o, tmp: (user_job(tmp), tuner(o, {"arch": o["Categorical"](["resnet18", "resnet34", "resnet50"]),
                                                      "optimizer": o["Categorical"](["sgd", "adam"])},
                                                 strategy="Grid", max_jobs=None), None),
    "override-resource-config": lambda o, tmp: (
        user_job(tmp, volume_kms_key="arn:aws:kms:us-east-1:111122223333:key/v"),
        tuner(o, instance_configs=[o["InstanceConfig"](1, "ml.g5.2xlarge", 50),
                                   o["InstanceConfig"](2, "ml.g5.xlarge")]),
        None),
    "smlaunch-runtime-seed": lambda o, tmp: (  # its warm pool is refused in a sweep (test below)
        {k: v for k, v in seed_run("p4d-no-cp")[0].items() if k != "keep_alive_period_in_seconds"},
        tuner(o, {"lr": o["Continuous"](1e-5, 1e-3, "Logarithmic")}, objective_metric_name="train:loss",
              objective_type="Minimize", metric_definitions=None), seed_run("p4d-no-cp")[1]),
}

# Differences, each with its reason.
EXPECTED = {
    # The SDK sends the tuner's metric_definitions only; without them its tuning job has no way to
    # read "train:loss" and SageMaker refuses it. smlaunch's trials are the job: its runtime's metric
    # definitions (launcher.wire.metric_lines), as for a training job.
    "smlaunch-runtime-seed": ["TrainingJobDefinition.AlgorithmSpecification.MetricDefinitions: extra in ours"],
    # Grid without max_jobs: the SDK sends MaxNumberOfTrainingJobs None, which botocore refuses
    # (ParamValidationError, checked below), so the SDK cannot start such a sweep; smlaunch leaves
    # the field out and SageMaker runs the whole grid.
    "grid": ["HyperParameterTuningJobConfig.ResourceLimits.MaxNumberOfTrainingJobs: missing in ours"],
}


def _botocore_errors(request: dict) -> str:
    import botocore.session
    from botocore.validate import ParamValidator

    model = botocore.session.get_session().get_service_model("sagemaker")
    shape = model.operation_model("CreateHyperParameterTuningJob").input_shape
    return ParamValidator().validate(request, shape).generate_report()


def _comparable(request: dict) -> dict:
    """Static hyperparameters as the container reads them (json.loads)."""
    out = copy.deepcopy(request)
    definition = out.get("TrainingJobDefinition", {})
    definition["StaticHyperParameters"] = {k: json.loads(v) for k, v in
                                           definition.get("StaticHyperParameters", {}).items()}
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_tuning_request_matches_the_sdk(name, tmp_path, monkeypatch):
    with aws(monkeypatch):
        s3 = boto3.client("s3", region_name="us-east-1")
        for bucket in ("parity-bucket", "sagemaker-us-east-1-123456789012", "sagemaker-us-east-1-111122223333"):
            s3.create_bucket(Bucket=bucket)
        args, sdk_tuner, inputs = CASES[name](sdk_classes(), tmp_path)
        _, our_tuner, _ = CASES[name](our_classes(), tmp_path)
        args = {k: v for k, v in args.items() if v is not None}
        theirs = sdk_tune(copy.deepcopy(args), sdk_tuner, inputs)
        ours = ours_tune(args, our_tuner, inputs)
    assert theirs.request and ours.request, "a tuner sent no request"
    diffs = [d.split(" (")[0].split(":")[0] + ":" + d.split(":", 1)[1].split("(")[0].rstrip()
             for d in differences(_comparable(ours.request), _comparable(theirs.request))]
    assert diffs == EXPECTED.get(name, []), "\n".join(diffs)
    assert ours.upload == theirs.upload
    assert _botocore_errors(ours.request) == ""
    if name == "grid":
        assert "MaxNumberOfTrainingJobs, value: None" in _botocore_errors(theirs.request)


def test_a_setting_the_trials_cannot_have_is_refused_where_the_sdk_drops_it(tmp_path, monkeypatch):
    """A warm pool (keep_alive_period_in_seconds) has no place in a tuning job's trials: the SDK's
    request silently goes without it; smlaunch refuses the sweep, naming the setting."""
    from launcher.wire.training.issues import ConfigError

    with aws(monkeypatch):
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="parity-bucket")
        args = user_job(tmp_path, keep_alive_period_in_seconds=600)
        theirs = sdk_tune(copy.deepcopy(args), tuner(sdk_classes()))
        with pytest.raises(ConfigError, match="keep_alive_period_in_seconds = 600: has no place"):
            ours_tune(args, tuner(our_classes()))
        control = ours_tune(user_job(tmp_path), tuner(our_classes()))  # the same sweep without it goes out
    assert "KeepAlive" not in json.dumps(theirs.request)
    resources = control.request["TrainingJobDefinition"]["HyperParameterTuningResourceConfig"]
    assert resources["InstanceType"] == "ml.g5.xlarge"


def test_trial_rows_are_the_sdks_analytics_dataframe():
    """The table `analytics().dataframe()` gives: the SDK's columns and values, from the same trials."""
    pytest.importorskip("pandas")
    from sagemaker.analytics import HyperparameterTuningJobAnalytics

    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    summaries = [{"TrainingJobName": "a", "TrainingJobStatus": "Completed", "TunedHyperParameters": {
        "lr": "0.01", "arch": '"resnet18"'}, "TrainingStartTime": start, "TrainingEndTime": start + timedelta(hours=1),
        "FinalHyperParameterTuningJobObjectiveMetric": {"MetricName": "m", "Value": 0.5}},
        {"TrainingJobName": "b", "TrainingJobStatus": "Failed", "TunedHyperParameters": {"lr": "0.1", "arch": '"x"'},
         "TrainingJobDefinitionName": "d"}]
    sdk = HyperparameterTuningJobAnalytics.__new__(HyperparameterTuningJobAnalytics)
    sdk._training_job_summaries = summaries
    sdk.training_job_summaries = lambda force_refresh=False: summaries
    import pandas

    # analytics().dataframe() is pandas.DataFrame(trial_rows(...)) where pandas is installed
    pandas.testing.assert_frame_equal(pandas.DataFrame(trial_rows(summaries)), sdk._fetch_dataframe(),
                                      check_like=True)
