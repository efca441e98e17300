"""smlaunch's `PyTorch` against the official SageMaker SDK v2 (2.257.x, the `sagemaker` extra):
the same estimator arguments, one moto account, and the CreateTrainingJob requests compared field
by field, with the code upload's S3 parameters (encryption, expected owner).

The only differences allowed are listed in INTENDED (docs/sagemaker-request.md says why).
"""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import boto3
import pytest
import yaml

# found here, imported by the worker that runs these tests, not at every worker's collection (~1 CPU s)
for _package in ("sagemaker", "moto"):
    if importlib.util.find_spec(_package) is None:
        pytest.skip(f"{_package} (the sagemaker and test extras) is not installed", allow_module_level=True)

from tests.support.sdk_reference import ROLE, aws, differences, ours_submit, sdk_submit  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "configs" / "seed"
BUCKET = "s3://parity-bucket"


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def seed_run(name: str) -> tuple[dict, dict]:
    """A seed job file as estimator arguments (read here with PyYAML) and its fit inputs."""
    data = yaml.safe_load((SEED / f"{name}.yaml").read_text())
    parent = data.pop("extends", None)
    while parent:
        base = yaml.safe_load((SEED / parent).read_text())
        parent = base.pop("extends", None)
        data = _merge(base, data)
    data.pop("region")  # the session's, for both
    inputs = data.pop("inputs")
    data["source_dir"] = str((SEED / data["source_dir"]).resolve())
    return data, inputs


def script(tmp: Path) -> str:
    code = tmp / "code"
    code.mkdir(exist_ok=True)
    (code / "cifar.py").write_text("import argparse\nprint('epoch=1 loss=0.5')\n")
    return str(code)


def user_job(tmp: Path, **changes) -> dict:
    args = {"entry_point": "cifar.py", "source_dir": script(tmp), "role": ROLE, "instance_type": "ml.g5.xlarge",
            "instance_count": 1, "framework_version": "2.5.1", "py_version": "py311",
            "hyperparameters": {"optimizer": "sgd", "epochs": 3, "momentum": 0.9, "nesterov": False,
                                "arch": "resnet18", "schedule": {"kind": "step", "gamma": 0.1}},
            "output_path": f"{BUCKET}/output/"}
    args.update(changes)
    return args


def sdk_objects():
    from sagemaker.debugger import (
        CollectionConfig,
        DebuggerHookConfig,
        ProfilerConfig,
        ProfilerRule,
        Rule,
        TensorBoardOutputConfig,
        rule_configs,
    )
    from sagemaker.inputs import TrainingInput
    from sagemaker.instance_group import InstanceGroup

    return {"CollectionConfig": CollectionConfig, "DebuggerHookConfig": DebuggerHookConfig,
            "ProfilerConfig": ProfilerConfig, "ProfilerRule": ProfilerRule, "Rule": Rule,
            "TensorBoardOutputConfig": TensorBoardOutputConfig, "rule_configs": rule_configs,
            "TrainingInput": TrainingInput, "InstanceGroup": InstanceGroup}


def _smp_v1(tmp: Path) -> dict:
    # The seed's SMP v1 sharded data parallelism (MiCS) job: PyTorch 1.13.1 and mpirun.
    return user_job(tmp, instance_type="ml.p4d.24xlarge", instance_count=2, framework_version="1.13.1",
                    py_version="py39", distribution={
                        "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
                            "ddp": True, "sharded_data_parallel_degree": 16, "bf16": True,
                            "sdp_hierarchical_allgather": False}}},
                        "mpi": {"enabled": True, "processes_per_host": 8,
                                "custom_mpi_options": "-verbose -x NCCL_DEBUG=VERSION"}})


def _groups(o, tmp: Path) -> dict:
    train = o["InstanceGroup"]("train", "ml.p4d.24xlarge", 2)
    data = o["InstanceGroup"]("data", "ml.c5.18xlarge", 1)
    return user_job(tmp, instance_type=None, instance_count=None, instance_groups=[data, train],
                    distribution={"mpi": {"enabled": True}, "instance_groups": [train]})


# name -> (arguments, fit inputs, fit keywords); `o` holds the SDK's classes.
CONFIGS = {
    "seed-p4d-no-cp": lambda o, tmp: (*seed_run("p4d-no-cp"), {}),
    "seed-p4d-cp8": lambda o, tmp: (*seed_run("p4d-cp8"), {}),
    "seed-p5-cp8-bf16": lambda o, tmp: (*seed_run("p5-cp8-bf16"), {}),
    "seed-p5-cp8-fp8": lambda o, tmp: (*seed_run("p5-cp8-fp8"), {}),
    "smp-v1-sharded-data-parallel": lambda o, tmp: (_smp_v1(tmp), {"train": f"{BUCKET}/train"}, {}),
    "user-script": lambda o, tmp: (user_job(tmp), {"training": f"{BUCKET}/cifar"}, {}),
    "user-script-torchrun": lambda o, tmp: (
        user_job(tmp, instance_type="ml.g5.12xlarge", instance_count=2,
                 distribution={"torch_distributed": {"enabled": True}}), f"{BUCKET}/cifar", {}),
    "pytorchddp": lambda o, tmp: (
        user_job(tmp, instance_type="ml.p4d.24xlarge", instance_count=2, framework_version="2.2.0", py_version="py310",
                 distribution={"pytorchddp": {"enabled": True}}), None, {}),
    "smddp": lambda o, tmp: (
        user_job(tmp, instance_type="ml.p4d.24xlarge", instance_count=2, framework_version="2.2.0", py_version="py310",
                 distribution={"smdistributed": {"dataparallel": {"enabled": True,
                                                                  "custom_mpi_options": "-verbose"}}}), None, {}),
    "mpi": lambda o, tmp: (
        user_job(tmp, instance_type="ml.g5.12xlarge", instance_count=2,
                 distribution={"mpi": {"enabled": True, "processes_per_host": 4}}), None, {}),
    "vpc": lambda o, tmp: (user_job(tmp, subnets=["subnet-1", "subnet-2"], security_group_ids=["sg-1"]), None, {}),
    "encrypted-traffic": lambda o, tmp: (user_job(tmp, encrypt_inter_container_traffic=True), None, {}),
    "network-isolation": lambda o, tmp: (user_job(tmp, enable_network_isolation=True),
                                         {"train": f"{BUCKET}/train"}, {}),
    "retries": lambda o, tmp: (user_job(tmp, max_retry_attempts=3), None, {}),
    "uncompressed-output": lambda o, tmp: (user_job(tmp, disable_output_compression=True), None, {}),
    "kms-keys": lambda o, tmp: (user_job(tmp, volume_kms_key="arn:aws:kms:us-east-1:111122223333:key/v",
                                         output_kms_key="arn:aws:kms:us-east-1:111122223333:key/o"), None, {}),
    "kms-code-elsewhere": lambda o, tmp: (
        user_job(tmp, output_kms_key="arn:aws:kms:us-east-1:111122223333:key/o",
                 code_location="s3://other-code-bucket/code"), None, {}),
    "default-bucket-kms": lambda o, tmp: (
        user_job(tmp, output_path=None, output_kms_key="arn:aws:kms:us-east-1:111122223333:key/o"), None, {}),
    "log-level-and-metrics-off": lambda o, tmp: (
        user_job(tmp, container_log_level=10, enable_sagemaker_metrics=False), None, {}),
    "tensorboard": lambda o, tmp: (
        user_job(tmp, tensorboard_output_config=o["TensorBoardOutputConfig"](
            f"{BUCKET}/tb", container_local_output_path="/opt/ml/output/tensorboard")), None, {}),
    "debugger-off": lambda o, tmp: (user_job(tmp, debugger_hook_config=False), None, {}),
    "debugger-rules": lambda o, tmp: (
        user_job(tmp, rules=[o["Rule"].sagemaker(o["rule_configs"].vanishing_gradient()),
                             o["Rule"].sagemaker(o["rule_configs"].loss_not_decreasing())],
                 debugger_hook_config=o["DebuggerHookConfig"](
                     hook_parameters={"save_interval": "100"},
                     collection_configs=[o["CollectionConfig"]("weights", {"save_interval": "50"})])), None, {}),
    "profiler": lambda o, tmp: (
        user_job(tmp, profiler_config=o["ProfilerConfig"](system_monitor_interval_millis=500),
                 rules=[o["ProfilerRule"].sagemaker(o["rule_configs"].ProfilerReport())]), None, {}),
    "profiler-off": lambda o, tmp: (user_job(tmp, disable_profiler=True), None, {}),
    "checkpoints-turn-the-hook-off": lambda o, tmp: (
        user_job(tmp, checkpoint_s3_uri=f"{BUCKET}/ckpt", checkpoint_local_path="/opt/ml/checkpoints"), None, {}),
    "spot": lambda o, tmp: (user_job(tmp, use_spot_instances=True, max_wait=7200, max_run=3600,
                                     checkpoint_s3_uri=f"{BUCKET}/ckpt"), None, {}),
    "channels": lambda o, tmp: (
        user_job(tmp, input_mode="FastFile"),
        {"train": o["TrainingInput"](f"{BUCKET}/train", distribution="ShardedByS3Key",
                                     content_type="application/x-parquet"),
         "val": o["TrainingInput"](f"{BUCKET}/val", input_mode="File")}, {}),
    "environment-tags-base-name": lambda o, tmp: (
        user_job(tmp, environment={"NCCL_DEBUG": "INFO", "HF_HOME": "/tmp/hf"},
                 tags=[{"Key": "team", "Value": "nlp"}], base_job_name="cifar-exp",
                 keep_alive_period_in_seconds=600, volume_size=100, max_run=7200), None, {}),
    "private-registry": lambda o, tmp: (
        user_job(tmp, image_uri="111122223333.dkr.ecr.us-east-1.amazonaws.com/mine:1",
                 framework_version=None, py_version=None, subnets=["subnet-1"], security_group_ids=["sg-1"],
                 training_repository_access_mode="Vpc",
                 training_repository_credentials_provider_arn="arn:aws:lambda:us-east-1:111122223333:function:f"),
        None, {}),
    "model-channel": lambda o, tmp: (user_job(tmp, model_uri=f"{BUCKET}/model/model.tar.gz",
                                              model_channel_name="pretrained"), None, {}),
    "container-overrides": lambda o, tmp: (
        user_job(tmp, enable_infra_check=True, enable_remote_debug=True, enable_session_tag_chaining=True,
                 container_entry_point=["python", "cifar.py"], container_arguments=["--fast"],
                 training_plan="arn:aws:sagemaker:us-east-1:111122223333:training-plan/p",
                 instance_placement_config={"EnableMultipleJobs": True}), None, {}),
    "experiment": lambda o, tmp: (user_job(tmp), None,
                                  {"experiment_config": {"ExperimentName": "exp", "TrialName": "trial-1"}}),
    "heterogeneous-cluster": lambda o, tmp: (_groups(o, tmp), None, {}),
    "cpu-instance": lambda o, tmp: (user_job(tmp, instance_type="ml.m5.xlarge", py_version="py311"), None, {}),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_request_matches_the_sdk(name, tmp_path, monkeypatch):
    with aws(monkeypatch):
        s3 = boto3.client("s3", region_name="us-east-1")
        for bucket in ("parity-bucket", "other-code-bucket", "sagemaker-us-east-1-111122223333"):
            s3.create_bucket(Bucket=bucket)
        args, inputs, fit = CONFIGS[name](sdk_objects(), tmp_path)
        args = {k: v for k, v in args.items() if v is not None}
        theirs = sdk_submit(copy.deepcopy(args), inputs, **fit)
        ours = ours_submit(args, inputs, **fit)
    assert theirs.request, "the SDK sent no request"
    diffs = [d for d in differences(comparable(ours.request), comparable(theirs.request))
             if not d.startswith(INTENDED)]
    assert diffs == [], "\n".join(diffs)
    assert ours.upload == theirs.upload


def comparable(request: dict) -> dict:
    """Hyperparameters as the container reads them (json.loads: the key order inside
    mp_parameters means nothing), and Debugger collections in name order (the SDK keeps them in
    a set, so its order changes from run to run)."""
    out = copy.deepcopy(request)
    out["HyperParameters"] = {k: json.loads(v) for k, v in out.get("HyperParameters", {}).items()}
    hook = out.get("DebugHookConfig")
    if hook:
        hook["CollectionConfigurations"].sort(key=lambda c: c["CollectionName"])
    return out


# smlaunch's metric definitions for its own runtime (the seed's runs); nothing else.
INTENDED = ("AlgorithmSpecification.MetricDefinitions: extra in ours",)


# max_restarts, which the SDK lacks: smlaunch's request names its restart loop as the program, leaves
# torch_distributed out and carries the budget (launcher.wire.restart_loop, docs/sagemaker-request.md).
RESTART_LOOP_DIFFERENCES = [
    "HyperParameters.sagemaker_program: '_smlaunch/restart_loop.py' != SDK {program!r}",
    "HyperParameters.sagemaker_smlaunch_restart_loop: extra in ours ({{'max_restarts': 2, 'replaced': "
    "{{'sagemaker_program': {program!r}, 'sagemaker_torch_distributed_enabled': True}}}})",
    "HyperParameters.sagemaker_torch_distributed_enabled: missing in ours (SDK: True)",
]


@pytest.mark.parametrize("name, program", [("seed-p5-cp8-bf16", "train.py"), ("user-script-torchrun", "cifar.py")])
def test_max_restarts_differs_only_in_the_restart_loop(name, program, tmp_path, monkeypatch):
    with aws(monkeypatch):
        s3 = boto3.client("s3", region_name="us-east-1")
        for bucket in ("parity-bucket", "sagemaker-us-east-1-111122223333"):
            s3.create_bucket(Bucket=bucket)
        args, inputs, fit = CONFIGS[name](sdk_objects(), tmp_path)
        args = {k: v for k, v in args.items() if v is not None}
        theirs = sdk_submit(copy.deepcopy(args), inputs, **fit)
        ours = ours_submit({**args, "max_restarts": 2}, inputs, **fit)
    diffs = [d for d in differences(comparable(ours.request), comparable(theirs.request))
             if not d.startswith(INTENDED)]
    assert diffs == [line.format(program=program) for line in RESTART_LOOP_DIFFERENCES]
    assert ours.upload == theirs.upload
