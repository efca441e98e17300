"""The /opt/ml tree (launcher.wire.opt_ml) and the SM_* environment derived from it (container.toolkit.contract).

Expected values are spelled out from the sagemaker-training toolkit's documented rules
(environment.Environment.to_env_vars, mapping.to_env_vars / to_cmd_args), not computed with the
code under test: strings stay as they are, everything else is compact JSON with sorted keys.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import launcher.wire.opt_ml as writer
from container.toolkit.contract import read_training_env, sm_environment, to_cmd_args
from launcher.wire.hyperparameters import encode
from launcher.wire.opt_ml import write_opt_ml

SOURCE = "s3://bucket/job-1/source/sourcedir.tar.gz"
MP = {"hybrid_shard_degree": 8, "context_parallel_degree": 2}


def compact(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


@pytest.fixture
def channels(tmp_path: Path) -> dict[str, Path]:
    train = tmp_path / "data" / "train"
    (train / "shards").mkdir(parents=True)
    (train / "a.jsonl").write_text('{"input_ids": [1, 2]}\n')
    (train / "shards" / "b.jsonl").write_text('{"input_ids": [3]}\n')
    test_file = tmp_path / "data" / "test.jsonl"
    test_file.write_text("{}\n")
    return {"train": train, "test": test_file}


@pytest.fixture
def tree(tmp_path: Path, channels) -> Path:
    base = tmp_path / "opt" / "ml"
    hps = {
        "lr": 0.1, "epochs": 3, "model": "llama", "fp8": True, "mp_parameters": MP,
        "sagemaker_program": "train.py", "sagemaker_submit_directory": SOURCE,
        "sagemaker_container_log_level": 20, "sagemaker_job_name": "job-1",
        "sagemaker_region": "us-west-2", "sagemaker_torch_distributed_enabled": True,
        "sagemaker_distributed_dataparallel_enabled": False,
        "sagemaker_instance_type": "ml.p5.48xlarge", "sagemaker_smlaunch_processes_per_host": 2,
    }
    write_opt_ml(base, hyperparameters=encode(hps), current_host="algo-2",
                 hosts=["algo-2", "algo-1"], instance_type="ml.p5.48xlarge", channels=channels)
    return base


def test_tree_is_what_sagemaker_writes(tree: Path):
    config = tree / "input" / "config"
    resource = json.loads((config / "resourceconfig.json").read_text())
    assert resource == {
        "current_host": "algo-2",
        "current_instance_type": "ml.p5.48xlarge",
        "current_group_name": "homogeneousCluster",
        "hosts": ["algo-1", "algo-2"],
        "instance_groups": [{"instance_group_name": "homogeneousCluster",
                             "instance_type": "ml.p5.48xlarge", "hosts": ["algo-1", "algo-2"]}],
        "network_interface_name": "eth0",
    }
    data = json.loads((config / "inputdataconfig.json").read_text())
    assert data == {name: {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated",
                           "RecordWrapperType": "None"} for name in ("test", "train")}
    hps = json.loads((config / "hyperparameters.json").read_text())
    assert hps["lr"] == "0.1" and hps["model"] == '"llama"' and hps["fp8"] == "true"
    for sub in ("model", "output/data", "checkpoints", "code"):
        assert (tree / sub).is_dir()
    assert (tree / "input/data/train/a.jsonl").read_text().startswith('{"input_ids"')
    assert (tree / "input/data/train/shards/b.jsonl").is_file()
    assert (tree / "input/data/test/test.jsonl").is_file()


def test_big_channel_files_are_symlinked(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(writer, "COPY_LIMIT_BYTES", 10)
    src = tmp_path / "src"
    src.mkdir()
    (src / "small").write_text("0123456789")
    (src / "big").write_text("0123456789A")
    write_opt_ml(tmp_path / "ml", hyperparameters={}, current_host="algo-1", hosts=["algo-1"],
                 instance_type="local", channels={"train": src})
    dest = tmp_path / "ml" / "input" / "data" / "train"
    assert not (dest / "small").is_symlink() and (dest / "small").read_text() == "0123456789"
    assert (dest / "big").is_symlink() and (dest / "big").resolve() == (src / "big").resolve()


def test_writer_rejects_bad_input(tmp_path: Path):
    common = {"instance_type": "local", "channels": {}}
    with pytest.raises(TypeError, match="JSON-encoded"):
        write_opt_ml(tmp_path, hyperparameters={"lr": 0.1}, current_host="algo-1",
                     hosts=["algo-1"], **common)
    with pytest.raises(ValueError, match="not one of hosts"):
        write_opt_ml(tmp_path, hyperparameters={}, current_host="algo-3",
                     hosts=["algo-1", "algo-2"], **common)
    with pytest.raises(FileNotFoundError):
        write_opt_ml(tmp_path, hyperparameters={}, current_host="algo-1", hosts=["algo-1"],
                     instance_type="local", channels={"train": tmp_path / "missing"})


def test_sm_environment_matches_the_toolkit(tree: Path, monkeypatch):
    for name in ("SAGEMAKER_PROGRAM", "SAGEMAKER_TRAINING_MODULE", "TRAINING_JOB_NAME"):
        monkeypatch.delenv(name, raising=False)
    env = sm_environment(read_training_env(tree, num_gpus=0))
    base = str(tree)
    user = {"epochs": 3, "fp8": True, "lr": 0.1, "model": "llama", "mp_parameters": MP}
    framework = {"sagemaker_distributed_dataparallel_enabled": False,
                 "sagemaker_instance_type": "ml.p5.48xlarge",
                 "sagemaker_torch_distributed_enabled": True, "sagemaker_smlaunch_processes_per_host": 2}
    resource = json.loads((tree / "input/config/resourceconfig.json").read_text())
    data = json.loads((tree / "input/config/inputdataconfig.json").read_text())
    user_args = ["--epochs", "3", "--fp8", "True", "--lr", "0.1", "--model", "llama",
                 "--mp_parameters", "context_parallel_degree=2,hybrid_shard_degree=8"]
    expected = {
        "SM_HP_LR": "0.1", "SM_HP_EPOCHS": "3", "SM_HP_MODEL": "llama", "SM_HP_FP8": "true",
        "SM_HP_MP_PARAMETERS": '{"context_parallel_degree":2,"hybrid_shard_degree":8}',
        "SM_HPS": compact(user),
        "SM_HOSTS": '["algo-1","algo-2"]',
        "SM_CURRENT_HOST": "algo-2",
        "SM_CURRENT_INSTANCE_TYPE": "ml.p5.48xlarge",
        "SM_CURRENT_INSTANCE_GROUP": "homogeneousCluster",
        "SM_CURRENT_INSTANCE_GROUP_HOSTS": '["algo-1","algo-2"]',
        "SM_INSTANCE_GROUPS": '["homogeneousCluster"]',
        "SM_INSTANCE_GROUPS_DICT": compact({"homogeneousCluster": resource["instance_groups"][0]}),
        "SM_DISTRIBUTION_INSTANCE_GROUPS": '["homogeneousCluster"]',
        "SM_IS_HETERO": "false",
        "SM_NUM_GPUS": "0",
        "SM_NUM_CPUS": str(os.cpu_count()),
        "SM_NUM_NEURONS": "0",
        "SM_CHANNELS": '["test","train"]',
        "SM_CHANNEL_TRAIN": f"{base}/input/data/train",
        "SM_CHANNEL_TEST": f"{base}/input/data/test",
        "SM_MODEL_DIR": f"{base}/model",
        "SM_OUTPUT_DATA_DIR": f"{base}/output/data",
        "SM_OUTPUT_DIR": f"{base}/output",
        "SM_OUTPUT_INTERMEDIATE_DIR": f"{base}/output/intermediate",
        "SM_INPUT_DIR": f"{base}/input",
        "SM_INPUT_CONFIG_DIR": f"{base}/input/config",
        "SM_NETWORK_INTERFACE_NAME": "eth0",
        "SM_MODULE_NAME": "train",
        "SM_MODULE_DIR": SOURCE,
        "SM_USER_ENTRY_POINT": "train.py",
        "SM_LOG_LEVEL": "20",
        "SM_FRAMEWORK_MODULE": "",
        "SM_FRAMEWORK_PARAMS": compact(framework),
        "SM_RESOURCE_CONFIG": compact(resource),
        "SM_INPUT_DATA_CONFIG": compact(data),
        "SM_USER_ARGS": compact(user_args),
    }
    training_env = json.loads(env.pop("SM_TRAINING_ENV"))
    assert env == expected

    # SM_TRAINING_ENV is dict(Environment()): every public property of the toolkit's class.
    assert sorted(training_env) == sorted([
        "additional_framework_parameters", "channel_input_dirs", "current_host",
        "current_instance_group", "current_instance_group_hosts", "current_instance_type",
        "distribution_hosts", "distribution_instance_groups", "framework_module", "hosts",
        "hyperparameters", "input_config_dir", "input_data_config", "input_dir",
        "instance_groups", "instance_groups_dict", "is_hetero", "is_master",
        "is_modelparallel_enabled", "is_smddpmprun_installed", "is_smddprun_installed", "job_name", "log_level",
        "master_hostname", "model_dir", "module_dir", "module_name", "network_interface_name",
        "num_cpus", "num_gpus", "num_neurons", "output_data_dir", "output_dir",
        "output_intermediate_dir", "resource_config", "topology", "user_entry_point",
    ])
    assert training_env["hyperparameters"] == user
    assert training_env["additional_framework_parameters"] == framework
    assert training_env["channel_input_dirs"] == {"train": f"{base}/input/data/train",
                                                  "test": f"{base}/input/data/test"}
    assert training_env["master_hostname"] == "algo-1" and training_env["is_master"] is False
    assert training_env["distribution_hosts"] == ["algo-1", "algo-2"]
    assert training_env["is_modelparallel_enabled"] is None  # SageMaker sets no SM_HP_* for the toolkit
    assert training_env["job_name"] is None and training_env["log_level"] == 20


def test_hyperparameters_decode_like_the_toolkit(tmp_path: Path, monkeypatch):
    # Hand-written (not JSON-encoded) values fall back to the raw string.
    monkeypatch.delenv("SAGEMAKER_PROGRAM", raising=False)
    write_opt_ml(tmp_path, hyperparameters={"model": "llama", "bad": "[1, 2", "n": "8",
                                            "quoted": '"8"', "on": "true"},
                 current_host="algo-1", hosts=["algo-1"], instance_type="local", channels={})
    env = read_training_env(tmp_path, num_gpus=0)
    assert env.user_hyperparameters == {"model": "llama", "bad": "[1, 2", "n": 8, "quoted": "8",
                                        "on": True}
    sm = sm_environment(env)
    assert sm["SM_HP_N"] == "8" and sm["SM_HP_QUOTED"] == "8" and sm["SM_HP_ON"] == "true"
    # No program and no submit directory: what the toolkit reports then.
    assert sm["SM_USER_ENTRY_POINT"] == "" and sm["SM_MODULE_NAME"] == "None"
    assert sm["SM_MODULE_DIR"] == str(tmp_path / "code")
    assert sm["SM_DISTRIBUTION_INSTANCE_GROUPS"] == "[]"


def test_sagemaker_program_env_overrides_the_hyperparameter(tree: Path, monkeypatch):
    monkeypatch.setenv("SAGEMAKER_PROGRAM", "baked.py")
    sm = sm_environment(read_training_env(tree, num_gpus=8))
    assert sm["SM_USER_ENTRY_POINT"] == "baked.py" and sm["SM_MODULE_NAME"] == "baked"
    assert sm["SM_NUM_GPUS"] == "8"


def test_to_cmd_args_rules():
    args = to_cmd_args({
        "zeta": 1, "alpha": True, "beta": False, "mp": {"b": 2, "a": True},
        "lst": [1, "x"], "lr": 0.1, "name": "llama", "k": 5, "none": None,
    })
    assert args == [
        "--alpha", "True", "--beta", "False", "-k", "5", "--lr", "0.1",
        "--lst", "[1, 'x']", "--mp", "a=True,b=2", "--name", "llama", "--none", "",
        "--zeta", "1",
    ]
    assert to_cmd_args({}) == []
