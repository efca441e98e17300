"""Rules that relate the backend to the rest of the job: which instance types each backend runs,
and the `slurm:` section (read only by backend slurm, its GPUs and time limit against the job's)."""

from __future__ import annotations

from launcher.config.issues import Issue
from launcher.config.rules import Context
from launcher.config.slurm_settings import time_seconds


def check_backend_choice(ctx: Context) -> list[Issue]:
    job = ctx.job
    issues = []
    if job.backend == "sagemaker" and job.is_local:
        issues.append(Issue("backend", "sagemaker", f"runs on ml.* instances, and instance_type is {job.instance_type}",
                            "pick an ml.* instance type, or use backend: local (or slurm)"))
    if job.backend == "local" and not job.is_local:
        issues.append(Issue("backend", "local", f"runs on this machine, which is not a {job.instance_type}",
                            "set instance_type: local (CPU) or local_gpu, or use backend: slurm or sagemaker"))
    if job.slurm is not None and job.backend_name != "slurm":
        issues.append(Issue("slurm", "{...}", f"is only read by backend slurm, and the job runs on {job.backend_name}",
                            "set backend: slurm (or --backend slurm), or remove the slurm section"))
    if job.backend_name == "slurm":
        issues += _slurm(ctx)
    return issues


def _slurm(ctx: Context) -> list[Issue]:
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
