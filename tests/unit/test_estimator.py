"""`launcher.PyTorch` runs the seed notebook's estimator code, changed only in its import."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import boto3
import pytest
from moto import mock_aws

from launcher import PyTorch  # the seed: from sagemaker.pytorch import PyTorch
from launcher.backends.sagemaker import SageMakerBackend
from launcher.wire.training.issues import ConfigError

ROOT = Path(__file__).resolve().parents[2]
REGION = "us-east-1"
BUCKET = "smlaunch-seed-bucket"
ROLE = "arn:aws:iam::111122223333:role/SageMakerExecutionRole"
OUTPUT = f"s3://{BUCKET}/smp-fsdp-tp/outputdir/"
CHECKPOINTS = f"s3://{BUCKET}/experiments/smp-fsdp-tp-llama_v2-checkpoints/"
TRAIN = f"s3://{BUCKET}/dataset/train/"


class TrainingInput:
    """Stands in for sagemaker.inputs.TrainingInput: the SDK object exposes the channel as .config."""

    def __init__(self, s3_data: str, distribution: str = "FullyReplicated"):
        self.config = {"DataSource": {"S3DataSource": {
            "S3DataType": "S3Prefix", "S3Uri": s3_data, "S3DataDistributionType": distribution}}}


def seed_hyperparameters() -> dict:
    """The seed's dict: baseline settings, then the p5 + CP 8 + FP8 update."""
    hyperparameters = {
        "activation_checkpointing": 1, "auto_wrap_policy": "transformer_auto_wrap_policy",
        "backward_fetch_policy": "backward_pre", "clean_cache": 0, "delayed_param": 1,
        "enable_memory_profiling": 1, "offload_activations": 0,
        "beta1": 0.9, "beta2": 0.95, "bf16": 1, "epochs": 100, "lr": 0.0001, "lr_decay_iters": 47683,
        "lr_decay_style": "cosine", "min_lr": 1e-05, "warmup": 0.0032, "weight_decay": 0.2,
        "train_batch_size": 1, "val_batch_size": 1, "validation_freq": 10, "validation_batches": -1,
        "fast_validation": 0, "max_steps": 15, "logging_freq": 1,
        "checkpoint_dir": "/opt/ml/checkpoints", "checkpoint_freq": 10, "num_kept_checkpoints": 2,
        "model_type": "llama_v2", "vocab_size": 128256,
        "hf_pretrained_model_name_or_dir": "meta-llama/Llama-3.1-8B",
        "forward_prefetch": 1, "fp8": 0, "limit_all_gathers": 1, "plateau": 0.0, "seed": 12345,
        "sharding_strategy": "hybrid_shard", "use_smp_flash_attn": 0, "zipped_data": 0,
    }
    hyperparameters.update({
        "use_smp_implementation": 1,
        "max_context_width": 16384,
        "train_batch_size": 4,
        "fp8": 1,
        "distributed_backend": "nccl",
    })
    return hyperparameters


def seed_distribution(context_parallel_degree: int = 8, hybrid_shard_degree: int = 8) -> dict:
    return {
        "torch_distributed": {"enabled": True},
        "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
            "context_parallel_degree": context_parallel_degree,
            "hybrid_shard_degree": hybrid_shard_degree,
            "delayed_parameter_initialization": True,
        }}},
    }


def seed_estimator(sagemaker_session, instance_type: str = "ml.p5.48xlarge", **changes) -> PyTorch:
    hyperparameters = changes.pop("hyperparameters", seed_hyperparameters())
    args = {
        "entry_point": "train.py",
        "hyperparameters": hyperparameters,
        "source_dir": str(ROOT / "entrypoints"),
        "role": ROLE,
        "checkpoint_s3_uri": CHECKPOINTS,
        "instance_type": instance_type,
        "volume_size": 400,
        "instance_count": 1,
        "sagemaker_session": sagemaker_session,
        "distribution": seed_distribution(),
        # The seed notebook's framework_version 2.4.1 (SMP v2's image) is left out: smlaunch's train.py
        # needs torch >= 2.6, and without a version it runs on the newest PyTorch DLC.
        "output_path": OUTPUT,
        "max_run": 86400,
        "debugger_hook_config": False,
        "base_job_name": "smp-8b-cp8-fp8-p5",
        "metric_definitions": [{"Name": "base_metric", "Regex": "<><><><><><>"}],
        "keep_alive_period_in_seconds": 1800,
        "environment": {"NCCL_DEBUG": "INFO", "NCCL_IB_TIMEOUT": "22"},
        "wait": False,
    }
    args.update(changes)
    return PyTorch(**args)


@pytest.fixture(autouse=True)
def _no_network(no_network):
    """Every test here runs with the network refused (conftest.py)."""


@pytest.fixture
def session(fake_credentials):
    """What the notebook passes as sagemaker_session: an object with .boto_session."""
    with mock_aws():
        boto_session = boto3.Session(region_name=REGION)
        boto_session.client("s3").create_bucket(Bucket=BUCKET)
        yield SimpleNamespace(boto_session=boto_session)


# --- the notebook, end to end -------------------------------------------------------------------
def test_seed_notebook_fit(session, capsys) -> None:
    smp_estimator = seed_estimator(session)
    data_channels = {"train": TrainingInput(TRAIN)}
    smp_estimator.fit(inputs=data_channels, wait=False)

    name = smp_estimator.latest_training_job.name
    assert name.startswith("smp-8b-cp8-fp8-p5-") and len(name) <= 63
    assert name in capsys.readouterr().err

    desc = smp_estimator.describe()
    assert desc["TrainingJobName"] == name
    assert desc["InputDataConfig"] == [{"ChannelName": "train", "DataSource": {"S3DataSource": {
        "S3DataType": "S3Prefix", "S3Uri": TRAIN, "S3DataDistributionType": "FullyReplicated"}}}]
    assert desc["ResourceConfig"] == {"InstanceType": "ml.p5.48xlarge", "InstanceCount": 1,
                                      "VolumeSizeInGB": 400, "KeepAlivePeriodInSeconds": 1800}
    assert desc["CheckpointConfig"]["S3Uri"] == CHECKPOINTS
    assert desc["OutputDataConfig"]["S3OutputPath"] == OUTPUT
    assert desc["RoleArn"] == ROLE
    assert desc["AlgorithmSpecification"]["TrainingImage"] == \
        "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.8.0-gpu-py312"  # pytorch.json 2.8.0
    hp = desc["HyperParameters"]
    assert json.loads(hp["mp_parameters"]) == seed_distribution()["smdistributed"]["modelparallel"]["parameters"]
    assert hp["sagemaker_torch_distributed_enabled"] == "true"
    # json.dumps of what the notebook passed, as the SDK v2 sends it
    assert (hp["train_batch_size"], hp["fp8"], hp["activation_checkpointing"]) == ("4", "1", "1")
    assert (hp["lr"], hp["min_lr"], hp["plateau"]) == ("0.0001", "1e-05", "0.0")
    assert hp["hf_pretrained_model_name_or_dir"] == '"meta-llama/Llama-3.1-8B"'

    # the code went to s3://<output bucket>/<job>/source/sourcedir.tar.gz
    key = f"{name}/source/sourcedir.tar.gz"
    s3 = session.boto_session.client("s3")
    assert s3.head_object(Bucket=BUCKET, Key=key)["ContentLength"] > 0
    assert hp["sagemaker_submit_directory"] == json.dumps(f"s3://{BUCKET}/{key}")

    # SageMaker puts model.tar.gz at <output_path>/<job>/output/model.tar.gz
    assert smp_estimator.model_data == f"{OUTPUT.rstrip('/')}/{name}/output/model.tar.gz"


def test_fit_with_plain_uri_and_explicit_name(session) -> None:
    est = seed_estimator(session)
    est.fit(TRAIN, wait=False, job_name="seed-explicit-name")
    desc = est.describe()
    assert desc["TrainingJobName"] == "seed-explicit-name"
    # the SDK names a lone channel "training"
    assert [c["ChannelName"] for c in desc["InputDataConfig"]] == ["training"]


def test_fit_with_wait_follows_to_completion(session) -> None:
    est = seed_estimator(session)
    est.fit(inputs={"train": TrainingInput(TRAIN)}, job_name="seed-waits")  # moto: Completed at once
    assert est.describe()["TrainingJobStatus"] == "Completed"


def test_methods_before_fit_explain_themselves(fake_credentials) -> None:
    est = seed_estimator(None)
    with pytest.raises(RuntimeError, match="fit"):
        est.describe()


def test_dryrun_sends_nothing(fake_credentials, monkeypatch) -> None:
    import botocore.endpoint

    def no_aws(*args, **kwargs):
        raise AssertionError("dryrun sent a request")

    monkeypatch.setattr(botocore.endpoint.Endpoint, "make_request", no_aws)
    est = seed_estimator(SimpleNamespace(boto_session=boto3.Session(region_name=REGION)))
    shown = est.dryrun(inputs={"train": TrainingInput(TRAIN, "ShardedByS3Key")}, job_name="dry-1")
    req = shown["CreateTrainingJob"]
    assert req["TrainingJobName"] == "dry-1"
    assert req["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3DataDistributionType"] == "ShardedByS3Key"
    assert shown["SourceUpload"] == f"s3://{BUCKET}/dry-1/source/sourcedir.tar.gz"


# --- validation at construction ------------------------------------------------------------------
def test_fp8_on_p4d_is_refused(fake_credentials) -> None:
    with pytest.raises(ConfigError) as err:
        seed_estimator(None, instance_type="ml.p4d.24xlarge")
    paths = [i.path for i in err.value.issues]
    assert "hyperparameters.fp8" in paths
    issue = err.value.issues[paths.index("hyperparameters.fp8")]
    assert "A100" in issue.problem or "FP8" in issue.problem
    assert issue.fix


def test_same_job_without_fp8_on_p4d_is_accepted(fake_credentials) -> None:
    hyperparameters = {**seed_hyperparameters(), "fp8": 0}
    est = seed_estimator(None, instance_type="ml.p4d.24xlarge", hyperparameters=hyperparameters)
    assert est.config.instance_type == "ml.p4d.24xlarge"


def test_unknown_argument_gets_did_you_mean(fake_credentials) -> None:
    with pytest.raises(ConfigError) as err:
        seed_estimator(None, instance_typo="ml.p5.48xlarge", volume_sze=400)
    by_path = {i.path: i for i in err.value.issues}
    assert set(by_path) == {"instance_typo", "volume_sze"}
    assert "instance_type" in by_path["instance_typo"].fix
    assert "volume_size" in by_path["volume_sze"].fix


def test_bad_degree_is_refused_with_its_path(fake_credentials) -> None:
    with pytest.raises(ConfigError) as err:
        seed_estimator(None, distribution=seed_distribution(context_parallel_degree=3))
    assert "distribution.smdistributed.modelparallel.parameters.context_parallel_degree" in \
        [i.path for i in err.value.issues]


# --- attach ---------------------------------------------------------------------------------------
def test_attach_round_trip(session) -> None:
    original = seed_estimator(session)
    original.fit(inputs={"train": TrainingInput(TRAIN)}, wait=False, job_name="seed-attach")

    attached = PyTorch.attach("seed-attach", session=session.boto_session)
    a, o = attached.config, original.config
    assert a.distribution == o.distribution
    assert a.distribution.model_dump() == o.distribution.model_dump()
    assert a.distribution.modelparallel.parameters.explicit() == \
        seed_distribution()["smdistributed"]["modelparallel"]["parameters"]
    assert a.hyperparameters.raw() == o.hyperparameters.raw()  # attached code is on S3: read as a user script
    assert a.hyperparameters.model_dump(exclude_none=True) == o.hyperparameters.model_dump(exclude_none=True)
    for field in ("instance_type", "instance_count", "volume_size", "max_run", "keep_alive_period_in_seconds",
                  "role", "output_path", "checkpoint_s3_uri", "checkpoint_local_path",
                  "use_spot_instances"):
        assert getattr(a, field) == getattr(o, field), field
    assert a.region == REGION  # the original took it from the session
    assert attached.latest_training_job.name == "seed-attach"
    assert attached.describe()["TrainingJobName"] == "seed-attach"
    assert attached.model_data == original.model_data
    # the attached estimator's image is the one the job ran, not a re-resolved one
    assert a.image_uri == original.describe()["AlgorithmSpecification"]["TrainingImage"]


def test_attach_restores_max_restarts_and_the_program(fake_credentials, monkeypatch) -> None:
    """A SageMaker job with max_restarts names smlaunch's restart loop as its program
    (launcher.wire.restart_loop): attach gives back the job's own program, torchrun and the budget."""
    est = seed_estimator(SimpleNamespace(boto_session=boto3.Session(region_name=REGION)), max_restarts=2,
                         restart_on_job_errors=1)
    request = SageMakerBackend(boto3.Session(region_name=REGION)).dryrun(est.job, job_name="rs-1", build=False).request
    assert json.loads(request["HyperParameters"]["sagemaker_program"]) == "_smlaunch/restart_loop.py"
    monkeypatch.setattr(SageMakerBackend, "describe", lambda self, name: {**request, "TrainingJobStatus": "InProgress"})

    attached = PyTorch.attach("rs-1", session=boto3.Session(region_name=REGION))
    assert (attached.config.max_restarts, attached.config.restart_on_job_errors) == (2, 1)
    assert attached.config.entry_point == "train.py"
    assert attached.config.distribution == est.config.distribution
    assert attached.config.hyperparameters.raw() == est.config.hyperparameters.raw()
    # control: a job without restarts attaches with none
    plain = SageMakerBackend(boto3.Session(region_name=REGION)).dryrun(
        seed_estimator(SimpleNamespace(boto_session=boto3.Session(region_name=REGION))).job, job_name="rs-2",
        build=False).request
    monkeypatch.setattr(SageMakerBackend, "describe", lambda self, name: {**plain, "TrainingJobStatus": "InProgress"})
    assert PyTorch.attach("rs-2", session=boto3.Session(region_name=REGION)).config.max_restarts == 0


def test_attach_restores_environment_and_spot(fake_credentials, monkeypatch) -> None:
    """moto drops Environment; build DescribeTrainingJob as AWS echoes it from the request."""
    est = seed_estimator(SimpleNamespace(boto_session=boto3.Session(region_name=REGION)),
                         use_spot_instances=True, max_wait=90000, keep_alive_period_in_seconds=None)
    request = SageMakerBackend(boto3.Session(region_name=REGION)).dryrun(
        est.job, job_name="spot-1", build=False).request
    described = {**request, "TrainingJobStatus": "InProgress",
                 "ModelArtifacts": {"S3ModelArtifacts": f"{OUTPUT}spot-1/output/model.tar.gz"}}
    monkeypatch.setattr(SageMakerBackend, "describe", lambda self, name: described)

    attached = PyTorch.attach("spot-1", session=boto3.Session(region_name=REGION))
    assert attached.config.environment == {"NCCL_DEBUG": "INFO", "NCCL_IB_TIMEOUT": "22"}
    assert attached.config.use_spot_instances is True
    assert attached.config.max_wait == 90000
    assert attached.config.distribution == est.config.distribution
    assert attached.config.hyperparameters.raw() == est.config.hyperparameters.raw()
