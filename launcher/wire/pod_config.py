"""What a Kubernetes pod of a smlaunch job reads to become one SageMaker host (issue 42): the
client renders it into the job's ConfigMap and Secret (launcher.kubernetes.manifest), and the pod's
entry (container.toolkit.pod) writes the host's /opt/ml tree from it and from the variables Kubeflow
Trainer's torch runtime sets in every pod of the TrainJob's JobSet.

A pod of a HyperPodPyTorchJob (launcher.kubernetes.hyperpod) learns its place differently: HyperPod's
training operator sets no rank in the pod's environment; it tells the pod's HyperPod elastic agent
(`hyperpodrun`, the container's command) the node rank, node count and master at its /start call,
and the agent starts smlaunch's entry as its one worker with torch elastic's worker variables
(GROUP_RANK, GROUP_WORLD_SIZE, MASTER_ADDR, MASTER_PORT). The manifest says which of the two the pod
runs under (LAUNCHER_ENV).

The pod's host is `algo-<node rank + 1>` of `algo-1..N`, as SageMaker names a job's hosts, so the
same hosts, current host and rank reach the bootstrap as on SageMaker, locally and on Slurm.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from launcher.wire.opt_ml import host_name, host_names

CONFIG_DIR = "/etc/smlaunch"  # where the job's ConfigMap is mounted in each pod
CONFIG_FILE = "pod.json"  # its key: the job's hosts' shared part (hyperparameters, channels, where /opt/ml goes)
SOURCE_ARCHIVE = "sourcedir.tar.gz"  # its binary key: the job's code archive (sagemaker_submit_directory)
CONFIG_DIR_ENV = "SMLAUNCH_POD_CONFIG"  # overrides CONFIG_DIR (tests run pods as processes)
# On S3 storage (pod.json's "s3": the job's prefixes): the pod's own disk, an emptyDir, holds its
# /opt/ml tree (`hosts/<host>`), its channels' downloads and its checkpoints, mirrored to S3.
SCRATCH_DIR = "/opt/smlaunch"
SCRATCH_DIR_ENV = "SMLAUNCH_POD_SCRATCH"  # overrides SCRATCH_DIR (tests run two pods on one machine)
# Below the job's S3 prefix: each host's output data (metrics.jsonl, progress.json, restarts, goodput)
# as a job directory holds it, so the client reads them as it reads a Slurm job's.
RECORDS_PREFIX = "hosts"
# The job's secret-named hyperparameters (JSON), from the job's Secret: never in the ConfigMap.
SECRET_HYPERPARAMETERS_ENV = "SMLAUNCH_SECRET_HYPERPARAMETERS"
SECRET_HYPERPARAMETERS_KEY = "hyperparameters.json"  # their key in the Secret

# Set by Kubeflow Trainer's torch plugin in the trainer container `node` of every trainer pod
# (kubeflow/trainer v2.3.0, pkg/runtime/framework/plugins/torch/torch.go and pkg/constants/constants.go):
# PET_NNODES (numNodes), PET_NPROC_PER_NODE, PET_NODE_RANK (from the pod's annotation
# batch.kubernetes.io/job-completion-index), PET_MASTER_ADDR `<trainjob>-node-0-0.<trainjob>` (the
# first pod in the JobSet's headless service) and PET_MASTER_PORT 29500. Kubernetes' Job controller
# also sets the index of an Indexed Job's pod as JOB_COMPLETION_INDEX.
NNODES_ENV = "PET_NNODES"
NODE_RANK_ENV = "PET_NODE_RANK"
MASTER_ADDR_ENV = "PET_MASTER_ADDR"
MASTER_PORT_ENV = "PET_MASTER_PORT"
COMPLETION_INDEX_ENV = "JOB_COMPLETION_INDEX"
# The names the torch plugin reserves: a TrainJob whose trainer env sets one is refused by its webhook.
RESERVED_ENV = (NNODES_ENV, "PET_NPROC_PER_NODE", NODE_RANK_ENV, MASTER_ADDR_ENV, MASTER_PORT_ENV)

# Which launcher the pod's entry runs under: unset, Kubeflow Trainer's torch runtime (the PET_*
# variables); HYPERPODRUN, a worker of HyperPod's elastic agent (torch elastic's worker variables,
# as hyperpod_elastic_agent's HyperPodElasticAgent sets them from the operator's /start call).
LAUNCHER_ENV = "SMLAUNCH_POD_LAUNCHER"
HYPERPODRUN = "hyperpodrun"
GROUP_RANK_ENV = "GROUP_RANK"  # the node rank the operator gave the agent
GROUP_WORLD_SIZE_ENV = "GROUP_WORLD_SIZE"  # the node count
WORKER_MASTER_ADDR_ENV = "MASTER_ADDR"  # the rank-0 pod's address, from the operator
WORKER_MASTER_PORT_ENV = "MASTER_PORT"
# The node count hyperpodrun's rendezvous backend reads from the pod's environment when it starts.
HYPERPOD_NNODES_ENV = "NNODES"
HYPERPOD_ENV = (HYPERPOD_NNODES_ENV, LAUNCHER_ENV)  # what a HyperPodPyTorchJob's manifest sets in every pod


# All of torch elastic's worker variables hyperpodrun gives its worker (hyperpod_elastic_agent's
# HyperPodElasticAgent._start_workers): read once for the pod's place, then not the bootstrap's to see.
# A script the bootstrap runs without torchrun would otherwise take the pod for a rank of a world of pods.
WORKER_VARIABLES = ("LOCAL_RANK", "RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
                    "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "JOB_RESTART_COUNT",
                    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
                    "TORCHELASTIC_USE_AGENT_STORE")


class PodPlace(NamedTuple):
    """Where a pod is in its job: the hosts, its own, and the master torchrun meets at."""

    hosts: list[str]
    host: str
    master_addr: str | None
    master_port: str | None


class PodEnvError(ValueError):
    """The pod's environment does not say which host of how many it is."""


def pod_hosts(env: Mapping[str, str]) -> tuple[list[str], str]:
    """(hosts, this pod's host) from the launcher's variables; PodEnvError naming the variable."""
    place = pod_place(env)
    return place.hosts, place.host


def launcher_variables(env: Mapping[str, str]) -> list[str]:
    """The variables in `env` that the pod's launcher set for its worker, and the bootstrap must not see."""
    return [name for name in WORKER_VARIABLES if name in env] if env.get(LAUNCHER_ENV) == HYPERPODRUN else []


def pod_place(env: Mapping[str, str]) -> PodPlace:
    """The pod's PodPlace from the variables of the launcher it runs under (LAUNCHER_ENV)."""
    if env.get(LAUNCHER_ENV) == HYPERPODRUN:
        names = (GROUP_WORLD_SIZE_ENV, GROUP_RANK_ENV, WORKER_MASTER_ADDR_ENV, WORKER_MASTER_PORT_ENV)
        where = "as a worker of hyperpodrun (HyperPod's elastic agent) in a HyperPodPyTorchJob, which sets it"
    else:
        rank = NODE_RANK_ENV if NODE_RANK_ENV in env else COMPLETION_INDEX_ENV
        names = (NNODES_ENV, rank, MASTER_ADDR_ENV, MASTER_PORT_ENV)
        where = "in a TrainJob of Kubeflow Trainer's torch runtime, which sets it"
    nodes_var, rank_var, addr_var, port_var = names
    nodes, rank = _number(env, nodes_var, where), _number(env, rank_var, where)
    if nodes < 1 or rank >= nodes:
        raise PodEnvError(f"{rank_var}={rank} is not a node of {nodes_var}={nodes}: the pod must run {where}")
    return PodPlace(host_names(nodes), host_name(rank), env.get(addr_var), env.get(port_var))


def _number(env: Mapping[str, str], name: str, where: str) -> int:
    value = env.get(name)
    if value is None or not value.isdigit():
        raise PodEnvError(f"{name}={value!r} is not a whole number: the pod must run {where}")
    return int(value)
