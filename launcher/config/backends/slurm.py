"""Backend slurm's part of a job: its `slurm:` section (what `sbatch` needs that a SageMaker job
does not say) and the rules that relate the section to the rest of the job.

The job's own fields still decide the rest: `instance_count` is the number of nodes,
`processes_per_host` (or the instance type's accelerators) the processes per node, `max_run` the
time limit when `time` is not given. docs/slurm.md describes the backend.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from pydantic import Field, field_validator

from launcher.config.paths import LocalPathText
from launcher.wire.training.base import Strict, WholeNumber
from launcher.wire.training.issues import Issue

# the rules read a Context, whose module imports the job: the job's backend table loads this module by name
if TYPE_CHECKING:
    from launcher.config.context import Context

# sbatch --time: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
# days-hours:minutes, days-hours:minutes:seconds (sbatch(1)).
_TIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")
# One sbatch option as it follows `#SBATCH` (a long option, as sbatch(1) writes them).
_SBATCH_OPTION = re.compile(r"--[a-z][a-z0-9-]*(=[^\n]*)?")
# Options the backend writes itself from the job; set them through the job's own fields.
OWN_OPTIONS = {
    "--nodes": "instance_count and slurm.spare_nodes", "--ntasks-per-node": "processes_per_host / the instance type",
    "--job-name": "base_job_name / --job-name", "--output": "(the job directory's logs/)",
    "--error": "(the job directory's logs/)", "--chdir": "(the job directory)", "--time": "slurm.time",
    "--partition": "slurm.partition", "--account": "slurm.account", "--gpus-per-node": "slurm.gpus_per_node",
}


def time_seconds(text: str) -> int:
    """Seconds in an sbatch --time value (already checked by SlurmSettings)."""
    days, first, second, third = _TIME.fullmatch(text).groups()
    if days is not None:  # days-hours[:minutes[:seconds]]
        return int(days) * 86400 + int(first) * 3600 + int(second or 0) * 60 + int(third or 0)
    if third is not None:  # hours:minutes:seconds
        return int(first) * 3600 + int(second) * 60 + int(third)
    return int(first) * 60 + int(second or 0)  # minutes[:seconds]


def time_text(seconds: int) -> str:
    """sbatch's days-hours:minutes:seconds for a number of seconds."""
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    return f"{days}-{hours:02d}:{rest // 60:02d}:{rest % 60:02d}"


class SlurmSettings(Strict):
    """Where and how the job runs on a Slurm cluster (backend: slurm)."""

    partition: str | None = Field(None, pattern=r"^[A-Za-z0-9_.,-]+$", description="sbatch --partition.")
    account: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]+$", description="sbatch --account.")
    qos: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]+$", description="sbatch --qos.")
    time: str | None = Field(
        None, description="sbatch --time (e.g. 2-00:00:00, 90:00); default: max_run plus the stop grace period."
    )
    gpus_per_node: WholeNumber | None = Field(
        None, ge=0, le=64, description="GPUs per node (default: the instance type's accelerators; required "
        "with instance_type local_gpu)."
    )
    sbatch: list[str] = Field(
        default_factory=list, description="Extra #SBATCH options, e.g. ['--exclusive', '--constraint=h100']."
    )
    container_image: str | None = Field(
        None, description="Run each node's bootstrap in this image with pyxis/enroot (srun --container-image); "
        "the image needs smlaunch (`python -m container`)."
    )
    container_mounts: list[str] = Field(
        default_factory=list, description="Extra srun --container-mounts (the job directory is always mounted)."
    )
    python: LocalPathText | None = Field(
        None, description="Python that runs the supervisor and, without container_image, the nodes' bootstraps "
        "(default: the one running smlaunch; it must exist on every node)."
    )
    spare_nodes: WholeNumber = Field(
        0, ge=0, le=64, description="Nodes allocated beyond instance_count, idle until a node's processes are "
        "lost: the restart (max_restarts) runs that node's host on a spare instead."
    )
    network_interface: str | None = Field(
        None, pattern=r"^[A-Za-z0-9_.:-]{1,15}$", description="The nodes' interface between each other "
        "(NCCL_SOCKET_IFNAME), e.g. ens5; default: left to NCCL."
    )

    @field_validator("time")
    @classmethod
    def _time(cls, value: str | None) -> str | None:
        if value is not None and not _TIME.fullmatch(value):
            raise ValueError("is not an sbatch time: use minutes, hours:minutes:seconds or "
                             "days-hours:minutes:seconds, e.g. 2-00:00:00")
        return value

    @field_validator("sbatch")
    @classmethod
    def _sbatch(cls, value: list[str]) -> list[str]:
        for option in value:
            if not _SBATCH_OPTION.fullmatch(option):
                raise ValueError(f"{option!r} is not one long sbatch option; write e.g. '--exclusive' or "
                                 "'--constraint=h100' (no '#SBATCH', no newline)")
            name = option.split("=", 1)[0]
            if name in OWN_OPTIONS:
                raise ValueError(f"{name} is written from the job ({OWN_OPTIONS[name]}); set it there")
        return value


def node_gpus(settings: SlurmSettings | None, accelerators: int | None) -> int | None:
    """GPUs per Slurm node: slurm.gpus_per_node when given, else the instance type's (None: unknown)."""
    if settings is not None and settings.gpus_per_node is not None:
        return settings.gpus_per_node
    return accelerators


def target(job) -> tuple[str, str]:
    """(kind, label) of script_rules.Target: what runs a script of the user's own on the nodes."""
    return "process", "the cluster's Python (Slurm)"


def image_text(job) -> str:
    """What the nodes run (validate's summary): slurm.container_image, else the bootstrap in slurm.python."""
    image = job.config.slurm.container_image if job.config.slurm else None
    return (f"{image} (srun --container-image)" if image else "none: the nodes run the bootstrap with slurm.python "
            "(default: this Python)")


def check_slurm(ctx: Context) -> list[Issue]:
    """The section's GPUs and time limit against the job's, and the job's settings Slurm does not read."""
    job, inst = ctx.job, ctx.instance
    settings = job.slurm
    gpus = settings.gpus_per_node if settings else None
    issues = []
    if job.instance_type == "local_gpu" and gpus is None:
        issues.append(Issue("slurm.gpus_per_node", None, "is needed with instance_type local_gpu: Slurm must "
                            "know how many GPUs each node gives the job", "set slurm.gpus_per_node, e.g. 8"))
    if gpus is not None and inst is not None and inst.accelerators and gpus != inst.accelerators:
        issues.append(Issue("slurm.gpus_per_node", gpus, f"differs from {inst.name}'s {inst.accelerators} "
                            "accelerators, which validation and the planner assume",
                            f"remove it (the instance type says {inst.accelerators}), or pick the instance "
                            "type whose accelerators the nodes have"))
    if job.local_runner != "process":
        issues.append(Issue("local_runner", job.local_runner, "is a local-mode setting; on Slurm the nodes run "
                            "the bootstrap directly", "remove it; set slurm.container_image to run in a container"))
    if settings and settings.time and time_seconds(settings.time) < job.max_run:
        issues.append(Issue("slurm.time", settings.time, f"is shorter than max_run ({job.max_run} s), so Slurm "
                            "ends the job first, with less warning than a max_run stop",
                            "raise slurm.time, or lower max_run", "warning"))
    if settings and settings.spare_nodes and not job.max_restarts:
        issues.append(Issue("slurm.spare_nodes", settings.spare_nodes, "are allocated (and billed) for the whole job "
                            "but only a restart uses them, and max_restarts is 0",
                            "set max_restarts (e.g. 2), or remove slurm.spare_nodes"))
    if job.image_uri and not (settings and settings.container_image):
        issues.append(Issue("image_uri", job.image_uri, "is not used by backend slurm: the nodes run the "
                            "bootstrap with their own Python", "set slurm.container_image to run in an image "
                            "(pyxis/enroot), or remove image_uri", "warning"))
    return issues
