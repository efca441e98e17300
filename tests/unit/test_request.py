"""The CreateTrainingJob request `dryrun` builds for the seed's runs, offline.

Expectations come from the job files themselves (read here with plain PyYAML) and from the
SageMaker SDK v2 / training-toolkit contract (docs/sagemaker-contract.md), not from the code
under test.
"""

from __future__ import annotations

import json
import re
import socket
from datetime import datetime, timezone
from pathlib import Path

import botocore.endpoint
import pytest
import yaml

from launcher.backends.sagemaker import SageMakerBackend
from launcher.config.job_names import MAX_JOB_NAME, make_job_name
from launcher.config.jobfile import validate_job_file

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "configs" / "seed"
SEED_RUNS = ["p4d-no-cp", "p4d-cp8", "p5-cp8-bf16", "p5-cp8-fp8"]
JOB = "x-1"
# The seed's jobs run smlaunch's train.py (torch >= 2.6) and name no version, so they get the newest
# PyTorch DLC: pytorch.json (SDK v2) 2.8.0, py312, account 763104351884 in us-east-1; the SDK's
# image_uris.retrieve("pytorch", "us-east-1", "2.8.0", "py312", "ml.p5.48xlarge", image_scope="training").
IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.8.0-gpu-py312"
RESERVED = {
    "mp_parameters",
    "sagemaker_torch_distributed_enabled",
    "sagemaker_distributed_dataparallel_enabled",
    "sagemaker_instance_type",
    "sagemaker_program",
    "sagemaker_submit_directory",
    "sagemaker_container_log_level",
    "sagemaker_job_name",
    "sagemaker_region",
}
# SageMaker's TrainingJobName pattern (CreateTrainingJob API reference).
JOB_NAME_PATTERN = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """No credentials anywhere, and any attempt to reach AWS (or any socket) fails the test."""
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                "AWS_DEFAULT_PROFILE", "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_ROLE_ARN",
                "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                "AWS_CONTAINER_CREDENTIALS_FULL_URI"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")

    def no_aws(*args, **kwargs):
        raise AssertionError("dryrun sent a request to AWS")

    def no_socket(*args, **kwargs):
        raise AssertionError("dryrun opened a network connection")

    monkeypatch.setattr(botocore.endpoint.Endpoint, "make_request", no_aws)
    monkeypatch.setattr(socket.socket, "connect", no_socket)
    monkeypatch.setattr(socket, "create_connection", no_socket)


# --- reading the job files independently of launcher.config.jobfile ---------------------------------
def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def load_yaml(path: Path) -> dict:
    data = yaml.safe_load(path.read_text())
    parent = data.pop("extends", None)
    return _merge(load_yaml(path.parent / parent), data) if parent else data


def toolkit_decode(raw: str):
    """sagemaker-training's rule: json.loads, falling back to the raw string."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def dryrun(run: str, *overrides: str, job_name: str | None = JOB):
    job = validate_job_file(SEED / f"{run}.yaml", overrides)
    return SageMakerBackend(region="us-east-1").dryrun(job, job_name=job_name)


# --- the seed's four runs ---------------------------------------------------------------------
@pytest.mark.parametrize("run", SEED_RUNS)
def test_seed_request(run: str) -> None:
    spec = load_yaml(SEED / f"{run}.yaml")
    plan = dryrun(run)
    req = plan.request

    assert req["TrainingJobName"] == JOB
    assert req["AlgorithmSpecification"]["TrainingImage"] == IMAGE
    assert req["AlgorithmSpecification"]["TrainingInputMode"] == "File"
    assert req["RoleArn"] == spec["role"]
    assert req["OutputDataConfig"] == {"S3OutputPath": spec["output_path"]}
    assert req["ResourceConfig"] == {
        "InstanceType": spec["instance_type"],
        "InstanceCount": spec["instance_count"],
        "VolumeSizeInGB": spec["volume_size"],
        "KeepAlivePeriodInSeconds": spec["keep_alive_period_in_seconds"],
    }
    assert req["StoppingCondition"] == {"MaxRuntimeInSeconds": spec["max_run"]}
    assert "EnableManagedSpotTraining" not in req  # the SDK sends it only when true
    assert req["CheckpointConfig"] == {"S3Uri": spec["checkpoint_s3_uri"]}  # LocalPath only when given
    assert req["Environment"] == {k: str(v) for k, v in spec["environment"].items()}
    channels = {c["ChannelName"]: c for c in req["InputDataConfig"]}
    assert channels == {
        name: {
            "ChannelName": name,
            "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": uri,
                                            "S3DataDistributionType": "FullyReplicated"}},
        }
        for name, uri in spec["inputs"].items()
    }

    hp = req["HyperParameters"]
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in hp.items())
    user = spec["hyperparameters"]
    # exactly the user's keys plus the SDK's reserved ones: nothing dropped, nothing invented
    assert set(hp) == set(user) | RESERVED
    for key, value in user.items():
        decoded = toolkit_decode(hp[key])
        assert decoded == value, key
        assert type(decoded) is type(value), key  # 1 stays 1 (not true), 0.0 stays a float
        if isinstance(value, bool):
            assert hp[key] == ("true" if value else "false"), key
        elif isinstance(value, str):
            assert hp[key] == json.dumps(value), key  # quoted, as the SDK's json.dumps does
        elif isinstance(value, int):
            assert hp[key] == str(value), key

    mp = spec["distribution"]["smdistributed"]["modelparallel"]["parameters"]
    assert json.loads(hp["mp_parameters"]) == mp
    assert hp["sagemaker_torch_distributed_enabled"] == "true"
    assert hp["sagemaker_distributed_dataparallel_enabled"] == "false"
    assert hp["sagemaker_instance_type"] == json.dumps(spec["instance_type"])
    assert hp["sagemaker_program"] == '"train.py"'
    assert hp["sagemaker_job_name"] == json.dumps(JOB)
    assert hp["sagemaker_region"] == '"us-east-1"'
    assert hp["sagemaker_container_log_level"] == "20"
    bucket = spec["output_path"].removeprefix("s3://").split("/")[0]
    source = f"s3://{bucket}/{JOB}/source/sourcedir.tar.gz"
    assert hp["sagemaker_submit_directory"] == json.dumps(source)
    assert plan.source_uri == source


def test_fp8_run_sends_fp8_and_batch_4() -> None:
    hp = dryrun("p5-cp8-fp8").request["HyperParameters"]
    assert hp["fp8"] == "1"  # the job file says fp8: 1, and the SDK sends json.dumps(1)
    assert hp["train_batch_size"] == "4"
    assert hp["fp8_amax_history_len"] == "1024"
    assert hp["fp8_amax_compute_algo"] == '"max"'
    assert json.loads(hp["mp_parameters"])["context_parallel_degree"] == 8


def test_bf16_run_has_no_fp8() -> None:
    hp = dryrun("p5-cp8-bf16").request["HyperParameters"]
    assert hp["fp8"] == "0"
    assert hp["train_batch_size"] == "4"


def test_integer_flags_keep_the_sdk_encoding() -> None:
    """The seed writes its flags as 0/1; the v2 SDK sends json.dumps(1) == "1". AWS's SMP v2
    train.py parses these flags with type=int, so "true" (-> '--fp8 True') would crash it."""
    hp = dryrun("p5-cp8-fp8").request["HyperParameters"]
    assert (hp["fp8"], hp["bf16"], hp["use_smp_flash_attn"], hp["delayed_param"]) == ("1", "1", "0", "1")
    assert (hp["do_train"], hp["offload_activations"]) == ("true", "false")  # YAML booleans stay booleans


def test_seed_bundle_holds_script_and_container_package() -> None:
    plan = dryrun("p4d-cp8")
    assert plan.bundle is not None
    assert "train.py" in plan.bundle.files
    assert "_smlaunch/container/__init__.py" in plan.bundle.files  # the runtime, under a name that shadows nothing
    summary = plan.to_dict()["SourceBundle"]
    assert summary["files"] == len(plan.bundle.files) and summary["bytes"] > 0


# --- other request fields -----------------------------------------------------------------------
def test_spot_job() -> None:
    req = dryrun("p5-cp8-bf16", "use_spot_instances=true", "max_wait=90000",
                 "keep_alive_period_in_seconds=null").request
    assert req["EnableManagedSpotTraining"] is True
    assert req["StoppingCondition"] == {"MaxRuntimeInSeconds": 86400, "MaxWaitTimeInSeconds": 90000}
    assert "KeepAlivePeriodInSeconds" not in req["ResourceConfig"]


@pytest.mark.parametrize("location", ["s3://code-bkt/some/prefix", "s3://code-bkt/some/prefix/"])
def test_code_location_with_prefix(location: str) -> None:
    plan = dryrun("p4d-cp8", f"code_location={location}")
    expected = f"s3://code-bkt/some/prefix/{JOB}/source/sourcedir.tar.gz"
    assert plan.source_uri == expected
    assert plan.request["HyperParameters"]["sagemaker_submit_directory"] == json.dumps(expected)
    # artifacts still go to output_path
    assert plan.request["OutputDataConfig"]["S3OutputPath"].startswith("s3://sagemaker-us-east-1-111122223333/")


def test_generated_job_name_uses_base_job_name() -> None:
    name = dryrun("p5-cp8-fp8", job_name=None).request["TrainingJobName"]
    assert name.startswith("smp-8b-cp8-fp8-p5-")
    assert JOB_NAME_PATTERN.fullmatch(name) and len(name) <= 63


@pytest.mark.parametrize("base", ["a" * 100, "x_" * 50, "my.job name/" * 9, "-" * 5 + "z" * 95])
def test_make_job_name_is_a_valid_sagemaker_name(base: str) -> None:
    now = datetime(2025, 3, 4, 5, 6, 7, 891000, tzinfo=timezone.utc)
    name = make_job_name(base, now=now)
    assert len(name) <= MAX_JOB_NAME == 63
    assert JOB_NAME_PATTERN.fullmatch(name), name
    assert name.endswith("-2025-03-04-05-06-07-891")  # the SDK v2 timestamp, milliseconds included
    later = make_job_name(base, now=now.replace(microsecond=892000))
    assert later != name


def test_make_job_name_keeps_a_short_base() -> None:
    now = datetime(2025, 1, 2, 3, 4, 5, 6000, tzinfo=timezone.utc)
    assert make_job_name("smp-8b-cp8", now=now) == "smp-8b-cp8-2025-01-02-03-04-05-006"


def test_secrets_are_masked_in_the_printed_dryrun() -> None:
    plan = dryrun("p5-cp8-bf16", "environment.HF_TOKEN=hf_abcdefSECRET", "hyperparameters.api_key=sk-live-123",
                  "hyperparameters.num_key_value_heads=8")
    shown = plan.to_dict()
    text = json.dumps(shown)
    assert "hf_abcdefSECRET" not in text and "sk-live-123" not in text
    req = shown["CreateTrainingJob"]
    assert req["Environment"]["HF_TOKEN"] == "****"
    assert req["HyperParameters"]["api_key"] == "****"
    assert req["HyperParameters"]["num_key_value_heads"] == "8"  # a count, not a key
    assert req["Environment"]["NCCL_DEBUG"] == "INFO"
    # only the printed copy is masked: the request itself still carries the real values
    assert plan.request["Environment"]["HF_TOKEN"] == "hf_abcdefSECRET"
    assert plan.request["HyperParameters"]["api_key"] == json.dumps("sk-live-123")
    assert plan.to_dict(masked=False)["CreateTrainingJob"]["Environment"]["HF_TOKEN"] == "hf_abcdefSECRET"
