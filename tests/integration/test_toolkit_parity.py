"""The container against AWS's sagemaker-training toolkit (5.1.4, the reference, installed by the
test extra) on the same /opt/ml trees: the script's arguments and every SM_* variable it can read,
the torchrun command and the variables the ranks get (docs/container.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from container.toolkit.contract import read_training_env, sm_environment, to_cmd_args
from launcher.wire.hyperparameters import PROCESSES_PER_HOST, encode
from launcher.wire.opt_ml import write_opt_ml

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


# --- the launch: torchrun's command and the environment the ranks get ------------------------

# What the toolkit launches on a tree, computed in a process of its own as entry_point.run does
# it: the SM_* variables written into its environment, then the runner's command, whose
# TorchDistributedRunner._setup() sets the NCCL/EFA variables. The ranks inherit that environment.
TOOLKIT_LAUNCH = """
import json, os, sys
before = dict(os.environ)
from sagemaker_training import environment, runner
env = environment.Environment()
environment.write_env_vars(env.to_env_vars())
kind = runner.RunnerType[sys.argv[1]]
cmd = runner.get(kind, env.user_entry_point, env.to_cmd_args(), env.to_env_vars())._create_command()
print(json.dumps({"cmd": cmd, "before": before, "after": dict(os.environ)}))
"""

# Options only our torchrun gets (container/toolkit/bootstrap.py launch_command), on purpose:
# --log-dir and --redirects 3: every rank's output goes to a file, which container.toolkit.rank_logs
#   streams to the console unprefixed and reads the failing rank's traceback from;
# --shutdown-timeout: ranks get 100 s (torchrun: 30) to checkpoint after SIGTERM.
OURS_ONLY = {"--log-dir", "--redirects", "--shutdown-timeout"}
MASTER = ("--master_addr", "--master_port", "--node_rank")
# The variables the toolkit's launch decides for the ranks (the rest is the machine's environment).
LAUNCH_VARIABLES = ("NCCL_", "FI_", "RDMAV_")
# The job's own environment sets some of them; the toolkit overwrites them for torchrun jobs.
JOB_ENVIRONMENT = {"NCCL_PROTO": "LL128", "FI_PROVIDER": "tcp", "NCCL_SOCKET_IFNAME": "lo"}

# Heterogeneous clusters: instance group -> (instance type, hosts). torchrun spans only the hosts
# of the distribution group (sagemaker_distribution_instance_groups: train); AWS's PyTorch images
# run the script with plain python on the other hosts (sagemaker_pytorch_container.training.train
# picks the runner, a layer above the toolkit).
HETERO = {"data": ("ml.c5.18xlarge", ["algo-1"]), "train": ("ml.p4d.24xlarge", ["algo-2", "algo-3"])}
LAUNCHES = {
    # case: (instance type, hosts, current host, GPUs per host, torch_distributed?, instance groups)
    "p4d-two-hosts": ("ml.p4d.24xlarge", ["algo-1", "algo-2"], "algo-2", 8, True, None),
    "p5-two-hosts": ("ml.p5.48xlarge", ["algo-1", "algo-2"], "algo-1", 8, True, None),
    "g5-one-host": ("ml.g5.12xlarge", ["algo-1"], "algo-1", 4, True, None),
    "g5-python": ("ml.g5.12xlarge", ["algo-1"], "algo-1", 4, False, None),
    "p5-python": ("ml.p5.48xlarge", ["algo-1"], "algo-1", 8, False, None),
    "p4d-hetero": ("ml.p4d.24xlarge", ["algo-1", "algo-2", "algo-3"], "algo-3", 8, True, HETERO),
    "c5-hetero-outside": ("ml.c5.18xlarge", ["algo-1", "algo-2", "algo-3"], "algo-1", 0, True, HETERO),
}


def _fake_nvidia_smi(directory: Path, gpus: int) -> Path:
    """What `nvidia-smi --list-gpus` prints on a host with `gpus` GPUs: the toolkit counts the lines."""
    directory.mkdir(parents=True, exist_ok=True)
    tool = directory / "nvidia-smi"
    lines = "".join(f"echo 'GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i})'\n" for i in range(gpus))
    tool.write_text(f"#!/bin/sh\n{lines}")
    tool.chmod(0o755)
    return directory


def _launch_tree(tmp_path: Path, instance_type: str, hosts: list[str], current: str, distributed: bool,
                 groups: dict | None) -> Path:
    hps = {"sagemaker_program": "train.py", "sagemaker_submit_directory": "s3://b/j/source/sourcedir.tar.gz",
           "sagemaker_job_name": "j", "sagemaker_region": "us-west-2", "lr": 0.0001,
           "mp_parameters": {"hybrid_shard_degree": 8}}
    if distributed:
        hps["sagemaker_torch_distributed_enabled"] = True
    if groups:
        hps["sagemaker_distribution_instance_groups"] = ["train"]
    base = tmp_path / current / "opt" / "ml"
    write_opt_ml(base, hyperparameters=encode(hps), current_host=current, hosts=hosts,
                 instance_type=instance_type, channels={}, network_interface_name="ens5")
    if groups:  # as SageMaker writes it for a job with instance groups
        path = base / "input" / "config" / "resourceconfig.json"
        config = json.loads(path.read_text())
        config["current_group_name"] = next(g for g, (_, members) in groups.items() if current in members)
        config["instance_groups"] = [{"instance_group_name": g, "instance_type": t, "hosts": members}
                                     for g, (t, members) in groups.items()]
        path.write_text(json.dumps(config))
    (base / "code" / "train.py").write_text("")  # fetched already: the launch is what is compared
    return base


def _split(cmd: list[str], launcher: int) -> tuple[dict[str, str], list[str]]:
    """({--option: value}, [program, *args]) of a torchrun command after its first `launcher` words."""
    options, i = {}, launcher
    while cmd[i].startswith("--"):
        options[cmd[i]] = cmd[i + 1]
        i += 2
    return options, cmd[i:]


def _launch_variables(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(LAUNCH_VARIABLES)}


@pytest.mark.parametrize("case", list(LAUNCHES))
def test_the_launch_is_the_toolkits(tmp_path, monkeypatch, case):
    from container.toolkit.bootstrap import child_environment, launch_command

    instance_type, hosts, current, gpus, distributed, groups = LAUNCHES[case]
    base = _launch_tree(tmp_path, instance_type, hosts, current, distributed, groups)
    torchrun = distributed and (not groups or current in groups["train"][1])
    machine = {k: v for k, v in os.environ.items()
               if not k.startswith(("SM_", "SAGEMAKER_", "SMLAUNCH_", *LAUNCH_VARIABLES))}
    for name in set(os.environ) - set(machine):
        monkeypatch.delenv(name)
    for name, value in JOB_ENVIRONMENT.items():
        monkeypatch.setenv(name, value)
    toolkit_env = {**machine, **JOB_ENVIRONMENT, "SAGEMAKER_BASE_DIR": str(base),
                   "PATH": f"{_fake_nvidia_smi(tmp_path / 'bin', gpus)}{os.pathsep}{machine['PATH']}"}
    kind = "TorchDistributed" if torchrun else "Process"
    proc = subprocess.run([sys.executable, "-c", TOOLKIT_LAUNCH, kind], env=toolkit_env,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    theirs = json.loads(proc.stdout.splitlines()[-1])

    env = read_training_env(base, num_gpus=gpus)
    cmd = launch_command(env, tmp_path / "logs")
    if torchrun:
        assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]  # torchrun, on this interpreter
        assert theirs["cmd"][0] == "torchrun"
        ours_options, ours_program = _split(cmd, 3)
        their_options, their_program = _split(theirs["cmd"], 1)
        assert ours_program == their_program  # program and arguments
        assert set(ours_options) - set(their_options) - set(MASTER) == OURS_ONLY
        for option in OURS_ONLY:
            del ours_options[option]
        if len(hosts) == 1:
            # The toolkit passes no master options to a single host: torchrun's defaults,
            # 127.0.0.1:29500. Ours: 127.0.0.1 on a free port, so single-host jobs side by side
            # do not collide.
            assert not set(MASTER) & set(their_options)
            assert ours_options.pop("--master_addr") == "127.0.0.1" and ours_options.pop("--node_rank") == "0"
            assert int(ours_options.pop("--master_port")) > 0
        assert ours_options == their_options  # nnodes, nproc_per_node, master address and port, node rank
    else:
        # The toolkit ends the interpreter's options with `--` before the script; same effect.
        assert theirs["cmd"] == [sys.executable, "--", *cmd[1:]] and cmd[0] == sys.executable

    ours_env = child_environment(env)
    added = {k: v for k, v in theirs["after"].items() if theirs["before"].get(k) != v}
    # PYTHONPATH differs on purpose: ours puts the code directory first, the toolkit its sys.path.
    added.pop("PYTHONPATH")
    assert json.loads(ours_env.pop("SM_TRAINING_ENV")) == json.loads(added.pop("SM_TRAINING_ENV"))
    assert {k: ours_env.get(k) for k in added} == added
    assert _launch_variables(ours_env) == _launch_variables(theirs["after"])
    if torchrun:
        assert ours_env["NCCL_SOCKET_IFNAME"] == "ens5" and ours_env["NCCL_PROTO"] == "simple"
    else:  # a plain python job keeps the job's own values and gets no EFA settings
        assert _launch_variables(ours_env) == JOB_ENVIRONMENT


def test_the_efa_table_is_the_toolkits():
    """container.toolkit.torchrun_env's table against the toolkit's instance lists (exact names)."""
    import sagemaker_training

    from container.toolkit.torchrun_env import EFA_VARIABLES

    assert {t for t, v in EFA_VARIABLES.items() if v.get("FI_PROVIDER") == "efa"} == set(
        sagemaker_training.SM_EFA_NCCL_INSTANCES)
    rdma = {t for t, v in EFA_VARIABLES.items() if v.get("FI_EFA_USE_DEVICE_RDMA") == "1"}
    assert rdma == set(sagemaker_training.SM_EFA_RDMA_INSTANCES)
    assert {t for t, v in EFA_VARIABLES.items() if v.get("RDMAV_FORK_SAFE") == "1"} == rdma
