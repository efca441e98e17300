"""The batch script of a Slurm job: an allocation of `instance_count` whole nodes, in which
smlaunch's supervisor runs on the first node and starts one bootstrap per node with `srun`
(launcher/slurm/runner.py).

The script holds no secret: the job's environment and hyperparameters stay in the job
directory's spec.json (0600), which the supervisor reads.
"""

from __future__ import annotations

import shlex

from launcher.config.backends.slurm import SlurmSettings, time_text
from launcher.local.spec import LocalJobSpec
from launcher.local.supervise import STOP_GRACE_S

SCRIPT_NAME = "job.sbatch"


def time_limit(settings: SlurmSettings, max_run: int) -> str:
    """slurm.time, else max_run plus the stop grace period and a minute: the supervisor's own
    max_run stop (SIGTERM, checkpoint, artifacts) then comes before Slurm's."""
    return settings.time or time_text(max_run + int(STOP_GRACE_S) + 60)


def sbatch_options(spec: LocalJobSpec, settings: SlurmSettings, gpus_per_node: int) -> list[str]:
    logs = spec.job_dir / "logs"
    options = [f"--job-name={spec.name}", f"--nodes={len(spec.hosts) + settings.spare_nodes}", "--ntasks-per-node=1",
               "--exclusive",  # a node is the job's alone, as a SageMaker instance is
               f"--output={logs}/slurm-%j.out", f"--time={time_limit(settings, spec.max_run)}"]
    # a node that fails leaves the allocation instead of ending the job: for a spare to take its host's
    # place, or for the job to go on with the nodes left (min_instance_count)
    if settings.spare_nodes or spec.min_instance_count:
        options.append("--no-kill")
    for name in ("partition", "account", "qos"):
        if getattr(settings, name):
            options.append(f"--{name}={getattr(settings, name)}")
    if gpus_per_node:
        options.append(f"--gpus-per-node={gpus_per_node}")
    return options + list(settings.sbatch)


def render(spec: LocalJobSpec, settings: SlurmSettings, gpus_per_node: int, python: str) -> str:
    lines = ["#!/bin/bash"]
    lines += [f"#SBATCH {option}" for option in sbatch_options(spec, settings, gpus_per_node)]
    lines += [
        f"# smlaunch job {spec.name}: {len(spec.hosts)} node(s) x {spec.processes_per_host} process(es)"
        + (f", {settings.spare_nodes} spare node(s) for a lost node's host." if settings.spare_nodes else "."),
        "# The supervisor runs here, on the first node: it starts one bootstrap per node with srun,",
        "# merges their logs into logs/job.log, passes a stop's SIGTERM on to them, packs the",
        "# artifacts and records the outcome in job.json (status: smlaunch status slurm:$SLURM_JOB_ID).",
        "set -u",
        f"exec {shlex.quote(python)} -m launcher.local.supervise {shlex.quote(str(spec.job_dir))}",
        "",
    ]
    return "\n".join(lines)
