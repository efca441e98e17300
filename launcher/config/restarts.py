"""`max_restarts`: what it means where the job runs, and how it reaches the container (docs/faults.md).

The container's bootstrap restarts torchrun after a fault (launcher.wire.faults carries the
budget as SMLAUNCH_MAX_RESTARTS); the local and Slurm supervisors restart what the bootstrap
cannot, a host that is gone. On SageMaker, AWS's toolkit runs the bootstrap's restart loop in
place of torchrun (launcher.wire.restart_loop: the budget is a hyperparameter there). The
variables of launcher.wire.faults are smlaunch's to set: a job that sets them itself is refused,
and an armed fault injection is pointed out (it kills the job on purpose).
"""

from __future__ import annotations

from launcher.config import backend_table
from launcher.config.issues import Issue
from launcher.wire import faults

MAX_RESTARTS = 100  # a job that fails more often than this is not running, it is failing
_OWN = (faults.MAX_RESTARTS_ENV, faults.ATTEMPT_ENV, faults.FAULT_DIR_ENV)

# What the request then has that the SDK's has not (launcher.wire.restart_loop, docs/sagemaker-request.md).
REQUEST_NOTE = ("the request differs from the SageMaker SDK's in three hyperparameters only: sagemaker_program "
                "names _smlaunch/restart_loop.py, sagemaker_torch_distributed_enabled is left out, and "
                "sagemaker_smlaunch_restart_loop holds the budget and the two values they replace")


def restart_environment(max_restarts: int) -> dict[str, str]:
    """What the job's environment gains for `max_restarts` (nothing for 0: the request stays the SDK's)."""
    return {faults.MAX_RESTARTS_ENV: str(max_restarts)} if max_restarts else {}


def check_restarts(ctx) -> list[Issue]:
    job = ctx.job
    issues = [Issue(f"environment.{name}", job.environment[name], "is set by smlaunch for each attempt",
                    "remove it; set max_restarts for automatic restarts") for name in _OWN if name in job.environment]
    if faults.FAULT_ENV in job.environment:
        issues.append(Issue(f"environment.{faults.FAULT_ENV}", "(set)", "arms fault injection: the job's ranks "
                            "will be killed, hung or stopped on purpose (tests only)",
                            f"remove {faults.FAULT_ENV} for a real job", "warning"))
    if not job.max_restarts:
        return issues
    if job.backend_name == "sagemaker":
        refused = _sagemaker_refusals(job)
        if refused:
            return issues + refused
    issues.append(Issue("max_restarts", job.max_restarts, backend_table.named(job.backend_name).restarts, level="info"))
    if job.backend_name == "sagemaker":
        issues.append(Issue("max_restarts", job.max_restarts, REQUEST_NOTE, level="info"))
    if ctx.runtime and not job.hyperparameters.checkpoint_freq:
        issues.append(Issue("max_restarts", job.max_restarts, "each restart starts training again from step 1: "
                            "the job saves no checkpoints", "set hyperparameters.checkpoint_freq", "warning"))
    if not ctx.runtime:
        issues.append(Issue("max_restarts", job.max_restarts, "a restart runs your script again from its start: "
                            "it resumes only from checkpoints it writes and reads itself (SM_CHECKPOINT_DIR or "
                            "checkpoint_local_path)", level="info"))
    return issues


def _sagemaker_refusals(job) -> list[Issue]:
    """What the restart loop cannot run on SageMaker: it takes the toolkit's place as the job's
    program and launches torchrun or python, so a ContainerEntrypoint (no toolkit) or an MPI or
    smdistributed-dataparallel launch (mpirun) leaves it nothing to do."""
    issues = []
    if job.container_entry_point is not None:
        issues.append(Issue("max_restarts", job.max_restarts, "runs through the image's toolkit, which "
                            "container_entry_point replaces", "remove container_entry_point or max_restarts"))
    dist = job.distribution
    for used, launch in ((dist is not None and dist.mpi_enabled, "distribution.mpi"),
                         (dist is not None and dist.dataparallel_enabled, "distribution.smdistributed.dataparallel")):
        if used:
            issues.append(Issue("max_restarts", job.max_restarts, f"restarts torchrun, not the mpirun launch of "
                                f"{launch}", "use distribution torch_distributed, or remove max_restarts"))
    return issues
