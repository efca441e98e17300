"""What each pod of a Kubernetes job asks of its node: the instance type's GPUs, its EFA interfaces
(the EFA device plugin's `vpc.amazonaws.com/efa`), CPU and memory, and a memory-backed /dev/shm.

Defaults come from the instance catalog (launcher.wire.training.catalog): every GPU of the type; on a job of
several nodes every EFA interface of the type (an inter-node network: a one-node job asks for none, so
it schedules on a cluster without the EFA device plugin too); on GPU nodes a /dev/shm without a size
limit (the container runtime's own is 64 MiB, too small for NCCL's shared-memory transport and data
loader workers). The job file's `kubernetes.resources` overrides each (launcher.config.backends.kubernetes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.config.backends.kubernetes import KubernetesSettings

if TYPE_CHECKING:
    from launcher.config.validate import ValidatedJob

GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
SHM_VOLUME = "smlaunch-shm"
SHM_PATH = "/dev/shm"


def gpus_per_node(job: ValidatedJob) -> int:
    """The GPUs each node asks for (0 for CPU nodes: the cluster's own requests stand)."""
    return (job.instance.accelerators or 0) if job.instance else 0


def efa_per_node(job: ValidatedJob, settings: KubernetesSettings) -> int:
    """The EFA interfaces each pod asks for: the section's, else all its instance type's on several nodes."""
    if settings.resources.efa is not None:
        return settings.resources.efa
    if job.config.instance_count < 2 or job.instance is None:
        return 0
    return job.instance.efa_interfaces or 0


def devices(job: ValidatedJob, settings: KubernetesSettings) -> dict[str, str]:
    """The devices each pod asks for (GPUs, EFA interfaces), as their limits: a device's request equals it."""
    wanted = {GPU_RESOURCE: gpus_per_node(job), EFA_RESOURCE: efa_per_node(job, settings)}
    return {name: str(count) for name, count in wanted.items() if count}


def requests(settings: KubernetesSettings) -> dict[str, str]:
    """The CPU and memory each pod requests (none unless the section says)."""
    asked = {"cpu": settings.resources.cpu, "memory": settings.resources.memory}
    return {name: str(value) for name, value in asked.items() if value is not None}


def shared_memory(job: ValidatedJob, settings: KubernetesSettings) -> tuple[dict, dict] | None:
    """(the volume, its mount) of the pods' /dev/shm: a memory-backed emptyDir, sized where the section
    says; None on CPU nodes by default, or where the section says false."""
    size = settings.resources.shared_memory
    if size is False or (size is None and not gpus_per_node(job)):
        return None
    empty_dir = {"medium": "Memory", **({"sizeLimit": size} if size else {})}
    return {"name": SHM_VOLUME, "emptyDir": empty_dir}, {"name": SHM_VOLUME, "mountPath": SHM_PATH}
