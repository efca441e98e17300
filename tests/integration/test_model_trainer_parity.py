"""smlaunch's `ModelTrainer` against the official SageMaker SDK v3's (sagemaker-train 1.27.0): the
same v3 script, one moto server, and the CreateTrainingJob requests compared field by field.

The SDK v3 runs in its own venv, .venv-sdk3 (it cannot share one with the SDK v2 the rest of the
suite compares with), through tests/support/sdk3_reference.py. Where the two requests differ by design
(docs/sdk-v3.md) the test asserts the difference exactly: the SDK v3 ships its driver scripts as an
`sm_drivers` channel and its code as a `code` channel, started by ContainerEntrypoint; smlaunch
sends the SDK v2 contract the image's sagemaker-training toolkit runs.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from launcher.sdk import model_trainer
from launcher.sdk.model_trainer import ModelTrainer
from tests.support.sdk3_reference import REGION, ROLE, SHAPES, Sent, build, channels

ROOT = Path(__file__).resolve().parents[2]
SDK3_PYTHON = ROOT / ".venv-sdk3" / "bin" / "python"
BUILD = "`make install` (its .venv-sdk3 step: docs/sdk-v3.md, 'The reference')"
IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.5.1-gpu-py311-cu124-ubuntu22.04-sagemaker"
BUCKET = "s3://parity-v3"
DEFAULT_BUCKET = f"sagemaker-{REGION}-123456789012"  # moto's account
# What the SDK v3 puts in AlgorithmSpecification to start its driver (sagemaker.train.constants).
V3_ENTRYPOINT = {"ContainerEntrypoint": ["/bin/bash"], "ContainerArguments": [
    "-c", "chmod +x /opt/ml/input/data/sm_drivers/sm_train.sh && /opt/ml/input/data/sm_drivers/sm_train.sh"]}
HYPERPARAMETERS = {"epochs": 3, "lr": 0.001, "arch": "resnet18", "nesterov": False,
                   "schedule": {"kind": "step", "gamma": 0.1}}


def jobs(code: str) -> dict[str, dict]:
    """name -> {"trainer": ModelTrainer arguments, "train_inputs": train()'s channels} (JSON)."""
    common = {"training_image": IMAGE, "role": ROLE, "source_code": {"source_dir": code, "entry_script": "train.py"},
              "hyperparameters": HYPERPARAMETERS}
    return {
        "torchrun": {"trainer": {
            **common, "base_job_name": "v3-torchrun", "distributed": {"kind": "Torchrun"},
            "compute": {"instance_type": "ml.g5.12xlarge", "instance_count": 2},
            "environment": {"NCCL_DEBUG": "INFO"},
            "output_data_config": {"s3_output_path": f"{BUCKET}/output"},
            "input_data_config": [{"channel_name": "train", "data_source": f"{BUCKET}/train"}]}},
        "smp": {"trainer": {
            **common, "base_job_name": "v3-smp",
            "distributed": {"kind": "Torchrun", "smp": {"hybrid_shard_degree": 8, "context_parallel_degree": 2,
                                                        "sm_activation_offloading": True}},
            "compute": {"instance_type": "ml.p5.48xlarge", "instance_count": 2, "volume_size_in_gb": 400,
                        "keep_alive_period_in_seconds": 1800},
            "networking": {"subnets": ["subnet-0abc"], "security_group_ids": ["sg-0abc"],
                           "enable_network_isolation": True, "enable_inter_container_traffic_encryption": True},
            "stopping_condition": {"max_runtime_in_seconds": 7200},
            "output_data_config": {"s3_output_path": f"{BUCKET}/output", "kms_key_id": "alias/artifacts",
                                   "compression_type": "NONE"},
            "checkpoint_config": {"s3_uri": f"{BUCKET}/checkpoints"},
            "environment": {"NCCL_DEBUG": "INFO", "FI_EFA_USE_DEVICE_RDMA": "1"},
            "input_data_config": [{"channel_name": "train", "data_source": f"{BUCKET}/old-train"}]},
            # train()'s channels replace the constructor's of the same name
            "train_inputs": [{"channel_name": "train", "data_source": f"{BUCKET}/train"},
                             {"channel_name": "validation", "data_source": f"{BUCKET}/validation",
                              "content_type": "application/jsonlines"}]},
        "mpi-spot": {"trainer": {
            **common, "base_job_name": "v3-mpi",
            "distributed": {"kind": "MPI", "process_count_per_node": 8,
                            "mpi_additional_options": ["-x", "NCCL_DEBUG=INFO"]},
            "compute": {"instance_type": "ml.p4d.24xlarge", "instance_count": 2, "enable_managed_spot_training": True},
            "stopping_condition": {"max_runtime_in_seconds": 3600, "max_wait_time_in_seconds": 7200},
            "output_data_config": {"s3_output_path": f"{BUCKET}/output"},
            "checkpoint_config": {"s3_uri": f"{BUCKET}/checkpoints", "local_path": "/opt/ml/ckpt"}},
            "train_inputs": [{"channel_name": "train", "data_source": {
                "s3_data_type": "S3Prefix", "s3_uri": f"{BUCKET}/train",
                "s3_data_distribution_type": "ShardedByS3Key"}}]},
        "defaults": {"trainer": common},
    }


def s3_sources(spec: dict, classes: dict[str, Any]) -> dict:
    """The S3DataSource channels of a spec made into objects (the JSON holds their fields)."""
    for channel in spec.get("train_inputs", []):
        if isinstance(channel["data_source"], dict):
            channel["data_source"] = classes["S3DataSource"](**channel["data_source"])
    return spec


@pytest.fixture(scope="module")
def code(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("code")
    (root / "train.py").write_text("import sys\nprint('training with', sys.argv[1:])\n")
    return str(root)


@pytest.fixture(scope="module")
def endpoint():
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    with pytest.MonkeyPatch.context() as mp:
        for key, value in {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "testing",
                           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION,
                           "SAGEMAKER_VALIDATE_ROLE": "false"}.items():
            mp.setenv(key, value)
        mp.delenv("AWS_PROFILE", raising=False)
        s3 = boto3.Session(region_name=REGION).client("s3")
        for bucket in (BUCKET.removeprefix("s3://"), DEFAULT_BUCKET):
            s3.create_bucket(Bucket=bucket)
        yield
    server.stop()


@pytest.fixture(scope="module")
def theirs(endpoint, code) -> dict[str, dict]:
    """Every job submitted by the official SDK v3, in one run of its interpreter."""
    if not SDK3_PYTHON.is_file():
        pytest.fail(f"{SDK3_PYTHON} is missing: the official SDK v3 runs in a venv of its own (it cannot share "
                    f".venv with the SDK v2). Build it with {BUILD}")
    proc = subprocess.run([str(SDK3_PYTHON), str(ROOT / "tests" / "support" / "sdk3_reference.py")],
                          input=json.dumps(jobs(code)), capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout)


def ours_submit(name: str, code: str) -> dict:
    """The job submitted by smlaunch's ModelTrainer, caught at CreateTrainingJob like theirs."""
    classes = {n: getattr(model_trainer, n) for n in [*SHAPES.values(), "InputData", "S3DataSource",
                                                      "Torchrun", "MPI", "SMP"]}
    spec = s3_sources(jobs(code)[name], classes)
    session = boto3.Session(region_name=REGION)
    request: dict = {}

    def grab(params: dict, **_: Any) -> None:
        request.update(params)
        raise Sent

    session.events.register("provide-client-params.sagemaker.CreateTrainingJob", grab)
    trainer = ModelTrainer(sagemaker_session=session, **build(spec["trainer"], classes))
    with pytest.raises(Sent):
        trainer.train(input_data_config=channels(spec.get("train_inputs", []), classes) or None,
                      wait=False, logs=False)
    return request


def toolkit_value(text: str) -> Any:
    """A hyperparameter as the sagemaker-training toolkit reads it: JSON, else the text itself."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


# The request fields compared as they are, and those of them each job sets (so none compares two absences).
SAME = ("RoleArn", "ResourceConfig", "StoppingCondition", "CheckpointConfig", "VpcConfig", "Environment",
        "EnableNetworkIsolation", "EnableInterContainerTrafficEncryption", "EnableManagedSpotTraining")
SET = {"torchrun": {"Environment"},
       "smp": {"CheckpointConfig", "VpcConfig", "Environment", "EnableNetworkIsolation",
               "EnableInterContainerTrafficEncryption"},
       "mpi-spot": {"CheckpointConfig", "EnableManagedSpotTraining"},
       "defaults": set()}


@pytest.mark.parametrize("name", list(jobs("")))
def test_requests_agree_field_by_field(name, theirs, code, endpoint):
    sdk, ours = theirs[name]["request"], ours_submit(name, code)
    spec = jobs(code)[name]["trainer"]
    base = spec.get("base_job_name", "pytorch-training-job")  # the SDK v3's default: the image's repository
    assert ours["TrainingJobName"].startswith(f"{base}-") and sdk["TrainingJobName"].startswith(f"{base}-")
    assert {f for f in SAME if f in ours} == {"RoleArn", "ResourceConfig", "StoppingCondition", *SET[name]}
    for field in SAME:
        assert ours.get(field) == sdk.get(field), field
    assert ours["AlgorithmSpecification"] == {"TrainingImage": IMAGE, "TrainingInputMode": "File"}
    assert sdk["AlgorithmSpecification"] == {**ours["AlgorithmSpecification"], **V3_ENTRYPOINT}
    # GZIP is the default either way; the SDK v3 writes it out. The default paths differ (test below).
    sdk_output, our_output = dict(sdk["OutputDataConfig"]), dict(ours["OutputDataConfig"])
    if "output_data_config" not in spec:
        del sdk_output["S3OutputPath"], our_output["S3OutputPath"]
    assert sdk_output == {"CompressionType": "GZIP", **our_output}
    user = {k: v for k, v in sdk["HyperParameters"].items() if k != "mp_parameters"}
    assert {k: toolkit_value(v) for k, v in user.items()} == HYPERPARAMETERS
    assert {k: json.loads(ours["HyperParameters"][k]) for k in user} == HYPERPARAMETERS
    # The SDK v2 encoding smlaunch sends quotes strings; the SDK v3 sends them bare. The toolkit reads both.
    assert (ours["HyperParameters"]["arch"], sdk["HyperParameters"]["arch"]) == ('"resnet18"', "resnet18")
    sdk_channels = [c for c in sdk["InputDataConfig"] if c["ChannelName"] not in ("code", "sm_drivers")]
    our_channels = [c for c in ours.get("InputDataConfig", []) if c["ChannelName"] != "code"]
    assert our_channels == sdk_channels
    # smlaunch sends the SDK v2's ProfilerConfig (profiler off); the SDK v3 sends none
    assert set(ours) - set(sdk) == {"ProfilerConfig"} and set(sdk) - set(ours) <= {"InputDataConfig"}


@pytest.mark.parametrize("name", ["torchrun", "smp"])
def test_the_sdk_v3_ships_drivers_smlaunch_sends_the_sdk_v2_contract(name, theirs, code, endpoint):
    sdk, drivers, ours = theirs[name]["request"], theirs[name]["sm_drivers"], ours_submit(name, code)
    spec = jobs(code)[name]["trainer"]
    smp = spec["distributed"].get("smp")
    # SDK v3: the code and its drivers as two channels, the launcher settings in distributed.json
    assert [c["ChannelName"] for c in sdk["InputDataConfig"]][-2:] == ["code", "sm_drivers"]
    assert {"sm_train.sh", "distributed.json", "sourcecode.json",
            "distributed_drivers/torchrun_driver.py"} <= set(drivers["files"])
    assert {k: v for k, v in drivers["distributed.json"].items() if v is not None} == ({"smp": {
        **{k: None for k in drivers["distributed.json"]["smp"]}, **smp}} if smp else {})
    assert drivers["sourcecode.json"]["entry_script"] == "train.py"
    # smlaunch: the toolkit's reserved hyperparameters, and the code as sourcedir.tar.gz
    hp = {k: json.loads(v) for k, v in ours["HyperParameters"].items()}
    assert hp["sagemaker_program"] == "train.py" and hp["sagemaker_torch_distributed_enabled"] is True
    isolated = bool(spec.get("networking", {}).get("enable_network_isolation"))
    code_channel = [c for c in ours.get("InputDataConfig", []) if c["ChannelName"] == "code"]
    if isolated:  # the SDK v2 sends the archive as the `code` channel too, and points the toolkit at it
        assert hp["sagemaker_submit_directory"] == "/opt/ml/input/data/code/sourcedir.tar.gz"
        assert code_channel[0]["DataSource"]["S3DataSource"]["S3Uri"].endswith("/source/sourcedir.tar.gz")
    else:
        assert hp["sagemaker_submit_directory"].endswith("/source/sourcedir.tar.gz") and code_channel == []
    # both send SMP's parameters as mp_parameters, the same JSON
    if smp:
        assert json.loads(sdk["HyperParameters"]["mp_parameters"]) == hp["mp_parameters"] == smp
    assert ours["ProfilerConfig"] == {"DisableProfiler": True}


def test_mpi_options_reach_the_toolkit(theirs, code, endpoint):
    drivers, ours = theirs["mpi-spot"]["sm_drivers"], ours_submit("mpi-spot", code)
    assert drivers["distributed.json"] == {"process_count_per_node": 8,
                                           "mpi_additional_options": ["-x", "NCCL_DEBUG=INFO"]}
    hp = {k: json.loads(v) for k, v in ours["HyperParameters"].items()}
    assert (hp["sagemaker_mpi_enabled"], hp["sagemaker_mpi_num_of_processes_per_host"],
            hp["sagemaker_mpi_custom_mpi_options"]) == (True, 8, "-x NCCL_DEBUG=INFO")


def test_default_output_path_differs_as_documented(theirs, code, endpoint):
    """Without output_data_config the SDK v3 writes under the base job name; smlaunch, as the SDK v2,
    at the bucket's top (the job name follows in both)."""
    sdk, ours = theirs["defaults"]["request"], ours_submit("defaults", code)
    assert sdk["OutputDataConfig"]["S3OutputPath"] == f"s3://{DEFAULT_BUCKET}/pytorch-training-job"
    assert ours["OutputDataConfig"]["S3OutputPath"] == f"s3://{DEFAULT_BUCKET}/"
