"""What a Kubernetes pod of a smlaunch job reads to become one SageMaker host (issue 42): the
client renders it into the job's ConfigMap and Secret (launcher.kubernetes.manifest), and the pod's
entry (container.toolkit.pod) writes the host's /opt/ml tree from it and from the variables Kubeflow
Trainer's torch runtime sets in every pod of the TrainJob's JobSet.

The pod's host is `algo-<node rank + 1>` of `algo-1..N`, as SageMaker names a job's hosts, so the
same hosts, current host and rank reach the bootstrap as on SageMaker, locally and on Slurm.
"""

from __future__ import annotations

from collections.abc import Mapping

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

# Set by Kubeflow Trainer's torch plugin in every trainer pod (torchrun's PET_* variables); the
# node rank is the JobSet's completion index, which Kubernetes also sets as JOB_COMPLETION_INDEX.
NNODES_ENV = "PET_NNODES"
NODE_RANK_ENV = "PET_NODE_RANK"
MASTER_ADDR_ENV = "PET_MASTER_ADDR"  # the first pod's name in the JobSet's headless service
MASTER_PORT_ENV = "PET_MASTER_PORT"
COMPLETION_INDEX_ENV = "JOB_COMPLETION_INDEX"


class PodEnvError(ValueError):
    """The pod's environment does not say which host of how many it is."""


def host_name(index: int) -> str:
    return f"algo-{index + 1}"


def pod_hosts(env: Mapping[str, str]) -> tuple[list[str], str]:
    """(hosts, this pod's host) from the runtime's variables; PodEnvError naming the variable."""
    nodes = _number(env, NNODES_ENV)
    rank_var = NODE_RANK_ENV if NODE_RANK_ENV in env else COMPLETION_INDEX_ENV
    rank = _number(env, rank_var)
    if nodes < 1 or rank >= nodes:
        raise PodEnvError(f"{rank_var}={rank} is not a node of {NNODES_ENV}={nodes}: the pod must run in "
                          "a TrainJob of Kubeflow Trainer's torch runtime, which sets both")
    return [host_name(i) for i in range(nodes)], host_name(rank)


def _number(env: Mapping[str, str], name: str) -> int:
    value = env.get(name)
    if value is None or not value.isdigit():
        raise PodEnvError(f"{name}={value!r} is not a whole number: the pod must run in a TrainJob of "
                          "Kubeflow Trainer's torch runtime, which sets it")
    return int(value)
