"""The container against AWS's sagemaker-training toolkit (5.1.4, the reference, installed by the
test extra) on the same /opt/ml trees: the script's arguments and every SM_* variable it can read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from container.contract import read_training_env, sm_environment, to_cmd_args
from launcher.contract import write_opt_ml
from launcher.wire import PROCESSES_PER_HOST, encode

pytest.importorskip("sagemaker_training")

# What the toolkit's Environment gives a script, computed in a process of its own: it reads
# SAGEMAKER_BASE_DIR when imported.
TOOLKIT = """
import json
from sagemaker_training import environment
env = environment.Environment()
print(json.dumps({"args": env.to_cmd_args(), "env": env.to_env_vars()}, default=str))
"""

JOBS = {
    "smp-v2-two-hosts": ({"sagemaker_program": "train.py", "sagemaker_submit_directory": "s3://b/j/source/sourcedir.tar.gz",
                          "sagemaker_torch_distributed_enabled": True, PROCESSES_PER_HOST: 2,
                          "sagemaker_job_name": "j", "sagemaker_region": "us-east-1",
                          "sagemaker_container_log_level": 20, "sagemaker_instance_type": "ml.p5.48xlarge",
                          "mp_parameters": {"hybrid_shard_degree": 8, "context_parallel_degree": 8},
                          "lr": 0.0001, "fp8": 1, "model_type": "llama_v3", "activation_checkpointing": True,
                          "hf_pretrained_model_name_or_dir": "meta-llama/Llama-3.1-8B"},
                         "ml.p5.48xlarge", ["algo-1", "algo-2"]),
    "user-script-one-host": ({"sagemaker_program": "cifar.py", "sagemaker_submit_directory": "s3://b/c/sourcedir.tar.gz",
                              "optimizer": "sgd", "epochs": 3, "momentum": 0.9, "nesterov": False, "layers": [1, 2],
                              "name": "resnet", "schedule": {"kind": "step", "gamma": 0.1}},
                             "ml.g5.xlarge", ["algo-1"]),
}


def _trees(tmp_path: Path, hps: dict, instance_type: str, hosts: list[str]) -> list[Path]:
    trees = []
    for host in hosts:
        base = tmp_path / host / "opt" / "ml"
        channel = tmp_path / "data" / "train"
        channel.mkdir(parents=True, exist_ok=True)
        write_opt_ml(base, hyperparameters=encode(hps), current_host=host, hosts=hosts,
                     instance_type=instance_type, channels={"train": channel})
        trees.append(base)
    return trees


@pytest.mark.parametrize("job", list(JOBS))
def test_script_sees_what_the_toolkit_gives_it(tmp_path, job):
    hps, instance_type, hosts = JOBS[job]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "SAGEMAKER_"))}
    for base in _trees(tmp_path, hps, instance_type, hosts):
        proc = subprocess.run([sys.executable, "-c", TOOLKIT], env={**env, "SAGEMAKER_BASE_DIR": str(base)},
                              capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr
        theirs = json.loads(proc.stdout.splitlines()[-1])
        ours = read_training_env(base, num_gpus=0)
        # the script's arguments: reserved keys (sagemaker_*, smlaunch's processes per host) never among them
        assert to_cmd_args(ours.user_hyperparameters) == theirs["args"]
        assert not any(arg.startswith("--sagemaker") for arg in theirs["args"])
        ours_env = sm_environment(ours)
        training_env = json.loads(theirs["env"].pop("SM_TRAINING_ENV"))
        assert json.loads(ours_env.pop("SM_TRAINING_ENV")) == training_env
        assert ours_env == theirs["env"]
