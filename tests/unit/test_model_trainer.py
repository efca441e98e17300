"""`launcher.ModelTrainer`: a SageMaker SDK v3 script, its import changed, validated by smlaunch's
rules with errors in v3 terms, planned, dry-run, and run in local mode.

The request it sends is compared with the official SDK v3's in tests/integration/test_model_trainer_parity.py.
Here the tests that run in one process; those that start processes are tests/integration/test_model_trainer.py."""

from __future__ import annotations

from types import SimpleNamespace

import boto3
import pytest

from launcher import PyTorch
from launcher.sdk.model_trainer import (
    MPI,
    SMP,
    CheckpointConfig,
    Compute,
    InputData,
    Mode,
    ModelTrainer,
    OutputDataConfig,
    S3DataSource,
    SourceCode,
    StoppingCondition,
    Torchrun,
)
from launcher.wire.restart_policy import RestartPolicy
from launcher.wire.training.issues import ConfigError
from tests.support.model_trainer import ROOT, issues

pytestmark = pytest.mark.usefixtures("no_network", "fake_credentials")  # nothing here reaches AWS or the network

REGION = "us-east-1"
ROLE = "arn:aws:iam::111122223333:role/SageMakerRole"
IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.7.1-gpu-py312-cu128-ubuntu22.04-sagemaker"
BUCKET = "s3://v3-bucket"
LLAMA = {"model_type": "llama_v2", "hf_pretrained_model_name_or_dir": "meta-llama/Llama-3.1-8B",
         "max_context_width": 16384, "train_batch_size": 1, "bf16": 1, "activation_checkpointing": 1}


def smp_trainer(smp: SMP, **changes) -> ModelTrainer:
    """The seed's Llama 3.1 8B run on two p5 hosts, as a v3 script writes it."""
    args = {"training_image": IMAGE, "role": ROLE, "hyperparameters": LLAMA,
            "source_code": SourceCode(source_dir=str(ROOT / "entrypoints"), entry_script="train.py"),
            "compute": Compute(instance_type="ml.p5.48xlarge", instance_count=2),
            "distributed": Torchrun(smp=smp), "output_data_config": OutputDataConfig(s3_output_path=f"{BUCKET}/out")}
    args.update(changes)
    return ModelTrainer(**args)


# --- validation, in v3 terms -----------------------------------------------------------------------
def test_a_bad_smp_degree_is_refused_naming_the_v3_field():
    with pytest.raises(ConfigError) as err:
        smp_trainer(SMP(hybrid_shard_degree=8, context_parallel_degree=3))
    found = issues(err)
    assert "distributed.smp.context_parallel_degree" in found  # the estimator's ...modelparallel.parameters...
    assert found["distributed.smp.context_parallel_degree"].value == 3
    assert not any(p.startswith("distribution") for p in found)


def test_estimator_fields_are_named_back_in_v3_terms():
    with pytest.raises(ConfigError) as err:
        smp_trainer(SMP(hybrid_shard_degree=8), compute=Compute(instance_type="ml.p5.48xlarge", instance_count=0),
                    stopping_condition=StoppingCondition(max_runtime_in_seconds=0))
    assert {"compute.instance_count", "stopping_condition.max_runtime_in_seconds"} <= set(issues(err))


def test_unknown_fields_get_did_you_mean():
    with pytest.raises(ConfigError) as err:
        SMP(context_paralel_degree=2)
    assert issues(err)["SMP.context_paralel_degree"].fix.startswith("did you mean 'context_parallel_degree'")
    with pytest.raises(ConfigError) as err:
        ModelTrainer(training_imag=IMAGE, compute={"instance_typ": "ml.p5.48xlarge"})
    found = issues(err)
    assert "'training_image'" in found["training_imag"].fix
    assert "'instance_type'" in found["compute.instance_typ"].fix


def test_what_smlaunch_cannot_send_is_refused_with_the_reason(script):
    with pytest.raises(ConfigError) as err:
        ModelTrainer(training_image=IMAGE, role=ROLE, algorithm_name="my-algo",
                     source_code=SourceCode(source_dir=str(script), command="python train.py --fast"),
                     checkpoint_config=CheckpointConfig(local_path="/opt/ml/checkpoints"),
                     distributed=MPI(mpi_additional_options=["--mca btl tcp"]))
    found = issues(err)
    assert set(found) == {"algorithm_name", "source_code.command", "checkpoint_config.s3_uri",
                          "distributed.mpi_additional_options"}
    assert "sm_train.sh" in found["source_code.command"].problem and "entry_script" in found["source_code.command"].fix


def test_requirements_are_the_toolkits_requirements_txt(script):
    (script / "gpu.txt").write_text("einops\n")
    with pytest.raises(ConfigError) as err:
        ModelTrainer(training_image=IMAGE, role=ROLE,
                     source_code=SourceCode(source_dir=str(script), entry_script="train.py", requirements="gpu.txt"))
    assert "requirements.txt" in issues(err)["source_code.requirements"].fix
    (script / "requirements.txt").write_text("einops\n")
    trainer = ModelTrainer(training_image=IMAGE, role=ROLE, source_code=SourceCode(
        source_dir=str(script), entry_script="train.py", requirements="requirements.txt"))
    assert trainer.estimator.config.source_dir == str(script)


def test_local_container_mode_needs_a_local_instance_type(script):
    with pytest.raises(ConfigError) as err:
        ModelTrainer(training_mode=Mode.LOCAL_CONTAINER, compute=Compute(instance_type="ml.p5.48xlarge"),
                     source_code=SourceCode(source_dir=str(script), entry_script="train.py"))
    assert "local_cpu" in issues(err)["compute.instance_type"].fix


# --- the official SDK's objects ----------------------------------------------------------------------
def test_the_sdk_v2_modules_objects_are_accepted_and_send_the_same_request():
    pytest.importorskip("sagemaker")
    from sagemaker.modules import configs, distributed

    session = SimpleNamespace(boto_session=boto3.Session(region_name=REGION))
    source = str(ROOT / "entrypoints")
    theirs = ModelTrainer(
        training_image=IMAGE, role=ROLE, hyperparameters=LLAMA, sagemaker_session=session,
        source_code=configs.SourceCode(source_dir=source, entry_script="train.py"),
        compute=configs.Compute(instance_type="ml.p5.48xlarge", instance_count=2),
        distributed=distributed.Torchrun(smp=distributed.SMP(hybrid_shard_degree=8, context_parallel_degree=2)),
        stopping_condition=configs.StoppingCondition(max_runtime_in_seconds=7200),
        checkpoint_config=configs.CheckpointConfig(s3_uri=f"{BUCKET}/ckpt"),
        output_data_config=configs.OutputDataConfig(s3_output_path=f"{BUCKET}/out"),
        input_data_config=[configs.InputData(channel_name="train", data_source=configs.S3DataSource(
            s3_data_type="S3Prefix", s3_uri=f"{BUCKET}/train", s3_data_distribution_type="ShardedByS3Key"))])
    ours = smp_trainer(
        SMP(hybrid_shard_degree=8, context_parallel_degree=2),
        stopping_condition=StoppingCondition(max_runtime_in_seconds=7200),
        checkpoint_config=CheckpointConfig(s3_uri=f"{BUCKET}/ckpt"),
        input_data_config=[InputData(channel_name="train", data_source=S3DataSource(
            s3_data_type="S3Prefix", s3_uri=f"{BUCKET}/train", s3_data_distribution_type="ShardedByS3Key"))],
        sagemaker_session=session)
    assert theirs.dryrun(job_name="v3-1") == ours.dryrun(job_name="v3-1")
    request = ours.dryrun(job_name="v3-1")["CreateTrainingJob"]
    assert request["StoppingCondition"] == {"MaxRuntimeInSeconds": 7200}
    assert request["CheckpointConfig"] == {"S3Uri": f"{BUCKET}/ckpt", "LocalPath": "/opt/ml/checkpoints"}
    assert request["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3DataDistributionType"] == "ShardedByS3Key"


# --- dry run and plan --------------------------------------------------------------------------------
def test_dryrun_applies_the_v3_defaults_and_merges_train_channels(script, tmp_path):
    hp_file = tmp_path / "hp.yaml"
    hp_file.write_text("epochs: 2\narch: resnet18\n")
    trainer = ModelTrainer(training_image=IMAGE, role=ROLE, hyperparameters=str(hp_file),
                           sagemaker_session=SimpleNamespace(boto_session=boto3.Session(region_name=REGION)),
                           source_code=SourceCode(source_dir=str(script), entry_script="train.py"),
                           output_data_config=OutputDataConfig(s3_output_path=f"{BUCKET}/out"),
                           input_data_config=[InputData(channel_name="train", data_source=f"{BUCKET}/old")])
    request = trainer.dryrun([InputData(channel_name="train", data_source=f"{BUCKET}/new"),
                              InputData(channel_name="test", data_source=f"{BUCKET}/test")])["CreateTrainingJob"]
    # sagemaker.train.defaults: one ml.m5.xlarge, 30 GB, an hour, the image's repository as the job name
    assert request["ResourceConfig"] == {"InstanceType": "ml.m5.xlarge", "InstanceCount": 1, "VolumeSizeInGB": 30}
    assert request["StoppingCondition"] == {"MaxRuntimeInSeconds": 3600}
    assert request["HyperParameters"]["sagemaker_job_name"].startswith('"pytorch-training-job-')
    assert (request["HyperParameters"]["epochs"], request["HyperParameters"]["arch"]) == ("2", '"resnet18"')
    assert [(c["ChannelName"], c["DataSource"]["S3DataSource"]["S3Uri"], c["InputMode"])
            for c in request["InputDataConfig"]] == [("train", f"{BUCKET}/new", "File"),
                                                     ("test", f"{BUCKET}/test", "File")]
    assert "DebugHookConfig" not in request and request["ProfilerConfig"] == {"DisableProfiler": True}


def test_plan_is_the_estimators_plan_of_the_same_job():
    trainer = smp_trainer(SMP(hybrid_shard_degree=16, context_parallel_degree=2))
    estimator = PyTorch(entry_point="train.py", source_dir=str(ROOT / "entrypoints"), image_uri=IMAGE, role=ROLE,
                        instance_type="ml.p5.48xlarge", instance_count=2, hyperparameters=LLAMA,
                        distribution={"torch_distributed": {"enabled": True}, "smdistributed": {"modelparallel": {
                            "enabled": True, "parameters": {"hybrid_shard_degree": 16, "context_parallel_degree": 2}}}})
    ours, reference = trainer.plan(), estimator.plan()
    assert ours.fits and ours.memory.peak_gib == reference.memory.peak_gib
    assert ours.tokens_per_s == reference.tokens_per_s > 0




def test_the_restart_rules_are_model_trainer_keywords_that_reach_the_job():
    trainer = smp_trainer(SMP(hybrid_shard_degree=8), max_restarts=2, restart_on_job_errors=1)
    assert (trainer._args["max_restarts"], trainer._args["restart_on_job_errors"]) == (2, 1)
    assert trainer.estimator.job.config.restart_policy == RestartPolicy(2, (), 1)
    with pytest.raises(ConfigError, match="restart_on_exit_codes = \\[3\\]: is a rule for a script of your own"):
        smp_trainer(SMP(hybrid_shard_degree=8), restart_on_exit_codes=[3])  # it reached train.py's rules
    with pytest.raises(ConfigError, match="min_instance_count = 1: is refused on backend sagemaker"):
        smp_trainer(SMP(hybrid_shard_degree=8), max_restarts=1, min_instance_count=1)  # it reached the rules
    plain = smp_trainer(SMP(hybrid_shard_degree=8))._args  # control: the SDK's request
    assert not {"max_restarts", "restart_on_exit_codes", "restart_on_job_errors", "min_instance_count"} & set(plain)
