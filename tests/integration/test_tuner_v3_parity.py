"""smlaunch's SDK v3 `HyperparameterTuner` (launcher.sdk.tuner_v3) against the official SDK v3's
(`sagemaker.train.tuner`, .venv-sdk3): the same ModelTrainer and tuner, one moto server, and the
CreateHyperParameterTuningJob requests compared field by field. All sweeps of the SDK run in one
subprocess (tests/support/sdk3_reference.py), as test_model_trainer_parity does.

The sweep's own settings (HyperParameterTuningJobConfig) must agree. The trials' definition
differs by design, and each difference is asserted with its reason (docs/tuning.md): smlaunch sends
the SDK v2 contract its ModelTrainer sends for a training job; the SDK v3 rebuilds the definition
from the ModelTrainer and drops network isolation, traffic encryption and the volume's KMS key.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import boto3
import pytest

from launcher.sdk import model_trainer
from launcher.sdk.model_trainer import ModelTrainer
from launcher.sdk.tuner_v3 import HyperparameterTuner
from tests.integration.test_model_trainer_parity import (  # noqa: F401 (fixtures)
    BUCKET,
    IMAGE,
    ROOT,
    SDK3_PYTHON,
    code,
    endpoint,
)
from tests.support.sdk3_reference import REGION, ROLE, SHAPES, Sent, build

METRICS = [{"Name": "val:acc", "Regex": r"val_acc=([0-9.]+)"}]
RANGES = {"lr": {"kind": "continuous", "min_value": 1e-5, "max_value": 1e-2, "scaling_type": "Logarithmic"},
          "batch_size": {"kind": "integer", "min_value": 16, "max_value": 128}}


def sweeps(code_dir: str) -> dict[str, dict]:
    """name -> {"trainer": ModelTrainer arguments, "tuner": the sweep, "job_name"} (JSON)."""
    common = {"training_image": IMAGE, "role": ROLE, "hyperparameters": {"epochs": 3, "arch": "resnet18"},
              "source_code": {"source_dir": code_dir, "entry_script": "train.py"},
              "output_data_config": {"s3_output_path": f"{BUCKET}/output"}}
    tuner = {"objective_metric_name": "val:acc", "metric_definitions": METRICS, "ranges": RANGES,
             "max_jobs": 4, "max_parallel_jobs": 2}
    return {
        "torchrun-spot-checkpoints": {"job_name": "v3-sweep-1", "tuner": tuner, "trainer": {
            **common, "distributed": {"kind": "Torchrun"}, "environment": {"NCCL_DEBUG": "INFO"},
            "compute": {"instance_type": "ml.g5.12xlarge", "instance_count": 2, "enable_managed_spot_training": True},
            "stopping_condition": {"max_runtime_in_seconds": 3600, "max_wait_time_in_seconds": 7200},
            "checkpoint_config": {"s3_uri": f"{BUCKET}/checkpoints"}}},
        "isolation-kms": {"job_name": "v3-sweep-2", "trainer": {
            **common, "compute": {"instance_type": "ml.g5.xlarge", "volume_kms_key_id": "alias/volume"},
            "networking": {"subnets": ["subnet-0abc"], "security_group_ids": ["sg-0abc"],
                           "enable_network_isolation": True, "enable_inter_container_traffic_encryption": True}},
            "tuner": {**tuner, "ranges": {"optimizer": {"kind": "categorical", "values": ["sgd", "adam"]}},
                      "strategy": "Random", "random_seed": 3, "early_stopping_type": "Auto",
                      "objective_type": "Minimize"}},
        "hyperband-warm-start-completion": {"job_name": "v3-sweep-3", "trainer": common, "tuner": {
            **tuner, "strategy": "Hyperband", "max_runtime_in_seconds": 7200,
            "hyperband": {"min_resource": 1, "max_resource": 9},
            "warm_start": {"type": "TransferLearning", "parents": ["parent-sweep"]},
            "completion": {"target": 0.9, "not_improving": 4, "convergence": "Enabled"}}},
    }


@pytest.fixture(scope="module")
def theirs(endpoint, code) -> dict[str, dict]:  # noqa: F811
    if not SDK3_PYTHON.is_file():
        pytest.fail(f"{SDK3_PYTHON} is missing: build it with `make .venv-sdk3/.installed`")
    proc = subprocess.run([str(SDK3_PYTHON), str(ROOT / "tests" / "support" / "sdk3_reference.py")],
                          input=json.dumps(sweeps(code)), capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {name: answer["request"] for name, answer in json.loads(proc.stdout).items()}


def ours_tune(name: str, code_dir: str) -> dict:
    spec = sweeps(code_dir)[name]
    classes = {n: getattr(model_trainer, n) for n in [*SHAPES.values(), "InputData", "Torchrun", "MPI", "SMP"]}
    session = boto3.Session(region_name=REGION)
    request: dict = {}

    def grab(params: dict, **_: Any) -> None:
        request.update(params)
        raise Sent

    session.events.register("provide-client-params.sagemaker.CreateHyperParameterTuningJob", grab)
    trainer = ModelTrainer(sagemaker_session=session, **build(spec["trainer"], classes))
    t = dict(spec["tuner"])
    args = {"hyperparameter_ranges": t.pop("ranges")}
    if "warm_start" in t:
        args["warm_start_config"] = t.pop("warm_start")
    if "hyperband" in t:
        args["strategy_config"] = t.pop("hyperband")
    if "completion" in t:
        c = t.pop("completion")
        args["completion_criteria_config"] = {"target_objective_value": c["target"],
                                              "max_jobs_not_improving": c["not_improving"],
                                              "complete_on_convergence": c["convergence"] == "Enabled"}
    tuner = HyperparameterTuner(model_trainer=trainer, **t, **args)
    with pytest.raises(Sent):
        tuner.tune(job_name=spec["job_name"], wait=False)
    return request


def _categorical_values(config: dict) -> list:
    return [v for r in config["ParameterRanges"].get("CategoricalParameterRanges", []) for v in r["Values"]]


def _without_empty_ranges(config: dict) -> dict:
    """The SDK v3's serializer leaves out a range type with no ranges; the SDK v2 (and smlaunch) sends []."""
    return {**config, "ParameterRanges": {k: v for k, v in config["ParameterRanges"].items() if v}}


@pytest.mark.parametrize("name", list(sweeps("")))
def test_the_sweep_settings_agree_and_the_trials_differ_only_as_documented(name, theirs, code, endpoint):  # noqa: F811
    sdk, ours = theirs[name], ours_tune(name, code)
    assert ours["HyperParameterTuningJobName"] == sdk["HyperParameterTuningJobName"]
    assert ours.get("WarmStartConfig") == sdk.get("WarmStartConfig")
    ours_config, sdk_config = dict(ours["HyperParameterTuningJobConfig"]), dict(sdk["HyperParameterTuningJobConfig"])
    # Categorical values: smlaunch JSON-encodes them as the SDK v2 does for a framework image (the
    # toolkit json.loads every hyperparameter: '"sgd"' -> sgd); the SDK v3 sends them bare (read as text).
    assert [json.loads(v) for v in _categorical_values(ours_config)] == _categorical_values(sdk_config)
    for config in (ours_config, sdk_config):
        for r in config["ParameterRanges"].get("CategoricalParameterRanges", []):
            r.pop("Values")
    assert _without_empty_ranges(ours_config) == _without_empty_ranges(sdk_config)

    mine, their = ours["TrainingJobDefinition"], sdk["TrainingJobDefinition"]
    for field in ("RoleArn", "StoppingCondition", "CheckpointConfig", "Environment", "VpcConfig",
                  "EnableManagedSpotTraining"):
        assert mine.get(field) == their.get(field), field
    assert mine["AlgorithmSpecification"] == their["AlgorithmSpecification"]
    assert their["OutputDataConfig"] == {"CompressionType": "GZIP", **mine["OutputDataConfig"]}  # GZIP: the default
    spec = sweeps(code)[name]["trainer"]
    # The SDK v3 builds ResourceConfig without the volume's KMS key; smlaunch sends the job's
    # resources as HyperParameterTuningResourceConfig, the key included.
    ours_resources = dict(mine["HyperParameterTuningResourceConfig"])
    key = ours_resources.pop("VolumeKmsKeyId", None)
    assert key == spec.get("compute", {}).get("volume_kms_key_id") and "VolumeKmsKeyId" not in their["ResourceConfig"]
    assert ours_resources == their["ResourceConfig"] and "ResourceConfig" not in mine
    # The SDK v3 drops network isolation and traffic encryption from the trials; smlaunch keeps them.
    networking = spec.get("networking", {})
    assert mine.get("EnableNetworkIsolation") == networking.get("enable_network_isolation")
    assert mine.get("EnableInterContainerTrafficEncryption") == networking.get(
        "enable_inter_container_traffic_encryption")
    assert "EnableNetworkIsolation" not in their and "EnableInterContainerTrafficEncryption" not in their
    # The code: the SDK v3 ships its drivers as an sm_drivers channel and the code under its own
    # prefix; smlaunch the SDK v2 contract (sourcedir.tar.gz under the tuning job's name).
    assert "sm_drivers" in [c["ChannelName"] for c in their["InputDataConfig"]]
    static = {k: json.loads(v) for k, v in mine["StaticHyperParameters"].items()}
    assert static["sagemaker_program"] == "train.py" == their["StaticHyperParameters"]["sagemaker_program"]
    archive = f"/{sweeps(code)[name]['job_name']}/source/sourcedir.tar.gz"
    if networking.get("enable_network_isolation"):  # the archive as the `code` channel, as the SDK v2 sends it
        assert static["sagemaker_submit_directory"] == "/opt/ml/input/data/code/sourcedir.tar.gz"
        uri = next(c for c in mine["InputDataConfig"] if c["ChannelName"] == "code")["DataSource"]["S3DataSource"]
        assert uri["S3Uri"].endswith(archive)
    else:
        assert static["sagemaker_submit_directory"].endswith(archive)
    assert {k: static[k] for k in ("epochs", "arch")} == {"epochs": 3, "arch": "resnet18"}
    # torchrun: smlaunch's trials carry the toolkit's switch for it, as its training job does
    assert static.get("sagemaker_torch_distributed_enabled") == (True if "distributed" in spec else None)
